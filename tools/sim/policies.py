"""The policies of NoPFS 6 as :class:`Routing` s: for every read, which local and remote tier hold it.

Each policy only decides where samples are cached and when they get there; the engine times the
reads with placement's model, which picks the fastest source available (NoPFS 4), and the PFS
contention.  Availability is by job position (every node's stream has the same length per epoch,
and the allreduce keeps nodes within a step): a copy made by a read at position p serves reads at
positions after p.  That is NoPFS's own heuristic for when a peer has a sample (5.2.2).

* ``perfect``: no I/O cost, the compute-bound lower bound.
* ``naive``: every read from the PFS when training asks for it; no prefetching, no caching.
* ``staging``: the staging-buffer prefetcher, always from the PFS (double buffering / tf.data).
* ``lbann``: LBANN's dynamic data store: the first node to read a sample keeps it in RAM and
  serves it to everybody afterwards.  It fails when the dataset exceeds the aggregate RAM, or a
  node's first reads exceed its RAM; the failure is a result, not an exception.
* ``lru``: each node's RAM and SSD as one two-level LRU of the samples it reads (RAM the most
  recent d_1 bytes, the next d_2 on the SSD), fed by its own reads; misses go to the PFS.
* ``frequency``: seerfs: :func:`placement.assign.assign` with spread ownership on the exact access
  counts (:func:`placement.frequency.access_stats`), tiers filled in order of first use.
* ``frequency-nospread``: the same without ownership: NoPFS's plain frequency fill.
* ``frequency-pernode``: seerfs at cluster scale (:mod:`placement.nodeplan`): each node's own pass and
  tiers, owners by the first-reader rule every node computes alike; what large jobs plan.

Tier filling (NoPFS 5.1: each node fills its tiers in order of first use, by their own threads)
is modelled by when a copy can serve: every holder of a sample has it from the job's first read
of it on.  The primary owner fetches it from the PFS by then (rule 1), and the other holders copy
it from the owner in the background before their own first read.  The job's first read of a
sample is therefore always a PFS read, as in :mod:`placement.plan`'s summary.  The fill traffic
itself (the owner's fetch when the first reader is not the owner, replica copies from the owner)
runs on the tier threads, off the staging threads' path, and is not charged; it is at most one
read of each sample per holder per job.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from placement.assign import Assignment, assign, earliest_reader
from placement.frequency import AccessStats, access_stats, count_type_for, job_segments
from placement.model import PerfModel
from placement.nodeplan import NEVER_KEY, designate, node_assignment, node_pass
from tools.sim.engine import Routing, Tiers
from tools.sim.system import Setup

POLICIES = ("perfect", "naive", "staging", "lbann", "lru", "frequency-nospread", "frequency", "frequency-pernode")
LABELS = {
    "perfect": "Perfect",
    "naive": "Naive",
    "staging": "StagingBuffer",
    "lbann": "LBANN",
    "lru": "LRU",
    "frequency-nospread": "Frequency (no spread)",
    "frequency": "Frequency (seerfs)",
    "frequency-pernode": "Frequency (per node)",
}


class PolicyFailed(Exception):
    """The policy cannot run this scenario (the reason is the message)."""


@dataclass(frozen=True)
class Failed:
    reason: str


def nowhere(setup: Setup) -> Tiers:
    return np.full(setup.streams.shape, -1, np.int8)


def job_stats(setup: Setup) -> AccessStats:
    """Per-node read counts and first uses over the job, by placement's own pass."""
    segments = job_segments([[(0, e)] for e in range(setup.epochs)], [setup.per_epoch])
    return access_stats([setup.sampler_streams], [0, setup.files], segments)


def perfect(setup: Setup) -> Routing:
    return Routing(nowhere(setup), nowhere(setup), perfect=True)


def naive(setup: Setup) -> Routing:
    return Routing(nowhere(setup), nowhere(setup), on_demand=True)


def staging(setup: Setup) -> Routing:
    return Routing(nowhere(setup), nowhere(setup))


def lbann(setup: Setup) -> Routing:
    ram = setup.tier_bytes[0]
    nodes = setup.system.nodes
    if setup.dataset_bytes > nodes * ram:
        raise PolicyFailed(f"dataset is {setup.dataset_bytes / (nodes * ram):.2f}x the aggregate RAM")
    stats = job_stats(setup)
    earliest, reader = earliest_reader(stats.first_use)
    kept = np.bincount(reader[reader >= 0], weights=setup.sizes[reader >= 0], minlength=nodes)
    if (kept > ram).any():
        k = int(np.argmax(kept))
        raise PolicyFailed(f"node {k} reads {kept[k] / ram:.2f}x its RAM first")
    pos = np.arange(setup.streams.shape[1])
    local, remote = nowhere(setup), nowhere(setup)
    for k in range(nodes):
        objs = setup.streams[k]
        warm = pos > earliest[objs]
        mine = reader[objs] == k
        local[k, warm & mine] = 0
        remote[k, warm & ~mine] = 0
    return Routing(local, remote)


def lru_tiers(stream: Sequence[int], sizes: npt.NDArray[np.int64], capacities: Sequence[int]) -> Tiers:
    """Tier each read hits in a multi-level exclusive LRU (-1: miss), inserting every read at the top.

    Level 0 holds the most recently read ``capacities[0]`` bytes, level 1 the next, and so on: a
    hit moves the sample back to level 0 and what overflows a level moves down to the next.
    """
    levels: list[OrderedDict[int, int]] = [OrderedDict() for _ in capacities]
    used = [0] * len(capacities)
    size = sizes.tolist()
    out = np.full(len(stream), -1, np.int8)
    for i, obj in enumerate(stream):
        s = size[obj]
        for j, level in enumerate(levels):
            if obj in level:
                out[i] = j
                used[j] -= level.pop(obj)
                break
        carry = [(obj, s)]
        for j, level in enumerate(levels):
            down: list[tuple[int, int]] = []
            for x, sx in carry:
                if sx > capacities[j]:
                    down.append((x, sx))
                    continue
                level[x] = sx
                used[j] += sx
            while used[j] > capacities[j]:
                x, sx = level.popitem(last=False)
                used[j] -= sx
                down.append((x, sx))
            carry = down
            if not carry:
                break
    return out


def lru(setup: Setup) -> Routing:
    local = np.stack(
        [lru_tiers(setup.streams[k].tolist(), setup.sizes, setup.tier_bytes) for k in range(setup.system.nodes)]
    )
    return Routing(local, nowhere(setup))


def routed(setup: Setup, a: Assignment, first_use: npt.NDArray[np.signedinteger], model: PerfModel) -> Routing:
    """Reads of an assignment: every holder serves a sample after the job's first read of it."""
    nodes, total = setup.streams.shape
    if a.earliest is not None:
        earliest = a.earliest
    else:  # pragma: no cover - assign() always fills it
        earliest, _ = earliest_reader(first_use)
    never = np.iinfo(np.int64).max
    since = np.where(a.tier_of >= 0, earliest.astype(np.int64)[None, :], never)
    rate = np.array([model.peer_rate(j) for j in range(len(model.tiers))] + [0.0])  # index -1: not held
    pos = np.arange(total)
    local, remote = nowhere(setup), nowhere(setup)
    for k in range(nodes):
        objs = setup.streams[k]
        local[k] = np.where(pos > since[k, objs], a.tier_of[k, objs], -1)
        best = np.zeros(total)
        for j in range(nodes):
            if j == k:
                continue
            tier = np.where(pos > since[j, objs], a.tier_of[j, objs], -1).astype(np.int8)
            r = rate[tier]
            better = r > best
            remote[k, better] = tier[better]
            np.maximum(best, r, out=best)
    return Routing(local, remote)


def frequency(setup: Setup, spread: bool = True) -> Routing:
    stats = job_stats(setup)
    cacheable = np.ones(setup.files, np.bool_)
    a = assign(stats.counts, stats.first_use, setup.sizes, cacheable, np.array(setup.tier_bytes), spread=spread)
    return routed(setup, a, stats.first_use, setup.model)


def per_node_assignment(setup: Setup) -> Assignment:
    """:mod:`placement.nodeplan` on every node: each node's own pass, the shared designation, its tiers
    (the nodes' parts side by side, as the simulator needs every node's)."""
    segments = job_segments([[(0, e)] for e in range(setup.epochs)], [setup.per_epoch])
    streams = [setup.sampler_streams]
    ctype = count_type_for(streams, segments)
    budgets = np.array(setup.tier_bytes, np.int64)
    nodes = setup.system.nodes
    passes = [node_pass(streams, [0, setup.files], segments, k, ctype) for k in range(nodes)]
    read = passes[0].first_key != NEVER_KEY
    owner = designate(passes[0].first_key, passes[0].total, setup.sizes, read, nodes, budgets)
    cacheable = np.ones(setup.files, np.bool_)
    parts = [node_assignment(p, owner, setup.sizes, cacheable, budgets) for p in passes]
    off = np.zeros(nodes + 1, np.int64)
    np.cumsum([p.fill_obj.size for p in parts], out=off[1:])
    return Assignment(
        np.stack([p.tier_of for p in parts]),
        owner,
        np.concatenate([p.fill_obj for p in parts]),
        np.concatenate([p.fill_due for p in parts]),
        off,
        np.stack([p.tier_bytes for p in parts]),
        np.stack([p.tier_files for p in parts]),
        passes[0].earliest(),
        passes[0].first_reader(),
    )


def frequency_per_node(setup: Setup) -> Routing:
    a = per_node_assignment(setup)
    assert a.earliest is not None
    return routed(setup, a, a.earliest, setup.model)


BUILDERS: dict[str, Callable[[Setup], Routing]] = {
    "perfect": perfect,
    "naive": naive,
    "staging": staging,
    "lbann": lbann,
    "lru": lru,
    "frequency-nospread": lambda s: frequency(s, spread=False),
    "frequency": frequency,
    "frequency-pernode": frequency_per_node,
}


def routing(name: str, setup: Setup) -> Routing | Failed:
    """The policy ``name``'s routing on ``setup``, or why it cannot run there."""
    if name not in BUILDERS:
        raise ValueError(f"policy: expected one of {', '.join(POLICIES)}, got {name!r}")
    try:
        return BUILDERS[name](setup)
    except PolicyFailed as exc:
        return Failed(str(exc))
