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
* ``observe_all(gids) -> predicted``: ``observe`` of each, in order (the worker thread's batch).
  Both record a run of strays of a dataset in a mismatch at once, up to the next test, and a run
  of plain hits of a followed pass at once.
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
* ``progress_key(step)``: a hashable that changes when any dataset's rank consumed ``step`` more
  positions or any state changed (when a window computed from ``upcoming`` is stale).

Threads: the cursor is not thread-safe; one caller at a time (the daemon's cursor loop).  Building
a cursor with ``previous=`` only reads the old one's counters and buffers, so the daemon builds it
only while nobody observes on the old one (else that batch's opens would be missing from what
carries over: holes in the new cursor's tracks).

Pure state machine: no I/O, no clocks; the daemon feeds it opens and asks it what comes next.

The code is split by what it does, behind :class:`NodeCursor`; every name above imports from here.
:mod:`placement.cursor_fit`: one epoch's map and the chance that strays fit a hypothesis.
:mod:`placement.cursor_tracks`: tracks, datasets, the node-wide counters and placing each open (the
hot path).  :mod:`placement.cursor_lock`: testing strays, locking, mismatches (the slow path).
:mod:`placement.cursor_horizon`: what comes next, read off the tracks.  This module: the entry
points above, which use all three.
"""

from __future__ import annotations

import bisect
import itertools
from typing import Any

import numpy as np

from placement.cursor_fit import FALSE_LOCK, Anchor, Fit, PassIndex, fit_strays, log_chance
from placement.cursor_horizon import CursorHorizon
from placement.cursor_lock import LOOK_GROWTH, VARIANT_MARGIN, CursorLocking
from placement.cursor_tracks import (
    _NEED,
    CursorBase,
    CursorSettings,
    CursorState,
    CursorStatus,
    DatasetCursor,
    DatasetCursorStatus,
    DatasetState,
    EpochHits,
    MismatchKind,
    Mode,
    PassStart,
    Placement,
    Track,
)

__all__ = [
    "FALSE_LOCK",
    "LOOK_GROWTH",
    "VARIANT_MARGIN",
    "Anchor",
    "CursorBase",
    "CursorSettings",
    "CursorState",
    "CursorStatus",
    "DatasetCursor",
    "DatasetCursorStatus",
    "DatasetState",
    "EpochHits",
    "Fit",
    "MismatchKind",
    "Mode",
    "NodeCursor",
    "PassIndex",
    "PassStart",
    "Placement",
    "Track",
    "fit_strays",
    "log_chance",
]


class NodeCursor(CursorHorizon, CursorLocking):
    """This node's place in every dataset of the job (see the module docstring for the API)."""

    FALSE_LOCK = FALSE_LOCK

    # ---- overall view --------------------------------------------------------------------

    def progress_key(self, step: int) -> tuple[Any, ...]:
        """Changes when any rank of any dataset consumed ``step`` more positions, or a state changed.

        Counted in positions consumed (all below ``low``, and those above it), not by ``low``
        alone: a position never observed holds ``low`` back until the readers are two windows
        past, and a view recomputed only when ``low`` moves ran out of stage list meanwhile (the
        staging window stopped for a fifth of an epoch)."""
        step = max(1, step)
        return (
            self.state,
            self.node,
            tuple(
                (
                    dc.state,
                    dc.variant,
                    tuple((t.epoch, t.job_epoch, (t.low + len(t.consumed)) // step) for t in dc.tracks),
                )
                for dc in self.datasets
            ),
        )

    # ---- epoch maps ----------------------------------------------------------------------

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

    # ---- presuming -----------------------------------------------------------------------

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

    # ---- observing -----------------------------------------------------------------------

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
        return self._observe_run(gids, slow_ok=False)

    def observe_all(self, gids: list[int]) -> int:
        """:meth:`observe` of each of ``gids``, in order; returns how many were predicted."""
        return self._observe_run(gids, slow_ok=True)[1]

    def _observe_run(self, gids: list[int], slow_ok: bool) -> tuple[int, int]:
        """:meth:`_observe` of ``gids`` in order, runs of strays and of hits in bulk (:meth:`_strays`,
        :meth:`_hits`), until one is not quick (only when not ``slow_ok``); returns (opens observed,
        of which predicted)."""
        predicted = 0
        i, n = 0, len(gids)
        while i < n:
            strays = self._strays(gids, i, slow_ok)
            if strays:
                i += strays
                continue
            hits = self._hits(gids, i)
            if hits:
                i += hits
                predicted += hits
                continue
            hit = self._observe(gids[i], slow_ok)
            if hit is None:
                return i, predicted
            predicted += hit
            i += 1
        return n, predicted

    def _strays(self, gids: list[int], start: int, slow_ok: bool) -> int:
        """The opens from ``gids[start]`` on that :meth:`_observe` would record as strays of a
        dataset in a mismatch, recorded at once; returns how many (0: none, or the first is not one).

        A mismatch (readers in an order no plan predicts, e.g. no seed written) makes every open a
        stray, tested once a batch: one by one that was most of the trio thread's cost of a warm
        open.  The same state changes in bulk, up to the first open of another dataset (or none of
        the plan's) and the first at which a test is due, which is left to :meth:`_observe` (the
        quick path hands it to the slow one; the slow one records it, then tests).  ``slow_ok``:
        which of the two this stands in for (the quick one asks before recording an open, the
        slow one after, so a batch ends one open apart).  ``tests/test_cursor.py`` compares the
        two ways."""
        d = self.last_d
        if d is None:
            return 0
        dc = self.datasets[d]
        if dc.state != "mismatch" or dc.look_pending:
            return 0
        lo, hi = dc.offset, dc.offset + dc.n
        end, n = start, len(gids)
        while end < n and lo <= gids[end] < hi:
            end += 1
        run = end - start
        if run == 0:
            return 0
        # The test _observe would ask for before open k of the run (slow: after recording it).  In a
        # mismatch it can be due only where a batch ends, so only k = 0 (its other effect, a reset
        # of the schedule, holds from the first k where it holds at all) and every batch-th k after.
        batch = max(1, self.shape.batch_size)
        coming = int(not slow_ok)  # the open being placed, not recorded yet when the test is asked
        first = -(dc.opens + 1 + slow_ok) % batch
        k = 0
        while k < run:
            if self._look_due(dc, coming, k + slow_ok):
                run = k
                break
            k = first if k < first else k + batch
        if run == 0:
            return 0
        # One by one, each open where enough strays came in asked lockable() of its size, which
        # remembers its answer for the last size asked (the state it reads is the same all run):
        # ask it of the last one's, so that what it remembers is the same.
        last = run - 1 + slow_ok
        if dc.stray_seen + last + coming >= dc.next_look:
            dc.lockable(min(len(dc.strays) + last + coming, dc.strays.maxlen or 0))
        local = [g - lo for g in gids[start : start + run]]
        number = dc.opens + 1  # the dataset's open number of the run's first
        self._record_run(dc, local, hit=False)
        self._count_epochs(self._lead_epoch, run, 0)
        dc.strays.extend(zip(local, range(number, number + run), strict=True))
        dc.stray_seen += run
        return run

    def _hits(self, gids: list[int], start: int) -> int:
        """The opens from ``gids[start]`` on that :meth:`_observe` would place as plain hits of the
        dataset placed last, recorded at once; returns how many (0: none, or the first is not one).

        While a job is followed, nearly every open is one: a file of a DistributedSampler pass (one
        rank's, one map for every track) within its rank's window, not opened yet in the pass.  One
        by one, placing it was half the trio thread's cost of a warm open.  The run ends at the
        first open that is anything else (another dataset, a repeat, a new pass, a stray: left to
        :meth:`_observe`, whose fast path, ``_find``, this follows step for step; such opens test
        nothing, quick or slow).  ``tests/test_cursor.py`` compares the two ways."""
        d = self.last_d
        if d is None:
            return 0
        dc = self.datasets[d]
        tracks = dc.tracks
        if dc.state != "tracking" or dc.look_pending or not tracks:
            return 0
        first = tracks[0].index
        if first is None or first.shared or any(u.index is not first for u in tracks):
            return 0
        lo, size = dc.offset, dc.n
        by_rank, window, segment = dc.by_rank, self.settings.window, self.segment
        own_epochs = d == self.lead and self._lead_epoch is not None  # counted in the reading rank's epoch
        counts: dict[int | None, int] = {}
        placed: list[int] = []
        k, n, step = start, len(gids), 1
        while k < n:  # the first open alone, then slices of 32 growing 4x: a run's cost stays linear
            if step == 1:
                # Without a numpy call (microseconds, whatever its length): where the first is no
                # plain hit (opens of two kinds taking turns), the run ends at once.
                i = gids[k] - lo
                if not 0 <= i < size:
                    break
                local = [i]
                ranks = [first.rank_of.item(i)]
                positions = [first.pos_of.item(i)]
                repeated = [first.repeated.item(i)] if first.repeated is not None else []
            else:
                arr = np.asarray(gids[k : k + step], dtype=np.int64) - lo
                inside = (arr >= 0) & (arr < size)
                arr = arr[: len(arr) if inside.all() else int(inside.argmin())]  # up to another dataset's
                local = arr.tolist()
                ranks = first.rank_of[arr].tolist()
                positions = first.pos_of[arr].tolist()
                repeated = first.repeated[arr].tolist() if first.repeated is not None else []
            took = 0
            for j, pos in enumerate(positions):
                t = by_rank.get(ranks[j])
                if t is None or (repeated and repeated[j]) or not t.low <= pos < t.high + window or pos in t.consumed:
                    break
                t.consume(pos, window)
                t.segment = segment
                epoch = t.job_epoch if own_epochs else self._lead_epoch
                counts[epoch] = counts.get(epoch, 0) + 1
                took += 1
            placed += local[:took]
            if took < step:
                break
            k += step
            step = 32 if step == 1 else 4 * step
        if not placed:
            return 0
        self._record_run(dc, placed, hit=True)
        for epoch, count in counts.items():
            self._count_epochs(epoch, count, count)
        return len(placed)

    def _record_run(self, dc: DatasetCursor, local: list[int], hit: bool) -> None:
        """The counters and buffers a run of opens of ``dc`` (dataset-local ids), all hits or all
        strays, changes as :meth:`_observe` of each would; their epochs are the caller's to count."""
        run = len(local)
        self.opens += run
        self.plan_opens += run
        dc.opens += run
        dc.plan_opens += run
        if hit:
            self.hits += run
            self.plan_hits += run
            dc.hits += run
            dc.plan_hits += run
        dc.recent.extend(local)
        dc.judged.extend(itertools.repeat(hit, run))

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
        self._count_epochs(epoch, 1, hit)
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

    # ---- status --------------------------------------------------------------------------

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
