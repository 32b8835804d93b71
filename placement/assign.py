"""Tier assignment and ownership: which node keeps which file in which local tier.

Inputs are plain arrays over *objects* (distinct cached things: one per snapshot entry), so the
simulator can call this with made-up numbers: per-node read counts and first uses (job
positions), sizes, which objects can be cached at all, and per-node tier byte budgets.

Frequency fill (NoPFS 5.1): each node ranks the objects it reads by descending read count, ties
by earliest first use in its own stream, then by object index (deterministic), and pours them
into its tiers, fastest first, until each tier's byte budget is full.  A file that does not fit
is skipped for that tier and tried in the next one, and smaller files later in the ranking may
still fill the gap.  Budgets are hard: a tier never receives more bytes than its budget.

Spread mode (NoPFS "well distributed", config ``peers.spread``): pure frequency fill replicates
the popular files on many nodes and leaves others on no node at all (with each node holding
1/N of the dataset, about a third of the files would be nowhere), so the PFS is read for them
every epoch.  Spread first gives every file that is read a *designated holder*, then fills what
is left of each node's budget by frequency:

1. Ownership rounds.  Each object goes to the node that reads it most (ties rotate with the
   object index, so no node is favoured).  A node accepts its share in ranking order while it
   has room; what it cannot take goes back to the pool and the node drops out.  The next round
   offers the pool to the remaining nodes the same way (an object nobody left reads goes, by
   the rotation, evenly to nodes with room), until the pool or the nodes run out.  Room per
   node is its total budget less a fragmentation reserve of (tiers x largest file), which
   guarantees that the tier placement below can place every designated object.
2. Frequency fill of the remaining room with the node's most-read other objects.
3. Tier placement: the node's objects (designated and frequency ones) in ranking order, fastest
   tier first, as in frequency fill.

Coverage is guaranteed when :func:`spread_covers` holds (aggregate room minus one largest file
per node is at least the bytes of the objects read); otherwise the least-read objects stay on
the PFS.  Using capacity for distinct files first is right whenever the PFS is the bottleneck: a
byte of distinct file saves all of its PFS reads, a replica only turns peer reads into local ones.

Primary owner: among the nodes holding an object, the one that reads it first (ties: lowest
node); -1 when nobody holds it.  It fetches the object from the PFS and serves its peers; it
fetches it by the time anybody first needs it, so that the PFS is read once per object per job.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from placement.parallel import Pool, by_columns, per_node

I64 = npt.NDArray[np.int64]
Bools = npt.NDArray[np.bool_]
UInts = npt.NDArray[np.unsignedinteger]
Ints = npt.NDArray[np.signedinteger]
I32s = npt.NDArray[np.int32]


@dataclass(eq=False)
class Assignment:
    """``tier_of[node, obj]``: the tier index holding it on that node, -1 none (int8).

    ``owner[obj]``: the primary owner node, -1 when no node holds it.  ``due[node]`` lists, for
    each node, its held objects and the job position by which each must be in place (for the
    owner: when anybody first reads it; for others: their own first read).
    """

    tier_of: npt.NDArray[np.int8]
    owner: npt.NDArray[np.int32]
    fill_obj: npt.NDArray[np.int32]  # per node, held objects in order of due position (concatenated)
    fill_due: npt.NDArray[np.int64]
    fill_off: I64  # nodes + 1 offsets into fill_obj / fill_due
    tier_bytes: I64  # (nodes, tiers): bytes placed in each tier
    tier_files: I64
    earliest: Ints | None = None  # per object, the job's first read position (not persisted)
    first_reader: npt.NDArray[np.int32] | None = None  # the node doing it, -1 nobody

    def fill_order(self, node: int) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.int64]]:
        lo, hi = int(self.fill_off[node]), int(self.fill_off[node + 1])
        return self.fill_obj[lo:hi], self.fill_due[lo:hi]


# --------------------------------------------------------------------------- building blocks


def fill(sizes: I64, budget: int) -> Bools:
    """Which of ``sizes`` (in priority order) go into a bin of ``budget`` bytes.

    Greedy in order: take while it fits; a file that does not fit is skipped and later, smaller
    ones are still tried.  Exhaustive (every skipped file was larger than the room left when it
    was tried), in O(n) per round with few rounds: after the first skip the room is below one
    file, and each round keeps only files that still fit.
    """
    n = int(sizes.shape[0])
    taken = np.zeros(n, np.bool_)
    if budget < 0:
        raise ValueError(f"budget: expected >= 0, got {budget}")
    room = int(budget)
    rest: I64 | None = None  # None: all of sizes, in order
    while True:
        part = sizes if rest is None else sizes[rest]
        if rest is not None:
            keep = part <= room
            rest, part = rest[keep], part[keep]
            if not rest.size:
                break
        cs = np.cumsum(part)
        q = int(np.searchsorted(cs, room, side="right"))
        if q:
            if rest is None:
                taken[:q] = True
            else:
                taken[rest[:q]] = True
            room -= int(cs[q - 1])
        if q >= part.shape[0]:
            break
        rest = np.arange(q + 1, n, dtype=np.int64) if rest is None else rest[q + 1 :]
    return taken


def place_in_tiers(sizes: I64, budgets: Sequence[int]) -> npt.NDArray[np.int8]:
    """Tier index per file of ``sizes`` (in priority order; -1: fits nowhere), fastest tier first."""
    tier = np.full(sizes.shape[0], -1, np.int8)
    remaining: I64 | None = None  # None: all, in order
    for j, budget in enumerate(budgets):
        part = sizes if remaining is None else sizes[remaining]
        if not part.size:
            break
        taken = fill(part, int(budget))
        if remaining is None:
            tier[taken] = j
            remaining = np.flatnonzero(~taken)
        else:
            tier[remaining[taken]] = j
            remaining = remaining[~taken]
    return tier


def sort_by(keys: Ints, idx: I64, bound: int) -> I64:
    """``idx`` (values below ``bound``) ordered by (keys, idx), keys non-negative.

    Packs both in one int64 and sorts values: numpy's value sort is several times faster than
    an argsort; falls back to lexsort when they do not fit in 63 bits.
    """
    k = keys.astype(np.int64)
    bits = max(1, (max(bound, 1) - 1).bit_length())
    if not k.size or (int(k.min()) >= 0 and int(k.max()) < (1 << (62 - bits))):
        k <<= bits
        k |= idx
        k.sort()
        k &= (1 << bits) - 1
        return k
    return idx[np.lexsort((idx, k))]  # pragma: no cover - job positions past 2**40


def priority_order(count: UInts, first: Ints, candidates: I64) -> I64:
    """``candidates`` by descending count, then ascending first use, then ascending index.

    All three packed in one int64 and sorted as values (numpy's value sort is several times
    faster than an argsort); when they do not fit, a value sort of (first use, index) and a
    stable radix argsort on the count.
    """
    if not candidates.size:
        return candidates
    m = int(count.shape[0])
    idx_bits = max(1, (m - 1).bit_length())
    f = first.take(candidates).astype(np.int64)
    cmax = int(np.iinfo(count.dtype).max)
    first_bits = max(1, int(f.max()).bit_length())
    if idx_bits + first_bits + cmax.bit_length() <= 63 and int(f.min()) >= 0:
        key = (cmax - count.take(candidates)).astype(np.int64)
        key <<= first_bits
        key |= f
        key <<= idx_bits
        key |= candidates
        key.sort()
        key &= (1 << idx_bits) - 1
        return key
    by_first = sort_by(first.take(candidates), candidates, m)
    inv = (cmax - count.take(by_first)).astype(count.dtype)
    return by_first[np.argsort(inv, kind="stable")]


# --------------------------------------------------------------------------- assignment


def fragmentation_reserve(largest: int, tiers: int, capacity: int) -> int:
    """Bytes per node kept out of ownership so tier placement can always place what it owns
    (``largest``: the largest cacheable file)."""
    return min(tiers * largest, capacity // 2)


def spread_covers(sizes: I64, read: Bools, budgets: npt.ArrayLike) -> bool:
    """Whether spread mode is guaranteed to give every read, cacheable object a holder."""
    b = np.atleast_2d(np.asarray(budgets, dtype=np.int64))
    if not read.any():
        return True
    largest = int(sizes[read].max())
    if (b.max(axis=1) < largest).any():
        return False
    caps = b.sum(axis=1)
    room = sum(int(c) - fragmentation_reserve(largest, b.shape[1], int(c)) for c in caps)
    return bool(room - b.shape[0] * largest >= int(sizes[read].sum()))


def assign(
    counts: UInts,
    first: Ints,
    sizes: I64,
    cacheable: Bools,
    budgets: npt.ArrayLike,
    *,
    spread: bool,
    pool: Pool | None = None,
    width: int = 1,
) -> Assignment:
    """Tiers and owners for every node (see the module docstring).

    ``counts``/``first``: (nodes, objects) reads over the job and first read position (a value
    above every position for objects the node never reads).  ``budgets``: bytes per tier,
    (tiers,) for every node alike or (nodes, tiers).  ``pool``: threads for the per-node and
    per-object-range steps, ``width`` of them (:mod:`placement.parallel`; the result does not
    depend on either).
    """
    nodes, m = counts.shape
    if first.shape != counts.shape or sizes.shape != (m,) or cacheable.shape != (m,):
        raise ValueError("assign: counts, first, sizes and cacheable disagree in shape")
    b = np.asarray(budgets, dtype=np.int64)
    b = np.broadcast_to(b, (nodes, b.shape[-1])) if b.ndim == 1 else b
    if b.shape[0] != nodes or (b < 0).any():
        raise ValueError("assign: budgets must be non-negative, one row per node or one for all")
    tiers = int(b.shape[1])
    read = cacheable & (counts.max(axis=0) > 0)
    tier_of = np.full((nodes, m), -1, np.int8)
    tier_bytes = np.zeros((nodes, tiers), np.int64)
    tier_files = np.zeros((nodes, tiers), np.int64)
    designated = np.full(m, -1, np.int32)
    largest = int(sizes[read].max()) if read.any() else 0
    caps = [int(b[k].sum()) for k in range(nodes)]
    room = np.array([c - fragmentation_reserve(largest, tiers, c) for c in caps], np.int64)
    if spread and tiers:
        designated = _ownership_rounds(counts, first, sizes, read, room, pool, width)

    def place(k: int) -> None:  # writes node k's rows only
        wanted = counts[k] > 0
        if spread:
            mine = designated == k
            wanted |= mine
        wanted &= read
        order = priority_order(counts[k], first[k], np.flatnonzero(wanted))
        sz = sizes.take(order)
        if spread:
            owned = mine.take(order)
            others = np.flatnonzero(~owned)
            extra_room = int(room[k]) - int(sz[owned].sum())
            owned[others[fill(sz.take(others), max(0, extra_room))]] = True
            order, sz = order[owned], sz[owned]
        placed = place_in_tiers(sz, [int(x) for x in b[k]])
        tier_of[k, order] = placed
        for j in range(tiers):
            on_j = placed == j
            tier_files[k, j] = int(on_j.sum())
            tier_bytes[k, j] = int(sz[on_j].sum())

    per_node(place, nodes, pool)
    earliest, reader = earliest_reader(first, pool, width)
    owner = primary_owners(tier_of, first, pool, width)
    fill_obj, fill_due, fill_off = _fill_orders(tier_of, owner, first, earliest, pool)
    return Assignment(tier_of, owner, fill_obj, fill_due, fill_off, tier_bytes, tier_files, earliest, reader)


def _ownership_rounds(
    counts: UInts, first: Ints, sizes: I64, read: Bools, room: I64, pool: Pool | None = None, width: int = 1
) -> npt.NDArray[np.int32]:
    """Designated holder per read object (-1: none had room); see step 1 of the module docstring."""
    nodes, m = counts.shape
    designated = np.full(m, -1, np.int32)
    pending = np.flatnonzero(read)
    active = room > 0
    room = room.copy()
    span = (int(np.iinfo(counts.dtype).max) + 2) * nodes
    key_type: type[np.unsignedinteger[Any]] = np.uint64
    for t in (np.uint16, np.uint32):
        if span <= np.iinfo(t).max:
            key_type = t
            break
    while pending.size and active.any():
        everything = pending.size == m  # then pending is 0..m-1: rows are read without a gather
        candidates = np.flatnonzero(active).tolist()

        def choose(
            sl: slice, pending: I64 = pending, everything: bool = everything, candidates: list[int] = candidates
        ) -> I32s:
            """The node reading each object most; ties rotate with the object index."""
            sub = pending[sl]
            rot = (sub % nodes).astype(key_type)
            best = np.zeros(sub.size, key_type)
            choice = np.full(sub.size, -1, np.int32)
            for k in candidates:
                key = (counts[k, sl] if everything else counts[k].take(sub)).astype(key_type)
                key *= key_type(nodes)
                key += (rot + key_type(k)) % key_type(nodes)
                key += key_type(1)  # 0 stays "no node yet"
                better = key > best
                choice[better] = k
                np.maximum(best, key, out=best)
            return choice

        choice = np.concatenate(by_columns(choose, pending.size, pool, width))
        left: list[I64] = []
        for k in np.flatnonzero(active).tolist():
            mine = pending[choice == k]
            if not mine.size:
                continue
            if int(sizes[mine].sum()) <= room[k]:
                designated[mine] = k
                room[k] -= int(sizes[mine].sum())
                continue
            order = priority_order(counts[k], first[k], mine)
            taken = fill(sizes[order], int(room[k]))
            designated[order[taken]] = k
            room[k] -= int(sizes[order[taken]].sum())
            left.append(order[~taken])
            active[k] = False
        pending = np.sort(np.concatenate(left)) if left else pending[:0]
    return designated


def primary_owners(tier_of: npt.NDArray[np.int8], first: Ints, pool: Pool | None = None, width: int = 1) -> I32s:
    """Per object, the holder that reads it first (ties: lowest node), -1 when none holds it."""
    parts = by_columns(lambda sl: _primary_owners(tier_of[:, sl], first[:, sl]), tier_of.shape[1], pool, width)
    return np.concatenate(parts)


def _primary_owners(tier_of: npt.NDArray[np.int8], first: Ints) -> I32s:
    nodes, m = tier_of.shape
    never = first.dtype.type(np.iinfo(first.dtype).max)
    owner = np.full(m, -1, np.int32)
    best = np.full(m, never, first.dtype)
    for k in range(nodes):  # a loop of row operations: numpy's argmin over axis 0 is far slower
        held = tier_of[k] >= 0
        key = np.where(held, first[k], never)
        better = key < best
        better |= held & (owner < 0)  # a holder that never reads it still beats nobody
        owner[better] = k
        np.minimum(best, key, out=best)
    return owner


def earliest_reader(first: Ints, pool: Pool | None = None, width: int = 1) -> tuple[Ints, I32s]:
    """Per object, the first read position over all nodes and the node doing it (-1: nobody)."""
    parts = by_columns(lambda sl: _earliest_reader(first[:, sl]), first.shape[1], pool, width)
    return np.concatenate([b for b, _ in parts]), np.concatenate([r for _, r in parts])


def _earliest_reader(first: Ints) -> tuple[Ints, I32s]:
    never = np.iinfo(first.dtype).max
    best = first[0].copy()
    reader = np.where(best < never, 0, -1).astype(np.int32)
    for k in range(1, first.shape[0]):
        better = first[k] < best
        reader[better] = k
        np.minimum(best, first[k], out=best)
    return best, reader


def _fill_orders(
    tier_of: npt.NDArray[np.int8], owner: npt.NDArray[np.int32], first: Ints, earliest: Ints, pool: Pool | None
) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.int64], I64]:
    """Per node: held objects by the job position they are due (NoPFS rule 1: order of first use)."""
    nodes, m = tier_of.shape
    never = np.iinfo(first.dtype).max
    bits = max(1, (m - 1).bit_length())

    def due_order(k: int) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.int64]]:
        held = np.flatnonzero(tier_of[k] >= 0)
        due = first[k].take(held).astype(np.int64)
        use_earliest = owner.take(held) == k
        use_earliest |= due == never
        due[use_earliest] = earliest.take(held[use_earliest])
        if int(due.max(initial=0)) < (1 << (62 - bits)):
            due <<= bits
            due |= held
            due.sort()
            held = due & ((1 << bits) - 1)
            due >>= bits
        else:  # pragma: no cover - job positions past 2**40
            order = np.lexsort((held, due))
            held, due = held[order], due[order]
        return held.astype(np.int32), due

    parts = per_node(due_order, nodes, pool)
    objs = [o for o, _ in parts]
    dues = [d for _, d in parts]
    off = np.zeros(nodes + 1, np.int64)
    np.cumsum([o.size for o in objs], out=off[1:])
    return (
        np.concatenate(objs) if objs else np.zeros(0, np.int32),
        np.concatenate(dues) if dues else np.zeros(0, np.int64),
        off,
    )
