"""The sampler seed the job writes to ``.control/seed``: parsing and the daemon's current value.

The seed that matters is the *sampler's* (``DistributedSampler(seed=...)``, default 0; or the seed of
the generator given to the DataLoader), not the script's ``torch.manual_seed`` (README.md, "How a job
uses it").  Until a seed is written the daemon assumes the sampler default 0 and marks it
``assumed``; a seed the daemon found from the node's opens (:mod:`fusefs.planning.discovery`) is
``discovered`` and is used exactly as a written one (a later write replaces it).

Every accepted change raises ``generation``; with peers, the highest (generation, writer) wins, so
concurrent writes on different nodes settle on one value.  A write also wins over a discovered seed
that raced it (:func:`next_generation`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated, Literal, TypedDict

from placement.statusfields import gauge, info, state, text

SEED_MIN = -(2**63)
SEED_MAX = 2**64 - 1  # torch.Generator.manual_seed's accepted range
SAMPLER_DEFAULT_SEED = 0


class SeedSyntaxError(ValueError):
    """The text written is not a seed; the message is shown in status."""


MAX_SEED_TEXT = 256
"""Longest text ``.control/seed`` takes (digits, sign and surrounding whitespace): a seed has at most
20 digits, and a bound keeps both the write buffer and the parse of hostile input small."""

_SEED_DIGITS = len(str(SEED_MAX))


def show(text: str, limit: int = 40) -> str:
    """A bounded, printable rendering of user text for a one-line error."""
    return repr(text if len(text) <= limit else text[: limit - 3] + "...")


def parse_seed(data: bytes) -> int:
    """A decimal integer, surrounding whitespace and a trailing newline allowed.

    Never converts more than a seed's worth of digits: Python refuses (ValueError) to convert
    decimal strings above 4,300 digits, and the length alone already proves such a value is out of
    range, so the range check comes from the digit count first.
    """
    if len(data) > MAX_SEED_TEXT:
        raise SeedSyntaxError(f"seed text of {len(data)} bytes (at most {MAX_SEED_TEXT})")
    try:
        text = data.decode("ascii").strip()
    except UnicodeDecodeError:
        raise SeedSyntaxError("seed must be a decimal integer (got non-ASCII bytes)") from None
    if not text:
        raise SeedSyntaxError("seed must be a decimal integer (got nothing)")
    body = text[1:] if text[0] in "+-" else text
    if not (body.isascii() and body.isdigit()):
        raise SeedSyntaxError(f"seed must be a decimal integer (got {show(text)})")
    if len(body.lstrip("0")) > _SEED_DIGITS:
        raise SeedSyntaxError(f"seed {show(text)} is outside torch's range [-2**63, 2**64-1]")
    value = int(text)
    if not SEED_MIN <= value <= SEED_MAX:
        raise SeedSyntaxError(f"seed {value} is outside torch's range [-2**63, 2**64-1]")
    return value


def valid_seed(value: object) -> bool:
    """Whether a value from elsewhere (a peer's note) is a seed this daemon would accept locally."""
    return type(value) is int and SEED_MIN <= value <= SEED_MAX


SeedOrigin = Literal["assumed", "written", "peer", "discovered"]


class SeedStatus(TypedDict):
    """Status section ``seed``: the sampler seed in use."""

    value: Annotated[int, info("the seed in use")]
    origin: Annotated[
        SeedOrigin,
        state(
            "assumed: the sampler default, nothing written yet; written: on this node; peer: on another node; "
            "discovered: found from the opens (section discovery)"
        ),
    ]
    generation: Annotated[
        int,
        gauge(
            "raised by every accepted change to the next round r of two: 2r for a written seed, 2r - 1 for a "
            "discovered one (a peer's keeps its own), so a write outranks a seed discovered under the same previous "
            "seed; with peers the highest (generation, writer) wins"
        ),
    ]
    writer: Annotated[int, gauge("the node that wrote (or discovered) it, -1 if none")]
    updated_at: Annotated[float | None, gauge("when it last changed (timestamp), or null", unit="seconds")]
    last_error: Annotated[str | None, text("why the last rejected write was rejected, or null")]


def next_generation(current: int, origin: SeedOrigin) -> int:
    """The generation of a seed set on this node (written or discovered) over one of ``current``.

    The precedence rule: a seed discovered from the opens never wins over a seed written, on any
    node, after its search was asked for.  A search answers "which seed fits the opens, given the
    seed in use when it was asked for"; a write made since is newer knowledge.  Two checks keep it:

    * On the finding node, a match is adopted only if the seed is still the version the search was
      asked under (:meth:`SeedState.set` ``since``); a seed written here or received from a peer
      meanwhile drops it (``fusefs.planning.discovery``).
    * Across the group, a write the finding node has not heard of yet when it adopts: the write and
      the search were made over the same seed (or the write over a newer one).  Generations come in
      rounds of two, round r holding 2r - 1 (discovered) and 2r (written), and every change moves to
      the round after the current one's, so from the same seed the write is one above the discovery
      whatever the node indices, and every node's (generation, writer) merge keeps the write.  The
      parity is the origin, so a peer's note needs no field of its own for it.

    A write made over an older seed than the search's (its node had not yet heard of the seed the
    search ran under) was concurrent with that seed too, and may lose to the match as it may lose to
    that seed.  A match adopted for a later mismatch of the seed in use (a search found before) is a
    decision under that seed, made with its version, and replaces it as any discovery does.
    """
    next_round = (current + 1) // 2 + 1
    return 2 * next_round - (1 if origin == "discovered" else 0)


@dataclass
class SeedState:
    value: int = SAMPLER_DEFAULT_SEED
    origin: SeedOrigin = "assumed"
    generation: int = 0
    writer: int = -1  # node index that wrote it (-1: nobody yet)
    updated_at: float = 0.0
    last_error: str | None = None
    me: int = -1  # this daemon's index in its group: the writer of seeds written here
    listeners: tuple[Callable[[SeedState], None], ...] = field(default=(), repr=False)
    """Told of every seed adopted, in this order; given at construction (the daemon's, built in
    ``Daemon.__init__``): nobody registers one later."""

    def version(self) -> tuple[int, int]:
        """(generation, writer): what identifies the seed in use across the group."""
        return self.generation, self.writer

    def set(
        self,
        value: int,
        origin: SeedOrigin,
        generation: int | None = None,
        writer: int = -1,
        *,
        since: tuple[int, int] | None = None,
    ) -> bool:
        """Adopt a seed: set here (no ``generation``: the next one for ``origin``) or a peer's (its
        generation and writer, ignored unless above the one held).  ``since``: adopt only if the seed
        in use is still that :meth:`version` (a discovered match and the seed it was searched under).
        Returns whether it was adopted."""
        if since is not None and since != self.version():
            return False
        if generation is None:
            gen, writer = next_generation(self.generation, origin), self.me
        elif (generation, writer) <= (self.generation, self.writer):
            return False
        else:
            gen = generation
        self.value, self.origin, self.generation, self.writer = value, origin, gen, writer
        self.updated_at = time.time()
        self.last_error = None
        for listener in self.listeners:
            listener(self)
        return True

    def reject(self, reason: str) -> None:
        self.last_error = reason

    def content(self) -> bytes:
        return f"{self.value}\n".encode()

    def status(self) -> SeedStatus:
        return {
            "value": self.value,
            "origin": self.origin,
            "generation": self.generation,
            "writer": self.writer,
            "updated_at": self.updated_at or None,
            "last_error": self.last_error,
        }
