"""Access frequency over a whole job: per node, how often and from when each file is read.

NoPFS section 3.1: with N readers and E epochs a given reader reads a given file
X ~ Binomial(E, 1/N) times, so some files are read far more often than E/N by some reader (and, by
Lemma 1, less often by another).  :func:`expected_heavy_files` is the paper's analytic estimate;
:func:`access_stats` measures the real thing from the exact access streams.

The measurement is one pass over the job's *segments* (one dataset read in one epoch: the train
epochs, with the validation reads that follow them, in :mod:`placement.jobstreams`'s order).
Every segment costs one permutation, the dominant price at ImageNet scale, so counts and first
uses are folded in the same pass (by :class:`placement.streams.NodeReads`, in file space: one
inverse of the epoch's order, then sequential work per node row); the next permutations are
computed meanwhile in the caller's threads, when it gives some (:mod:`placement.parallel`).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from placement.parallel import Pool
from placement.prob import binomial_tail
from placement.samplers import DistributedSamplerModel
from placement.streams import NodeReads, Streams, layouts_ahead

I64 = npt.NDArray[np.int64]


# --------------------------------------------------------------------------- analytic (NoPFS 3.1)


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


def _count_bound(streams: Streams) -> int:
    """An upper bound on one node's reads of one file in one read of the dataset."""
    s = streams.sampler
    cyclic = -(-streams.per_rank * streams.shape.world_size // s.n)  # padding wraps around
    repeats = max(int(getattr(s, "max_repeats", 0)), cyclic, 1)
    shared = not isinstance(s, DistributedSamplerModel)  # every rank reads the whole order
    return repeats * (streams.shape.ranks_per_node if shared else 1)


def count_type_for(streams: Sequence[Streams], segments: Sequence[Segment]) -> type[np.unsignedinteger[Any]]:
    """The narrowest unsigned type that holds any node's reads of any file over ``segments``."""
    bound = max(
        (sum(_count_bound(streams[d]) for s in segments if s.dataset == d) for d in range(len(streams))), default=0
    )
    for t in (np.uint8, np.uint16):
        if bound <= np.iinfo(t).max:
            return t
    return np.uint32


def access_stats(
    streams: Sequence[Streams],
    offsets: Sequence[int],
    segments: Sequence[Segment],
    pool: Pool | None = None,
    width: int = 1,
) -> AccessStats:
    """Per-node read counts and first uses over ``segments`` (global ids: offsets[d] + index).

    ``pool``: threads computing up to ``width`` permutations ahead (None: each in its turn, here).
    The folding is :class:`placement.streams.NodeReads`'s, the same as :meth:`Streams.node_counts`.
    Counts are uint8 when no file can be read 255 times by one node (ImageNet, 90 epochs), else
    uint16 or uint32.
    """
    shape = streams[0].shape
    total = int(offsets[-1])
    count_type = count_type_for(streams, segments)
    job_len = segments[-1].start + segments[-1].length if segments else 0
    pos_type: type[np.signedinteger[Any]] = np.int32 if job_len < np.iinfo(np.int32).max else np.int64
    reads = NodeReads(shape, total, count_type, pos_type)
    first_epoch_counts: npt.NDArray[np.unsignedinteger[Any]] | None = None
    ahead = layouts_ahead(streams, [(s.dataset, s.ds_epoch) for s in segments], pool, width)
    with contextlib.closing(ahead) as layouts:
        for seg, lay in zip(segments, layouts, strict=True):
            if first_epoch_counts is None and seg.job_epoch > 0:
                first_epoch_counts = reads.counts.copy()
            reads.add(streams[seg.dataset], lay, offset=int(offsets[seg.dataset]), start=seg.start)
    assert reads.first is not None
    if first_epoch_counts is None:
        first_epoch_counts = reads.counts.copy()
    return AccessStats(reads.counts, first_epoch_counts, reads.first, list(segments))
