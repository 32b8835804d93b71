"""Where this node's ranks are in their predicted streams, inferred from the files being opened.

The daemon knows neither the epoch, nor the step, nor which ranks it hosts, nor whether the job
validates, resumed from a checkpoint or calls ``set_epoch``.  It sees opens.  Every dataset of the
job is followed on its own (:class:`DatasetCursor`): a training set, a validation set read between
epochs or every N steps, a sanity pass before epoch 0 never disturb each other's tracks.

Per dataset and local rank a :class:`Track` holds the pass being read (sampler epoch, the job
epoch it stands for) and a low watermark; an open is *predicted* when it falls within ``window``
positions ahead of its rank's progress (DataLoader workers reorder opens by up to about
(W - 1) x batch and keep W x prefetch_factor batches in flight).  A rank that finished its pass
goes on at the start of its next one: epoch e + 1 when the loop calls ``set_epoch``, epoch e again
when it does not (``mode``, learned from the opens), the same order for a sampler that does not
shuffle (validation); a pass another dataset interrupted (Lightning's 2-batch sanity check) starts
over from the beginning.

Opens nothing predicts are *strays*.  They are tested against hypotheses -- (sampler variant,
sampler epoch, node, position) -- and the cursor locks on, or relocks (a resume in the middle of
an epoch, a new seed, an early break, a jump), as soon as one hypothesis explains them so well that
an unrelated order would do so by chance less than :data:`FALSE_LOCK`, with the chance multiplied
by every hypothesis, suffix and repeated test the search may try (:func:`log_chance`,
:meth:`DatasetCursor.multiplicity`).  Likely hypotheses (where the tracks are and go next) are
tried at every test, all epochs up to past the planning horizon only when those fail.  If nothing
explains plenty of strays: a mismatch (wrong seed, sampler not modelled).

A *presumed* dataset predicts before any proof: the lead from the start of an epoch when the daemon
knows the seed and the node (:meth:`NodeCursor.presume`), any other dataset from the start of its
first pass when it is first opened (a validation set small enough that its whole pass is in the
loader's batches in flight can never prove an order, and every order predicts the same files).
Its opens are tested like strays until a lock confirms or replaces it; hits of a presumption the
opens refute are withdrawn from the counters.

API (what the daemon calls):

* ``NodeCursor(job, settings, start_epoch=0, previous=None)``: ``job`` is the plan's
  :class:`~placement.jobstreams.JobStreams`, ``settings`` from :meth:`CursorSettings.for_job`.
  ``previous``: the cursor of the plan this one replaces (a rewritten seed): cumulative counters,
  history, the node, learned pass schedules and each dataset's recent opens carry over (with how
  many of them the old cursor placed in its newest pass, a boundary the relock keeps), and the
  new plan relocks on those opens at the next slow step (``prepare()`` or a slow ``observe``).
* ``presume(node, epoch=0)``: predict the lead dataset from the start of ``epoch`` for ``node``.
* ``observe(gid) -> bool``: record one open (global file id); True when it was predicted.
* ``observe_while_quick(gids) -> (observed, predicted)``: the same for as long as each open is
  quick (microseconds: placing with built maps); leaves the rest -- tests of strays, a dataset's
  first open, a permutation for a new epoch -- to the caller's worker thread (``observe``).
* ``upcoming_gids(limit) -> (epochs, gids)`` arrays, and ``upcoming(limit) -> [(epoch, gid)]``:
  what this node opens next, local ranks interleaved batch by batch, across datasets: a pass under
  way first, training in order, a validation pass where one is due (after an epoch, or every N
  steps, as learned from the passes seen; the config's ``follows``/``every`` before any was seen).
  ``epochs`` are the lead's job epochs at which each is read.  May build the next epoch's map.
* ``prepare()``: build the maps the quick path will need next and test carried-over opens.
* ``status()``: JSON-able, see :meth:`NodeCursor.status`; ``state`` (:data:`CursorState`),
  ``node``, ``epoch``, ``opens``, ``hits``, ``hit_rate``, ``mismatch_reason``,
  ``first_mismatch_open`` as attributes; ``tracks``: the lead's tracks by global rank (each with
  ``epoch``, ``job_epoch``, ``low``, ``high``); ``datasets``: the :class:`DatasetCursor` list.
* ``progress_key(step)``: a hashable that changes when any dataset's rank moved ``step``
  positions or any state changed (when a window computed from ``upcoming`` is stale).

Threads: the cursor is not thread-safe; one caller at a time (the daemon's cursor loop).  Building
a cursor with ``previous=`` only reads the old one's counters and buffers; doing so while a worker
thread still observes on the old one costs at most the opens of that batch.

Pure state machine: no I/O, no clocks; the daemon feeds it opens and asks it what comes next.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, TypedDict

import numpy as np
import numpy.typing as npt

from placement.frameworks import epoch_permutation, unpredictable_reason
from placement.jobstreams import JobStreams
from placement.prob import log_comb
from placement.samplers import (
    LRU,
    DistributedSamplerModel,
    ExplicitOrderModel,
    RandomSamplerModel,
    sampler_name,
    varies_by_epoch,
)
from placement.shapeprobe import ShapeFit, probe_shapes
from placement.statusfields import counter, gauge, state, text
from placement.streams import EpochInverse, JobShape, Streams

CursorState = Literal["detecting", "presumed", "tracking", "mismatch"]
MismatchKind = Literal["wrong_seed", "wrong_shape", "unpredictable"]
"""Why opens fit no hypothesis: ``wrong_shape`` when they fit the plan's permutation under another job
shape (:mod:`placement.shapeprobe`), ``unpredictable`` when the configured sampler's order is not
decided by a seed a script states (:data:`placement.frameworks.UNPREDICTABLE`), else ``wrong_seed``
(a wrong seed, or a sampler not modelled)."""
DatasetState = Literal["idle", "detecting", "presumed", "tracking", "mismatch"]
Mode = Literal["unknown", "advance", "repeat"]
"""How a dataset's next pass relates to the last: ``advance`` (set_epoch: epoch + 1), ``repeat``
(the same sampler epoch again: no set_epoch).  Samplers that do not shuffle need neither."""
Anchor = Literal["start", "anywhere"]


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
            "the opens fit no epoch, node or position of the plan (wrong seed or an unmodelled sampler): "
            "the daemon falls back to its reactive policy"
        ),
    ]
    mismatch_reason: Annotated[str | None, text("why, or null")]
    mismatch_kind: Annotated[MismatchKind | None, text("wrong_seed, wrong_shape or unpredictable; null")]
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


FALSE_LOCK = 1e-6
"""Accepted chance that opens of another order (wrong seed, epoch or node) are taken for this one."""

VARIANT_MARGIN = math.log(1e3)
"""How much likelier (ln) a fit of another sampler variant must be to replace the one followed."""

LOOK_GROWTH = 1.25
"""Strays grow by this factor between two tests of them: the union bound then pays for about
log(strays) tests rather than one per stray, and little evidence goes untested."""

I64 = npt.NDArray[np.int64]
_LOG_FALSE_LOCK = math.log(FALSE_LOCK)
_NEED = None  # _find: an epoch map is needed that is not built (the quick path stops)
_EMPTY = np.zeros(0, dtype=np.int64)


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


# ---------------------------------------------------------------------------------------- chances


def log_chance(distinct: int, span: int, length: int, slots: int, per_position: int, anchor: Anchor) -> float:
    """ln of the chance that ``distinct`` files of an unrelated order fit one hypothesis this well.

    The hypothesis maps each file to a slot (rank, position) of one epoch, ``slots`` in all
    (world_size x length for a DistributedSampler, ``length`` when every rank reads the same
    order).  Under a wrong seed, epoch or sampler those files land on ``distinct`` slots drawn
    uniformly without replacement (two different permutations look random to each other).  They
    *fit* when all of them land on this node's ranks within one window of ``span`` positions,
    which holds ``per_position * span`` slots (per_position: the node's ranks, or 1 for a shared
    order).  For a window fixed at the start of the epoch that chance is
    C(per_position * span, distinct) / C(slots, distinct); a window anywhere adds a union over its
    ``length - span + 1`` starting points.  The caller multiplies by the number of hypotheses it
    may try (nodes, epochs, variants, anchors, suffixes, repeated looks): a Bonferroni bound.
    """
    if distinct <= 0:
        return 0.0
    held = min(per_position * span, slots)
    out = log_comb(held, distinct) - log_comb(slots, distinct)
    if anchor == "anywhere":
        out += math.log(max(1, length - span + 1))
    return min(0.0, out)


# ---------------------------------------------------------------------------------------- epochs


class PassIndex:
    """One (dataset variant, sampler epoch): file -> (rank, position), and each rank's stream.

    ``repeated`` marks files read more than once by the epoch's ranks (DistributedSampler padding,
    a list with repeats): their first position is not the only one, so they are looked up in the
    rank's stream and never used as evidence.
    """

    __slots__ = ("inv", "length", "pos_of", "rank_of", "repeated", "shared")

    def __init__(self, inv: EpochInverse) -> None:
        self.inv = inv
        self.length = inv.length
        self.rank_of = inv.rank_of
        self.pos_of = inv.pos_of
        lay = inv.layout
        self.shared = lay.shared
        if lay.shared:
            flat = lay.order[: self.length]
            n = inv.rank_of.shape[0]
            self.repeated: npt.NDArray[np.bool_] | None = (
                None if lay.distinct >= flat.shape[0] else np.bincount(flat, minlength=n) > 1
            )
        else:
            self.repeated = inv.duplicated if inv.duplicated.any() else None

    def positions(self, i: int, rank: int) -> list[int]:
        """Where ``rank`` reads local file ``i`` in this pass (usually one position, or none)."""
        r = int(self.rank_of[i])
        if r < 0:
            return []
        if self.repeated is None or not self.repeated[i]:
            return [int(self.pos_of[i])] if self.shared or r == rank else []
        return np.flatnonzero(self.inv.rank_row(rank) == i).tolist()

    def row(self, rank: int) -> I64:
        return self.inv.rank_row(rank)


@dataclass(frozen=True, eq=False)
class Fit:
    """How well one hypothesis explains the newest strays (their longest consistent suffix)."""

    variant: int
    epoch: int  # sampler epoch
    anchor: Anchor
    node: int | None  # None: the order is shared by every rank (the node is not identifiable)
    explained: int  # strays in the suffix
    distinct: int  # files in it usable as evidence
    span: int
    repeats: int  # opens of a file already opened in the suffix (local ranks sharing an order)
    log_chance: float
    slots: I64  # per suffix entry: the local slot reading it (-1: any, a shared order)
    positions: I64  # per suffix entry: its position (-1: no evidence, placed later)

    def plausible(self, strays: int) -> bool:
        """Explains most of what was seen: worth waiting for more evidence rather than searching on."""
        return self.explained >= max(3, (strays + 1) // 2)


def fit_strays(
    index: PassIndex,
    local: I64,
    shape: JobShape,
    *,
    variant: int,
    epoch: int,
    node: int | None,
    cap: int,
    anchor: Anchor,
) -> Fit | None:
    """Test one hypothesis on strays ``local`` (dataset-local ids, oldest first), vectorised.

    Walks back from the newest stray while the strays stay one node's reads within ``cap``
    positions (from the epoch's start for ``anchor="start"``): older strays may belong to what
    came before a break.  In a DistributedSampler order a file is read once per epoch, so a
    file opened twice ends the suffix; in an order every rank shares, each local rank opens it.
    """
    k = local.shape[0]
    if k == 0:
        return None
    rank = index.rank_of[local].astype(np.int64)
    pos = index.pos_of[local].astype(np.int64)
    unread = rank < 0
    rep = index.repeated[local] if index.repeated is not None else np.zeros(k, dtype=np.bool_)
    neutral = rep & ~unread  # read elsewhere too: no evidence, no violation
    if index.shared:
        slots = np.full(k, -1, dtype=np.int64)
        bad = unread.copy()
        fit_node = node
    else:
        safe = np.maximum(rank, 0)
        nodes = shape.rank_nodes()[safe].astype(np.int64)
        fit_node = node
        if fit_node is None:
            usable = np.flatnonzero(~unread & ~neutral)
            if usable.shape[0] == 0:
                usable = np.flatnonzero(~unread)  # only repeated files: their first reads
            if usable.shape[0] == 0:
                return None
            fit_node = int(nodes[usable[-1]])
        bad = unread | (~neutral & (nodes != fit_node))
        slots = np.where(bad | neutral, -1, shape.rank_slots()[safe].astype(np.int64))
    # Opens of a file that is opened again later in the buffer.
    uniq, inverse = np.unique(local, return_inverse=True)
    last = np.full(uniq.shape[0], -1, dtype=np.int64)
    np.maximum.at(last, inverse, np.arange(k, dtype=np.int64))
    again = last[inverse] != np.arange(k)
    if not index.shared:
        bad |= again & ~neutral
    evidence = ~bad & ~neutral
    low = np.where(evidence, pos, np.iinfo(np.int64).max)[::-1]
    high = np.where(evidence, pos, -1)[::-1]
    rmin = np.minimum.accumulate(low)
    rmax = np.maximum.accumulate(high)
    span = rmax + 1 if anchor == "start" else np.where(rmax >= 0, rmax - rmin + 1, 0)
    violation = bad[::-1] | (span > cap)
    n_ok = int(np.argmax(violation)) if violation.any() else k
    if n_ok == 0:
        return None
    start = k - n_ok
    R = int(span[n_ok - 1])
    if not index.shared and fit_node is not None and neutral[start:].any():
        R = _promote_first_reads(
            shape, rank, pos, evidence, neutral, again, slots, nodes, fit_node, start, R, cap, anchor
        )
    suffix_ev = evidence[start:]
    distinct = int(np.unique(local[start:][suffix_ev]).shape[0]) if suffix_ev.any() else 0
    repeats = int(again[start:].sum())
    length = index.length
    if index.shared:
        total, per_position = length, 1
    else:
        total, per_position = length * shape.world_size, shape.ranks_per_node
    chance = log_chance(distinct, max(R, 1), length, total, per_position, anchor)
    positions = np.where(evidence | neutral, pos, -1)[start:]
    return Fit(
        variant,
        epoch,
        anchor,
        fit_node if not index.shared else node,
        n_ok,
        distinct,
        R,
        repeats,
        chance,
        slots[start:],
        positions,
    )


def _promote_first_reads(
    shape: JobShape,
    rank: I64,
    pos: I64,
    evidence: npt.NDArray[np.bool_],
    neutral: npt.NDArray[np.bool_],
    again: npt.NDArray[np.bool_],
    slots: I64,
    nodes: I64,
    fit_node: int,
    start: int,
    span: int,
    cap: int,
    anchor: Anchor,
) -> int:
    """Count repeated files of the suffix ``start:`` as evidence at their first read where it fits.

    Padding repeats the start of an epoch at its end (DistributedSampler: a few files;
    accelerate's even_batches: up to a round of batches, which are then the very files an epoch
    opens first).  Such a file opened where the suffix's other evidence is -- its first read on
    this node within the span -- is placed like any other: under an unrelated order its first read
    is as uniformly placed as any file's.  One that does not fit stays neutral (it may be the
    later read).  Updates the arrays in place; returns the suffix's span.
    """
    seg = slice(start, None)
    cand = neutral[seg] & ~again[seg] & (nodes[seg] == fit_node)
    ev = pos[seg][evidence[seg]]
    if anchor == "start":
        cand &= pos[seg] < cap
    elif ev.shape[0]:
        cand &= (pos[seg] > int(ev.max()) - cap) & (pos[seg] < int(ev.min()) + cap)
    else:
        return span  # nothing to anchor a window anywhere
    if not cand.any():
        return span
    placed = pos[seg][evidence[seg] | cand]
    new_span = int(placed.max()) + 1 if anchor == "start" else int(placed.max() - placed.min()) + 1
    if new_span > cap:
        return span
    evidence[seg] |= cand
    neutral[seg] &= ~cand
    slots[seg] = np.where(cand, shape.rank_slots()[np.maximum(rank[seg], 0)].astype(np.int64), slots[seg])
    return new_span


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

    def __init__(self, cur: NodeCursor, d: int) -> None:
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
        self._lockable_key: tuple[int, int, bool] | None = None
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

    # ---- shape of the hypotheses ------------------------------------------------------------

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

        Asked at every open of a presumed dataset: remembered for the last (strays, looks, node)."""
        if strays < self.cur.settings.detect_opens:
            return False
        key = (strays, self.looks, self.cur.node_confirmed)
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

    # ---- when passes come (for upcoming) ----------------------------------------------------

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

    # ---- status ---------------------------------------------------------------------------

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


class NodeCursor:
    """This node's place in every dataset of the job (see the module docstring for the API)."""

    FALSE_LOCK = FALSE_LOCK

    def __init__(
        self,
        job: JobStreams,
        settings: CursorSettings,
        start_epoch: int = 0,
        previous: NodeCursor | None = None,
    ) -> None:
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
        if previous is not None:
            self._carry(previous)

    # ---- construction from an older plan ----------------------------------------------------

    def _carry(self, old: NodeCursor) -> None:
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
            tracks = list(a.tracks)  # (C-level copies again)
            if a.state == "tracking" and tracks:
                newest = max(t.job_epoch for t in tracks)
                b.carried_tail = sum(t.seen.count(1) for t in tracks if t.job_epoch == newest and t.seen is not None)
            for i, g in enumerate(recent):
                b.strays.append((g, b.opens - len(recent) + i))
            if recent:
                b.state = "detecting"
                b.look_pending = True

    # ---- overall view ---------------------------------------------------------------------

    @property
    def state(self) -> CursorState:
        """The lead dataset's state; before it was opened, tracking if another dataset is tracked."""
        lead = self.datasets[self.lead].state
        if lead == "idle":
            if any(dc.state == "tracking" for dc in self.datasets):
                return "tracking"
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

    def progress_key(self, step: int) -> tuple[Any, ...]:
        """Changes when any rank of any dataset moved ``step`` positions, or a state changed."""
        step = max(1, step)
        return (
            self.state,
            self.node,
            tuple(
                (dc.state, dc.variant, tuple((t.epoch, t.job_epoch, t.low // step) for t in dc.tracks))
                for dc in self.datasets
            ),
        )

    # ---- epoch maps -----------------------------------------------------------------------

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

    def prepare(self) -> None:
        """Build the maps the quick path will need next: each dataset's next pass; and test opens
        carried over from a replaced plan (so the new plan relocks before the next open).  Slow:
        call it from a worker thread."""
        for dc in self.datasets:
            if dc.look_pending:
                self._look_carried(dc)
            for t in dc.tracks:
                self.index(dc, dc.variant, t.epoch)
                if t.finished(self.settings.window) or t.high * 2 >= t.length:
                    for e in dc.next_epochs(t):
                        self.index(dc, dc.variant, e)

    # ---- presuming ------------------------------------------------------------------------

    def presume(self, node: int, epoch: int = 0) -> None:
        """Predict the lead dataset from the start of ``epoch`` for ``node`` before any open.

        Lets the daemon prefetch as soon as the seed is known (a single-node job, or a node that
        knows its index).  Opens that fit confirm it; opens that do not are searched like any
        others, and a wrong guess ends in a relock or a mismatch.
        """
        lead = self.datasets[self.lead]
        if lead.state not in ("idle", "detecting") or lead.opens:
            return
        self.node = node
        self._epoch = epoch
        self._presume(lead, epoch, epoch)

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

    def _look_carried(self, dc: DatasetCursor) -> None:
        """Relock on the opens a replaced plan carried over.  A dataset other than the lead that does
        not lock on them is presumed again at its next open, as at its first: a small validation
        set's opens may never prove an order, and left detecting it would go unpredicted for the
        rest of the job.

        Carried opens the new plan fits nowhere are forgotten, not held against it: they are in the
        replaced plan's order (a job that changed its sampler's seed and wrote the new one reads the
        new order from then on).  Left among the strays, they kept every later test from fitting
        until they aged out of the buffer: 70 unpredicted opens of a 100-file epoch after such a
        seed change, and in a three-node soak whole epochs in mismatch.  The new plan is judged on
        the opens it sees next instead, as a plan made before any open is: within two batches per
        local rank it locks, or declares the mismatch itself.
        """
        first_mismatch = self.first_mismatch_open
        self._look(dc)
        if dc.state in ("detecting", "mismatch"):
            self._look_before_tail(dc)
        if dc.state == "mismatch":
            dc.strays.clear()
            dc.looks = dc.explained_at = 0
            dc.next_look = dc.looked_size = dc.stray_seen = 0
            dc.scan_after, dc.scan_gap, dc.finalists = dc.opens, 0, []
            dc.mismatch_reason = dc.mismatch_kind = None
            dc.state = "detecting"
            self.first_mismatch_open = first_mismatch
        if dc.d != self.lead and dc.state == "detecting":
            dc.state = "idle"

    def _look_holding(self, dc: DatasetCursor, held: list[tuple[int, int]], n: int) -> None:
        """Look again at the strays with the newest held back until ``held`` has ``n`` of them."""
        while len(held) < n:
            held.append(dc.strays.pop())
        dc.state, dc.mismatch_reason, dc.mismatch_kind = "detecting", None, None  # judged again
        dc.scan_after = 0  # each shorter evidence may be searched (its look spends budget)
        self._look(dc)

    def _look_before_tail(self, dc: DatasetCursor) -> None:
        """Relock on the carried opens without their newest few, then place those after the lock.

        A plan that replaces the cursor at an epoch's end carries the end of one pass and the first
        opens of the next: a hypothesis explains the newest opens back to where they stop fitting,
        so the old pass fits nothing (its newest opens are the new pass's) and the new pass has too
        few opens to lock on.  7-10 opens of the next epoch went unpredicted (real clients, seed
        written while epoch 0 ended).  Held back newest first, up to what a lock on the new pass
        alone would need; the held opens are then placed as later opens are (the next pass's start).
        Without a lock, the verdict on the whole evidence stands (a mismatch of a shorter one is not
        one of the carried opens).
        """
        verdict = (dc.state, dc.mismatch_reason, dc.mismatch_kind)
        held: list[tuple[int, int]] = []
        tail, dc.carried_tail = dc.carried_tail, 0
        if 0 < tail <= len(dc.strays) - self.settings.detect_opens:
            # The replaced cursor tracked the job and began a pass this many opens ago: the opens
            # before are the pass that ended, whatever the new plan calls it.  Held back at once:
            # one at a time stopped at 2 x detect_opens, and with 12 of the next pass's opens
            # carried, the rest never locked (7-9 of its opens unpredicted).
            self._look_holding(dc, held, tail)
            if dc.state != "tracking":
                dc.strays.extend(reversed(held))
                held.clear()
        most = min(len(dc.strays) - self.settings.detect_opens, 2 * self.settings.detect_opens)
        while len(held) < most and dc.state != "tracking":
            self._look_holding(dc, held, len(held) + 1)
        if dc.state != "tracking":
            dc.state, dc.mismatch_reason, dc.mismatch_kind = verdict
            dc.strays.extend(reversed(held))
            return
        for local, n in reversed(held):
            found = self._find(dc, local, self.segment, True)
            if found is False or found is None:
                dc.strays.append((local, n))
                dc.stray_seen += 1
            else:
                self._commit(dc, found, self.segment)

    # ---- observing ------------------------------------------------------------------------

    def observe(self, gid: int) -> bool:
        """Record one open of global file ``gid``; True when the cursor predicted it."""
        hit = self._observe(gid, slow_ok=True)
        assert hit is not None
        return hit

    def observe_while_quick(self, gids: list[int]) -> tuple[int, int]:
        """Observe ``gids`` from the start for as long as each open takes microseconds.

        Returns (opens observed, of which predicted).  Testing hypotheses and building an epoch's
        map are not quick (a permutation per epoch, ~0.1 s at ImageNet scale): they are left, with
        the rest of ``gids``, to the caller's worker thread.  Placing with maps already built is
        quick, and a thread hop per batch of opens would cost the daemon's FUSE thread more.
        """
        predicted = 0
        for i, gid in enumerate(gids):
            hit = self._observe(gid, slow_ok=False)
            if hit is None:
                return i, predicted
            predicted += hit
        return len(gids), predicted

    def _observe(self, gid: int, slow_ok: bool) -> bool | None:
        """observe(); None, with nothing recorded, when that is not quick and ``slow_ok`` is False."""
        d = bisect.bisect_right(self._ends, gid)
        if d >= len(self._ends) or gid < 0:
            return False  # not a file of the plan: nothing to place
        dc = self.datasets[d]
        if dc.look_pending or dc.state == "idle":
            if not slow_ok:
                return None
            if dc.look_pending:
                self._look_carried(dc)  # opens carried from a replaced plan: relock before placing this one
            if dc.state == "idle":
                self._first_open(dc)
        segment = self.segment if d == self.last_d else self.segment + 1
        local = gid - dc.offset
        found = self._find(dc, local, segment, slow_ok)
        if found is _NEED:
            return None
        if not slow_ok and (found is False or dc.state == "presumed") and self._look_due(dc, 1):
            return None
        # Recorded from here on.
        self.segment, self.last_d = segment, d
        epoch = self._lead_epoch
        hit = found is not False
        if found is not False:
            t = self._commit(dc, found, segment)
            if d == self.lead and epoch is not None:
                epoch = t.job_epoch  # the epoch of the rank that read it (ranks change epochs apart)
        self.opens += 1
        self.plan_opens += 1
        dc.opens += 1
        dc.plan_opens += 1
        dc.recent.append(local)
        dc.judged.append(hit)
        if hit:
            self.hits += 1
            self.plan_hits += 1
            dc.hits += 1
            dc.plan_hits += 1
        self._count_epoch(epoch, hit)
        if hit and dc.state == "presumed":
            dc.provisional[epoch] = dc.provisional.get(epoch, 0) + 1
        if hit:
            # A presumption's hits may be chance (a window can be much of a small epoch): it is
            # tested like strays are, on every open, until a lock confirms or replaces it.
            if dc.state == "presumed" and slow_ok and self._look_due(dc, 0):
                self._look(dc)
            return True
        if dc.state == "idle":
            dc.state = "detecting"
        dc.strays.append((local, dc.opens))
        dc.stray_seen += 1
        if slow_ok and self._look_due(dc, 0):
            self._look(dc)
        return False

    def _count_epoch(self, epoch: int | None, hit: bool) -> None:
        if epoch is None:
            self._unplaced[0] += 1
            self._unplaced[1] += hit
            return
        row = self.history.setdefault(epoch, [0, 0])
        row[0] += 1
        row[1] += hit

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

    # ---- placing --------------------------------------------------------------------------

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
        if dc.d == self.lead:
            return
        lead = self.datasets[self.lead]
        if lead.state not in ("tracking", "presumed") or not lead.tracks or all(t.high == 0 for t in lead.tracks):
            dc.passes += 1  # before the lead read anything (a sanity check): no schedule to learn
            return
        step = min(t.low for t in lead.tracks) // self.shape.batch_size
        dc.learn_pass(PassStart(self.epoch, step, lead.all_finished()))

    # ---- searching ------------------------------------------------------------------------

    def _look_due(self, dc: DatasetCursor, coming: int) -> bool:
        """Whether the evidence should be tested now (``coming``: the open being placed, 1 when it
        is not recorded yet).

        Tests are spaced geometrically in the evidence seen (each one spends part of the false-lock
        budget, see :meth:`DatasetCursor.multiplicity`), and in a mismatch once a batch (costs).
        """
        if dc.look_pending:
            return True
        count = dc.evidence_count() + coming
        size = min(dc.evidence_size() + coming, dc.strays.maxlen or 0)
        if size < dc.looked_size // 2:  # old strays expired: a new run of them, test it soon
            dc.next_look = 0
        if count < dc.next_look or not dc.lockable(size):
            return False
        if dc.state == "mismatch":
            return (dc.opens + 1) % max(1, self.shape.batch_size) == 0
        return True

    def _look(self, dc: DatasetCursor) -> None:
        """Test the strays against the likely hypotheses, and against all when those fail."""
        dc.look_pending = False
        local = dc.evidence()
        k = local.shape[0]
        if k < self.settings.detect_opens:
            return
        bound = _LOG_FALSE_LOCK - dc.multiplicity(k)  # this look's share of the budget
        dc.looks += 1
        count = dc.evidence_count()
        dc.looked_size = k
        dc.next_look = max(count + 1, math.ceil(count * LOOK_GROWTH))
        node = self.node if self.node_confirmed else None
        best: Fit | None = None
        best_score = 0.0
        plausible = False
        # Variants that share an order (a DistributedSampler and accelerate's batch sharding of it
        # when every rank is on this node) fit alike: the one followed so far wins unless another
        # is far likelier.
        mine = dc.variant
        for v, e in self._cheap(dc):
            idx = self.index(dc, v, e)
            assert idx is not None
            for f in self._fits(dc, idx, local, v, e, node):
                plausible |= f.plausible(k)
                score = f.log_chance + (0.0 if v == mine else VARIANT_MARGIN)
                if f.log_chance < bound and (best is None or score < best_score):
                    best, best_score = f, score
        if best is not None:
            self._lock(dc, best, local)
            return
        searched = False
        if not plausible and dc.opens >= dc.scan_after:
            searched = True
            best, plausible = self._search(dc, local, bound, node)
            if best is not None:
                self._lock(dc, best, local)
                return
            dc.scan_gap = min(max(2 * dc.scan_gap, k), 1 << 16)
            dc.scan_after = dc.opens + dc.scan_gap
        # Nothing anywhere explains the strays: a mismatch (for a tracked dataset only once its hit
        # rate also fell, so a few stray opens never end tracking).
        settled = dc.state in ("idle", "detecting", "presumed") or (dc.state == "tracking" and dc.judge_fails())
        if searched and not plausible and settled:
            self._mismatch(dc, local)
        elif dc.state == "mismatch" and not plausible and 2 * dc.explained_at <= k <= 2 * dc.budget:
            # More strays than the reason was worked out from: a job shape may show only now (the
            # first batches of every shape are the start of the permutation).
            dc.mismatch_kind, dc.mismatch_reason = self._explain(dc, local)
            dc.explained_at = k

    def _cheap(self, dc: DatasetCursor) -> list[tuple[int, int]]:
        """Hypotheses whose maps are (nearly always) built: where the tracks are and go next."""
        out: list[tuple[int, int]] = []
        v = dc.variant
        for t in dc.tracks:
            out.append((v, t.epoch))
            out.extend((v, e) for e in dc.next_epochs(t))
        out.extend(dc.finalists)
        hint = self.epoch_hint(dc)
        for w in range(len(dc.variants)):
            out.append((w, hint if dc.varies[w] else 0))
        return [(w, dc.key(w, e)) for w, e in dict.fromkeys(out) if e >= 0]

    def _fits(self, dc: DatasetCursor, idx: PassIndex, local: I64, v: int, e: int, node: int | None) -> list[Fit]:
        """Both anchors of one hypothesis, weighed against the other way of reading an unshuffled set.

        The chance in a :class:`Fit` is against an unrelated order.  An order every local rank
        shares and a DistributedSampler's strided share of the same order are not unrelated: the
        first opens fit both.  They differ in files opened twice: every local rank opens a shared
        order's files, a strided share never opens one twice.  So with several local ranks, a
        shared order locks only once a file was opened twice, and a strided share only once a
        batch per local rank passed with no file opened twice among all the strays.
        """
        out = []
        m = self.shape.ranks_per_node
        rival = m > 1 and len(set(dc.shared)) > 1
        twice = rival and not idx.shared and np.unique(local).shape[0] < local.shape[0]
        anchors: tuple[Anchor, ...] = ("start", "anywhere")
        for anchor in anchors:
            f = fit_strays(
                idx, local, self.shape, variant=v, epoch=e, node=node, cap=self.settings.window, anchor=anchor
            )
            if f is None:
                continue
            if idx.shared and m > 1 and f.repeats == 0:
                if f.explained >= dc.budget:
                    continue  # two batches per rank and no file opened twice: not a shared order
                f = _no_evidence(f)
            elif rival and not idx.shared:
                if twice:
                    continue
                if f.explained < m * self.shape.batch_size:
                    f = _no_evidence(f)
            out.append(f)
        return out

    def _search(self, dc: DatasetCursor, local: I64, bound: float, node: int | None) -> tuple[Fit | None, bool]:
        """Every hypothesis in likelihood order; the first that passes wins (the bound counted all)."""
        dc.scans += 1
        cheap = set(self._cheap(dc))
        near: list[tuple[float, int, int]] = []
        plausible = False
        k = local.shape[0]
        for v, e in dc.scan_order():
            if (v, e) in cheap:
                continue
            dc.epochs_scanned += 1
            key = (dc.d, v, e)
            idx = (
                self._index.get(key, _unreachable) if key in self._index else PassIndex(dc.variants[v].fresh_inverse(e))
            )
            for f in self._fits(dc, idx, local, v, e, node):
                if f.plausible(k):
                    plausible = True
                    near.append((f.log_chance, v, e))
                if f.log_chance < bound:
                    self._keep(key, idx)
                    return f, True
        near.sort()
        dc.finalists = list(dict.fromkeys((v, e) for _c, v, e in near))[:2]
        return None, plausible

    def _lock(self, dc: DatasetCursor, f: Fit, local: I64) -> None:
        """Take hypothesis ``f``: tracks where its suffix puts them, the suffix consumed."""
        window = self.settings.window
        shape = self.shape
        if (
            dc.state == "presumed"
            and f.variant == dc.variant
            and dc.tracks
            and all(dc.key(f.variant, t.epoch) == f.epoch for t in dc.tracks)
            and (f.node is None or f.node == self.node)
            and (f.anchor == "start" or self._holds(dc, f))
        ):
            # The presumption confirmed: its tracks already hold every open since, keep them.
            self._locked(dc, f, local)
            return
        if dc.state == "presumed" and not (
            (f.anchor == "start" or self._near_start(f))
            and dc.tracks
            and all(dc.key(f.variant, t.epoch) == f.epoch for t in dc.tracks)
            and (f.node is None or f.node == self.node)
        ):
            # Refuted.  (Another variant of the same pass from its start -- the same permutation,
            # shared out by batches rather than samples -- confirms the node's window: its hits stand.)
            self._withdraw(dc)
        if f.node is not None and not _shared(dc.variants[f.variant]):
            if self.node != f.node:
                self.node = f.node
                for other in self.datasets:  # their ranks were another node's
                    if other is not dc and other.tracks and not other.shared[other.variant]:
                        other.tracks = []
                        other.state = "detecting"
                self._lead_moved()
            self.node_confirmed = True
        node = self.node if self.node is not None else 0
        ranks = shape.ranks_of_node(node)
        varies = dc.varies[f.variant]
        old_job = max((t.job_epoch for t in dc.tracks), default=None)
        restarted = f.anchor == "start"
        if dc.tracks and varies and restarted and dc.mode == "unknown" and f.variant == dc.variant:
            before = max(t.epoch for t in dc.tracks)
            if f.epoch == before + 1:
                dc.set_mode("advance")
            elif f.epoch == before:
                dc.set_mode("repeat")
        if varies and dc.mode != "repeat":
            job_epoch = f.epoch
        elif old_job is None:
            job_epoch = self._epoch if dc.d == self.lead else 0
        else:
            job_epoch = old_job + (1 if restarted else 0)
        if dc.d != self.lead and restarted:
            self._pass_started(dc)
        dc.variant = f.variant
        dc.in_place = dc.restarts_in_place()
        length = dc.variants[f.variant].length
        known = f.positions >= 0
        sure = known & (f.slots >= 0)
        if sure.any():
            # A position with no slot is one of several a file holds: the end padding of a
            # DistributedSampler repeats the pass's first files, whose position 0 set the tracks at
            # the start of a pass they are at the end of (seen when a plan replaced the cursor at an
            # epoch's end: the suffix could not be placed, and 7-10 opens of the next epoch missed).
            known = sure
        low = 0
        if f.anchor == "anywhere" and known.any():
            # Workers may still open a few positions before the first one seen.
            low = max(0, int(f.positions[known].min()) - window // 2)
        idx = self.index(dc, f.variant, f.epoch)
        assert idx is not None
        dc.tracks = [Track(s, r, f.epoch, job_epoch, length, low, low, index=idx) for s, r in enumerate(ranks)]
        segment = self.segment
        suffix = local[-f.explained :]
        for i, slot, pos in zip(suffix.tolist(), f.slots.tolist(), f.positions.tolist(), strict=True):
            placed = False
            for t in dc.tracks if slot < 0 else [dc.tracks[slot]]:
                for p in [pos] if pos >= 0 and slot >= 0 else idx.positions(i, t.rank):
                    if t.accepts(p, window):
                        t.consume(p, window)
                        placed = True
                        break
                if placed:
                    break
        for t in dc.tracks:
            t.segment = segment if self.last_d == dc.d else -1
        self._locked(dc, f, local)

    @staticmethod
    def _holds(dc: DatasetCursor, f: Fit) -> bool:
        """Every open ``f`` places is where the tracks already put it.

        A run of consecutive positions (one worker's batch, opened before any other worker's) fits
        "somewhere in the pass" more tightly than "from the start": placed where the presumed
        tracks consumed it, that fit is the presumption itself, not a refutation of it.
        """
        for slot, pos in zip(f.slots.tolist(), f.positions.tolist(), strict=True):
            tracks = dc.tracks if slot < 0 or slot >= len(dc.tracks) else [dc.tracks[slot]]
            if pos < 0 or not any(pos in t.consumed or pos < t.low for t in tracks):
                return False
        return True

    def _near_start(self, f: Fit) -> bool:
        """Every open ``f`` places lies within the first window of its track: where a presumption
        of the pass's start predicted (and staged) it.

        One worker's batch opened before any other's (say accelerate's rank 0, its second batch:
        permutation indices 16..22) fits another variant of the same permutation, sample-wise
        DistributedSampler sharding at positions 8..11 of both ranks, "anywhere" more tightly than
        the presumed variant does; that fit still says these opens came from the start of the pass
        the presumption staged, so its hits stand (they were withdrawn: 7 of 512 opens of epoch 0
        read as unpredicted, though each was served from the staged window).
        """
        known = f.positions[f.positions >= 0]
        return known.size > 0 and bool((known < self.settings.window).all())

    def _locked(self, dc: DatasetCursor, f: Fit, local: I64) -> None:
        dc.provisional = {}
        if f.node is not None and not dc.shared[f.variant]:
            self.node_confirmed = True
        dc.state = "tracking"
        dc.mismatch_reason = None
        dc.mismatch_kind = None
        dc.strays.clear()
        dc.looks = 0
        dc.next_look = dc.looked_size = dc.stray_seen = 0
        dc.scan_after = dc.opens
        dc.scan_gap = 0
        dc.finalists = []
        dc.judged.clear()
        dc.locks += 1
        dc.lock_opens = int(local.shape[0])
        if dc.d == self.lead:
            self._lead_moved()
            self._settle_unplaced()

    def _withdraw(self, dc: DatasetCursor) -> None:
        """A presumption turned out wrong: its hits were not predictions after all."""
        for epoch, n in dc.provisional.items():
            self.hits -= n
            self.plan_hits -= n
            dc.hits -= n
            dc.plan_hits -= n
            if epoch is None:
                self._unplaced[1] -= n
            elif epoch in self.history:
                self.history[epoch][1] -= n
        dc.provisional = {}

    def _mismatch(self, dc: DatasetCursor, local: I64) -> None:
        if dc.state == "presumed":
            self._withdraw(dc)
        dc.state = "mismatch"
        dc.tracks = []
        if dc.d == self.lead:
            self._lead_moved()
        if self.first_mismatch_open is None and dc.d == self.lead:
            self.first_mismatch_open = self.opens
        dc.mismatch_kind, dc.mismatch_reason = self._explain(dc, local)
        dc.explained_at = int(local.shape[0])

    def _explain(self, dc: DatasetCursor, local: I64) -> tuple[MismatchKind, str]:
        """Why ``local`` (strays that fit no hypothesis) fit nothing, for status: another job shape
        (:meth:`_probe_shape`), a configured sampler no stated seed predicts, or a wrong seed."""
        k = int(local.shape[0])
        fit = self._probe_shape(dc, local)
        if fit is not None:
            shape = self.shape
            return "wrong_shape", (
                f"wrong job shape: the last {fit.opens} opens of dataset {dc.d} fit the plan's order with "
                f"{fit.describe()}; the config says world_size {shape.world_size}, ranks_per_node "
                f"{shape.ranks_per_node}, batch_size {shape.batch_size} (set job.world_size, job.ranks_per_node "
                "and job.batch_size to the job's)"
            )
        reason = unpredictable_reason(dc.variants[0].sampler)
        if reason is not None:
            return "unpredictable", f"{reason} (the last {k} opens of dataset {dc.d} fit no epoch of the plan)"
        return "wrong_seed", (
            f"the last {k} opens of dataset {dc.d} fit no epoch of the plan on any node "
            "(wrong seed or sampler settings?)"
        )

    def _probe_shape(self, dc: DatasetCursor, local: I64) -> ShapeFit | None:
        """A job shape other than the config's that ``local`` fits (:func:`placement.shapeprobe.probe_shapes`),
        in the epochs near the hint; None if a shape the config allows fits too, or none does.

        Shapes that give this node the same files are told apart by nothing in the opens (samples
        of 6 ranks, ranks 0-1, are batches of 2 of 3 ranks, rank 0): the config's layout and its
        ranks per node are preferred among them.  A permutation per variant and epoch, kept while the
        hint stays: run when a mismatch is declared and as its strays grow, not per open."""
        hint = self.epoch_hint(dc)
        if dc.probe_perms is None or dc.probe_perms[0] != hint:
            perms: dict[bytes, tuple[str, I64]] = {}
            for v, streams in enumerate(dc.variants):
                epochs = [hint, hint + 1, hint - 1, 0, 1] if dc.varies[v] else [0]
                for e in dict.fromkeys(x for x in epochs if x >= 0):
                    perm = epoch_permutation(streams.sampler, e)
                    if perm is not None:
                        perms.setdefault(perm[:64].tobytes(), (f"{sampler_name(streams.sampler)} epoch {e}", perm))
            dc.probe_perms = (hint, list(perms.values()))
        shape = self.shape
        fits = probe_shapes(
            dc.probe_perms[1],
            local,
            cap=4 * self.settings.window,
            world_size=shape.world_size,
            batch_size=shape.batch_size,
            budget=_LOG_FALSE_LOCK,
        )
        configured = {c for c in (self._configured(st.sampler) for st in dc.variants) if c is not None}
        nodes = [set(shape.ranks_of_node(k)) for k in range(shape.nodes)]
        if any(
            (f.layout, f.world_size, f.batch_size) in configured and any(set(f.ranks) <= ranks for ranks in nodes)
            for f in fits
        ):
            return None  # the configured shape explains them as well: not a question of shape
        family = self._configured(dc.variants[0].sampler)
        fits.sort(
            key=lambda f: (
                family is not None and f.layout != family[0],
                not _one_node(f.ranks, f.world_size, shape.rank_order),
                len(f.ranks) not in (shape.ranks_per_node, f.world_size),
                f.log_chance,
            )
        )
        return fits[0] if fits else None

    def _configured(self, sampler: object) -> tuple[str, int, int | None] | None:
        """(layout, world size, batch) of a variant, as :mod:`placement.shapeprobe` names shapes."""
        if isinstance(sampler, DistributedSamplerModel):
            return ("samples", sampler.world_size, None)
        if getattr(sampler, "shared", True) is False:  # the batch-sharded framework models
            return ("batches", self.shape.world_size, self.shape.batch_size)
        return None

    # ---- predicting -----------------------------------------------------------------------

    def upcoming(self, limit: int) -> list[tuple[int, int]]:
        """The next ``limit`` (epoch, gid) this node will open (see :meth:`upcoming_gids`)."""
        epochs, gids = self.upcoming_gids(limit)
        return list(zip(epochs.tolist(), gids.tolist(), strict=True))

    def upcoming_gids(self, limit: int) -> tuple[I64, I64]:
        """The next ``limit`` opens of this node: (lead epoch, global id) arrays, in expected order.

        Training files in order; a validation pass in progress first, and one predicted where it
        is due (every N steps, or after an epoch, as learned from the passes seen or as the config's
        ``follows``/``every`` suggest); local ranks interleaved batch by batch.  Vectorised per
        piece: this runs every few milliseconds in the daemon's cursor thread, and a Python loop
        per position would hold the GIL the FUSE loop needs.
        """
        if self.state not in ("tracking", "presumed") or limit <= 0:
            return _EMPTY, _EMPTY
        b = self.shape.batch_size
        m = self.shape.ranks_per_node
        majors: list[I64] = []
        batches: list[I64] = []
        slots: list[I64] = []
        gids: list[I64] = []
        epochs: list[I64] = []
        for slot in range(m):
            # Ranks advance in step: each contributes about limit / m of the first ``limit`` opens.
            for major, epoch, dc, g, pos in self._slot_plan(slot, -(-limit // m) + self.settings.window):
                if g.shape[0] == 0:
                    continue
                majors.append(np.full(g.shape[0], major, dtype=np.int64))
                batches.append(pos // b)
                slots.append(np.full(g.shape[0], slot, dtype=np.int64))
                gids.append(g + dc.offset)
                epochs.append(np.full(g.shape[0], epoch, dtype=np.int64))
        if not gids:
            return _EMPTY, _EMPTY
        order = np.lexsort((np.concatenate(slots), np.concatenate(batches), np.concatenate(majors)))[:limit]
        return np.concatenate(epochs)[order], np.concatenate(gids)[order]

    def _slot_plan(self, slot: int, limit: int) -> list[tuple[int, int, DatasetCursor, I64, I64]]:
        """One local rank's coming pieces: (order key, lead epoch, dataset, local ids, positions)."""
        out: list[tuple[int, int, DatasetCursor, I64, I64]] = []
        got = 0
        lead = self.datasets[self.lead]
        others = [dc for dc in self.datasets if dc is not lead]
        b = self.shape.batch_size
        seq = 0

        def major(job_epoch: int) -> int:
            return job_epoch * 4096 + seq

        active = self.datasets[self.last_d] if self.last_d is not None else None
        lead_epoch = self.epoch
        if (
            active is not None
            and active is not lead
            and active.state in ("tracking", "presumed")
            and slot < len(active.tracks)
        ):  # a pass under way: its rest comes first (nothing when it is done)
            t = active.tracks[slot]
            g, pos = self._rest(active, t, t.epoch, t.low, t.length, skip=t.consumed, most=limit)
            out.append((major(lead_epoch) - 2048, lead_epoch, active, g, pos))
            got += g.shape[0]
        if lead.state not in ("tracking", "presumed") or slot >= len(lead.tracks):
            return out
        t = lead.tracks[slot]
        epoch, job_epoch, start = t.epoch, t.job_epoch, t.low
        skip: set[int] | None = t.consumed
        length = t.length
        for _round in range(64):
            if got >= limit or length == 0:
                break
            steps_end = -(-length // b)
            due = {dc.d: dc.due_steps(job_epoch, start // b, steps_end) for dc in others}
            stops = sorted({s for ss in due.values() for s in ss})
            end = stops[0] * b if stops else length
            g, pos = self._rest(lead, t, epoch, start, end, skip=skip, most=limit - got)
            out.append((major(job_epoch), job_epoch, lead, g, pos))
            got += g.shape[0]
            seq += 1
            skip = None
            if stops:
                passing = [dc for dc in others if stops[0] in due[dc.d]]
            else:
                passing = [dc for dc in others if dc.due_at_end(job_epoch)]
            for dc in passing:
                g, pos = self._full_pass(dc, slot, limit - got)
                out.append((major(job_epoch), job_epoch, dc, g, pos))
                got += g.shape[0]
                seq += 1
            if stops:
                start = end
                continue
            epoch = lead.next_epochs(t)[0] if lead.varies[lead.variant] else epoch
            job_epoch += 1
            start, seq = 0, 0
        return out

    def _rest(
        self, dc: DatasetCursor, t: Track, epoch: int, start: int, end: int, skip: set[int] | None, most: int
    ) -> tuple[I64, I64]:
        """Positions start..end of ``t``'s rank in ``epoch``, less those consumed: ``most`` of them."""
        idx = self.index(dc, dc.variant, epoch)
        assert idx is not None
        row = idx.row(t.rank)
        end = min(end, row.shape[0], start + max(0, most) + (len(skip) if skip else 0))
        if start >= end:
            return _EMPTY, _EMPTY
        g = row[start:end]
        pos = np.arange(start, end, dtype=np.int64)
        if skip:
            done = np.fromiter(skip, dtype=np.int64, count=len(skip)) - start
            keep = np.ones(g.shape[0], dtype=np.bool_)
            keep[done[(done >= 0) & (done < g.shape[0])]] = False
            g, pos = g[keep], pos[keep]
        return np.asarray(g, dtype=np.int64), pos

    def _full_pass(self, dc: DatasetCursor, slot: int, most: int) -> tuple[I64, I64]:
        """A coming pass of a (non-lead) dataset for one local rank, from its start: ``most`` entries."""
        if dc.tracks and slot < len(dc.tracks):
            t = dc.tracks[slot]
            epoch = dc.next_epochs(t)[0]
            rank = t.rank
        else:
            epoch = 0 if not dc.varies[dc.variant] else self.epoch_hint(dc)
            rank = self.rank_of_slot(slot)
        idx = self.index(dc, dc.variant, epoch)
        assert idx is not None
        row = idx.row(rank)[: max(0, most)]
        return np.asarray(row, dtype=np.int64), np.arange(row.shape[0], dtype=np.int64)

    # ---- status ---------------------------------------------------------------------------

    def status(self) -> CursorStatus:
        """What the cursor knows, JSON-able.

        Counters: ``opens``/``hits`` over every plan of the mount, ``plan_opens``/``plan_hits``
        under this one; ``history``: per lead epoch (also past the planned epochs) its opens and
        hits, every dataset's opens counted in the lead epoch under way; ``datasets``: each
        dataset's own state, sampler, mode, position and counters.
        """
        lead = self.datasets[self.lead]
        positions = [t.low for t in lead.tracks if t.job_epoch == self.epoch]
        history: list[EpochHits] = [{"epoch": e, "opens": o, "hits": h} for e, (o, h) in sorted(self.history.items())]
        return {
            "state": self.state,
            "node": self.node,
            "epoch": self.epoch,
            "step": min(positions) // self.shape.batch_size if positions else 0,
            "ranks": sorted(t.rank for t in lead.tracks),
            "rank_positions": {str(t.rank): [t.job_epoch, t.low] for t in lead.tracks},
            "opens": self.opens,
            "hits": self.hits,
            "hit_rate": round(self.hit_rate, 6),
            "plan_opens": self.plan_opens,
            "plan_hits": self.plan_hits,
            "plans": self.plans,
            "mismatch": self.state == "mismatch",
            "mismatch_reason": self.mismatch_reason,
            "mismatch_kind": self.mismatch_kind,
            "first_mismatch_open": self.first_mismatch_open,
            "detect_opens": lead.lock_opens,
            "lead": self.lead,
            "datasets": [dc.status() for dc in self.datasets],
            "history": history,
        }


def _no_evidence(f: Fit) -> Fit:
    """``f`` kept as plausible but unable to lock (its order's local ranks were not seen sharing)."""
    return Fit(
        f.variant,
        f.epoch,
        f.anchor,
        f.node,
        f.explained,
        f.distinct,
        f.span,
        f.repeats,
        0.0,
        f.slots,
        f.positions,
    )


def _one_node(ranks: tuple[int, ...], world: int, rank_order: str) -> bool:
    """Whether ``ranks`` can be one node's among ``world`` ranks placed in ``rank_order``."""
    m = len(ranks)
    if world % m:
        return False
    if rank_order == "contiguous":
        return ranks[0] % m == 0 and ranks == tuple(range(ranks[0], ranks[0] + m))
    return ranks == tuple(range(ranks[0], world, world // m))


def _unreachable() -> PassIndex:
    raise AssertionError("checked to be cached")
