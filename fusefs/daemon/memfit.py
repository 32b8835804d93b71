"""Fitting the daemon's RAM to its memory cgroup: the budget sized at mount, lowered and raised while mounted.

The RAM budget (:class:`fusefs.tiers.Budget`: the memory tiers' bytes, which the staging window,
the pages the mount keeps in the page cache and the memory tiers' copies charge) is what the
daemon controls.  Under Slurm the daemon shares the job's cgroup with the training processes, and a
budget larger than what the limit leaves got the daemon OOM-killed: readers then see ENOTCONN.
Pages pushed with ``notify_store`` are charged to the daemon's cgroup like its own memory; the
budget counts them, so fitting the budget fits them too.

**At mount** (:func:`size_at_mount`), after the snapshot is loaded and before any worker runs: the
room is the binding cgroup's bound (:mod:`fusefs.daemon.cgroup`) less what is unreclaimable there
now (the daemon as it is, the calling ``seerfs mount``, other processes of the job) and the
:class:`Reserve`: the daemon's own growth as it serves, file bytes of reads in flight, the peak of
a plan worker and of a seed-search worker (they run beside it, in the same cgroup), and a margin.
A memory tier written without ``bytes`` gets what fits of its default; one written with ``bytes``
that does not fit is a configuration error (exit 3) with one line.  When the budget is sized down
the log says so in one WARNING line, and status ``memory_cgroup`` shows it.

What counts as use is the unreclaimable part (:mod:`fusefs.daemon.cgroup`): page cache fills every
cgroup to its limit and the kernel reclaims it before it kills anyone.  The budget still counts the
pages the mount pushed and kept, though the kernel could reclaim them: the fit never relies on that.

The plan keeps the configured bytes: nodes must plan the same (the plan digest covers the tiers'
bytes), and each node's cgroup leaves a different room.  A sized node's memory tier holds what fits
of the files the plan gives it; a fill of one more finds no room (the tier refuses it after its
read), and its opens read it as a file the plan placed nowhere here.

**While mounted** (:meth:`MemoryFit.run`, every :data:`PERIOD` seconds) the same room is computed
from a fresh reading, with the workers' reserve less what they hold now (they are measured in the
reading already) and without the daemon's growth (likewise).  Below the budget: it is lowered at
once, first by dropping kept pages (the policy's own reclaim: pages outside the predicted horizon,
oldest first, then the furthest due), then memory-tier copies (outside the horizon first), then
by refusing new charges until released ones bring it down.  An ``oom`` or ``oom_kill`` event
lowers it by a quarter at least; ``high`` and ``max`` events do so by an eighth only while the
unreclaimable use is within two margins of the bound (they also count the page cache recycled at
the limit, which is harmless).  Above the budget, after :data:`CALM_ROUNDS` rounds without
pressure, it grows by :data:`GROW_STEP` at most per round, never past the configured bytes.

Concurrency: the cgroup files are read in a worker thread, which returns a reading and touches
nothing.  Every decision and every drop runs on the trio thread in one synchronous step, between
other tasks' awaits, so never inside a policy step (those never await): kept pages go through
``Budget.reclaim`` (the prefetcher carries out the policy's drops at once), copies through
``MemoryTier.drop`` (whose ``on_drop`` tells the policy), and ``Budget.resize`` takes the budget's
lock, so a charge released from a worker thread meanwhile cannot make ``used`` exceed the limit.

How the reserve was measured (``ru_maxrss`` of each worker run alone on synthetic trees of 1,000 to
200,000 files, one byte each, under ``DistributedSampler`` jobs of 1 to 300 epochs and 1 or 8
ranks; and the daemon's RSS over a mount serving 1,000 files of 500 KiB twice): see the constants.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Literal, TypedDict

import numpy as np
import numpy.typing as npt
import trio

from fusefs.config import ByteSize, Config, given
from fusefs.daemon import cgroup as cg
from fusefs.errors import ConfigError
from fusefs.planning.worker import TORCH_WORTH_IT
from fusefs.readpath.policy import ReadPolicy
from fusefs.tiers import Budget, MemoryTier, Tier
from placement.statusfields import counter, gauge, info, state, text
from placement.tree import KIND_FILE

log = logging.getLogger(__name__)

MiB = 1 << 20

WORKER_BASE = 40 * MiB
"""A plan or seed-search worker with little to do: Python, numpy and seerfs imported (37.4 MiB for a
1,000-file tree, both workers)."""
PLAN_PER_FILE = 600
"""Plan worker bytes per dataset file above :data:`WORKER_BASE`: 139 MiB at 200,000 files (100 epochs,
8 ranks), 101-126 MiB at 1-10 epochs; epochs barely count (300 epochs of one rank: 114 MiB)."""
SEARCH_PER_FILE = 400
"""Seed-search worker bytes per file above :data:`WORKER_BASE`: 93-105 MiB at 200,000 files, 58 MiB at 20,000."""
TORCH_IMPORT = 192 * MiB
"""From ``TORCH_WORTH_IT`` files the plan worker imports torch, whose import alone took 218 MiB (181 above
a worker's base)."""
DAEMON_GROWTH = 24 * MiB
"""What the daemon's own memory outside the budget grows by after the snapshot is loaded: requests,
tasks, the plan's per-file maps, buffers (its anonymous memory outside the budget went from 34 to 39
MiB serving 1,000 files of 500 KiB twice to one reader; more readers keep more requests in flight)."""
DAEMON_PER_FILE = 64
"""... and per dataset file (the policy's and the cursor's per-entry arrays, the plan's columns)."""
MARGIN_MIN = 16 * MiB
"""The least room left unused below the bound; larger bounds keep a 32nd of it."""
PERIOD = 2.0
"""Seconds between readings while mounted: a burst of reads fills little in that time, and a
reading costs a thread hop and a dozen small files."""
CALM_ROUNDS = 3
"""Rounds without pressure before the budget may grow again."""
GROW_STEP = 16 * MiB
"""The most the budget grows by in one round (shrinking is at once)."""
STEADY = 4 * MiB
"""Changes of the room smaller than this (a worker's heap, a few requests) leave the budget alone,
unless an event says the cgroup is short: the margin covers them."""

Hierarchy = Literal["v1", "v2", "none"]


def _mib(n: int) -> str:
    return f"{n / MiB:.0f}MiB"


@dataclass(frozen=True)
class Reserve:
    """Bytes kept out of the budget, by what for."""

    daemon: int  # the daemon's growth from now on
    inflight: int  # file bytes of uncharged PFS reads in flight at once (fuse.io_threads of them)
    plan_worker: int
    search_worker: int
    margin: int

    @property
    def workers(self) -> int:
        return self.plan_worker + self.search_worker

    @property
    def total(self) -> int:
        return self.daemon + self.inflight + self.workers + self.margin

    def text(self) -> str:
        parts = [f"{_mib(self.daemon)} to grow", f"{_mib(self.inflight)} of reads in flight"]
        workers = f"its plan worker ({_mib(self.plan_worker)})"
        if self.search_worker:
            workers += f" and seed-search worker ({_mib(self.search_worker)})"
        return (
            f"{_mib(self.total)} kept for the daemon ({', '.join(parts)}), {workers} and a {_mib(self.margin)} margin"
        )


def reserve_for(cfg: Config, sizes: npt.NDArray[np.int64], bound: int | None) -> Reserve:
    """The reserve for a mount of files of ``sizes`` under a cgroup bound of ``bound`` bytes.

    Reads in flight: at most ``fuse.io_threads`` whole files at once, each at most
    ``fuse.whole_file_max`` (larger files are read in ranges); the 90th percentile of the sizes so
    capped stands for them.  The staging window's reads (up to ``prefetch.max_in_flight``, under their
    own thread limit: ``PfsReader``) are not in it: each stage reserved its file's bytes in the budget
    before its read started (a stage the policy cancels gives them back while its read may still run:
    only for files that left the horizon, a few at a time).  The workers: their measured peak for this
    many files (see the constants).
    """
    files = int(sizes.shape[0])
    capped = np.minimum(sizes, cfg.fuse.whole_file_max)
    typical = int(np.percentile(capped, 90)) if files else 0
    plan = WORKER_BASE + PLAN_PER_FILE * files + (TORCH_IMPORT if files >= TORCH_WORTH_IT else 0)
    search = WORKER_BASE + SEARCH_PER_FILE * files if cfg.seed_discovery.enabled else 0
    margin = max(MARGIN_MIN, (bound or 0) // 32)
    return Reserve(DAEMON_GROWTH + DAEMON_PER_FILE * files, cfg.fuse.io_threads * typical, plan, search, margin)


@dataclass(frozen=True)
class Sizing:
    """What the mount's RAM budget was set to, and why."""

    hierarchy: Hierarchy
    path: str | None  # the daemon's memory cgroup
    limited_by: str | None  # the level whose bound binds (None: no limit)
    bound: int | None
    in_use: int  # unreclaimable there at mount
    reserve: Reserve | None
    configured: int  # the RAM budget the config asks for
    budget: int
    tier_bytes: tuple[int | None, ...]  # per tier: a memory tier's sized bytes, None for others
    message: str
    events: dict[str, dict[str, int]] = dataclasses.field(default_factory=dict)  # at mount, by level

    @property
    def sized(self) -> bool:
        return self.budget < self.configured


def configured_budget(cfg: Config) -> int:
    """The RAM budget as configured: the memory tiers' bytes, or the staging window without one."""
    memory = [t.bytes for t in cfg.tiers if t.kind == "memory"]
    return sum(memory) if memory else cfg.prefetch.lookahead_bytes


def plan_sizing(cfg: Config, cgroup: cg.MemoryCgroup | None, reading: cg.Reading | None, reserve: Reserve) -> Sizing:
    """The budget for ``cfg`` under ``reading`` (pure).  Raises ConfigError when a memory tier's
    ``bytes`` was given and the tiers given so do not fit."""
    configured = configured_budget(cfg)
    memory = [(i, t) for i, t in enumerate(cfg.tiers) if t.kind == "memory"]
    as_configured: tuple[int | None, ...] = tuple(t.bytes if t.kind == "memory" else None for t in cfg.tiers)
    hierarchy: Hierarchy = cgroup.version if cgroup is not None else "none"
    path = cgroup.path if cgroup is not None else None
    level = reading.binding if reading is not None else None
    if level is None or level.bound is None:
        why = "no memory cgroup found" if cgroup is None else f"memory cgroup {path} ({hierarchy}) has no limit"
        return Sizing(hierarchy, path, None, None, 0, None, configured, configured, as_configured, why)
    bound, in_use, events = level.bound, level.unreclaimable, reading.events() if reading is not None else {}
    room = max(0, bound - in_use - reserve.total)
    where = f"memory cgroup {level.path} ({hierarchy})" + ("" if level.path == path else f", an ancestor of {path}")
    facts = f"{where}: limit {_mib(bound)}, {_mib(in_use)} in use at mount; {reserve.text()}"
    explicit = [(i, t) for i, t in memory if given(t, "bytes")]
    promised = sum(t.bytes for _, t in explicit)
    if promised > room:
        first = explicit[0][0]
        raise ConfigError(
            f"tiers.{first}.bytes: {_mib(promised)} of memory tiers do not fit the {facts}, leaving "
            f"{_mib(room)}; give less, or leave bytes out to have the tier sized"
        )
    if configured <= room:
        why = f"{facts}: the RAM budget of {_mib(configured)} fits"
        return Sizing(
            hierarchy, path, level.path, bound, in_use, reserve, configured, configured, as_configured, why, events
        )
    sized: list[int | None] = list(as_configured)
    if not memory:
        budget = room
        asked = f"prefetch.lookahead_bytes is {_mib(configured)} (no memory tier)"
    else:
        defaults = [(i, t) for i, t in memory if not given(t, "bytes")]
        left, wanted = room - promised, sum(t.bytes for _, t in defaults)
        for i, t in defaults:
            sized[i] = t.bytes * left // wanted if wanted else 0
        budget = sum(b for b in sized if b is not None)
        asked = ", ".join(
            f"tiers.{i}.bytes {'is' if given(t, 'bytes') else 'defaults to'} {_mib(t.bytes)}" for i, t in memory
        )
    why = f"{facts}: RAM budget sized to {_mib(budget)} ({asked})"
    return Sizing(hierarchy, path, level.path, bound, in_use, reserve, configured, budget, tuple(sized), why, events)


def file_sizes(sizes: npt.NDArray[np.int64], kind: npt.NDArray[np.uint8]) -> npt.NDArray[np.int64]:
    """The sizes of the snapshot's regular files (the tree's ``size`` and ``kind`` columns)."""
    out: npt.NDArray[np.int64] = sizes[kind == KIND_FILE].astype(np.int64)
    return out


def size_at_mount(cfg: Config, sizes: npt.NDArray[np.int64]) -> tuple[Sizing, cg.MemoryCgroup | None]:
    """Read the daemon's memory cgroup and size the budget for files of ``sizes``; logs the outcome
    (WARNING when sized down).  Raises ConfigError (exit 3) for ``bytes`` given that cannot fit."""
    group = cg.find()
    reading = cg.read(group) if group is not None else None
    level = reading.binding if reading is not None else None
    reserve = reserve_for(cfg, sizes, level.bound if level is not None else None)
    sizing = plan_sizing(cfg, group, reading, reserve)
    if sizing.sized:
        log.warning("%s", sizing.message)
    else:
        log.info("%s", sizing.message)
    return sizing, group


def fitted_config(cfg: Config, sizing: Sizing) -> Config:
    """``cfg`` with the memory tiers' bytes (or, without one, the staging window) as sized: what the
    read path builds its budget and the reactive policy's capacities from."""
    if not sizing.sized:
        return cfg
    if not any(t.kind == "memory" for t in cfg.tiers):
        return dataclasses.replace(
            cfg, prefetch=dataclasses.replace(cfg.prefetch, lookahead_bytes=ByteSize(sizing.budget))
        )
    tiers = [
        dataclasses.replace(t, bytes=ByteSize(b)) if b is not None and t.kind == "memory" else t
        for t, b in zip(cfg.tiers, sizing.tier_bytes, strict=True)
    ]
    return dataclasses.replace(cfg, tiers=tiers)


class MemoryCgroupStatus(TypedDict):
    """Status section ``memory_cgroup``: the daemon's memory cgroup and the RAM budget fitted to it."""

    hierarchy: Annotated[
        Hierarchy, state("v1 or v2: the cgroup hierarchy holding the memory controller; none: no memory cgroup found")
    ]
    path: Annotated[str | None, info("the daemon's memory cgroup")]
    limited_by: Annotated[
        str | None, info("the cgroup (the daemon's or an ancestor) whose limit leaves the least room; null: no limit")
    ]
    limit_bytes: Annotated[int | None, gauge("its limit (v2: the least of memory.max and memory.high)")]
    unreclaimable_bytes: Annotated[
        int | None, gauge("its usage less the page cache the kernel can reclaim, at the last reading")
    ]
    peak_unreclaimable_bytes: Annotated[int | None, gauge("the most unreclaimable_bytes read since the mount")]
    configured_bytes: Annotated[
        int, gauge("the RAM budget the config asks for: the memory tiers' bytes (prefetch.lookahead_bytes without one)")
    ]
    mount_bytes: Annotated[int, gauge("the RAM budget set at mount (memory_budget.limit is the one now)")]
    reserved_bytes: Annotated[
        int,
        gauge(
            "kept out of the budget at mount for the daemon's own growth, reads in flight, the plan and seed-search "
            "workers and a margin"
        ),
    ]
    sized: Annotated[bool, gauge("the budget at mount is below the configured one, to fit the cgroup")]
    reason: Annotated[str, text("what was sized and why (the WARNING line of the log), or why nothing was")]
    shrinks: Annotated[int, counter("times the budget was lowered while mounted")]
    grows: Annotated[int, counter("times it was raised again")]
    freed_bytes: Annotated[int, counter("bytes of kept pages and memory-tier copies given back to lower it")]
    high_events: Annotated[int, counter("memory.events high rises since the mount, over the limited cgroups (v2)")]
    max_events: Annotated[int, counter("memory.events max (v1: memory.failcnt) rises since the mount")]
    oom_events: Annotated[int, counter("memory.events oom (v1: memory.oom_control oom_kill and under_oom) rises")]
    oom_kills: Annotated[int, counter("memory.events oom_kill (v1: memory.oom_control oom_kill) rises")]


class MemoryFit:
    """The budget kept within the cgroup while mounted (see the module docstring for the rules)."""

    def __init__(
        self,
        sizing: Sizing,
        group: cg.MemoryCgroup | None,
        budget: Budget,
        policy: ReadPolicy,
        tiers: Sequence[Tier],
    ) -> None:
        self.sizing = sizing
        self.group = group
        self.budget = budget
        self.policy = policy
        self.memory_tiers = [t for t in tiers if isinstance(t, MemoryTier)]
        self.ceiling = sizing.configured
        reserve = sizing.reserve
        self.inflight = reserve.inflight if reserve is not None else 0
        self.workers = reserve.workers if reserve is not None else 0
        self.limited_by = sizing.limited_by
        self.bound = sizing.bound
        self.unreclaimable: int | None = sizing.in_use if sizing.bound is not None else None
        self.peak = self.unreclaimable
        self.calm = 0
        self.shrinks = 0
        self.grows = 0
        self.freed = 0
        self.events = dict.fromkeys(cg.EVENTS, 0)
        self._last: dict[str, dict[str, int]] = dict(sizing.events)  # rises count from the mount

    async def run(self) -> None:
        """Read every :data:`PERIOD` seconds (in a worker thread) and act on the trio thread; only where
        a limit was found at mount (a timer wakeup costs the trio thread more than most checks)."""
        if self.group is None or self.sizing.bound is None:
            return
        group = self.group
        while True:
            await trio.sleep(PERIOD)
            reading, children = await trio.to_thread.run_sync(lambda: (cg.read(group), cg.children_rss()))
            self.step(reading, children)

    def _tier_bytes(self) -> int:
        return sum(t.status()["tier_bytes"] for t in self.memory_tiers)

    def step(self, reading: cg.Reading, children: int) -> None:
        """One round: the room now and the events since the last round, then lower or raise the budget
        (trio thread; ``children``: bytes the daemon's workers hold now)."""
        level = reading.binding
        rises = self._rises(reading)
        limit = self.budget.limit
        pressed = False
        if level is None or level.bound is None:
            self.limited_by, self.bound, self.unreclaimable = None, None, None
            target = self.ceiling
        else:
            self.limited_by, self.bound, self.unreclaimable = level.path, level.bound, level.unreclaimable
            self.peak = max(self.peak or 0, level.unreclaimable)
            margin = max(MARGIN_MIN, level.bound // 32)
            others = max(0, level.unreclaimable - self._tier_bytes())  # all but the memory tiers' copies
            target = level.bound - margin - self.inflight - max(0, self.workers - children) - others
            if rises["oom"] or rises["oom_kill"]:
                log.warning(
                    "memory cgroup %s: %d OOM event(s), %d kill(s) since the last reading; RAM budget lowered",
                    level.path,
                    rises["oom"],
                    rises["oom_kill"],
                )
                target, pressed = min(target, limit * 3 // 4), True
            elif (rises["high"] or rises["max"]) and level.bound - level.unreclaimable < 2 * margin:
                target, pressed = min(target, limit * 7 // 8), True
        target = max(0, min(target, self.ceiling))
        if pressed or target <= limit - STEADY:
            self.calm = 0
            if target < limit:
                self.shrink(target)
            return
        if target >= limit + STEADY or (limit < target == self.ceiling):
            self.calm += 1
            if self.calm >= CALM_ROUNDS:
                after = self.budget.resize(min(target, limit + GROW_STEP))
                if after > limit:
                    self.grows += 1
                    log.debug("RAM budget raised from %s to %s", _mib(limit), _mib(after))
        else:
            self.calm += 1

    def _rises(self, reading: cg.Reading) -> dict[str, int]:
        """How much each event counter rose since the last reading, summed over the limited levels."""
        rises = dict.fromkeys(cg.EVENTS, 0)
        now = reading.events()
        for path, counts in now.items():
            before = self._last.get(path)
            if before is None:
                continue  # a level seen for the first time: its past is not ours
            for k in cg.EVENTS:
                rises[k] += max(0, counts.get(k, 0) - before.get(k, 0))
        self._last = now
        for k, n in rises.items():
            self.events[k] += n
        return rises

    def shrink(self, target: int) -> None:
        """Lower the budget to ``target``: kept pages first, then memory-tier copies, then whatever is
        still charged is refused room until it is released (trio thread; see the module docstring)."""
        budget, policy = self.budget, self.policy
        before = budget.limit
        need = budget.used - target
        freed = 0
        if need > 0 and policy.kept_bytes and budget.reclaim is not None:
            got = budget.reclaim(min(need, policy.kept_bytes))
            budget.reclaimed += got
            freed += got
        if need - freed > 0:
            freed += self._drop_copies(need - freed)
        after = budget.resize(target)
        self.freed += freed
        if after < before:
            self.shrinks += 1
            log.info(
                "memory cgroup %s: RAM budget lowered from %s to %s (%s given back; the cgroup's unreclaimable "
                "use is %s of %s)",
                self.limited_by,
                _mib(before),
                _mib(after),
                _mib(freed),
                _mib(self.unreclaimable or 0),
                _mib(self.bound or 0),
            )

    def _drop_copies(self, need: int) -> int:
        """Drop memory-tier copies worth ``need`` bytes: those outside the predicted horizon first (in
        the order they were made), then the horizon's, furthest due first."""
        policy = self.policy
        horizon = policy.view.due if policy.mode == "predicting" else {}
        outside: list[tuple[MemoryTier, int]] = []
        inside: list[tuple[int, MemoryTier, int]] = []
        for tier in self.memory_tiers:
            for entry in tier.entries():
                if entry in horizon:
                    inside.append((horizon[entry], tier, entry))
                else:
                    outside.append((tier, entry))
        inside.sort(key=lambda x: -x[0])
        freed = 0
        for tier, entry in [*outside, *((t, e) for _, t, e in inside)]:
            if freed >= need:
                break
            size = tier.size_of(entry)
            if size is None:
                continue
            freed += tier.footprint(size)
            tier.drop(entry)
        return freed

    def status(self) -> MemoryCgroupStatus:
        s = self.sizing
        return {
            "hierarchy": s.hierarchy,
            "path": s.path,
            "limited_by": self.limited_by,
            "limit_bytes": self.bound,
            "unreclaimable_bytes": self.unreclaimable,
            "peak_unreclaimable_bytes": self.peak,
            "configured_bytes": s.configured,
            "mount_bytes": s.budget,
            "reserved_bytes": s.reserve.total if s.reserve is not None else 0,
            "sized": s.sized,
            "reason": s.message,
            "shrinks": self.shrinks,
            "grows": self.grows,
            "freed_bytes": self.freed,
            "high_events": self.events["high"],
            "max_events": self.events["max"],
            "oom_events": self.events["oom"],
            "oom_kills": self.events["oom_kill"],
        }
