"""Every decision of the read path's prefetching, apart from the I/O that carries it out.

Events in, instructions out, the way Dask distributed separates its worker state machine from the
worker: the executor (:mod:`fusefs.readpath.prefetch`) reports what happened (a file was opened,
released, fetched, pushed, the cursor published a new view, the plan changed, the budget needs
room) and carries out what :meth:`ReadPolicy.handle` returns (stage a file, push it, drop its pages,
fill a tier, drop a tier copy).  Nothing here awaits, sleeps, reads a clock or touches a file, so
every rule below is tested by feeding events (``tests/test_policy.py``) in microseconds.

NoPFS's rules as applied here:

1. Optimal prefetching: the staging window holds the next files of this node's predicted stream,
   staged in stream order from the fastest source that has them.  A file that does not fit waits
   for room: a later file is never staged ahead of it.
2. Replacement: pages a reader left in the page cache are *kept* while the budget has room and are
   reclaimed oldest first, files due in the predicted horizon last and furthest-due first; staging
   never takes a page due before the file it stages.
3. A staged file is retired when it was consumed, or once it left the whole predicted horizon
   (the plan changed, the readers skipped it): never merely because the byte-limited window moved
   on, which would throw away a file needed before the ones replacing it.
4. Long-term tiers hold the plan's files by access frequency and are filled in order of first use,
   only while no staging is in flight ("staging first": the readers' window has the bandwidth).

When no plan can be trusted (no plan, or the cursor reports a mismatch) the reactive policy
(:mod:`placement.reactive`) decides what to keep, and nothing is staged.  Three transitions decide
how a plan is trusted and are handled in one place each: a :class:`PlanChanged` event
(:meth:`ReadPolicy._plan_changed`), and the mismatch and the relock a :class:`ViewPublished` may
report (:meth:`ReadPolicy._mismatch`, :meth:`ReadPolicy._relock`: the policy derives them from the
view's state, so they are not events of their own).

The contract (:mod:`fusefs.readpath.contract`) is closed: every event comes in through
:meth:`ReadPolicy.handle` and nowhere else, the one exception being the budget's re-entrant
:meth:`ReadPolicy.reclaim`.  The last steps may be logged (``debug.policy_log``; :meth:`ReadPolicy.story`
tells one file's), and checked after each (``debug.validate``; :meth:`ReadPolicy.validate`).

Budgets: the staging window, the pages readers leave cached and the memory tier charge one byte
budget (``Charges``, the daemon's memory budget); the window alone never exceeds
``staging_limit``.  The policy charges and releases the window's and the page cache's bytes itself
and answers the budget's reclaim requests (:meth:`ReadPolicy.reclaim`); the memory tier charges its
own puts.

Threads: everything runs on the executor's one event-loop thread, except :meth:`stage_list`, which
the cursor's worker thread calls while it computes a view.  That reads tier membership and
``kept`` only; a stale answer costs one needless or one missed stage, never a wrong byte.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Literal, Protocol, TypedDict, assert_never

import numpy as np
import numpy.typing as npt

from fusefs.readpath.contract import (
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
    PeerDown,
    PeerUp,
    Place,
    PlanChanged,
    Presume,
    Push,
    Pushed,
    PushNext,
    ReadFromPfs,
    ReadThrough,
    Reclaimed,
    Released,
    RetryFillLater,
    SeedInDoubt,
    SeedTrusted,
    SourceChanged,
    Stage,
    StageFetched,
    StageNext,
    StageSlots,
    Step,
    Tick,
    UseHeld,
    UsePages,
    ViewPublished,
)
from placement.owners import owners
from placement.plan import Plan
from placement.reactive import StaticFrequencySet
from placement.statusfields import counter, gauge, state, text

Mode = Literal["reactive", "detecting", "predicting"]
"""reactive: no plan can be trusted; detecting: a plan, waiting for opens to place this node;
predicting: the cursor follows this node's ranks and the window is staged ahead of them."""
PageState = Literal["fetching", "pushing", "pushed", "held", "reading"]
"""fetching: room reserved, the staging fetch in flight; pushing: notify_store in flight; pushed: in
the page cache; held: in daemon RAM (memory staging, or a push the kernel refused); reading: pages
a reader pulls through the mount (not the window's)."""
StagingMode = Literal["page_cache", "memory"]

_STAGED: frozenset[PageState] = frozenset(("fetching", "pushing", "pushed", "held"))
FILL_RETRY_SECONDS = 1.0  # between passes over replicas whose owners could not serve them yet
PAST_PLANS = 3  # followed plans whose owners :meth:`ReadPolicy.holders` remembers
# Tier fills that may start per open this node serves while its readers read (see _pump_fill).
VISIT = 1 << 40
""":meth:`ReadPolicy.readers`' flag on an op: ``entry | VISIT`` is a *visit*, an open of ``entry`` and its
release with no other op on ``entry`` between them (the native front folds such pairs): one step
that does what the open and the release do one after the other.  Far above any entry."""

ReaderAnswer = UsePages | UseHeld | bool | None | tuple[UsePages | UseHeld | None, bool]
"""Per op of :meth:`ReadPolicy.readers`: an open's UsePages, UseHeld or None; a release's
:meth:`ReadPolicy.in_page_cache` right after it; a visit's both, as a pair."""

FILL_PER_OPEN = 0.5


class Charges(Protocol):
    """The byte budget the window, the kept pages and the memory tier share (``fusefs.tiers.Budget``)."""

    limit: int
    used: int

    def try_reserve(self, n: int) -> bool: ...
    def release(self, n: int) -> None: ...


class TierView(Protocol):
    """What the policy asks a tier: membership only (a tier's own index, no I/O)."""

    @property
    def kind(self) -> str: ...

    def contains(self, entry: int) -> bool: ...
    def size_of(self, entry: int) -> int | None: ...
    def entries(self) -> list[int]: ...


class NextEpochStatus(TypedDict):
    """The lane that stages the next epoch's files this node does not read in this one (from an
    epoch that reads its dataset for the first time, the epoch after's too)."""

    epoch: Annotated[int | None, gauge("the next epoch, the first they are for (null: no lane)")]
    files: Annotated[int, gauge("files in the lane")]
    released: Annotated[int, gauge("of those, released to stage (their holders have them)")]
    inflight: Annotated[int, gauge("stages in flight")]
    pushed: Annotated[int, counter("files pushed for the next epoch before it began", metric="next_pushed")]
    later: Annotated[int, counter("next-epoch stages no peer could serve yet", metric="next_later")]


class WindowStatus(TypedDict):
    """The staging window and the page cache, as the policy accounts them."""

    mode: Annotated[StagingMode, state("page_cache: staged files are pushed into the page cache; memory: held in RAM")]
    limit_bytes: Annotated[int, gauge("bytes the staging window may hold")]
    staged_bytes: Annotated[int, gauge("bytes staged for coming opens")]
    staged_files: Annotated[int, gauge("files staged for coming opens")]
    page_cache_bytes: Annotated[
        int, gauge("pages the mount holds in the kernel page cache, pushed or pulled by readers")
    ]
    kept_files: Annotated[int, gauge("files read already whose pages stay cached while the budget has room")]
    kept_bytes: Annotated[int, gauge("bytes of those files")]
    reused: Annotated[int, counter("opens served by pages kept from an earlier read", metric="reused_opens")]
    uncached_opens: Annotated[int, counter("opens served with direct_io because the memory budget was full")]
    unused: Annotated[int, counter("staged files dropped before any open used them", metric="unused_files")]
    in_flight: Annotated[
        int, gauge("stages in flight (PFS or tier reads and page-cache pushes)", metric="stages_inflight")
    ]
    in_flight_limit: Annotated[
        int,
        gauge(
            "stages in flight at most now: prefetch.threads, raised by that much while readers catch the window, "
            "up to prefetch.max_in_flight, and lowered again while it stays ahead"
        ),
    ]
    in_flight_limit_max: Annotated[int, gauge("the highest in_flight_limit since the mount")]
    caught_opens: Annotated[
        int,
        counter(
            "opens of a file due in the window whose stage was still in flight or not started: the readers "
            "caught up with the staging window"
        ),
    ]
    next_epoch: Annotated[NextEpochStatus, text("the next epoch's files staged from peers and local tiers")]


class PolicyStepStatus(TypedDict):
    """One step of the read policy's log."""

    seq: Annotated[int, gauge("the step's number since the mount")]
    step: Annotated[
        str,
        text(
            "the event (or a Reclaimed: the budget's reclaim outside any step) and the instructions the "
            "policy decided: 'Event(fields) -> Instruction(fields), ...'"
        ),
    ]
    entries: Annotated[
        list[int],
        text("the snapshot entries the step names (an entry is the file's inode number minus 1)"),
    ]


class PolicyLogStatus(TypedDict):
    """Status section ``policy_log``: the read policy's last steps (the ``debug.policy_log`` key of
    seerfs.yaml(5)), so that why a file was staged, kept, dropped or read from the PFS again is read
    off the steps naming it (jq: ``.policy_log.log[] | select(.entries | index(ENTRY))``)."""

    capacity: Annotated[int, gauge("steps the log keeps at most (debug.policy_log; 0: no log)")]
    steps: Annotated[int, counter("policy steps since the mount: events handled, and reclaims outside a step")]
    log: Annotated[list[PolicyStepStatus], text("the steps kept, oldest first (empty without the log)", export=False)]


# ---------------------------------------------------------------------------------------- state


@dataclass(slots=True)
class Pages:
    """One file whose bytes the mount holds for the window, or whose pages a reader pulls in."""

    nbytes: int
    state: PageState
    taken: bool = False  # an open used it (its pages are then kept at release)
    data: bytes | None = None  # held in RAM (held), or on its way to the kernel (pushing)

    @property
    def staged(self) -> bool:
        return self.state in _STAGED


@dataclass
class _FillRun:
    """One pass over this node's assigned files in order of first use."""

    node: int
    entries: npt.NDArray[np.int64]
    tiers: npt.NDArray[np.int64]
    owners: npt.NDArray[np.int64]
    due: npt.NDArray[np.int64]  # the node's job position each is due by (ascending)
    pos: int = 0
    inflight: dict[int, int] = field(default_factory=dict)  # entry -> position, fills of this pass
    later: list[int] = field(default_factory=list)  # positions of replicas to try again
    waiting: bool = False  # a RetryFillLater is out


@dataclass
class _NextRun:
    """The next epoch's files this node does not read this epoch, released as their holders get them."""

    generation: int
    node: int
    epoch: int  # the epoch they are for
    entries: npt.NDArray[np.int64]  # in the order this node reads them then
    ready_at: npt.NDArray[np.int64]  # position of this epoch from which the holder has each (-1: now)
    by_ready: npt.NDArray[np.int64]  # indices into entries, by ready_at
    first_read: bool  # its epoch before reads a dataset for the first time (NextEpoch.first_read)
    released: int = 0  # how many of by_ready were released
    heap: list[int] = field(default_factory=list)  # released indices not staged yet (need order first)
    unreleased: set[int] = field(default_factory=set)  # not released yet: the window leaves them to it


@dataclass(frozen=True, slots=True)
class PlanHolder:
    """The member that was training node ``node`` under the plan with ``digest``: that plan made it
    the file's one PFS reader, so it may hold the file still."""

    digest: str
    node: int


@dataclass(frozen=True, slots=True)
class RuleHolder:
    """Group member ``member`` (its index as of the last :class:`GroupChanged`): the group rule made
    it the file's one PFS reader while no plan was trusted, so it may hold the file still."""

    member: int


Holder = PlanHolder | RuleHolder


@dataclass(frozen=True)
class PolicySettings:
    staging_limit: int  # bytes the staging window may hold (a share of the budget)
    staging_mode: StagingMode = "page_cache"
    stage_threads: int = 4  # stages in flight to start with, and the step the limit moves by (stage_max)
    fill_threads: tuple[int, ...] = ()  # fills in flight per tier at most
    reactive_capacities: tuple[int, ...] = ()  # bytes per tier the reactive policy may keep
    next_threads: int = 4  # next-epoch stages in flight at most (local tiers and peers only)
    # Positions of each epoch its DataLoaders read in their first moments, which tier fills and the
    # next-epoch lane leave to the readers (see _pump_fill; the cursor's window, CursorSettings).
    loader_start: int = 0
    # Developer checks (the config's debug keys): the steps the policy's log keeps (0: no log), and
    # whether every step ends with validate() (a contradiction in the books then raises at once).
    log_steps: int = 0
    validate: bool = False
    # Stages in flight at most (fetch and push); the limit starts at stage_threads and moves by it
    # (ReadPolicy._caught).  Below stage_threads: fixed at stage_threads.
    stage_max: int = 0


# ---------------------------------------------------------------------------------------- the policy


class ReadPolicy:
    """The state machine: :meth:`handle` one event, get the instructions it decided."""

    def __init__(
        self, sizes: npt.NDArray[np.int64], budget: Charges, tiers: Sequence[TierView], settings: PolicySettings
    ) -> None:
        self.sizes = sizes  # bytes per snapshot entry
        self.budget = budget
        self.tiers = list(tiers)
        self.settings = settings
        self.staging_limit = settings.staging_limit
        self.memory_tiers = [t for t in self.tiers if t.kind == "memory"]
        self.fill_threads = list(settings.fill_threads) or [1] * len(self.tiers)
        self._fill_credit_cap = float(sum(self.fill_threads))  # one round of fill slots
        self.reactive = StaticFrequencySet(list(settings.reactive_capacities or [0] * len(self.tiers)))
        # The plan and where this node is in it
        self.plan: Plan | None = None
        self.trusted = False  # the job wrote the plan's seed (not merely assumed)
        self.generation = 0
        self.view = CursorView()
        self.presumed_node: int | None = None  # this daemon's group index: the node to presume (NodePresumed)
        self.entry_gid: npt.NDArray[np.int32] = np.full(0, -1, np.int32)
        self.tier_of_gid: npt.NDArray[np.int8] | None = None  # this node's assignment, per gid
        self._unplaced: dict[int, int] = {}  # entry -> opens the published view does not reflect yet
        self._opened_since_view: set[int] = set()  # opened since the horizon was last computed
        # The staging window and the page cache
        self.pages: dict[int, Pages] = {}  # staged (the window) or open by readers
        # Consumed, pages still cached -> charge; oldest first.  A plain dict keeps insertion order,
        # and a warm open pops its file and its release puts it back at the end: 0.1 us against
        # OrderedDict's 0.5 us (its own linked list), which no code here needs (no move_to_end).
        self.kept: dict[int, int] = {}
        self._kept_unused: set[int] = set()  # kept pages of staged files no open has used (yet)
        self.staged_bytes = 0
        self.cached_bytes = 0  # pages of files readers have open, pulled through the mount
        self.kept_bytes = 0
        self._staging_now: set[int] = set()  # stages in flight (fetch or push)
        self._pushing: dict[int, Pages] = {}  # pushes in flight, by entry (also once retired meanwhile)
        self._swept_for: Mapping[int, int] | None = None  # the horizon the last retirement sweep used
        self._stage_of: tuple[int, ...] | None = None  # the stage list the walk is on ...
        self._stage_pos = 0  # ... and how far it got
        # Stages in flight at most now (see _caught and _tick: raised while readers catch the window)
        self.stage_limit = settings.stage_threads
        self.stage_ceiling = max(settings.stage_threads, settings.stage_max)
        self.stage_limit_max = self.stage_limit  # the highest since the mount (status)
        self.caught_opens = 0  # opens of a due file whose stage was in flight or not started
        self._held_back = False  # the walk stopped at the limit since the limit last changed
        self._done_since_change = 0  # stages that ended since the limit last changed
        self._caught_since_tick = 0
        self._peak = 0  # most stages in flight since the last tick
        # Long-term tiers
        self._fill: _FillRun | None = None
        self._fill_busy = [0] * len(self.tiers)
        self._fill_credit = math.inf  # fills that may start now: unbounded while no reader reads
        self._opens_since_tick = 0
        self._fill_until_for: tuple[int, int | None] | None = None  # (epoch, _fill_until's answer)
        self._fill_hold = 0  # positions of an epoch fills leave to the loaders' start (_pump_fill)
        self.filled_node: int | None = None
        self.peers_down: set[int] = set()
        # The group (owners while no plan is trusted) and the next epoch's pages
        self.group_seeds: tuple[int, ...] = ()
        self.group_me = 0
        self.group_owner: npt.NDArray[np.int16] | None = None  # per entry, its owning member (None: alone)
        # Who may hold what was read under an earlier regime (see holders): the group rule picked
        # PFS readers at some time since the mount; the current plan was followed (presumed or
        # tracked: its owners read files from the PFS); earlier plans that were followed, newest
        # last, each as its owner per entry.
        self.ruled = False
        self.followed = False
        self.past_owners: list[tuple[str, npt.NDArray[np.int16]]] = []
        self.reactive_owned = StaticFrequencySet([0] * len(self.tiers))  # the reactive set of owned files
        self.from_pfs = np.zeros(sizes.shape[0], np.bool_)  # per entry: this node read it from the PFS
        self._lane: _NextRun | None = None
        self._lane_after: _NextRun | None = None  # the lane after it, computed ahead (see _next_epoch)
        self.next_pages: dict[int, Pages] = {}  # next-epoch stages in flight (fetching or pushing)
        self.next_bytes = 0
        self._next_forgotten: set[int] = set()  # dropped while pushed: drop the pages the push stores
        self.next_pushed = 0  # files pushed for the next epoch before it began
        self.next_later = 0  # next-epoch stages no peer could serve yet
        # Counters (status)
        self.predicted_opens = 0
        self.unplanned_opens = 0
        self.unused = 0  # staged files dropped before any open used them (wasted fetches)
        self.reused = 0  # opens served by pages kept from an earlier read
        self.uncached_opens = 0  # opens served with direct_io because the budget was full
        self._out: list[Instruction] = []
        self._busy = False
        self._due_for: int | None = None  # the horizon position of the file a reservation is for
        # The log (PolicySettings.log_steps): the last steps, for story() and the debug status section.
        self._log: deque[Step] | None = deque(maxlen=settings.log_steps) if settings.log_steps > 0 else None
        self.steps = 0  # steps taken since the mount (events handled, reclaims outside a step)

    # ------------------------------------------------------------------ the interface

    def handle(self, event: Event) -> list[Instruction]:
        """Decide on one event; the instructions are carried out in order, before the next event.

        Every event the executor reports comes here, and only here; the one other way in is the
        budget's :meth:`reclaim`, which may re-enter a step (see there).  The ``match`` is closed:
        an event class added to :data:`Event` without its case fails the type check (``assert_never``).
        The readers' events come first: they are by far the most frequent.
        """
        self._busy = True
        try:
            match event:
                case Opened():
                    self._opened(event)
                case Released():
                    self._released(event)
                case ReadThrough():
                    self._read_through(event)
                case Missed():
                    self._missed(event)
                case ReadFromPfs():
                    self._read_from_pfs(event)
                case ViewPublished():
                    self._view_published(event)
                case StageFetched():
                    self._stage_fetched(event)
                case Pushed():
                    self._pushed(event)
                case FillDone():
                    self._fill_done(event)
                case FillRetry():
                    self._fill_retry(event)
                case NextFetched():
                    self._next_fetched(event)
                case NextPushed():
                    self._next_pushed(event)
                case Tick():
                    self._tick(event)
                case PeerAsked():
                    self._peer_asked(event)
                case CopyLost():
                    self._copy_lost(event)
                case SourceChanged():
                    self._source_changed(event)
                case NextEpoch():
                    self._next_epoch(event)
                case PlanChanged():
                    self._plan_changed(event)
                case SeedTrusted():
                    self._seed_trusted(event)
                case NodePresumed():
                    self._node_presumed(event)
                case PeerDown():
                    self._peer_down(event)
                case PeerUp():
                    self._peer_up(event)
                case GroupChanged():
                    self._group_changed(event)
                case _:
                    assert_never(event)
        finally:
            self._busy = False
        out, self._out = self._out, []
        if not self.followed and any(isinstance(i, (Fill, Stage)) for i in out):
            self.followed = True
        self._record(event, out)
        if self.settings.validate:
            self.validate()
        return out

    def _record(self, event: Event | Reclaimed, out: list[Instruction]) -> None:
        self.steps += 1
        if self._log is not None:
            self._log.append(Step(self.steps, event, tuple(out)))

    def log(self) -> list[Step]:
        """The steps the log keeps, oldest first (empty with ``log_steps`` 0)."""
        return list(self._log) if self._log is not None else []

    def log_status(self) -> PolicyLogStatus:
        return {
            "capacity": self.settings.log_steps,
            "steps": self.steps,
            "log": [{"seq": st.seq, "step": st.describe(), "entries": st.entries()} for st in self.log()],
        }

    def story(self, entry: int) -> list[Step]:
        """The logged steps that name ``entry``, oldest first: why it was staged, kept, dropped,
        reclaimed or read again ("why did this node read X from the PFS again?")."""
        return [step for step in self.log() if entry in step.entries()]

    @property
    def busy(self) -> bool:
        """Inside :meth:`handle` (a budget callback then leaves its instructions to that call's result)."""
        return self._busy

    def drain(self) -> list[Instruction]:
        """Instructions decided outside :meth:`handle` (a reclaim the memory tier's put asked for)."""
        out, self._out = self._out, []
        return out

    @property
    def mode(self) -> Mode:
        if self.plan is None or self.view.state == "mismatch":
            return "reactive"
        if self.view.state == "detecting":
            return "detecting"
        return "predicting"

    def planned_tier(self, entry: int) -> int | None:
        """The tier the plan gives ``entry`` on this node (once the node is known), else None."""
        if self.tier_of_gid is None or entry >= self.entry_gid.shape[0]:
            return None
        gid = int(self.entry_gid[entry])
        t = int(self.tier_of_gid[gid]) if gid >= 0 else -1
        return t if 0 <= t < len(self.tiers) else None

    def stage_list(self, entries: Sequence[int]) -> tuple[int, ...]:
        """Worker thread: of the horizon's ``entries`` (in order of use), those to stage, as many as fit.

        Files in a memory tier are left out: an open serves them from RAM already, and staging
        them would spend the window's small budget on what needs no fetching; so are pages kept
        from an earlier read.  One comprehension per check: later epochs hold nearly everything,
        and this keeps the scan cheap.
        """
        held: list[Callable[[int], bool]] = [t.contains for t in self.memory_tiers]
        held.append(self.kept.__contains__)
        todo = list(dict.fromkeys(entries))
        for contains in held:
            todo = [e for e in todo if not contains(e)]
        if not todo:
            return ()
        sizes = np.cumsum(self.sizes[np.asarray(todo, dtype=np.int64)])
        return tuple(todo[: int(np.searchsorted(sizes, self.staging_limit, side="right"))])

    # ------------------------------------------------------------------ the plan

    def _plan_changed(self, ev: PlanChanged) -> None:
        """A new plan (or none): the cursor restarts from the opens its predecessor saw.

        Nothing held is thrown away: files staged for the old plan stay until the new cursor's
        first view sweeps those outside its horizon into the kept pages (they may be due under
        the new plan too), and stages in flight complete.  Without a plan nothing can be predicted:
        the window settles as after a mismatch.
        """
        self.generation += 1
        self._remember_owners()
        plan = self.plan = ev.plan
        self.followed = False
        self.trusted = ev.seed_trusted and plan is not None
        self.view = CursorView()
        self._unplaced = {}
        self._opened_since_view = set()
        self.tier_of_gid = None
        self.filled_node = None
        self._fill = None
        self._fill_until_for = None
        self._fill_hold = 0
        self._stage_of, self._stage_pos = None, 0
        presume: int | None = None
        if plan is None:
            self.entry_gid = np.full(0, -1, np.int32)
            self._adopt_into_reactive()
            self._settle_window()
        else:
            # At most a quarter of a rank's first read of its epoch: an epoch shorter than a few
            # loader starts still fills while it is read.
            per_rank = max((seg.length for seg in plan.segments(0)), default=0) // plan.shape.ranks_per_node
            self._fill_hold = min(self.settings.loader_start, per_rank // 4)
            self.entry_gid = np.full(self.sizes.shape[0], -1, np.int32)
            gids = np.arange(plan.files, dtype=np.int64)
            entries = plan.entry_of(gids).astype(np.int64)
            self.entry_gid[entries[::-1]] = gids[::-1].astype(np.int32)  # the first id of a shared entry wins
            # Predict before any open only for a seed the job wrote: with the assumed default, wait
            # for the first opens to confirm it rather than stage a window that may all be wasted.
            if self.trusted:
                presume = self._node_to_presume(plan)
        self._out.append(FollowPlan(plan, presume, self.generation))

    def _node_to_presume(self, plan: Plan) -> int | None:
        if plan.nodes == 1:
            return 0
        if self.presumed_node is not None and self.presumed_node < plan.nodes:
            return self.presumed_node
        return None

    def _node_presumed(self, ev: NodePresumed) -> None:
        """Remembered for the next trusted plan (and a seed trusted later); a plan followed already
        keeps its presumption, and the opens decide in any case."""
        self.presumed_node = ev.node

    def _seed_trusted(self, ev: SeedTrusted) -> None:
        """The job wrote the seed the plan was made for as the assumed default (README's ``echo 0``):
        the same plan, now trusted; presume as for a plan made for a written seed."""
        plan = self.plan
        if plan is None or self.trusted or plan.seed != ev.seed:
            return
        self.trusted = True
        node = self._node_to_presume(plan)
        if node is not None and self.view.state == "detecting":
            self._out.append(Presume(node, self.generation))

    def _view_published(self, ev: ViewPublished) -> None:
        # The opens of the turn were predicted (or not) when they came, by whichever plan's cursor
        # placed them: counted even when that plan was replaced meanwhile (its turn's opens go to
        # the new cursor as carried history, never observed again, so never counted twice).
        self.predicted_opens += ev.view.predicted
        if ev.generation != self.generation:
            return  # computed for a plan replaced meanwhile: nothing else of it is followed
        for entry in ev.placed:
            left = self._unplaced.get(entry, 0) - 1
            if left > 0:
                self._unplaced[entry] = left
            else:
                self._unplaced.pop(entry, None)
        view = ev.view
        previous, self.view = self.view, view
        if view.fresh:  # a recomputed horizon knows every open it was given; later ones it does not
            self._opened_since_view = set(self._unplaced)
        if view.node is not None and (view.node != previous.node or self.tier_of_gid is None) and self.plan:
            self.tier_of_gid = self.plan.tier_of(view.node)
        if view.state in ("tracking", "presumed"):
            self.followed = True
        if view.state == "mismatch" and previous.state != "mismatch":
            self._mismatch(view)
        elif previous.state == "mismatch" and view.state != "mismatch":
            self._relock()
        if self._fill is None and self.filled_node is None:
            self._start_fill()
        self._sweep()
        self._pump()

    def _mismatch(self, view: CursorView) -> None:
        """The plan is wrong for these readers: the reactive policy decides, and nothing held is lost.

        A mismatch must never cost more PFS reads than having no plan at all, so what the plan
        brought here stays usable: the window's files become kept pages (served if a reader opens
        them, reclaimed when the budget needs room), stages in flight complete and are kept the
        same way, and the tiers' copies count against the reactive policy as far as its capacity
        goes, none dropped (:meth:`_adopt_into_reactive`); in a group the other members find what
        this node holds through :meth:`holders`.  The tier fill of the plan goes on, into room the
        reactive policy leaves only (it is this node's assignment, which peers ask for, whatever the
        readers do now).  Whatever may find the right seed from the opens is told
        (:class:`SeedInDoubt`).
        """
        self._adopt_into_reactive()
        self._settle_window()
        if self.plan is not None:
            status = view.status
            reason = (status and status["mismatch_reason"]) or "the opens fit no epoch, node or position"
            self._out.append(SeedInDoubt(self.plan.seed, self.trusted, reason, self.generation))

    def _relock(self) -> None:
        """The readers follow the plan again: prediction resumes with the view that said so; the
        sweep of that view retires what the window held outside the new horizon into kept pages."""
        self._swept_for = None

    # ------------------------------------------------------------------ readers

    def _opened(self, ev: Opened) -> None:
        places: list[int] = []
        staged: list[ReaderAnswer] = []
        self._reader_steps((ev.entry,), places, staged)
        if places:
            self._out.append(Place(places[0]))
        answer = staged[0]
        if isinstance(answer, UsePages | UseHeld):
            self._out.append(answer)

    def _caught(self) -> None:
        """A reader opened a file the window has not staged yet (its stage in flight or not started).

        The window stages at most ``stage_limit`` / (time per stage) files a second, and a PFS whose
        opens take milliseconds needs hundreds in flight for the readers' pace; no fixed number fits
        every PFS and node.  So when readers catch the window while the limit held stages back, the
        limit grows by ``stage_threads``, up to ``stage_max``; once more, only after half a step's stages
        ended since it last changed (the new slots' effect begins to show).  Lowered by
        :meth:`_tick`.  Memory does not grow with it: the window's bytes stay within ``staging_limit``
        and every stage reserves its bytes before it starts.
        """
        self.caught_opens += 1
        self._caught_since_tick += 1
        if (
            self._held_back
            and self.stage_limit < self.stage_ceiling
            and self._done_since_change >= self.settings.stage_threads // 2
        ):
            self._set_stage_limit(min(self.stage_ceiling, self.stage_limit + self.settings.stage_threads))

    def _set_stage_limit(self, limit: int) -> None:
        self.stage_limit = limit
        self.stage_limit_max = max(self.stage_limit_max, limit)
        self._held_back = False
        self._done_since_change = 0
        self._out.append(StageSlots(limit))

    def lean(self) -> bool:
        """Whether :meth:`readers` may stand in for :meth:`handle`: no step is logged or validated,
        and no instruction waits in the outbox (a reclaim outside a step leaves its drops there for
        the next step to carry out, in its order)."""
        return self._log is None and not self.settings.validate and not self._out

    def readers(self, ops: Sequence[int], places: list[int], staged: list[ReaderAnswer]) -> None:
        """A run of readers' opens (``entry``), releases (``~entry``) and visits (``entry | VISIT``),
        in order: exactly what :meth:`handle` of ``Opened``/``Released`` does for each (the same
        state changes, one step each, two for a visit), without an event, an instruction list or a
        dispatch per step.  Only when :meth:`lean`.  Appends each open's Place gid (planned opens
        only) to ``places`` and, per op, its :data:`ReaderAnswer` to ``staged``.  Other
        instructions these steps decide (a release's CancelStage, an open that caught the window's
        StageSlots) stay in the outbox: :meth:`drain` them after.
        Neither step ever decides a Fill or Stage (``followed`` unchanged), reserves bytes (no
        reclaim inside), or logs."""
        self._busy = True
        try:
            visits = self._reader_steps(ops, places, staged)
        finally:
            self._busy = False
            self.steps += len(ops)
        self.steps += visits

    def _reader_steps(self, ops: Sequence[int], places: list[int], staged: list[ReaderAnswer]) -> int:
        """The state changes of :meth:`readers` (and of one ``Opened`` step, :meth:`_opened`).

        An open counts for the fills' credit and the tick, marks the group rule used while no plan
        predicts, is placed for the cursor (or counted unplanned) and takes what is staged or kept
        for it; a release retires the file (:meth:`_retire`, rule 4: what its room allows starts at
        the next view).  A visit is both; when its file's pages are kept and nothing else holds it
        (the warm open), their net effect is done directly: the file moves to the end of ``kept``
        (taken, then kept again at its release) and counts as reused.  The run's invariants are
        read once: the plan's gids and the mode change only on other events.  Returns how many
        visits there were (each is two steps)."""
        gids = self.entry_gid
        planned = gids.shape[0]
        unplaced = self._unplaced
        since_view = self._opened_since_view
        kept = self.kept
        pages = self.pages
        predicting = self.mode == "predicting"
        due = self.view.due
        take = self._take
        retire = self._retire
        kept_unused = self._kept_unused
        credit, cap = self._fill_credit, self._fill_credit_cap  # not read in the loop (see finally)
        opened = unplanned = visits = reused = 0
        try:
            for op in ops:
                if op >= 0:
                    visit = op >= VISIT
                    if visit:
                        op -= VISIT
                        visits += 1
                    opened += 1
                    gid: int = gids.item(op) if op < planned else -1
                    if gid < 0:
                        unplanned += 1
                    else:
                        places.append(gid)
                        unplaced[op] = unplaced.get(op, 0) + 1
                        since_view.add(op)
                    p = pages.get(op)
                    if visit and p is None:
                        charge = kept.pop(op, None)
                        if charge is not None:  # kept pages: _take, then _retire, their net effect
                            kept[op] = charge
                            kept_unused.discard(op)
                            reused += 1
                            staged.append((UsePages(op), True))
                            continue
                    caught = (p is not None and p.state == "fetching") or (
                        p is None and predicting and op in due and op not in kept
                    )
                    answer = take(op)
                    if caught:
                        self._caught()
                    if visit:
                        retire(op)
                        staged.append((answer, op in kept))
                    else:
                        staged.append(answer)
                else:
                    retire(~op)
                    staged.append(~op in kept)  # in_page_cache: retire() took it out of self.pages
        finally:
            if opened:  # each open adds FILL_PER_OPEN up to the cap (in one sum: the same, exactly)
                if credit == math.inf:
                    credit = 0.0  # readers started: fills keep pace with them from now on
                self._fill_credit = min(credit + FILL_PER_OPEN * opened, cap)
            self.reused += reused
            self._opens_since_tick += opened
            self.unplanned_opens += unplanned
            if opened and self.group_owner is not None and self.mode != "predicting":
                self.ruled = True
        return visits

    def _take(self, entry: int) -> UsePages | UseHeld | None:
        """What an open of ``entry`` can use: staged pages or bytes, or pages kept from an earlier read."""
        p = self.pages.get(entry)
        if p is not None:
            if p.state == "reading":
                return None  # open by another reader, who pulls its pages through the mount
            # An open racing its file's push or fetch: its reads fill the page cache with the same
            # bytes, so the file counts as taken: kept at its release, and a push that ends after
            # that must not drop the pages.  Still being fetched, the open awaits that fetch; being
            # pushed, it is served the bytes on their way to the kernel.
            p.taken = True
            if p.state == "fetching":
                return None
            if p.state == "pushed":
                return UsePages(entry)
            assert p.data is not None
            return UseHeld(entry, p.data)
        charge = self.kept.pop(entry, None)
        if charge is None:
            return None
        self.kept_bytes -= charge
        self.cached_bytes += charge
        self.reused += 1
        self._kept_unused.discard(entry)
        self.pages[entry] = Pages(charge, "reading", taken=True)
        return UsePages(entry)

    def _read_through(self, ev: ReadThrough) -> None:
        """Charge the pages a reader pulls through the mount; no room: it must bypass the page cache
        (direct_io), since a read is never refused and the budget is never exceeded."""
        if ev.entry in self.pages:
            return
        charge = self.kept.pop(ev.entry, None)
        if charge is not None:
            # Charged already: another reader of the file, who opened it after this one, released it
            # meanwhile and its pages were kept.  They are this reader's pages again (kept at its
            # release), not charged twice (validate() after each step found that double charge).
            self.kept_bytes -= charge
            self._kept_unused.discard(ev.entry)
            self.cached_bytes += charge
            self.pages[ev.entry] = Pages(charge, "reading", taken=True)
            return
        if not self._reserve(ev.nbytes, due=-1):
            self.uncached_opens += 1
            self._out.append(Bypass(ev.entry))
            return
        self.pages[ev.entry] = Pages(ev.nbytes, "reading")
        self.cached_bytes += ev.nbytes

    def _missed(self, ev: Missed) -> None:
        """Where a file fetched on demand should also be kept (plan's tier, or the reactive policy)."""
        if self.mode == "predicting":
            t = self.planned_tier(ev.entry)
            if t is not None and not self.tiers[t].contains(ev.entry):
                self._out.append(KeepIn(ev.entry, t))
            return
        tier = self._reactive_keep(ev.entry, ev.nbytes)
        if tier is not None:
            self._out.append(KeepIn(ev.entry, tier))

    def _released(self, ev: Released) -> None:
        """Retired at once; what its room allows starts at the next view (rule 4), not here.

        Every open comes here, and a pump per release (the window's walk, the fills' gates, the
        lane) cost the trio thread about 25 us per open; the executor's cursor loop publishes a
        view at its next turn (10-30 ms later), and that pump starts what all of them made room for."""
        self._retire(ev.entry)

    # ------------------------------------------------------------------ the staging window

    def _sweep(self) -> None:
        """Once per new horizon: retire staged files that left it (rule 3).  A file an open already
        took is retired at its release, never here: its reader may still be reading the pages."""
        if self.mode != "predicting" or self.view.due is self._swept_for:
            return
        horizon = self._swept_for = self.view.due
        for entry in [e for e, p in self.pages.items() if p.staged and not p.taken and e not in horizon]:
            self._retire(entry)

    def _pump(self) -> None:
        """Start what may start now: stages in order of the stage list, then tier fills and the next
        epoch's pages.  The lane's releases are taken once, before the window's walk (see
        :meth:`_live_lane`)."""
        lane = self._live_lane()
        self._pump_staging(lane)
        self._pump_fill()
        self._pump_lane(lane)

    def _pump_staging(self, lane: _NextRun | None) -> None:
        """Stage the window's next files, resuming where the walk over this stage list stopped.

        Runs on most events, so nothing here rescans the window: the walk keeps its position until
        a new stage list comes, and an entry passed once (staged, in flight, opened, held) is never
        revisited for that list.  No room: stop, and wait for consumption to free some (never skip
        to a later, smaller file, and never evict a file due sooner).  The next epoch's files the
        lane has not released yet are left to it: it releases them spread over this epoch, and
        staged as soon as they entered the horizon they were a burst of peer fetches at its start.
        Once released (or once the lane ends) the window may stage them as any other, so a lane
        with no room of its own, or pages of its files reclaimed, never leaves a file unstaged.
        """
        if self.mode != "predicting":
            return
        leave = lane.unreleased if lane is not None else ()
        stage = self.view.stage
        if stage is not self._stage_of:
            self._stage_of, self._stage_pos = stage, 0
        due = self.view.due
        while self._stage_pos < len(stage):
            if len(self._staging_now) >= self.stage_limit:
                self._held_back = True
                return
            entry = stage[self._stage_pos]
            # Opened already (since the horizon was computed), staged, open or kept, or the lane's: skip.
            if entry in self._opened_since_view or entry in self.pages or entry in self.kept or entry in leave:
                self._stage_pos += 1
                continue
            if entry in self._staging_now:
                return  # retired while its push is in flight: stage it again once that push ended
            nbytes = int(self.sizes[entry])
            if self.staged_bytes + nbytes > self.staging_limit or not self._reserve(nbytes, due.get(entry, -1)):
                return
            self._stage_pos += 1
            self.pages[entry] = Pages(nbytes, "fetching")
            self.staged_bytes += nbytes
            self._staging_now.add(entry)
            self._peak = max(self._peak, len(self._staging_now))
            local = next((t for t, tier in enumerate(self.tiers) if tier.contains(entry)), None)
            self._out.append(Stage(entry, local, None if local is not None else self.planned_tier(entry)))

    def _stage_fetched(self, ev: StageFetched) -> None:
        entry = ev.entry
        self._done_since_change += 1
        p = self.pages.get(entry)
        if p is None or p.state != "fetching":
            # Retired or cancelled meanwhile (its charge went with it); a push of it may be in flight.
            if entry not in self._pushing:
                self._staging_now.discard(entry)
            self._pump()
            return
        if ev.data is None or p.taken:
            # Failed: give the reservation back.  Taken: a reader opened it before its bytes came
            # and its reads put the pages in the cache; they are that reader's now, not the window's.
            self._staging_now.discard(entry)
            self.staged_bytes -= p.nbytes
            if p.taken:
                p.state = "reading"
                self.cached_bytes += p.nbytes
            else:
                del self.pages[entry]
                self.budget.release(p.nbytes)
        elif self.settings.staging_mode == "memory":
            self._staging_now.discard(entry)
            p.state, p.data = "held", ev.data
        else:
            p.state, p.data = "pushing", ev.data
            self._pushing[entry] = p
            self._out.append(Push(entry, ev.data))
            return  # the slot stays busy until the push ends
        self._pump()

    def _pushed(self, ev: Pushed) -> None:
        entry = ev.entry
        self._staging_now.discard(entry)
        p = self._pushing.pop(entry, None)
        if p is None:
            return
        if ev.ok:
            p.state, p.data = "pushed", None
        else:
            p.state = "held"  # the kernel does not know the inode (no lookup yet): serve from RAM
        current = self.pages.get(entry)
        if current is not p and not (p.taken and (current is not None or entry in self.kept)):
            # Retired while we pushed: drop the pages just stored.  Not when a reader took it
            # meanwhile: it read the same bytes through the mount, and its release kept them.
            if ev.ok:
                self._out.append(DropPages(entry, 0))
        elif ev.ok and current is p and not p.taken and self.mode == "reactive":
            self._retire(entry)  # staged for a plan no longer followed: kept (see _settle_window)
        self._pump()

    def _retire(self, entry: int) -> None:
        """``entry`` was consumed or left the horizon: keep its pages while the budget allows, free its RAM."""
        p = self.pages.pop(entry, None)
        if p is None:
            return
        state = p.state
        staged = state != "reading"
        if staged:
            self.staged_bytes -= p.nbytes
            if state == "fetching":
                self._staging_now.discard(entry)
                self._out.append(CancelStage(entry))
        else:
            self.cached_bytes -= p.nbytes
        if state != "pushing":
            p.data = None  # a push in flight still needs its bytes if the kernel refuses them
        if state == "pushed" or p.taken or not staged:  # its pages are in the page cache
            self.kept[entry] = p.nbytes
            self.kept_bytes += p.nbytes
            if not p.taken:
                self._kept_unused.add(entry)  # an open may still use them; counted unused if dropped first
        else:  # never opened and not in the page cache (or a push in flight, undone when it ends)
            self.budget.release(p.nbytes)
            self.unused += 1

    def _settle_window(self) -> None:
        """No plan is followed now: stage nothing more, but lose nothing the window holds.

        Staged files are fetched already (the PFS was read for them), and a reader may well open
        them soon (one node's readers read most of the dataset every epoch, in whatever order):
        pushed ones become kept pages, which opens are served from and the budget reclaims first
        when it needs room; stages and pushes in flight complete and are kept the same way when
        they end (:meth:`_pushed`); bytes held in RAM (memory staging, a refused push) stay until
        an open takes them or :meth:`reclaim` needs their room.
        """
        for entry in [e for e, p in self.pages.items() if p.state == "pushed" and not p.taken]:
            self._retire(entry)
        self._stage_of, self._stage_pos = None, 0

    def _drop_kept(self, entry: int) -> int:
        charge = self.kept.pop(entry)
        self.kept_bytes -= charge
        if entry in self._kept_unused:
            self._kept_unused.discard(entry)
            self.unused += 1
        return charge

    # ------------------------------------------------------------------ the budget

    def _reserve(self, nbytes: int, due: int) -> bool:
        """Charge ``nbytes`` for a file due at horizon position ``due`` (-1: now, a reader's).

        When the budget is full it asks :meth:`reclaim`, which then spares pages due before ``due``.
        """
        self._due_for = due
        try:
            return self.budget.try_reserve(nbytes)
        finally:
            self._due_for = None

    def reclaim(self, need: int) -> int:
        """Budget callback: drop kept pages until ``need`` bytes are free; returns the bytes freed.

        THE one way into the policy that is not an event through :meth:`handle`, and the one
        re-entrant path: the budget calls it from inside whatever reserves bytes, which is either
        this policy's own step (the window's reservation, a reader's pages) or a memory-tier put
        outside any step.  It cannot be an event: the reservation needs its answer (the bytes
        freed) synchronously, in the middle of that step or put, and a step cannot start another.
        Inside a step its drops join that step's instructions (and its log entry); outside one
        they wait in the outbox for :meth:`drain`, and the log records a :class:`Reclaimed` step.
        """
        start = len(self._out)
        freed = self._reclaim(need)
        if freed and not self._busy:
            self._record(Reclaimed(need, freed), self._out[start:])
        return freed

    def _reclaim(self, need: int) -> int:
        """Pages outside the horizon go first, oldest first, then the horizon's, furthest due first.
        For the window's own reservation only pages due after the file being staged may go (rule
        2); for a reader's, or a memory-tier put's, any may.  All or nothing: when the pages that
        may go do not free ``need`` bytes the reservation fails anyway, so none is dropped.  The
        drops are queued in the outbox (the result of the :meth:`handle` call under way, else
        :meth:`drain`).
        """
        horizon = self.view.due if self.mode == "predicting" else {}
        due = self._due_for
        victims: list[int] = []
        protected: list[int] = []
        freed = 0
        # Bytes held for a plan no longer followed (memory staging, a refused push) go first: they
        # are the window of no horizon, kept only in case a reader still opens them.
        orphans = []
        if self.mode == "reactive":
            orphans = [e for e, p in self.pages.items() if p.state == "held" and not p.taken]
        for entry in orphans:
            if freed >= need:
                break
            victims.append(entry)
            freed += self.pages[entry].nbytes
        for entry, charge in self.kept.items():
            if freed >= need:
                break
            if entry in horizon:
                protected.append(entry)
            else:
                victims.append(entry)
                freed += charge
        if freed < need and protected:  # every kept page was looked at: protected lists them all
            protected.sort(key=horizon.__getitem__, reverse=True)
            for entry in protected:
                if freed >= need or (due is not None and horizon[entry] <= due):
                    break
                victims.append(entry)
                freed += self.kept[entry]
        if freed < need:
            return 0
        for entry in victims:
            held = self.pages.get(entry)
            if held is not None:  # an orphan held in RAM: no pages to drop
                del self.pages[entry]
                held.data = None
                self.staged_bytes -= held.nbytes
                self.budget.release(held.nbytes)
                self.unused += 1
                continue
            charge = self._drop_kept(entry)
            self.budget.release(charge)
            self._out.append(DropPages(entry, charge))
        return freed

    # ------------------------------------------------------------------ long-term tiers

    def _adopt_into_reactive(self) -> None:
        """Files kept under a plan that turned out wrong now count against the reactive policy, as far
        as its capacities go.

        Copies beyond them stay where they are, outside its accounting, and are never dropped to make
        room: one the wrong plan's fill read may be the group's only copy (its rule owner has not read
        it), and dropping it would cost a second PFS read when that owner needs it (:meth:`holders`
        finds it here instead).  The tier's own byte budget still bounds what it holds: a file the
        reactive policy would keep and that finds no room there is simply not kept.
        """
        for t, tier in enumerate(self.tiers):
            for entry in tier.entries():
                rset = self._reactive_for(entry)
                if entry in rset.where:
                    continue
                size = tier.size_of(entry)
                if size is not None and rset.tiers[t].used + size <= rset.tiers[t].capacity:
                    rset.admitted(entry, t, size)

    def _start_fill(self) -> None:
        """Once per plan, as soon as this node is known: its assigned files in order of first use."""
        plan, view = self.plan, self.view
        if plan is None or view.node is None or view.state not in ("tracking", "presumed"):
            return
        node = view.node
        objs, _due = plan.fill_order(node)
        objs64 = objs.astype(np.int64)
        self.filled_node = node
        self._fill = _FillRun(
            node,
            plan.objects.obj_entry[objs64].astype(np.int64),
            plan.node_tiers(node)[objs64].astype(np.int64),
            plan.owner_obj[objs64].astype(np.int64),
            _due.astype(np.int64),
        )

    def _pump_fill(self) -> None:
        """Fill tiers while no stage is in flight (staging first: the readers need that bandwidth now).

        Files this node owns come from the PFS (it is their one PFS reader); replicas of files
        other nodes own come only from their owner, and wait for a later pass while it cannot
        serve them (or is down).  Under a mismatch a fill goes only into room the reactive policy
        has, and is counted there: a fill the tier would refuse is a PFS read for nothing.

        While readers read, fills keep pace with them: at most ``FILL_PER_OPEN`` start per open this
        node serves (a credit that opens add to and fills spend, held to one round of fill slots),
        and at full speed once a tick passes with no open.  A fill is for a later epoch (the
        window stages what is due sooner), and every fill costs this daemon and the peer serving
        it CPU that readers' opens wait on: at full speed the fills a group left for after epoch 0
        ran in a burst at the start of epoch 1 and made it 1.13-1.18x its compute-only time on two
        nodes (tools/bench/train --nodes 2).  For the same reason, while readers read, a fill due
        after the next epoch waits until that epoch is the next one: each epoch then carries only
        the transfers the next one needs (about 500 of 2,000 files per node in epoch 1 of the
        two-node benchmark, not all 800 still missing), and the rest run when readers stop.

        Nor do fills start while this node's ranks are in the first ``loader_start`` positions of
        their epoch (at most a quarter of it): every epoch begins with fresh DataLoader workers
        reading their first batches one file after another while the ranks wait, and the burst of
        opens then earned a burst of fills (about 100 peer transfers in 250 ms per node on two
        nodes) that took the trio thread those opens were waiting on.  The credit stays, capped, for
        when the readers are past it.
        """
        run = self._fill
        if run is None or run.waiting or self._staging_now:
            return
        if self._fill_credit != math.inf and self.mode == "predicting" and self._loaders_starting():
            return  # fills wait for the readers' first batches (their opens pump again)
        reactive = self.mode == "reactive"
        n = run.entries.shape[0]
        # Only a followed plan's epochs say what is due when (under a mismatch the view's epoch is not
        # the readers'): there, while readers read, the pass stops at the first file due after the
        # next epoch (they are in order of due position) until the readers get there, or stop.
        until = self._fill_until() if self._fill_credit != math.inf and self.mode == "predicting" else None
        rest = n
        while run.pos < n:
            if until is not None and int(run.due[run.pos]) >= until:
                rest = run.pos
                break
            entry, t, owner = int(run.entries[run.pos]), int(run.tiers[run.pos]), int(run.owners[run.pos])
            if not 0 <= t < len(self.tiers) or self.tiers[t].contains(entry):
                run.pos += 1
                continue
            if reactive:
                size = int(self.sizes[entry])
                room = self.reactive.tiers[t]
                if entry in self.reactive.where or room.used + size > room.capacity:
                    run.pos += 1  # kept elsewhere already, or no room left for it
                    continue
            if owner != run.node and owner in self.peers_down:
                run.later.append(run.pos)
                run.pos += 1
                continue
            if self._fill_busy[t] >= self.fill_threads[t] or self._fill_credit < 1:
                return  # in order: wait for this tier's slot, or for the readers to get ahead
            self._fill_credit -= 1
            self._fill_busy[t] += 1
            run.inflight[entry] = run.pos
            run.pos += 1
            if reactive:
                self.reactive.admitted(entry, t, int(self.sizes[entry]))  # its room, until the fill ends
            self._out.append(Fill(entry, t, self._fill_reads_pfs(entry, owner, run.node), self.generation))
        if run.later and not run.inflight:
            # The pass is over, or waits at the gate above: after a pause, try the replicas whose
            # owners could not serve them, followed by what the gate held back.  Positions sorted:
            # ``later`` is in completion order, and the gate needs the pass in order of due position.
            keep = np.sort(np.asarray(run.later + list(range(rest, n)), dtype=np.int64))
            run.entries, run.tiers, run.owners = run.entries[keep], run.tiers[keep], run.owners[keep]
            run.due = run.due[keep]
            run.pos, run.later, run.waiting = 0, [], True
            self._out.append(RetryFillLater(FILL_RETRY_SECONDS, self.generation))

    def _fill_until(self) -> int | None:
        """While readers read: the node position where the epoch after next begins (fills due from
        there on wait), or None when the plan has no such epoch (it ends before; nothing waits)."""
        epoch = self.view.epoch + 2
        if self._fill_until_for is None or self._fill_until_for[0] != epoch:
            seg = self.plan.segments(epoch) if self.plan is not None else []
            self._fill_until_for = (epoch, seg[0].start if seg else None)
        return self._fill_until_for[1]

    def _fill_done(self, ev: FillDone) -> None:
        if 0 <= ev.tier < len(self._fill_busy) and self._fill_busy[ev.tier] > 0:
            self._fill_busy[ev.tier] -= 1
        run = self._fill
        if run is not None and ev.generation == self.generation:
            pos = run.inflight.pop(ev.entry, None)
            if ev.outcome == "later" and pos is not None:
                run.later.append(pos)
        counted = self.reactive.where.get(ev.entry) == ev.tier
        if ev.outcome == "stored" and not counted and self.mode == "reactive":
            self.reactive.admitted(ev.entry, ev.tier, int(self.sizes[ev.entry]))  # begun under the plan
        elif ev.outcome != "stored" and counted and not self.tiers[ev.tier].contains(ev.entry):
            self.reactive.dropped(ev.entry)  # the room taken for it is free again
        self._pump_fill()

    def _fill_retry(self, ev: FillRetry) -> None:
        if self._fill is not None and ev.generation == self.generation:
            self._fill.waiting = False
            self._pump_fill()

    def _read_from_pfs(self, ev: ReadFromPfs) -> None:
        if 0 <= ev.entry < self.from_pfs.shape[0]:
            self.from_pfs[ev.entry] = True

    def _pinned(self, entry: int) -> bool:
        """A copy the reactive set of files this node does not own may not drop: one it read from the
        PFS itself, in a group.

        Each regime (a presumed plan, the group rule, a plan found later) names one PFS reader per
        file, and the readers of later regimes ask the earlier ones before they read the PFS
        (:meth:`holders`).  A copy this node read from the PFS under an earlier regime is then the
        group's only one until the file's current owner has asked for it, and the static frequency
        set would otherwise let it make way for a copy fetched from a peer, which another member
        holds anyway: dropping it cost a second PFS read of that file (seen with a wrong seed on
        two nodes).  Pinned, it stays, and the set admits fewer peer copies: a peer transfer more,
        never a PFS read more.  Its owner's set (reactive_owned) keeps the usual rule: there it is
        the designated copy, sized to hold every owned file while the budgets allow.
        """
        return self.group_owner is not None and bool(self.from_pfs[entry])

    def _pins(self, rset: StaticFrequencySet) -> Callable[[int], bool] | None:
        """What ``rset`` may not drop: :meth:`_pinned` for the set of files others own, nothing for the owned one."""
        return self._pinned if rset is self.reactive else None

    def _copy_lost(self, ev: CopyLost) -> None:
        for rset in (self.reactive, self.reactive_owned):
            if rset.where.get(ev.entry) == ev.tier:
                rset.dropped(ev.entry)

    def _source_changed(self, ev: SourceChanged) -> None:
        """Forget every copy of the file here (the revalidator drops the tiers' copies itself); its
        pages are always invalidated, since a reader may have left some that nothing recorded."""
        entry = ev.entry
        self._forget_next(entry)
        p = self.pages.pop(entry, None)
        if p is not None:
            if p.staged:
                self.staged_bytes -= p.nbytes
                if p.state == "fetching":
                    self._staging_now.discard(entry)
                    self._out.append(CancelStage(entry))
            else:
                self.cached_bytes -= p.nbytes
            p.data = None
            self.budget.release(p.nbytes)
        charge = self._drop_kept(entry) if entry in self.kept else None
        if charge is not None:
            self.budget.release(charge)
        self._out.append(DropPages(entry, charge or 0))
        self._pump()

    def _peer_down(self, ev: PeerDown) -> None:
        self.peers_down.add(ev.node)

    def _peer_up(self, ev: PeerUp) -> None:
        self.peers_down.discard(ev.node)
        self._pump_fill()

    def _tick(self, ev: Tick) -> None:
        if not self._opens_since_tick:
            self._fill_credit = math.inf  # no open for a tick: readers idle, fills at full speed
        self._opens_since_tick = 0
        # The window stayed ahead for a tick (no open caught it) and never used the limit's top step:
        # give that step back (fewer PFS threads), one step a tick, never below where it started.
        step = self.settings.stage_threads
        if not self._caught_since_tick and self.stage_limit > step and self._peak <= self.stage_limit - step:
            self._set_stage_limit(max(step, self.stage_limit - step))
        self._caught_since_tick = 0
        self._peak = len(self._staging_now)
        self._pump()

    # ------------------------------------------------------------------ the group's owners (no trusted plan)

    def _group_changed(self, ev: GroupChanged) -> None:
        """New members: each file's owner under the group rule, and the reactive capacity owned files get.

        Alone, nothing changes: the reactive policy keeps what a node alone would.  With others, the
        files this node owns come first: their reactive set may take each tier's capacity up to the
        owned files' bytes (fastest tier first), and the files others own get what is left.  So,
        while the group's tiers hold the dataset, every owner keeps what it owns and no file needs
        a second PFS read; copies of other owners' files take only the room left over.
        """
        self.group_seeds, self.group_me = tuple(ev.seeds), ev.me
        if len(ev.seeds) < 2:
            self.group_owner = None
        else:
            self.group_owner = owners(np.arange(self.sizes.shape[0], dtype=np.int64), ev.seeds).astype(np.int16)
        self._split_reactive()

    def owns(self, entry: int) -> bool:
        """Whether this node reads ``entry`` from the PFS under the group rule (always, when alone)."""
        g = self.group_owner
        return g is None or not 0 <= entry < g.shape[0] or int(g[entry]) == self.group_me

    def reactive_owner(self, entry: int) -> int | None:
        """The group member to ask for ``entry`` under the group rule; None when this node reads it
        itself (it owns it, or is alone)."""
        if self.owns(entry):
            return None
        assert self.group_owner is not None
        return int(self.group_owner[entry])

    def holders(self, entry: int) -> list[Holder]:
        """Members that may hold ``entry`` from an earlier regime, to ask (for a copy they hold, never
        a PFS read) before this node or the file's current owner reads it from the PFS.

        Each regime (a plan, the group rule) names one PFS reader per file, and a change of regime
        changes them: a wrong seed's plan presumed before any open had its owners fill and stage
        files, the group rule that takes over names other owners, and the plan of the seed found
        later names others again.  Each reader keeps what it read (a mismatch drops nothing), so
        whoever reads a file next asks the readers of the earlier regimes first, newest first: the
        current plan's owner once that plan was followed, the rule's owner when the group ran by the
        rule, the owners of plans followed before.  The current plan's owner is listed while this
        node still predicts, too: a member whose readers refuted the plan a moment earlier left it
        (it follows the rule, and this node's owner request went to the rule's owner), yet keeps
        what it read for the plan (seen: a presumed wrong plan's fill read twice, the second time by
        the other node just before its own cursor saw the mismatch).  The caller resolves each to a
        member and skips itself and whom it asked already, so a group with one regime asks nobody
        more: the plan's owner was asked as the owner, or is this node.
        """
        out: list[Holder] = []
        plan = self.plan
        if plan is not None and self.followed and entry < self.entry_gid.shape[0]:
            gid = int(self.entry_gid[entry])
            node = int(plan.owner()[gid]) if gid >= 0 else -1
            if node >= 0:
                out.append(PlanHolder(plan.digest, node))
        if self.ruled and self.group_owner is not None and 0 <= entry < self.group_owner.shape[0]:
            out.append(RuleHolder(int(self.group_owner[entry])))
        for digest, owner_of in reversed(self.past_owners):
            if 0 <= entry < owner_of.shape[0] and owner_of[entry] >= 0:
                out.append(PlanHolder(digest, int(owner_of[entry])))
        return out

    def _remember_owners(self) -> None:
        """The outgoing plan, if it was followed: its owner per entry (for :meth:`holders`)."""
        plan = self.plan
        if plan is None or not self.followed or self.group_owner is None:
            return
        owner_of = np.full(self.sizes.shape[0], -1, np.int16)
        placed = self.entry_gid >= 0
        owner_of[placed] = plan.owner()[self.entry_gid[placed].astype(np.int64)]
        self.past_owners = [p for p in self.past_owners if p[0] != plan.digest][-(PAST_PLANS - 1) :]
        self.past_owners.append((plan.digest, owner_of))

    def _reactive_for(self, entry: int) -> StaticFrequencySet:
        g = self.group_owner
        return self.reactive_owned if g is not None and self.owns(entry) else self.reactive

    def _split_reactive(self) -> None:
        """Rebuild both reactive sets for the current owners, carrying every admitted copy and read count."""
        caps = list(self.settings.reactive_capacities or [0] * len(self.tiers))
        left = int(self.sizes[self.group_owner == self.group_me].sum()) if self.group_owner is not None else 0
        mine: list[int] = []
        rest: list[int] = []
        for cap in caps:
            take = min(cap, left)
            left -= take
            mine.append(take)
            rest.append(cap - take)
        old = (self.reactive, self.reactive_owned)
        self.reactive, self.reactive_owned = StaticFrequencySet(rest), StaticFrequencySet(mine)
        for rset in old:
            for entry, reads in rset.reads.items():
                new = self._reactive_for(entry)
                new.reads[entry] = reads
                new.last_read[entry] = rset.last_read.get(entry, 0)
                new.clock = max(new.clock, rset.clock)
            for entry, t in rset.where.items():
                self._reactive_for(entry).admitted(entry, t, rset.tiers[t].members[entry])
        self._trim_reactive()

    def _trim_reactive(self) -> None:
        """Drop copies past either reactive set's capacity (most recently admitted last to go), never
        a pinned one (it then stays, over the capacity, and the set admits nothing more there)."""
        for rset in (self.reactive, self.reactive_owned):
            pinned = self._pins(rset)
            for t, rtier in enumerate(rset.tiers):
                excess = rtier.used - rtier.capacity
                for entry in list(rtier.members):
                    if excess <= 0:
                        break
                    if pinned is not None and pinned(entry):
                        continue
                    excess -= rtier.members[entry]
                    self._out.append(DropCopy(entry, t))
                    rset.dropped(entry)

    def _reactive_keep(self, entry: int, nbytes: int) -> int | None:
        """The reactive decision for a file read here: evictions are queued, the tier (or None) returned."""
        rset = self._reactive_for(entry)
        decision = rset.on_read(entry, nbytes, self._pins(rset))
        for t, victim in decision.evict:
            self._out.append(DropCopy(victim, t))
            rset.dropped(victim)
        if decision.tier is not None:
            rset.admitted(entry, decision.tier, nbytes)
        return decision.tier

    def _peer_asked(self, ev: PeerAsked) -> None:
        """Read a file from the PFS for a peer only as its one owner: the plan's (a request naming the
        plan, or this node predicting) or the group rule's (a request naming the file alone)."""
        entry = ev.entry
        if ev.by_plan or self.mode == "predicting":
            t = self.planned_tier(entry)
            if t is not None:
                self._out.append(FetchForPeer(entry, t))
                return
            if ev.by_plan:
                return
        if self.group_owner is None or not self.owns(entry):
            return
        if self.mode != "predicting":
            self.ruled = True
        keep = None if self.mode == "predicting" else self._reactive_keep(entry, ev.nbytes)
        self._out.append(FetchForPeer(entry, keep))

    def _fill_reads_pfs(self, entry: int, owner: int, node: int) -> bool:
        """Whether a fill reads ``entry`` from the PFS here: as the plan's owner while the plan is
        trusted; otherwise as the group rule's owner, which the other nodes now ask for it."""
        if self.mode == "predicting" or self.group_owner is None:
            return owner == node
        return self.owns(entry)

    # ------------------------------------------------------------------ the next epoch's pages

    def _next_epoch(self, ev: NextEpoch) -> None:
        if ev.generation != self.generation:
            return
        order = np.argsort(ev.ready_at, kind="stable").astype(np.int64)
        run = _NextRun(ev.generation, ev.node, ev.epoch, ev.entries, ev.ready_at, order, ev.first_read)
        run.unreleased = set(ev.entries.tolist())
        if ev.epoch > self.view.epoch + 1:
            # Computed an epoch ahead: it takes over when its epoch is next, so the window never
            # stages its files in the moments the executor would take to compute it then.
            self._lane_after = run
            return
        self._lane = run
        self._pump()

    def _rank_lows(self, epoch: int) -> list[int]:
        """Where each of this node's ranks in job epoch ``epoch`` is, from the cursor's view."""
        status = self.view.status
        positions = status["rank_positions"] if status is not None else {}
        return [int(low) for job_epoch, low in positions.values() if job_epoch == epoch]

    def _loaders_starting(self) -> bool:
        """This node's ranks are in the first ``_fill_hold`` positions of the view's epoch.  False
        while no rank is known to be in it: a hold that nothing can end would stop fills for good."""
        lows = self._rank_lows(self.view.epoch)
        return bool(lows) and min(lows) < self._fill_hold

    def _lane_position(self, epoch: int) -> int:
        """How far this node's ranks got in job epoch ``epoch`` (the slowest one), from the cursor's view."""
        return min(self._rank_lows(epoch), default=0)

    def _pump_lane(self, lane: _NextRun | None) -> None:
        """Push the next epoch's files this node does not hold into the page cache before it starts.

        In a group each node reads this epoch only its share of the files; the rest of what it
        reads next epoch is on the peers that read it now.  Those are fetched as their holders get
        them (``ready_at``, from the plan) from a local disk tier or that peer, never from the PFS: a file
        nobody holds yet is the window's, fetched in order of use (rule 1), and the next epoch's
        first files are due right after this one's last.  The lane takes only the budget's room
        beyond what the window may still take (the window never waits for it) and its own few
        slots, goes in the next epoch's order among the files released so far (waiting for room
        rather than skipping to a later file), and each file it pushed counts as a kept page.  Files
        their holders have from this epoch's start are released over its first three quarters
        (:data:`placement.nextepoch.SPREAD`), not at once, and the window leaves the files the lane
        has not released yet to it: together they made a burst of about a thousand peer fetches per
        node at the start of epoch 1 on two nodes, which the readers' opens waited behind.

        Files in a memory tier here are left out, as the window leaves them out
        (:meth:`stage_list`): an open serves them from RAM.  Pushing them ahead only moved that
        copy into the epoch before, in a burst: 500 such pushes per node made epoch 1 of two nodes
        4-8% slower (tools/bench/train --nodes 2), while serving them at their opens in epoch 2
        cost nothing measurable there.  Except in a lane from an epoch in which the job reads a
        dataset for the first time (``first_read``): its readers wait on the PFS, so the copy
        costs nobody's time there, and the next epoch's opens, the first batches of which read
        the memory tier's earliest-due copies, find every file in the page cache.
        """
        if lane is None:
            return
        while lane.heap and len(self.next_pages) < self.settings.next_threads:
            entry = int(lane.entries[lane.heap[0]])
            if (
                entry in self.kept
                or entry in self.pages
                or entry in self.next_pages
                or entry in self._staging_now
                or (not lane.first_read and any(t.contains(entry) for t in self.memory_tiers))
            ):
                heapq.heappop(lane.heap)
                continue
            nbytes = int(self.sizes[entry])
            spare = self.budget.limit - self.budget.used - max(0, self.staging_limit - self.staged_bytes)
            if nbytes > spare or not self.budget.try_reserve(nbytes):
                return
            heapq.heappop(lane.heap)
            self.next_pages[entry] = Pages(nbytes, "fetching")
            self.next_bytes += nbytes
            local = next((t for t, tier in enumerate(self.tiers) if tier.contains(entry)), None)
            self._out.append(StageNext(entry, local, None if local is not None else self.planned_tier(entry)))

    def _live_lane(self) -> _NextRun | None:
        """The lane, with the files its readers' progress released, while its epoch is next and its
        plan followed; else None, and the window walks its stage list again from the start, now
        taking the files it left to the lane.  Runs before the window's walk: a file released now
        that the walk has not passed yet is the window's to stage too in the same step (the lane may
        have no room for it)."""
        lane = self._lane
        if lane is not None and not self._lane_next(lane):
            # Replanned, mismatched, moved on (or back: a resumed job): the window has the rest.
            self._lane = lane = None
            self._stage_of = None
        after = self._lane_after
        if lane is None and after is not None and after.epoch <= self.view.epoch + 1:
            self._lane_after = None
            if self._lane_next(after):
                self._lane = lane = after
        if lane is None:
            return None
        position = self._lane_position(lane.epoch - 1)
        n = lane.by_ready.shape[0]
        while lane.released < n and lane.ready_at[lane.by_ready[lane.released]] < position:
            index = int(lane.by_ready[lane.released])
            heapq.heappush(lane.heap, index)
            lane.unreleased.discard(int(lane.entries[index]))
            lane.released += 1
        # A file released here that the window's walk passed is the window's from its next walk, which
        # every view of the cursor starts anew: restarting the walk on each release cost the trio
        # thread a walk of the stage list per open (epoch 0 of two nodes went from 1.6-1.7x to 1.9x).
        return lane

    def _lane_next(self, lane: _NextRun) -> bool:
        """Whether ``lane`` is for the epoch after the readers' one, of the plan followed."""
        view = self.view
        return (
            lane.generation == self.generation
            and self.mode == "predicting"
            and view.node == lane.node
            and view.epoch == lane.epoch - 1
        )

    def _next_fetched(self, ev: NextFetched) -> None:
        entry = ev.entry
        p = self.next_pages.get(entry)
        if p is None or p.state != "fetching":
            self._pump()
            return
        if ev.data is None or entry in self.pages or entry in self.kept:
            # No holder had it yet (the window gets it in order), or a reader or the window has it now.
            self.next_later += ev.data is None
            del self.next_pages[entry]
            self.next_bytes -= p.nbytes
            self.budget.release(p.nbytes)
        else:
            p.state, p.data = "pushing", ev.data
            self._out.append(PushNext(entry, ev.data))
            return  # the slot stays busy until the push ends
        self._pump()

    def _next_pushed(self, ev: NextPushed) -> None:
        entry = ev.entry
        p = self.next_pages.pop(entry, None)
        if p is None:
            if ev.ok and entry in self._next_forgotten:
                self._out.append(DropPages(entry, 0))  # its source changed while we pushed
            self._next_forgotten.discard(entry)
            self._pump()
            return
        self.next_bytes -= p.nbytes
        p.data = None
        if ev.ok and entry not in self.pages and entry not in self.kept:
            self.kept[entry] = p.nbytes
            self.kept_bytes += p.nbytes
            self.next_pushed += 1
        else:  # refused, or a reader took the file meanwhile (the pages are then charged as its)
            self.budget.release(p.nbytes)
        self._pump()

    def _forget_next(self, entry: int) -> None:
        p = self.next_pages.pop(entry, None)
        if p is None:
            return
        self.next_bytes -= p.nbytes
        self.budget.release(p.nbytes)
        if p.state == "pushing":
            self._next_forgotten.add(entry)

    # ------------------------------------------------------------------ checks and status

    def validate(self) -> None:
        """Raise AssertionError when the bookkeeping contradicts itself: after every step with
        ``debug.validate`` (the in-process tests set it), and after each event in ``tests/test_policy.py``."""
        staged = sum(p.nbytes for p in self.pages.values() if p.staged)
        cached = sum(p.nbytes for p in self.pages.values() if not p.staged)
        assert staged == self.staged_bytes, (staged, self.staged_bytes)
        assert cached == self.cached_bytes, (cached, self.cached_bytes)
        assert sum(self.kept.values()) == self.kept_bytes, (self.kept, self.kept_bytes)
        assert self.staged_bytes <= self.staging_limit, (self.staged_bytes, self.staging_limit)
        assert self.held_bytes() <= self.budget.used <= self.budget.limit, (self.held_bytes(), self.budget.used)
        assert not set(self.pages) & set(self.kept), set(self.pages) & set(self.kept)
        assert self._kept_unused <= set(self.kept), self._kept_unused - set(self.kept)
        fetching = {e for e, p in self.pages.items() if p.state == "fetching"}
        assert fetching <= self._staging_now, (fetching, self._staging_now)
        assert all(self._pushing.get(e) is p for e, p in self.pages.items() if p.state == "pushing")
        assert len(self._staging_now) <= self.stage_ceiling, (len(self._staging_now), self.stage_ceiling)
        assert self.settings.stage_threads <= self.stage_limit <= self.stage_ceiling, self.stage_limit
        assert sum(p.nbytes for p in self.next_pages.values()) == self.next_bytes, self.next_bytes
        assert len(self.next_pages) <= self.settings.next_threads
        assert all(p.state in ("fetching", "pushing") for p in self.next_pages.values())

    def in_page_cache(self, entry: int) -> bool:
        """Whether all of ``entry``'s pages are in the page cache as far as the policy knows: kept
        after a read, or pushed (the kernel may still have dropped some since)."""
        if entry in self.kept:
            return True
        p = self.pages.get(entry)
        return p is not None and p.state == "pushed"

    def held_entries(self) -> list[int]:
        """Entries whose bytes this node holds outside the tiers: kept pages, staged or read files."""
        return [*self.kept, *(e for e, p in self.pages.items() if p.state != "fetching")]

    def held_bytes(self) -> int:
        """Bytes the policy charges to the budget: the window, readers' pages, kept pages and the next
        epoch's stages in flight."""
        return self.staged_bytes + self.cached_bytes + self.kept_bytes + self.next_bytes

    def staging_status(self) -> WindowStatus:
        return {
            "mode": self.settings.staging_mode,
            "limit_bytes": self.staging_limit,
            "staged_bytes": self.staged_bytes,
            "staged_files": sum(1 for p in self.pages.values() if p.staged),
            "page_cache_bytes": self.cached_bytes
            + self.kept_bytes
            + sum(p.nbytes for p in self.pages.values() if p.state == "pushed"),
            "kept_files": len(self.kept),
            "kept_bytes": self.kept_bytes,
            "reused": self.reused,
            "uncached_opens": self.uncached_opens,
            "unused": self.unused,
            "in_flight": len(self._staging_now),
            "in_flight_limit": self.stage_limit,
            "in_flight_limit_max": self.stage_limit_max,
            "caught_opens": self.caught_opens,
            "next_epoch": {
                "epoch": self._lane.epoch if self._lane is not None else None,
                "files": int(self._lane.entries.shape[0]) if self._lane is not None else 0,
                "released": self._lane.released if self._lane is not None else 0,
                "inflight": len(self.next_pages),
                "pushed": self.next_pushed,
                "later": self.next_later,
            },
        }


def entries_due(entries: Iterable[int]) -> dict[int, int]:
    """entry -> position of its first use, from the horizon's entries in order of use."""
    arr = np.fromiter(entries, dtype=np.int64)
    if arr.size == 0:
        return {}
    unique, first = np.unique(arr, return_index=True)
    return dict(zip(unique.tolist(), first.tolist(), strict=True))
