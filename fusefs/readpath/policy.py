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
(:mod:`placement.reactive`) decides what to keep, and nothing is staged.  Three events decide how
a plan is trusted and are handled in one place each: :class:`PlanChanged`, :class:`Mismatch` and
:class:`Relock`.

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

from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, Protocol, TypedDict

import numpy as np
import numpy.typing as npt

from placement.cursor import CursorState, CursorStatus
from placement.plan import Plan
from placement.reactive import StaticFrequencySet
from placement.statusfields import counter, gauge, state

Mode = Literal["reactive", "detecting", "predicting"]
"""reactive: no plan can be trusted; detecting: a plan, waiting for opens to place this node;
predicting: the cursor follows this node's ranks and the window is staged ahead of them."""
PageState = Literal["fetching", "pushing", "pushed", "held", "reading"]
"""fetching: room reserved, the staging fetch in flight; pushing: notify_store in flight; pushed: in
the page cache; held: in daemon RAM (memory staging, or a push the kernel refused); reading: pages
a reader pulls through the mount (not the window's)."""
StagingMode = Literal["page_cache", "memory"]
FillOutcome = Literal["stored", "refused", "later", "failed"]
"""stored: the tier holds it; refused: fetched but not kept (budget); later: a replica whose owner
could not serve it yet; failed: the fetch failed."""

_STAGED: frozenset[PageState] = frozenset(("fetching", "pushing", "pushed", "held"))
FILL_RETRY_SECONDS = 1.0  # between passes over replicas whose owners could not serve them yet


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


# ---------------------------------------------------------------------------------------- state


@dataclass(frozen=True)
class CursorView:
    """What the cursor's worker thread last computed (the event-loop side reads only this)."""

    state: CursorState = "detecting"
    node: int | None = None
    epoch: int = 0
    due: Mapping[int, int] = field(default_factory=dict)  # entry -> first position in the predicted horizon
    stage: tuple[int, ...] = ()  # what to stage next, in order (not held already, fits the window)
    status: CursorStatus | None = None  # the cursor's status section, computed with the view
    predicted: int = 0  # opens of this batch the plan predicted
    fresh: bool = True  # False: the horizon was carried over from the last view (nobody moved a step)
    upcoming: tuple[int, ...] = ()  # the horizon's entries in predicted read order (what revalidation checks first)


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
    pos: int = 0
    inflight: dict[int, int] = field(default_factory=dict)  # entry -> position, fills of this pass
    later: list[int] = field(default_factory=list)  # positions of replicas to try again
    waiting: bool = False  # a RetryFillLater is out


# ---------------------------------------------------------------------------------------- events


@dataclass(slots=True)
class PlanChanged:
    """A new plan (or a failed one: None); ``seed_trusted``: the job wrote the seed (not assumed)."""

    plan: Plan | None
    seed_trusted: bool = True


@dataclass(slots=True)
class Opened:
    """A reader opened a dataset file: answers :class:`UsePages`, :class:`UseHeld` or nothing."""

    entry: int


@dataclass(slots=True)
class ReadThrough:
    """A reader is about to pull ``entry`` through the mount (its pages stay cached): answers
    :class:`Bypass` when the budget has no room for them."""

    entry: int
    nbytes: int


@dataclass(slots=True)
class Missed:
    """An open found ``entry`` nowhere local and fetches it: answers :class:`KeepIn` (where to keep a copy)."""

    entry: int
    nbytes: int


@dataclass(slots=True)
class Released:
    """A reader closed ``entry``: it was consumed."""

    entry: int


@dataclass(slots=True)
class ViewPublished:
    """The cursor placed a batch of opens (``placed``: their entries) and computed ``view``."""

    view: CursorView
    placed: Sequence[int]
    generation: int


@dataclass(slots=True)
class Mismatch:
    """The cursor found the opens do not follow the plan (derived from :class:`ViewPublished`)."""

    view: CursorView


@dataclass(slots=True)
class Relock:
    """The cursor follows the plan again after a mismatch (derived from :class:`ViewPublished`)."""

    view: CursorView


@dataclass(slots=True)
class StageFetched:
    """A :class:`Stage` got its bytes (``data``), or failed (None)."""

    entry: int
    data: bytes | None


@dataclass(slots=True)
class Pushed:
    """A :class:`Push` ended: ``ok`` False when the kernel refused the pages (the bytes stay in RAM)."""

    entry: int
    ok: bool


@dataclass(slots=True)
class FillDone:
    entry: int
    tier: int
    outcome: FillOutcome
    generation: int


@dataclass(slots=True)
class FillRetry:
    """The pause a :class:`RetryFillLater` asked for is over."""

    generation: int


@dataclass(slots=True)
class CopyLost:
    """Tier ``tier`` no longer holds ``entry`` (its copy was found stale or damaged and dropped)."""

    entry: int
    tier: int


@dataclass(slots=True)
class SourceChanged:
    """The source of ``entry`` was seen changed since the snapshot: no copy of it may be served."""

    entry: int


@dataclass(slots=True)
class PeerDown:
    """Training node ``node``'s daemon stopped answering."""

    node: int


@dataclass(slots=True)
class PeerUp:
    node: int


@dataclass(slots=True)
class Tick:
    """Periodic: retry what waits for room that something outside the policy may have freed."""


Event = (
    PlanChanged
    | Opened
    | ReadThrough
    | Missed
    | Released
    | ViewPublished
    | Mismatch
    | Relock
    | StageFetched
    | Pushed
    | FillDone
    | FillRetry
    | CopyLost
    | SourceChanged
    | PeerDown
    | PeerUp
    | Tick
)


# ---------------------------------------------------------------------------------------- instructions


@dataclass(slots=True)
class FollowPlan:
    """Give the cursor this plan (None: no cursor), presumed on ``presume``'s node from epoch 0."""

    plan: Plan | None
    presume: int | None
    generation: int


@dataclass(slots=True)
class Place:
    """Give the cursor this open (a global file id of the plan)."""

    gid: int


@dataclass(slots=True)
class UsePages:
    """Answer to :class:`Opened`: the file's pages are in the page cache."""

    entry: int


@dataclass(slots=True)
class UseHeld:
    """Answer to :class:`Opened`: serve the file from these bytes."""

    entry: int
    data: bytes


@dataclass(slots=True)
class Bypass:
    """Answer to :class:`ReadThrough`: no room for the pages, open with direct_io."""

    entry: int


@dataclass(slots=True)
class KeepIn:
    """Answer to :class:`Missed`: keep the fetched copy in tier ``tier``."""

    entry: int
    tier: int


@dataclass(slots=True)
class Stage:
    """Get ``entry``'s bytes and report :class:`StageFetched`: from local tier ``from_tier`` when not
    None, else (or when that copy is gone) by a fetch (in flight, peer, PFS) that keeps a copy in
    tier ``keep_in`` when not None."""

    entry: int
    from_tier: int | None
    keep_in: int | None


@dataclass(slots=True)
class CancelStage:
    """Stop waiting for ``entry``'s stage (the fetch itself goes on for anyone else awaiting it)."""

    entry: int


@dataclass(slots=True)
class Push:
    """notify_store ``data`` as ``entry``'s pages (in a worker thread), then report :class:`Pushed`."""

    entry: int
    data: bytes


@dataclass(slots=True)
class DropPages:
    """invalidate_inode ``entry`` (in a worker thread): ``nbytes`` of its pages are no longer charged."""

    entry: int
    nbytes: int


@dataclass(slots=True)
class Fill:
    """Fetch ``entry`` into tier ``tier`` (from the PFS only when ``from_pfs``: this node owns it),
    then report :class:`FillDone`."""

    entry: int
    tier: int
    from_pfs: bool
    generation: int


@dataclass(slots=True)
class DropCopy:
    """Drop tier ``tier``'s copy of ``entry``."""

    entry: int
    tier: int


@dataclass(slots=True)
class RetryFillLater:
    """Report :class:`FillRetry` after ``seconds``."""

    seconds: float
    generation: int


Instruction = (
    FollowPlan
    | Place
    | UsePages
    | UseHeld
    | Bypass
    | KeepIn
    | Stage
    | CancelStage
    | Push
    | DropPages
    | Fill
    | DropCopy
    | RetryFillLater
)
Answer = UsePages | UseHeld | Bypass | KeepIn


@dataclass(frozen=True)
class PolicySettings:
    staging_limit: int  # bytes the staging window may hold (a share of the budget)
    staging_mode: StagingMode = "page_cache"
    stage_threads: int = 4  # stages in flight at most (fetch and push)
    fill_threads: tuple[int, ...] = ()  # fills in flight per tier at most
    reactive_capacities: tuple[int, ...] = ()  # bytes per tier the reactive policy may keep


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
        self.reactive = StaticFrequencySet(list(settings.reactive_capacities or [0] * len(self.tiers)))
        # The plan and where this node is in it
        self.plan: Plan | None = None
        self.generation = 0
        self.view = CursorView()
        self.presumed_node: int | None = None  # this daemon's group index: the node to presume
        self.entry_gid: npt.NDArray[np.int32] = np.full(0, -1, np.int32)
        self.tier_of_gid: npt.NDArray[np.int8] | None = None  # this node's assignment, per gid
        self._unplaced: dict[int, int] = {}  # entry -> opens the published view does not reflect yet
        self._opened_since_view: set[int] = set()  # opened since the horizon was last computed
        # The staging window and the page cache
        self.pages: dict[int, Pages] = {}  # staged (the window) or open by readers
        self.kept: OrderedDict[int, int] = OrderedDict()  # consumed, pages still cached -> charge; oldest first
        self.staged_bytes = 0
        self.cached_bytes = 0  # pages of files readers have open, pulled through the mount
        self.kept_bytes = 0
        self._staging_now: set[int] = set()  # stages in flight (fetch or push)
        self._pushing: dict[int, Pages] = {}  # pushes in flight, by entry (also once retired meanwhile)
        self._swept_for: Mapping[int, int] | None = None  # the horizon the last retirement sweep used
        self._stage_of: tuple[int, ...] | None = None  # the stage list the walk is on ...
        self._stage_pos = 0  # ... and how far it got
        # Long-term tiers
        self._fill: _FillRun | None = None
        self._fill_busy = [0] * len(self.tiers)
        self.filled_node: int | None = None
        self.peers_down: set[int] = set()
        # Counters (status)
        self.predicted_opens = 0
        self.unplanned_opens = 0
        self.unused = 0  # staged files dropped before any open used them (wasted fetches)
        self.reused = 0  # opens served by pages kept from an earlier read
        self.uncached_opens = 0  # opens served with direct_io because the budget was full
        self._out: list[Instruction] = []
        self._busy = False
        self._due_for: int | None = None  # the horizon position of the file a reservation is for
        self._handlers: dict[type[Any], Callable[[Any], None]] = {
            PlanChanged: self._plan_changed,
            Opened: self._opened,
            ReadThrough: self._read_through,
            Missed: self._missed,
            Released: self._released,
            ViewPublished: self._view_published,
            Mismatch: self._mismatch,
            Relock: self._relock,
            StageFetched: self._stage_fetched,
            Pushed: self._pushed,
            FillDone: self._fill_done,
            FillRetry: self._fill_retry,
            CopyLost: self._copy_lost,
            SourceChanged: self._source_changed,
            PeerDown: self._peer_down,
            PeerUp: self._peer_up,
            Tick: self._tick,
        }

    # ------------------------------------------------------------------ the interface

    def handle(self, event: Event) -> list[Instruction]:
        """Decide on one event; the instructions are carried out in order, before the next event."""
        self._busy = True
        try:
            self._handlers[type(event)](event)
        finally:
            self._busy = False
        out, self._out = self._out, []
        return out

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
        """A new plan (or none): restart prediction from detection.

        Files staged for the old plan stay until the new cursor's first view sweeps those outside
        its horizon (they may be due under the new plan too); stages in flight complete.  Without a
        plan nothing can be predicted: the window goes, as after a mismatch.
        """
        self.generation += 1
        plan = self.plan = ev.plan
        self.view = CursorView()
        self._unplaced = {}
        self._opened_since_view = set()
        self.tier_of_gid = None
        self.filled_node = None
        self._fill = None
        self._stage_of, self._stage_pos = None, 0
        presume: int | None = None
        if plan is None:
            self.entry_gid = np.full(0, -1, np.int32)
            self._adopt_into_reactive()
            self._clear_window()
        else:
            self.entry_gid = np.full(self.sizes.shape[0], -1, np.int32)
            gids = np.arange(plan.files, dtype=np.int64)
            entries = plan.entry_of(gids).astype(np.int64)
            self.entry_gid[entries[::-1]] = gids[::-1].astype(np.int32)  # the first id of a shared entry wins
            # Predict before any open only for a seed the job wrote: with the assumed default, wait
            # for the first opens to confirm it rather than stage a window that may all be wasted.
            if ev.seed_trusted:
                if plan.nodes == 1:
                    presume = 0
                elif self.presumed_node is not None and self.presumed_node < plan.nodes:
                    presume = self.presumed_node
        self._out.append(FollowPlan(plan, presume, self.generation))

    def _view_published(self, ev: ViewPublished) -> None:
        if ev.generation != self.generation:
            return  # computed for a plan replaced meanwhile
        for entry in ev.placed:
            left = self._unplaced.get(entry, 0) - 1
            if left > 0:
                self._unplaced[entry] = left
            else:
                self._unplaced.pop(entry, None)
        view = ev.view
        self.predicted_opens += view.predicted
        previous, self.view = self.view, view
        if view.fresh:  # a recomputed horizon knows every open it was given; later ones it does not
            self._opened_since_view = set(self._unplaced)
        if view.node is not None and (view.node != previous.node or self.tier_of_gid is None) and self.plan:
            self.tier_of_gid = self.plan.tier_of(view.node)
        if view.state == "mismatch" and previous.state != "mismatch":
            self._mismatch(Mismatch(view))
        elif previous.state == "mismatch" and view.state == "tracking":
            self._relock(Relock(view))
        if self._fill is None and self.filled_node is None:
            self._start_fill()
        self._sweep()
        self._pump()

    def _mismatch(self, ev: Mismatch) -> None:
        """The plan is wrong for these readers: its window is meaningless, the reactive policy decides.

        Files kept in the tiers under the plan now count against the reactive policy.  The tier
        fill of the plan goes on (it is for this node's assignment, whatever the readers do now).
        """
        self._adopt_into_reactive()
        self._clear_window()

    def _relock(self, ev: Relock) -> None:
        """The readers follow the plan again: prediction resumes with the view that said so."""

    # ------------------------------------------------------------------ readers

    def _opened(self, ev: Opened) -> None:
        entry = ev.entry
        gid = int(self.entry_gid[entry]) if entry < self.entry_gid.shape[0] else -1
        if gid < 0:
            self.unplanned_opens += 1
        else:
            self._out.append(Place(gid))
            self._unplaced[entry] = self._unplaced.get(entry, 0) + 1
            self._opened_since_view.add(entry)
        answer = self._take(entry)
        if answer is not None:
            self._out.append(answer)

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
        self.pages[entry] = Pages(charge, "reading", taken=True)
        return UsePages(entry)

    def _read_through(self, ev: ReadThrough) -> None:
        """Charge the pages a reader pulls through the mount; no room: it must bypass the page cache
        (direct_io), since a read is never refused and the budget is never exceeded."""
        if ev.entry in self.pages:
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
        decision = self.reactive.on_read(ev.entry, ev.nbytes)
        for t, victim in decision.evict:
            self._out.append(DropCopy(victim, t))
            self.reactive.dropped(victim)
        if decision.tier is not None:
            self.reactive.admitted(ev.entry, decision.tier, ev.nbytes)
            self._out.append(KeepIn(ev.entry, decision.tier))

    def _released(self, ev: Released) -> None:
        self._retire(ev.entry)
        if self.plan is not None:  # (every open comes here: nothing to start without a plan)
            self._pump()

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
        """Start what may start now: stages in order of the stage list, then tier fills."""
        self._pump_staging()
        self._pump_fill()

    def _pump_staging(self) -> None:
        """Stage the window's next files, resuming where the walk over this stage list stopped.

        Runs on most events, so nothing here rescans the window: the walk keeps its position until
        a new stage list comes, and an entry passed once (staged, in flight, opened, held) is never
        revisited for that list.  No room: stop, and wait for consumption to free some (never skip
        to a later, smaller file, and never evict a file due sooner).
        """
        if self.mode != "predicting":
            return
        stage = self.view.stage
        if stage is not self._stage_of:
            self._stage_of, self._stage_pos = stage, 0
        due = self.view.due
        while self._stage_pos < len(stage) and len(self._staging_now) < self.settings.stage_threads:
            entry = stage[self._stage_pos]
            # Opened already (since the horizon was computed), staged, open or kept: skip.
            if entry in self._opened_since_view or entry in self.pages or entry in self.kept:
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
            local = next((t for t, tier in enumerate(self.tiers) if tier.contains(entry)), None)
            self._out.append(Stage(entry, local, None if local is not None else self.planned_tier(entry)))

    def _stage_fetched(self, ev: StageFetched) -> None:
        entry = ev.entry
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
        if ev.ok and current is not p and not (p.taken and (current is not None or entry in self.kept)):
            # Retired while we pushed: drop the pages just stored.  Not when a reader took it
            # meanwhile: it read the same bytes through the mount, and its release kept them.
            self._out.append(DropPages(entry, 0))
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
            self.unused += not p.taken
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
        else:  # never opened and not in the page cache (or a push in flight, undone when it ends)
            self.budget.release(p.nbytes)

    def _clear_window(self) -> None:
        """Drop the staging window (no trusted plan: its order is meaningless); kept pages stay valid."""
        for entry in [e for e, p in self.pages.items() if p.staged and not p.taken]:
            p = self.pages.pop(entry)
            self.staged_bytes -= p.nbytes
            self.unused += 1
            self.budget.release(p.nbytes)
            if p.state == "pushed":
                self._out.append(DropPages(entry, p.nbytes))
            elif p.state == "fetching":
                self._staging_now.discard(entry)
                self._out.append(CancelStage(entry))
        self._stage_of, self._stage_pos = None, 0

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

        Pages outside the horizon go first, oldest first, then the horizon's, furthest due first.
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
            charge = self.kept.pop(entry)
            self.kept_bytes -= charge
            self.budget.release(charge)
            self._out.append(DropPages(entry, charge))
        return freed

    # ------------------------------------------------------------------ long-term tiers

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
        for t, rtier in enumerate(self.reactive.tiers):
            excess = rtier.used - rtier.capacity
            for entry in list(rtier.members):
                if excess <= 0:
                    break
                excess -= rtier.members[entry]
                self._out.append(DropCopy(entry, t))
                self.reactive.dropped(entry)

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
            plan.assignment.tier_of[node][objs64].astype(np.int64),
            plan.assignment.owner[objs64].astype(np.int64),
        )

    def _pump_fill(self) -> None:
        """Fill tiers while no stage is in flight (staging first: the readers need that bandwidth now).

        Files this node owns come from the PFS (it is their one PFS reader); replicas of files
        other nodes own come only from their owner, and wait for a later pass while it cannot
        serve them (or is down).
        """
        run = self._fill
        if run is None or run.waiting or self._staging_now:
            return
        n = run.entries.shape[0]
        while run.pos < n:
            entry, t, owner = int(run.entries[run.pos]), int(run.tiers[run.pos]), int(run.owners[run.pos])
            if not 0 <= t < len(self.tiers) or self.tiers[t].contains(entry):
                run.pos += 1
                continue
            if owner != run.node and owner in self.peers_down:
                run.later.append(run.pos)
                run.pos += 1
                continue
            if self._fill_busy[t] >= self.fill_threads[t]:
                return  # in order: wait for this tier's slot
            self._fill_busy[t] += 1
            run.inflight[entry] = run.pos
            run.pos += 1
            self._out.append(Fill(entry, t, owner == run.node, self.generation))
        if run.later and not run.inflight:
            # The pass is over: try the replicas whose owners could not serve them after a pause.
            keep = np.asarray(run.later, dtype=np.int64)
            run.entries, run.tiers, run.owners = run.entries[keep], run.tiers[keep], run.owners[keep]
            run.pos, run.later, run.waiting = 0, [], True
            self._out.append(RetryFillLater(FILL_RETRY_SECONDS, self.generation))

    def _fill_done(self, ev: FillDone) -> None:
        if 0 <= ev.tier < len(self._fill_busy) and self._fill_busy[ev.tier] > 0:
            self._fill_busy[ev.tier] -= 1
        run = self._fill
        if run is not None and ev.generation == self.generation:
            pos = run.inflight.pop(ev.entry, None)
            if ev.outcome == "later" and pos is not None:
                run.later.append(pos)
        self._pump_fill()

    def _fill_retry(self, ev: FillRetry) -> None:
        if self._fill is not None and ev.generation == self.generation:
            self._fill.waiting = False
            self._pump_fill()

    def _copy_lost(self, ev: CopyLost) -> None:
        if self.reactive.where.get(ev.entry) == ev.tier:
            self.reactive.dropped(ev.entry)

    def _source_changed(self, ev: SourceChanged) -> None:
        """Forget every copy of the file here (the revalidator drops the tiers' copies itself); its
        pages are always invalidated, since a reader may have left some that nothing recorded."""
        entry = ev.entry
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
        charge = self.kept.pop(entry, None)
        if charge is not None:
            self.kept_bytes -= charge
            self.budget.release(charge)
        self._out.append(DropPages(entry, charge or 0))
        self._pump()

    def _peer_down(self, ev: PeerDown) -> None:
        self.peers_down.add(ev.node)

    def _peer_up(self, ev: PeerUp) -> None:
        self.peers_down.discard(ev.node)
        self._pump_fill()

    def _tick(self, ev: Tick) -> None:
        self._pump()

    # ------------------------------------------------------------------ checks and status

    def validate(self) -> None:
        """Raise AssertionError when the bookkeeping contradicts itself (tests call this after each event)."""
        staged = sum(p.nbytes for p in self.pages.values() if p.staged)
        cached = sum(p.nbytes for p in self.pages.values() if not p.staged)
        assert staged == self.staged_bytes, (staged, self.staged_bytes)
        assert cached == self.cached_bytes, (cached, self.cached_bytes)
        assert sum(self.kept.values()) == self.kept_bytes, (self.kept, self.kept_bytes)
        assert self.staged_bytes <= self.staging_limit, (self.staged_bytes, self.staging_limit)
        assert self.held_bytes() <= self.budget.used <= self.budget.limit, (self.held_bytes(), self.budget.used)
        assert not set(self.pages) & set(self.kept), set(self.pages) & set(self.kept)
        fetching = {e for e, p in self.pages.items() if p.state == "fetching"}
        assert fetching <= self._staging_now, (fetching, self._staging_now)
        assert all(self._pushing.get(e) is p for e, p in self.pages.items() if p.state == "pushing")
        assert len(self._staging_now) <= self.settings.stage_threads

    def held_entries(self) -> list[int]:
        """Entries whose bytes this node holds outside the tiers: kept pages, staged or read files."""
        return [*self.kept, *(e for e, p in self.pages.items() if p.state != "fetching")]

    def held_bytes(self) -> int:
        """Bytes the policy charges to the budget: the window, readers' pages and kept pages."""
        return self.staged_bytes + self.cached_bytes + self.kept_bytes

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
        }


def entries_due(entries: Iterable[int]) -> dict[int, int]:
    """entry -> position of its first use, from the horizon's entries in order of use."""
    arr = np.fromiter(entries, dtype=np.int64)
    if arr.size == 0:
        return {}
    unique, first = np.unique(arr, return_index=True)
    return dict(zip(unique.tolist(), first.tolist(), strict=True))
