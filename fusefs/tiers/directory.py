"""A directory tier: one file per cached entry on a local disk, under a hard byte budget.

The budget counts what ``du -s PATH`` counts, not file sizes: every file is charged its size
rounded up to the allocation unit (or its real allocation, if larger), every name slot is charged
for its directory entry and its two rows in the persisted index (old + new during a rewrite), and a
fixed base covers the directories, the index headers, the digests of multi-block files and any
files found there that are not ours (left alone, but counted).  Name slots are never given back
during a session because directories do not shrink when files go.

Space is given back only after a dropped file is really unlinked, so the directory never holds
more than the budget even while deletions are under way.  Unlinks and periodic index writes run
as trio system tasks; ``close()`` waits for them and writes the index a last time.

On open, a persisted index for the same snapshot fingerprint makes a warm start: files that exist
with their recorded size are kept, everything else of ours (temporaries, orphans, files of a
changed size) is removed.  Another fingerprint or an unusable index means a cold start: all our
files are removed.  Files that are not ours (other names) are never touched.  See base.py for the
concurrency rules.
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
from typing import Any

import numpy as np
import trio

from fusefs.errors import ConfigError
from fusefs.tiers import index as index_io
from fusefs.tiers.base import IntColumn, PutSlot, TierCounters
from fusefs.tiers.budget import Budget
from fusefs.tiers.digest import BLOCK, BlockDigests
from fusefs.tiers.fileio import read_verified, unlink_quiet, write_atomic
from fusefs.tiers.index import INDEX_NAME, ROW_BYTES, TierIndex
from fusefs.tiers.layout import (
    LOCK_NAME,
    alloc_unit,
    disk_usage,
    file_path,
    foreign_top_level,
    scan_subdir,
    subdir_names,
    tmp_path,
)

log = logging.getLogger(__name__)

DIRENT_BYTES = 64
"""Directory space charged per name slot (an ext4 entry for our names takes 16-32 bytes)."""
NAME_BYTES = DIRENT_BYTES + 2 * ROW_BYTES
"""Budget per name slot: its directory entry plus its row in the old and the new index."""
INDEX_FIXED = 64 << 10
"""Budget for the index files' headers and block rounding, and the lock file."""


def round_up(n: int, unit: int) -> int:
    return -(-n // unit) * unit


class DirectoryTier:
    kind = "directory"

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
        self.opened: dict[str, Any] = {}
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
        self._persist_errors = 0
        self._background = 0
        self._background_idle: trio.Event | None = None
        self._logged_errnos: set[int] = set()
        self._last_audit: dict[str, Any] | None = None
        self._closed = False
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
        key = f"tiers.{self.index}.path"
        try:
            self.path.mkdir(mode=0o700, parents=True, exist_ok=True)  # cached data is private
            for sub in subdir_names():
                (self.path / sub).mkdir(mode=0o700, exist_ok=True)
            fd = os.open(self.path / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise ConfigError(f"{key}: cannot use {self.path}: {exc.strerror}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise ConfigError(f"{key}: {self.path} is in use by another seerfs daemon") from None
        return fd

    def _open(self) -> None:
        """Reconcile the persisted index with the files on disk and charge what stays (blocking)."""
        t0 = time.monotonic()
        self.alloc = alloc_unit(self.path)
        try:
            loaded: TierIndex | None = index_io.load(self.path / INDEX_NAME, self.fingerprint)
            reason = "index matches the snapshot"
        except index_io.IndexError_ as exc:
            loaded, reason = None, str(exc)
        index_tmp = self.path / (INDEX_NAME + ".tmp")
        unlink_quiet(str(index_tmp))
        with ThreadPoolExecutor(max(4, self.threads)) as pool:
            scans = list(pool.map(functools.partial(scan_subdir, self.path), subdir_names()))
            remove: list[str] = [p for sc in scans for p in sc.temporary]
            foreign = foreign_top_level(self.path, {LOCK_NAME, INDEX_NAME})
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
            self.base_bytes = dirs + foreign + INDEX_FIXED + 2 * 8 * (self.budget.limit // BLOCK + 1)
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
        if loaded is None or remove or over_budget:
            try:
                index_io.save(self.path / INDEX_NAME, idx.export(), self.fingerprint)
            except OSError as exc:  # e.g. disk full: the tier still works, the index is written later
                self._changes = 1
                log.warning("%s: cannot write the index: %s", self.name, exc.strerror or exc)
        self.opened = {
            "warm": loaded is not None,
            "reason": reason,
            "kept_files": idx.count,
            "kept_bytes": idx.data_bytes,
            "removed_files": len(remove),
            "over_budget": over_budget,
            "seconds": round(time.monotonic() - t0, 3),
        }
        log.info(
            "%s: %s start at %s (%s): kept %d files, %d bytes; removed %d files",
            self.name,
            "warm" if loaded is not None else "cold",
            self.path,
            reason,
            idx.count,
            idx.data_bytes,
            len(remove),
        )
        if self.base_bytes > self.budget.limit:
            log.warning(
                "%s: budget %d is below the tier's fixed overhead %d; nothing will be cached",
                self.name,
                self.budget.limit,
                self.base_bytes,
            )

    def abandon(self) -> None:
        """Let go of the directory without writing the index (startup failed elsewhere)."""
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1
        self._closed = True

    # ------------------------------------------------------------------ queries

    def contains(self, entry: int) -> bool:
        return self._idx.has(entry)

    def size_of(self, entry: int) -> int | None:
        return self._idx.size_of(entry)

    def digests_of(self, entry: int) -> BlockDigests | None:
        return self._idx.digests(entry) if self._idx.has(entry) else None

    def source_mtime_of(self, entry: int) -> int | None:
        return int(self._idx.mtime[entry]) if self._idx.has(entry) else None

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
        source_mtime_ns: int,
        digests: BlockDigests | None = None,
    ) -> bool:
        """Store ``data`` (whole file) for ``entry``; False when it does not fit or cannot be
        written. Never evicts: making room is the caller's decision (drop)."""
        self._check_open()
        size = len(data)
        if digests is not None and digests.size != size:
            raise ValueError(f"entry {entry}: digests for {digests.size} bytes, data has {size}")
        if self._idx.has(entry):
            if self._idx.size_of(entry) == size:
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
                written, allocated = await trio.to_thread.run_sync(
                    self._write, entry, data, digests, limiter=self.limiter
                )
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
            self._idx.add(entry, size, source_mtime_ns, written)
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

    def _write(self, entry: int, data: bytes, digests: BlockDigests | None) -> tuple[BlockDigests, int]:
        """Hash (if needed) and write one file; runs in a worker thread."""
        if digests is None:
            digests = BlockDigests.of(data)
        final, tmp = file_path(self.path, entry), tmp_path(self.path, entry)
        try:
            allocated = write_atomic(final, tmp, data, self.clean_cache)
        except FileNotFoundError:  # a fan-out directory was removed under us
            os.makedirs(os.path.dirname(final), exist_ok=True)
            allocated = write_atomic(final, tmp, data, self.clean_cache)
        return digests, allocated

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
        self._schedule_unlink(entry, charge)
        self._changed()

    def _schedule_unlink(self, entry: int, charge: int) -> None:
        assert entry not in self._unlinking
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

    def prune_stale(self, sizes: IntColumn, mtimes_ns: IntColumn) -> int:
        """Drop copies whose source no longer matches the snapshot's size/mtime; returns how many."""
        ents = self._idx.entries()
        sz = np.asarray(sizes)
        mt = np.asarray(mtimes_ns)
        inside = ents[ents < len(sz)]
        differs = (sz[inside] != self._idx.size[inside]) | (mt[inside] != self._idx.mtime[inside])
        stale = ents[ents >= len(sz)].tolist() + inside[differs].tolist()
        for e in stale:
            self.drop(int(e))
        self.counters.stale += len(stale)
        return len(stale)

    # ------------------------------------------------------------------ persistence

    def _changed(self) -> None:
        self._changes += 1
        if self._persister is None:
            self._persister = trio.CancelScope()
            self._spawn(self._persist_later, "persist index")

    async def _persist_later(self) -> None:
        """Write the index at most every ``persist_interval`` seconds while changes keep coming."""
        assert self._persister is not None
        try:
            with self._persister:
                while self._changes != self._saved_changes:
                    await trio.sleep(max(0.0, self._persisted_at + self.persist_interval - time.monotonic()))
                    await self.persist()
        finally:
            self._persister = None

    async def persist(self, force: bool = False) -> bool:
        """Write the index if it changed (or ``force``); False if the write failed (logged)."""
        async with self._persist_lock:
            if self._changes == self._saved_changes and not force:
                return True
            changes = self._changes
            arrays = self._idx.export()
            try:
                await trio.to_thread.run_sync(
                    index_io.save, self.path / INDEX_NAME, arrays, self.fingerprint, limiter=self.limiter
                )
            except OSError as exc:
                self._persist_errors += 1
                self._persisted_at = time.monotonic()  # retry after an interval, not in a loop
                log.warning("%s: cannot write the index: %s", self.name, exc.strerror or exc)
                return False
            self._saved_changes = changes
            self._persisted_at = time.monotonic()
            return True

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

    async def audit(self) -> dict[str, Any]:
        """Measure the directory as ``du`` would and compare with the budget's count."""
        real = await trio.to_thread.run_sync(disk_usage, self.path, limiter=self.limiter)
        self._last_audit = {"real_bytes": real, "used_bytes": self.budget.used, "at": time.time()}
        return dict(self._last_audit)

    def status(self) -> dict[str, Any]:
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
            "opened": dict(self.opened),
            "audit": self._last_audit,
            **self.counters.as_dict(),
        }
