"""What this node opens next, read off the tracks (:mod:`placement.cursor`).

:class:`CursorHorizon`: the lead's passes in order, validation passes where they are due, local
ranks interleaved batch by batch.  Separate because it only reads the tracks, never moves them:
it is what the read policy's horizon and staging window are built from.
"""

from __future__ import annotations

import numpy as np

from placement.cursor_fit import I64
from placement.cursor_tracks import CursorBase, DatasetCursor, Track

_EMPTY = np.zeros(0, dtype=np.int64)


class CursorHorizon(CursorBase):
    """The forecast of the next opens (see the module docstring); a part of :class:`~placement.cursor.NodeCursor`."""

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
