"""Access frequency over a whole job: per node, how often and from when each file is read.

NoPFS section 3.1: with N readers and E epochs a given reader reads a given file
X ~ Binomial(E, 1/N) times, so some files are read far more often than E/N by some reader (and, by
Lemma 1, less often by another).  :func:`expected_heavy_files` is the paper's analytic estimate;
:func:`access_stats` measures the real thing from the exact access streams.

The measurement is one pass over the job's *segments* (one dataset read in one epoch: the train
epochs, with the validation reads that follow them, in :mod:`placement.jobstreams`'s order).
Every segment costs one permutation, the dominant price at ImageNet scale, so counts and first
uses are folded in the same pass, in file space: one scatter inverts the epoch's order, then each
file's (file, node) cell is updated with near-sequential gathers.  The next permutations are
computed in worker threads meanwhile.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from placement.samplers import DistributedSamplerModel, EpochLayout
from placement.streams import JobShape, Streams

I64 = npt.NDArray[np.int64]


# --------------------------------------------------------------------------- analytic (NoPFS 3.1)


def binomial_tail(trials: int, p: float, k_min: int) -> float:
    """P(X >= k_min) for X ~ Binomial(trials, p), summed in log space (no overflow at any E)."""
    if k_min <= 0:
        return 1.0
    if k_min > trials:
        return 0.0
    if p <= 0.0:
        return 0.0
    if p >= 1.0:
        return 1.0
    lp, lq = math.log(p), math.log1p(-p)
    lg = math.lgamma
    total = 0.0
    for k in range(k_min, trials + 1):
        total += math.exp(lg(trials + 1) - lg(k + 1) - lg(trials - k + 1) + k * lp + (trials - k) * lq)
    return min(1.0, total)


def heavy_threshold(readers: int, epochs: int, delta: float) -> int:
    """Smallest count above (1 + delta) * E / N: the paper sums from ceil((1 + delta) mu)."""
    return math.ceil((1.0 + delta) * epochs / readers)


def expected_heavy_files(files: int, readers: int, epochs: int, delta: float) -> float:
    """F * P(X > (1 + delta) E / N): files one reader is expected to read that often (NoPFS 3.1).

    N=16, E=90, F=1,281,167, delta=0.8 gives about 31,635.
    """
    if readers < 1 or epochs < 0 or files < 0:
        raise ValueError("expected_heavy_files: needs readers >= 1, epochs >= 0, files >= 0")
    return files * binomial_tail(epochs, 1.0 / readers, heavy_threshold(readers, epochs, delta))


def lemma1_other_reader_bound(readers: int, epochs: int, delta: float) -> int:
    """Lemma 1: if one reader reads a file ceil((1+delta)E/N) times, another reads it at most this often."""
    if readers < 2:
        raise ValueError("Lemma 1 needs at least two readers")
    return math.ceil((readers - 1 - delta) / (readers - 1) * epochs / readers)


# --------------------------------------------------------------------------- the job's segments


@dataclass(frozen=True)
class Segment:
    """One read of one dataset: where it sits in every node's stream over the job.

    Nodes run in lockstep and every node's stream of a segment has the same length, so ``start``
    (the job position where the segment begins) is the same on every node.
    """

    job_epoch: int
    dataset: int
    ds_epoch: int  # the sampler epoch: the dataset's how-many-th read
    start: int
    length: int  # entries per node


def job_segments(phases: Sequence[Sequence[tuple[int, int]]], node_lengths: Sequence[int]) -> list[Segment]:
    """The job as an ordered list of segments.

    ``phases[e]``: the (dataset, sampler epoch) pairs read in job epoch e, in order (what
    :meth:`placement.jobstreams.JobStreams.phases` says); ``node_lengths[d]``: entries per node
    of one read of dataset d.
    """
    out: list[Segment] = []
    pos = 0
    for e, epoch_phases in enumerate(phases):
        for d, ds_epoch in epoch_phases:
            out.append(Segment(e, d, ds_epoch, pos, int(node_lengths[d])))
            pos += int(node_lengths[d])
    return out


# --------------------------------------------------------------------------- measured


@dataclass(eq=False)
class AccessStats:
    """Per node and global file id: reads over the job, reads in job epoch 0, first job position.

    ``first_use`` holds :attr:`never` for a file the node never reads.
    """

    counts: npt.NDArray[np.unsignedinteger]  # (nodes, files), uint16 (uint32 if it could overflow)
    first_epoch_counts: npt.NDArray[np.unsignedinteger]
    first_use: npt.NDArray[np.signedinteger]  # (nodes, files), int32 or int64
    segments: list[Segment]

    @property
    def never(self) -> int:
        return int(np.iinfo(self.first_use.dtype).max)


def node_positions(pos: npt.NDArray[Any], slot: npt.NDArray[Any], length: int, shape: JobShape) -> npt.NDArray[Any]:
    """Position in the node stream of rank-stream entry ``pos`` of the rank taking turn ``slot``.

    The ranks of a node take turns batch by batch (full steps of ranks_per_node batches, then the
    last partial batches); must agree with :meth:`Streams.node_stream` (a test checks it).
    In a full step: pos + (m - 1) * (pos - within) + slot * b, with within = pos % b.
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


def _count_bound(streams: Streams) -> int:
    """An upper bound on one node's reads of one file in one read of the dataset."""
    s = streams.sampler
    cyclic = -(-streams.per_rank * streams.shape.world_size // s.n)  # padding wraps around
    repeats = max(int(getattr(s, "max_repeats", 0)), cyclic, 1)
    shared = not isinstance(s, DistributedSamplerModel)  # every rank reads the whole order
    return repeats * (streams.shape.ranks_per_node if shared else 1)


def _layouts(streams: Sequence[Streams], segments: Sequence[Segment], workers: int) -> Iterator[EpochLayout]:
    """Each segment's layout in order; the next ``workers`` permutations are computed in threads.

    Only samplers with a pure per-epoch function (``fresh_layout``) that shuffle run ahead; the
    others are stateful or trivial and run in order here (and do not use up the look-ahead).
    """

    def heavy(seg: Segment) -> bool:
        sampler = streams[seg.dataset].sampler
        return hasattr(sampler, "fresh_layout") and bool(getattr(sampler, "shuffle", False))

    if workers <= 1:
        for seg in segments:
            yield streams[seg.dataset].layout(seg.ds_epoch)
        return
    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="seerfs-plan")
    futures: dict[int, Future[EpochLayout]] = {}
    upcoming = iter([i for i, seg in enumerate(segments) if heavy(seg)])
    try:
        for i, seg in enumerate(segments):
            while len(futures) < workers:
                j = next(upcoming, None)
                if j is None:
                    break
                sampler: Any = streams[segments[j].dataset].sampler
                futures[j] = pool.submit(sampler.fresh_layout, segments[j].ds_epoch)
            fut = futures.pop(i, None)
            yield fut.result() if fut is not None else streams[seg.dataset].layout(seg.ds_epoch)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def access_stats(
    streams: Sequence[Streams], offsets: Sequence[int], segments: Sequence[Segment], workers: int | None = None
) -> AccessStats:
    """Per-node read counts and first uses over ``segments`` (global ids: offsets[d] + index).

    ``workers``: threads computing permutations ahead (default: 2 where the machine has 2 cores).
    The pass works on (file, node) arrays so that each epoch's updates, which go over files in
    ascending order, touch memory almost sequentially; the result is transposed once at the end.
    Counts are uint8 when no file can be read 255 times by one node (ImageNet, 90 epochs), else
    uint16 or uint32.
    """
    shape = streams[0].shape
    nodes = shape.nodes
    total = int(offsets[-1])
    bound = max(
        (sum(_count_bound(streams[d]) for s in segments if s.dataset == d) for d in range(len(streams))), default=0
    )
    count_type: type[np.unsignedinteger[Any]] = np.uint32
    for t in (np.uint8, np.uint16):
        if bound <= np.iinfo(t).max:
            count_type = t
            break
    job_len = segments[-1].start + segments[-1].length if segments else 0
    pos_type: type[np.signedinteger[Any]] = np.int32 if job_len < np.iinfo(np.int32).max else np.int64
    fold = _Fold(np.zeros((total, nodes), count_type), np.full((total, nodes), np.iinfo(pos_type).max, pos_type), shape)
    first_epoch_counts: npt.NDArray[np.unsignedinteger[Any]] | None = None
    if workers is None:
        workers = min(2, os.cpu_count() or 1)
    for seg, lay in zip(segments, _layouts(streams, segments, workers), strict=True):
        if first_epoch_counts is None and seg.job_epoch > 0:
            first_epoch_counts = np.ascontiguousarray(fold.counts.T)
        st = streams[seg.dataset]
        if lay.shared:
            fold.shared(lay, st, int(offsets[seg.dataset]), seg.start)
        else:
            fold.strided(lay, st, int(offsets[seg.dataset]), seg.start)
    counts = np.ascontiguousarray(fold.counts.T)
    first = np.ascontiguousarray(fold.first.T)
    del fold
    if first_epoch_counts is None:
        first_epoch_counts = counts.copy()
    return AccessStats(counts, first_epoch_counts, first, list(segments))


class _Fold:
    """The (file, node) accumulators of :func:`access_stats` and the per-layout updates.

    Per strided epoch: one random scatter (the inverse permutation, int32), then a handful of
    sequential passes; a node position is computed only for (node, file) pairs seen for the
    first time, which after the first few epochs are few.
    """

    def __init__(
        self, counts: npt.NDArray[np.unsignedinteger[Any]], first: npt.NDArray[np.signedinteger[Any]], shape: JobShape
    ) -> None:
        self.counts = counts
        self.first = first
        self.shape = shape
        self._cflat = counts.reshape(-1)
        self._fflat = first.reshape(-1)
        self._idx: type[np.signedinteger[Any]] = np.int32 if counts.size < np.iinfo(np.int32).max else np.int64
        self._arange: npt.NDArray[np.signedinteger[Any]] = np.zeros(0, self._idx)
        self._bases: dict[tuple[int, int], npt.NDArray[np.signedinteger[Any]]] = {}

    def _ar(self, n: int) -> npt.NDArray[np.signedinteger[Any]]:
        if self._arange.shape[0] < n:
            self._arange = np.arange(n, dtype=self._idx)
        return self._arange[:n]

    def _base(self, off: int, n: int) -> npt.NDArray[np.signedinteger[Any]]:
        """Flat index of (file off + i, node 0) for i < n, kept per dataset."""
        key = (off, n)
        if key not in self._bases:
            self._bases[key] = np.arange(
                off * self.shape.nodes, (off + n) * self.shape.nodes, self.shape.nodes, dtype=self._idx
            )
        return self._bases[key]

    def _nodes_of(self, t: npt.NDArray[np.signedinteger[Any]]) -> npt.NDArray[np.signedinteger[Any]]:
        """Node of strided entries t (rank t % W), as a new array; bit operations when possible."""
        world, per_node, nodes = self.shape.world_size, self.shape.ranks_per_node, self.shape.nodes
        pow2 = world & (world - 1) == 0
        rank = t & (world - 1) if pow2 else t % world
        if self.shape.rank_order == "contiguous":
            if per_node & (per_node - 1) == 0:
                rank >>= per_node.bit_length() - 1
            else:
                rank //= per_node
            return rank
        return rank % nodes

    def _positions(self, t: npt.NDArray[np.signedinteger[Any]], length: int, start: int) -> npt.NDArray[Any]:
        """Job position of strided entries t in their node's stream (in first's dtype)."""
        world = self.shape.world_size
        dt = self.first.dtype
        tt = t.astype(dt)
        if world & (world - 1) == 0:
            rank = tt & (world - 1)
            tt >>= world.bit_length() - 1
        else:
            tt, rank = np.divmod(tt, world)
        slots = self.shape.rank_slots().astype(dt).take(rank)
        out = node_positions(tt, slots, length, self.shape)
        out += dt.type(start)
        return out

    def strided(self, lay: EpochLayout, st: Streams, off: int, start: int) -> None:
        """DistributedSampler layout: rank r reads order[r::W]; entry t is rank t % W's entry t // W."""
        world, length, nodes, n = st.shape.world_size, st.length, self.shape.nodes, st.n
        flat = lay.order[: length * world]
        u = min(lay.distinct, flat.size)
        if u >= n:
            inv = np.empty(n, self._idx)
            inv[flat[:n]] = self._ar(n)
            files: npt.NDArray[Any] | None = None
        else:
            inv = np.full(n, -1, self._idx)
            inv[flat[:u]] = self._ar(u)
            files = np.flatnonzero(inv >= 0).astype(self._idx)
            inv = inv[files]
        cell = self._nodes_of(inv)
        cell += self._base(off, n) if files is None else (files + off) * nodes
        old = self._cflat.take(cell)
        new = np.flatnonzero(old == 0)
        old += 1
        self._cflat.put(cell, old)
        del old
        self._fflat.put(cell.take(new), self._positions(inv.take(new), length, start))
        if u < flat.size:  # padding (or an order of unknown shape): repeats, with np.*.at
            tt = np.arange(u, flat.size, dtype=np.int64)
            cc = (flat[u:] + off) * nodes + self._nodes_of(tt)
            np.add.at(self._cflat, cc, 1)
            np.minimum.at(self._fflat, cc, self._positions(tt, length, start))

    def shared(self, lay: EpochLayout, st: Streams, off: int, start: int) -> None:
        """Every rank reads order[:length]: each node reads each entry once per rank it hosts."""
        length, per_node, n = st.length, st.shape.ranks_per_node, st.n
        flat = lay.order[:length]
        u = min(lay.distinct, flat.size)
        inv = np.full(n, -1, np.int64)
        inv[flat[:u]] = np.arange(u, dtype=np.int64)
        files = np.flatnonzero(inv >= 0)
        t = inv[files]
        gids = files + off
        self.counts[gids] += np.asarray(per_node, self.counts.dtype)
        pos = (start + node_positions(t, np.zeros_like(t), length, st.shape)).astype(self.first.dtype)
        self.first[gids] = np.minimum(self.first[gids], pos[:, None])
        if u < flat.size:
            tt = np.arange(u, flat.size, dtype=np.int64)
            rest = flat[u:] + off
            p = (start + node_positions(tt, np.zeros_like(tt), length, st.shape)).astype(self.first.dtype)
            for k in range(self.shape.nodes):
                np.add.at(self.counts[:, k], rest, per_node)
                np.minimum.at(self.first[:, k], rest, p)
