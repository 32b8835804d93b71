"""The ``.control/status`` document: its type, section by section, and the board that renders it.

Every section is a TypedDict defined next to the ``status()`` that fills it, each field annotated
with its doc and kind (:mod:`placement.statusfields`).  :class:`StatusDocument` names the sections;
seerfs-control(7) and the Prometheus metrics are generated from it, and a test checks that a real
mount's document has exactly these fields.  Components add fields and sections, never rename.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from typing import Annotated, Literal, TypedDict

from fusefs import __version__
from fusefs.cluster.formation import GroupStatus
from fusefs.cluster.peergroup import PeeredGroupStatus
from fusefs.daemon.memfit import MemoryCgroupStatus
from fusefs.daemon.metrics import MetricsStatus
from fusefs.fuse.front import FrontStatus
from fusefs.fuse.inflight import RequestsStatus
from fusefs.meta.snapshot import Snapshot, SnapshotCounts
from fusefs.planning.discovery import DiscoveryStatus
from fusefs.planning.manager import PlanStatus
from fusefs.planning.seed import SeedStatus
from fusefs.progress import ProgressDoc
from fusefs.readpath.counters import ReadsStatus
from fusefs.readpath.policy import PolicyLogStatus
from fusefs.readpath.prefetch import PrefetchStatus
from fusefs.readpath.revalidate import RevalidationStatus
from fusefs.tiers.base import DirectoryTierStatus, MemoryTierStatus
from fusefs.tiers.budget import BudgetStatus
from placement.cursor import CursorStatus
from placement.statusfields import gauge, info, state, text

DaemonState = Literal["starting", "serving", "stopping"]

_LISTED = 100
"""Lists of paths in status stop at this many (their ``_total`` field counts them all)."""


class SnapshotStatus(SnapshotCounts):
    """Status section ``snapshot``: the metadata snapshot of the source, taken at mount."""

    reused: Annotated[bool, gauge("the persisted snapshot was reused because the source's fingerprint did not change")]
    reason: Annotated[str, text("why it was reused or walked (or why a persisted one was refused)")]
    build_seconds: Annotated[float, gauge("time to walk, or to load and verify")]
    fingerprint: Annotated[str, info("hex digest of every directory's identity and times")]
    memory_bytes: Annotated[int, gauge("the snapshot's memory, excluding names")]
    bytes_per_entry: Annotated[float, gauge("memory_bytes / entries", unit="bytes", metric="memory_per_entry")]
    external_symlinks: Annotated[
        list[str],
        text("up to 100 relative paths of symlinks whose target leaves the source tree (reads bypass seerfs)"),
    ]
    external_symlinks_total: Annotated[int, gauge("how many such symlinks there are", metric="external_symlinks")]
    unlisted_dirs: Annotated[list[str], text("up to 100 directories that could not be read at mount")]


def snapshot_status(snapshot: Snapshot, reason: str) -> SnapshotStatus:
    s = snapshot
    return {
        **s.counts(),
        "reused": s.reused,
        "reason": reason,
        "build_seconds": round(s.build_seconds, 4),
        "fingerprint": s.fingerprint,
        "memory_bytes": s.memory_bytes(),
        "bytes_per_entry": round(s.bytes_per_entry(), 2),
        "external_symlinks": s.external_links[:_LISTED],
        "external_symlinks_total": len(s.external_links),
        "unlisted_dirs": s.errors[:_LISTED],
    }


ProgressTask = Literal["walk", "plan"]


class DaemonStatus(TypedDict):
    """The daemon itself (the fields every status document starts with)."""

    version: Annotated[str, info("seerfs's version")]
    state: Annotated[DaemonState, state("starting, serving or stopping")]
    pid: Annotated[int, text("the daemon's process id")]
    source: Annotated[str, info("the source directory")]
    mountpoint: Annotated[str, info("the mountpoint")]
    started_at: Annotated[float, gauge("when the daemon started (timestamp)", unit="seconds", metric="start_time")]
    uptime_s: Annotated[float, gauge("seconds since it started", metric="uptime")]


class StatusSections(TypedDict):
    """The sections after the daemon's own fields, in this order."""

    snapshot: Annotated[SnapshotStatus, text("the metadata snapshot")]
    seed: Annotated[SeedStatus, text("the sampler seed (written to .control/seed)")]
    discovery: Annotated[
        DiscoveryStatus, text("the search for the sampler's seed from the first opens (SEED DISCOVERY)")
    ]
    plan: Annotated[PlanStatus, text("the placement plan for the current seed")]
    cursor: Annotated[
        CursorStatus | None,
        text(
            "where this node's ranks are in the predicted streams; null with no plan, and for the moment "
            "between a new plan and its first cursor window.  Every dataset is followed on its own; the "
            "lead dataset (the largest that follows no other: the training set) gives the job's epoch"
        ),
    ]
    prefetch: Annotated[PrefetchStatus, text("the prefetch policy and the staging window")]
    memory_budget: Annotated[BudgetStatus, text("the RAM budget")]
    memory_cgroup: Annotated[MemoryCgroupStatus, text("the daemon's memory cgroup and the RAM budget fitted to it")]
    tiers: Annotated[
        list[MemoryTierStatus | DirectoryTierStatus],
        text("one object per configured tier, fastest first", label="tier", key="name", metric="tier"),
    ]
    reads: Annotated[ReadsStatus, text("reads served, by source")]
    revalidation: Annotated[RevalidationStatus, text("rechecks of cached copies against their source")]
    group: Annotated[GroupStatus | PeeredGroupStatus, text("the daemon group")]
    progress: Annotated[
        dict[ProgressTask, ProgressDoc],
        text(
            "long work, one object per task: walk (the walk of the source at mount, in entries) and plan "
            "(the plan for the current seed, in files)",
            label="task",
        ),
    ]
    metrics: Annotated[MetricsStatus, text("the Prometheus endpoint (the metrics key of seerfs.yaml(5))")]
    requests: Annotated[
        RequestsStatus, text("readers' requests the daemon is serving now (seerfs umount names their processes)")
    ]
    front: Annotated[FrontStatus, text("the FUSE binding serving the mount (the fuse.front key of seerfs.yaml(5))")]
    policy_log: Annotated[
        PolicyLogStatus,
        text(
            "the read policy's last steps, each event and the instructions it decided (kept with the "
            "debug.policy_log key of seerfs.yaml(5); empty otherwise).  Why a file was staged, kept, dropped "
            "or read from the PFS again is told by the steps naming its entry (its inode number minus 1): "
            "jq '.policy_log.log[] | select(.entries | contains([ENTRY]))'"
        ),
    ]


class StatusDocument(DaemonStatus, StatusSections):
    """``MOUNTPOINT/.control/status``: what the daemon shows of itself (seerfs-control(7))."""


StartupTask = Literal["start", "walk"]


class StartingStatus(DaemonStatus):
    """What seerfs status --json shows while the daemon still starts, from its start record (no
    .control exists yet): the daemon's fields above, and"""

    log_file: Annotated[str, text("the daemon's log")]
    progress: Annotated[
        dict[StartupTask, ProgressDoc],
        text("start (the step of startup under way) and walk (the walk of the source)", label="task"),
    ]


class StatusBoard:
    """Renders the document on the trio thread (``.control/status`` reads and metrics snapshots)."""

    def __init__(
        self, source: str, mountpoint: str, sections: Callable[[], StatusSections | None] | None = None
    ) -> None:
        """``sections``: the components' sections, None until the daemon is assembled (and without
        one: a read path run with no daemon around it)."""
        self.source = source
        self.mountpoint = mountpoint
        self.started = time.time()
        self.state: DaemonState = "starting"
        self._sections = sections

    def daemon(self) -> DaemonStatus:
        return {
            "version": __version__,
            "state": self.state,
            "pid": os.getpid(),
            "source": self.source,
            "mountpoint": self.mountpoint,
            "started_at": round(self.started, 3),
            "uptime_s": round(time.time() - self.started, 3),
        }

    def sections(self) -> StatusSections | None:
        return None if self._sections is None else self._sections()

    def document(self) -> StatusDocument:
        sections = self.sections()
        if sections is None:
            raise RuntimeError("the status board has no sections yet (the daemon is not assembled)")
        return {**self.daemon(), **sections}

    def __call__(self) -> Mapping[str, object]:
        """The whole document; only the daemon's fields while a read path runs without a daemon around it."""
        sections = self.sections()
        return {**self.daemon(), **sections} if sections is not None else self.daemon()
