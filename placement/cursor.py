"""Where this node's ranks are in their predicted streams, inferred from the files being opened.

The daemon knows neither the epoch, nor the step, nor which ranks it hosts.  In any epoch each file
belongs to one rank (padding aside), so the first opens reveal the node's ranks and the epoch
(also of a resumed job); afterwards every open is placed in its rank's stream.  Each local rank has
a low watermark (its first unconsumed position); an open counts as *predicted* when it falls
within a window ahead of that watermark.  The window absorbs DataLoader reordering: W workers
with prefetch_factor pf keep up to W*pf batches in flight, so opens run up to about W*pf*b ahead.

When the recent hit rate drops (wrong seed, sampler not modelled), the cursor declares a mismatch
and the daemon falls back to its reactive policy; a later run of predicted opens (the job re-seeded
or resynchronised) recovers tracking.

Pure state machine: no I/O, no clocks; the daemon feeds it opens and asks it what comes next.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from placement.jobstreams import EpochMap, JobStreams


@dataclass(frozen=True)
class CursorSettings:
    window: int  # positions ahead of a rank's frontier that count as predicted
    detect_opens: int = 8  # opens needed to lock the node and the epoch, at least (see NodeCursor.needed)
    judge_opens: int = 32  # recent opens over which the hit rate is judged
    mismatch_below: float = 0.5  # hit rate under which the prediction is declared wrong

    @classmethod
    def for_job(cls, batch_size: int, num_workers: int, prefetch_factor: int) -> CursorSettings:
        inflight = max(1, num_workers) * max(1, prefetch_factor) + 1
        return cls(window=2 * inflight * batch_size + 16, judge_opens=max(8, max(1, num_workers) * batch_size))


@dataclass
class RankTrack:
    """One local rank: its epoch, first unconsumed position and highest consumed position + 1."""

    rank: int
    epoch: int
    low: int = 0
    high: int = 0
    consumed: set[int] = field(default_factory=set)  # consumed positions >= low

    def accepts(self, pos: int, window: int) -> bool:
        return self.low <= pos < self.high + window and pos not in self.consumed

    def consume(self, pos: int, window: int) -> None:
        self.consumed.add(pos)
        self.high = max(self.high, pos + 1)
        # A position never opened (a skipped sample) must not hold the watermark back forever.
        floor = self.high - 2 * window
        while self.low in self.consumed or self.low < floor:
            self.consumed.discard(self.low)
            self.low += 1

    def restart(self, epoch: int) -> None:
        self.epoch, self.low, self.high = epoch, 0, 0
        self.consumed.clear()


class NodeCursor:
    """detecting (or presumed) -> tracking (<-> mismatch)."""

    def __init__(self, job: JobStreams, settings: CursorSettings, start_epoch: int = 0) -> None:
        self.job = job
        self.shape = job.shape
        self.settings = settings
        self.state = "detecting"
        self.node: int | None = None
        self.epoch = start_epoch
        self.tracks: dict[int, RankTrack] = {}
        self.opens = 0
        self.hits = 0
        self.recent: deque[bool] = deque(maxlen=settings.judge_opens)
        self.pending: list[int] = []  # the last `needed` opens (what detection looks at)
        self.mismatch_reason: str | None = None
        self.epochs_scanned = 0
        self.retry_every = 4 * settings.judge_opens  # opens between detection attempts after a failure
        self.retry_after = 0
        self._needed: int | None = None
        self._chance: float | None = None
        self.first_mismatch_open: int | None = None  # the open at which a mismatch was first declared
        self.attempts = 0  # detection attempts

    FALSE_LOCK = 1e-6  # accepted chance that random opens fit a wrong epoch or seed

    @property
    def needed(self) -> int:
        """Opens detection looks at: enough that random files fit with probability < FALSE_LOCK.

        A random file lands in a rank's first ``window`` positions with probability about
        window/length, so k opens all fit by chance with (window/length)^k.  Big epochs need only
        ``detect_opens``; a small dataset, whose window is much of an epoch, needs more.
        """
        if self._needed is None:
            k = math.ceil(math.log(self.FALSE_LOCK) / math.log(min(0.98, self.chance)))
            self._needed = max(self.settings.detect_opens, min(k, 1024))
        return self._needed

    @property
    def chance(self) -> float:
        """Probability that a random file falls inside a rank's window: what a wrong plan still 'hits'."""
        if self._chance is None:
            length = min(self.job.epoch_map(self.epoch).length(r) for r in range(self.shape.world_size))
            self._chance = min(1.0, self.settings.window / max(1, length))
        return self._chance

    def presume(self, node: int, epoch: int = 0) -> None:
        """Predict from the start of ``epoch`` for ``node`` before any open confirms it.

        Lets the daemon prefetch epoch 0 as soon as the seed is known (a single-node job, or a
        node that knows its index).  The first opens still run detection: they confirm the
        guess or replace it, and a wrong guess ends in a mismatch like a wrong seed.
        """
        if self.state != "detecting":
            return
        self.state = "presumed"
        self.node = node
        self.epoch = epoch
        self.tracks = {r: RankTrack(r, epoch) for r in self.shape.ranks_of_node(node)}

    # ------------------------------------------------------------------ observing

    def observe(self, gid: int) -> bool:
        """Record one open of global file ``gid``; True when the plan predicted it."""
        hit = self._observe(gid, slow_ok=True)
        assert hit is not None
        return hit

    def observe_while_quick(self, gids: list[int]) -> tuple[int, int]:
        """Observe ``gids`` from the start for as long as each open takes microseconds.

        Returns (opens observed, of which predicted).  Detection and building an epoch map are
        not quick (a permutation per epoch, ~0.1 s at ImageNet scale): they are left, with the
        rest of ``gids``, to the caller's worker thread.  Placing with maps already built is quick,
        and a thread hop per batch of opens would cost the daemon's FUSE thread more than it.
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
        placed: bool | None = None
        if self.state == "tracking":
            placed = self._place(gid, build=slow_ok)  # reads no counter updated below
            if placed is None:
                return None
        elif not slow_ok and not (self.state == "mismatch" and self.opens + 1 < self.retry_after):
            return None  # detection runs at this open
        self.opens += 1
        self.pending.append(gid)
        if len(self.pending) > self.needed:
            self.pending.pop(0)
        retry = self.state == "mismatch" and self.opens >= self.retry_after
        if self.state in ("detecting", "presumed") or retry:
            if len(self.pending) < self.needed:
                return False
            first = self.state in ("detecting", "presumed")
            detecting = len(self.pending)
            self._detect()
            if self.state != "tracking":
                return False
            # The opens that revealed the position were predicted after all (only the current
            # one after a mismatch: the others were already counted as misses).
            credited = detecting if first else 1
            self.hits += credited
            self.recent.extend([True] * credited)
            return True
        if placed is None:
            return False  # mismatch: unpredicted until detection locks again (see the retry above)
        self.hits += placed
        self.recent.append(placed)
        self._judge()
        return placed

    def _detect(self) -> None:
        """Find the (epoch, node) under which the pending opens are one node's reads.

        First pass: opens at the start of every rank's stream (a fresh or resumed job: set_epoch
        then iterate from the beginning).  Only if no epoch fits that way, a second pass accepts a
        cluster anywhere in the epoch (the daemon restarted mid-epoch).  Random files fit the first
        test with probability ~(window/length)^detect_opens, which is negligible.
        """
        gids = np.asarray(self.pending, dtype=np.int64)
        # The first detection scans every epoch (a resumed job can be anywhere).  Retries look next to
        # where the job was and scan everything only on attempts 2, 4, 8, ... (a job restarted from
        # a checkpoint): a full scan costs one permutation per epoch, seconds at ImageNet scale.
        self.attempts += 1
        if self.first_mismatch_open is None or self.attempts & (self.attempts - 1) == 0:
            order = [self.epoch, *[e for e in range(self.job.epochs) if e != self.epoch]]
        else:
            near = (self.epoch, self.epoch + 1, self.epoch - 1, self.epoch + 2)
            order = [e for e in near if 0 <= e < self.job.epochs]
        # The mid-epoch pass is only trustworthy when a window is a small part of an epoch.
        passes = (True, False) if self.chance < 0.1 else (True,)
        for from_start in passes:
            for epoch in order:
                self.epochs_scanned += 1
                found = self._fits(self.job.epoch_map(epoch), gids, from_start)
                if found is not None:
                    self.node = found
                    self.epoch = epoch
                    self.state = "tracking"
                    self.mismatch_reason = None
                    self.tracks = {r: RankTrack(r, epoch) for r in self.shape.ranks_of_node(found)}
                    for gid in self.pending:
                        self._place(int(gid))
                    self.recent.clear()
                    return
        self._declare_mismatch()
        self.mismatch_reason = (
            f"{len(self.pending)} opens are not one node's reads in any epoch of the plan "
            "(wrong seed or sampler settings?)"
        )
        self.retry_after = self.opens + self.retry_every
        self.retry_every = min(self.retry_every * 2, 1 << 16)

    def _fits(self, emap: EpochMap, gids: npt.NDArray[np.int64], from_start: bool) -> int | None:
        ranks = emap.rank_of[gids].astype(np.int64)
        if (ranks < 0).any():
            return None
        nodes = self.shape.rank_nodes()[ranks]
        if not (nodes == nodes[0]).all():
            return None
        pos = emap.pos_of[gids]
        for r in np.unique(ranks):
            p = pos[ranks == r]
            if (p.max() if from_start else p.max() - p.min()) >= self.settings.window:
                return None
        return int(nodes[0])

    def _place(self, gid: int, build: bool = True) -> bool | None:
        """Consume ``gid`` where a local rank is, or where one of them starts its next epoch.

        None, with nothing consumed, when that needs an epoch map not built yet and ``build`` is False.
        """
        window = self.settings.window
        job = self.job
        if not build and not all(job.has_epoch_map(t.epoch) for t in self.tracks.values()):
            return None
        for track in self.tracks.values():
            for pos in job.epoch_map(track.epoch).positions(gid, track.rank).tolist():
                if track.accepts(pos, window):
                    track.consume(pos, window)
                    return True
        for track in self.tracks.values():
            if track.epoch + 1 >= job.epochs:
                continue
            # Only a rank near the end of its epoch can be starting the next one; otherwise a stray
            # open would jump it ahead (the window can be a large share of a small epoch).  Near the
            # end means its watermark is within a window of it, or it has opened its last position:
            # a loader iterates an epoch to the end before the next one starts.  The second test
            # matters when positions were opened before this cursor existed (the seed's plan came
            # after the job's first opens): they are never consumed, and in an epoch shorter than
            # two windows nothing releases the watermark they hold back.
            length = job.epoch_map(track.epoch).length(track.rank)
            if track.low + window < length and track.high < length:
                continue
            if not build and not job.has_epoch_map(track.epoch + 1):
                return None
            for pos in job.epoch_map(track.epoch + 1).positions(gid, track.rank).tolist():
                if pos < window:
                    track.restart(track.epoch + 1)
                    track.consume(pos, window)
                    self.epoch = min(t.epoch for t in self.tracks.values())
                    return True
        return False

    def _declare_mismatch(self) -> None:
        self.state = "mismatch"
        if self.first_mismatch_open is None:
            self.first_mismatch_open = self.opens

    def _judge(self) -> None:
        """Declare a mismatch when the recent hit rate is closer to chance than to a correct plan's 1.0.

        Recovery is left to detection (retried with backoff), whose false-lock odds are bounded.
        """
        if len(self.recent) < self.recent.maxlen:  # type: ignore[operator]
            return
        rate = sum(self.recent) / len(self.recent)
        threshold = max(self.settings.mismatch_below, (1.0 + self.chance) / 2)
        if self.state == "tracking" and rate < threshold:
            self._declare_mismatch()
            self.mismatch_reason = (
                f"only {rate:.0%} of the last {len(self.recent)} opens were predicted (wrong seed or sampler settings?)"
            )
            self.retry_after = self.opens + self.retry_every

    # ------------------------------------------------------------------ predicting

    @property
    def hit_rate(self) -> float:
        return self.hits / self.opens if self.opens else 0.0

    def upcoming(self, limit: int) -> list[tuple[int, int]]:
        """The next ``limit`` (epoch, gid) this node will open: its ranks in step, batch by batch.

        Vectorised per rank: this runs every few milliseconds in the daemon's cursor thread, and a
        Python loop per position would hold the GIL the FUSE loop needs.
        """
        if self.state not in ("tracking", "presumed") or not self.tracks:
            return []
        b = self.shape.batch_size
        ranks = sorted(self.tracks)
        per_rank: list[tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]] = []
        for r in ranks:
            track = self.tracks[r]
            epochs_parts, gids_parts, got = [], [], 0
            epoch, lo = track.epoch, track.low
            while got < limit and epoch < self.job.epochs:
                stream = self.job.epoch_map(epoch).streams[r]
                chunk = stream[lo : lo + limit - got]
                if epoch == track.epoch and track.consumed:
                    keep = np.ones(chunk.shape[0], dtype=bool)
                    consumed = np.fromiter(track.consumed, dtype=np.int64) - lo
                    keep[consumed[(consumed >= 0) & (consumed < chunk.shape[0])]] = False
                    chunk = chunk[keep]
                gids_parts.append(chunk)
                epochs_parts.append(np.full(chunk.shape[0], epoch, dtype=np.int64))
                got += chunk.shape[0]
                epoch, lo = epoch + 1, 0
            per_rank.append(
                (
                    np.concatenate(epochs_parts) if epochs_parts else np.zeros(0, np.int64),
                    np.concatenate(gids_parts) if gids_parts else np.zeros(0, np.int64),
                )
            )
        # Interleave the ranks batch by batch (their own position stays in stream order).
        order: list[npt.NDArray[np.int64]] = []
        longest = max(len(g) for _e, g in per_rank)
        for start in range(0, longest, b):
            for e, g in per_rank:
                if start < len(g):
                    order.append(np.stack([e[start : start + b], g[start : start + b]], axis=1))
        if not order:
            return []
        both = np.concatenate(order)[:limit]
        return list(zip(both[:, 0].tolist(), both[:, 1].tolist(), strict=True))

    def status(self) -> dict[str, Any]:
        lows = [t.low for t in self.tracks.values() if t.epoch == self.epoch]
        return {
            "state": self.state,
            "node": self.node,
            "epoch": self.epoch,
            "step": min(lows) // self.shape.batch_size if lows else 0,
            "ranks": sorted(self.tracks),
            "rank_positions": {str(r): [t.epoch, t.low] for r, t in sorted(self.tracks.items())},
            "opens": self.opens,
            "hits": self.hits,
            "hit_rate": round(self.hit_rate, 6),
            "mismatch": self.state == "mismatch",
            "mismatch_reason": self.mismatch_reason,
            "first_mismatch_open": self.first_mismatch_open,
            "detect_opens": self._needed,
        }
