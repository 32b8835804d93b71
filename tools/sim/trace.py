"""Under epoch-wise shuffling, LRU is no better than random replacement.

The trace is node 0's exact DistributedSampler stream over several epochs (one node by default:
a single reader's reshuffled epochs, as in Lee and Bahn, "A Study on Improvement of Buffer Cache
Performance for File I/O in Deep Learning", JIIBC 2024), with a cache of a fraction of the
dataset's bytes.  LRU keeps what was read last, which at the end of an epoch is
exactly what the next epoch needs least soon (nothing read late in epoch e is needed early in
e+1 more than anything else, and LRU evicts what epoch e read early, which e+1 wants just as
much).  Random replacement keeps a random sample instead, and a static set (the frequency
policy: :func:`placement.assign.assign` on the exact counts, filled at first use) keeps the same
files for the whole job, so every epoch after the first hits the cached fraction.  Belady
(evict the sample whose next use is furthest away, bypass samples used later than everything
cached) is the clairvoyant reference; with unequal sizes it is a heuristic, not an optimum.

Every policy starts cold, and hit rates count every read of the job (the first epoch included).
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from placement.assign import assign
from placement.frequency import access_stats, job_segments
from placement.samplers import DistributedSamplerModel
from placement.streams import JobShape, Streams
from tools.sim.policies import lru_tiers
from tools.sim.system import sample_sizes

TRACE_POLICIES = ("lru", "random", "frequency", "belady")
Sizes = npt.NDArray[np.int64]
Hits = npt.NDArray[np.bool_]


@dataclass(frozen=True)
class HitRate:
    policy: str
    hits: int
    reads: int
    hit_bytes: int
    read_bytes: int

    @property
    def rate(self) -> float:
        return self.hits / self.reads if self.reads else 0.0

    @property
    def byte_rate(self) -> float:
        return self.hit_bytes / self.read_bytes if self.read_bytes else 0.0


@dataclass(frozen=True, eq=False)
class Trace:
    """Node 0's reads (sample ids, in order), every node's counts and first uses, sizes, cache bytes."""

    reads: npt.NDArray[np.int64]
    counts: npt.NDArray[np.unsignedinteger]
    first_use: npt.NDArray[np.signedinteger]
    sizes: Sizes
    capacity: int


def make_trace(
    files: int, epochs: int, nodes: int, fraction: float, seed: int, mean_mb: float = 0.1077, sd_mb: float = 0.1
) -> Trace:
    """The job's trace; sizes as ImageNet-1k's in the simulator (see :mod:`tools.sim.system`)."""
    if files < nodes or epochs < 1 or nodes < 1 or not fraction >= 0:
        raise ValueError("trace: needs files >= nodes >= 1, epochs >= 1 and a non-negative cache fraction")
    sizes = sample_sizes(files, mean_mb, sd_mb, seed)
    shape = JobShape(world_size=nodes, ranks_per_node=1, batch_size=32, drop_last=False)
    st = Streams(DistributedSamplerModel(files, nodes, seed, backend="numpy"), shape)
    reads = np.concatenate([st.node_stream(e, 0) for e in range(epochs)]).astype(np.int64)
    segments = job_segments([[(0, e)] for e in range(epochs)], [st.length])
    stats = access_stats([st], [0, files], segments)
    return Trace(reads, stats.counts, stats.first_use, sizes, int(fraction * sizes.sum()))


def lru_hits(t: Trace) -> Hits:
    hit: Hits = lru_tiers(t.reads.tolist(), t.sizes, [t.capacity]) >= 0
    return hit


def random_hits(t: Trace, seed: int = 0) -> Hits:
    """Random replacement: a miss is admitted, evicting residents chosen uniformly until it fits."""
    rng = random.Random(seed)
    size = t.sizes.tolist()
    resident: list[int] = []
    where: dict[int, int] = {}
    used = 0
    out = np.zeros(t.reads.shape[0], np.bool_)
    for i, obj in enumerate(t.reads.tolist()):
        if obj in where:
            out[i] = True
            continue
        if size[obj] > t.capacity:
            continue
        while used + size[obj] > t.capacity:
            j = rng.randrange(len(resident))
            victim = resident[j]
            resident[j] = resident[-1]
            where[resident[j]] = j
            resident.pop()
            del where[victim]
            used -= size[victim]
        where[obj] = len(resident)
        resident.append(obj)
        used += size[obj]
    return out


def frequency_hits(t: Trace) -> Hits:
    """The frequency policy's static set for node 0; a held sample hits from its second read on."""
    cacheable = np.ones(t.sizes.shape[0], np.bool_)
    a = assign(t.counts, t.first_use, t.sizes, cacheable, np.array([t.capacity]), spread=False)
    held = a.tier_of[0].take(t.reads) >= 0
    pos = np.arange(t.reads.shape[0])
    out: Hits = held & (pos > t.first_use[0].take(t.reads))
    return out


def next_uses(reads: npt.NDArray[np.int64]) -> list[int]:
    """Per read, the position of the same sample's next read (len(reads) when none)."""
    n = reads.shape[0]
    order = np.lexsort((np.arange(n), reads))
    nxt = np.full(n, n, np.int64)
    same = reads[order[1:]] == reads[order[:-1]]
    nxt[order[:-1][same]] = order[1:][same]
    out: list[int] = nxt.tolist()
    return out


def belady_hits(t: Trace) -> Hits:
    nxt = next_uses(t.reads)
    size = t.sizes.tolist()
    cached: dict[int, int] = {}  # sample -> its next use
    heap: list[tuple[int, int]] = []  # (-next use, sample), stale entries skipped
    used = 0
    out = np.zeros(t.reads.shape[0], np.bool_)
    for i, obj in enumerate(t.reads.tolist()):
        if obj in cached:
            out[i] = True
        else:
            used += size[obj]
        cached[obj] = nxt[i]
        heapq.heappush(heap, (-nxt[i], obj))
        while used > t.capacity:
            far, victim = heapq.heappop(heap)
            if cached.get(victim) != -far:
                continue  # stale
            del cached[victim]
            used -= size[victim]
    return out


HITTERS: dict[str, Callable[[Trace], Hits]] = {
    "lru": lru_hits,
    "random": random_hits,
    "frequency": frequency_hits,
    "belady": belady_hits,
}


def hit_rates(t: Trace, policies: Sequence[str] = TRACE_POLICIES) -> list[HitRate]:
    read_sizes = t.sizes.take(t.reads)
    out = []
    for name in policies:
        hit = HITTERS[name](t)
        out.append(HitRate(name, int(hit.sum()), int(hit.size), int(read_sizes[hit].sum()), int(read_sizes.sum())))
    return out
