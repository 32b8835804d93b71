"""Which files each rank and each node opens, in which order, epoch by epoch.

A rank opens what its sampler yields, minus the last partial batch when the DataLoader has
``drop_last=True`` (those files are never opened).  The ranks of one node run in lockstep (the
allreduce keeps them within a step), so the node's stream interleaves them batch by batch: step s
is rank r0's batch s, then r1's batch s, and so on.

Everything is computed per epoch on demand and only the last couple of epochs are kept, so a
90-epoch ImageNet job never holds 90 permutations.  :meth:`Streams.node_counts` folds many
epochs into per-node read counts without materialising any per-node stream.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Generator, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from placement.parallel import Pool, run_ahead
from placement.randperm import IndexArray
from placement.samplers import (
    LRU,
    EpochLayout,
    HasEpochLayout,
    SamplerModel,
)

RANK_ORDERS = ("contiguous", "round_robin")
COUNT_MAX = int(np.iinfo(np.uint16).max)
_COUNT_CHUNK = 1 << 15  # files per slice when turning node ids into per-node counts
_BROADCAST_NODES = 96  # up to this many nodes, per-node byte compares beat one scatter
_SPARSE_NEW = 8  # at most 1 in this many (node, file) pairs new last epoch: no inverse this one


@dataclass(frozen=True)
class JobShape:
    """How the job's ranks sit on nodes and how its DataLoader batches.

    ``rank_order``: ``contiguous`` puts ranks k*R..k*R+R-1 on node k (torchrun, srun);
    ``round_robin`` puts rank r on node r % nodes.
    """

    world_size: int
    ranks_per_node: int
    batch_size: int
    drop_last: bool
    rank_order: str = "contiguous"

    def __post_init__(self) -> None:
        for name in ("world_size", "ranks_per_node", "batch_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"{name}: expected a positive integer, got {value!r}")
        if self.world_size % self.ranks_per_node:
            raise ValueError(
                f"ranks_per_node: expected a divisor of world_size ({self.world_size}), got {self.ranks_per_node}"
            )
        order = self.rank_order.replace("-", "_")
        if order not in RANK_ORDERS:
            raise ValueError(f"rank_order: expected 'contiguous' or 'round_robin', got {self.rank_order!r}")
        object.__setattr__(self, "rank_order", order)

    @property
    def nodes(self) -> int:
        return self.world_size // self.ranks_per_node

    def node_of_rank(self, rank: int) -> int:
        self._check_rank(rank)
        if self.rank_order == "contiguous":
            return rank // self.ranks_per_node
        return rank % self.nodes

    def slot_of_rank(self, rank: int) -> int:
        """Where ``rank`` comes among its node's ranks (its turn within a node step)."""
        self._check_rank(rank)
        if self.rank_order == "contiguous":
            return rank % self.ranks_per_node
        return rank // self.nodes

    def ranks_of_node(self, node: int) -> tuple[int, ...]:
        """The node's ranks in ascending order: the order they take turns in the node stream."""
        if not 0 <= node < self.nodes:
            raise ValueError(f"node: expected 0..{self.nodes - 1}, got {node}")
        if self.rank_order == "contiguous":
            start = node * self.ranks_per_node
            return tuple(range(start, start + self.ranks_per_node))
        return tuple(range(node, self.world_size, self.nodes))

    def rank_nodes(self) -> npt.NDArray[np.int32]:
        """node_of_rank for every rank, as an array."""
        ranks = np.arange(self.world_size, dtype=np.int32)
        if self.rank_order == "contiguous":
            return ranks // self.ranks_per_node
        return ranks % self.nodes

    def rank_slots(self) -> npt.NDArray[np.int32]:
        ranks = np.arange(self.world_size, dtype=np.int32)
        if self.rank_order == "contiguous":
            return ranks % self.ranks_per_node
        return ranks // self.nodes

    def placement(self) -> tuple[int, int, str]:
        """Where the ranks sit: what streams must share to be folded together (each dataset's own
        DataLoader batch size and drop_last are already in its streams' lengths)."""
        return (self.world_size, self.ranks_per_node, self.rank_order)

    def opened_per_rank(self, per_rank: int) -> int:
        """How many of a rank's sampler entries are opened: drop_last drops the partial batch."""
        return per_rank - per_rank % self.batch_size if self.drop_last else per_rank

    def _check_rank(self, rank: int) -> None:
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank: expected 0..{self.world_size - 1}, got {rank}")


@dataclass(frozen=True, eq=False)
class EpochInverse:
    """File index -> where it is read in one epoch, O(1) per query.

    ``rank_of[i]`` is -1 for a file not read this epoch (dropped).  A file read more than once
    (DistributedSampler padding, or every rank reading the same order) has ``duplicated[i]`` set
    and ``rank_of``/``pos_of`` give its earliest read: the smallest position, then the smallest
    rank; :meth:`occurrences` lists them all.  When every rank reads the same order (random,
    sequential, list samplers), that is rank 0, and ``node_pos`` is the file's position in every
    node's stream alike.
    """

    epoch: int
    shape: JobShape
    length: int  # entries each rank opens this epoch
    rank_of: npt.NDArray[np.int32]
    pos_of: npt.NDArray[np.int64]
    duplicated: npt.NDArray[np.bool_]
    _layout: EpochLayout = field(repr=False)

    @property
    def layout(self) -> EpochLayout:
        """The epoch's order this inverse was built from (kept alive with it: no permutation to redo)."""
        return self._layout

    def rank_row(self, rank: int) -> IndexArray:
        """What ``rank`` opens this epoch, in order (a view, from the kept layout)."""
        lay = self._layout
        if lay.shared:
            return lay.order[: self.length]
        return lay.order[rank : self.length * self.shape.world_size : self.shape.world_size]

    def node_of(self, idx: int) -> int:
        """The node of the earliest read of file ``idx``, or -1."""
        rank = int(self.rank_of[idx])
        return -1 if rank < 0 else self.shape.node_of_rank(rank)

    def node_pos(self, idx: int) -> int:
        """Position of the earliest read of file ``idx`` in its node's stream, or -1."""
        return int(self.node_positions(np.array([idx]))[0])

    def nodes_of(self, idx: npt.ArrayLike) -> npt.NDArray[np.int32]:
        """:meth:`node_of` for many files at once."""
        ranks = self.rank_of[np.asarray(idx, dtype=np.int64)]
        out = self.shape.rank_nodes()[np.maximum(ranks, 0)]
        out[ranks < 0] = -1
        return out

    def node_positions(self, idx: npt.ArrayLike) -> npt.NDArray[np.int64]:
        """:meth:`node_pos` for many files at once."""
        sel = np.asarray(idx, dtype=np.int64)
        ranks = self.rank_of[sel]
        slots = self.shape.rank_slots()[np.maximum(ranks, 0)].astype(np.int64)
        out = node_positions(self.pos_of[sel], slots, self.length, self.shape)
        out[ranks < 0] = -1
        return out

    def occurrences(self, idx: int) -> list[tuple[int, int]]:
        """Every (rank, position) reading file ``idx`` this epoch, earliest first.

        O(1) for files read once; a scan of the epoch for duplicated ones (rare: padding).
        """
        rank = int(self.rank_of[idx])
        if rank < 0:
            return []
        if not self.duplicated[idx]:
            return [(rank, int(self.pos_of[idx]))]
        world = self.shape.world_size
        layout = self._layout
        if layout.shared:
            hits = np.flatnonzero(layout.order[: self.length] == idx)
            return [(int(r), int(p)) for p in hits for r in range(world)]
        hits = np.flatnonzero(layout.order[: self.length * world] == idx)
        return [(int(t % world), int(t // world)) for t in hits]


def node_positions(pos: npt.NDArray[Any], slot: npt.NDArray[Any], length: int, shape: JobShape) -> npt.NDArray[Any]:
    """Position in the node stream of rank-stream entry ``pos`` of the rank taking turn ``slot``.

    The ranks of a node take turns batch by batch: full steps hold ranks_per_node batches of
    batch_size, a last partial step (no drop_last) ranks_per_node batches of the remainder.  In a
    full step: pos + (m - 1) * (pos - within) + slot * b, with within = pos % b.  Computed in
    ``pos``'s integer type (the caller picks one that holds the result); ``pos`` is not modified.
    """
    b, m = shape.batch_size, shape.ranks_per_node
    full = length // b
    within = pos & (b - 1) if b & (b - 1) == 0 else pos % b
    out = pos - within
    out *= m - 1
    out += pos
    out += slot * b
    tail = pos >= full * b
    if tail.any():  # the last partial batches: each rank's remainder in turn
        rem = length - full * b
        out[tail] = full * m * b + slot[tail] * rem + within[tail]
    result: npt.NDArray[Any] = out
    return result


def entry_nodes(t: npt.NDArray[Any], shape: JobShape) -> npt.NDArray[Any]:
    """Node of strided entries ``t`` (entry t is read by rank t % world_size), as a new array of
    ``t``'s type; bit operations where the sizes are powers of two."""
    world, per_node = shape.world_size, shape.ranks_per_node
    rank = t & (world - 1) if world & (world - 1) == 0 else t % world
    if shape.rank_order == "contiguous":
        if per_node & (per_node - 1) == 0:
            rank >>= per_node.bit_length() - 1
        else:
            rank //= per_node
        return rank
    rank %= shape.nodes
    return rank


def entry_positions(t: npt.NDArray[Any], length: int, shape: JobShape) -> npt.NDArray[Any]:
    """Node-stream position of strided entries ``t`` (rank t % W reads it as its entry t // W)."""
    world, per_node = shape.world_size, shape.ranks_per_node
    if world & (world - 1) == 0:
        rank = t & (world - 1)
        pos = t >> (world.bit_length() - 1)
    else:
        pos, rank = np.divmod(t, world)
    # the rank's turn within its node (JobShape.slot_of_rank), in place
    if shape.rank_order == "round_robin":
        rank //= shape.nodes
    elif per_node & (per_node - 1) == 0:
        rank &= per_node - 1
    else:
        rank %= per_node
    return node_positions(pos, rank, length, shape)


class Streams:
    """Per-rank and per-node access streams of one dataset in one job, epoch by epoch."""

    def __init__(self, sampler: SamplerModel, shape: JobShape, cache_epochs: int = 2) -> None:
        if sampler.world_size != shape.world_size:
            raise ValueError(f"the sampler models {sampler.world_size} ranks but the job has {shape.world_size}")
        self.sampler = sampler
        self.shape = shape
        self.n = int(sampler.n)
        self.per_rank = int(sampler.num_samples())
        self.length = shape.opened_per_rank(self.per_rank)  # entries each rank opens per epoch
        self._layouts: LRU[int, EpochLayout] = LRU(cache_epochs)
        self._inverses: LRU[int, EpochInverse] = LRU(cache_epochs)

    # ---- per epoch ---------------------------------------------------------------------------

    def layout(self, epoch: int) -> EpochLayout:
        """The epoch in compact form (shared order, or DistributedSampler-style strided order)."""
        if isinstance(self.sampler, HasEpochLayout):
            return self.sampler.epoch_layout(epoch)
        return self._layouts.get(epoch, lambda: self._generic_layout(epoch))

    def _generic_layout(self, epoch: int) -> EpochLayout:
        """Any SamplerModel: interleave its rank lists into one strided global order."""
        rows = [np.asarray(self.sampler.rank_indices(epoch, r), dtype=np.int64) for r in range(self.shape.world_size)]
        if any(row.shape != (self.per_rank,) for row in rows):
            raise ValueError("sampler model: every rank must yield num_samples() indices")
        order = np.stack(rows, axis=1).reshape(-1) if rows else np.zeros(0, dtype=np.int64)
        order.setflags(write=False)
        return EpochLayout(order=order, shared=False, distinct=0)

    def rank_matrix(self, epoch: int) -> IndexArray:
        """(world_size, length) view: row r is what rank r opens (do not write to it)."""
        lay = self.layout(epoch)
        world, length = self.shape.world_size, self.length
        if lay.shared:
            return np.broadcast_to(lay.order[:length], (world, length))
        return lay.order[: length * world].reshape(length, world).T

    def rank_stream(self, epoch: int, rank: int) -> IndexArray:
        """The files ``rank`` opens in ``epoch``, in order (DataLoader drop_last applied)."""
        self.shape._check_rank(rank)
        return np.ascontiguousarray(self.rank_matrix(epoch)[rank])

    def node_stream(self, epoch: int, node: int) -> IndexArray:
        """The node's ranks interleaved in step by batch."""
        ranks = list(self.shape.ranks_of_node(node))
        rows = self.rank_matrix(epoch)[ranks]  # (m, length), a copy
        b = self.shape.batch_size
        full = self.length // b
        head = rows[:, : full * b].reshape(len(ranks), full, b).transpose(1, 0, 2).reshape(-1)
        tail = rows[:, full * b :].reshape(-1)
        return np.concatenate([head, tail])

    def epoch_inverse(self, epoch: int) -> EpochInverse:
        """File -> (rank, position) and (node, position) for ``epoch`` (built in O(n), cached)."""
        return self._inverses.get(epoch, lambda: self._build_inverse(epoch))

    def fresh_inverse(self, epoch: int) -> EpochInverse:
        """:meth:`epoch_inverse` without touching any cache (a scan over many epochs must not evict
        the few epochs the readers are in)."""
        fresh = getattr(self.sampler, "fresh_layout", None)
        return self._build_inverse(epoch, fresh(epoch) if fresh is not None else None)

    def _build_inverse(self, epoch: int, lay: EpochLayout | None = None) -> EpochInverse:
        if lay is None:
            lay = self.layout(epoch)
        world, length = self.shape.world_size, self.length
        flat = lay.order[:length] if lay.shared else lay.order[: length * world]
        first_t, duplicated = _first_reads(flat, lay.distinct, self.n)
        read = first_t >= 0
        # sequential passes only; the one random pass was the scatter in _first_reads
        if lay.shared:
            rank_of = np.where(read, np.int32(0), np.int32(-1))
            pos_of = first_t.astype(np.int64)
            if world > 1:
                duplicated |= read
        else:
            pos, rank = np.divmod(first_t, world)  # -1 // world == -1: unread stays -1
            rank_of = np.where(read, rank, -1).astype(np.int32)
            pos_of = pos.astype(np.int64)
        return EpochInverse(epoch, self.shape, length, rank_of, pos_of, duplicated, lay)

    # ---- over many epochs ----------------------------------------------------------------------

    def node_counts(
        self, epochs: Iterable[int], node: int | None = None, *, pool: Pool | None = None, width: int = 1
    ) -> npt.NDArray[np.uint16]:
        """How often each node reads each file over ``epochs``: (nodes, n), or (n,) for one node.

        A file a node reads twice in an epoch (padding) counts twice.  ``pool`` computes the next
        ``width`` epochs' permutations while this one is counted (numpy and torch release the GIL;
        None: each in its turn, here).  Raises ValueError if a count could pass 65535.
        """
        epoch_list = [int(e) for e in epochs]
        if node is not None and not 0 <= node < self.shape.nodes:
            raise ValueError(f"node: expected 0..{self.shape.nodes - 1}, got {node}")
        reads = NodeReads(self.shape, self.n, np.uint16, node=node)
        bound = 0
        with contextlib.closing(layouts_ahead([self], [(0, e) for e in epoch_list], pool, width)) as layouts:
            for lay in layouts:
                bound += self.read_bound(lay)
                if bound > COUNT_MAX:
                    raise ValueError(f"node_counts: a file could be read more than {COUNT_MAX} times; ask fewer epochs")
                reads.add(self, lay)
        counts: npt.NDArray[np.uint16] = reads.counts
        return counts if node is None else counts[0]

    def read_bound(self, lay: EpochLayout) -> int:
        """Most reads of one file by one node in this epoch (to size or guard counters)."""
        flat = lay.order[: self.length] if lay.shared else lay.order[: self.length * self.shape.world_size]
        if not flat.size:
            return 0
        if lay.distinct >= flat.size:
            repeats = 1
        elif lay.distinct >= self.n:  # a full permutation, then cyclic padding
            repeats = -(-flat.size // self.n)
        else:
            repeats = int(np.bincount(flat).max())
        return repeats * self.shape.ranks_per_node if lay.shared else repeats


def layouts_ahead(
    streams: Sequence[Streams], reads: Sequence[tuple[int, int]], pool: Pool | None, width: int
) -> Generator[EpochLayout, None, None]:
    """The layouts of ``reads`` ((dataset, sampler epoch) pairs) in order, with up to ``width``
    of the coming permutations computed in ``pool`` meanwhile (numpy and torch release the GIL;
    :func:`placement.parallel.run_ahead`; None: none ahead).

    Only samplers that shuffle and offer a pure per-epoch ``fresh_layout`` run ahead; the others
    are stateful or trivial and run in order here (and do not use up the look-ahead).
    """
    calls = [layout_calls(streams[d], e) for d, e in reads]
    return run_ahead([inline for inline, _ in calls], [ahead for _, ahead in calls], pool, width)


def layout_calls(st: Streams, epoch: int) -> tuple[Callable[[], EpochLayout], Callable[[], EpochLayout] | None]:
    """The call giving ``st``'s layout of ``epoch`` in order, and a pure one that may run ahead in
    a pool (:func:`layouts_ahead`), or None where the sampler does not shuffle or has no pure
    per-epoch ``fresh_layout``."""
    sampler = st.sampler
    heavy = hasattr(sampler, "fresh_layout") and bool(getattr(sampler, "shuffle", False))
    return functools.partial(st.layout, epoch), functools.partial(_fresh_layout, sampler, epoch) if heavy else None


def _fresh_layout(sampler: Any, epoch: int) -> EpochLayout:
    layout: EpochLayout = sampler.fresh_layout(epoch)
    return layout


class NodeReads:
    """Per-node read counts over epochs and, optionally, where each node first reads each file.

    The one implementation of "how often does node k read file f" behind
    :meth:`Streams.node_counts` and :func:`placement.frequency.access_stats`.  Arrays are
    (rows, files), a row per node (or a single row for ``node``); several datasets share them at
    offsets (global ids).  ``first`` holds job positions: an epoch's node-stream position plus the
    ``start`` given for it; :attr:`never` where a node never reads a file.

    A strided epoch costs a node id per file (a byte scattered by entry, or taken from the
    order's inverse when first uses need positions), then byte compares per node row in
    cache-sized slices; first uses are computed only for (node, file) pairs not read before,
    tracked by a bit per node and file where nodes <= 64.  Once few pairs are new, an epoch
    skips the inverse (see :meth:`_add_strided_sparse`).
    """

    def __init__(
        self,
        shape: JobShape,
        files: int,
        count_type: type[np.unsignedinteger[Any]] = np.uint16,
        first_type: type[np.signedinteger[Any]] | None = None,
        *,
        node: int | None = None,
    ) -> None:
        if node is not None and first_type is not None:
            raise ValueError("NodeReads: first uses are kept for all nodes, not for one")
        self.shape = shape
        self.files = files
        self.node = node
        rows = shape.nodes if node is None else 1
        self.counts: npt.NDArray[np.unsignedinteger[Any]] = np.zeros((rows, files), count_type)
        self.first: npt.NDArray[np.signedinteger[Any]] | None = None
        self._seen: npt.NDArray[np.unsignedinteger[Any]] | None = None
        self._entry_nodes: npt.NDArray[Any] | None = None  # see _pattern
        self._new_last: dict[int, int] = {}  # per dataset offset: new pairs in its last epoch
        if first_type is not None:
            self.first = np.full((rows, files), np.iinfo(first_type).max, first_type)
            for t in (np.uint8, np.uint16, np.uint32, np.uint64):
                if shape.nodes <= np.iinfo(t).bits:
                    self._seen = np.zeros(files, t)  # bit k: node k has read the file
                    break

    @property
    def never(self) -> int:
        """The first-use value of a file a node never reads."""
        if self.first is None:
            raise ValueError("NodeReads: no first uses kept")
        return int(np.iinfo(self.first.dtype).max)

    def add(self, streams: Streams, lay: EpochLayout, *, offset: int = 0, start: int = 0) -> None:
        """Fold one epoch of ``streams`` (its layout ``lay``), its files at ``offset``, its node
        streams starting at job position ``start``."""
        if streams.shape.placement() != self.shape.placement():
            raise ValueError("NodeReads: the streams belong to another job shape")
        if lay.shared:
            self._add_shared(streams, lay, offset, start)
        else:
            self._add_strided(streams, lay, offset, start)

    # ---- strided: rank r reads order[r::W] -----------------------------------------------------

    def _add_strided(self, st: Streams, lay: EpochLayout, off: int, start: int) -> None:
        shape, n = self.shape, st.n
        flat = lay.order[: st.length * shape.world_size]
        u = min(lay.distinct, flat.size)
        if self.first is None:  # counts only: scatter each entry's node id, no inverse needed
            node = np.full(n, shape.nodes, self._pattern(u).dtype)  # beyond every node: no row
            node[flat[:u]] = self._pattern(u)
            self._count(node, off, n)
        elif self._seen is not None and u >= n and self._new_last.get(off, n) * _SPARSE_NEW <= n:
            self._add_strided_sparse(flat[:u], st.length, off, start)
        else:
            inv = _first_positions(flat, u, n)  # entry t of each file read in flat[:u], -1 unread
            node = entry_nodes(inv, shape)
            unread = None if u >= n else inv < 0
            if unread is not None:
                node[unread] = shape.nodes
            if shape.nodes < 255:  # node ids as bytes: less to read in every pass below
                node = node.astype(np.uint8)
            self._count(node, off, n)
            self._first_uses(node, inv, unread, st.length, off, start)
        if u < flat.size:  # padding (or an order of unknown shape): repeats, with ufunc.at
            self._add_repeats(flat[u:], np.arange(u, flat.size, dtype=np.int64), st.length, off, start)

    def _add_strided_sparse(self, perm: IndexArray, length: int, off: int, start: int) -> None:
        """A permutation epoch when few (node, file) pairs are still new (later epochs): no inverse.

        Each entry's node id is scattered as a byte (into an array about the size of L2, where
        the int32 inverse is four times that); the new pairs are then found in entry order, so
        their positions come straight from their entry numbers and only their files are
        gathered.  Their first-use writes land in random order, which is why early epochs,
        where most pairs are new, take the inverse instead.
        """
        assert self.first is not None and self._seen is not None
        n = perm.shape[0]
        pattern = self._pattern(n)
        node = np.empty(n, pattern.dtype)
        node[perm] = pattern
        self._count(node, off, n)
        seen = self._seen[off : off + n]
        bits = np.left_shift(seen.dtype.type(1), node, dtype=seen.dtype, casting="unsafe")
        fresh = (seen & bits) != bits
        seen |= bits
        new_t = np.flatnonzero(fresh.take(perm))  # entries reading a (node, file) pair first
        self._new_last[off] = int(new_t.shape[0])
        pos = entry_positions(new_t.astype(self.first.dtype), length, self.shape)
        pos += self.first.dtype.type(start)
        cells = pattern.take(new_t).astype(np.int64)
        cells *= self.files
        cells += perm.take(new_t)
        cells += off
        self.first.reshape(-1)[cells] = pos

    def _pattern(self, u: int) -> npt.NDArray[Any]:
        """Node id of strided entries 0..u-1 (bytes where they fit): the same every epoch, kept."""
        if self._entry_nodes is None or self._entry_nodes.shape[0] != u:
            ids = entry_nodes(np.arange(u, dtype=np.int64), self.shape)
            self._entry_nodes = ids.astype(np.uint8 if self.shape.nodes < 255 else np.int32)
            self._entry_nodes.setflags(write=False)
        return self._entry_nodes

    def _count(self, node: npt.NDArray[Any], off: int, n: int) -> None:
        """counts[k, off + f] += 1 where node[f] == k (node[f] == nodes: not read)."""
        rows = self.counts[:, off : off + n]
        if self.node is not None:
            rows[0] += node == self.node
            return
        nodes = self.shape.nodes
        if nodes <= _BROADCAST_NODES:
            # a byte compare per (node, file), in cache-sized slices: no random writes at all
            ids = np.arange(nodes, dtype=np.uint8)[:, None]
            for lo in range(0, n, _COUNT_CHUNK):
                rows[:, lo : lo + _COUNT_CHUNK] += node[None, lo : lo + _COUNT_CHUNK] == ids
            return
        # one add over distinct (node, file) cells, in file order within each node's row
        files = np.flatnonzero(node < nodes)
        cells = node.take(files).astype(np.int64)
        cells *= self.files
        cells += files
        cells += off
        self.counts.reshape(-1)[cells] += 1

    def _first_uses(
        self,
        node: npt.NDArray[Any],
        inv: npt.NDArray[Any],
        unread: npt.NDArray[np.bool_] | None,
        length: int,
        off: int,
        start: int,
    ) -> None:
        """Record the node-stream position of every (node, file) pair read for the first time."""
        assert self.first is not None
        n = inv.shape[0]
        if self._seen is not None:
            seen = self._seen[off : off + n]
            bits = np.left_shift(seen.dtype.type(1), node, dtype=seen.dtype, casting="unsafe")
            if unread is not None:
                bits[unread] = 0
            new = np.flatnonzero((seen & bits) != bits)
            seen |= bits
            self._new_last[off] = int(new.shape[0])
            cells = node.take(new).astype(np.int64)
            cells *= self.files
            cells += new
            cells += off
        else:  # too many nodes for a bit each: a pair is new while its first use is unset
            new = np.arange(n, dtype=np.int64) if unread is None else np.flatnonzero(~unread)
            cells = node.take(new).astype(np.int64)
            cells *= self.files
            cells += new
            cells += off
            fresh = np.flatnonzero(self.first.reshape(-1).take(cells) == self.never)
            new, cells = new.take(fresh), cells.take(fresh)
        pos = entry_positions(inv.take(new).astype(self.first.dtype, copy=False), length, self.shape)
        pos += self.first.dtype.type(start)
        self.first.reshape(-1)[cells] = pos

    def _add_repeats(self, files: IndexArray, t: IndexArray, length: int, off: int, start: int) -> None:
        """Strided entries ``t`` reading ``files``, any of them possibly again: unbuffered adds."""
        node = entry_nodes(t, self.shape)
        gid = files + off
        if self.node is not None:
            np.add.at(self.counts[0], gid[node == self.node], 1)
            return
        np.add.at(self.counts, (node, gid), 1)
        if self.first is not None:
            pos = entry_positions(t, length, self.shape) + start
            np.minimum.at(self.first, (node, gid), pos.astype(self.first.dtype))
            if self._seen is not None:
                bits = np.left_shift(self._seen.dtype.type(1), node, dtype=self._seen.dtype, casting="unsafe")
                np.bitwise_or.at(self._seen, gid, bits)

    # ---- shared: every rank reads order[:length] -----------------------------------------------

    def _add_shared(self, st: Streams, lay: EpochLayout, off: int, start: int) -> None:
        """Each node reads each entry once per rank it hosts; its first rank (slot 0) reads it first."""
        per_node = self.shape.ranks_per_node
        n, length = st.n, st.length
        flat = lay.order[:length]
        u = min(lay.distinct, flat.size)
        inv = _first_positions(flat, u, n)
        files = None if u >= n else np.flatnonzero(inv >= 0)
        rows = self.counts[:, off : off + n]
        if files is None:
            rows += rows.dtype.type(per_node)
        else:
            rows[:, files] += rows.dtype.type(per_node)
        if self.first is not None:
            t = inv if files is None else inv.take(files)
            pos = node_positions(t.astype(self.first.dtype), np.zeros(t.shape[0], self.first.dtype), length, self.shape)
            pos += self.first.dtype.type(start)
            first = self.first[:, off : off + n]
            if files is None:
                np.minimum(first, pos[None, :], out=first)
            else:
                first[:, files] = np.minimum(first[:, files], pos[None, :])
        if u < flat.size:
            once = np.zeros(n, np.int64)
            np.add.at(once, flat[u:], per_node)
            rows += once.astype(rows.dtype)[None, :]
            if self.first is not None:
                tt = np.arange(u, flat.size, dtype=np.int64)
                p = node_positions(tt, np.zeros_like(tt), length, self.shape) + start
                low = np.full(n, self.never, np.int64)
                np.minimum.at(low, flat[u:], p)
                first = self.first[:, off : off + n]
                np.minimum(first, low.astype(first.dtype)[None, :], out=first)
        if self._seen is not None:  # every node has read these files now
            everyone = self._seen.dtype.type((1 << self.shape.nodes) - 1)
            seen = self._seen[off : off + n]
            if files is None:
                seen |= everyone
            else:
                seen[files] |= everyone
            seen[flat[u:]] |= everyone


def _first_positions(flat: IndexArray, distinct: int, n: int) -> npt.NDArray[np.signedinteger[Any]]:
    """For each of ``n`` files, the index t of its read in ``flat[:distinct]`` (duplicate-free), or -1.

    int32 where it fits: this one random scatter is the main cost of an inverse.
    """
    u = min(distinct, flat.size)
    t_type: type[np.signedinteger[Any]] = np.int32 if flat.size <= np.iinfo(np.int32).max else np.int64
    if u >= n:
        first_t: npt.NDArray[np.signedinteger[Any]] = np.empty(n, dtype=t_type)
    else:
        first_t = np.full(n, -1, dtype=t_type)
    first_t[flat[:u]] = np.arange(u, dtype=t_type)
    return first_t


def _first_reads(
    flat: IndexArray, distinct: int, n: int
) -> tuple[npt.NDArray[np.signedinteger[Any]], npt.NDArray[np.bool_]]:
    """For each file, the first index t with ``flat[t] == file`` (-1: absent) and whether it repeats.

    ``flat[:distinct]`` is known duplicate-free: a direct scatter does it.  The rest (padding, or
    orders of unknown shape) goes through ``np.unique``, whose first-index answer is defined.
    """
    first_t = _first_positions(flat, distinct, n)
    duplicated = np.zeros(n, dtype=np.bool_)
    u = min(distinct, flat.size)
    rest = flat[u:]
    if rest.size:
        seen = first_t[rest] >= 0
        duplicated[rest[seen]] = True
        fresh = np.flatnonzero(~seen)
        files, where, times = np.unique(rest[fresh], return_index=True, return_counts=True)
        first_t[files] = u + fresh[where]
        duplicated[files[times > 1]] = True
    return first_t, duplicated
