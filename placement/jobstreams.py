"""The whole job's reads per epoch: every rank's stream over all datasets, in global file ids.

A job reads its training set every epoch and, after some epochs, a validation set that *follows*
it (``imagenet/val`` in order at the end of each epoch).  Global file ids put the datasets side by
side (``offset + index``).  For planning, one epoch of a rank is its training stream, then its
validation stream when one is due; :class:`EpochMap` holds those combined streams and their
inverse (global id -> rank, position).

Followers read their sampler's epoch-0 order every time: validation loaders are not given
``set_epoch`` (and usually do not shuffle at all).

``epochs`` is the *planning horizon*: how many epochs tier assignment and access counts look at.
A job may run longer (or be resumed at or past it): a DistributedSampler's epoch e is seeded with
``seed + e``, so every stream here is computed lazily for any epoch >= 0.  ``follows``/``every``
say where planning puts a dataset's reads; the daemon's cursor (:mod:`placement.cursor`) does not
rely on them: it follows each dataset on its own (:meth:`JobStreams.variants`,
:meth:`JobStreams.dataset_of`) and learns when passes come from the opens.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from placement.frameworks import framework_alternatives
from placement.samplers import LRU, unshuffled_alternatives
from placement.streams import JobShape, Streams


@dataclass(frozen=True)
class DatasetStreams:
    """One dataset of the job: its streams, where its ids start, and when it is read."""

    streams: Streams
    offset: int  # global id of its file 0
    follows: int | None = None  # index (in the job's list) of the dataset it follows, or None
    every: int = 1  # with follows: read after every Nth epoch of the followed dataset

    @property
    def n(self) -> int:
        return self.streams.n

    def due(self, epoch: int) -> bool:
        return self.follows is None or (epoch + 1) % self.every == 0


@dataclass(frozen=True, eq=False)
class EpochMap:
    """One epoch: each rank's combined stream, and global id -> (rank, position) of its first read."""

    epoch: int
    streams: list[npt.NDArray[np.int64]]  # per rank, global ids in read order
    rank_of: npt.NDArray[np.int16]  # per global id, -1 if not read this epoch
    pos_of: npt.NDArray[np.int32]  # position in that rank's stream
    duplicated: npt.NDArray[np.bool_]  # read more than once this epoch (padding, shared orders)

    def length(self, rank: int) -> int:
        return int(self.streams[rank].shape[0])

    def positions(self, gid: int, rank: int) -> npt.NDArray[np.int64]:
        """Every position where ``rank`` reads ``gid`` this epoch (usually one)."""
        if not self.duplicated[gid]:
            return np.array([self.pos_of[gid]] if self.rank_of[gid] == rank else [], dtype=np.int64)
        return np.flatnonzero(self.streams[rank] == gid)


class JobStreams:
    """All datasets of a job over its epochs; epoch maps computed on demand, the last few cached.

    ``epochs`` is the planning horizon only: maps and streams exist for every epoch >= 0.
    """

    def __init__(self, datasets: list[DatasetStreams], shape: JobShape, epochs: int, cache_epochs: int = 3) -> None:
        if not datasets:
            raise ValueError("a job needs at least one dataset")
        self.datasets = datasets
        self.shape = shape
        self.epochs = epochs
        self.total = max(d.offset + d.n for d in datasets)
        if shape.world_size > np.iinfo(np.int16).max:
            raise ValueError("world_size above 32767 is not supported")
        self._maps: LRU[int, EpochMap] = LRU(cache_epochs)
        self._starts = [d.offset for d in datasets]
        self._variants: dict[int, list[Streams]] = {}

    @property
    def lead(self) -> int:
        """The dataset whose passes are the job's epochs: the longest per-rank stream among those
        that follow nobody (a training set is read every epoch and is the big one), first on ties."""
        primary = [i for i, d in enumerate(self.datasets) if d.follows is None] or list(range(len(self.datasets)))
        return max(primary, key=lambda i: (self.datasets[i].streams.length, -i))

    def dataset_of(self, gid: int) -> int:
        """Which dataset global id ``gid`` belongs to (-1: none)."""
        d = bisect.bisect_right(self._starts, gid) - 1
        if d < 0 or gid >= self.datasets[d].offset + self.datasets[d].n:
            return -1
        return d

    def variants(self, d: int) -> list[Streams]:
        """Dataset ``d``'s configured streams first, then the other ways an unshuffled loader reads it
        (:func:`placement.samplers.unshuffled_alternatives`) and the samplers of other frameworks
        that share its orders (:func:`placement.frameworks.framework_alternatives`)."""
        if d not in self._variants:
            ds = self.datasets[d].streams
            models = [
                *unshuffled_alternatives(ds.sampler),
                *framework_alternatives(ds.sampler, ds.shape.batch_size, ds.shape.drop_last),
            ]
            self._variants[d] = [ds, *(Streams(m, ds.shape) for m in models)]
        return self._variants[d]

    def phases(self, epoch: int) -> list[tuple[DatasetStreams, int]]:
        """(dataset, its sampler epoch) in the order a rank reads them during ``epoch``."""
        out: list[tuple[DatasetStreams, int]] = []
        for d in self.datasets:
            if d.follows is None:
                out.append((d, epoch))
        for d in self.datasets:
            if d.follows is not None and d.due(epoch):
                out.append((d, 0))
        return out

    def epoch_map(self, epoch: int) -> EpochMap:
        """Every dataset's reads in ``epoch`` (any epoch >= 0, also past the planning horizon)."""
        if isinstance(epoch, bool) or not isinstance(epoch, (int, np.integer)) or epoch < 0:
            raise ValueError(f"epoch: expected a non-negative integer, got {epoch!r}")
        return self._maps.get(epoch, lambda: self._build(epoch))

    def has_epoch_map(self, epoch: int) -> bool:
        """Whether ``epoch_map(epoch)`` would answer from the cache (building one is a permutation)."""
        return epoch in self._maps

    def _build(self, epoch: int) -> EpochMap:
        world = self.shape.world_size
        rank_of = np.full(self.total, -1, dtype=np.int16)
        pos_of = np.full(self.total, -1, dtype=np.int32)
        duplicated = np.zeros(self.total, dtype=np.bool_)
        parts: list[list[npt.NDArray[np.int64]]] = [[] for _ in range(world)]
        base = 0
        for d, sampler_epoch in self.phases(epoch):
            inv = d.streams.epoch_inverse(sampler_epoch)
            ids = slice(d.offset, d.offset + d.n)
            read = inv.rank_of >= 0
            sel = np.flatnonzero(read) + d.offset
            rank_of[sel] = inv.rank_of[read]
            pos_of[sel] = inv.pos_of[read] + base
            duplicated[ids] = inv.duplicated
            matrix = d.streams.rank_matrix(sampler_epoch)
            for r in range(world):
                parts[r].append(matrix[r] + d.offset)
            base += d.streams.length
        streams = [np.concatenate(p) if p else np.zeros(0, np.int64) for p in parts]
        for s in streams:
            s.setflags(write=False)
        return EpochMap(epoch, streams, rank_of, pos_of, duplicated)

    def node_stream(self, epoch: int, node: int) -> npt.NDArray[np.int64]:
        """The node's ranks interleaved in step by batch, over all phases of the epoch."""
        parts = []
        for d, sampler_epoch in self.phases(epoch):
            parts.append(d.streams.node_stream(sampler_epoch, node) + d.offset)
        return np.concatenate(parts) if parts else np.zeros(0, np.int64)
