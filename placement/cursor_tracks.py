"""The cursor's state and the hot path: each open placed on a rank's track (:mod:`placement.cursor`).

:class:`Track` (one local rank in one dataset's pass), :class:`DatasetCursor` (a dataset's tracks,
strays and counters) and :class:`CursorBase` (the node-wide counters, epoch maps, presuming, and
placing an open: microseconds once its pass's map is built), with the settings and the status
sections.  Separate from the search that finds where the tracks are
(:mod:`placement.cursor_lock`) and the forecast read off them (:mod:`placement.cursor_horizon`),
which both build on :class:`CursorBase`.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated, Literal, TypedDict

import numpy as np
import numpy.typing as npt

from placement.cursor_fit import _LOG_FALSE_LOCK, I64, PassIndex, log_chance
from placement.jobstreams import JobStreams
from placement.samplers import (
    LRU,
    DistributedSamplerModel,
    ExplicitOrderModel,
    RandomSamplerModel,
    sampler_name,
    varies_by_epoch,
)
from placement.statusfields import counter, gauge, state, text
from placement.streams import Streams

CursorState = Literal["detecting", "presumed", "tracking", "mismatch"]


MismatchKind = Literal["wrong_seed", "wrong_shape", "unpredictable"]
"""Why opens fit no hypothesis: ``wrong_shape`` when they fit the plan's permutation under another job
shape (:mod:`placement.shapeprobe`), ``unpredictable`` when the configured sampler's order is not
decided by a seed a script states (:data:`placement.frameworks.UNPREDICTABLE`), else ``wrong_seed``
(another order than the plan's: a wrong seed, another catalog order, or a sampler not modelled)."""


DatasetState = Literal["idle", "detecting", "presumed", "tracking", "mismatch"]


Mode = Literal["unknown", "advance", "repeat"]
"""How a dataset's next pass relates to the last: ``advance`` (set_epoch: epoch + 1), ``repeat``
(the same sampler epoch again: no set_epoch).  Samplers that do not shuffle need neither."""


class DatasetCursorStatus(TypedDict):
    """One dataset of the job, followed on its own."""

    dataset: Annotated[int, text("the dataset's index in the configuration")]
    lead: Annotated[bool, text("whether it is the lead dataset")]
    state: Annotated[DatasetState, state("idle (no opens yet), detecting, presumed, tracking or mismatch")]
    sampler: Annotated[
        str,
        text(
            "the sampler the opens showed, e.g. distributed(shuffle=False) for a validation set read "
            "through DistributedSampler(shuffle=False), or sequential when every rank reads it all"
        ),
    ]
    mode: Annotated[Mode, state("advance: set_epoch; repeat: the same order every pass; unknown")]
    epoch: Annotated[int | None, gauge("the job epoch its ranks are in (null before any)")]
    sampler_epoch: Annotated[int | None, gauge("the sampler's epoch its ranks are in (null before any)")]
    rank_positions: Annotated[
        dict[str, list[int]], text("per rank: job epoch, first unconsumed and highest read position + 1")
    ]
    passes: Annotated[int, gauge("passes of it seen (validation sets), under this plan")]
    opens: Annotated[int, gauge("opens of it under this plan")]
    hits: Annotated[int, gauge("of those, opens predicted (withdrawn when a presumption is refuted)")]
    plan_opens: Annotated[int, gauge("opens under this plan")]
    plan_hits: Annotated[int, gauge("hits under this plan")]
    locks: Annotated[int, gauge("times its position was locked from opens")]
    lock_opens: Annotated[int | None, gauge("opens the last lock looked at (null before one)")]
    strays: Annotated[int, gauge("opens not predicted since the last lock")]
    searches: Annotated[int, gauge("searches of the plan for the opens' position")]
    epochs_searched: Annotated[int, gauge("epochs those searches looked at")]
    every_steps: Annotated[int | None, gauge("a pass every this many lead steps, as learned (null: lead, unknown)")]
    every_epochs: Annotated[
        int | None, gauge("a pass after every this many lead epochs, as learned (null: lead, unknown)")
    ]
    mismatch_reason: Annotated[str | None, text("why its opens fit no position of the plan, or null")]
    mismatch_kind: Annotated[
        MismatchKind | None, text("wrong_seed, wrong_shape (the opens fit another job shape) or unpredictable; null")
    ]


class EpochHits(TypedDict):
    epoch: Annotated[int, text("lead epoch")]
    opens: Annotated[int, text("opens in it, every dataset's opens counted in the lead epoch under way")]
    hits: Annotated[int, text("of those, predicted")]


class CursorStatus(TypedDict):
    """Status section ``cursor``: where this node's ranks are in the predicted streams."""

    state: Annotated[
        CursorState,
        state("detecting; presumed: predicting before opens proved it; tracking; mismatch"),
    ]
    node: Annotated[int | None, gauge("this node's index in the job, inferred from the opens (null: not yet)")]
    epoch: Annotated[
        int,
        gauge(
            "the lead's epoch, also past the configured job.epochs (which only bounds planning); its pass "
            "count when the job does not call set_epoch"
        ),
    ]
    step: Annotated[int, gauge("batches into the epoch")]
    ranks: Annotated[list[int], text("the training ranks this node hosts")]
    rank_positions: Annotated[dict[str, list[int]], text("per rank: epoch and first unconsumed position")]
    opens: Annotated[
        int, counter("opens the cursor saw, over every plan of the mount: a rewritten seed does not reset them")
    ]
    hits: Annotated[
        int, gauge("of those, opens it predicted (hits a presumption made are withdrawn when opens refute it)")
    ]
    hit_rate: Annotated[float, gauge("hits / opens: the prediction hit ratio", unit="ratio", metric="hit_ratio")]
    plan_opens: Annotated[int, gauge("opens under the current plan")]
    plan_hits: Annotated[int, gauge("hits under the current plan")]
    plans: Annotated[int, gauge("plans this mount's cursor has followed")]
    mismatch: Annotated[
        bool,
        gauge(
            "the opens fit no epoch, node or position of the plan (another seed, catalog order, job shape or "
            "sampler than the plan's): the daemon falls back to its reactive policy"
        ),
    ]
    mismatch_reason: Annotated[
        str | None,
        text(
            "why, or null; for a wrong_seed mismatch of the lead dataset the daemon adds what seed discovery "
            "found (searching, the seed and order it fitted, or that no modelled order with a likely seed fits)"
        ),
    ]
    mismatch_kind: Annotated[
        MismatchKind | None,
        text(
            "wrong_seed (another order than the plan's: its seed, catalog order or sampler), wrong_shape or "
            "unpredictable; null"
        ),
    ]
    first_mismatch_open: Annotated[int | None, text("the open at which a mismatch was first declared")]
    detect_opens: Annotated[int | None, text("how many opens the lead's last lock looked at")]
    lead: Annotated[
        int,
        text("the lead dataset's index: the largest that follows no other (the training set) gives the epoch"),
    ]
    datasets: Annotated[
        list[DatasetCursorStatus], text("per dataset", label="dataset", key="dataset", metric="dataset")
    ]
    history: Annotated[list[EpochHits], text("per lead epoch, also past the planned epochs")]


_NEED = None  # _find: an epoch map is needed that is not built (the quick path stops)


@dataclass(frozen=True)
class CursorSettings:
    window: int  # positions ahead of a rank's progress that count as predicted
    detect_opens: int = 4  # strays a hypothesis test looks at, at least
    judge_opens: int = 32  # recent opens over which the hit rate is judged
    mismatch_below: float = 0.5  # hit rate under which a tracked plan may be declared wrong

    @classmethod
    def for_job(cls, batch_size: int, num_workers: int, prefetch_factor: int) -> CursorSettings:
        inflight = max(1, num_workers) * max(1, prefetch_factor) + 1
        return cls(window=2 * inflight * batch_size + 16, judge_opens=max(8, max(1, num_workers) * batch_size))


# ---------------------------------------------------------------------------------------- tracks


@dataclass(slots=True)
class Track:
    """One local rank in one dataset: the pass it reads and how far it got.

    ``low``: first position not consumed (or given up on: a sample never opened must not hold it
    back forever); ``high``: highest consumed position + 1; ``segment``: the node-wide run of
    same-dataset opens it last consumed in (another dataset read since: the track is *idle*).
    """

    slot: int
    rank: int
    epoch: int  # sampler epoch of the pass
    job_epoch: int  # which pass: the job's epoch for the lead dataset
    length: int
    low: int = 0
    high: int = 0
    consumed: set[int] = field(default_factory=set)  # consumed positions >= low
    seen: bytearray | None = field(default=None, repr=False)  # every position consumed in this pass
    segment: int = -1
    index: PassIndex | None = field(default=None, repr=False)  # this pass's map, once built

    def accepts(self, pos: int, window: int) -> bool:
        return self.low <= pos < self.high + window and pos not in self.consumed

    def consume(self, pos: int, window: int) -> None:
        if self.seen is None:
            self.seen = bytearray(self.length)
        if pos < self.length:
            self.seen[pos] = 1
        if pos < self.low:
            return  # passed already: a re-open (see NodeCursor._reopened)
        self.consumed.add(pos)
        if pos + 1 > self.high:
            self.high = pos + 1
        floor = self.high - 2 * window
        while self.low in self.consumed or self.low < floor:
            self.consumed.discard(self.low)
            self.low += 1

    def restart(self, epoch: int, job_epoch: int, index: PassIndex | None) -> None:
        self.epoch, self.job_epoch, self.low, self.high = epoch, job_epoch, 0, 0
        self.consumed.clear()
        self.seen = None
        if index is not self.index:
            self.index = index

    def reopened(self, pos: int) -> bool:
        """Position ``pos`` was consumed in this pass already (its file opened there before)."""
        return self.seen is not None and 0 <= pos < len(self.seen) and self.seen[pos] == 1

    def finished(self, window: int) -> bool:
        """Near enough the end that the next open may be the next pass's (a loader reads to the end)."""
        return self.high >= self.length or self.low + window >= self.length


Placement = tuple[int, int, "tuple[int, int, PassIndex] | None"]
"""(slot, position, and for a new pass its (sampler epoch, job epoch, map)): where an open goes."""


@dataclass
class PassStart:
    """Where the lead dataset was when another dataset's pass began (to learn when passes come)."""

    lead_epoch: int
    lead_step: int
    at_end: bool


# ---------------------------------------------------------------------------------------- datasets


class DatasetCursor:
    """One dataset's tracks, strays and counters (see the module docstring)."""

    def __init__(self, cur: CursorBase, d: int) -> None:
        self.cur = cur
        self.d = d
        ds = cur.job.datasets[d]
        self.offset = ds.offset
        self.n = ds.n
        self.follows = ds.follows
        self.every = ds.every
        self.variants: list[Streams] = cur.job.variants(d)
        self.varies = [varies_by_epoch(v.sampler) for v in self.variants]
        self.shared = [_shared(v) for v in self.variants]
        # accelerate's prepared loader: an epoch broken off early is followed by the same order
        self.repeats = [bool(getattr(v.sampler, "repeats_unfinished", False)) for v in self.variants]
        self.variant = 0
        self.state: DatasetState = "idle"
        self.mode: Mode = "unknown"
        self.in_place = not self.varies[0]  # restarts_in_place(), kept for the hot path
        self._tracks: list[Track] = []
        self.by_rank: dict[int, Track] = {}
        settings, shape = cur.settings, cur.shape
        self.budget = 2 * shape.batch_size * shape.ranks_per_node  # 2 batches per local rank
        cap = max(64, 4 * self.budget)
        self.strays: deque[tuple[int, int]] = deque(maxlen=cap)  # (local id, dataset open number)
        self.stray_life = 16 * self.budget  # strays older than this many opens are forgotten
        self.recent: deque[int] = deque(maxlen=cap)  # every open, for a replacing plan to relock on
        self.judged: deque[bool] = deque(maxlen=max(8, settings.judge_opens))
        self.looks = 0  # hypothesis tests since the last lock
        self._lockable_key: tuple[int, int, bool, int] | None = None
        self._lockable = False
        self.next_look = 0  # evidence count at which the next test runs (each one spends budget)
        self.looked_size = 0  # evidence held at the last test
        self.stray_seen = 0  # strays since the last lock (never capped, unlike the buffer)
        self.scan_after = 0  # no full search before this dataset open number ...
        self.scan_gap = 0  # ... and the gap after the next failed one
        self.scans = 0
        self.epochs_scanned = 0
        self.finalists: list[tuple[int, int]] = []  # (variant, epoch) that came close in a search
        self.look_pending = False  # strays were carried over: look at the next slow open
        self.carried_tail = 0  # of them, the newest the replaced cursor had placed in its newest pass
        self.opens = self.hits = self.plan_opens = self.plan_hits = 0
        self.locks = 0
        self.lock_opens: int | None = None  # strays the last lock looked at
        self.mismatch_reason: str | None = None
        self.mismatch_kind: MismatchKind | None = None
        self.explained_at = 0  # strays the mismatch reason was worked out from
        self.probe_perms: tuple[int, list[tuple[str, I64]]] | None = None  # (epoch hint, orders) probed
        self.presumed_at = 0  # dataset opens when the presumption was made
        self.provisional: dict[int | None, int] = {}  # hits of the presumption, by history epoch
        self.passes = 0  # passes started since the cursor knew this dataset
        self.pass_starts: list[PassStart] = []
        self.every_steps: int | None = None  # learned: a pass every N lead steps
        self.first_step: int | None = None  # ... the first of them this many steps into an epoch
        self.every_epochs: int | None = None  # learned: a pass after every Nth lead epoch

    @property
    def tracks(self) -> list[Track]:
        return self._tracks

    @tracks.setter
    def tracks(self, tracks: list[Track]) -> None:
        self._tracks = tracks
        self.by_rank = {t.rank: t for t in tracks}

    # ---- shape of the hypotheses ---------------------------------------------------------

    @property
    def streams(self) -> Streams:
        return self.variants[self.variant]

    def key(self, variant: int, epoch: int) -> int:
        """The sampler epoch whose map stands for ``epoch`` (0 for orders that never change)."""
        return epoch if self.varies[variant] else 0

    def next_epochs(self, t: Track) -> list[int]:
        if not self.varies[self.variant]:
            return [t.epoch]
        if self.mode == "advance":
            return [t.epoch + 1]
        if self.mode == "repeat":
            return [t.epoch]
        return [t.epoch + 1, t.epoch]

    def set_mode(self, mode: Mode) -> None:
        self.mode = mode
        self.in_place = self.restarts_in_place()

    def restarts_in_place(self) -> bool:
        """Whether the next pass reads the same positions as this one (so an idle track's open
        below its watermark can only be a new pass)."""
        return not self.varies[self.variant] or self.mode == "repeat"

    def horizon(self) -> int:
        """Sampler epochs a full search covers: the planning horizon, a margin past it, and past
        anything seen (a job may run or be resumed beyond what was planned)."""
        job = self.cur.job
        seen = max([t.epoch for t in self.tracks] + [e for _v, e in self.finalists] + [self.cur.epoch, 0])
        return max(job.epochs + max(3, job.epochs // 4), seen + 3)

    def scan_order(self) -> list[tuple[int, int]]:
        """Every (variant, sampler epoch) a full search tries, likeliest first."""
        hint = self.cur.epoch_hint(self)
        out: list[tuple[int, int]] = []
        for v in range(len(self.variants)):
            if not self.varies[v]:
                out.append((v, 0))
                continue
            near = [hint, hint + 1, hint - 1, hint + 2]
            out.extend((v, e) for e in dict.fromkeys([*near, *range(self.horizon())]) if e >= 0)
        return out

    def hypotheses(self) -> int:
        """How many (variant, epoch, node, anchor) hypotheses a search may try."""
        shape = self.cur.shape
        nodes = 1 if self.cur.node_confirmed else shape.nodes
        total = 0
        h = self.horizon() + 4  # the near epochs may lie past the horizon
        for v in range(len(self.variants)):
            epochs = h if self.varies[v] else 1
            total += epochs * (1 if self.shared[v] else nodes) * 2
        return total

    def multiplicity(self, strays: int) -> float:
        """ln of the factor the chance of one hypothesis is multiplied by before it may lock.

        A union bound over everything the search may try before this lock: each hypothesis
        (:meth:`hypotheses`), each suffix of the strays it could pick (``strays``), and each look
        since the last lock -- look j spends FALSE_LOCK / ((j + 1)(j + 2)) of the budget, which
        sums to FALSE_LOCK over any number of looks.
        """
        j = self.looks
        return math.log(self.hypotheses()) + math.log(max(1, strays)) + math.log((j + 1) * (j + 2))

    def lockable(self, strays: int) -> bool:
        """Whether ``strays`` opens could lock at all, fitting perfectly (else a test is wasted).

        Asked at every open of a presumed dataset: remembered for the last (strays, looks, node,
        horizon), everything the answer depends on (the horizon grows with the epochs seen, and
        with it the hypotheses a search may try)."""
        if strays < self.cur.settings.detect_opens:
            return False
        key = (strays, self.looks, self.cur.node_confirmed, self.horizon())
        if key == self._lockable_key:
            return self._lockable
        self._lockable_key = key
        self._lockable = self._can_lock(strays)
        return self._lockable

    def _can_lock(self, strays: int) -> bool:
        shape = self.cur.shape
        m = shape.ranks_per_node
        best = 0.0
        for v, streams in enumerate(self.variants):
            length = max(1, streams.length)
            if self.shared[v]:
                distinct = max(1, strays // m)
                chance = log_chance(distinct, distinct, length, length, 1, "start")
            else:
                span = max(1, -(-strays // m))
                chance = log_chance(strays, span, length, length * shape.world_size, m, "start")
            best = min(best, chance)
        return best + self.multiplicity(strays) < _LOG_FALSE_LOCK

    # ---- counters ------------------------------------------------------------------------

    def judge_fails(self) -> bool:
        if len(self.judged) < 8:
            return False
        rate = sum(self.judged) / len(self.judged)
        chance = min(1.0, self.cur.settings.window / max(1, self.streams.length))
        return rate < max(self.cur.settings.mismatch_below, (1.0 + chance) / 2)

    def live_strays(self) -> I64:
        while self.strays and self.strays[0][1] < self.opens - self.stray_life:
            self.strays.popleft()
        return np.fromiter((g for g, _n in self.strays), dtype=np.int64, count=len(self.strays))

    def evidence(self) -> I64:
        """What hypothesis tests look at: the strays; while only presumed, every open since (hits
        under a guess prove nothing, and the pattern of hits and misses is what tells a DistributedSampler
        share from an order every rank reads)."""
        if self.state != "presumed":
            return self.live_strays()
        since = min(self.opens - self.presumed_at, len(self.recent))
        return np.fromiter(list(self.recent)[len(self.recent) - since :], dtype=np.int64, count=since)

    def evidence_size(self) -> int:
        """How much evidence is held (the buffers are capped)."""
        if self.state != "presumed":
            return len(self.strays)
        return min(self.opens - self.presumed_at, len(self.recent))

    def evidence_count(self) -> int:
        """How much evidence came in since the last lock or presumption (what tests are spaced by)."""
        return self.opens - self.presumed_at if self.state == "presumed" else self.stray_seen

    def all_finished(self) -> bool:
        return bool(self.tracks) and all(t.finished(self.cur.settings.window) for t in self.tracks)

    # ---- when passes come (for upcoming) -------------------------------------------------

    def learn_pass(self, start: PassStart) -> None:
        """A pass of this (non-lead) dataset began where the lead dataset is at ``start``."""
        self.passes += 1
        before = [p for p in self.pass_starts if p.lead_epoch == start.lead_epoch and not p.at_end]
        if start.at_end:
            ends = [p.lead_epoch for p in self.pass_starts if p.at_end]
            if ends and start.lead_epoch > ends[-1]:
                self.every_epochs = start.lead_epoch - ends[-1]
            elif self.every_epochs is None:
                self.every_epochs = self.every if self.follows is not None else 1
        elif start.lead_step > 0:
            if before and start.lead_step > before[-1].lead_step:
                self.every_steps = start.lead_step - before[-1].lead_step
            if not before:
                self.first_step = start.lead_step
                if self.every_steps is None:
                    self.every_steps = start.lead_step
        self.pass_starts.append(start)
        del self.pass_starts[:-8]

    def due_steps(self, lead_epoch: int, after: int, before: int) -> list[int]:
        """Lead steps in (after, before) of ``lead_epoch`` at which a pass of this dataset is due."""
        n = self.every_steps
        if not n:
            return []
        here = [p.lead_step for p in self.pass_starts if p.lead_epoch == lead_epoch and not p.at_end]
        first = here[-1] + n if here else (self.first_step or n)
        while first <= after:
            first += n
        return list(range(first, before, n))[:64]

    def due_at_end(self, lead_epoch: int) -> bool:
        """Whether a pass of this dataset follows the end of the lead's ``lead_epoch``."""
        ends = [p.lead_epoch for p in self.pass_starts if p.at_end]
        if ends:
            if ends[-1] == lead_epoch:
                return False  # under way or done
            return (lead_epoch - ends[-1]) % (self.every_epochs or 1) == 0
        if self.every_steps:
            return False
        return self.follows is not None and (lead_epoch + 1) % self.every == 0

    # ---- status --------------------------------------------------------------------------

    def status(self) -> DatasetCursorStatus:
        cur = self.cur
        lead = cur.lead == self.d
        return {
            "dataset": self.d,
            "lead": lead,
            "state": self.state,
            "sampler": sampler_name(self.streams.sampler),
            "mode": self.mode,
            "epoch": min((t.job_epoch for t in self.tracks), default=None),
            "sampler_epoch": min((t.epoch for t in self.tracks), default=None),
            "rank_positions": {str(t.rank): [t.job_epoch, t.low, t.high] for t in self.tracks},
            "passes": self.passes,
            "opens": self.opens,
            "hits": self.hits,
            "plan_opens": self.plan_opens,
            "plan_hits": self.plan_hits,
            "locks": self.locks,
            "lock_opens": self.lock_opens,
            "strays": len(self.strays),
            "searches": self.scans,
            "epochs_searched": self.epochs_scanned,
            "every_steps": None if lead else self.every_steps,
            "every_epochs": None if lead else self.every_epochs,
            "mismatch_reason": self.mismatch_reason,
            "mismatch_kind": self.mismatch_kind,
        }


def _shared(streams: Streams) -> bool:
    """Whether every rank reads the same order (then opens cannot tell which node this is)."""
    sampler = streams.sampler
    shared = getattr(sampler, "shared", None)
    if isinstance(shared, bool):  # the framework models say so
        return shared
    if isinstance(sampler, DistributedSamplerModel):
        return False
    if isinstance(sampler, (RandomSamplerModel, ExplicitOrderModel)):
        return True
    return streams.layout(0).shared


# ---------------------------------------------------------------------------------------- the node


class CursorBase:
    """The cursor's state and placing: counters, epoch maps, presuming, each open onto a track.

    Attributes and helpers :class:`~placement.cursor_lock.CursorLocking` and
    :class:`~placement.cursor_horizon.CursorHorizon` build on; :class:`~placement.cursor.NodeCursor`
    combines the three."""

    def __init__(
        self,
        job: JobStreams,
        settings: CursorSettings,
        start_epoch: int = 0,
        previous: CursorBase | None = None,
        regid: Callable[[npt.NDArray[np.int64]], npt.NDArray[np.int64]] | None = None,
    ) -> None:
        """``regid``: the replaced plan's global ids -> this plan's (-1: not in it), for the opens
        ``previous`` carries over when this plan lists the files in another order (the catalog order
        seed discovery found): carried as they were, they would name other files, fit nothing, and
        the new plan would wait for two more batches per local rank of opens to lock."""
        self.job = job
        self.shape = job.shape
        self.settings = settings
        self.lead = job.lead
        self.node: int | None = None
        self.node_confirmed = False
        if job.shape.nodes == 1:  # nothing to infer
            self.node, self.node_confirmed = 0, True
        self._epoch = start_epoch
        self._index: LRU[tuple[int, int, int], PassIndex] = LRU(6 + 2 * len(job.datasets))
        self.segment = 0  # runs of opens of one dataset, numbered
        self.last_d: int | None = None
        self.opens = self.hits = 0  # cumulative over every plan of this mount
        self.plan_opens = self.plan_hits = 0  # under this plan
        self.plans = 1
        self.first_mismatch_open: int | None = None
        self.history: dict[int, list[int]] = {}  # lead epoch -> [opens, hits]
        self._unplaced = [0, 0]  # opens and hits before the lead's epoch was known
        self.datasets = [DatasetCursor(self, d) for d in range(len(job.datasets))]
        self._ends = [d.offset + d.n for d in job.datasets]
        self._lead_epoch: int | None = None  # the lead's job epoch while it is placed, else None
        self._replaying = False  # relocking on carried opens: passes found then teach no schedule
        if previous is not None:
            self._carry(previous, regid)

    # ---- construction from an older plan -------------------------------------------------

    def _carry(
        self, old: CursorBase, regid: Callable[[npt.NDArray[np.int64]], npt.NDArray[np.int64]] | None = None
    ) -> None:
        self.opens, self.hits = old.opens, old.hits
        self.plans = old.plans + 1
        self.first_mismatch_open = old.first_mismatch_open
        # C-level copies (atomic under the GIL): a worker may still be observing on ``old``.
        self.history = {e: list(v) for e, v in dict(old.history).items()}
        self._unplaced = list(old._unplaced)
        self._epoch = old.epoch
        if old.shape == self.shape and old.node_confirmed:
            self.node, self.node_confirmed = old.node, True
        same = len(old.datasets) == len(self.datasets) and all(
            (a.offset, a.n) == (b.offset, b.n) for a, b in zip(old.datasets, self.datasets, strict=True)
        )
        if not same:
            return
        for a, b in zip(old.datasets, self.datasets, strict=True):
            b.opens, b.hits = a.opens, a.hits
            b.set_mode(a.mode)
            b.pass_starts = list(a.pass_starts)
            b.every_steps, b.first_step, b.every_epochs, b.passes = (
                a.every_steps,
                a.first_step,
                a.every_epochs,
                a.passes,
            )
            recent = a.recent.copy()
            if regid is not None and recent:  # dataset-local indices, through global ids
                ids = regid(np.fromiter(recent, dtype=np.int64, count=len(recent)) + a.offset)
                recent = deque(int(g) - b.offset for g in ids.tolist() if b.offset <= g < b.offset + b.n)
            tracks = list(a.tracks)  # (C-level copies again)
            if a.state == "tracking" and tracks:
                newest = max(t.job_epoch for t in tracks)
                b.carried_tail = sum(t.seen.count(1) for t in tracks if t.job_epoch == newest and t.seen is not None)
            for i, g in enumerate(recent):
                b.strays.append((g, b.opens - len(recent) + i))
            # Also this cursor's own recent opens: a plan that replaces this one before it observed
            # anything (two plans between two turns) carries them on, instead of nothing.
            b.recent.extend(recent)
            if recent:
                b.state = "detecting"
                b.look_pending = True

    # ---- overall view --------------------------------------------------------------------

    @property
    def state(self) -> CursorState:
        """The lead dataset's state; before it was opened, detecting (or mismatch if another dataset is).

        Never tracking on another dataset's lock alone: Lightning's sanity check reads validation
        batches before any training file, and a validation order (``shuffle=False``) fits every
        seed's plan.  Called tracking, the job looked located under the assumed seed's plan (status
        said tracking, then detecting at the first training open: a lock taken back), and the read
        policy followed that plan's view (its fill of the tiers starts once a view tracks).  The
        validation set is still predicted as it is read (its own state).
        """
        lead = self.datasets[self.lead].state
        if lead == "idle":
            return "mismatch" if any(dc.state == "mismatch" for dc in self.datasets) else "detecting"
        return lead

    @property
    def epoch(self) -> int:
        """The lead dataset's job epoch (its pass count when the loop does not call set_epoch)."""
        return self._epoch

    @property
    def tracks(self) -> dict[int, Track]:
        """The lead dataset's tracks by global rank."""
        return {t.rank: t for t in self.datasets[self.lead].tracks}

    @property
    def mismatch_reason(self) -> str | None:
        lead = self.datasets[self.lead]
        if lead.mismatch_reason:
            return lead.mismatch_reason
        return next((dc.mismatch_reason for dc in self.datasets if dc.mismatch_reason), None)

    @property
    def mismatch_kind(self) -> MismatchKind | None:
        """Why the opens fit nothing (see :data:`MismatchKind`), with :attr:`mismatch_reason`."""
        lead = self.datasets[self.lead]
        if lead.mismatch_reason:
            return lead.mismatch_kind
        return next((dc.mismatch_kind for dc in self.datasets if dc.mismatch_reason), None)

    @property
    def hit_rate(self) -> float:
        return self.hits / self.opens if self.opens else 0.0

    def epoch_hint(self, dc: DatasetCursor) -> int:
        if dc.tracks:
            return min(t.epoch for t in dc.tracks)
        lead = self.datasets[self.lead]
        if lead.tracks:
            return min(t.epoch for t in lead.tracks)
        return self._epoch

    def rank_of_slot(self, slot: int) -> int:
        node = self.node if self.node is not None else 0
        return self.shape.ranks_of_node(node)[slot]

    # ---- epoch maps ----------------------------------------------------------------------

    def index(self, dc: DatasetCursor, variant: int, epoch: int, build: bool = True) -> PassIndex | None:
        key = (dc.d, variant, dc.key(variant, epoch))
        if key in self._index:
            return self._index.get(key, _unreachable)
        if not build:
            return None
        streams = dc.variants[variant]
        return self._index.get(key, lambda: PassIndex(streams.fresh_inverse(key[2])))

    def _keep(self, key: tuple[int, int, int], idx: PassIndex) -> None:
        self._index.get(key, lambda: idx)

    # ---- presuming -----------------------------------------------------------------------

    def _presume(self, dc: DatasetCursor, epoch: int, job_epoch: int) -> None:
        dc.state = "presumed"
        dc.presumed_at = dc.opens
        dc.provisional = {}
        dc.next_look = dc.looked_size = 0
        ranks = self.shape.ranks_of_node(self.node if self.node is not None else 0)
        length = dc.streams.length
        dc.tracks = [Track(s, r, epoch, job_epoch, length) for s, r in enumerate(ranks)]
        if dc.d == self.lead:
            self._lead_moved()
        else:
            self._pass_started(dc)

    def _first_open(self, dc: DatasetCursor) -> None:
        """A dataset other than the lead is opened for the first time: presume a pass from its start.

        Validation passes start at the beginning, and a small validation set may never give the
        evidence a lock needs: its whole pass fits in the batches the workers hold in flight, so
        no order can be told from another, and all of them predict the same files.  Presuming
        predicts it anyway; opens that do not fit go to the search like any others.  The node
        must be known for a DistributedSampler's share (every rank reading all is node-free).
        """
        if dc.d == self.lead or (self.node is None and not dc.shared[dc.variant]):
            return
        epoch = 0 if not dc.varies[dc.variant] else self.epoch_hint(dc)
        self._presume(dc, epoch, dc.passes)

    # ---- counting ------------------------------------------------------------------------

    def _count_epochs(self, epoch: int | None, opens: int, hits: int) -> None:
        """Count ``opens`` opens, ``hits`` of them predicted, in ``epoch``'s history (None: the
        lead's epoch is not known yet, settled at its lock)."""
        row = self._unplaced if epoch is None else self.history.setdefault(epoch, [0, 0])
        row[0] += opens
        row[1] += hits

    def _settle_unplaced(self) -> None:
        """Opens seen before the lead's epoch was known belong to the epoch it locked on."""
        for dc in self.datasets:
            if None in dc.provisional:
                dc.provisional[self.epoch] = dc.provisional.get(self.epoch, 0) + dc.provisional.pop(None)
        if self._unplaced[0]:
            row = self.history.setdefault(self.epoch, [0, 0])
            row[0] += self._unplaced[0]
            row[1] += self._unplaced[1]
            self._unplaced = [0, 0]

    # ---- placing -------------------------------------------------------------------------

    def _find(self, dc: DatasetCursor, i: int, segment: int, build: bool) -> Placement | Literal[False] | None:
        """Where local file ``i`` goes: a Placement, False (a stray), or None (a map is not built).

        The hot path (microseconds): each track holds its pass's map; a file's (rank, position) is
        looked up once per map, and a DistributedSampler file belongs to one rank only.
        """
        state = dc.state
        if (state != "tracking" and state != "presumed") or not dc.tracks:
            return False
        window = self.settings.window
        in_place = dc.in_place
        repeats = dc.repeats[dc.variant]
        first = dc.tracks[0].index
        if first is not None and not first.shared and all(u.index is first for u in dc.tracks):
            # A DistributedSampler file belongs to one rank: straight to its track (no loop over all).
            r = int(first.rank_of[i])
            t = dc.by_rank.get(r)
            if t is not None and (first.repeated is None or not first.repeated[i]):
                pos = int(first.pos_of[i])
                if in_place and t.segment != segment and pos < t.low and pos < window:
                    return (t.slot, pos, (t.epoch, t.job_epoch + 1, first))
                if t.low <= pos < t.high + window and pos not in t.consumed:
                    return (t.slot, pos, None)
                if repeats and pos < window and (pos < t.low or pos in t.consumed) and not t.finished(window):
                    return (t.slot, pos, (t.epoch, t.job_epoch + 1, first))  # broken off: the same order again
        prev: PassIndex | None = None
        r = p = -1
        repeated = shared = False
        # Ranks in different passes (one started its next epoch, another still reads its last or
        # broken-off one): a file may fit several tracks, and the track it comes next in is the one
        # it belongs to.  Taken by the first track that fit, a broken-off loader's last in-flight
        # files, opened after the other rank began its next epoch, landed up to a window ahead in
        # that epoch and pushed the track's progress there; it then left the epoch early, and up
        # to 28 opens of the next plain epoch went unpredicted (replays of that order).
        near: Placement | None = None
        near_ahead = 0
        for t in dc.tracks:
            idx = t.index
            if idx is None:
                idx = self.index(dc, dc.variant, t.epoch, build)
                if idx is None:
                    return _NEED
                t.index = idx
            if idx is not prev:
                prev = idx
                r = int(idx.rank_of[i])
                p = int(idx.pos_of[i])
                shared = idx.shared
                repeated = idx.repeated is not None and bool(idx.repeated[i])
            if r < 0:
                continue
            if repeated:
                candidates = idx.positions(i, t.rank)
            elif shared or r == t.rank:
                candidates = [p]
            else:
                continue
            for pos in candidates:
                if in_place and t.segment != segment and pos < t.low and pos < window:
                    # An interrupted or finished pass of an order that does not change: a new pass.
                    return near or (t.slot, pos, (t.epoch, t.job_epoch + 1, idx))
                if t.low <= pos < t.high + window and pos not in t.consumed:
                    if shared:
                        return (t.slot, pos, None)
                    ahead = max(0, pos - t.high)
                    if near is None or ahead < near_ahead:
                        near, near_ahead = (t.slot, pos, None), ahead
                    continue
                if (
                    repeats
                    and not repeated
                    and pos < window
                    and (pos < t.low or pos in t.consumed)
                    and not t.finished(window)
                ):
                    # A loop that left its epoch early reads the same order again (accelerate).
                    return near or (t.slot, pos, (t.epoch, t.job_epoch + 1, idx))
        if near is not None:
            return near
        if len(dc.variants) > 1 and (
            any(t.high < t.length for t in dc.tracks)
            or (dc.variant != 0 and dc.variants[0].length > dc.tracks[0].length)
        ):
            padding = self._end_padding(dc, i, build)
            if padding is not False:
                return padding
        # The next pass's start; with set_epoch or not still unknown, the candidate that puts the
        # file nearer the start (where a new pass's first opens are; a wrong one's are anywhere),
        # over every finished track: a DistributedSampler file belongs to another rank in each
        # epoch, so the first track's candidate (its rank's, in the order that does not change)
        # must not win for want of looking at the rank the file is really for.  Taken from the
        # first track only, the order set_epoch does not change won a quarter of the runs of a
        # 300-sample epoch (its position only had to be under the window) and set the mode to
        # "repeat" for good.  A DataLoader worker opens its batch's samples in order, so a pass's
        # first open is a batch's first sample: an aligned candidate beats a nearer unaligned one.
        best: Placement | None = None
        best_key = (True, 0)
        batch = max(1, self.shape.batch_size)
        for t in dc.tracks:
            if not t.finished(window):
                continue
            epochs = dc.next_epochs(t)
            if repeats and t.high < t.length and t.epoch not in epochs:
                epochs = [*epochs, t.epoch]  # a loop that left near the end reads the same order again
            for e in epochs:
                nxt = self.index(dc, dc.variant, e, build)
                if nxt is None:
                    return _NEED
                for pos in nxt.positions(i, t.rank):
                    key = (pos % batch != 0, pos)
                    if pos < window and (best is None or key < best_key):
                        best, best_key = (t.slot, pos, (e, t.job_epoch + 1, nxt)), key
        return best if best is not None else self._reopened(dc, i)

    @staticmethod
    def _reopened(dc: DatasetCursor, i: int) -> Placement | Literal[False]:
        """Local file ``i`` opened where its track consumed it already in this pass: the earlier
        open was another pass's, taken for this one by chance.

        A lock takes the newest opens back to where they stop fitting, and an open of the pass
        before fits the new one by chance (inside its window: about one in four each).  A
        DataLoader reads a position once a pass, so this open is the real one (it missed): placed
        where the track already is, nothing moves.  Asked last, after every other placement.
        """
        for t in dc.tracks:
            for pos in t.index.positions(i, t.rank) if t.index is not None else ():
                if t.reopened(pos):
                    return (t.slot, pos, None)
        return False

    def _end_padding(self, dc: DatasetCursor, i: int, build: bool) -> Placement | Literal[False] | None:
        """Local file ``i``, opened again near the end of a pass this node has not finished: the end
        padding of another variant (accelerate's even_batches completes the last round of batches
        with the epoch's first samples, where a DistributedSampler pads one sample per rank)?

        The two share one permutation and differ locally only there, so a lock may have taken either;
        taking such a re-read for the start of the next pass instead would learn a wrong mode
        (``repeat``) and count an epoch too many.  A genuine next pass starts only once the node's
        ranks opened their whole pass (their steps are in lockstep), which is what ``_find`` asks
        before calling this.  A lock on another variant than the configured one (a few opens fit a
        DistributedSampler's sample-wise sharding of accelerate's permutation more tightly) ends its
        tracks at 252 positions per rank where accelerate's pass has 256: when the other local
        rank's padding batch is opened last, every track has ended before it comes, and its re-reads
        are still taken for the configured sampler's padding (seen in a real accelerate run: a wrong
        ``repeat`` mode, then 15-22 of 512 opens unpredicted in each later epoch, and an epoch
        counted twice per pass).  Not the other way round: after the configured sampler's whole
        pass, a re-read of a file another variant pads with is the next pass's first open (a
        DistributedSampler's epochs of 300 files: 12 of 60 worker interleavings took it for padding).
        When the followed variant read ``i`` already in this pass and another variant reads ``i``
        twice in it, the second time in a local rank's last batch, the cursor follows that variant
        from its last window on (the tracks' remaining opens are that window's) and places the open
        there.
        """
        tracks = dc.tracks
        epoch = tracks[0].epoch
        if any(t.epoch != epoch or t.job_epoch != tracks[0].job_epoch for t in tracks) or not any(
            t.finished(self.settings.window) for t in tracks
        ):
            return False
        # Padding re-reads what the pass under way read already: a file the followed variant does not
        # read in this pass at all (the tail of a drop_last validation set every rank reads) is not it.
        here = tracks[0].index
        if here is None or int(here.rank_of[i]) < 0:
            return False
        if not any(p < t.low or p in t.consumed for t in tracks for p in here.positions(i, t.rank)):
            return False
        batch = self.shape.batch_size
        # Every track ended: _find asks only when the configured variant's pass is the longer one.
        done = all(t.high >= t.length for t in tracks)
        for v, streams in enumerate(dc.variants):
            if v == dc.variant or dc.shared[v] or dc.varies[v] != dc.varies[dc.variant] or (done and v != 0):
                continue
            idx = self.index(dc, v, epoch, build)
            if idx is None:
                return _NEED
            if idx.repeated is None or not idx.repeated[i]:
                continue
            length = streams.length
            for t in tracks:
                ends = [p for p in idx.positions(i, t.rank) if p >= length - batch]
                if not ends:
                    continue
                dc.variant = v
                dc.in_place = dc.restarts_in_place()
                start = max(0, length - self.settings.window)
                for u in tracks:
                    u.index, u.length, u.low, u.high = idx, length, start, start
                    u.consumed.clear()
                    u.seen = None
                return (t.slot, ends[0], None)
        return False

    def _commit(self, dc: DatasetCursor, placement: Placement, segment: int) -> Track:
        slot, pos, restart = placement
        t = dc.tracks[slot]
        if restart is not None:
            epoch, job_epoch, idx = restart
            broken = dc.repeats[dc.variant] and epoch == t.epoch and t.high < t.length
            if dc.varies[dc.variant] and dc.mode == "unknown" and not broken:
                # (a pass broken off early and read again says nothing about set_epoch)
                dc.set_mode("advance" if epoch == t.epoch + 1 else "repeat")
            if all(u.job_epoch < job_epoch for u in dc.tracks):  # the first rank into the new pass
                self._pass_started(dc)
            t.restart(epoch, job_epoch, idx)
            if dc.d == self.lead:
                self._lead_moved()
        t.consume(pos, self.settings.window)
        t.segment = segment
        return t

    def _lead_moved(self) -> None:
        """The lead's job epoch (what history counts opens under), after its tracks changed."""
        lead = self.datasets[self.lead]
        self._lead_epoch = None  # opens wait in _unplaced for the epoch a lock (or confirmation) finds
        if lead.tracks and lead.state in ("tracking", "presumed"):
            self._epoch = min(t.job_epoch for t in lead.tracks)
            if lead.state == "tracking":
                self._lead_epoch = self._epoch

    def _pass_started(self, dc: DatasetCursor) -> None:
        """A pass of ``dc`` began: learn where the lead is then (when such passes come).

        Not while relocking on carried opens (``_look_carried``): they replay the past, and
        the lead is already where its newest carried opens put it, not where it was when the pass
        began.  A sanity check's pass, relocked after the training set's, was learned at training's
        step 4 as "every 4 steps", and the horizon filled with validation passes (the rest of the
        epoch went unstaged).  The replaced cursor learned those passes as they came; its schedule
        is carried over."""
        if dc.d == self.lead or self._replaying:
            return
        lead = self.datasets[self.lead]
        if lead.state not in ("tracking", "presumed") or not lead.tracks or all(t.high == 0 for t in lead.tracks):
            dc.passes += 1  # before the lead read anything (a sanity check): no schedule to learn
            return
        step = min(t.low for t in lead.tracks) // self.shape.batch_size
        dc.learn_pass(PassStart(self.epoch, step, lead.all_finished()))


def _unreachable() -> PassIndex:
    raise AssertionError("checked to be cached")
