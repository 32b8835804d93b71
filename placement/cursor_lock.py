"""Locking on: strays tested against (variant, epoch, node, position) hypotheses (:mod:`placement.cursor`).

:class:`CursorLocking`: when to test, the likely hypotheses then the full search, taking a fit (a
lock or relock), refuting a presumption, declaring and explaining a mismatch, and relocking on
the opens a replaced plan carried over.  Separate from placing opens
(:mod:`placement.cursor_tracks`): this is the slow part of observing (``observe_while_quick`` leaves
it to the caller's worker thread) and the only code that spends the false-lock budget.
"""

from __future__ import annotations

import math

import numpy as np

from placement.cursor_fit import _LOG_FALSE_LOCK, I64, Anchor, Fit, PassIndex, fit_strays
from placement.cursor_tracks import CursorBase, DatasetCursor, MismatchKind, Track, _shared, _unreachable
from placement.frameworks import epoch_permutation, unpredictable_reason
from placement.samplers import DistributedSamplerModel, sampler_name
from placement.shapeprobe import ShapeFit, probe_shapes

VARIANT_MARGIN = math.log(1e3)
"""How much likelier (ln) a fit of another sampler variant must be to replace the one followed."""


LOOK_GROWTH = 1.25
"""Strays grow by this factor between two tests of them: the union bound then pays for about
log(strays) tests rather than one per stray, and little evidence goes untested."""


class CursorLocking(CursorBase):
    """Testing strays and locking on (see the module docstring); a part of :class:`~placement.cursor.NodeCursor`."""

    # ---- relocking on carried opens ------------------------------------------------------

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

        A replay of the past: passes it finds teach no schedule (:meth:`_pass_started`).
        """
        self._replaying = True
        try:
            self._relock_carried(dc)
        finally:
            self._replaying = False

    def _relock_carried(self, dc: DatasetCursor) -> None:
        """:meth:`_look_carried`'s relock itself."""
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

    # ---- searching -----------------------------------------------------------------------

    def _look_due(self, dc: DatasetCursor, coming: int, ahead: int = 0) -> bool:
        """Whether the evidence should be tested now (``coming``: the open being placed, 1 when it
        is not recorded yet; ``ahead``: strays not recorded yet before it, as the bulk path of a
        mismatch asks, :meth:`NodeCursor._strays`).

        Tests are spaced geometrically in the evidence seen (each one spends part of the false-lock
        budget, see :meth:`DatasetCursor.multiplicity`), and in a mismatch once a batch (costs).
        """
        if dc.look_pending:
            return True
        count = dc.evidence_count() + coming + ahead
        size = min(dc.evidence_size() + coming + ahead, dc.strays.maxlen or 0)
        if size < dc.looked_size // 2:  # old strays expired: a new run of them, test it soon
            dc.next_look = 0
        if count < dc.next_look or not dc.lockable(size):
            return False
        if dc.state == "mismatch":
            return (dc.opens + ahead + 1) % max(1, self.shape.batch_size) == 0
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
        (:meth:`_probe_shape`), a configured sampler no stated seed predicts, or another order than the
        plan's: which of seed, catalog order or sampler differs only seed discovery can tell (the daemon
        adds what it found to this text)."""
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
            f"the last {k} opens of dataset {dc.d} fit no epoch of the plan on any node: the job reads another "
            "order (the plan's seed, catalog order or sampler is not the job's)"
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
