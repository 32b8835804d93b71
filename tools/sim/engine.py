"""The simulated job: staging-buffer prefetching, training steps with an allreduce, PFS contention.

Per node, NoPFS 4's time model: training consumes read f at

    t_f = max(avail_f, t_{f-1} + s_{f-1} / c)

where ``avail_f`` is when f is in the staging buffer.  Here avail is simulated rather than the
paper's load-balanced sum: p_0 staging threads take reads in access order (NoPFS rule 1), each
busy for fetch + max(s / beta, s / (w_0(p_0) / p_0)), with fetch from the source placement's
:meth:`PerfModel.choose` picks.  A read may start only when the staging buffer has room for it,
i.e. once the reads it would push past d_0 bytes have been consumed (an entry is dropped when
training takes it, NoPFS 5.1).  Naive has no prefetcher: it fetches a read when training asks for
it.  Training is synchronous data-parallel SGD: each step every worker consumes its batch, then
all wait for the slowest (the allreduce), so the job time is the last step's end and the
compute-only lower bound (Perfect) is the sum over steps of the slowest worker's compute.

PFS contention (``t(gamma)``).  placement's model gives each PFS reader t(gamma)/gamma, so what
"a reader" is decides the contention:

* ``streams`` (default): gamma is the mean number of PFS fetches in flight cluster-wide during
  the epoch (PFS busy seconds / epoch seconds, rounded, at most the threads that read the PFS),
  found as a fixed point: start from one reader, simulate, measure, repeat until gamma stops
  changing (a cycle between neighbouring values settles on the larger).  At the fixed point the
  PFS delivers at most t(gamma) in aggregate, and a lightly used PFS is not charged for
  contention it does not see.  From one reader it converges in two or three rounds: the mean
  concurrency at gamma = 1 is already close to the demanded throughput over t(1).  It is a mean:
  bursts above it are not throttled, so a PFS-bound job may come out a few percent faster than
  its bytes over t(max); reads prefetched before their epoch began count in their own epoch.
* ``nodes``: the paper's reading and :mod:`placement.plan`'s summary: gamma is the number of
  nodes that read the PFS in the epoch, and each staging thread gets t(gamma)/gamma.

Python loops over reads are the cost (about a microsecond each); everything else is numpy.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from placement.model import MB, SOURCE_LOCAL, SOURCE_PEER, SOURCE_PFS
from tools.sim.system import Setup

CONTENTION = ("streams", "nodes")
MAX_ROUNDS = 12
Floats = npt.NDArray[np.float64]
Tiers = npt.NDArray[np.int8]


@dataclass(frozen=True, eq=False)
class Routing:
    """Where each read of a policy may come from: a policy's whole decision, for the engine to time.

    ``local_tier[k, f]``: the tier of node k holding read f's sample when it is read (-1: none);
    ``remote_tier[k, f]``: the fastest tier of another node holding it then (-1: none).  The PFS is
    always possible; :meth:`PerfModel.choose` takes the fastest.
    """

    local_tier: Tiers
    remote_tier: Tiers
    on_demand: bool = False  # Naive: no prefetching, one fetch at a time when training asks
    perfect: bool = False  # no I/O cost at all: the lower bound


@dataclass(frozen=True)
class Timeline:
    seconds: float  # the job: end of the last step
    lower: float  # sum over steps of the slowest worker's compute
    epoch_seconds: tuple[float, ...]


@dataclass(frozen=True)
class Outcome:
    """A policy's simulated job: time, lower bound, bytes read per source, gamma per epoch."""

    seconds: float
    lower: float
    source_bytes: tuple[int, int, int]  # local, peer, PFS
    pfs_readers: tuple[int, ...]
    rounds: int  # contention fixed-point iterations

    def shares(self) -> dict[str, float]:
        """Share of the job's time: compute time split by where its samples came from, and stall.

        The lower bound is time spent computing; it is split in proportion to the bytes read from
        each source.  Whatever the job took beyond it is stall (waiting for I/O, or for a worker
        that waited for I/O at the allreduce).  The four shares sum to 1.
        """
        total = sum(self.source_bytes)
        busy = self.lower / self.seconds if self.seconds > 0 else 1.0
        local, peer, pfs = (busy * b / total if total else 0.0 for b in self.source_bytes)
        return {"local": local, "remote": peer, "pfs": pfs, "stall": max(0.0, 1.0 - busy)}


def buffer_waits(sizes: npt.NDArray[np.int64], staging_bytes: int) -> list[int]:
    """Per read f, the latest read g that must have been consumed before f may enter the buffer (-1: none).

    The buffer holds reads g+1..f, so their bytes must fit: the smallest g with
    sum(s[g+1..f]) <= d_0.  A read larger than the whole buffer waits only for its predecessor.
    """
    prefix = np.concatenate([[0], np.cumsum(sizes)])
    first_kept = np.searchsorted(prefix, prefix[1:] - staging_bytes, side="left")
    last = np.arange(sizes.shape[0], dtype=np.int64) - 1
    out: list[int] = np.minimum(first_kept - 1, last).tolist()
    return out


def pipeline(
    read_s: Floats,
    compute_s: Floats,
    sizes: npt.NDArray[np.int64],
    steps: Sequence[tuple[int, int]],
    epoch_len: int,
    threads: int,
    staging_bytes: int,
    on_demand: bool = False,
) -> Timeline:
    """Time the job (see the module docstring).  Arrays are (nodes, reads) in job order."""
    nodes, _ = read_s.shape
    reads = [r.tolist() for r in read_s]
    work = [c.tolist() for c in compute_s]
    waits = [buffer_waits(s, staging_bytes) for s in sizes]
    taken: list[list[float]] = [[0.0] * read_s.shape[1] for _ in range(nodes)]
    free = [[0.0] * threads for _ in range(nodes)]  # heaps of staging-thread free times
    barrier = 0.0
    lower = 0.0
    epoch_ends: list[float] = []
    for lo, hi in steps:
        end = barrier
        slowest = 0.0
        for k in range(nodes):
            rk, ck, gk, tk, heap = reads[k], work[k], waits[k], taken[k], free[k]
            ready = barrier  # when training on node k wants its next read
            busy = 0.0
            for f in range(lo, hi):
                if on_demand:
                    done = ready + rk[f]
                else:
                    start = heap[0]
                    g = gk[f]
                    if g >= 0 and tk[g] > start:
                        start = tk[g]
                    done = start + rk[f]
                    heapq.heapreplace(heap, done)
                t = done if done > ready else ready
                tk[f] = t
                ready = t + ck[f]
                busy += ck[f]
            if ready > end:
                end = ready
            if busy > slowest:
                slowest = busy
        barrier = end
        lower += slowest
        if hi % epoch_len == 0:
            epoch_ends.append(barrier)
    starts = [0.0, *epoch_ends[:-1]]
    return Timeline(barrier, lower, tuple(e - s for s, e in zip(starts, epoch_ends, strict=True)))


def run(setup: Setup, routing: Routing, contention: str = "streams") -> Outcome:
    """Simulate one policy's job on ``setup``."""
    if contention not in CONTENTION:
        raise ValueError(f"contention: expected one of {', '.join(CONTENTION)}, got {contention!r}")
    system, model = setup.system, setup.model
    nodes, total = setup.streams.shape
    epochs, n = setup.epochs, setup.per_epoch
    sizes = setup.sizes[setup.streams]
    mb = sizes / MB
    compute = mb / system.compute_mbps
    write = mb * max(1.0 / system.preprocess_mbps, model.write_seconds(MB))
    steps = setup.steps()
    if routing.perfect:
        tl = pipeline(np.zeros_like(compute), compute, sizes, steps, n, 1, setup.staging_bytes)
        return Outcome(tl.seconds, tl.lower, (int(sizes.sum()), 0, 0), (0,) * epochs, 0)
    threads = 1 if routing.on_demand else system.staging_threads

    def choose(gammas: Sequence[int]) -> tuple[npt.NDArray[np.uint8], Floats]:
        source = np.empty((nodes, total), np.uint8)
        fetch = np.empty((nodes, total), np.float64)
        for e in range(epochs):
            sl = slice(e * n, (e + 1) * n)
            for k in range(nodes):
                src, sec = model.choose(sizes[k, sl], routing.local_tier[k, sl], routing.remote_tier[k, sl], gammas[e])
                source[k, sl], fetch[k, sl] = src, sec
        return source, fetch

    def pfs_nodes(source: npt.NDArray[np.uint8]) -> list[int]:
        on_pfs = (source == SOURCE_PFS).reshape(nodes, epochs, n).any(axis=2)
        return [int(x) for x in on_pfs.sum(axis=0)]

    source, _ = choose([nodes * threads] * epochs)
    ceiling = [max(1, x * threads) for x in pfs_nodes(source)]
    gammas = [max(1, x) for x in pfs_nodes(source)] if contention == "nodes" else [1] * epochs
    seen: list[list[int]] = []
    rounds = 0
    while True:
        rounds += 1
        source, fetch = choose(gammas)
        tl = pipeline(fetch + write, compute, sizes, steps, n, threads, setup.staging_bytes, routing.on_demand)
        if contention == "nodes" or rounds >= MAX_ROUNDS:
            break
        seen.append(gammas)
        busy = np.where(source == SOURCE_PFS, fetch, 0.0).reshape(nodes, epochs, n).sum(axis=(0, 2))
        measured = [
            min(cap, max(1, math.floor(b / s + 0.5))) if s > 0 else 1
            for b, s, cap in zip(busy.tolist(), tl.epoch_seconds, ceiling, strict=True)
        ]
        if measured == gammas:
            break
        if measured in seen:  # a cycle between neighbours: settle on its most contended member
            cycle = seen[seen.index(measured) :]
            gammas = [max(g) for g in zip(*cycle, strict=True)]
            if gammas != seen[-1]:
                rounds += 1
                source, fetch = choose(gammas)
                tl = pipeline(fetch + write, compute, sizes, steps, n, threads, setup.staging_bytes, routing.on_demand)
            break
        gammas = measured
    by_source = tuple(int(sizes[source == s].sum()) for s in (SOURCE_LOCAL, SOURCE_PEER, SOURCE_PFS))
    return Outcome(tl.seconds, tl.lower, (by_source[0], by_source[1], by_source[2]), tuple(gammas), rounds)
