"""Carrying out the read policy: the cursor, staging fetches and pushes, tier fills, drops.

Every decision (what to stage, keep, retire, reclaim, fill, where to keep a fetched copy) is made
by :class:`fusefs.readpath.policy.ReadPolicy`; this executor feeds it events (opens, releases,
the cursor's views, the outcome of each fetch, push and fill) and carries out the instructions it
returns, without looking at the plan, the horizon or the budget itself.

Concurrency rules:
* The cursor is touched only by ``_cursor_loop``, one step at a time, so never by two threads at
  once.  Opens are queued; the loop places a batch on the trio thread while that is quick
  (:meth:`NodeCursor.observe_while_quick`), and hands the rest to a worker thread, which it awaits,
  when placing needs detection or an epoch's permutation (~0.1 s of numpy at ImageNet scale) or the
  view must be recomputed (O(horizon)).  Such work must never run on the trio thread; a thread
  hop for every batch, though, cost that thread more than placing (GIL handoffs: the FUSE ceiling
  of a mount in mismatch fell by a third).  The view the loop publishes is immutable.
* A new plan's cursor is built from the old one (counters, recent opens) only while no worker
  thread observes on the old one: a plan that comes during such a turn waits for its end
  (:meth:`Prefetcher._follow_plan`), so the turn's batch carries over; opens queued for the old
  cursor are the new one's first.  No open is lost to a plan change: a lost open is a hole that
  holds its rank's track back, and the staging window with it.
* The policy is touched only on the trio thread, except :meth:`ReadPolicy.stage_list`, which the
  cursor's worker thread calls (it reads tier membership and kept pages only).  Each event is
  handled and its instructions carried out in one synchronous step, with no await in between, so
  no instruction acts on state older than the event that decided it.
* Instructions that wait for I/O start tasks in the fetcher's nursery (stages, pushes, fills,
  pauses); each reports its outcome as an event when it ends.  A stage the policy cancelled
  reports nothing: the policy has already given its room back.
* The staging window's stage limit is the policy's (it grows while readers catch the window:
  ``ReadPolicy._caught``); its ``StageSlots`` instruction resizes the window's PFS thread limit
  (:meth:`PfsReader.stage_slots`) in the step that decided it, on the trio thread, so the threads
  for stages never lag the stages the policy lets start.
* A view carries the generation of the plan its cursor follows; the policy ignores views of a plan
  that was replaced while the worker thread computed them.
* A release is handled at once (the policy retires the file: its books never lag the readers), but
  the pump for the room it freed waits for the cursor loop's next turn, which :meth:`consumed` asks
  for: one pump per turn, not per open.  Nothing that must happen by a reader's next request waits
  on it; a stage starts 10-30 ms later.
* Whatever follows the view (the lane, the peer group's note) is woken by :meth:`_view_changed`, on
  the trio thread, right after the plan or view changed; none of them polls.
* Everything the policy learns comes through :meth:`_handle`, one step at a time: the executor's own
  events and those other components report through the policy's port (fusefs/readpath/port.py:
  :meth:`report`, staging's changed sources and the peers' clients' members down or up;
  :meth:`pfs_read`, the fetcher's PFS reads).  THE one
  exception, re-entrant, is the budget's reclaim (:meth:`reclaim`): a reservation (the policy's own,
  inside a step, or a memory tier's put) needs the bytes freed at once.  Inside a policy step the
  drops it decides come back with that step's instructions; otherwise they are carried out at once.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from typing import Annotated, Any, Protocol, TypedDict, assert_never

import numpy as np
import numpy.typing as npt
import trio

from fusefs.config import Config
from fusefs.meta.snapshot import Snapshot
from fusefs.readpath.contract import (
    Answer,
    Bypass,
    CancelStage,
    CopyLost,
    CursorView,
    DropCopy,
    DropPages,
    Event,
    FetchForPeer,
    Fill,
    FillDone,
    FillOutcome,
    FillRetry,
    FollowPlan,
    GroupChanged,
    Instruction,
    KeepIn,
    Missed,
    NextEpoch,
    NextFetched,
    NextPushed,
    NodePresumed,
    Opened,
    PeerAsked,
    Place,
    PlanChanged,
    Presume,
    Push,
    Pushed,
    PushNext,
    ReadFromPfs,
    ReadThrough,
    Released,
    RetryFillLater,
    SeedInDoubt,
    SeedTrusted,
    Stage,
    StageFetched,
    StageNext,
    StageSlots,
    Tick,
    UseHeld,
    UsePages,
    ViewPublished,
)
from fusefs.readpath.counters import ReadCounters
from fusefs.readpath.fetcher import Fetcher, NotFromPeer, Sources
from fusefs.readpath.hooks import ReadPathHooks
from fusefs.readpath.policy import VISIT, Holder, Mode, ReaderAnswer, ReadPolicy, entries_due
from fusefs.readpath.staging import Staging, StagingStatus
from fusefs.tiers import Tier
from placement.cursor import CursorSettings, CursorStatus, NodeCursor
from placement.nextepoch import next_epoch_reads, reads_first
from placement.plan import Plan
from placement.statusfields import counter, gauge, state, text

log = logging.getLogger(__name__)

VIEW_INTERVAL = 0.01  # seconds between the cursor loop's turns while it settles: at most 100/s
STEADY_INTERVAL = 0.03
"""Seconds between turns after one that found every open predicted on a carried view while tracking,
or a mismatch that stayed one.  Each turn costs the trio thread a few hundred microseconds whatever
it carries (the cursor's status, the view's publication, the pump): at 100 turns a second that was
3% of a core on every node, and in a mismatch (readers in an order no plan predicts, e.g. no seed
written) about 1 us per warm open.  A break in the pattern shows as an unpredicted open at the next
turn, from which turns are ``VIEW_INTERVAL`` apart again, and a relock out of a mismatch at the
next turn: either is seen at most 20 ms later than before."""
TICK_INTERVAL = 0.5  # seconds between retries of what waits for room freed outside the policy
LANE_INTERVAL = 5.0
"""Seconds between the lane loop's looks when nothing woke it.  A view that changed plan, state, node
or epoch wakes it at once (:meth:`Prefetcher._view_changed`), so this is a safety net, not a poll:
every timer wakeup of a daemon costs its trio thread about 0.5 ms on the benchmark's VM."""

__all__ = ["CursorView", "Prefetcher"]

_STAGED = (UsePages, UseHeld)


class PrefetchStatus(TypedDict):
    """Status section ``prefetch``: what the policy decided and the fetches that carried it out."""

    mode: Annotated[
        Mode,
        state(
            "predicting; detecting: a plan, waiting for opens to place this node; reactive: without a "
            "usable plan, files are kept by a static frequency set and nothing is prefetched"
        ),
    ]
    cursor: Annotated[CursorStatus | None, text("the same object as the cursor section", export=False)]
    predicted_opens: Annotated[int, counter("opens the cursor predicted")]
    unplanned_opens: Annotated[int, counter("opens of files no plan places (no plan yet, or outside its datasets)")]
    staging_fetches: Annotated[int, counter("fetches for the staging window")]
    fill_fetches: Annotated[int, counter("fetches that filled long-term tiers")]
    next_fetches: Annotated[int, counter("fetches that staged the next epoch's files (peers and local tiers)")]
    fetches_inflight: Annotated[int, gauge("fetches running now")]
    recent_fetches: Annotated[
        int, counter("fetches served by the bytes this node read for a peer within the last second")
    ]
    window_files: Annotated[int, gauge("opens ahead that count as predicted")]
    horizon_files: Annotated[int, gauge("files ahead the prefetcher plans for")]
    staging: Annotated[StagingStatus, text("the staging window", metric="staging")]


class HorizonListener(Protocol):
    """What the prefetcher tells the revalidator: the entries the readers open next, in order."""

    def upcoming(self, entries: tuple[int, ...]) -> None: ...


class GroupFetch(Protocol):
    """The peer group's fetch (:meth:`fusefs.cluster.peerclients.PeerClients.fetch`), which this
    executor drives: a :class:`~fusefs.readpath.fetcher.PeerFetch` that is also handed ``owners``,
    this executor, whose plan, view and policy say who owns ``entry`` and who may hold it now."""

    def __call__(self, entry: int, *, owner: bool, holders: bool, owners: Prefetcher) -> Awaitable[bytes | None]: ...


class Prefetcher:
    def __init__(
        self,
        snapshot: Snapshot,
        cfg: Config,
        fetcher: Fetcher,
        staging: Staging,
        tiers: Sequence[Tier],
        counters: ReadCounters,
        policy: ReadPolicy,
        horizon: HorizonListener,
        hooks: ReadPathHooks,
        peers: GroupFetch | None = None,
    ) -> None:
        """``horizon``: told each fresh horizon, in order (the revalidator checks those copies
        ahead); ``hooks``: the optional observers; ``peers``: the peer group's fetch, asked when
        the fetcher asks peers (:meth:`peer_fetch`), None alone.  The budget, staging, the fetcher
        and the peers' clients report back through the policy's port, to which ``build_readpath``
        binds this executor (:meth:`report`, :meth:`reclaim`, :meth:`pfs_read`; ARCHITECTURE.md,
        "Wiring")."""
        self.snapshot = snapshot
        self.cfg = cfg
        self.fetcher = fetcher
        self.staging = staging
        self.tiers = list(tiers)
        self.counters = counters
        self.policy = policy
        self.cursor: NodeCursor | None = None
        self._cursor_plan: Plan | None = None  # the plan followed last (its cursor may wait for _build_cursor)
        self._cursor_generation = 0
        self._built_for: Plan | None = None  # the plan self.cursor was built for
        self._follow: FollowPlan | None = None  # a plan followed while a worker observed: its cursor is due
        self._observing = False  # a worker thread observes on self.cursor (the cursor loop awaits it)
        self.horizon = horizon
        self.hooks = hooks
        self.peers = peers
        self._opens: list[int] = []  # gids opened, not yet given to the cursor
        self._opens_ready = trio.Event()
        self._cursor_lock = trio.CapacityLimiter(1)
        self._stage_scopes: dict[int, trio.CancelScope] = {}
        self.staging_fetches = 0
        self.fill_fetches = 0
        self.next_fetches = 0
        self._lanes_for: set[tuple[int, int, int]] = set()  # (generation, node, epoch) of the NextEpochs made
        self._view_seen: tuple[Any, ...] | None = None  # (generation, state, node, epoch) of the view last told
        self._lane_wake = trio.Event()
        job = cfg.job
        self.settings = CursorSettings.for_job(job.batch_size, job.num_workers, job.prefetch_factor)
        self.window_files = max(self.settings.window, 64)
        # The predicted horizon must cover the staging window's bytes (files of the mean size, with
        # margin), or a large window never fills; and at least the cursor's own window several times.
        files = max(1, int((snapshot.tree.kind == 1).sum()))
        mean = max(1, int(snapshot.tree.size.sum()) // files)
        self.horizon_files = max(self.window_files * 4, int(1.5 * policy.staging_limit / mean))
        # The view (horizon, stage list: O(horizon) Python work) is recomputed when a rank moved
        # this far.  A sixteenth of the horizon keeps the staging window at least 15/16 full; per
        # batch it cost the daemon a third of a core in later epochs, taken from the readers.
        self.cursor_step = max(1, job.batch_size, self.horizon_files // 16)
        self._view_key: tuple[Any, ...] = ()  # the cursor's progress_key when the view was last computed
        self._prepare = False  # a new cursor waits for its prepare() in the worker thread
        self._presume_node: int | None = None  # a Presume for the cursor loop to carry out
        self._retired: NodeCursor | None = None  # the cursor of the last plan, while no plan is followed
        self._retired_plan: Plan | None = None  # its plan

    # ------------------------------------------------------------------ what others read

    @property
    def plan(self) -> Plan | None:
        return self.policy.plan

    @property
    def view(self) -> CursorView:
        return self.policy.view

    @property
    def entry_gid(self) -> np.ndarray[Any, np.dtype[np.int32]]:
        return self.policy.entry_gid

    @property
    def mode(self) -> str:
        return self.policy.mode

    def planned_tier_for(self, entry: int) -> Tier | None:
        """The tier the plan gives ``entry`` on this node (once the node is known), else None."""
        t = self.policy.planned_tier(entry)
        return None if t is None else self.tiers[t]

    # ------------------------------------------------------------------ events in, instructions out

    def _handle(self, event: Event) -> Answer | None:
        """One policy step: the event, then every instruction it decided (the answer is returned)."""
        answer: Answer | None = None
        for ins in self.policy.handle(event):
            answer = self._execute(ins) or answer
        return answer

    def _execute(self, ins: Instruction) -> Answer | None:
        """Carry out one instruction, or return it when it answers the event that decided it.  The
        ``match`` is closed: an instruction class added to :data:`Instruction` without its case
        fails the type check (``assert_never``), where it used to pass silently as an answer."""
        match ins:
            case UsePages() | UseHeld() | Bypass() | KeepIn() | FetchForPeer():
                return ins
            case Place():
                self._place(ins)
            case Stage():
                self._stage(ins)
            case CancelStage():
                self._cancel_stage(ins)
            case Push():
                self._push(ins)
            case DropPages():
                self._drop_pages(ins)
            case Fill():
                self._fill(ins)
            case DropCopy():
                self._drop_copy(ins)
            case RetryFillLater():
                self._retry_fill_later(ins)
            case StageNext():
                self._stage_next(ins)
            case PushNext():
                self._push_next(ins)
            case FollowPlan():
                self._follow_plan(ins)
            case Presume():
                self._presume(ins)
            case SeedInDoubt():
                self._seed_in_doubt(ins)
            case StageSlots():
                self._stage_slots(ins)
            case _:
                assert_never(ins)
        return None

    def report(self, event: Event) -> None:
        """An event from a component that carries out the policy's work (staging: a source seen
        changed), handled as one step like the executor's own; it answers nothing."""
        self._handle(event)

    async def peer_fetch(self, entry: int, *, owner: bool, holders: bool) -> bytes | None:
        """The fetcher asks peers for ``entry`` (through the policy's port): the peer group's fetch,
        handed this executor to read who owns it now; None (read it here) without peers."""
        if self.peers is None:
            return None
        return await self.peers(entry, owner=owner, holders=holders, owners=self)

    def pfs_read(self, entry: int) -> None:
        """The fetcher read ``entry`` from the PFS (through the policy's port), handled as one step."""
        self._handle(ReadFromPfs(entry))  # (no answer, no instruction)

    def _carry_out(self, instructions: list[Instruction]) -> None:
        for ins in instructions:
            answer = self._execute(ins)
            assert answer is None, answer  # outside a step nothing asks a question

    def reclaim(self, need: int) -> int:
        """Budget callback, THE re-entrant path into the policy (see :meth:`ReadPolicy.reclaim`): inside a
        policy step the drops come back with its instructions; outside one they are carried out here."""
        freed = self.policy.reclaim(need)
        if not self.policy.busy:
            self._carry_out(self.policy.drain())
        return freed

    def presume_node(self, node: int | None) -> None:
        """This daemon's index in its group: the training node to presume for a trusted plan."""
        self._handle(NodePresumed(node))

    def on_plan(self, plan: Plan | None) -> None:
        """A new plan (or a failed one): restart prediction from detection."""
        self._handle(PlanChanged(plan, self.hooks.seed_trusted()))
        self._view_changed()

    def _view_changed(self) -> None:
        """Wake what follows the view (the next-epoch lane, the peer group's note) when what they read
        of it changed: its plan, state, node or epoch.  Checked after every plan and view, so that
        nobody polls for it: a poll is a timer wakeup, which costs more than the check."""
        view = self.policy.view
        key = (self.policy.generation, view.state, view.node, view.epoch)
        if key != self._view_seen:
            self._view_seen = key
            self._lane_wake.set()  # a new epoch: its next-epoch lane at once
            if self.hooks.on_view_change is not None:
                self.hooks.on_view_change()

    def seed_written(self, value: int) -> None:
        """The job wrote ``value``: when the plan followed was made for it as the assumed default,
        it is trusted now (a plan for another value comes through :meth:`on_plan`)."""
        self._handle(SeedTrusted(value))

    def opened(self, entry: int) -> UsePages | UseHeld | None:
        """An open of a dataset file: pages or bytes staged for it, if any."""
        if self.hooks.on_open is not None:
            self.hooks.on_open(entry)
        answer = self._handle(Opened(entry))
        return answer if isinstance(answer, _STAGED) else None

    def book(self, ops: list[int]) -> list[ReaderAnswer]:
        """A run of readers' opens (``entry``), releases (``~entry``) and visits (``entry | VISIT``:
        an open and its release, :data:`~fusefs.readpath.policy.VISIT`), in order: for each, what
        :meth:`opened` answers, or for a release, after :meth:`consumed`, whether the policy keeps
        its pages (``in_page_cache``, as :meth:`Staging.pages_kept` asks); a visit's both.  Where the policy logs
        and validates nothing, the steps run as one call (:meth:`ReadPolicy.readers`): the open
        hook sees the run's opens first, in order, the Place decisions join the cursor's batch in
        order, the cursor loop is woken once, and what else the steps decided is carried out after
        them, in order.  Reordering is exact: nothing here awaits, so the cursor loop and every
        task a Stage or CancelStage touches run only after the whole run anyway; neither Place nor
        CancelStage calls back into the policy; and the hook only observes (seed discovery records
        the opens), never reading or calling the read path."""
        policy = self.policy
        out: list[ReaderAnswer] = []
        if not policy.lean():
            for op in ops:
                if op >= VISIT:
                    answer = self.opened(op - VISIT)
                    self.consumed(op - VISIT)
                    out.append((answer, policy.in_page_cache(op - VISIT)))
                elif op >= 0:
                    out.append(self.opened(op))
                else:
                    self.consumed(~op)
                    out.append(policy.in_page_cache(~op))
            return out
        on_open = self.hooks.on_open
        if on_open is not None:
            for op in ops:
                if op >= 0:
                    on_open(op - VISIT if op >= VISIT else op)
        places: list[int] = []
        policy.readers(ops, places, out)
        for ins in policy.drain():
            self._execute(ins)
        if places:
            self._opens.extend(places)
            self._opens_ready.set()
        elif self.cursor is not None and ops and (min(ops) < 0 or max(ops) >= VISIT):  # a release wakes the cursor loop
            self._opens_ready.set()
        return out

    def read_through(self, entry: int, nbytes: int) -> bool:
        """A reader is about to pull ``entry`` through the mount; False: open it with direct_io."""
        return self._handle(ReadThrough(entry, nbytes)) is None

    def keep_decision(self, entry: int, size: int) -> Tier | None:
        """Where a file fetched on demand should also be kept (plan's tier, or the reactive policy)."""
        answer = self._handle(Missed(entry, size))
        return self.tiers[answer.tier] if isinstance(answer, KeepIn) else None

    def consumed(self, entry: int) -> None:
        """A reader closed ``entry``; the cursor loop's next turn pumps for the room it freed."""
        self._handle(Released(entry))
        if self.cursor is not None:
            self._opens_ready.set()

    def copy_lost(self, entry: int, tier: int) -> None:
        """A tier found its copy of ``entry`` stale or damaged and dropped it."""
        self._handle(CopyLost(entry, tier))

    def group_changed(self, seeds: tuple[int, ...], me: int) -> None:
        """The daemon group's members (hashing seeds, in member order) and this daemon's index."""
        self._handle(GroupChanged(seeds, me))

    def reactive_owner(self, entry: int) -> int | None:
        """The member to ask for ``entry`` under the group rule, or None: this node reads it itself."""
        return self.policy.reactive_owner(entry)

    def holders(self, entry: int) -> list[Holder]:
        """Members that may hold ``entry`` from an earlier regime (ask them before any PFS read)."""
        return self.policy.holders(entry)

    def peer_asked(self, entry: int, nbytes: int, by_plan: bool) -> FetchForPeer | None:
        """A peer asks for a file this node neither holds nor fetches: read it for them (and where to keep it)?"""
        answer = self._handle(PeerAsked(entry, nbytes, by_plan))
        return answer if isinstance(answer, FetchForPeer) else None

    # ------------------------------------------------------------------ instructions

    def _follow_plan(self, ins: FollowPlan) -> None:
        """A new plan: its cursor carries the old one's counters, history and recent opens over, and
        the opens queued for the old one (placed, not yet observed) are the new one's first, in the
        new plan's ids.  None may be lost: a lost open is a hole in its rank's track, whose ``low``
        stays below it until the readers are two windows past, and the horizon, counted from
        ``low``, runs dry meanwhile (seed discovery's plan came between two cursor turns: the
        staging window stopped for a fifth of the epoch).

        The new cursor is built only while no worker thread observes on the old one, so that what
        carries over includes that turn's batch; during such a turn the loop builds it when the turn
        ends (:meth:`_build_cursor`).  Its ``prepare()`` (the relock on the carried opens, the maps
        the quick path needs) is slow and runs in the cursor loop's worker thread.
        """
        self._cursor_generation = ins.generation
        queued_plan, self._cursor_plan = self._cursor_plan, ins.plan
        queued, self._opens = self._opens, []
        if ins.plan is not None and queued_plan is not None and queued:
            if _layouts(queued_plan) != _layouts(ins.plan):
                ids = _regid(queued_plan, self.policy.entry_gid)(np.asarray(queued, dtype=np.int64))
                queued = ids[ids >= 0].tolist()
            self._opens = queued
        self._presume_node = None  # an older plan's: a Presume for this one comes after this step
        self._follow = ins
        if not self._observing:
            self._build_cursor()

    def _build_cursor(self) -> None:
        """The cursor for the plan last followed (:meth:`_follow_plan`), from the one it replaces."""
        ins, self._follow = self._follow, None
        if ins is None:
            return
        old, old_plan = self.cursor, self._built_for
        if ins.plan is None:
            self.cursor = None
            if old is not None:
                self._retired, self._retired_plan = old, old_plan
        else:
            previous, previous_plan = (old, old_plan) if old is not None else (self._retired, self._retired_plan)
            regid = None
            if previous is not None and previous_plan is not None and _layouts(previous_plan) != _layouts(ins.plan):
                regid = _regid(previous_plan, self.policy.entry_gid)
            self.cursor = NodeCursor(ins.plan.job_streams(), self.settings, previous=previous, regid=regid)
            self._retired = self._retired_plan = None
            if ins.presume is not None:
                self.cursor.presume(ins.presume, 0)
            self._prepare = True
        self._built_for = ins.plan
        self._view_key = ()  # the old cursor's (a deferred turn's worker may have set it since)
        self._opens_ready.set()  # let the worker publish the new cursor's first view

    def _presume(self, ins: Presume) -> None:
        """The seed of the plan the cursor follows was written after the plan was made: predict now."""
        if self.cursor is not None and ins.generation == self._cursor_generation:
            self._presume_node = ins.node
            self._opens_ready.set()

    def _seed_in_doubt(self, ins: SeedInDoubt) -> None:
        if self.hooks.on_seed_doubt is not None:
            self.hooks.on_seed_doubt(ins)

    def _stage_slots(self, ins: StageSlots) -> None:
        self.fetcher.pfs.stage_slots(ins.limit)

    def _place(self, ins: Place) -> None:
        self._opens.append(ins.gid)
        self._opens_ready.set()

    def _stage(self, ins: Stage) -> None:
        self.fetcher.spawn(self._stage_one, ins)

    def _cancel_stage(self, ins: CancelStage) -> None:
        scope = self._stage_scopes.get(ins.entry)
        if scope is not None:
            scope.cancel()

    def _push(self, ins: Push) -> None:
        self.fetcher.spawn(self._push_one, ins)

    def _drop_pages(self, ins: DropPages) -> None:
        log.debug("dropping the pages of entry %d (%d bytes)", ins.entry, ins.nbytes)
        self.staging.drop_pages(ins.entry)

    def _fill(self, ins: Fill) -> None:
        self.fetcher.spawn(self._fill_one, ins)

    def _drop_copy(self, ins: DropCopy) -> None:
        log.debug("dropping tier %d's copy of entry %d", ins.tier, ins.entry)
        self.tiers[ins.tier].drop(ins.entry)

    def _retry_fill_later(self, ins: RetryFillLater) -> None:
        self.fetcher.spawn(self._fill_pause, ins)

    def _stage_next(self, ins: StageNext) -> None:
        self.fetcher.spawn(self._stage_next_one, ins)

    def _push_next(self, ins: PushNext) -> None:
        self.fetcher.spawn(self._push_next_one, ins)

    # ------------------------------------------------------------------ background work

    async def run(self) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._cursor_loop)
            nursery.start_soon(self._tick_loop)
            nursery.start_soon(self._lane_loop)

    async def _tick_loop(self) -> None:
        while True:
            await trio.sleep(TICK_INTERVAL)
            self._handle(Tick())

    async def _cursor_loop(self) -> None:
        while True:
            await self._opens_ready.wait()
            self._opens_ready = trio.Event()
            self._build_cursor()  # a plan whose worker turn ended without it (cancelled): never on a stale cursor
            cursor, plan, generation, batch = self.cursor, self._cursor_plan, self._cursor_generation, self._opens
            self._opens = []
            if cursor is None or plan is None:
                continue
            prepare, self._prepare = self._prepare, False
            presume, self._presume_node = self._presume_node, None
            if presume is not None:
                cursor.presume(presume, 0)  # a few tracks, no maps: quick
            # Quick placements run here; detection, new epoch maps, a new plan's preparation and
            # view recomputations in a worker thread (see the module's concurrency rules).
            observed, predicted = (0, 0) if prepare else cursor.observe_while_quick(batch)
            view = None
            if observed == len(batch) and not prepare and presume is None:
                view = self._carried_view(cursor, predicted)
            steady = view is not None and predicted == len(batch) and view.state == "tracking"
            if view is None:
                self._observing = True  # a plan followed meanwhile waits for this turn (_follow_plan)
                try:
                    view = await trio.to_thread.run_sync(
                        self._advance, cursor, plan, batch[observed:], predicted, prepare, limiter=self._cursor_lock
                    )
                finally:
                    self._observing = False
                if self._follow is not None:
                    # The view is of the replaced plan: only its count of predicted opens is taken.
                    self._handle(ViewPublished(view, [], generation))
                    self._build_cursor()  # carries this batch over
                    continue
            placed = plan.entry_of(np.asarray(batch, dtype=np.int64)).tolist() if batch else []
            previous = self.policy.view
            self._handle(ViewPublished(view, placed, generation))
            self._view_changed()
            if self.policy.view is view and view.state != previous.state:
                log.info(
                    "cursor: %s -> %s (node %s, epoch %s)%s",
                    previous.state,
                    view.state,
                    view.node,
                    view.epoch,
                    f": {view.status['mismatch_reason']}" if view.status and view.status["mismatch_reason"] else "",
                )
            if view.fresh and view.upcoming and self.policy.view is view:
                self.horizon.upcoming(view.upcoming)
            if self.hooks.on_view is not None and self.policy.view is view:
                self.hooks.on_view(view)
            # Let opens gather: placing is cheap, a turn is not (longer while nothing changes).
            steady = steady or (view.state == previous.state == "mismatch" and not view.fresh)
            await trio.sleep(STEADY_INTERVAL if steady else VIEW_INTERVAL)

    def _advance(self, cursor: NodeCursor, plan: Plan, gids: list[int], predicted: int, prepare: bool) -> CursorView:
        """Worker thread: a new cursor's preparation, the opens left, then the view the trio side asks for."""
        if prepare:
            cursor.prepare()  # relock on the opens a replaced plan's cursor saw; build the maps needed next
        if not log.isEnabledFor(logging.DEBUG):  # at once (runs of strays in bulk): the same as one by one
            predicted += cursor.observe_all(gids)
            gids = []
        for gid in gids:  # one by one, to log each unpredicted open
            if cursor.observe(gid):
                predicted += 1
            else:
                log.debug(
                    "unpredicted open: gid %d (%s, epoch %d, positions %s)",
                    gid,
                    cursor.state,
                    cursor.epoch,
                    {r: (t.epoch, t.low, t.high) for r, t in cursor.tracks.items()},
                )
        view = None if prepare else self._carried_view(cursor, predicted)
        return view or self._fresh_view(cursor, plan, predicted)

    def _carried_view(self, cursor: NodeCursor, predicted: int) -> CursorView | None:
        """The last view with new counts, when nobody moved a step since it was computed; else None."""
        previous = self.policy.view
        if cursor.progress_key(self.cursor_step) == self._view_key and previous.state == cursor.state:
            return replace(previous, status=cursor.status(), predicted=predicted, fresh=False)
        return None

    def _fresh_view(self, cursor: NodeCursor, plan: Plan, predicted: int) -> CursorView:
        """Worker thread: the horizon and stage list from the cursor's position (O(horizon) work).

        ``prepare()`` builds the next epoch's maps while we are in a worker thread anyway, so the
        quick path never has to hand the first opens of an epoch to a thread.
        """
        cursor.prepare()
        self._view_key = cursor.progress_key(self.cursor_step)
        due: dict[int, int] = {}
        stage: tuple[int, ...] = ()
        ahead: tuple[int, ...] = ()
        if cursor.state in ("tracking", "presumed"):
            _epochs, gids = cursor.upcoming_gids(self.horizon_files)
            if gids.shape[0]:
                entries = plan.entry_of(gids).tolist()
                due = entries_due(entries)
                ahead = tuple(entries)
                stage = self.policy.stage_list(entries)
        return CursorView(
            cursor.state, cursor.node, cursor.epoch, due, stage, cursor.status(), predicted, upcoming=ahead
        )

    async def _stage_one(self, ins: Stage) -> None:
        entry = ins.entry
        data: bytes | None = None
        with trio.CancelScope() as scope:
            self._stage_scopes[entry] = scope
            try:
                # A tier copy through the revalidator, like a reader's open: a staged copy is served
                # without reaching it again, so after a remount an unchecked copy of a file changed
                # while unmounted would otherwise be served (and passed on to peers asking).  With
                # no tier named, a copy a fill stored since the decision is read here, not the PFS
                # again (seen: a fill and then its stage, 20 ms apart).
                local = await self.fetcher.from_tiers(entry)
                data = local.data if local is not None else None
                if data is None and ins.from_tier is not None and not self.tiers[ins.from_tier].contains(entry):
                    self.copy_lost(entry, ins.from_tier)
                if data is None:
                    keep = None if ins.keep_in is None else self.tiers[ins.keep_in]
                    data = await self.fetcher.start(entry, Sources.ALL, keep, why="staging").wait()
                    self.staging_fetches += 1
            except Exception as exc:  # the reader's own open reports the error; staging just skips it
                log.debug("staging entry %d failed: %s", entry, exc)
            finally:
                if self._stage_scopes.get(entry) is scope:
                    del self._stage_scopes[entry]
        if not scope.cancelled_caught:
            self._handle(StageFetched(entry, data))

    async def _lane_loop(self) -> None:
        """Once per epoch of a node in a group: what it reads next epoch and not this one (the policy's
        next-epoch lane), and the same for the epoch after, so that the lane is in place the moment
        its epoch is next (until it is, the window stages its files as they enter its horizon, in a
        burst); woken as soon as a view of a new epoch is published.
        Computed in a worker thread under the cursor's lock: it builds epoch maps (a permutation each
        at ImageNet scale) in the plan's shared cache, which the cursor uses too."""
        while True:
            with trio.move_on_after(LANE_INTERVAL):
                await self._lane_wake.wait()
            # Renewed before any await: a wake set while the lanes below are computed wakes the next look.
            self._lane_wake = trio.Event()
            policy, plan, view = self.policy, self.policy.plan, self.policy.view
            if plan is None or plan.nodes < 2 or policy.mode != "predicting" or view.node is None:
                continue
            for epoch in (view.epoch, view.epoch + 1):  # the next epoch's lane, and the one after
                key = (policy.generation, view.node, epoch)
                if key in self._lanes_for:
                    continue
                self._lanes_for = {k for k in self._lanes_for if k[0] == key[0] and k[2] >= view.epoch} | {key}
                try:
                    entries, ready, first = await trio.to_thread.run_sync(
                        _lane_reads,
                        plan,
                        view.node,
                        epoch,
                        policy.settings.loader_start,
                        limiter=self._cursor_lock,
                    )
                except (ValueError, IndexError) as exc:  # a node or epoch this plan cannot map
                    log.info("no next-epoch reads for node %s, epoch %s: %s", view.node, epoch, exc)
                    continue
                self._handle(NextEpoch(key[0], key[1], epoch + 1, entries, ready, first))

    async def _stage_next_one(self, ins: StageNext) -> None:
        """A file for the next epoch, from a local tier or the peer holding it (never the PFS)."""
        entry = ins.entry
        data: bytes | None = None
        try:
            if ins.from_tier is not None:
                local = await self.fetcher.from_tiers(entry)  # checked first, as in _stage_one
                data = local.data if local is not None else None
            if data is None:
                keep = None if ins.keep_in is None else self.tiers[ins.keep_in]
                data = await self.fetcher.start(entry, Sources.PAGES | Sources.OWNER, keep, why="next").wait()
                self.next_fetches += 1
        except NotFromPeer:
            pass
        except Exception as exc:  # the reader's own open reports any error; the lane just skips it
            log.debug("next-epoch stage of entry %d failed: %s", entry, exc)
        self._handle(NextFetched(entry, data))

    async def _push_next_one(self, ins: PushNext) -> None:
        ok = await self.staging.push(ins.entry, ins.data)
        self._handle(NextPushed(ins.entry, ok))

    async def _push_one(self, ins: Push) -> None:
        ok = await self.staging.push(ins.entry, ins.data)
        self._handle(Pushed(ins.entry, ok))

    async def _fill_one(self, ins: Fill) -> None:
        tier = self.tiers[ins.tier]
        outcome: FillOutcome = "stored"
        try:
            if not tier.contains(ins.entry):
                await self.fetcher.start(ins.entry, _fill_sources(ins.from_pfs), tier, why="fill").wait()
                self.fill_fetches += 1
                outcome = "stored" if tier.contains(ins.entry) else "refused"
                if outcome == "refused":
                    log.debug("filling entry %d into tier %d: fetched, but the tier had no room", ins.entry, ins.tier)
        except NotFromPeer:
            outcome = "later"
        except Exception as exc:
            outcome = "failed"
            log.debug("filling entry %d into tier %d failed: %s", ins.entry, ins.tier, exc)
        self._handle(FillDone(ins.entry, ins.tier, outcome, ins.generation))

    async def _fill_pause(self, ins: RetryFillLater) -> None:
        await trio.sleep(ins.seconds)  # owners not ready for these replicas yet
        self._handle(FillRetry(ins.generation))

    def status(self) -> PrefetchStatus:
        policy = self.policy
        return {
            "mode": policy.mode,
            "cursor": policy.view.status,
            "predicted_opens": policy.predicted_opens,
            "unplanned_opens": policy.unplanned_opens,
            "staging_fetches": self.staging_fetches,
            "fill_fetches": self.fill_fetches,
            "next_fetches": self.next_fetches,
            "fetches_inflight": len(self.fetcher.inflight),
            "recent_fetches": self.fetcher.recent_hits,
            "window_files": self.window_files,
            "horizon_files": self.horizon_files,
            "staging": self.staging.status(),
        }


def _fill_sources(from_pfs: bool) -> Sources:
    """A fill's sources: a replica's fill waits for a peer's copy; the owner's reads the PFS too."""
    return Sources.ALL if from_pfs else Sources.PAGES | Sources.OWNER


def _lane_reads(
    plan: Plan, node: int, epoch: int, hold_off: int
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], bool]:
    """The lane of ``epoch`` and whether that epoch first reads a training dataset (its
    ``NextEpoch.first_read``): both walk the plan's epochs, so both run in the lane's worker thread."""
    entries, ready = next_epoch_reads(plan, node, epoch, hold_off)
    return entries, ready, reads_first(plan, epoch)


def _regid(old: Plan, entry_gid: npt.NDArray[np.int32]) -> Callable[[npt.NDArray[np.int64]], npt.NDArray[np.int64]]:
    """The replaced plan's global ids -> the new plan's (``entry_gid``: the policy's entry -> id map of
    the new plan, -1 where it has none), through the snapshot entry both name: the opens a cursor
    carries over to a plan that lists the files in another order (seed discovery found the catalog
    order) then name the same files, and the new plan relocks on them at once."""

    def regid(gids: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        entries = old.entry_of(gids).astype(np.int64)
        inside = entries < entry_gid.shape[0]
        out = np.full(gids.shape[0], -1, dtype=np.int64)
        out[inside] = entry_gid[entries[inside]]
        return out

    return regid


def _layouts(plan: Plan) -> list[object]:
    """The catalog order of each dataset the plan lists (its inputs' layouts)."""
    return [ds.get("layout") for ds in plan.inputs["datasets"]]
