"""Which job shape a node's opens fit, when they fit none of the configured one.

When the opens refute every hypothesis of the plan, either the seed (or the sampler) is wrong, or
the seed is right and the job is shaped otherwise than the config says: another world size, more
or fewer ranks on this node, another batch size for a batch-sharded loader.  Only the second leaves
a trace: the files still come from the epoch's permutation, at places a sharding of another shape
gives this node's ranks.  Each open's place ``t`` in the permutation tells its rank and position
under any shape at once:

* samples dealt round-robin (DistributedSampler): rank ``t % W``, position ``t // W``;
* batches dealt round-robin (accelerate's BatchSamplerShard; ``split_batches`` is the same map with
  the per-process slice as batch): global batch ``k = t // b``, rank ``k % W``, position
  ``(k // W) * b + t % b``.

A shape *fits* when the opens land on a few ranks (this node's) within a window of positions.
Under a wrong seed ``t`` is uniform, and the chance that k distinct files land on some set of m of
W ranks within ``span`` positions is at most ``C(W, m) * C(m * span, k) / C(n, k)`` (times the
window's possible starts when it is not at the epoch's start): a fit is reported only when that,
times every shape, suffix and permutation tried, is below the cursor's false-lock chance.

Pure: numpy only, no I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

from placement.prob import log_comb_v, log_factorials

I64 = npt.NDArray[np.int64]
Layout = Literal["samples", "batches"]

BATCH_SIZES = (2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024)
"""Per-rank batch sizes tried for batch-sharded layouts (plus the configured one and its neighbours)."""


@dataclass(frozen=True)
class ShapeFit:
    """A shape the opens fit: ``layout`` with ``world_size`` ranks (``batch_size`` for batches), the
    node's ``ranks`` among them, and the (Bonferroni-corrected) chance a wrong seed fits as well."""

    layout: Layout
    world_size: int
    batch_size: int | None
    ranks: tuple[int, ...]
    opens: int
    log_chance: float
    label: str  # which permutation (the caller's name for it)

    def describe(self) -> str:
        if len(self.ranks) == self.world_size:
            return "every rank of the job on this node (it reads the whole order)"
        how = "samples dealt to ranks round-robin (DistributedSampler)"
        if self.layout == "batches":
            how = f"batches of {self.batch_size} dealt to ranks round-robin (accelerate)"
        return f"{how}, world_size {self.world_size}, this node's ranks {_ranges(self.ranks)}"


def _ranges(ranks: tuple[int, ...]) -> str:
    parts: list[str] = []
    start = prev = ranks[0]
    for r in (*ranks[1:], None):
        if r is not None and r == prev + 1:
            prev = r
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if r is not None:
            start = prev = r
    return ",".join(parts)


def worlds_to_try(world_size: int) -> list[int]:
    """World sizes a probe tries: every one up to twice the configured (and at least 32)."""
    return list(range(1, max(32, 2 * world_size) + 1))


def batches_to_try(batch_size: int) -> list[int]:
    near = {batch_size, 2 * batch_size, max(1, batch_size // 2)}
    return sorted((set(BATCH_SIZES) | near) - {1})  # batches of 1 are the samples layout


def probe_shapes(
    perms: list[tuple[str, I64]],
    opens: I64,
    *,
    cap: int,
    world_size: int,
    batch_size: int,
    budget: float,
    min_opens: int = 6,
) -> list[ShapeFit]:
    """Every shape the newest ``opens`` (dataset-local ids, oldest first) fit, best first.

    ``perms``: (label, permutation) pairs, the epochs' global orders the opens may come from.
    ``cap``: positions a node's opens may spread over (generous: the loader's window is unknown
    when its shape is).  ``budget``: ln of the false-fit chance allowed (the caller's bound, before
    this probe's own multiplicity, which is added here).  Suffixes of the opens (all, half, a
    quarter, at least ``min_opens``) are tried: older opens may belong to an earlier epoch.
    Vectorised over the shapes: one (shapes x opens) array per permutation and suffix.
    """
    k_all = int(opens.shape[0])
    if k_all < min_opens or not perms:
        return []
    shapes: list[tuple[int, int | None]] = [(w, None) for w in worlds_to_try(world_size)]
    shapes += [(w, b) for w in worlds_to_try(world_size) if w > 1 for b in batches_to_try(batch_size)]
    worlds = np.array([w for w, _ in shapes], dtype=np.int64)[:, None]
    batches = np.array([b or 1 for _, b in shapes], dtype=np.int64)[:, None]
    sampled = np.array([b is None for _, b in shapes])[:, None]
    suffixes = sorted({k_all >> i for i in range(4) if k_all >> i >= min_opens}, reverse=True)
    bound = budget - math.log(len(perms) * len(suffixes) * len(shapes) * 2)  # 2: anchors
    out: list[ShapeFit] = []
    for label, perm in perms:
        n = int(perm.shape[0])
        inverse = np.empty(n, dtype=np.int64)
        inverse[perm] = np.arange(n, dtype=np.int64)
        lf = log_factorials(n)
        for k in suffixes:
            files = np.unique(opens[k_all - k :])  # distinct files: reopens say nothing here
            distinct = int(files.shape[0])
            if distinct < min_opens or int(files.max()) >= n:
                continue
            t = inverse[files][None, :]
            g = t // batches
            rank = np.where(sampled, t % worlds, g % worlds)
            pos = np.where(sampled, t // worlds, (g // worlds) * batches + t % batches)
            ordered = np.sort(rank, axis=1)
            m = 1 + (np.diff(ordered, axis=1) != 0).sum(axis=1)
            top, bottom = pos.max(axis=1), pos.min(axis=1)
            w = worlds[:, 0]
            length = -(-n // w)  # positions per rank
            base = log_comb_v(lf, w, m) - log_comb_v(lf, np.array([n]), np.array([distinct]))
            chance = np.full(len(shapes), np.inf)
            for span, anywhere in ((top + 1, False), (top - bottom + 1, True)):
                held = np.minimum(m * span, n)
                c = base + log_comb_v(lf, held, np.full_like(held, distinct))
                if anywhere:
                    c = c + np.log(np.maximum(1, length - span + 1))
                chance = np.where(span <= cap, np.minimum(chance, c), chance)
            for i in np.flatnonzero(chance < bound).tolist():
                wi, bi = shapes[i]
                ranks = tuple(int(r) for r in np.unique(ordered[i]))
                layout: Layout = "samples" if bi is None else "batches"
                out.append(ShapeFit(layout, wi, bi, ranks, k, float(chance[i]), label))
    out.sort(key=lambda f: (f.log_chance, -f.opens))
    return out
