"""The plan: from (snapshot arrays, config, seed) to tiers, owners, streams and a digest.

Every node computes the same plan from the same inputs; the xxh3 digest over the inputs that
decide it (config parts, catalogs, list orders, seed) and its outputs (tier assignment, owners)
proves agreement across nodes.  It is stable across processes and hash seeds: it hashes
canonical JSON and little-endian array bytes, never Python ``hash``.

Planning a large job takes seconds of numpy, so the daemon runs :meth:`Plan.build` in a
subprocess, which persists it (``fusefs.planning.store``: :meth:`Plan.meta` and :meth:`Plan.arrays`);
:meth:`Plan.from_parts` rebuilds it from those parts, and the per-epoch streams are recomputed lazily
from the recorded inputs.

Ids: a dataset's file i has global id ``offsets[d] + i`` (datasets in config order).  Cached
things are *objects*, one per snapshot entry (two ids reached through a symlinked directory
share one): ``gid_obj`` maps ids to objects, ``obj_entry`` objects to entries (inode - 1).
When no entry is shared, ``gid_obj`` is the identity and objects are ids.

Job order for planning is :class:`placement.jobstreams.JobStreams`'s: each epoch reads the datasets
that follow nobody (config order), then those with ``follows`` that are due ((epoch + 1) % every
== 0), each of those at sampler epoch 0, over ``job.epochs`` (the planning horizon).  All datasets
use the seed.  The daemon's cursor follows each dataset on its own, past the horizon too.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
import xxhash

from placement.assign import Assignment, assign, earliest_reader, spread_covers
from placement.catalog import DEFAULT_LAYOUT, Catalog, build_catalogs
from placement.frameworks import FRAMEWORK_KINDS, build_sampler
from placement.frequency import (
    AccessStats,
    Segment,
    access_stats,
    count_type_for,
    expected_heavy_files,
    heavy_threshold,
    job_segments,
)
from placement.jobstreams import DatasetStreams, EpochMap, JobStreams
from placement.model import PerfModel
from placement.nodeplan import NEVER_KEY, NodePart, NodePass, designate, fold_pass, node_assignment, node_pass
from placement.parallel import Pool, per_node
from placement.randperm import Backend
from placement.streams import JobShape, Streams
from placement.tree import TreeArrays

FRAMEWORK_SAMPLER_KEYS = ("even_batches", "split_batches", "loader_generator")
KIND_SAMPLER_KEYS = {"aug_repeats": "repeat_aug"}
"""Sampler keys that decide the plan for one kind only: in the inputs (and digests) of that kind alone."""
FORMAT = 3
"""Version of the planning algorithm, hashed into every digest: plans of another version never match.
2: the digest covers every output column (objects and fill order too), not only tiers and owners.
3: large spread jobs plan per node (:mod:`placement.nodeplan`; :data:`DENSE_CELLS`)."""
_SUMMARY_SLICE = 1 << 21  # objects per slice of a per-node plan's summary
DENSE_CELLS = 1 << 27
"""Above this many (node, object) cells a spread plan is per node (:mod:`placement.nodeplan`): each
node computes its own reads and the first-reader designation, in O(objects) memory; up to it, the
dense planner keeps every node's rows (ImageNet-1k up to about 100 nodes) and its exact ownership
rounds.  Every node of a job takes the same branch: it depends on the inputs only."""
HEAVY_DELTA = 0.8  # NoPFS's example threshold for "read much more often than average"
I64 = npt.NDArray[np.int64]
PlanPhase = Literal["streams", "access", "assign", "summary", "done"]
"""The steps of :meth:`Plan.from_catalogs`, announced to its ``phases`` callback as each begins
("done": the plan is complete).  The caller times them: placement reads no clock."""


# --------------------------------------------------------------------------- inputs


def plan_inputs(config: Mapping[str, Any], seed: int) -> dict[str, Any]:
    """The parts of the config that decide the plan, canonically (hashed into the digest).

    Tier paths, thread counts, the performance model and everything about FUSE or peers except
    ``spread`` change no decision, so nodes that differ only there agree.
    """
    job = config["job"]
    return {
        "format": FORMAT,
        "seed": int(seed),
        "job": {k: job[k] for k in sorted(job)},
        "datasets": [
            {
                "root": os.path.normpath(ds["root"]),
                "layout": ds["layout"] or DEFAULT_LAYOUT,  # not given: planned as imagefolder
                "extensions": ds.get("extensions"),
                "follows": None if ds.get("follows") is None else os.path.normpath(ds["follows"]),
                "every": int(ds.get("every", 1)),
                "sampler": _sampler_inputs(ds["sampler"]),
                **_loader_inputs(ds),
            }
            for ds in config["datasets"]
        ],
        "tiers": [{"kind": t["kind"], "bytes": int(t["bytes"])} for t in config["tiers"]],
        "spread": bool(config["peers"]["spread"]),
    }


def _sampler_inputs(sampler: Mapping[str, Any]) -> dict[str, Any]:
    """The sampler keys that decide the plan: the framework kinds' own keys only for those kinds (so
    the inputs, and digests, of the other kinds stay what they were before those keys existed)."""
    framework = sampler.get("kind") in FRAMEWORK_KINDS
    return {
        k: sampler[k]
        for k in sorted(sampler)
        if k != "order_file"
        and (framework or k not in FRAMEWORK_SAMPLER_KEYS)
        and KIND_SAMPLER_KEYS.get(k, sampler.get("kind")) == sampler.get("kind")
    }


def _loader_inputs(ds: Mapping[str, Any]) -> dict[str, Any]:
    """A dataset's own DataLoader batching (``datasets.N.loader``), only where some key is set: the
    inputs, and digests, of configs that leave it to ``job.*`` stay what they were before it existed."""
    loader = {k: v for k, v in sorted((ds.get("loader") or {}).items()) if v is not None}
    return {"loader": loader} if loader else {}


def _dataset_shape(shape: JobShape, ds: Mapping[str, Any]) -> JobShape:
    """The job's shape with this dataset's DataLoader batch size and drop_last where it has its own."""
    loader = ds.get("loader") or {}
    batch, drop = loader.get("batch_size"), loader.get("drop_last")
    return dataclasses.replace(
        shape,
        batch_size=shape.batch_size if batch is None else int(batch),
        drop_last=shape.drop_last if drop is None else bool(drop),
    )


def _shape(inputs: Mapping[str, Any]) -> JobShape:
    job = inputs["job"]
    return JobShape(
        world_size=int(job["world_size"]),
        ranks_per_node=int(job["ranks_per_node"]),
        batch_size=int(job["batch_size"]),
        drop_last=bool(job["drop_last"]),
        rank_order=str(job.get("rank_order", "contiguous")),
    )


def _follows(inputs: Mapping[str, Any]) -> list[int | None]:
    roots = [ds["root"] for ds in inputs["datasets"]]
    out: list[int | None] = []
    for i, ds in enumerate(inputs["datasets"]):
        lead = ds["follows"]
        if lead is None:
            out.append(None)
            continue
        if lead not in roots or roots.index(lead) == i:
            raise ValueError(f"datasets.{i}.follows: {lead!r} is not the root of another dataset")
        out.append(roots.index(lead))
    return out


def _streams(
    inputs: Mapping[str, Any],
    sizes: Sequence[int],
    orders: Mapping[int, npt.ArrayLike],
    backend: Backend,
) -> list[Streams]:
    shape = _shape(inputs)
    job = inputs["job"]
    out = []
    job_shape = shape
    for i, ds in enumerate(inputs["datasets"]):
        smp = ds["sampler"]
        shape = _dataset_shape(job_shape, ds)
        if sizes[i] == 0:
            raise ValueError(f"datasets.{i} ({ds['root']}): no files to plan for")
        if smp["kind"] == "list" and i not in orders:
            raise ValueError(f"datasets.{i}.sampler: kind 'list' needs the contents of order_file")
        try:
            sampler = build_sampler(
                smp["kind"],
                int(sizes[i]),
                seed=int(inputs["seed"]),
                world_size=shape.world_size,
                batch_size=shape.batch_size,
                drop_last=shape.drop_last,
                shuffle=bool(smp.get("shuffle", True)),
                sampler_drop_last=bool(smp.get("drop_last", False)),
                even_batches=bool(smp.get("even_batches", True)),
                split_batches=bool(smp.get("split_batches", False)),
                loader_generator=bool(smp.get("loader_generator", False)),
                persistent_workers=bool(smp.get("persistent_workers", False)),
                num_workers=int(job.get("num_workers", 0)),
                aug_repeats=float(smp.get("aug_repeats", 3.0)),
                order=orders.get(i),
                backend=backend,
            )
        except ValueError as exc:
            raise ValueError(f"datasets.{i}.sampler: {exc}") from None
        out.append(Streams(sampler, shape))
    return out


def _job_streams(inputs: Mapping[str, Any], streams: Sequence[Streams]) -> JobStreams:
    follows = _follows(inputs)
    offsets = np.concatenate([[0], np.cumsum([st.n for st in streams])]).astype(np.int64)
    datasets = [
        DatasetStreams(st, int(offsets[d]), follows[d], int(inputs["datasets"][d]["every"]))
        for d, st in enumerate(streams)
    ]
    return JobStreams(datasets, _shape(inputs), int(inputs["job"]["epochs"]))


def job_streams_of(
    config: Mapping[str, Any], sizes: Sequence[int], orders: Mapping[int, npt.ArrayLike] | None = None
) -> JobStreams:
    """The job's streams for datasets of ``sizes`` files, without a plan (seed 0; which dataset
    leads and each one's shape do not depend on the seed): what the seed search needs to know."""
    inputs = plan_inputs(config, 0)
    order_arrays = {int(i): np.asarray(o, dtype=np.int64) for i, o in (orders or {}).items()}
    return _job_streams(inputs, _streams(inputs, sizes, order_arrays, "numpy"))


def _segments(js: JobStreams, ranks_per_node: int) -> list[Segment]:
    index = {id(d): i for i, d in enumerate(js.datasets)}
    phases = [[(index[id(d)], se) for d, se in js.phases(e)] for e in range(js.epochs)]
    return job_segments(phases, [d.streams.length * ranks_per_node for d in js.datasets])


def _le_bytes(a: npt.NDArray[Any]) -> bytes:
    arr = np.ascontiguousarray(a)
    return arr.astype(arr.dtype.newbyteorder("<"), copy=False).tobytes()


def _outputs(objects: Objects, assignment: Assignment | None, owner: npt.NDArray[np.int32]) -> list[npt.NDArray[Any]]:
    """Every output column a node acts on: which entry an object is, its size, where it goes and when.

    All of them, because a node that agrees on owners but not on ``obj_entry`` serves another file's
    bytes under the right name.  Hashing them costs a few ms at 1.28M files (xxh3, no copies).  A
    per-node plan (``assignment`` None) hashes the owners and objects, which every node computes
    alike; its own tiers are its own business (they follow from the owners and its own reads)."""
    out: list[npt.NDArray[Any]] = (
        [owner]
        if assignment is None
        else [
            assignment.tier_of,
            assignment.owner,
            assignment.fill_obj,
            assignment.fill_due,
            assignment.fill_off,
        ]
    )
    out += [
        objects.obj_entry,
        objects.size,
        objects.cacheable,
    ]
    if objects.gid_obj is not None:
        out.append(objects.gid_obj)
    return out


def _digest(
    inputs: Mapping[str, Any],
    catalogs: Sequence[Catalog],
    orders: Mapping[int, I64],
    arrays: Sequence[npt.NDArray[Any]],
) -> str:
    h = xxhash.xxh3_128()
    h.update(json.dumps(inputs, sort_keys=True, separators=(",", ":")).encode())
    for cat in catalogs:
        h.update(cat.digest().encode())
    for i in sorted(orders):
        h.update(f"order{i}".encode())
        h.update(_le_bytes(orders[i]))
    for a in arrays:
        h.update(str(a.dtype.str).encode() + str(a.shape).encode())
        h.update(_le_bytes(a))
    return h.hexdigest()


def _no_phase(phase: PlanPhase) -> None:
    """Nobody is timing the plan."""


# --------------------------------------------------------------------------- objects


@dataclass(frozen=True, eq=False)
class Objects:
    """Distinct cached things (snapshot entries) behind the global ids."""

    gid_obj: npt.NDArray[np.int32] | None  # None: identity (no entry is shared)
    obj_entry: npt.NDArray[np.int32]
    size: I64
    cacheable: npt.NDArray[np.bool_]

    @classmethod
    def of(cls, catalogs: Sequence[Catalog], entries_in_tree: int) -> Objects:
        entry = np.concatenate([c.entry for c in catalogs]).astype(np.int32)
        size = np.concatenate([c.size for c in catalogs]).astype(np.int64)
        readable = np.concatenate([c.readable for c in catalogs])
        if not entry.size or int(np.bincount(entry, minlength=max(entries_in_tree, 1)).max()) <= 1:
            return cls(None, entry, size, readable)
        uniq, first_idx, inverse = np.unique(entry, return_index=True, return_inverse=True)
        by_first = np.argsort(first_idx, kind="stable")  # objects numbered in order of first id
        rank = np.empty_like(by_first)
        rank[by_first] = np.arange(by_first.size)
        gid_obj = rank[inverse].astype(np.int32)
        firsts = first_idx[by_first]
        return cls(gid_obj, uniq[by_first].astype(np.int32), size[firsts], readable[firsts])

    def __len__(self) -> int:
        return int(self.obj_entry.shape[0])

    def fold(self, per_gid: npt.NDArray[Any], how: str) -> npt.NDArray[Any]:
        """(nodes, gids) -> (nodes, objects) by summing ("sum") or taking the minimum ("min")."""
        if self.gid_obj is None:
            return per_gid
        if how == "sum":
            out = np.zeros((per_gid.shape[0], len(self)), per_gid.dtype)
            for k in range(per_gid.shape[0]):
                out[k] = np.bincount(self.gid_obj, weights=per_gid[k], minlength=len(self)).astype(per_gid.dtype)
            return out
        out = np.full((per_gid.shape[0], len(self)), np.iinfo(per_gid.dtype).max, per_gid.dtype)
        for k in range(per_gid.shape[0]):
            np.minimum.at(out[k], self.gid_obj, per_gid[k])
        return out


# --------------------------------------------------------------------------- the plan


class Plan:
    """A computed plan (see the module docstring).  Build with :meth:`build`, or :meth:`load`."""

    def __init__(
        self,
        inputs: dict[str, Any],
        catalogs: list[Catalog],
        orders: dict[int, I64],
        objects: Objects,
        assignment: Assignment | None,
        digest: str,
        summary: dict[str, Any],
        backend: Backend = "auto",
        *,
        owner: npt.NDArray[np.int32] | None = None,
        parts: Mapping[int, NodePart] | None = None,
    ) -> None:
        self.inputs = inputs
        self.catalogs = catalogs
        self.orders = orders
        self.objects = objects
        self.assignment = assignment
        """Every node's rows (a dense plan), or None: a per-node plan (:attr:`per_node`)."""
        if assignment is not None:
            owner = assignment.owner
        if owner is None:
            raise ValueError("a plan needs an assignment or its owners")
        self.owner_obj: npt.NDArray[np.int32] = owner
        """Per object, the primary owner node (-1: nobody holds it)."""
        self._parts: dict[int, NodePart] = dict(parts or {})
        self.digest = digest
        self._summary = summary
        self.backend: Backend = backend
        self.shape = _shape(inputs)
        self.offsets = np.concatenate([[0], np.cumsum([len(c) for c in catalogs])]).astype(np.int64)
        self._job_streams: JobStreams | None = None
        self._segments: list[Segment] | None = None

    # ------------------------------------------------------------------ building

    @classmethod
    def build(
        cls,
        tree: TreeArrays,
        config: Mapping[str, Any],
        seed: int,
        *,
        lists: Mapping[int, Sequence[str]] | None = None,
        orders: Mapping[int, npt.ArrayLike] | None = None,
        backend: Backend = "auto",
        pool: Pool | None = None,
        width: int = 1,
        phases: Callable[[PlanPhase], None] | None = None,
        node: int | None = None,
        per_node: bool | None = None,
    ) -> Plan:
        """Plan the job in ``config`` (``Config.to_dict()``) over ``tree`` for sampler ``seed``.

        ``lists[i]`` / ``orders[i]``: contents of dataset i's list_file (paths) and
        order_file (indices), read by the caller.  Raises ValueError with a one-line reason for
        setups whose reads cannot be predicted.  ``pool``, ``width``, ``phases``, ``node`` and
        ``per_node``: see :meth:`from_catalogs`.
        """
        catalogs = build_catalogs(tree, config, lists)
        return cls.from_catalogs(
            catalogs,
            config,
            seed,
            orders=orders,
            backend=backend,
            pool=pool,
            width=width,
            entries=len(tree),
            phases=phases,
            node=node,
            per_node=per_node,
        )

    @classmethod
    def from_catalogs(
        cls,
        catalogs: Sequence[Catalog],
        config: Mapping[str, Any],
        seed: int,
        *,
        orders: Mapping[int, npt.ArrayLike] | None = None,
        backend: Backend = "auto",
        pool: Pool | None = None,
        width: int = 1,
        entries: int | None = None,
        phases: Callable[[PlanPhase], None] | None = None,
        node: int | None = None,
        per_node: bool | None = None,
    ) -> Plan:
        """The plan over catalogs already built (:meth:`build` builds them from a tree).

        ``pool``: the caller's threads for the independent passes, ``width`` of them
        (:mod:`placement.parallel`; None: the calling thread does everything); the plan does not
        depend on either.  ``phases`` is told each
        :data:`PlanPhase` as it begins, so that a caller can time them (``fusefs.planning.inputs``).
        ``per_node``: plan per node (:mod:`placement.nodeplan`) or densely; None: per node for spread
        jobs above :data:`DENSE_CELLS`.  ``node``: the node a per-node plan computes its part for at
        once (default 0; any other node's part is computed when asked, :meth:`node_part`).
        """
        mark: Callable[[PlanPhase], None] = phases or _no_phase
        mark("streams")
        inputs = plan_inputs(config, seed)
        order_arrays = {int(i): np.asarray(o, dtype=np.int64) for i, o in (orders or {}).items()}
        cats = list(catalogs)
        if len(cats) != len(inputs["datasets"]):
            raise ValueError("one catalog per configured dataset expected")
        streams = _streams(inputs, [len(c) for c in cats], order_arrays, backend)
        follows = _follows(inputs)
        nodes = _shape(inputs).nodes
        js = _job_streams(inputs, streams)
        segments = _segments(js, _shape(inputs).ranks_per_node)
        offsets = np.concatenate([[0], np.cumsum([len(c) for c in cats])]).astype(np.int64)
        budgets = np.array([t["bytes"] for t in inputs["tiers"]], np.int64)
        if per_node is None:
            per_node = bool(inputs["spread"]) and budgets.size > 0 and nodes * int(offsets[-1]) > DENSE_CELLS
        if entries is None:
            entries = 1 + max((int(c.entry.max()) for c in cats if len(c)), default=0)
        if per_node:
            if not inputs["spread"] or not budgets.size:
                raise ValueError("a per-node plan needs peers.spread and at least one tier")
            k = 0 if node is None else int(node)
            mark("access")
            p = node_pass(streams, offsets.tolist(), segments, k, count_type_for(streams, segments), pool, width)
            mark("assign")
            objects = Objects.of(cats, entries)
            po = fold_pass(p, objects.gid_obj, len(objects))
            read = objects.cacheable & (po.first_key != NEVER_KEY)
            owner = designate(po.first_key, po.total, objects.size, read, nodes, budgets)
            part = node_assignment(po, owner, objects.size, objects.cacheable, budgets)
            digest = _digest(inputs, cats, order_arrays, _outputs(objects, None, owner))
            mark("summary")
            summary = _summarize_node(
                inputs, cats, objects, p, po, part, owner, PerfModel.from_config(config), nodes, follows, segments
            )
            summary["digest"] = digest
            mark("done")
            plan = cls(
                inputs, cats, order_arrays, objects, None, digest, summary, backend, owner=owner, parts={k: part}
            )
            plan._job_streams = js
            plan._segments = segments
            return plan
        mark("access")
        stats = access_stats(streams, offsets.tolist(), segments, pool, width)
        mark("assign")
        objects = Objects.of(cats, entries)
        counts = objects.fold(stats.counts, "sum")
        first = objects.fold(stats.first_use, "min")
        assignment = assign(
            counts, first, objects.size, objects.cacheable, budgets, spread=inputs["spread"], pool=pool, width=width
        )
        digest = _digest(inputs, cats, order_arrays, _outputs(objects, assignment, assignment.owner))
        mark("summary")
        model = PerfModel.from_config(config)
        summary = _summarize(
            inputs, cats, objects, stats, counts, first, assignment, model, nodes, follows, pool, width
        )
        summary["digest"] = digest
        mark("done")
        plan = cls(inputs, cats, order_arrays, objects, assignment, digest, summary, backend)
        plan._job_streams = js
        plan._segments = segments
        return plan

    # ------------------------------------------------------------------ what the daemon asks

    @property
    def nodes(self) -> int:
        return self.shape.nodes

    @property
    def epochs(self) -> int:
        return int(self.inputs["job"]["epochs"])

    @property
    def seed(self) -> int:
        return int(self.inputs["seed"])

    @property
    def files(self) -> int:
        """Global ids over all datasets."""
        return int(self.offsets[-1])

    def job_streams(self) -> JobStreams:
        """The job's per-epoch streams over global ids (what the daemon's cursor follows)."""
        if self._job_streams is None:
            st = _streams(self.inputs, [len(c) for c in self.catalogs], self.orders, self.backend)
            self._job_streams = _job_streams(self.inputs, st)
        return self._job_streams

    def segments(self, epoch: int | None = None) -> list[Segment]:
        """The job's segments (one dataset read each), or only those of job epoch ``epoch``."""
        if self._segments is None:
            self._segments = _segments(self.job_streams(), self.shape.ranks_per_node)
        if epoch is None:
            return self._segments
        return [s for s in self._segments if s.job_epoch == epoch]

    def node_stream(self, epoch: int, node: int) -> I64:
        """Global ids ``node`` opens in job epoch ``epoch``: the training read, then validation when due."""
        return self.job_streams().node_stream(epoch, node)

    def epoch_map(self, epoch: int) -> EpochMap:
        """Global id -> (rank, position) of its first read in job epoch ``epoch`` (detection)."""
        return self.job_streams().epoch_map(epoch)

    def dataset_of(self, gid: int) -> tuple[int, int]:
        """(dataset, index in its catalog) of a global id."""
        d = int(np.searchsorted(self.offsets, gid, side="right")) - 1
        if not 0 <= gid < self.files:
            raise IndexError(f"gid {gid} outside 0..{self.files - 1}")
        return d, gid - int(self.offsets[d])

    def entry_of(self, gids: npt.ArrayLike) -> npt.NDArray[np.int32]:
        """Snapshot entry (inode - 1) of global ids."""
        g = np.asarray(gids, dtype=np.int64)
        return self.objects.obj_entry[self.obj_of(g)]

    def obj_of(self, gids: npt.ArrayLike) -> npt.NDArray[np.int64]:
        g = np.asarray(gids, dtype=np.int64)
        return g if self.objects.gid_obj is None else self.objects.gid_obj[g].astype(np.int64)

    @property
    def per_node(self) -> bool:
        """Whether this plan holds only some nodes' parts (:mod:`placement.nodeplan`), not all rows."""
        return self.assignment is None

    def planned_nodes(self) -> list[int]:
        """The nodes whose tiers this plan holds without computing anything (all, for a dense plan)."""
        return list(range(self.nodes)) if self.assignment is not None else sorted(self._parts)

    def node_part(self, node: int) -> NodePart:
        """``node``'s tiers and fill order.  A per-node plan computes a node it was not built for here,
        once (a pass over the job's permutations: seconds at ImageNet scale); see :meth:`planned_nodes`."""
        if not 0 <= node < self.nodes:
            raise ValueError(f"node: expected 0..{self.nodes - 1}, got {node}")
        part = self._parts.get(node)
        if part is not None:
            return part
        if self.assignment is not None:
            a = self.assignment
            obj, due = a.fill_order(node)
            part = NodePart(node, a.tier_of[node], obj, due, a.tier_bytes[node], a.tier_files[node])
        else:
            js = self.job_streams()
            streams = [d.streams for d in js.datasets]
            segments = self.segments()
            p = node_pass(streams, self.offsets.tolist(), segments, node, count_type_for(streams, segments))
            po = fold_pass(p, self.objects.gid_obj, len(self.objects))
            budgets = np.array([t["bytes"] for t in self.inputs["tiers"]], np.int64)
            part = node_assignment(po, self.owner_obj, self.objects.size, self.objects.cacheable, budgets)
        self._parts[node] = part
        return part

    def node_tiers(self, node: int) -> npt.NDArray[np.int8]:
        """Per object: the tier holding it on ``node``, -1 none."""
        if self.assignment is not None:
            row: npt.NDArray[np.int8] = self.assignment.tier_of[node]
            return row
        return self.node_part(node).tier_of

    def tier_of(self, node: int) -> npt.NDArray[np.int8]:
        """Per global id: the tier holding it on ``node``, -1 none."""
        row = self.node_tiers(node)
        return row if self.objects.gid_obj is None else row[self.objects.gid_obj]

    def owner(self) -> npt.NDArray[np.int32]:
        """Per global id: the primary owner node, -1 when no node holds it."""
        o = self.owner_obj
        return o if self.objects.gid_obj is None else o[self.objects.gid_obj]

    def owner_of(self, gids: npt.NDArray[np.int64]) -> npt.NDArray[np.int32]:
        """The primary owner node of each of ``gids`` (-1: nobody holds it), without
        :meth:`owner`'s array over every id."""
        return self.owner_obj[self.obj_of(gids)]

    def fill_order(self, node: int) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.int64]]:
        """Objects ``node`` keeps in its tiers, in the order to fetch them, with the job position
        each is due by (its first use there; for its primary owner, anybody's first use)."""
        if self.assignment is not None:
            return self.assignment.fill_order(node)
        part = self.node_part(node)
        return part.fill_obj, part.fill_due

    def summary(self) -> dict[str, Any]:
        return self._summary

    # ------------------------------------------------------------------ persistence

    def arrays(self) -> dict[str, npt.NDArray[Any]]:
        """Every column of the plan by name: what :mod:`fusefs.planning.store` persists."""
        arrays: dict[str, npt.NDArray[Any]] = {"owner": self.owner_obj}
        if self.assignment is not None:
            a = self.assignment
            arrays |= {
                "tier_of": a.tier_of,
                "fill_obj": a.fill_obj,
                "fill_due": a.fill_due,
                "fill_off": a.fill_off,
                "tier_bytes": a.tier_bytes,
                "tier_files": a.tier_files,
            }
        else:
            for k, part in sorted(self._parts.items()):
                held = np.flatnonzero(part.tier_of >= 0).astype(np.int32)  # the node's share, not a row
                arrays |= {
                    f"node{k}_held": held,
                    f"node{k}_tier": part.tier_of[held],
                    f"node{k}_fill_obj": part.fill_obj,
                    f"node{k}_fill_due": part.fill_due,
                    f"node{k}_tier_bytes": part.tier_bytes,
                    f"node{k}_tier_files": part.tier_files,
                }
        arrays |= {
            "obj_entry": self.objects.obj_entry,
            "obj_size": self.objects.size,
            "obj_cacheable": self.objects.cacheable,
        }
        if self.objects.gid_obj is not None:
            arrays["gid_obj"] = self.objects.gid_obj
        for d, cat in enumerate(self.catalogs):
            for key, arr in cat.arrays().items():
                arrays[f"cat{d}_{key}"] = arr
        for d, order in self.orders.items():
            arrays[f"order{d}"] = order
        return arrays

    def meta(self) -> dict[str, Any]:
        """The plan's JSON-able part (inputs, catalogs, digest, summary), next to :meth:`arrays`."""
        return {
            "digest": self.digest,
            "per_node": sorted(self._parts) if self.assignment is None else None,
            "inputs": self.inputs,
            "catalogs": [c.meta() for c in self.catalogs],
            "summary": self._summary,
        }

    @classmethod
    def from_parts(
        cls, meta: Mapping[str, Any], arrays: Mapping[str, npt.NDArray[Any]], backend: Backend = "auto"
    ) -> Plan:
        """The plan whose :meth:`meta` and :meth:`arrays` these are (KeyError if a part is missing)."""
        catalogs = []
        for d, cmeta in enumerate(meta["catalogs"]):
            prefix = f"cat{d}_"
            catalogs.append(
                Catalog.from_parts(cmeta, {k[len(prefix) :]: v for k, v in arrays.items() if k.startswith(prefix)})
            )
        orders = {int(k[5:]): np.asarray(v) for k, v in arrays.items() if k.startswith("order")}
        objects = Objects(arrays.get("gid_obj"), arrays["obj_entry"], arrays["obj_size"], arrays["obj_cacheable"])
        planned = meta.get("per_node")
        if planned is not None:
            parts = {}
            for k in planned:
                held = np.asarray(arrays[f"node{k}_held"], dtype=np.int64)
                tier_of = np.full(len(objects), -1, np.int8)
                tier_of[held] = arrays[f"node{k}_tier"]
                parts[int(k)] = NodePart(
                    int(k),
                    tier_of,
                    arrays[f"node{k}_fill_obj"],
                    arrays[f"node{k}_fill_due"],
                    arrays[f"node{k}_tier_bytes"],
                    arrays[f"node{k}_tier_files"],
                )
            return cls(
                dict(meta["inputs"]),
                catalogs,
                orders,
                objects,
                None,
                meta["digest"],
                dict(meta["summary"]),
                backend,
                owner=arrays["owner"],
                parts=parts,
            )
        assignment = Assignment(
            arrays["tier_of"],
            arrays["owner"],
            arrays["fill_obj"],
            arrays["fill_due"],
            arrays["fill_off"],
            arrays["tier_bytes"],
            arrays["tier_files"],
        )
        return cls(
            dict(meta["inputs"]), catalogs, orders, objects, assignment, meta["digest"], dict(meta["summary"]), backend
        )

    def recompute_digest(self) -> str:
        """The digest from this plan's own inputs and outputs (a loaded plan can check itself)."""
        return _digest(self.inputs, self.catalogs, self.orders, _outputs(self.objects, self.assignment, self.owner_obj))


# --------------------------------------------------------------------------- summary


class _RemoteTiers:
    """For any node, the fastest tier another node holds each object in, without a pass per tier.

    Keeps per object the fastest held tier, how many nodes hold it there, and the fastest tier
    after that one: a node only needs the second when it is the sole holder in the first.
    """

    def __init__(self, tier_of: npt.NDArray[np.int8], model: PerfModel) -> None:
        tiers = len(model.tiers)
        nodes, m = tier_of.shape
        holders = np.zeros((tiers, m), np.int32)
        for k in range(nodes):
            row = tier_of[k]
            for j in range(tiers):
                holders[j] += row == j
        self.best = np.full(m, -1, np.int8)
        self.second = np.full(m, -1, np.int8)
        for j in sorted(range(tiers), key=model.peer_rate):  # slowest first: faster ones overwrite
            has = holders[j] > 0
            self.second[has] = self.best[has]
            self.best[has] = j
        self.best_count = np.zeros(m, np.int32)
        for j in range(tiers):
            sel = self.best == j
            self.best_count[sel] = holders[j][sel]
        self.held_any = self.best >= 0

    def for_node(self, mine: npt.NDArray[np.int8]) -> npt.NDArray[np.int8]:
        remote = self.best.copy()
        alone = mine == self.best
        alone &= self.best_count == 1
        remote[alone] = self.second[alone]
        return remote


def _summarize(
    inputs: Mapping[str, Any],
    catalogs: Sequence[Catalog],
    objects: Objects,
    stats: AccessStats,
    counts: npt.NDArray[Any],
    first: npt.NDArray[Any],
    assignment: Assignment,
    model: PerfModel,
    nodes: int,
    follows: Sequence[int | None],
    pool: Pool | None = None,
    width: int = 1,
) -> dict[str, Any]:
    """Bytes per tier, read shares by source, predicted I/O time and PFS traffic, per node.

    Reads are classified per (node, object): the job's first read of a held object is a PFS read
    (the owner's fetch, on the reader's critical path); every other read takes the fastest
    source the model picks among the node's own tier, the fastest peer tier and the PFS.
    "first_epoch" is job epoch 0 (cold); "later_epochs" averages the others.
    """
    tier_of = assignment.tier_of
    tiers = len(inputs["tiers"])
    epochs = int(inputs["job"]["epochs"])
    sizes = objects.size
    fsizes = sizes.astype(np.float64)
    first_counts = objects.fold(stats.first_epoch_counts, "sum")
    epoch1 = next((s.start for s in stats.segments if s.job_epoch == 1), np.iinfo(np.int64).max)
    if assignment.first_reader is not None and assignment.earliest is not None:
        earliest_first, first_reader = assignment.earliest, assignment.first_reader
    else:
        earliest_first, first_reader = earliest_reader(first, pool, width)
    remotes = _RemoteTiers(tier_of, model)
    held_any = remotes.held_any
    read_any = first_reader >= 0
    total_reads = counts.sum(axis=0, dtype=np.int64)
    # PFS traffic over the job: each held object once (its owner's fetch), the others at every read
    pfs_bytes = int(sizes[held_any & read_any].sum()) + int((total_reads * sizes)[~held_any].sum())
    # categories: local tier j -> j, peer tier j -> tiers + j, PFS -> 2 * tiers
    cats = 2 * tiers + 1
    pfs_cat = 2 * tiers
    reads_by = np.zeros((nodes, 2, cats), np.int64)
    bytes_by = np.zeros((nodes, 2, cats), np.int64)
    table, pfs_above = model.source_table(nodes)
    size_matters = bool((np.isfinite(pfs_above) & (pfs_above >= 0)).any())
    first_is_epoch0 = earliest_first < epoch1  # the job's first read of each object is in epoch 0

    def classify(k: int) -> None:  # writes node k's rows only
        combo = tier_of[k].astype(np.intp)
        combo += 1
        combo *= tiers + 1
        combo += remotes.for_node(tier_of[k])
        combo += 1
        cat = table.take(combo)
        if size_matters:  # a PFS faster than some tier: large files go there after all
            cat[fsizes > pfs_above.take(combo)] = pfs_cat
        c = counts[k].astype(np.float64)
        c0 = first_counts[k].astype(np.float64)
        all_reads = np.bincount(cat, weights=c, minlength=cats)
        reads_by[k, 0] = np.rint(np.bincount(cat, weights=c0, minlength=cats))
        reads_by[k, 1] = np.rint(all_reads) - reads_by[k, 0]
        c *= fsizes
        c0 *= fsizes
        all_bytes = np.bincount(cat, weights=c, minlength=cats)
        bytes_by[k, 0] = np.rint(np.bincount(cat, weights=c0, minlength=cats))
        bytes_by[k, 1] = np.rint(all_bytes) - bytes_by[k, 0]
        # the job's first read of a held object comes from the PFS (the owner fetches it then)
        cold = np.flatnonzero(first_reader == k)
        cold = cold[held_any.take(cold)]
        for phase, sel in ((0, cold[first_is_epoch0.take(cold)]), (1, cold[~first_is_epoch0.take(cold)])):
            moved_r = np.bincount(cat.take(sel), minlength=cats)
            moved_b = np.rint(np.bincount(cat.take(sel), weights=fsizes.take(sel), minlength=cats)).astype(np.int64)
            reads_by[k, phase] -= moved_r
            bytes_by[k, phase] -= moved_b
            reads_by[k, phase, pfs_cat] += int(sel.size)
            bytes_by[k, phase, pfs_cat] += int(moved_b.sum())

    per_node(classify, nodes, pool)
    pfs_readers = [int((reads_by[:, phase, 2 * tiers] > 0).sum()) for phase in (0, 1)]
    node_reports: list[dict[str, Any]] = []
    owned_files = np.bincount(assignment.owner + 1, minlength=nodes + 1)[1:]
    owned_bytes = np.rint(np.bincount(assignment.owner + 1, weights=fsizes, minlength=nodes + 1)[1:])
    for k in range(nodes):
        node: dict[str, Any] = {"node": k}
        node["tier_bytes"] = [int(x) for x in assignment.tier_bytes[k]]
        node["tier_files"] = [int(x) for x in assignment.tier_files[k]]
        node["owned_files"] = int(owned_files[k])
        node["owned_bytes"] = int(owned_bytes[k])
        node.update(_phase_reports(reads_by[k], bytes_by[k], epochs, tiers, model, pfs_readers))
        node_reports.append(node)
    return {
        **_job_report(inputs, catalogs, follows, stats.segments, objects, read_any, held_any, nodes, None),
        "pfs_bytes_job": pfs_bytes,
        "pfs_bytes_without_cache": int((total_reads * sizes).sum()),
        "frequency": _frequency(inputs, catalogs, stats.segments, stats.counts, nodes, follows),
        "per_node": node_reports,
    }


def _summarize_node(
    inputs: Mapping[str, Any],
    catalogs: Sequence[Catalog],
    objects: Objects,
    p: NodePass,
    po: NodePass,
    part: NodePart,
    owner: npt.NDArray[np.int32],
    model: PerfModel,
    nodes: int,
    follows: Sequence[int | None],
    segments: Sequence[Segment],
) -> dict[str, Any]:
    """:func:`_summarize` for a per-node plan: the job-wide numbers (coverage, PFS bytes) from the
    per-object arrays every node has, and the one node's report.

    Another node's tiers are not known here, so a read this node does not hold counts as a peer read
    from its owner's slowest tier (the owner holds it, in some tier); a read of an object nobody owns
    is a PFS read.  PFS bytes over the job: each owned object once, the others at every read (a node
    keeping an unowned object by frequency fetches it itself: this counts its reads as PFS reads).
    """
    tiers = len(inputs["tiers"])
    epochs = int(inputs["job"]["epochs"])
    sizes = objects.size
    k = part.node
    held_any = owner >= 0
    read_any = po.first_key != NEVER_KEY
    cats = 2 * tiers + 1
    pfs_cat = 2 * tiers
    slowest_peer = min(range(tiers), key=model.peer_rate) if tiers else -1
    table, pfs_above = model.source_table(nodes)
    size_bound = bool((np.isfinite(pfs_above) & (pfs_above >= 0)).any())
    epoch1 = next((s.start for s in segments if s.job_epoch == 1), np.iinfo(np.int64).max)
    reads_by = np.zeros((2, cats), np.int64)
    bytes_by = np.zeros((2, cats), np.int64)
    pfs_bytes = uncached = 0
    # in slices of objects: whole float64 and intp columns of 14 million objects would add a GB;
    # every sum is of integers below 2**53, so each slice's is exact and they add up to the same
    for lo in range(0, len(objects), _SUMMARY_SLICE):
        sl = slice(lo, lo + _SUMMARY_SLICE)
        held, size = held_any[sl], sizes[sl]
        fsizes = size.astype(np.float64)
        total_bytes = po.total[sl].astype(np.int64)
        total_bytes *= size
        pfs_bytes += int(size[held & read_any[sl]].sum()) + int(total_bytes[~held].sum())
        uncached += int(total_bytes.sum())
        del total_bytes
        remote = np.where(held & (owner[sl] != k), np.int8(slowest_peer), np.int8(-1))
        combo = part.tier_of[sl].astype(np.intp)
        combo += 1
        combo *= tiers + 1
        combo += remote
        combo += 1
        cat = table.take(combo)
        if size_bound:
            cat[fsizes > pfs_above.take(combo)] = pfs_cat
        del combo, remote
        c = po.counts[sl].astype(np.float64)
        c0 = po.first_epoch_counts[sl].astype(np.float64)
        first_reads = np.rint(np.bincount(cat, weights=c0, minlength=cats)).astype(np.int64)
        reads_by[0] += first_reads
        reads_by[1] += np.rint(np.bincount(cat, weights=c, minlength=cats)).astype(np.int64) - first_reads
        c0 *= fsizes
        c *= fsizes
        first_bytes = np.rint(np.bincount(cat, weights=c0, minlength=cats)).astype(np.int64)
        bytes_by[0] += first_bytes
        bytes_by[1] += np.rint(np.bincount(cat, weights=c, minlength=cats)).astype(np.int64) - first_bytes
        del c, c0
        key = po.first_key[sl]
        cold = np.flatnonzero((key % nodes == k) & (key != NEVER_KEY) & held)  # read here first, and held
        in_epoch0 = key.take(cold) // nodes < epoch1
        for phase, sel in ((0, cold[in_epoch0]), (1, cold[~in_epoch0])):
            moved_b = np.rint(np.bincount(cat.take(sel), weights=fsizes.take(sel), minlength=cats)).astype(np.int64)
            reads_by[phase] -= np.bincount(cat.take(sel), minlength=cats)
            bytes_by[phase] -= moved_b
            reads_by[phase, pfs_cat] += int(sel.size)
            bytes_by[phase, pfs_cat] += int(moved_b.sum())
    node: dict[str, Any] = {
        "node": k,
        "tier_bytes": [int(x) for x in part.tier_bytes],
        "tier_files": [int(x) for x in part.tier_files],
        "owned_files": int((owner == k).sum()),
        "owned_bytes": int(sizes[owner == k].sum()),
    }
    # every node reads the PFS alike in the model: as many readers as nodes that read it at all
    readers = [nodes if reads_by[phase, pfs_cat] else 0 for phase in (0, 1)]
    node.update(_phase_reports(reads_by, bytes_by, epochs, tiers, model, readers))
    return {
        **_job_report(inputs, catalogs, follows, segments, objects, read_any, held_any, nodes, "per_node"),
        "pfs_bytes_job": pfs_bytes,
        "pfs_bytes_without_cache": uncached,
        "frequency": _frequency(inputs, catalogs, list(segments), p.counts[None, :], nodes, follows),
        "per_node": [node],
    }


def _job_report(
    inputs: Mapping[str, Any],
    catalogs: Sequence[Catalog],
    follows: Sequence[int | None],
    segments: Sequence[Segment],
    objects: Objects,
    read_any: npt.NDArray[np.bool_],
    held_any: npt.NDArray[np.bool_],
    nodes: int,
    planned: str | None,
) -> dict[str, Any]:
    """The summary's head, the same for a dense and a per-node plan: the job, its datasets and the
    coverage of what it reads (``planned``: how, where not dense)."""
    job = inputs["job"]
    head: dict[str, Any] = {
        "seed": int(inputs["seed"]),
        "nodes": nodes,
        "world_size": int(job["world_size"]),
        "ranks_per_node": int(job["ranks_per_node"]),
        "epochs": int(job["epochs"]),
        "spread": bool(inputs["spread"]),
    }
    if planned is not None:
        head["planned"] = planned
    budgets = np.array([t["bytes"] for t in inputs["tiers"]], np.int64)
    head["tiers"] = [{"kind": t["kind"], "bytes": int(t["bytes"])} for t in inputs["tiers"]]
    head["datasets"] = _dataset_reports(catalogs, follows, segments)
    head["objects"] = len(objects)
    head["coverage"] = _coverage(objects.size, objects.cacheable & read_any, held_any, budgets)
    return head


def _coverage(sizes: I64, read: npt.NDArray[np.bool_], held_any: npt.NDArray[np.bool_], budgets: I64) -> dict[str, Any]:
    """What the job reads and how much of it some node holds; whether spread ownership can hold it all."""
    held = held_any & read
    return {
        "read_objects": int(read.sum()),
        "read_bytes": int(sizes[read].sum()),
        "held_objects": int(held.sum()),
        "held_bytes": int(sizes[held].sum()),
        "spread_guaranteed": bool(spread_covers(sizes, read, budgets)) if budgets.size else False,
    }


def _phase_reports(
    reads_by: I64, bytes_by: I64, epochs: int, tiers: int, model: PerfModel, pfs_readers: Sequence[int]
) -> dict[str, Any]:
    """One node's ``first_epoch`` and ``later_epochs`` reports from its reads and bytes per phase and
    source category (local tier j, peer tier j, PFS); ``pfs_readers``: nodes reading the PFS per phase."""
    out: dict[str, Any] = {}
    for phase, name, div in ((0, "first_epoch", 1), (1, "later_epochs", max(epochs - 1, 0))):
        if div == 0:
            out[name] = None
            continue
        r, b = reads_by[phase], bytes_by[phase]
        local, peer, pfs = int(r[:tiers].sum()), int(r[tiers : 2 * tiers].sum()), int(r[2 * tiers])
        total = max(local + peer + pfs, 1)
        seconds = _phase_seconds(model, b, pfs, tiers, pfs_readers[phase])
        out[name] = {
            "reads_per_epoch": round((local + peer + pfs) / div, 1),
            "share": {"local": round(local / total, 4), "peer": round(peer / total, 4), "pfs": round(pfs / total, 4)},
            "pfs_bytes_per_epoch": int(b[2 * tiers]) // div,
            "predicted_io_seconds_per_epoch": round(seconds / div, 3),
        }
    return out


def _dataset_reports(
    catalogs: Sequence[Catalog], follows: Sequence[int | None], segments: Sequence[Segment]
) -> list[dict[str, Any]]:
    """The summary's line per dataset: its catalog's facts and how many passes the job makes over it."""
    return [
        {
            "root": cat.root,
            "layout": cat.layout,
            "files": len(cat),
            "bytes": cat.total_bytes,
            "classes": len(cat.classes),
            "unreadable": int((~cat.readable).sum()),
            "outside_links": len(cat.outside_links),
            "exact": cat.exact,
            "follows": None if follows[d] is None else catalogs[int(follows[d] or 0)].root,
            "reads": sum(1 for s in segments if s.dataset == d),
        }
        for d, cat in enumerate(catalogs)
    ]


def _phase_seconds(model: PerfModel, bytes_by: I64, pfs_reads: int, tiers: int, readers: int) -> float:
    """Sum of fetch and staging-write times of one phase's reads, over the p_0 staging threads."""
    mb = 1_000_000
    secs = 0.0
    for j in range(tiers):
        secs += int(bytes_by[j]) / mb / model.local_rate(j) + int(bytes_by[tiers + j]) / mb / model.peer_rate(j)
    secs += int(bytes_by[2 * tiers]) / mb / model.pfs_rate(max(readers, 1)) + pfs_reads * model.open_latency_s
    secs += model.write_seconds(float(bytes_by.sum()))
    return secs / model.staging_threads


def _frequency(
    inputs: Mapping[str, Any],
    catalogs: Sequence[Catalog],
    segments: Sequence[Segment],
    counts: npt.NDArray[Any],
    nodes: int,
    follows: Sequence[int | None],
) -> dict[str, Any] | None:
    """NoPFS 3.1 next to the measured counts for the first training dataset (strided samplers);
    ``counts``: a row per node observed (all nodes, or a per-node plan's own)."""
    primary = next((d for d, f in enumerate(follows) if f is None), None)
    if primary is None:
        return None
    smp = inputs["datasets"][primary]["sampler"]
    if smp["kind"] != "distributed" or not smp.get("shuffle", True):
        return None
    files = len(catalogs[primary])
    reads = sum(1 for s in segments if s.dataset == primary)
    threshold = heavy_threshold(nodes, reads, HEAVY_DELTA)
    lo = sum(len(c) for c in catalogs[:primary])
    observed = [int((row[lo : lo + files] >= threshold).sum()) for row in counts]
    return {
        "delta": HEAVY_DELTA,
        "mean_reads_per_node": round(reads / nodes, 3),
        "threshold": threshold,
        "expected_heavy_per_node": round(expected_heavy_files(files, nodes, reads, HEAVY_DELTA), 1),
        "observed_heavy_per_node": observed,
        "max_reads_by_one_node": int(counts[:, lo : lo + files].max()) if files else 0,
    }
