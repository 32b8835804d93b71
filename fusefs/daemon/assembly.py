"""Builds the daemon's components for one mount, mounts it, and runs the FUSE front's loop.

Kept apart from :mod:`fusefs.daemon.lifecycle` (forking, readiness, logging) so the assembly can be
built in-process.  Building and mounting are separate steps: :func:`build_readpath` and
:func:`build_operations` make the read path and the real Operations handlers with the kernel's
page-cache calls and every source (PFS reader, tiers, peer fetch) passed in, so they also run in
one process without /dev/fuse; :meth:`Daemon.mount` is the step that needs the kernel.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import trio
import xxhash

from fusefs import mountinfo
from fusefs.cluster.formation import (
    Group,
    Rendezvous,
    alone,
    bind_address,
    detect_mode,
    form_mpi,
    form_static,
    listen_socket,
)
from fusefs.cluster.peerclients import PeerClients
from fusefs.cluster.peergroup import PeerGroup
from fusefs.config import Config
from fusefs.daemon.checks import MountRequest
from fusefs.daemon.memfit import MemoryFit, file_sizes, fitted_config, size_at_mount
from fusefs.daemon.metrics import MetricsExporter
from fusefs.daemon.runtime import MountRecord
from fusefs.daemon.status import StartupTask, StatusBoard, StatusDocument, StatusSections, snapshot_status
from fusefs.errors import FuseUnavailable, MountpointError
from fusefs.fuse.attrs import AttrFactory
from fusefs.fuse.control import ControlFiles
from fusefs.fuse.front import EntryAttributes, Front, NewFileInfo, PlainAttributes, PlainFileInfo
from fusefs.fuse.operations import SeerOperations
from fusefs.fuse.pyfuse3_front import Pyfuse3Front
from fusefs.meta.snapshot import Snapshot, load_or_scan, mark_stale, snapshot_file
from fusefs.planning.discovery import SeedDiscovery
from fusefs.planning.inputs import planning_config
from fusefs.planning.manager import PlanManager
from fusefs.planning.seed import SeedState
from fusefs.progress import LOG_INTERVAL_S, Progress, ProgressDoc
from fusefs.readpath.contract import CursorView
from fusefs.readpath.counters import ReadCounters
from fusefs.readpath.fetcher import Fetcher
from fusefs.readpath.hooks import NO_HOOKS, ReadPathHooks
from fusefs.readpath.openfiles import OpenFiles
from fusefs.readpath.pfs import PfsReader
from fusefs.readpath.policy import PolicySettings, ReadPolicy
from fusefs.readpath.port import PolicyPort
from fusefs.readpath.prefetch import GroupFetch, Prefetcher
from fusefs.readpath.revalidate import Revalidator
from fusefs.readpath.staging import Kernel, Staging, ThroughMount
from fusefs.tiers import Budget, Tier, build_tiers, memory_budget
from placement.cursor import CursorSettings, DatasetState
from placement.plan import Plan, plan_inputs
from placement.recheck import rechecked_here
from placement.tree import KIND_FILE, TreeArrays

log = logging.getLogger(__name__)

GIL_SWITCH_INTERVAL = 0.001


def make_front(name: str, snapshot: Snapshot, no_open: str = "off") -> Front[SeerOperations]:
    """The front ``fuse.front`` names; native falls back to pyfuse3 (one INFO line) where the
    extension was not built or does not load.  ``no_open`` (``fuse.no_open``): on, or auto where
    the daemon has CAP_SYS_ADMIN, asks the native front for zero-request opens."""
    if name == "native":
        try:
            from fusefs.fuse.native_front import NativeFront, may_watch
        except ImportError as exc:
            log.info("native FUSE front not available (%s): serving through pyfuse3", exc)
        else:
            wanted = no_open == "on" or (no_open == "auto" and may_watch())
            tree = snapshot.tree
            return NativeFront(
                tree.path, inodes=len(tree) + 1, no_open=wanted, watch_dirs=lambda: _dirs_with_files(tree)
            )
    if no_open == "on":
        log.warning("fuse.no_open: on needs the native front; opens are served as requests")
    return Pyfuse3Front(snapshot.tree.path)


def _dirs_with_files(tree: TreeArrays) -> list[bytes]:
    """The directories ``fuse.no_open`` marks with fanotify (relative paths; ``b""``: the root)."""
    parents = np.unique(tree.parent[1:][tree.kind[1:] == KIND_FILE])
    return [tree.path(int(p)) for p in parents]


def _escape_opt(value: str) -> str:
    return value.replace("\\", "\\\\").replace(",", "\\,")


@dataclass
class ReadPath:
    """One mount's read path: what an open, a read and a release go through, and the prefetching."""

    cfg: Config
    snapshot: Snapshot
    counters: ReadCounters
    budget: Budget
    tiers: list[Tier]
    reader: PfsReader
    policy: ReadPolicy
    staging: Staging
    fetcher: Fetcher
    prefetcher: Prefetcher
    open_files: OpenFiles
    revalidator: Revalidator

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve: fetches, staging and prefetching run in this task's nursery until it is cancelled."""
        async with trio.open_nursery() as nursery:
            self.fetcher.attach(nursery)
            nursery.start_soon(self.staging.run)
            nursery.start_soon(self.prefetcher.run)
            nursery.start_soon(self.revalidator.run)
            task_status.started()


def build_readpath(
    cfg: Config,
    snapshot: Snapshot,
    *,
    counters: ReadCounters | None = None,
    kernel: Kernel | None = None,
    reader: PfsReader | None = None,
    tiers: list[Tier] | None = None,
    peer_fetch: GroupFetch | None = None,
    port: PolicyPort | None = None,
    fitted: Config | None = None,
    hooks: ReadPathHooks = NO_HOOKS,
) -> ReadPath:
    """Tiers, staging, fetcher, policy and prefetcher for ``snapshot`` under ``cfg``.

    ``kernel`` makes the page-cache calls (default: the mounted kernel, through the pyfuse3 front),
    ``reader`` reads the PFS, ``tiers`` (charging the RAM budget) hold local copies and
    ``peer_fetch`` asks the owning peer (none alone); each defaults to what ``cfg`` configures
    (tiers given here tell the policy of a copy they drop only if built with ``on_drop`` set to
    ``port.copy_lost``).
    ``port``: the policy's port, when something built before the read path reports into it (the
    peers' clients).  ``fitted``: ``cfg`` with the memory tiers sized to the memory cgroup
    (:func:`fusefs.daemon.memfit.fitted_config`), which the RAM budget, the staging window and the
    reactive policy's capacities are made from; the plan and ``.control/config`` keep ``cfg``.
    ``hooks``: the read path's optional observers (the daemon's seed discovery and group,
    :meth:`Daemon._hooks`).

    Every component gets what it needs as a constructor argument, in this order.  The budget,
    staging and the fetcher report into the policy's executor, which drives them and so is built
    after them: they get the policy's port, made first, and the executor is bound to it once built
    (the one late-bound link: ARCHITECTURE.md, "Wiring").  The fetcher asks peers through the port
    too: the executor holds ``peer_fetch`` and tells it who owns a file now.
    """
    port = port if port is not None else PolicyPort()
    counters = counters if counters is not None else ReadCounters()
    ram = fitted if fitted is not None else cfg
    lookahead = ram.prefetch.lookahead_bytes
    # The staging window lives inside the memory tiers' bytes; without a memory tier it is the RAM
    # budget by itself.
    has_memory_tier = any(t.kind == "memory" for t in ram.tiers)
    budget = memory_budget(ram.tiers, port.reclaim) if has_memory_tier else Budget(lookahead, "memory", port.reclaim)
    if tiers is None:
        tiers = build_tiers(cfg.tiers, budget, snapshot.fingerprint, cfg.cache_path, port.copy_lost)
        for tier in tiers:
            dropped = tier.prune_stale(snapshot.source_ids())
            if dropped:
                log.info("%s: dropped %d copies made from another version of their source", tier.name, dropped)
    if reader is None:
        reader = PfsReader(snapshot, cfg.fuse.io_threads, cfg.fuse.whole_file_max, cfg.prefetch.threads)
    settings = PolicySettings(
        staging_limit=min(lookahead, budget.limit),
        staging_mode=cfg.prefetch.staging,
        stage_threads=max(1, cfg.prefetch.threads),
        stage_max=cfg.prefetch.max_in_flight,
        fill_threads=tuple(max(1, t.threads) for t in cfg.tiers),
        reactive_capacities=tuple(t["bytes"] for t in planning_config(ram)["tiers"]),
        loader_start=CursorSettings.for_job(cfg.job.batch_size, cfg.job.num_workers, cfg.job.prefetch_factor).window,
        log_steps=cfg.debug.policy_log,
        validate=cfg.debug.validate,
    )
    policy = ReadPolicy(snapshot.tree.size, budget, tiers, settings)
    staging = Staging(policy, kernel if kernel is not None else Pyfuse3Front(snapshot.tree.path), port.report)
    revalidator = Revalidator(
        snapshot,
        tiers,
        staging,
        counters,
        cfg.snapshot.revalidate_per_s,
        cfg.snapshot.revalidate_round_min_s,
        identity=cfg.snapshot.identity,
        hooks=hooks,
    )
    fetcher = Fetcher(reader, tiers, counters, staging, revalidator, port.pfs_read, port.peer_fetch)
    prefetcher = Prefetcher(snapshot, cfg, fetcher, staging, tiers, counters, policy, revalidator, hooks, peer_fetch)
    port.bind_executor(prefetcher)
    open_files = OpenFiles(fetcher, prefetcher, revalidator, counters, cfg.fuse.whole_file_max)
    return ReadPath(
        cfg, snapshot, counters, budget, tiers, reader, policy, staging, fetcher, prefetcher, open_files, revalidator
    )


def build_operations(
    readpath: ReadPath,
    seed: SeedState,
    status: StatusBoard,
    new_attrs: Callable[[], EntryAttributes] = PlainAttributes,
    new_file_info: NewFileInfo = PlainFileInfo,
) -> SeerOperations:
    """The FUSE handlers over ``readpath``, with the ``.control`` directory; ``new_attrs`` and
    ``new_file_info``: the front's records (:class:`fusefs.fuse.front.Front`)."""
    cfg = readpath.cfg
    owner = os.getuid() if cfg.control_owner is None else cfg.control_owner  # who may write the seed
    control = ControlFiles(
        seed, status, cfg.to_yaml(), owner, os.getgid(), time.time_ns(), cfg.fuse.entry_timeout, new_attrs
    )
    attrs = AttrFactory(readpath.snapshot, cfg.fuse.entry_timeout, cfg.fuse.attr_timeout, new_attrs)
    return SeerOperations(readpath.snapshot, control, readpath.open_files, attrs, new_file_info)


class Daemon:
    def __init__(self, req: MountRequest) -> None:
        self.req = req
        self.cfg = req.config
        self.mounted = False
        self.record: MountRecord | None = None
        self.assembled = False
        self.peering: PeerGroup | None = None  # _join_group, in a group
        self.board = StatusBoard(req.source, req.mountpoint, self._sections)
        # Read by the startup reporter thread while start() runs (Progress locks its own fields).
        self.startup = Progress("start", "steps")
        self.walk = Progress("walk", "entries")
        self.startup.start("starting")

    def startup_progress(self) -> dict[StartupTask, ProgressDoc]:
        """What the daemon is doing before its mount answers; the last running task is the one shown."""
        return {"start": self.startup.doc(), "walk": self.walk.doc()}

    # ------------------------------------------------------------------ startup

    def start(self) -> None:
        self.assemble()
        self.startup.set_phase("mounting")
        self.mount()
        self.startup.finish()

    def assemble(self) -> None:
        """Everything the mount serves with, built without mounting (group formation included)."""
        cfg = self.cfg
        t0 = time.monotonic()
        self.startup.set_phase("walking the source")
        self.snapshot, self.snapshot_reason = load_or_scan(
            self.req.source,
            cfg.cache_path,
            cfg.snapshot.walk_threads,
            cfg.snapshot.reuse,
            self.req.rescan,
            progress=self.walk,
        )
        log.log(
            logging.WARNING if "refused" in self.snapshot_reason else logging.INFO,
            "snapshot of %s: %s (%s, %.3fs)",
            self.req.source,
            self.snapshot.counts(),
            self.snapshot_reason,
            time.monotonic() - t0,
        )
        for path in self.snapshot.external_links:
            log.warning("symlink leaves the source tree, reads through it bypass seerfs: %s", path)
        # Before the group forms: a memory tier's bytes that cannot fit stop this node at once (exit 3).
        tree = self.snapshot.tree
        self.sizing, self.memory_cgroup = size_at_mount(cfg, file_sizes(tree.size, tree.kind))
        self.counters = ReadCounters()
        # The seed's followers, in the order they are told (the one place they are given): the
        # planner, the prefetcher, seed discovery, then the peer group.  Each is built after the seed
        # (discovery and the group take it in their constructors), so each is reached through the
        # daemon.
        self.seed = SeedState(
            listeners=(self._seed_to_planner, self._seed_written, self._seed_to_discovery, self._seed_to_peers)
        )
        self.reader = PfsReader(self.snapshot, cfg.fuse.io_threads, cfg.fuse.whole_file_max, cfg.prefetch.threads)
        self.startup.set_phase("forming the daemon group")
        self._form_group()
        self.startup.set_phase("opening the cache tiers")
        self._build_cache()
        self._join_group()
        self.ops = build_operations(
            self.readpath, self.seed, self.board, self.front.new_attrs, self.front.new_file_info
        )
        self.assembled = True  # the status board renders the components' sections from now on
        self.metrics = MetricsExporter(cfg.metrics, StatusDocument, self.board.document)
        self.metrics.bind()

    def _form_group(self) -> None:
        """Find the peers before mounting (MPI formation is blocking and must precede serving)."""
        cfg = self.cfg
        mode = detect_mode(cfg)
        host = bind_address(cfg.peers.bind)
        # Only what decides the plan (plan_inputs leaves out paths, threads, addresses): nodes whose
        # configs differ there still agree, nodes that would plan differently do not.
        decides = plan_inputs(planning_config(cfg), seed=0)
        inputs = xxhash.xxh3_128_hexdigest(
            json.dumps(decides, sort_keys=True).encode() + self.snapshot.content_digest().encode()
        )
        self.sock = None if mode == "none" else listen_socket(host, cfg.peers.port)
        port = self.sock.getsockname()[1] if self.sock is not None else 0
        self.rendezvous: Rendezvous | None = None
        self.group: Group
        if mode == "mpi":
            self.group = form_mpi(host, port, inputs)
        elif mode == "static":
            self.group = form_static(cfg, host, port, inputs)
        elif mode == "rendezvous":
            self.rendezvous = Rendezvous(cfg, host, port, inputs)
            self.group = self.rendezvous.group
        else:
            self.group = alone(host, port, inputs)
        log.info("group: %s, member %d of %d", self.group.mode, self.group.me, len(self.group.members))

    def _join_group(self) -> None:
        if self.peers is not None:
            self.peering = PeerGroup(
                self.group,
                self.cfg,
                self.peers,
                self.prefetcher,
                self.fetcher,
                self.staging,
                self.seed,
                self.counters,
                self.rendezvous,
            )
            self.prefetcher.presume_node(self.group.me)  # torchrun may number nodes otherwise: opens decide

    def _build_cache(self) -> None:
        """The read path and the planner for this mount."""
        cfg = self.cfg
        # The FUSE binding, which also makes staging's kernel calls; typed as the seam, so mypy holds
        # both fronts to it.
        self.front: Front[SeerOperations] = make_front(cfg.fuse.front, self.snapshot, cfg.fuse.no_open)
        snap_file = snapshot_file(cfg.cache_path, self.snapshot.source)
        if not snap_file.exists():  # persisting failed at mount: the planner still needs a copy
            snap_file = cfg.cache_path / "plans" / f"snapshot-{os.getpid()}.npz"
            try:
                self.snapshot.save(snap_file)
            except OSError as exc:  # e.g. cache_dir full: serve anyway; planning fails with this reason
                log.warning("cannot persist the snapshot for the planner: %s", exc.strerror or exc)
        mount_tag = xxhash.xxh64_hexdigest(self.req.mountpoint.encode())[:12]
        plans_dir = cfg.cache_path / "plans" / mount_tag
        self.plans = PlanManager(
            snap_file, self.snapshot.fingerprint, cfg, plans_dir, on_plan=self._plan_ready, node_hint=self._group_index
        )
        self.discovery = SeedDiscovery(snap_file, cfg, self.seed, on_order=self._order_to_planner)
        # In a group, the peers' clients come first: the fetcher asks peers through them (driven by
        # the executor, through the policy's port), and they report a member down into that port.
        port = PolicyPort()
        self.peers = None if self.sock is None else PeerClients(self.group, cfg, self.snapshot, port)
        rp = self.readpath = build_readpath(
            cfg,
            self.snapshot,
            counters=self.counters,
            kernel=self.front,
            reader=self.reader,
            peer_fetch=self.peers.fetch if self.peers is not None else None,
            port=port,
            fitted=fitted_config(cfg, self.sizing),
            hooks=self._hooks(),
        )
        self.budget, self.tiers, self.staging = rp.budget, rp.tiers, rp.staging
        self.memfit = MemoryFit(self.sizing, self.memory_cgroup, rp.budget, rp.policy, rp.tiers)
        self.fetcher, self.prefetcher, self.open_files = rp.fetcher, rp.prefetcher, rp.open_files
        self.revalidator = rp.revalidator

    def _hooks(self) -> ReadPathHooks:
        """The read path's observers: seed discovery, the seed's origin and, in a group, which
        copies this node rechecks and how often its replicas (the one place they are made)."""
        grouped = self.sock is not None  # a peer group forms (_join_group)
        return ReadPathHooks(
            on_open=self.discovery.on_open,
            on_view=self._cursor_view,
            on_view_change=self._view_changed if grouped else None,
            on_source_changed=self._source_changed,
            seed_trusted=lambda: self.seed.origin != "assumed",
            mine=self._mine if grouped else ReadPathHooks.mine,
            replicas_every=self._replicas_every if grouped else ReadPathHooks.replicas_every,
        )

    def _replicas_every(self) -> int:
        """The revalidator rechecks replicas every this many rounds: the group's size, as it grows."""
        return max(1, len(self.group.members), self.group.expect)

    def _group_index(self) -> int | None:
        """The training node to plan this daemon's part for: the one it presumes (_join_group), if any."""
        return self.group.me if self.peers is not None else None

    def _plan_ready(self, plan: Plan | None) -> None:
        """A plan made or reused (None: planning failed): the prefetcher follows it.  The planner is
        built before the read path (the seed it follows is), so this routes through the daemon."""
        self.prefetcher.on_plan(plan)

    def _seed_to_planner(self, seed: SeedState) -> None:
        """A seed adopted: plan for it."""
        self.plans.request(seed.value)

    def _order_to_planner(self, dataset: int, layout: str) -> None:
        """Seed discovery found the job reading ``dataset`` in catalog order ``layout``: plan it so."""
        self.plans.use_layout(dataset, layout)

    def _seed_to_discovery(self, seed: SeedState) -> None:
        """A seed adopted: seed discovery starts a new recording of opens for it."""
        self.discovery.seed_changed(seed)

    def _seed_to_peers(self, seed: SeedState) -> None:
        """A seed adopted: the peer group (in a group) tells the members now."""
        if self.peering is not None:
            self.peering.seed_changed(seed)

    def _seed_written(self, seed: SeedState) -> None:
        """A seed written (here or on a peer) may be the very value the plan assumed: trust it now."""
        if seed.origin != "assumed":
            self.prefetcher.seed_written(seed.value)

    def _cursor_view(self, view: CursorView) -> None:
        """Tell seed discovery the lead dataset's state under the plan the cursor follows."""
        plan = self.prefetcher.plan
        doc = view.status
        lead_state: DatasetState = view.state
        if doc is not None and 0 <= doc["lead"] < len(doc["datasets"]):
            lead_state = doc["datasets"][doc["lead"]]["state"]
        self.discovery.on_cursor(lead_state, plan.seed if plan is not None else None)

    def _view_changed(self) -> None:
        """The view changed: the peer group sends its note early.  The group is built after the read
        path (it drives the prefetcher), so this routes the hook through the daemon."""
        if self.peering is not None:
            self.peering.wake()

    def _source_changed(self, path: str, reason: str) -> None:
        """Mark the persisted snapshot so the next mount walks the source again (best effort)."""
        try:
            mark_stale(self.cfg.cache_path, self.snapshot.source, [f"{path}: {reason}"])
        except OSError as exc:
            log.warning("cannot mark the persisted snapshot outdated: %s", exc.strerror or exc)

    def _mine(self, entries: npt.NDArray[np.int64]) -> npt.NDArray[np.bool_]:
        """Which cached entries this node rechecks in background rounds (decided by
        :func:`placement.recheck.rechecked_here` from the plan, the node and the group)."""
        member_of = None if self.peers is None else self.peers.member_of
        prefetcher = self.prefetcher
        return rechecked_here(entries, prefetcher.entry_gid, prefetcher.plan, prefetcher.view.node, member_of)

    def mount(self) -> None:
        """Mount the assembled read path (the step that needs /dev/fuse)."""
        options = set(self.front.default_options)
        options |= {f"fsname={_escape_opt(self.req.source)}", "subtype=seerfs", "noatime"}
        if self.cfg.allow_other:
            options.add("allow_other")
        try:
            self.front.mount(self.ops, self.req.mountpoint, options)
        except RuntimeError as exc:
            text = str(exc)
            if "allow_other" in text or "user_allow_other" in text:
                raise FuseUnavailable(f"allow_other refused: {text}") from None
            raise MountpointError(f"mount {self.req.mountpoint} failed: {text}") from None
        self.mounted = True
        kernel = self.readpath.staging.kernel
        entry = mountinfo.find(self.req.mountpoint)  # the mount table only: never a request to this mount
        if isinstance(kernel, ThroughMount) and entry is not None:
            major, _, minor = entry.device.partition(":")
            kernel.mounted(os.makedev(int(major), int(minor)), os.fsencode(self.req.mountpoint))
        self.record = MountRecord(
            os.getpid(), self.req.mountpoint, self.req.source, str(self.req.log_file), time.time()
        )
        self.record.write()
        self.board.state = "serving"
        log.info("mounted %s on %s", self.req.source, self.req.mountpoint)

    async def _tune_read_ahead(self) -> None:
        """Raise the mount's read-ahead so the kernel sends 1 MiB reads instead of 128 KiB.

        Only after INIT: the kernel caps read-ahead at the max_readahead of the INIT reply, which
        libfuse sets from the kernel's own 128 KiB proposal, so a value written earlier is undone.
        """
        await self.ops.initialized.wait()
        await trio.sleep(0)  # the reply went out when the INIT handler returned; let that finish
        entry = mountinfo.find(self.req.mountpoint)
        if entry is None:
            return
        path = f"/sys/class/bdi/{entry.device}/read_ahead_kb"
        try:
            with open(path, "w") as fh:
                fh.write(str(self.cfg.fuse.read_ahead_kb))
        except OSError as exc:
            log.info("read_ahead_kb not set (%s): %s", path, exc.strerror)

    def _sections(self) -> StatusSections | None:
        """The status sections (seerfs-control(7)), None until assembled; rendered on the trio thread only."""
        if not self.assembled:
            return None
        prefetch = self.prefetcher.status()
        return {
            "snapshot": snapshot_status(self.snapshot, self.snapshot_reason),
            "seed": self.seed.status(),
            "discovery": self.discovery.status(),
            "plan": self.plans.status(),
            "cursor": self.discovery.explained(prefetch["cursor"]),
            "prefetch": prefetch,
            "memory_budget": self.budget.status(),
            "memory_cgroup": self.memfit.status(),
            "tiers": [t.status() for t in self.tiers],
            "reads": self.counters.status(),
            "revalidation": self.revalidator.status(),
            "group": self.peering.status() if self.peering is not None else self.group.status(),
            "progress": {"walk": self.walk.doc(), "plan": self.plans.progress.doc()},
            "metrics": self.metrics.status(),
            "requests": self.ops.requests.status(),
            "front": self.front.status(),
            "policy_log": self.readpath.policy.log_status(),
        }

    # ------------------------------------------------------------------ serving

    def serve(self) -> None:
        # The cursor and tier threads run numpy in Python-level steps; a 1 ms switch interval (not 5)
        # hands the GIL back to the FUSE loop quickly, which bounds open latency while they work.
        sys.setswitchinterval(GIL_SWITCH_INTERVAL)
        trio.run(self._main)

    async def _main(self) -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(self.readpath.run)
            nursery.start_soon(self._signals, nursery.cancel_scope)
            nursery.start_soon(self._tune_read_ahead)
            nursery.start_soon(self.plans.run)
            nursery.start_soon(self.discovery.run)
            nursery.start_soon(self._log_progress)
            nursery.start_soon(self.memfit.run)
            if self.peering is not None:
                nursery.start_soon(self.peering.run, self.sock)
            self.metrics.start()
            self.plans.request(self.seed.value)  # the sampler default until a seed is written
            await self.front.run(self.cfg.fuse.max_tasks)
            nursery.cancel_scope.cancel()
        for tier in self.tiers:
            await tier.close()
        if self.peering is not None:
            await self.peering.close()

    async def _log_progress(self) -> None:
        """A plan being built shows in the log (the output of ``mount --fg``) every 10 s."""
        while True:
            await trio.sleep(LOG_INTERVAL_S)
            doc = self.plans.progress.doc()
            if doc["state"] == "running":
                log.info("%s", doc["line"])

    async def _signals(self, scope: trio.CancelScope) -> None:
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
            async for signum in signals:
                log.info("signal %d: unmounting", signum)
                self.board.state = "stopping"
                self.front.terminate()
                return

    def close(self) -> None:
        metrics: MetricsExporter | None = getattr(self, "metrics", None)
        if metrics is not None:
            metrics.close()
        if self.mounted:
            try:
                self.front.unmount()
            except Exception as exc:  # already unmounted from outside: nothing left to do
                log.debug("close: %s", exc)
            self.mounted = False
        if self.record is not None:
            self.record.remove()
        log.info("stopped")
