"""Carrying out the plan: a staging window ahead of the readers, long-term tiers filled in order of use.

NoPFS rules as applied here:
1. Optimal prefetching: the staging window holds the next files of this node's predicted stream,
   fetched in stream order from the fastest source that has them.
2-4. Replacement: a staged file is dropped as soon as it was consumed (it is not needed again
   this epoch, while everything still staged is); long-term tiers hold the plan's files by access
   frequency and are filled in order of first use, only with bandwidth staging does not need.
When no plan can be trusted (no usable seed, or the cursor reports a mismatch) the reactive policy
(:mod:`placement.reactive`) decides what to keep, and nothing is prefetched.

Concurrency rules:
* The cursor is touched only by ``_cursor_loop``, one step at a time, so never by two threads at
  once.  Opens are queued; the loop places a batch on the trio thread while that is quick
  (:meth:`NodeCursor.observe_while_quick`), and hands the rest to a worker thread, which it awaits,
  when placing needs detection or an epoch's permutation (~0.1 s of numpy at ImageNet scale) or the
  window must be recomputed (O(horizon)).  Such work must never run on the trio thread; a thread
  hop for every batch, though, cost that thread more than placing (GIL handoffs: the FUSE ceiling
  of a mount in mismatch fell by a third).  The trio side reads only the immutable
  :class:`CursorView` the loop publishes.
* Everything else runs on the trio thread; fetches and tier I/O happen in the fetcher's tasks and
  the tiers' worker threads.
* ``self.generation`` is bumped whenever the plan changes; a task that captured an older
  generation stops acting on it after its next await (its decisions would follow the old plan).
* The staging window is recomputed from scratch on each wake-up (cursor moved, plan changed, a
  fetch finished), so no decision outlives the state it was based on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import numpy.typing as npt
import trio

from fusefs.config import Config
from fusefs.meta.snapshot import Snapshot
from fusefs.readpath.counters import ReadCounters
from fusefs.readpath.fetcher import Fetcher, NotFromPeer
from fusefs.readpath.staging import Staging
from fusefs.tiers import Tier
from placement.cursor import CursorSettings, NodeCursor
from placement.plan import Plan
from placement.reactive import StaticFrequencySet

log = logging.getLogger(__name__)

VIEW_INTERVAL = 0.01  # seconds between window recomputations in the cursor thread, at most 100/s
REFILL_INTERVAL = 0.005  # seconds between staging refills on the trio thread, at most 200/s


@dataclass(frozen=True)
class CursorView:
    """What the worker thread last knew about the cursor (the trio side reads only this)."""

    state: str = "detecting"
    node: int | None = None
    epoch: int = 0
    window: frozenset[int] = frozenset()  # entries due within the predicted horizon
    stage: tuple[int, ...] = ()  # what to stage next, in order (not in RAM already, fits the limit)
    status: dict[str, Any] = field(default_factory=dict)
    predicted: int = 0  # opens of this batch the plan predicted
    fresh: bool = True  # False: the window was carried over from the last view (nobody moved a batch)
    upcoming: tuple[int, ...] = ()  # the horizon's entries in predicted read order (for upcoming_hook)


class Prefetcher:
    def __init__(
        self,
        snapshot: Snapshot,
        cfg: Config,
        fetcher: Fetcher,
        staging: Staging,
        tiers: Sequence[Tier],
        counters: ReadCounters,
        tier_capacities: list[int],
    ) -> None:
        self.snapshot = snapshot
        self.cfg = cfg
        self.fetcher = fetcher
        self.staging = staging
        self.tiers = list(tiers)
        self.counters = counters
        self.plan: Plan | None = None
        self.cursor: NodeCursor | None = None
        self.generation = 0
        self.entry_gid: npt.NDArray[np.int32] = np.full(0, -1, np.int32)
        self.tier_of_gid: npt.NDArray[np.int8] | None = None  # this node's assignment, per gid
        self.reactive_capacities = list(tier_capacities)
        self.reactive = StaticFrequencySet(tier_capacities)
        self.view = CursorView()
        self.presumed_node: int | None = None  # the node to predict for before opens confirm it (group index)
        self.seed_trusted: Callable[[], bool] = lambda: True  # False while the seed is only assumed
        self.upcoming_hook: Callable[[tuple[int, ...]], None] | None = None  # told each fresh horizon, in order
        self._opens: list[int] = []  # gids opened, not yet given to the cursor
        self._unplaced: dict[int, int] = {}  # entry -> opens the published view does not reflect yet
        self._opened_since_view: set[int] = set()  # opened since the window was last recomputed
        self._swept_for: frozenset[int] | None = None  # the horizon the last retirement sweep used
        self._stage_of: tuple[int, ...] | None = None  # the stage list _refill is walking ...
        self._stage_pos = 0  # ... and how far it got
        self._opens_ready = trio.Event()
        self._cursor_lock = trio.CapacityLimiter(1)
        self.predicted_opens = 0
        self.unplanned_opens = 0
        self.staging_fetches = 0
        self.fill_fetches = 0
        self.filled_node: int | None = None
        self._wake = trio.Event()
        self._staging_now: set[int] = set()  # entries a staging task is working on
        self._staging_idle = trio.Event()
        self._staging_idle.set()
        self._slots = trio.Semaphore(max(1, cfg.prefetch.threads))
        self._fill_slots = [trio.Semaphore(max(1, t.threads)) for t in cfg.tiers]
        self._fill_later: list[int] = []  # replicas whose owner could not serve them yet
        job = cfg.job
        self.settings = CursorSettings.for_job(job.batch_size, job.num_workers, job.prefetch_factor)
        staging.protect = lambda: self.view.window if self.mode == "predicting" else frozenset()
        self.window_files = max(self.settings.window, 64)
        # The predicted horizon must cover the staging window's bytes (files of the mean size, with
        # margin), or a large window never fills; and at least the cursor's own window several times.
        files = max(1, int((snapshot.tree.kind == 1).sum()))
        mean = max(1, int(snapshot.tree.size.sum()) // files)
        self.horizon_files = max(self.window_files * 4, int(1.5 * staging.limit / mean))
        # The view (horizon set, stage list: O(horizon) Python work) is recomputed when a rank moved
        # this far.  A sixteenth of the horizon keeps the staging window at least 15/16 full; per
        # batch it cost the daemon a third of a core in later epochs, taken from the readers.
        self.cursor_step = max(1, job.batch_size, self.horizon_files // 16)
        self._view_where: tuple[Any, ...] = ()
        self.memory_tiers = [t for t in self.tiers if t.kind == "memory"]

    # ------------------------------------------------------------------ plan changes

    def on_plan(self, plan: Plan | None) -> None:
        """A new plan (or a failed one): restart prediction from detection."""
        self.generation += 1
        self.plan = plan
        self.cursor = None
        self.view = CursorView()
        self._view_where = ()
        self._opens = []
        self._unplaced = {}
        self._opened_since_view = set()
        self.tier_of_gid = None
        self.filled_node = None
        if plan is None:
            self._adopt_into_reactive()
        else:
            self.cursor = NodeCursor(plan.job_streams(), self.settings)
            self.entry_gid = np.full(len(self.snapshot), -1, np.int32)
            gids = np.arange(plan.files, dtype=np.int64)
            entries = plan.entry_of(gids).astype(np.int64)
            self.entry_gid[entries[::-1]] = gids[::-1].astype(np.int32)  # the first id of a shared entry wins
            # Predict before any open only for a seed the job wrote: with the assumed default, wait
            # for the first opens to confirm it rather than stage a window that may all be wasted.
            if self.seed_trusted():
                if plan.nodes == 1:
                    self.cursor.presume(0, 0)
                elif self.presumed_node is not None and self.presumed_node < plan.nodes:
                    self.cursor.presume(self.presumed_node, 0)
        self._opens_ready.set()  # let the worker publish the new cursor's first window
        self._wake.set()

    @property
    def mode(self) -> str:
        if self.plan is None or self.cursor is None or self.view.state == "mismatch":
            return "reactive"
        if self.view.state == "detecting":
            return "detecting"
        return "predicting"

    # ------------------------------------------------------------------ reader events

    def opened(self, entry: int) -> None:
        """An open of a dataset file: queue it for the cursor (placed in a worker thread)."""
        gid = int(self.entry_gid[entry]) if entry < self.entry_gid.shape[0] else -1
        if self.cursor is None or gid < 0:
            self.unplanned_opens += 1
            return
        self._opens.append(gid)
        self._unplaced[entry] = self._unplaced.get(entry, 0) + 1
        self._opened_since_view.add(entry)
        self._opens_ready.set()

    async def _cursor_loop(self) -> None:
        while True:
            await self._opens_ready.wait()
            self._opens_ready = trio.Event()
            cursor, generation, batch = self.cursor, self.generation, self._opens
            self._opens = []
            if cursor is None:
                continue
            # Quick placements run here; detection, new epoch maps and window recomputations in a
            # worker thread (see the module's concurrency rules).
            observed, predicted = cursor.observe_while_quick(batch)
            view = self._carried_view(cursor, predicted) if observed == len(batch) else None
            if view is None:
                view = await trio.to_thread.run_sync(
                    self._advance, cursor, batch[observed:], predicted, limiter=self._cursor_lock
                )
            if generation != self.generation:
                continue  # a new plan replaced this cursor meanwhile
            for entry in self.plan.entry_of(np.asarray(batch, dtype=np.int64)).tolist() if self.plan else ():
                left = self._unplaced.get(entry, 0) - 1
                if left > 0:
                    self._unplaced[entry] = left
                else:
                    self._unplaced.pop(entry, None)
            if view.state != self.view.state:
                log.info(
                    "cursor: %s -> %s (node %s, epoch %s)%s",
                    self.view.state,
                    view.state,
                    view.node,
                    view.epoch,
                    f": {view.status['mismatch_reason']}" if view.status.get("mismatch_reason") else "",
                )
            self.predicted_opens += view.predicted
            previous, self.view = self.view, view
            if view.fresh and view.upcoming and self.upcoming_hook is not None:
                self.upcoming_hook(view.upcoming)
            if view.fresh:  # a recomputed window knows every open it was given; later ones it does not
                self._opened_since_view = set(self._unplaced)
            if view.node is not None and (view.node != previous.node or self.tier_of_gid is None) and self.plan:
                self.tier_of_gid = self.plan.tier_of(view.node)
            if view.state == "mismatch" and previous.state != "mismatch":
                self._adopt_into_reactive()
                self.fetcher.spawn(self.staging.clear)  # the window of a wrong plan is meaningless
            self._wake.set()
            # Let opens gather: placing is cheap, recomputing the window per open is not.
            await trio.sleep(VIEW_INTERVAL)

    def _advance(self, cursor: NodeCursor, gids: list[int], predicted: int) -> CursorView:
        """Worker thread: place the opens left, then precompute what the trio side will ask for."""
        for gid in gids:
            if cursor.observe(gid):
                predicted += 1
            elif log.isEnabledFor(logging.DEBUG):
                log.debug(
                    "unpredicted open: gid %d (%s, epoch %d, positions %s)",
                    gid,
                    cursor.state,
                    cursor.epoch,
                    {r: (t.epoch, t.low, t.high) for r, t in cursor.tracks.items()},
                )
        return self._carried_view(cursor, predicted) or self._fresh_view(cursor, predicted)

    def _where(self, cursor: NodeCursor) -> tuple[Any, ...]:
        return (
            cursor.state,
            cursor.epoch,
            tuple((t.epoch, t.low // self.cursor_step) for t in cursor.tracks.values()),
        )

    def _carried_view(self, cursor: NodeCursor, predicted: int) -> CursorView | None:
        """The last view with new counts, when nobody moved a step since it was computed; else None."""
        previous = self.view
        if self._where(cursor) == self._view_where and previous.state == cursor.state:
            return replace(previous, status=cursor.status(), predicted=predicted, fresh=False)
        return None

    def _fresh_view(self, cursor: NodeCursor, predicted: int) -> CursorView:
        """Worker thread: the horizon and stage list from the cursor's position (O(horizon) work)."""
        self._view_where = self._where(cursor)
        horizon: frozenset[int] = frozenset()
        stage: tuple[int, ...] = ()
        ahead: tuple[int, ...] = ()
        plan = self.plan
        if plan is not None and cursor.state in ("tracking", "presumed"):
            upcoming = cursor.upcoming(self.horizon_files)
            if upcoming:
                gids_ahead = np.fromiter((g for _e, g in upcoming), dtype=np.int64, count=len(upcoming))
                entries = plan.entry_of(gids_ahead).tolist()
                horizon = frozenset(entries)
                ahead = tuple(entries)
                stage = self._stage_list(entries)
                last_epoch = upcoming[-1][0]
                if last_epoch + 1 < cursor.job.epochs:
                    cursor.job.epoch_map(last_epoch + 1)  # warm the next epoch while we are here
        return CursorView(
            cursor.state, cursor.node, cursor.epoch, horizon, stage, cursor.status(), predicted, upcoming=ahead
        )

    def consumed(self, entry: int) -> None:
        self.staging.retire(entry)
        self._wake.set()

    def _adopt_into_reactive(self) -> None:
        """Files kept under a plan that turned out wrong now count against the reactive policy.

        Otherwise they would sit in the tiers outside its accounting, and the tiers would hold more
        than the capacities both modes are meant to share.
        """
        for t, tier in enumerate(self.tiers):
            for entry in tier.entries():
                if entry not in self.reactive.where:
                    size = tier.size_of(entry)
                    if size is not None:
                        self.reactive.admitted(entry, t, size)
        for t, cap in enumerate(self.reactive_capacities):
            excess = self.reactive.tiers[t].used - cap
            for entry in list(self.reactive.tiers[t].members):
                if excess <= 0:
                    break
                excess -= self.reactive.tiers[t].members[entry]
                self.tiers[t].drop(entry)
                self.reactive.dropped(entry)

    def keep_decision(self, entry: int, size: int) -> Tier | None:
        """Where a file fetched on demand should also be kept (plan's tier, or the reactive policy)."""
        if self.mode == "predicting":
            tier = self._planned_tier(entry)
            return tier if tier is not None and not tier.contains(entry) else None
        decision = self.reactive.on_read(entry, size)
        for t, victim in decision.evict:
            self.tiers[t].drop(victim)
            self.reactive.dropped(victim)
        if decision.tier is None:
            return None
        self.reactive.admitted(entry, decision.tier, size)
        return self.tiers[decision.tier]

    def planned_tier_for(self, entry: int) -> Tier | None:
        """The tier the plan gives ``entry`` on this node (once the node is known), else None."""
        return self._planned_tier(entry)

    def _planned_tier(self, entry: int) -> Tier | None:
        if self.tier_of_gid is None or entry >= self.entry_gid.shape[0]:
            return None
        gid = int(self.entry_gid[entry])
        t = int(self.tier_of_gid[gid]) if gid >= 0 else -1
        return self.tiers[t] if 0 <= t < len(self.tiers) else None

    # ------------------------------------------------------------------ background work

    async def run(self) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._cursor_loop)
            nursery.start_soon(self._staging_loop)
            nursery.start_soon(self._fill_loop)

    async def _staging_loop(self) -> None:
        while True:
            self._wake = trio.Event()
            if self.mode == "predicting":
                await self._refill(self.generation)
            with trio.move_on_after(0.5):
                await self._wake.wait()
            await trio.sleep(REFILL_INTERVAL)  # coalesce wake-ups: one refill per burst of events

    def _stage_list(self, entries: list[int]) -> tuple[int, ...]:
        """Worker thread: entries to stage next, in stream order, as many as fit the staging limit.

        Files in a memory tier are left out: an open serves them from RAM already, and staging
        them would spend the window's small budget on what needs no fetching.  (Tier membership
        is read from this thread; a stale answer only costs one needless or missed stage.)
        """
        held: list[Callable[[int], bool]] = [t.contains for t in self.memory_tiers]
        held.append(self.staging.kept.__contains__)  # pages still cached from an earlier read
        # One comprehension per check (later epochs hold nearly everything: this keeps the scan cheap).
        todo = list(dict.fromkeys(entries))
        for contains in held:
            todo = [e for e in todo if not contains(e)]
        if not todo:
            return ()
        sizes = np.cumsum(self.snapshot.tree.size[np.asarray(todo, dtype=np.int64)])
        return tuple(todo[: int(np.searchsorted(sizes, self.staging.limit, side="right"))])

    async def _refill(self, generation: int) -> None:
        """Stage the window's next files, resuming where the last refill stopped.

        Refills run up to 1/REFILL_INTERVAL times a second on the trio thread, so nothing here
        rescans the whole window: the retirement sweep runs once per new horizon, and the walk over
        the stage list keeps its position until the cursor thread publishes a new list.  An entry
        passed once (staged, in progress, or opened by a reader) is never revisited for that list.
        """
        view = self.view
        # A staged file is dropped when consumed (release), or here once it left the whole predicted
        # horizon (the plan changed, or the readers skipped it): never merely because the byte-limited
        # window shifted, which would throw away a file needed before the ones replacing it (rule 3).
        # A file an open already took is retired at its release, never here: its reader may still
        # be reading the pushed pages.
        if view.window is not self._swept_for:
            self._swept_for = view.window
            horizon = view.window
            for entry in [e for e, f in self.staging.files.items() if f.staged and not f.taken and e not in horizon]:
                self.staging.retire(entry)
        if view.stage is not self._stage_of:
            self._stage_of, self._stage_pos = view.stage, 0
        stage = view.stage
        while self._stage_pos < len(stage):
            entry = stage[self._stage_pos]
            # Opened already (since the window was computed): never stage it again.
            if entry in self._opened_since_view or self.staging.has(entry) or entry in self._staging_now:
                self._stage_pos += 1
                continue
            await self._slots.acquire()
            if generation != self.generation or self._wake.is_set() or self.view.stage is not stage:
                self._slots.release()  # the cursor moved or the plan changed: look at the new window
                return
            if not self.staging.reserve(entry, int(self.snapshot.tree.size[entry])):
                self._slots.release()
                return  # no room: wait for consumption to free some (never evict what is due sooner)
            self._stage_pos += 1
            self._staging_now.add(entry)
            self._staging_idle = trio.Event()
            self.fetcher.spawn(self._stage_one, entry, generation)

    async def _stage_one(self, entry: int, generation: int) -> None:
        try:
            fetched = await self.fetcher.from_tiers(entry)
            if fetched is not None:
                data = fetched.data
            else:
                data = await self.fetcher.start(entry, keep_in=self._planned_tier(entry), why="staging").wait()
                self.staging_fetches += 1
            await self.staging.fill(entry, data)
        except Exception as exc:  # the reader's own open reports the error; staging just skips it
            self.staging.cancel(entry)
            log.debug("staging entry %d failed: %s", entry, exc)
        finally:
            self._staging_now.discard(entry)
            if not self._staging_now:
                self._staging_idle.set()
            self._slots.release()
            self._wake.set()

    async def _fill_loop(self) -> None:
        """Fill long-term tiers with this node's assigned files in order of first use.

        Files this node owns come from the PFS (it is their one PFS reader); replicas of files other
        nodes own come only from their owner, and wait for a later pass while it cannot serve them.
        """
        while True:
            plan, view, generation = self.plan, self.view, self.generation
            if plan is None or view.node is None or view.state not in ("tracking", "presumed"):
                await trio.sleep(0.2)
                continue
            node = view.node
            objs, _due = plan.fill_order(node)
            todo = objs.tolist()
            self.filled_node = node
            while todo and generation == self.generation:
                self._fill_later = []
                await self._fill_pass(plan, node, todo, generation)
                todo = self._fill_later
                if todo:
                    await trio.sleep(1.0)  # owners not ready for these replicas yet
            while generation == self.generation:
                await trio.sleep(0.5)

    async def _fill_pass(self, plan: Plan, node: int, objs: list[int], generation: int) -> None:
        tier_row = plan.assignment.tier_of[node]
        owners = plan.assignment.owner
        entries = plan.objects.obj_entry
        for obj in objs:
            if generation != self.generation:
                return
            entry = int(entries[obj])
            t = int(tier_row[obj])
            if not 0 <= t < len(self.tiers) or self.tiers[t].contains(entry):
                continue
            # Staging first: tier filling only uses bandwidth the readers do not need now.
            await self._staging_idle.wait()
            await self._fill_slots[t].acquire()
            self.fetcher.spawn(self._fill_one, obj, entry, t, int(owners[obj]) == node)

    async def _fill_one(self, obj: int, entry: int, t: int, owned: bool) -> None:
        try:
            if not self.tiers[t].contains(entry):
                await self.fetcher.start(entry, keep_in=self.tiers[t], why="fill", pfs=owned).wait()
                self.fill_fetches += 1
        except NotFromPeer:
            self._fill_later.append(obj)
        except Exception as exc:
            log.debug("filling entry %d into tier %d failed: %s", entry, t, exc)
        finally:
            self._fill_slots[t].release()

    def status(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "cursor": self.view.status or None,
            "predicted_opens": self.predicted_opens,
            "unplanned_opens": self.unplanned_opens,
            "staging_fetches": self.staging_fetches,
            "fill_fetches": self.fill_fetches,
            "fetches_inflight": len(self.fetcher.inflight),
            "window_files": self.window_files,
            "horizon_files": self.horizon_files,
            "staging": self.staging.status(),
        }
