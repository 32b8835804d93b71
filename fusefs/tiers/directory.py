"""A directory tier: one file per cached entry on a local disk, under a hard byte budget.

The budget counts what ``du -s PATH`` counts, not file sizes: every file is charged its size
rounded up to the allocation unit (or its real allocation, if larger), every name slot is charged
for its directory entry and its two rows in the persisted index (old + new during a rewrite), and a
fixed base covers the directories, the index headers, the digests of multi-block files and any
files found there that are not ours (left alone, but counted).  Name slots are never given back
during a session because directories do not shrink when files go.

Space is given back only after a dropped file is really unlinked, so the directory never holds
more than the budget even while deletions are under way.  Unlinks and periodic index writes run
as trio system tasks; ``close()`` waits for them and writes the index a last time.  Drops made
before the trio loop runs (pruning at startup) unlink at once instead.

Crash consistency: a copy's journal record (journal.py) is written before its file is renamed to
its final name, so after kill -9 at any moment every final-named copy is kept by the next open
(index, then the journal replayed over it).  The journal's files and a reserve for the next index
write are preallocated: on a full tier filesystem the journal still records every copy, and the
index write frees the reserve and uses its space.  fsync policy: see journal.py (records survive
the daemon's death, not a power loss; the index is fsynced; every read is verified either way).
Index, journal and reserve files are mode 0600.

Which directory is ours (layout.py): the path is trusted from / down first (fusefs/trust.py: no
other user can redirect it), then a tier opens only a directory holding its marker (this user's uid
and a tier id), or marks one that is empty or holds a seerfs index whose checksum holds; any other
directory is refused at mount (exit status 3) before anything is created or removed in it.

On open, a persisted index for the same snapshot fingerprint makes a warm start: files that exist
with their recorded size are kept, everything else of ours (temporaries, orphans, files of a
changed size) is removed.  Another fingerprint or an unusable index means a cold start: all our
files are removed.  "Ours" means entry-shaped names owned by the daemon's user in the marked
directory; an entry-shaped file of another user refuses the mount, with nothing removed, and
other names are never touched.  See base.py for the concurrency rules.
"""

from __future__ import annotations

import errno
import fcntl
import functools
import logging
import os
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Literal

import trio

from fusefs.errors import ConfigError
from fusefs.meta.identity import SourceColumns, SourceId
from fusefs.tiers import index as index_io
from fusefs.tiers.base import AuditStatus, DirectoryTierStatus, OpenedStatus, PutSlot, TierCounters, in_trio
from fusefs.tiers.budget import Budget
from fusefs.tiers.digest import BLOCK, BlockDigests
from fusefs.tiers.fileio import is_enospc, read_verified, unlink_quiet, write_atomic
from fusefs.tiers.index import INDEX_NAME, RESERVE_NAME, ROW_BYTES, TierIndex
from fusefs.tiers.journal import ADD, JOURNAL_NAMES, REMOVE, Journal, JournalFull, Record, journal_bytes
from fusefs.tiers.layout import (
    LOCK_NAME,
    MARKER_NAME,
    Marker,
    alloc_unit,
    disk_usage,
    file_path,
    foreign_top_level,
    looks_fresh,
    read_marker,
    scan_subdir,
    subdir_names,
    tmp_path,
    write_marker,
)
from fusefs.trust import private_subdir, trusted_dir

log = logging.getLogger(__name__)

DIRENT_BYTES = 64
"""Directory space charged per name slot (an ext4 entry for our names takes 16-32 bytes)."""
NAME_BYTES = DIRENT_BYTES + 3 * ROW_BYTES
"""Budget per name slot: its directory entry plus its row in the old and the new index and the reserve."""
INDEX_FIXED = 96 << 10
"""Budget for the index files' headers and block rounding, the reserve's margin, the lock file and
the marker."""
RESERVE_MARGIN = 8 << 10
"""The reserve holds the last index's size plus this much (rows added since then)."""
JOURNAL_SWITCH_AT = 0.5
"""Write the index (and so start a fresh journal generation) once the journal is this full."""
UNINDEXED_POLL = 0.001
"""Seconds between looks, in an index write, for puts whose record predates the last switch (persist)."""


def round_up(n: int, unit: int) -> int:
    return -(-n // unit) * unit


class DirectoryTier:
    kind: Literal["directory"] = "directory"

    def __init__(
        self,
        index: int,
        path: Path,
        limit: int,
        threads: int,
        snapshot_fingerprint: str,
        *,
        clean_cache: bool = True,
        persist_interval: float = 30.0,
        on_drop: Callable[[int, int], None] | None = None,
    ) -> None:
        self.index = index
        self.name = f"directory:{index}"
        self.path = Path(path)
        self.threads = threads
        self.limiter = trio.CapacityLimiter(threads)
        self.budget = Budget(limit, self.name)
        self.fingerprint = snapshot_fingerprint
        self.clean_cache = clean_cache
        self.persist_interval = persist_interval
        self.counters = TierCounters()
        self.alloc = 4096
        self.base_bytes = 0
        self.foreign_bytes = 0
        self.opened: OpenedStatus | None = None
        self._idx = TierIndex()
        self._over: dict[int, int] = {}  # entry -> allocated bytes beyond round_up(size)
        self._inflight: dict[int, PutSlot] = {}
        self._unlinking: dict[int, trio.Event] = {}
        self._names_charged = 0
        self._stuck_bytes = 0  # charged for files we failed to unlink
        self._changes = 0
        self._saved_changes = 0
        self._persisted_at = time.monotonic()
        self._persist_lock = trio.Lock()
        self._persister: trio.CancelScope | None = None  # the pending periodic index write
        self._persist_wake = trio.Event()  # set: write the index now (the journal is filling up)
        self._persist_now = False
        self._persist_failed_at = -10.0
        self._persist_errors = 0
        self._background = 0
        self._background_idle: trio.Event | None = None
        self._logged_errnos: set[int] = set()
        self._last_audit: AuditStatus | None = None
        self._closed = False
        self.on_drop = on_drop  # told (entry, index) of every entry this tier forgets
        self.journal: Journal | None = None
        self._journal_note: str | None = None  # why the journal is not in use, for status
        self._journal_errors = 0
        self.marker: Marker | None = None
        self._lock_fd = -1
        self._lock_fd = self._claim_directory()
        try:
            self._open()
        except OSError as exc:
            self.abandon()
            raise ConfigError(f"tiers.{index}.path: cannot use {self.path}: {exc.strerror or exc}") from None
        except BaseException:
            self.abandon()
            raise

    # ------------------------------------------------------------------ open

    def _claim_directory(self) -> int:
        """Trust the path, check the directory is ours (or may become ours) before creating anything
        in it, lock it, then mark it and make the fan-out directories.  The ownership check runs
        again under the lock: another daemon may have claimed or used the directory meanwhile."""
        key = f"tiers.{self.index}.path"
        trusted_dir(self.path, key)  # made 0700 if missing: cached data is private
        try:
            self._ownership(key, claim=False)
            fd = os.open(self.path / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        except OSError as exc:
            raise ConfigError(f"{key}: cannot use {self.path}: {exc.strerror}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise ConfigError(f"{key}: {self.path} is in use by another seerfs daemon") from None
        try:
            self.marker = self._ownership(key, claim=True)
            for sub in subdir_names():
                private_subdir(self.path / sub)
        except OSError as exc:
            os.close(fd)
            raise ConfigError(f"{key}: cannot use {self.path}: {exc.strerror}") from None
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _ownership(self, key: str, claim: bool) -> Marker | None:
        """This user's marker in the tier directory, written first when ``claim`` and the directory
        is empty or holds a seerfs index whose checksum holds (a tier from before markers).
        ConfigError (one line, exit status 3) for any other directory; nothing is changed in it."""
        rule = "seerfs uses only an empty directory or a tier it made"
        try:
            marker = read_marker(self.path)
        except ValueError as exc:
            raise ConfigError(f"{key}: {self.path}: {exc}; {rule}") from None
        if marker is not None:
            return marker
        if looks_fresh(self.path):
            why = "empty"
        elif (problem := index_io.written_by_seerfs(self.path / INDEX_NAME)) is None:
            why = "holding a seerfs index"
        else:
            raise ConfigError(
                f"{key}: {self.path} is not empty and holds no {MARKER_NAME} nor a valid seerfs index "
                f"({problem}); {rule}"
            )
        if not claim:
            return None
        marker = write_marker(self.path)
        log.info("%s: %s (%s) marked as this daemon's tier %s", self.name, self.path, why, marker.tier)
        return marker

    def _open(self) -> None:
        """Reconcile the persisted index and journal with the files on disk and charge what stays (blocking)."""
        t0 = time.monotonic()
        self.alloc = alloc_unit(self.path)
        with ThreadPoolExecutor(max(4, self.threads)) as pool:
            scans = list(pool.map(functools.partial(scan_subdir, self.path), subdir_names()))
        foreign_owned = [item for sc in scans for item in sc.foreign_owned]
        if foreign_owned:  # before the journal or any removal: nothing in the directory changes
            path, uid = foreign_owned[0]
            more = f" (and {len(foreign_owned) - 1} more)" if len(foreign_owned) > 1 else ""
            raise ConfigError(
                f"tiers.{self.index}.path: {path}{more} is owned by uid {uid}, not by this daemon's user; "
                "seerfs removes only its own files (move it away)"
            )
        try:
            journal: Journal | None = Journal(self.path, journal_bytes(self.budget.limit))
        except OSError as exc:  # e.g. no room for even an empty file: the tier works, not crash-safe
            journal = None
            self._journal_note = f"no journal ({exc.strerror or exc}): copies are not crash-safe"
            log.warning("%s: %s", self.name, self._journal_note)
        self.journal = journal
        gen = 0
        replayed = 0
        try:
            loaded, gen = index_io.load(self.path / INDEX_NAME, self.fingerprint)
            reason = "index matches the snapshot"
        except index_io.IndexError_ as exc:
            loaded, reason = None, str(exc)
        if loaded is not None and journal is not None:
            # G - 1 may hold records the index's export missed (puts in flight); see journal.py.
            for g in (gen - 1, gen):
                for rec in journal.read(g):
                    replayed += 1
                    if rec.op == ADD and rec.source is not None and rec.digests is not None:
                        loaded.add(rec.entry, rec.source, rec.digests)
                    elif rec.op == REMOVE and loaded.has(rec.entry):
                        loaded.remove(rec.entry)
        elif journal is not None:
            journal.reset()
        unlink_quiet(str(self.path / (INDEX_NAME + ".tmp")))
        ours = {LOCK_NAME, MARKER_NAME, INDEX_NAME, RESERVE_NAME, *JOURNAL_NAMES}
        with ThreadPoolExecutor(max(4, self.threads)) as pool:
            remove: list[str] = [p for sc in scans for p in sc.temporary]
            foreign = foreign_top_level(self.path, ours)
            foreign += sum(sc.foreign_bytes for sc in scans)
            found: dict[int, tuple[int, int]] = {}
            for sc in scans:
                found.update(sc.files)
            idx = loaded if loaded is not None else TierIndex()
            for e in idx.entries().tolist():
                if found.get(e, (-1, 0))[0] != int(idx.size[e]):
                    idx.remove(e)
            remove.extend(file_path(self.path, e) for e in found if not idx.has(e))
            dirs = os.lstat(self.path).st_blocks * 512 + sum(max(self.alloc, sc.dir_bytes) for sc in scans)
            self.foreign_bytes = foreign
            journal_space = 2 * journal.size if journal is not None else 0
            self.base_bytes = dirs + foreign + INDEX_FIXED + journal_space + 2 * 8 * (self.budget.limit // BLOCK + 1)
            if not self.budget.try_reserve(min(self.base_bytes, self.budget.limit)):
                raise AssertionError("a fresh budget refused its base")
            over_budget = 0
            for e in idx.entries().tolist():
                size, allocated = found[e]
                file_charge = max(round_up(size, self.alloc), allocated)
                if not self.budget.try_reserve(file_charge + NAME_BYTES):
                    idx.remove(e)  # the budget shrank since the last run
                    remove.append(file_path(self.path, e))
                    over_budget += 1
                    continue
                self._names_charged += 1
                if file_charge > round_up(size, self.alloc):
                    self._over[e] = file_charge - round_up(size, self.alloc)
            list(pool.map(unlink_quiet, remove))
        self._idx = idx
        if journal is not None:
            why_not = journal.reserve() if self.base_bytes <= self.budget.limit else "budget below the fixed overhead"
            if why_not is not None:
                log.warning("%s: journal space not reserved (%s); appends may fail on a full disk", self.name, why_not)
        try:  # claim a fresh generation: the journal is written from the start of its file
            self._save_index(idx.export(), gen + 1)
            if journal is not None:
                journal.switch(gen + 1)
        except OSError as exc:
            if loaded is not None and journal is not None:  # the index on disk still covers gen: append to it
                journal.switch(gen)
                journal.tail = journal.length(gen)
            else:
                self._journal_note = f"no index could be written ({exc.strerror or exc}): copies are not crash-safe"
            self._changes = 1
            log.warning("%s: cannot write the index: %s", self.name, exc.strerror or exc)
        self.opened = {
            "warm": loaded is not None,
            "reason": reason,
            "kept_files": idx.count,
            "kept_bytes": idx.data_bytes,
            "journal_records": replayed,
            "removed_files": len(remove),
            "over_budget": over_budget,
            "seconds": round(time.monotonic() - t0, 3),
        }
        refused = loaded is None and reason != "no index"  # an index was there and could not be used
        log.log(
            logging.WARNING if refused else logging.INFO,
            "%s: %s start at %s (%s): kept %d files, %d bytes (%d journal records); removed %d files",
            self.name,
            "warm" if loaded is not None else "cold",
            self.path,
            reason,
            idx.count,
            idx.data_bytes,
            replayed,
            len(remove),
        )
        if self.base_bytes > self.budget.limit:
            log.warning(
                "%s: budget %d is below the tier's fixed overhead %d; nothing will be cached",
                self.name,
                self.budget.limit,
                self.base_bytes,
            )

    def _save_index(self, arrays: dict[str, Any], gen: int) -> None:
        """Write the index claiming journal generation ``gen`` (blocking).

        On a full disk the reserve is given up and the write tried again in its space; after a
        good write the reserve is set to the new index's size plus a margin (best effort)."""
        path = self.path / INDEX_NAME
        reserve = self.path / RESERVE_NAME
        try:
            written = index_io.save(path, arrays, self.fingerprint, gen)
        except OSError as exc:
            if not is_enospc(exc) or not reserve.exists():
                raise
            reserve.unlink()
            log.warning("%s: tier filesystem full: index written in its reserved space", self.name)
            written = index_io.save(path, arrays, self.fingerprint, gen)
        try:
            fd = os.open(reserve, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
            try:
                os.posix_fallocate(fd, 0, written + RESERVE_MARGIN)
            finally:
                os.close(fd)
        except OSError:
            pass  # no room for a reserve now: the next write tries again

    def abandon(self) -> None:
        """Let go of the directory without writing the index (startup failed elsewhere)."""
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1
        if self.journal is not None:
            self.journal.close()
            self.journal = None
        self._closed = True

    # ------------------------------------------------------------------ queries

    def contains(self, entry: int) -> bool:
        return self._idx.has(entry)

    def size_of(self, entry: int) -> int | None:
        return self._idx.size_of(entry)

    def digests_of(self, entry: int) -> BlockDigests | None:
        return self._idx.digests(entry) if self._idx.has(entry) else None

    def source_of(self, entry: int) -> SourceId | None:
        """The identity of the source the copy of ``entry`` was made from (None: no copy)."""
        return self._idx.source_of(entry) if self._idx.has(entry) else None

    def footprint(self, size: int) -> int:
        """Budget bytes one more file of ``size`` bytes takes at most (data blocks and a name slot)."""
        return round_up(size, self.alloc) + NAME_BYTES

    def entries(self) -> list[int]:
        return [int(e) for e in self._idx.entries().tolist()]

    def _names_in_use(self) -> int:
        return self._idx.count + len(self._inflight) + len(self._unlinking)

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"{self.name} is closed")

    # ------------------------------------------------------------------ put

    async def put(
        self,
        entry: int,
        data: bytes,
        source: SourceId,
        digests: BlockDigests | None = None,
    ) -> bool:
        """Store ``data`` (whole file) for ``entry``, made from the source file ``source``; False when
        it does not fit or cannot be written. Never evicts: making room is the caller's decision (drop)."""
        self._check_open()
        size = len(data)
        if digests is not None and digests.size != size:
            raise ValueError(f"entry {entry}: digests for {digests.size} bytes, data has {size}")
        if source.size != size:
            raise ValueError(f"entry {entry}: source of {source.size} bytes, data has {size}")
        if self._idx.has(entry):
            if self._idx.source_of(entry) == source:
                return True
            self.drop(entry)
        slot = self._inflight.get(entry)
        if slot is not None:
            await slot.done.wait()
            return slot.ok
        slot = self._inflight[entry] = PutSlot()
        charge = 0  # reserved and not yet handed to the index or to an unlink
        try:
            while (gone := self._unlinking.get(entry)) is not None:
                await gone.wait()  # the old file must be unlinked before the new one takes its name
            if slot.dropped:
                return False
            new_name = self._names_in_use() > self._names_charged
            file_charge = round_up(size, self.alloc)
            want = file_charge + (NAME_BYTES if new_name else 0)
            if not self.budget.try_reserve(want):
                self.counters.put_refused += 1
                return False
            if new_name:
                self._names_charged += 1
                want -= NAME_BYTES  # a name slot stays charged for the session
            charge = want
            try:
                written, allocated = await self._write_journaled(entry, data, source, digests, slot)
            except JournalFull as exc:
                self._journal_failed(exc)
                return False
            except OSError as exc:
                self._write_failed(entry, exc)
                return False
            # From here the file exists under its final name: it is committed or unlinked, no await.
            if allocated > charge and not self.budget.try_reserve(allocated - charge):
                self.counters.put_refused += 1
                slot.dropped = True
            elif allocated > charge:
                charge = allocated
            if slot.dropped:
                self._schedule_unlink(entry, charge)
                charge = 0
                return False
            self._idx.add(entry, source, written)
            if charge > file_charge:
                self._over[entry] = charge - file_charge
            charge = 0
            self.counters.puts += 1
            self.counters.put_bytes += size
            slot.ok = True
            self._changed()
            return True
        finally:
            if charge:
                self.budget.release(charge)
            del self._inflight[entry]
            slot.done.set()

    def _write(
        self, entry: int, data: bytes, source: SourceId, digests: BlockDigests | None, slot: PutSlot
    ) -> tuple[BlockDigests, int]:
        """Hash (if needed) and write one file, its journal record just before its rename; runs in a
        worker thread.  ``slot``: the put's, which notes the journal's generation (see persist)."""
        if digests is None:
            digests = BlockDigests.of(data)
        final, tmp = file_path(self.path, entry), tmp_path(self.path, entry)
        record = functools.partial(self._journal_add, Record(ADD, entry, source, digests), slot)
        try:
            allocated = write_atomic(final, tmp, data, self.clean_cache, record)
        except FileNotFoundError:  # a fan-out directory was removed under us
            os.makedirs(os.path.dirname(final), exist_ok=True)
            allocated = write_atomic(final, tmp, data, self.clean_cache, record)
        return digests, allocated

    async def _write_journaled(
        self, entry: int, data: bytes, source: SourceId, digests: BlockDigests | None, slot: PutSlot
    ) -> tuple[BlockDigests, int]:
        """``_write`` in a worker thread; when the journal is full, write the index (which starts a
        fresh generation) and try again, for as long as index writes succeed (each frees a journal)."""
        while True:
            journal = self.journal
            gen = journal.gen if journal is not None else 0
            try:
                return await trio.to_thread.run_sync(
                    self._write, entry, data, source, digests, slot, limiter=self.limiter
                )
            except JournalFull:
                if not await self.persist(switch_from=gen):
                    raise

    def _journal_add(self, rec: Record, slot: PutSlot) -> None:
        """Worker thread: the record a copy needs before it may take its final name.  The slot
        notes the generation first, so a record of a generation is never without its note."""
        if self.journal is not None and self.journal.gen >= 1:
            slot.journal_gen = self.journal.gen
            self.journal.append(rec)

    def _journal_failed(self, exc: Exception) -> None:
        """A put whose record could not be written: the copy is not kept (it would not survive a crash)."""
        self.counters.put_errors += 1
        self._journal_errors += 1
        if self._journal_errors == 1:
            log.warning("%s: journal: %s; copies are refused until the index is written", self.name, exc)
        self._persist_soon()

    def _write_failed(self, entry: int, exc: OSError) -> None:
        self.counters.put_errors += 1
        code = exc.errno if exc.errno is not None else errno.EIO
        if code not in self._logged_errnos:  # once per kind of failure, not once per file
            self._logged_errnos.add(code)
            log.warning(
                "%s: cannot write entry %d: %s (further such errors are only counted)",
                self.name,
                entry,
                exc.strerror or exc,
            )

    # ------------------------------------------------------------------ get

    async def get(self, entry: int) -> bytes | None:
        """The whole file, verified; None if absent or damaged (a damaged copy is dropped)."""
        return await self._read(entry, None, None)

    async def read_range(self, entry: int, off: int, size: int) -> bytes | None:
        """Bytes [off, off+size) (short at the end of the file); only the blocks touched are read
        and verified."""
        return await self._read(entry, off, size)

    async def _read(self, entry: int, off: int | None, size: int | None) -> bytes | None:
        self._check_open()
        if not self._idx.has(entry):
            self.counters.misses += 1
            return None
        digests = self._idx.digests(entry)
        gen = self._idx.generation(entry)
        if off is None or size is None:
            start, end = 0, digests.size
        else:
            off, size = max(off, 0), max(size, 0)
            if off >= digests.size or size == 0:
                self.counters.hits += 1
                return b""
            start, end = digests.span(off, size)
        path = file_path(self.path, entry)
        try:
            data, why = await trio.to_thread.run_sync(
                read_verified, path, digests, start, end, self.clean_cache, limiter=self.limiter
            )
        except OSError as exc:
            data, why = None, f"unreadable ({exc.strerror or exc})"
        if data is None:
            if self._idx.has(entry) and self._idx.generation(entry) == gen:
                self.counters.corrupt += 1
                log.warning("%s: entry %d: %s; copy dropped", self.name, entry, why)
                self.drop(entry)
            else:  # dropped or replaced while we read: not damage, just gone
                self.counters.misses += 1
            return None
        if off is not None and size is not None:
            data = data[off - start : off - start + size]
        self.counters.hits += 1
        self.counters.hit_bytes += len(data)
        return data

    # ------------------------------------------------------------------ drop

    def drop(self, entry: int) -> None:
        """Forget ``entry`` now; its budget comes back once the file is unlinked."""
        slot = self._inflight.get(entry)
        if slot is not None:
            slot.dropped = True
        if not self._idx.has(entry):
            return
        size = self._idx.remove(entry)
        charge = round_up(size, self.alloc) + self._over.pop(entry, 0)
        self.counters.drops += 1
        if self.journal is not None and self.journal.gen >= 1:
            # Synchronous (a few bytes to a local file) so the records keep the index's order.  If
            # it fails the copy may come back after a crash: harmless, since every read is verified
            # and the source's identity is checked again after each mount.
            try:
                self.journal.append(Record(REMOVE, entry))
            except (OSError, JournalFull) as exc:
                self._journal_failed(exc)
                self.counters.put_errors -= 1  # counted as a journal error, not a failed put
        self._schedule_unlink(entry, charge)
        self._changed()
        if self.on_drop is not None:
            self.on_drop(entry, self.index)

    def _schedule_unlink(self, entry: int, charge: int) -> None:
        assert entry not in self._unlinking
        if not in_trio():  # pruning at startup, before the loop runs: unlink now
            try:
                unlink_quiet(file_path(self.path, entry))
                self.budget.release(charge)
            except OSError as exc:
                log.error("%s: cannot remove %s: %s", self.name, file_path(self.path, entry), exc.strerror)
                self._stuck_bytes += charge
            return
        done = self._unlinking[entry] = trio.Event()
        self._spawn(functools.partial(self._unlink, entry, charge, done), f"unlink {entry}")

    async def _unlink(self, entry: int, charge: int, done: trio.Event) -> None:
        unlinked = False
        try:
            await trio.to_thread.run_sync(unlink_quiet, file_path(self.path, entry), limiter=self.limiter)
            unlinked = True
        except OSError as exc:
            log.error("%s: cannot remove %s: %s", self.name, file_path(self.path, entry), exc.strerror)
        finally:
            if unlinked:
                self.budget.release(charge)
            else:  # still on disk (or shutting down): keep it charged
                self._stuck_bytes += charge
            del self._unlinking[entry]
            done.set()

    def prune_stale(self, ids: SourceColumns) -> int:
        """Drop copies made from another source identity than the snapshot records; returns how many."""
        ents = self._idx.entries()
        i = self._idx
        ok = ids.matches(ents, i.size[ents], i.mtime[ents], i.ctime[ents], i.ino[ents])
        stale = ents[~ok].tolist()
        for e in stale:
            self.drop(int(e))
        self.counters.stale += len(stale)
        return len(stale)

    # ------------------------------------------------------------------ persistence

    def _changed(self) -> None:
        self._changes += 1
        if self._persister is None and in_trio():  # before the loop runs, close() writes it
            self._persister = trio.CancelScope()
            self._spawn(self._persist_later, "persist index")
        if self.journal is not None and self.journal.fill() >= JOURNAL_SWITCH_AT:
            self._persist_soon()

    def _persist_soon(self) -> None:
        """Write the index without waiting for the interval (the journal is filling up); not within
        a second of a failed write, so a full disk does not turn this into a loop of failing writes."""
        if self._persist_now or time.monotonic() - self._persist_failed_at < 1.0 or not in_trio():
            return
        self._persist_now = True
        self._persist_wake.set()
        if self._persister is None:
            self._persister = trio.CancelScope()
            self._spawn(self._persist_later, "persist index")

    async def _persist_later(self) -> None:
        """Write the index at most every ``persist_interval`` seconds while changes keep coming."""
        assert self._persister is not None
        try:
            with self._persister:
                while self._changes != self._saved_changes or self._persist_now:
                    if not self._persist_now:
                        wait = max(0.0, self._persisted_at + self.persist_interval - time.monotonic())
                        with trio.move_on_after(wait):
                            await self._persist_wake.wait()
                    self._persist_wake = trio.Event()
                    self._persist_now = False
                    await self.persist(force=True)
        finally:
            self._persister = None

    async def persist(self, force: bool = False, switch_from: int | None = None) -> bool:
        """Write the index if it changed (or ``force``, or the journal is still at generation
        ``switch_from``); False if the write failed (logged).

        The written index claims the next journal generation, and the journal switches to it only
        once the index is in place (see journal.py for why that order is crash-safe)."""
        async with self._persist_lock:
            if switch_from is not None:
                if self.journal is None or self.journal.gen != switch_from:
                    return True  # another write started a fresh generation meanwhile
            elif self._changes == self._saved_changes and not force:
                return True
            journal = self.journal
            if journal is not None:
                # The next open replays only the generation this index claims and the one before.
                # A put with a record of the one before that must be in this export: wait for it.
                # It is past its worker thread's record (it only renames and returns), so the wait
                # is short.  A note older than the journal's generation may belong to a record of
                # the current one (a switch between note and append): waited for too, harmlessly.
                while self._record_before(journal.gen):
                    await trio.sleep(UNINDEXED_POLL)
            changes = self._changes
            arrays = self._idx.export()
            gen = journal.gen + 1 if journal is not None else 1
            try:
                await trio.to_thread.run_sync(self._save_index, arrays, gen, limiter=self.limiter)
            except OSError as exc:
                self._persist_errors += 1
                self._persisted_at = self._persist_failed_at = time.monotonic()  # retry after an interval
                log.warning("%s: cannot write the index: %s", self.name, exc.strerror or exc)
                return False
            if journal is not None:
                journal.switch(gen)
                self._journal_note = None
            self._saved_changes = changes
            self._persisted_at = time.monotonic()
            return True

    def _record_before(self, gen: int) -> bool:
        """Whether a put in flight (its outcome not in the index yet) may have a record older than ``gen``."""
        return any(s.journal_gen is not None and s.journal_gen < gen for s in self._inflight.values())

    def _spawn(self, fn: Callable[[], Awaitable[object]], what: str) -> None:
        self._background += 1
        trio.lowlevel.spawn_system_task(self._run_background, fn, what, name=f"{self.name}: {what}")

    async def _run_background(self, fn: Callable[[], Awaitable[object]], what: str) -> None:
        try:
            await fn()
        except Exception:
            log.exception("%s: %s failed", self.name, what)
        finally:
            self._background -= 1
            if self._background == 0 and self._background_idle is not None:
                self._background_idle.set()

    async def close(self) -> None:
        """Wait for unlinks and index writes under way, then write the index a last time.

        Puts still in flight should be cancelled by the caller first; their temporaries are
        removed at the next open."""
        if self._closed:
            return
        if self._persister is not None:
            self._persister.cancel()  # written below anyway
        while self._background:
            self._background_idle = trio.Event()
            await self._background_idle.wait()
        await self.persist(force=True)
        self.abandon()

    # ------------------------------------------------------------------ status

    async def audit(self) -> AuditStatus:
        """Measure the directory as ``du`` would and compare with the budget's count."""
        real = await trio.to_thread.run_sync(disk_usage, self.path, limiter=self.limiter)
        self._last_audit = {"real_bytes": real, "used_bytes": self.budget.used, "at": time.time()}
        return self._last_audit.copy()

    def status(self) -> DirectoryTierStatus:
        return {
            "name": self.name,
            "kind": self.kind,
            "path": str(self.path),
            "budget_bytes": self.budget.limit,
            "used_bytes": self.budget.used,
            "base_bytes": min(self.base_bytes, self.budget.limit),
            "foreign_bytes": self.foreign_bytes,  # not ours, left alone, charged
            "name_slots": self._names_charged,
            "stuck_bytes": self._stuck_bytes,
            "files": self._idx.count,
            "data_bytes": self._idx.data_bytes,
            "inflight": len(self._inflight),
            "unlinking": len(self._unlinking),
            "threads": self.threads,
            "index_memory_bytes": self._idx.memory_bytes(),
            "index_unsaved_changes": self._changes - self._saved_changes,
            "index_write_errors": self._persist_errors,
            "journal": None
            if self.journal is None
            else {
                "generation": self.journal.gen,
                "fill": round(self.journal.fill(), 4),
                "reserved": self.journal.reserved,
                "records": self.journal.records,
                "errors": self._journal_errors,
                "note": self._journal_note,
            },
            "opened": None if self.opened is None else self.opened.copy(),
            "audit": self._last_audit,
            **self.counters.as_dict(),
        }
