"""Which files each rank and each node opens, in which order, epoch by epoch.

A rank opens what its sampler yields, minus the last partial batch when the DataLoader has
``drop_last=True`` (those files are never opened).  The ranks of one node run in lockstep (the
allreduce keeps them within a step), so the node's stream interleaves them batch by batch: step s
is rank r0's batch s, then r1's batch s, and so on (DESIGN 4.5).

Everything is computed per epoch on demand and only the last couple of epochs are kept, so a
90-epoch ImageNet job never holds 90 permutations.  :meth:`Streams.node_counts` folds many
epochs into per-node read counts without materialising any per-node stream.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from placement.randperm import IndexArray
from placement.samplers import (
    LRU,
    DistributedSamplerModel,
    EpochLayout,
    HasEpochLayout,
    SamplerModel,
)

RANK_ORDERS = ("contiguous", "round_robin")
COUNT_MAX = int(np.iinfo(np.uint16).max)
_COUNT_CHUNK = 1 << 15  # files per slice when turning node ids into per-node counts
_BROADCAST_NODES = 96  # up to this many nodes, per-node byte compares beat one scatter


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

    def node_of(self, idx: int) -> int:
        """The node of the earliest read of file ``idx``, or -1."""
        rank = int(self.rank_of[idx])
        return -1 if rank < 0 else self.shape.node_of_rank(rank)

    def node_pos(self, idx: int) -> int:
        """Position of the earliest read of file ``idx`` in its node's stream, or -1."""
        rank = int(self.rank_of[idx])
        if rank < 0:
            return -1
        return _node_position(int(self.pos_of[idx]), self.shape.slot_of_rank(rank), self.length, self.shape)

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
        out = _node_positions(self.pos_of[sel], slots, self.length, self.shape)
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


def _node_position(pos: int, slot: int, length: int, shape: JobShape) -> int:
    """Position in the node stream of entry ``pos`` of the rank whose turn is ``slot``.

    Full steps hold ranks_per_node batches of batch_size; a last partial step (no drop_last)
    holds ranks_per_node batches of the remainder.
    """
    b, m = shape.batch_size, shape.ranks_per_node
    full = length // b
    step, within = divmod(pos, b)
    if step < full:
        return step * m * b + slot * b + within
    return full * m * b + slot * (length - full * b) + within


def _node_positions(
    pos: npt.NDArray[np.int64], slot: npt.NDArray[np.int64], length: int, shape: JobShape
) -> npt.NDArray[np.int64]:
    """:func:`_node_position` over arrays."""
    b, m = shape.batch_size, shape.ranks_per_node
    full = length // b
    step, within = np.divmod(pos, b)
    in_full = step * (m * b) + slot * b + within
    in_tail = full * (m * b) + slot * (length - full * b) + within
    return np.where(step < full, in_full, in_tail).astype(np.int64)


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
        self._pattern: npt.NDArray[np.unsignedinteger[Any]] | None = None  # see _node_pattern

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

    def _build_inverse(self, epoch: int) -> EpochInverse:
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
        self, epochs: Iterable[int], node: int | None = None, *, workers: int | None = None
    ) -> npt.NDArray[np.uint16]:
        """How often each node reads each file over ``epochs``: (nodes, n), or (n,) for one node.

        A file a node reads twice in an epoch (padding) counts twice.  ``workers`` threads compute
        the next epochs' permutations while this one is counted (numpy and torch release the GIL);
        default: up to 4, as the machine allows.  Raises ValueError if a count could pass 65535.
        """
        epoch_list = [int(e) for e in epochs]
        if node is not None and not 0 <= node < self.shape.nodes:
            raise ValueError(f"node: expected 0..{self.shape.nodes - 1}, got {node}")
        nodes = self.shape.nodes
        counts = np.zeros((nodes if node is None else 1, self.n), dtype=np.uint16)
        shared = np.zeros(self.n, dtype=np.uint16)  # per-rank counts of shared-order epochs
        shared_epochs = 0
        bound = 0
        for lay in self._layouts_ahead(epoch_list, workers):
            bound += self._count_bound(lay)
            if bound > COUNT_MAX:
                raise ValueError(f"node_counts: a file could be read more than {COUNT_MAX} times; ask fewer epochs")
            if lay.shared:
                _add_reads(shared, lay.order[: self.length], lay.distinct)
                shared_epochs += 1
            else:
                self._count_strided(counts, lay, node)
        if shared_epochs:
            counts += shared * np.uint16(self.shape.ranks_per_node)
        return counts if node is None else counts[0]

    def _count_bound(self, lay: EpochLayout) -> int:
        """Most reads of one file by one node in this epoch (for the uint16 guard)."""
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

    def _count_strided(self, counts: npt.NDArray[np.uint16], lay: EpochLayout, node: int | None) -> None:
        world = self.shape.world_size
        flat = lay.order[: self.length * world]
        u = min(lay.distinct, flat.size)
        rank_nodes = self.shape.rank_nodes()
        if node is not None:
            ranks = np.array(self.shape.ranks_of_node(node), dtype=np.int64)
            t = (np.arange(self.length, dtype=np.int64)[:, None] * world + ranks).reshape(-1)
            counts[0, flat[t[t < u]]] += np.uint16(1)  # distinct files: plain fancy add is exact
            np.add.at(counts[0], flat[t[t >= u]], 1)
            return
        nodes = self.shape.nodes
        pattern = self._node_pattern(u)  # node of read t, for t < u
        node_of_file = np.full(self.n, np.iinfo(pattern.dtype).max, dtype=pattern.dtype)  # max: unread
        node_of_file[flat[:u]] = pattern  # a scatter into a small array (a byte per file)
        if nodes <= _BROADCAST_NODES:
            # a byte compare per (node, file), in cache-sized slices: no random writes at all
            ids = np.arange(nodes, dtype=pattern.dtype)[:, None]
            for lo in range(0, self.n, _COUNT_CHUNK):
                block = node_of_file[lo : lo + _COUNT_CHUNK]
                counts[:, lo : lo + _COUNT_CHUNK] += block[None, :] == ids
        else:
            # one fancy add over distinct (node, file) cells, in file order: the writes stream
            # through the nodes' rows instead of jumping around all of them at random
            files = np.flatnonzero(node_of_file != np.iinfo(pattern.dtype).max)
            cells = node_of_file[files].astype(np.int64) * self.n + files
            counts.reshape(-1)[cells] += np.uint16(1)
        if u < flat.size:  # padding: the same files again, possibly on other nodes
            t = np.arange(u, flat.size, dtype=np.int64)
            np.add.at(counts, (rank_nodes[t % world], flat[u:]), 1)

    def _node_pattern(self, u: int) -> npt.NDArray[np.unsignedinteger[Any]]:
        """``node_of_rank(t % world)`` for reads t < u, as small ints (the same every epoch)."""
        cached = self._pattern
        if cached is None or cached.size != u:
            id_type = np.uint8 if self.shape.nodes < 255 else np.uint32
            cached = np.resize(self.shape.rank_nodes().astype(id_type), u)
            cached.setflags(write=False)
            self._pattern = cached
        return cached

    def _layouts_ahead(self, epochs: list[int], workers: int | None) -> Iterator[EpochLayout]:
        """Layouts of ``epochs`` in order; independent epochs are computed ahead in threads."""
        sampler = self.sampler
        if workers is None:
            workers = min(4, os.cpu_count() or 1)
        if workers <= 1 or len(epochs) < 2 or not isinstance(sampler, DistributedSamplerModel):
            for e in epochs:
                yield self.layout(e)
            return
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="seerfs-epochs") as pool:
            pending: list[Future[EpochLayout]] = []
            ahead = iter(epochs)
            for e in ahead:
                pending.append(pool.submit(sampler.fresh_layout, e))
                if len(pending) >= workers:
                    break
            while pending:
                lay = pending.pop(0).result()
                nxt = next(ahead, None)
                if nxt is not None:
                    pending.append(pool.submit(sampler.fresh_layout, nxt))
                yield lay


def _first_reads(
    flat: IndexArray, distinct: int, n: int
) -> tuple[npt.NDArray[np.signedinteger[Any]], npt.NDArray[np.bool_]]:
    """For each file, the first index t with ``flat[t] == file`` (-1: absent) and whether it repeats.

    ``flat[:distinct]`` is known duplicate-free: a direct scatter does it.  The rest (padding, or
    orders of unknown shape) goes through ``np.unique``, whose first-index answer is defined.
    """
    # int32 where it fits: this random scatter is the cost of the whole inverse
    t_type: type[np.signedinteger[Any]] = np.int32 if flat.size <= np.iinfo(np.int32).max else np.int64
    first_t: npt.NDArray[np.signedinteger[Any]] = np.full(n, -1, dtype=t_type)
    duplicated = np.zeros(n, dtype=np.bool_)
    u = min(distinct, flat.size)
    first_t[flat[:u]] = np.arange(u, dtype=t_type)
    rest = flat[u:]
    if rest.size:
        seen = first_t[rest] >= 0
        duplicated[rest[seen]] = True
        fresh = np.flatnonzero(~seen)
        files, where, times = np.unique(rest[fresh], return_index=True, return_counts=True)
        first_t[files] = u + fresh[where]
        duplicated[files[times > 1]] = True
    return first_t, duplicated


def _add_reads(counts: npt.NDArray[np.uint16], order: IndexArray, distinct: int) -> None:
    """counts[f] += number of times f occurs in ``order``."""
    u = min(distinct, order.size)
    counts[order[:u]] += np.uint16(1)
    if u < order.size:
        np.add.at(counts, order[u:], 1)
