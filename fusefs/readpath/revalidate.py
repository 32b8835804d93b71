"""Serving a cached copy only while its source is the file it was made from.

Every copy a tier holds records its source's identity (size, mtime, ctime, inode:
:mod:`fusefs.meta.identity`), and the snapshot records what the walk saw.  Rules:

* After every (re)mount, a cached copy is served only after one fresh stat of its source in this
  mount matched.  Those stats run ahead of the readers, in the order the prefetcher predicts
  (:meth:`Revalidator.upcoming`); an open that gets there first stats the file itself, and so does
  staging a tier copy (a staged file is served without reaching the daemon again).  A read
  from the PFS checks the identity on its own descriptor, which counts as that stat.  A copy whose
  file the page cache holds for its next open (kept or staged pages: :meth:`Staging.serves`) is not
  stat'ed ahead: that open reads the pages, which were made from bytes this mount or the peer that
  sent them checked, not the copy, and whatever reads the copy later checks it first (a read after
  the kernel dropped the pages, a stage, a peer's request).  Two nodes' tier copies of files a peer
  sent were stat'ed ahead one by one as each epoch's horizon reached them, though the opens read
  their pages: 500 stats per node in epoch 1, each a worker-thread hop and a PFS metadata request,
  on a host whose two cores the readers were waiting for (tools/bench/train --nodes 2).
* While mounted, cached files are checked again in rounds at ``snapshot.revalidate_per_s`` stats per
  second; each file once per round, by its owner when the node is in a group (``mine``).  A round
  takes (cached files) / rate seconds, at least ``snapshot.revalidate_round_min_s`` (``min_round``): the
  staleness bound shown in status.  The floor keeps a small cache from being stat'ed over and over: at
  1000 stats/s, 4,400 cached files were stat'ed every 4.4 s for the whole job, on every node (each a
  metadata request to the PFS, and on the benchmark's two-core host a third of the daemon's CPU).
  At a 30 s floor two nodes still stat'ed about 100 files a second each, and the epoch a round fell
  in took 3-5% longer; spreading those stats out did not help, fewer did (tools/RESULTS.md,
  "Training benchmark, 2026-11-30", both sections).  Hence five minutes, rclone mount's
  --dir-cache-time.
  A round shorter than the floor spreads its stats evenly over it rather than bursting at full rate.
* A change seen by any of these (or by a PFS read) makes the file CHANGED for the rest of the
  mount: its opens fail with EIO (the tree keeps the snapshot's sizes), its copies are dropped
  from every tier, its kernel page cache is invalidated, status names it, and the persisted
  snapshot is marked so the next mount walks the source again and serves the new content.

In a group, a replica this node holds of a file another node owns is its owner's to recheck, but no
message tells this node what the owner saw (that needs a note in the peer protocol); so every
``replicas_every``-th round (the group's size) also covers this node's replicas.  A file held on k
of N nodes then costs about 1 + (k - 1) / N stats per round in all, and a replica's staleness bound
is N rounds instead of one (:mod:`placement.recheck` decides which files a round covers and
computes both bounds; status shows them).  A round with nothing of this node's own to check still
counts, or a node holding only replicas would never reach its next replica round.

With ``snapshot.identity: content`` a round also reads each source it stat'ed unchanged whole and
compares it, block by block, with the digests its copy recorded (:func:`content_change`): a
rewrite that keeps size, mtime and inode on a source that does not maintain ctime (object-store
FUSE clients, bindfs ``--ctime-from-mtime``: :mod:`fusefs.meta.identity`) is then seen within a
round, and treated as any change above.  The copy compared is a tier copy's digests, or, for a file
held only as pages, those pages read back (a read back costs the trio thread an OPEN, so pages kept
beside a tier copy are not read too: should they be of another version than the tier copy, made
before a rewrite the tier copy was made after, they stay unseen).  Checks before a copy's first
use after a mount (ahead, open) stay stats: reading the whole source there would undo the cache on
every remount.  A file held only as pages is read back whole into memory to be hashed (it is no
larger than the RAM budget that holds it).

What it cannot see: a change the PFS client does not show yet (an NFS client's attribute cache,
``actimeo``, delays it by up to that many seconds), and one that happens after the last check and
before a read of a copy (bounded by the round time).

Concurrency rules: bookkeeping (``state``, the queues, counters) changes only on the trio thread;
stats run in worker threads under ``limiter`` and return results.  Concurrent checks of one entry
share one stat (``_checking``).
"""

from __future__ import annotations

import logging
import os
import stat
import time
from collections.abc import Sequence
from typing import Annotated, Literal, TypedDict

import numpy as np
import numpy.typing as npt
import trio
import xxhash

from fusefs.meta.identity import SourceId
from fusefs.meta.ids import inode_of
from fusefs.meta.snapshot import Snapshot
from fusefs.readpath.counters import ReadCounters
from fusefs.readpath.hooks import NO_HOOKS, ReadPathHooks
from fusefs.readpath.staging import Staging
from fusefs.tiers import Tier
from fusefs.tiers.digest import BLOCK, BlockDigests
from placement import recheck
from placement.statusfields import counter, gauge, info, text

log = logging.getLogger(__name__)

UNCHECKED, FRESH, CHANGED = 0, 1, 2
TICK = 1.0
"""Seconds between batches of a background round: one worker-thread hop a second, not ten.  Each
wakeup of a daemon otherwise waiting costs its trio thread far more than the stats (about 0.5 ms on
the benchmark's VM: the loop runs cold, then the hop); at 0.1 s the rounds alone used 1.4-2% of a
core on every node, all job long (tools/RESULTS.md, "timer wakeups")."""
AHEAD_YIELD_EVERY = 256  # entries the ahead loop looks at between checkpoints
IDLE_SECONDS = 1.0
"""How often a node with nothing cached looks again."""
_MAX_LISTED = 100

"""Which of these entries this node checks in background rounds (the rest have another owner)."""


def stat_identity(path: bytes) -> SourceId | str:
    """The source's identity, or why it has none (gone, not a regular file). Worker thread."""
    try:
        st = os.lstat(path)
    except OSError as exc:
        return f"cannot be checked ({exc.strerror})"
    if not stat.S_ISREG(st.st_mode):
        return "not a regular file any more (a FIFO, socket, device, link or directory)"
    return SourceId.of(st)


def content_change(path: bytes, recorded: list[BlockDigests]) -> str | None:
    """Why the source's bytes are not those of every copy in ``recorded``, or None when they are.

    Reads the file whole, one BLOCK at a time into one buffer (a file of any size costs 1 MiB of
    memory), opened as the PFS reader opens it (no symlink followed, no blocking on a FIFO).
    Worker thread.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        return f"cannot be read to compare its content ({exc.strerror})"
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return "not a regular file any more (a FIFO, socket, device, link or directory)"
        buf = bytearray(BLOCK)
        view = memoryview(buf)
        digests: list[int] = []
        size = 0
        while True:
            got = 0
            while got < BLOCK:  # a whole block, as the copy's digests cut it (a pread may return less)
                n = os.preadv(fd, [view[got:]], size + got)
                if n == 0:
                    break
                got += n
            if got or not digests:  # the empty file has one digest, of no bytes
                digests.append(xxhash.xxh3_64_intdigest(view[:got]))
            size += got
            if got < BLOCK:
                break
    except OSError as exc:
        return f"cannot be read to compare its content ({exc.strerror})"
    finally:
        os.close(fd)
    for copy in recorded:
        if copy.size != size:
            return f"content changed (now {size} bytes, the cached copy {copy.size})"
        for i, (was, now) in enumerate(zip(copy.digests, digests, strict=True)):
            if was != now:
                return f"content changed (block {i} of {len(digests)} differs from the cached copy)"
    return None


def _contents_changed(checks: list[tuple[bytes, list[BlockDigests]]]) -> list[str | None]:
    return [content_change(path, recorded) for path, recorded in checks]


StatKind = Literal["ahead", "open", "background"]
Identity = Literal["stat", "content"]
"""snapshot.identity: what a background round compares (fusefs/config.py has the why)."""
"""Why a source was stat'ed: ahead of the readers in predicted order, by an open that got there
first, or by a background round."""


class RevalidationStatus(TypedDict):
    """Status section ``revalidation``: checks that cached copies still match their source (a copy is
    served only after a stat of its source in this mount matched the identity it was made from)."""

    rate_per_s: Annotated[
        float,
        gauge(
            "most stats per second (snapshot.revalidate_per_s); a round shorter than "
            "snapshot.revalidate_round_min_s runs slower, spread over that time",
            metric="stats_per_second",
        ),
    ]
    round_files: Annotated[
        int,
        gauge(
            "cached files the current round rechecks: in a group, those this node owns, and every "
            "replicas_every_rounds-th round its replicas of files other nodes own too"
        ),
    ]
    replicas_every_rounds: Annotated[int, gauge("rounds between two that also recheck replicas (the group's size)")]
    round_seconds: Annotated[
        float,
        gauge(
            "cached files this node owns / rate_per_s, at least snapshot.revalidate_round_min_s: the "
            "staleness bound of a copy of a file this node owns (of every copy outside a group) while "
            "mounted, to which the PFS client's own attribute cache adds"
        ),
    ]
    replica_bound_seconds: Annotated[
        float,
        gauge(
            "the staleness bound of a copy this node holds of a file another node owns: "
            "replicas_every_rounds - 1 rounds of its own files and one round of every cached file "
            "(equal to round_seconds outside a group)"
        ),
    ]
    last_round_seconds: Annotated[float | None, gauge("how long the last round took (null before the first)")]
    rounds: Annotated[int, counter("background rounds done")]
    stats: Annotated[dict[StatKind, int], counter("stats made, by why: ahead, open, background", label="why")]
    fresh_files: Annotated[int, gauge("files checked unchanged in this mount")]
    changed_total: Annotated[int, counter("files seen changed", metric="changed_files")]
    changed: Annotated[dict[str, str], text("up to 100 relative paths seen changed, with what changed")]
    identity: Annotated[
        Identity,
        info("snapshot.identity: stat, or content (rounds also compare each cached file's source bytes with its copy)"),
    ]
    content_checks: Annotated[
        int,
        counter(
            "cached files whose source a round read whole and compared with the copy's digests "
            "(snapshot.identity: content)"
        ),
    ]
    content_bytes: Annotated[int, counter("source bytes those comparisons read from the PFS")]


class Revalidator:
    def __init__(
        self,
        snapshot: Snapshot,
        tiers: Sequence[Tier],
        staging: Staging,
        counters: ReadCounters,
        rate: float,
        min_round: float,
        threads: int = 4,
        identity: Identity = "stat",
        hooks: ReadPathHooks = NO_HOOKS,
    ) -> None:
        self.snapshot = snapshot
        self.ids = snapshot.source_ids()
        self.tiers = list(tiers)
        self.staging = staging
        self.counters = counters
        self.rate = rate
        self.min_round = min_round  # the rate is a ceiling, not a quota to spend
        self.limiter = trio.CapacityLimiter(threads)
        self.identity: Identity = identity
        self.content_checks = 0
        self.content_bytes = 0
        self.state: npt.NDArray[np.uint8] = np.zeros(len(snapshot), np.uint8)
        self.changed: dict[int, str] = {}
        self.mine = hooks.mine
        self.replicas_every = hooks.replicas_every  # asked each round: a rendezvous group grows
        self.on_source_changed = hooks.on_source_changed
        self.stats: dict[StatKind, int] = {"ahead": 0, "open": 0, "background": 0}
        self.rounds = 0
        self.round_files = 0  # files the current round checks
        self.owned_files = 0  # cached files this node rechecks every round (at the last round's start)
        self.held_files = 0  # every cached file, replicas included (idem)
        self.last_round_seconds: float | None = None
        self.round_started = 0.0
        self._checking: dict[int, trio.Event] = {}
        self._ahead: list[int] = []
        self._ahead_pos = 0
        self._ahead_wake = trio.Event()

    # ------------------------------------------------------------------ questions of the read path

    def is_changed(self, entry: int) -> bool:
        return int(self.state[entry]) == CHANGED

    def reason(self, entry: int) -> str:
        return self.changed.get(entry, "changed since the snapshot")

    def fresh(self, entry: int) -> None:
        """A PFS read just checked the identity on its descriptor: as good as a stat."""
        if int(self.state[entry]) == UNCHECKED:
            self.state[entry] = FRESH

    def cached(self, entry: int) -> bool:
        return any(t.contains(entry) for t in self.tiers)

    async def ensure(self, entry: int) -> bool:
        """Before a cached copy of ``entry`` is served: True when its source was seen unchanged in
        this mount (stat it now if not yet), False when it changed (its copies are dropped then)."""
        state = int(self.state[entry])
        if state == UNCHECKED:
            await self._check(entry, "open")
            state = int(self.state[entry])
        return state == FRESH

    # ------------------------------------------------------------------ checking

    async def _check(self, entry: int, why: StatKind) -> None:
        running = self._checking.get(entry)
        if running is not None:
            await running.wait()
            return
        done = self._checking[entry] = trio.Event()
        try:
            path = self.snapshot.source_path(entry)
            seen = await trio.to_thread.run_sync(stat_identity, path, limiter=self.limiter)
            self.stats[why] += 1
            self._judge(entry, seen)
        finally:
            del self._checking[entry]
            done.set()

    def _judge(self, entry: int, seen: SourceId | str) -> None:
        if int(self.state[entry]) == CHANGED:
            return
        reason = seen if isinstance(seen, str) else seen.change_from(self.ids.of(entry))
        if reason is None:
            self.state[entry] = FRESH
        else:
            self.mark_changed(entry, f"{reason} since the snapshot")

    def mark_changed(self, entry: int, reason: str) -> None:
        """The source of ``entry`` is not the file the snapshot saw: never serve it again this mount."""
        if int(self.state[entry]) == CHANGED:
            return
        self.state[entry] = CHANGED
        if len(self.changed) < _MAX_LISTED:
            self.changed[entry] = reason
        for tier in self.tiers:
            tier.drop(entry)
        self.staging.forget(entry)  # staged copies, kept pages: dropped, the kernel's pages invalidated
        path = os.fsdecode(self.snapshot.tree.path(entry))
        self.counters.mark_stale(path, reason)
        log.warning("%s: %s; its reads fail with EIO until a remount or --rescan", path, reason)
        if self.on_source_changed is not None:
            self.on_source_changed(path, reason)

    # ------------------------------------------------------------------ ahead of the readers

    def upcoming(self, entries: Sequence[int]) -> None:
        """The prefetcher's predicted reads, in order: check their cached copies before the opens come.

        Only the unchecked ones are kept, in one array operation: a horizon is told several times an
        epoch, and walking all of it entry by entry on the trio thread (tens of thousands at ImageNet
        scale, nearly all fresh after the first epoch) held up every FUSE request meanwhile.
        """
        ents = np.asarray(entries, dtype=np.int64)
        self._ahead, self._ahead_pos = ents[self.state[ents] == UNCHECKED].tolist(), 0
        self._ahead_wake.set()

    async def _ahead_loop(self, parallel: int) -> None:
        async with trio.open_nursery() as nursery:
            slots = trio.Semaphore(parallel)
            while True:
                await self._ahead_wake.wait()
                self._ahead_wake = trio.Event()
                while self._ahead_pos < len(self._ahead) and not self._ahead_wake.is_set():
                    entry = self._ahead[self._ahead_pos]
                    self._ahead_pos += 1
                    if self._ahead_pos % AHEAD_YIELD_EVERY == 0:
                        await trio.lowlevel.checkpoint()  # a long run of uncached ones: let requests in
                    if int(self.state[entry]) != UNCHECKED or not self.cached(entry) or self.staging.serves(entry):
                        continue  # checked, no copy, or its open reads pages, not the copy (module docstring)
                    await slots.acquire()
                    nursery.start_soon(self._ahead_one, entry, slots)

    async def _ahead_one(self, entry: int, slots: trio.Semaphore) -> None:
        try:
            await self._check(entry, "ahead")
        finally:
            slots.release()

    # ------------------------------------------------------------------ background rounds

    def cached_entries(self) -> npt.NDArray[np.int64]:
        """Every entry with a copy this node could serve: tier copies and pages kept in the page cache."""
        parts = [np.asarray(t.entries(), np.int64) for t in self.tiers]
        parts.append(np.asarray(self.staging.cached_entries(), np.int64))
        ents = np.unique(np.concatenate(parts))  # sorted: a round walks the source in entry order
        return ents[self.state[ents] != CHANGED] if ents.size else ents

    async def _round_loop(self) -> None:
        while True:
            cached = self.cached_entries()
            if not cached.size:  # nothing cached, nothing to recheck (and no round to count)
                await trio.sleep(IDLE_SECONDS)
                continue
            mine = self.mine(cached)
            self.owned_files, self.held_files = int(np.count_nonzero(mine)), int(cached.size)
            # Possibly empty (only replicas here, and not their round): the round still counts.
            ents = recheck.round_entries(cached, mine, self.rounds, self.replicas_every())
            self.round_files = int(ents.size)
            self.round_started = time.monotonic()
            # A round shorter than the floor is spread over it, not run at full rate and then idle:
            # N nodes starting rounds together sent the PFS bursts of N x rate stats, and on a
            # two-core host each burst took CPU the readers were waiting for.
            rate = ents.size / recheck.round_seconds(ents.size, self.rate, self.min_round) if ents.size else self.rate
            per_tick = max(1, int(rate * TICK))
            for k in range(0, ents.size, per_tick):
                batch = [int(e) for e in ents[k : k + per_tick].tolist() if int(self.state[e]) != CHANGED]
                paths = [self.snapshot.source_path(e) for e in batch]
                seen = await trio.to_thread.run_sync(_stat_all, paths, limiter=self.limiter)
                self.stats["background"] += len(batch)
                for entry, result in zip(batch, seen, strict=True):
                    self._judge(entry, result)
                if self.identity == "content":
                    await self._compare_contents([e for e in batch if int(self.state[e]) == FRESH])
                # Pace by the clock: stat number k + per_tick is due at round start + (k + per_tick) / rate.
                await trio.sleep(max(0.0, self.round_started + (k + per_tick) / rate - time.monotonic()))
            self.last_round_seconds = time.monotonic() - self.round_started
            self.rounds += 1
            await trio.sleep(max(0.0, self.round_started + self.min_round - time.monotonic()))

    async def _compare_contents(self, entries: list[int]) -> None:
        """``snapshot.identity: content``: compare the sources of these entries, stat'ed unchanged just
        now, with their copies' digests; one worker-thread hop for the batch (module docstring)."""
        checks: list[tuple[int, bytes, list[BlockDigests]]] = []
        for entry in entries:
            recorded = await self._copy_digests(entry)
            if recorded:
                checks.append((entry, self.snapshot.source_path(entry), recorded))
        if not checks:
            return
        reasons = await trio.to_thread.run_sync(
            _contents_changed, [(path, recorded) for _, path, recorded in checks], limiter=self.limiter
        )
        for (entry, _, recorded), reason in zip(checks, reasons, strict=True):
            self.content_checks += 1
            self.content_bytes += recorded[0].size
            if reason is not None:
                self.mark_changed(entry, f"{reason} since the snapshot")

    async def _copy_digests(self, entry: int) -> list[BlockDigests]:
        """What this node's copies of ``entry`` hold: each tier's recorded digests, or when no tier has
        one, the digests of the bytes staged in RAM or of its pages read back (none: nothing to compare,
        e.g. the kernel dropped the pages, and the next open fetches it through the checked paths)."""
        recorded = [d for t in self.tiers if (d := t.digests_of(entry)) is not None]
        if recorded:
            return list(dict.fromkeys(recorded))  # one per distinct copy
        policy = self.staging.policy
        held = policy.pages.get(entry)
        data: bytes | None = held.data if held is not None else None
        if data is None and policy.in_page_cache(entry):
            size = int(policy.sizes[entry])
            data = await trio.to_thread.run_sync(
                self.staging.kernel.read_pages, inode_of(entry), size, limiter=self.limiter
            )
        if data is None:
            return []
        return [await trio.to_thread.run_sync(BlockDigests.of, data, limiter=self.limiter)]

    async def run(self) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._ahead_loop, max(1, int(self.limiter.total_tokens)))
            nursery.start_soon(self._round_loop)

    # ------------------------------------------------------------------ status

    def status(self) -> RevalidationStatus:
        every = self.replicas_every()
        return {
            "rate_per_s": self.rate,
            "round_files": self.round_files,
            "replicas_every_rounds": every,
            "round_seconds": round(recheck.round_seconds(self.owned_files, self.rate, self.min_round), 3),
            "replica_bound_seconds": round(
                recheck.replica_bound_seconds(self.owned_files, self.held_files, self.rate, every, self.min_round),
                3,
            ),
            "last_round_seconds": None if self.last_round_seconds is None else round(self.last_round_seconds, 3),
            "rounds": self.rounds,
            "stats": dict(self.stats),
            "fresh_files": int(np.count_nonzero(self.state == FRESH)),
            "changed_total": int(np.count_nonzero(self.state == CHANGED)),
            "changed": {os.fsdecode(self.snapshot.tree.path(e)): r for e, r in self.changed.items()},
            "identity": self.identity,
            "content_checks": self.content_checks,
            "content_bytes": self.content_bytes,
        }


def _stat_all(paths: list[bytes]) -> list[SourceId | str]:
    return [stat_identity(p) for p in paths]
