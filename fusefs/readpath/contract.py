"""The read policy's contract: every event the executor reports and every instruction the policy returns.

:meth:`fusefs.readpath.policy.ReadPolicy.handle` takes an :data:`Event` and returns a list of
:data:`Instruction`; the executor (:class:`fusefs.readpath.prefetch.Prefetcher`) carries each one
out.  Both sides dispatch with ``match`` and end in ``typing.assert_never``, so mypy proves the
contract closed: an event class added to :data:`Event` without a handler, or an instruction added
to :data:`Instruction` that the executor does not carry out, fails the type check, not a run.

Everything the policy learns arrives here, as an event, through ``handle``: the node to presume
(:class:`NodePresumed`), a source seen changed (:class:`SourceChanged`, which staging reports
through the executor), every outcome of a stage, push or fill.  The one way in that is not an
event is the budget's reclaim (``ReadPolicy.reclaim``), re-entrant by nature: see that method.

Pure data, like the policy: no I/O, no clock (``tests/test_layering.py``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import numpy.typing as npt

from placement.cursor import CursorState, CursorStatus
from placement.plan import Plan

FillOutcome = Literal["stored", "refused", "later", "failed"]
"""stored: the tier holds it; refused: fetched but not kept (budget); later: a replica whose owner
could not serve it yet; failed: the fetch failed."""


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


# ---------------------------------------------------------------------------------------- events


@dataclass(slots=True)
class PlanChanged:
    """A new plan (or a failed one: None); ``seed_trusted``: the job wrote the seed (not assumed)."""

    plan: Plan | None
    seed_trusted: bool = True


@dataclass(slots=True)
class SeedTrusted:
    """The job wrote ``seed`` after the daemon had planned for it as an assumption (the default 0):
    the plan is the same, only now it may be predicted from before any open."""

    seed: int


@dataclass(slots=True)
class NodePresumed:
    """This daemon's index in its group: the training node to presume for a trusted plan before any
    open (torchrun may number nodes otherwise: the opens decide then).  None: no presumption."""

    node: int | None


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
    """The cursor placed a batch of opens (``placed``: their entries) and computed ``view``.  One of
    a plan replaced since (an older ``generation``) counts its predicted opens and nothing else."""

    view: CursorView
    placed: Sequence[int]
    generation: int


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
class ReadFromPfs:
    """This node read ``entry`` from the PFS (for a reader, a stage, a fill or a peer): in a group
    its copy here may be the only one (see :meth:`ReadPolicy._pinned`)."""

    entry: int


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
class GroupChanged:
    """The daemon group's members, as hashing seeds in member order, and this daemon's index: who
    reads each file from the PFS while no plan is trusted (:mod:`placement.owners`)."""

    seeds: tuple[int, ...]
    me: int


@dataclass(slots=True)
class PeerAsked:
    """A peer asked for ``entry``, which this node neither holds nor fetches: answers
    :class:`FetchForPeer` when this node is the one to read it from the PFS, else nothing.
    ``by_plan``: the request named the plan (the asker predicts and takes this node for the plan's
    owner); otherwise it named the file alone (the asker follows the group rule)."""

    entry: int
    nbytes: int
    by_plan: bool


@dataclass(slots=True)
class NextEpoch:
    """What this node reads in job epoch ``epoch`` that it does not read in the epoch before, in
    the order it reads them, with the position of the epoch before (this node's ranks' progress)
    from which the peer that holds each one has it (-1: it has it already).  Computed off the
    event loop by the executor (:func:`placement.nextepoch.next_epoch_reads`)."""

    generation: int
    node: int
    epoch: int
    entries: npt.NDArray[np.int64]
    ready_at: npt.NDArray[np.int64]
    # The epoch before reads a training dataset for the first time (placement.nextepoch.reads_first): its
    # readers wait on the PFS, and the lane pushes memory-tier copies too (see _pump_lane).
    first_read: bool = False


@dataclass(slots=True)
class NextFetched:
    """A :class:`StageNext` got its bytes, or failed or found no peer holding them yet (None)."""

    entry: int
    data: bytes | None


@dataclass(slots=True)
class NextPushed:
    """A :class:`PushNext` ended: ``ok`` False when the kernel refused the pages."""

    entry: int
    ok: bool


@dataclass(slots=True)
class Tick:
    """Periodic: retry what waits for room that something outside the policy may have freed."""


Event = (
    PlanChanged
    | SeedTrusted
    | NodePresumed
    | Opened
    | ReadThrough
    | Missed
    | Released
    | ViewPublished
    | StageFetched
    | Pushed
    | FillDone
    | FillRetry
    | CopyLost
    | ReadFromPfs
    | SourceChanged
    | PeerDown
    | PeerUp
    | Tick
    | GroupChanged
    | PeerAsked
    | NextEpoch
    | NextFetched
    | NextPushed
)
"""Everything the executor reports to the policy (:meth:`ReadPolicy.handle`'s one argument)."""


# ---------------------------------------------------------------------------------------- instructions


@dataclass(slots=True)
class FollowPlan:
    """Give the cursor this plan (None: no cursor), presumed on ``presume``'s node from epoch 0."""

    plan: Plan | None
    presume: int | None
    generation: int


@dataclass(slots=True)
class Presume:
    """Let the cursor of plan ``generation`` predict from the start of epoch 0 on ``node`` (ignored
    once it has seen opens: those decide)."""

    node: int
    generation: int


@dataclass(slots=True)
class StageSlots:
    """The staging window may have ``limit`` stages in flight now (raised while readers catch it,
    lowered while it stays ahead): size the staging window's PFS threads to match."""

    limit: int


@dataclass(slots=True)
class SeedInDoubt:
    """The opens fit no epoch, node or position of the plan for the seed in use (``trusted``: the job
    wrote it; else it was only assumed).  The hook for whatever may find the right seed from the
    opens seen (the cursor keeps the recent ones); nothing is required of the executor."""

    seed: int
    trusted: bool
    reason: str
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


@dataclass(slots=True)
class FetchForPeer:
    """Answer to :class:`PeerAsked`: read ``entry`` from the PFS for the peer, keeping a copy in tier
    ``keep_in`` when not None."""

    entry: int
    keep_in: int | None


@dataclass(slots=True)
class StageNext:
    """Get ``entry``'s bytes for the next epoch, from local tier ``from_tier`` when not None, else from
    the peer that holds it (never the PFS), keeping a copy in ``keep_in``; report :class:`NextFetched`."""

    entry: int
    from_tier: int | None
    keep_in: int | None


@dataclass(slots=True)
class PushNext:
    """notify_store ``data`` as ``entry``'s pages (in a worker thread), then report :class:`NextPushed`."""

    entry: int
    data: bytes


Instruction = (
    FollowPlan
    | Presume
    | SeedInDoubt
    | StageSlots
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
    | StageNext
    | PushNext
    | FetchForPeer
)
"""Everything the policy may ask of the executor (what :meth:`ReadPolicy.handle` returns)."""
Answer = UsePages | UseHeld | Bypass | KeepIn | FetchForPeer
"""The instructions that answer the event they came with (an open, a miss, a peer's request): the
executor returns them to its caller rather than carrying them out."""


# ---------------------------------------------------------------------------------------- the log


@dataclass(frozen=True, slots=True)
class Reclaimed:
    """Not an event: the log's record of a reclaim the budget asked for outside any step (a memory
    tier's put needing room), the one way into the policy that does not go through ``handle``."""

    need: int
    freed: int


@dataclass(frozen=True, slots=True)
class Step:
    """One entry of the policy's log: what came in (``seq``: its number since the mount) and what
    the policy decided."""

    seq: int
    event: Event | Reclaimed
    out: tuple[Instruction, ...]

    def entries(self) -> list[int]:
        """The snapshot entries this step names: the event's and each instruction's ``entry``, and the
        opens a view placed.  Not a view's horizon or stage list, nor a next-epoch lane's files:
        thousands each, and what the policy did with one of them is an instruction naming it."""
        found: dict[int, None] = {}
        for item in (self.event, *self.out):
            entry = getattr(item, "entry", None)
            if isinstance(entry, int):
                found[entry] = None
        if isinstance(self.event, ViewPublished):
            found.update(dict.fromkeys(int(e) for e in self.event.placed))
        return list(found)

    def describe(self) -> str:
        """One line: ``#seq Event(fields) -> Instruction(fields), ...`` (bytes and arrays summarised)."""
        out = ", ".join(_short(i) for i in self.out) or "nothing"
        return f"#{self.seq} {_short(self.event)} -> {out}"


def _short(item: object) -> str:
    """A record's class and fields, with bytes, arrays, views and plans shortened to what they are."""
    parts = []
    for name in getattr(item, "__dataclass_fields__", {}):
        value = getattr(item, name)
        if isinstance(value, bytes):
            shown = f"<{len(value)} bytes>"
        elif isinstance(value, np.ndarray):
            shown = f"<{value.shape[0]} entries>"
        elif isinstance(value, CursorView):
            shown = f"<{value.state}, node {value.node}, epoch {value.epoch}, {len(value.due)} due>"
        elif isinstance(value, Plan):
            shown = f"<plan {value.digest[:12]}, seed {value.seed}>"
        elif isinstance(value, Sequence) and not isinstance(value, str) and len(value) > 8:
            shown = f"<{len(value)} items>"
        else:
            shown = repr(value)
        parts.append(f"{name}={shown}")
    return f"{type(item).__name__}({', '.join(parts)})"
