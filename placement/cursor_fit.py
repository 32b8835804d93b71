"""One epoch's map and the test of one hypothesis against a dataset's strays (:mod:`placement.cursor`).

:class:`PassIndex`, :func:`fit_strays` and :func:`log_chance`: values and functions over numpy
arrays that hold no cursor state.  Separate from the cursor's bookkeeping so the statistics a lock
rests on (:data:`FALSE_LOCK`) read, and are tested, on their own; :mod:`placement.cursor_lock`
decides when to run them and what a fit changes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

from placement.prob import log_comb
from placement.streams import EpochInverse, JobShape

Anchor = Literal["start", "anywhere"]


FALSE_LOCK = 1e-6
"""Accepted chance that opens of another order (wrong seed, epoch or node) are taken for this one."""


I64 = npt.NDArray[np.int64]


_LOG_FALSE_LOCK = math.log(FALSE_LOCK)


# ---------------------------------------------------------------------------------------- chances


def log_chance(distinct: int, span: int, length: int, slots: int, per_position: int, anchor: Anchor) -> float:
    """ln of the chance that ``distinct`` files of an unrelated order fit one hypothesis this well.

    The hypothesis maps each file to a slot (rank, position) of one epoch, ``slots`` in all
    (world_size x length for a DistributedSampler, ``length`` when every rank reads the same
    order).  Under a wrong seed, epoch or sampler those files land on ``distinct`` slots drawn
    uniformly without replacement (two different permutations look random to each other).  They
    *fit* when all of them land on this node's ranks within one window of ``span`` positions,
    which holds ``per_position * span`` slots (per_position: the node's ranks, or 1 for a shared
    order).  For a window fixed at the start of the epoch that chance is
    C(per_position * span, distinct) / C(slots, distinct); a window anywhere adds a union over its
    ``length - span + 1`` starting points.  The caller multiplies by the number of hypotheses it
    may try (nodes, epochs, variants, anchors, suffixes, repeated looks): a Bonferroni bound.
    """
    if distinct <= 0:
        return 0.0
    held = min(per_position * span, slots)
    out = log_comb(held, distinct) - log_comb(slots, distinct)
    if anchor == "anywhere":
        out += math.log(max(1, length - span + 1))
    return min(0.0, out)


# ---------------------------------------------------------------------------------------- epochs


class PassIndex:
    """One (dataset variant, sampler epoch): file -> (rank, position), and each rank's stream.

    ``repeated`` marks files read more than once by the epoch's ranks (DistributedSampler padding,
    a list with repeats): their first position is not the only one, so they are looked up in the
    rank's stream and never used as evidence.
    """

    __slots__ = ("inv", "length", "pos_of", "rank_of", "repeated", "shared")

    def __init__(self, inv: EpochInverse) -> None:
        self.inv = inv
        self.length = inv.length
        self.rank_of = inv.rank_of
        self.pos_of = inv.pos_of
        lay = inv.layout
        self.shared = lay.shared
        if lay.shared:
            flat = lay.order[: self.length]
            n = inv.rank_of.shape[0]
            self.repeated: npt.NDArray[np.bool_] | None = (
                None if lay.distinct >= flat.shape[0] else np.bincount(flat, minlength=n) > 1
            )
        else:
            self.repeated = inv.duplicated if inv.duplicated.any() else None

    def positions(self, i: int, rank: int) -> list[int]:
        """Where ``rank`` reads local file ``i`` in this pass (usually one position, or none)."""
        r = int(self.rank_of[i])
        if r < 0:
            return []
        if self.repeated is None or not self.repeated[i]:
            return [int(self.pos_of[i])] if self.shared or r == rank else []
        return np.flatnonzero(self.inv.rank_row(rank) == i).tolist()

    def row(self, rank: int) -> I64:
        return self.inv.rank_row(rank)


@dataclass(frozen=True, eq=False)
class Fit:
    """How well one hypothesis explains the newest strays (their longest consistent suffix)."""

    variant: int
    epoch: int  # sampler epoch
    anchor: Anchor
    node: int | None  # None: the order is shared by every rank (the node is not identifiable)
    explained: int  # strays in the suffix
    distinct: int  # files in it usable as evidence
    span: int
    repeats: int  # opens of a file already opened in the suffix (local ranks sharing an order)
    log_chance: float
    slots: I64  # per suffix entry: the local slot reading it (-1: any, a shared order)
    positions: I64  # per suffix entry: its position (-1: no evidence, placed later)

    def plausible(self, strays: int) -> bool:
        """Explains most of what was seen: worth waiting for more evidence rather than searching on."""
        return self.explained >= max(3, (strays + 1) // 2)


def fit_strays(
    index: PassIndex,
    local: I64,
    shape: JobShape,
    *,
    variant: int,
    epoch: int,
    node: int | None,
    cap: int,
    anchor: Anchor,
) -> Fit | None:
    """Test one hypothesis on strays ``local`` (dataset-local ids, oldest first), vectorised.

    Walks back from the newest stray while the strays stay one node's reads within ``cap``
    positions (from the epoch's start for ``anchor="start"``): older strays may belong to what
    came before a break.  In a DistributedSampler order a file is read once per epoch, so a
    file opened twice ends the suffix; in an order every rank shares, each local rank opens it.
    """
    k = local.shape[0]
    if k == 0:
        return None
    rank = index.rank_of[local].astype(np.int64)
    pos = index.pos_of[local].astype(np.int64)
    unread = rank < 0
    rep = index.repeated[local] if index.repeated is not None else np.zeros(k, dtype=np.bool_)
    neutral = rep & ~unread  # read elsewhere too: no evidence, no violation
    if index.shared:
        slots = np.full(k, -1, dtype=np.int64)
        bad = unread.copy()
        fit_node = node
    else:
        safe = np.maximum(rank, 0)
        nodes = shape.rank_nodes()[safe].astype(np.int64)
        fit_node = node
        if fit_node is None:
            usable = np.flatnonzero(~unread & ~neutral)
            if usable.shape[0] == 0:
                usable = np.flatnonzero(~unread)  # only repeated files: their first reads
            if usable.shape[0] == 0:
                return None
            fit_node = int(nodes[usable[-1]])
        bad = unread | (~neutral & (nodes != fit_node))
        slots = np.where(bad | neutral, -1, shape.rank_slots()[safe].astype(np.int64))
    # Opens of a file that is opened again later in the buffer.
    uniq, inverse = np.unique(local, return_inverse=True)
    last = np.full(uniq.shape[0], -1, dtype=np.int64)
    np.maximum.at(last, inverse, np.arange(k, dtype=np.int64))
    again = last[inverse] != np.arange(k)
    if not index.shared:
        bad |= again & ~neutral
    evidence = ~bad & ~neutral
    low = np.where(evidence, pos, np.iinfo(np.int64).max)[::-1]
    high = np.where(evidence, pos, -1)[::-1]
    rmin = np.minimum.accumulate(low)
    rmax = np.maximum.accumulate(high)
    span = rmax + 1 if anchor == "start" else np.where(rmax >= 0, rmax - rmin + 1, 0)
    violation = bad[::-1] | (span > cap)
    n_ok = int(np.argmax(violation)) if violation.any() else k
    if n_ok == 0:
        return None
    start = k - n_ok
    R = int(span[n_ok - 1])
    if not index.shared and fit_node is not None and neutral[start:].any():
        R = _promote_first_reads(
            shape, rank, pos, evidence, neutral, again, slots, nodes, fit_node, start, R, cap, anchor
        )
    suffix_ev = evidence[start:]
    distinct = int(np.unique(local[start:][suffix_ev]).shape[0]) if suffix_ev.any() else 0
    repeats = int(again[start:].sum())
    length = index.length
    if index.shared:
        total, per_position = length, 1
    else:
        total, per_position = length * shape.world_size, shape.ranks_per_node
    chance = log_chance(distinct, max(R, 1), length, total, per_position, anchor)
    positions = np.where(evidence | neutral, pos, -1)[start:]
    return Fit(
        variant,
        epoch,
        anchor,
        fit_node if not index.shared else node,
        n_ok,
        distinct,
        R,
        repeats,
        chance,
        slots[start:],
        positions,
    )


def _promote_first_reads(
    shape: JobShape,
    rank: I64,
    pos: I64,
    evidence: npt.NDArray[np.bool_],
    neutral: npt.NDArray[np.bool_],
    again: npt.NDArray[np.bool_],
    slots: I64,
    nodes: I64,
    fit_node: int,
    start: int,
    span: int,
    cap: int,
    anchor: Anchor,
) -> int:
    """Count repeated files of the suffix ``start:`` as evidence at their first read where it fits.

    Padding repeats the start of an epoch at its end (DistributedSampler: a few files;
    accelerate's even_batches: up to a round of batches, which are then the very files an epoch
    opens first).  Such a file opened where the suffix's other evidence is -- its first read on
    this node within the span -- is placed like any other: under an unrelated order its first read
    is as uniformly placed as any file's.  One that does not fit stays neutral (it may be the
    later read).  Updates the arrays in place; returns the suffix's span.
    """
    seg = slice(start, None)
    cand = neutral[seg] & ~again[seg] & (nodes[seg] == fit_node)
    ev = pos[seg][evidence[seg]]
    if anchor == "start":
        cand &= pos[seg] < cap
    elif ev.shape[0]:
        cand &= (pos[seg] > int(ev.max()) - cap) & (pos[seg] < int(ev.min()) + cap)
    else:
        return span  # nothing to anchor a window anywhere
    if not cand.any():
        return span
    placed = pos[seg][evidence[seg] | cand]
    new_span = int(placed.max()) + 1 if anchor == "start" else int(placed.max() - placed.min()) + 1
    if new_span > cap:
        return span
    evidence[seg] |= cand
    neutral[seg] &= ~cand
    slots[seg] = np.where(cand, shape.rank_slots()[np.maximum(rank[seg], 0)].astype(np.int64), slots[seg])
    return new_span
