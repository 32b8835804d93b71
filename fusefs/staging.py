"""The staging window's data and everything the mount leaves in the kernel page cache.

Staged files are either pushed into the page cache (``notify_store``: later reads never reach the
daemon) or held in daemon RAM, as ``prefetch.staging`` says.  Both are charged to the memory budget
they share with the memory tier, and so is every file a reader pulled through the mount (with
``keep_cache`` its pages stay cached after close); an open that does not fit is served with
``direct_io`` so the kernel caches none of it.  Once a file has been consumed its pages are
invalidated and its charge released (NoPFS rules 2-4: a consumed sample is not needed again this
epoch), so the mount never holds more page cache than its budget.

Concurrency rules:
* ``notify_store`` and ``invalidate_inode`` run in worker threads, never on the trio thread: the
  kernel locks the target pages, and a READ of the same pages waiting for the trio thread would
  deadlock the mount (DESIGN 5).
* Bookkeeping (``files``, charges) changes only on the trio thread.  An entry is recorded before the
  await that pushes it, so a concurrent drop sees it and undoes the charge after the push returns.
"""

from __future__ import annotations

import errno
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import pyfuse3
import trio

from .attrs import inode_of

log = logging.getLogger(__name__)


class BudgetLike(Protocol):
    limit: int
    used: int

    def try_reserve(self, n: int) -> bool: ...
    def release(self, n: int) -> None: ...


@dataclass
class StagedFile:
    nbytes: int
    data: bytes | None = None  # held in RAM (memory staging, or a push the kernel refused)
    pushed: bool = False  # its pages were stored in the kernel page cache
    staged: bool = True  # False: only pages a reader pulled through the mount (keep_cache)
    taken: bool = False  # an open used it


Push = Callable[[int, int, bytes], None]
Invalidate = Callable[[int], None]


def _kernel_push(inode: int, offset: int, data: bytes) -> None:
    pyfuse3.notify_store(pyfuse3.InodeT(inode), offset, data)


def _kernel_invalidate(inode: int) -> None:
    pyfuse3.invalidate_inode(pyfuse3.InodeT(inode), attr_only=False)


class Staging:
    def __init__(self, budget: BudgetLike, limit: int, mode: str, push: Push = _kernel_push,
                 invalidate: Invalidate = _kernel_invalidate) -> None:  # fmt: skip
        self.budget = budget
        self.limit = limit  # bytes the staging window may hold (a share of the budget)
        self.mode = mode  # "page_cache" or "memory"
        self._push = push
        self._invalidate = invalidate
        self.files: dict[int, StagedFile] = {}
        self.staged_bytes = 0
        self.cached_bytes = 0  # pages pulled by readers, not yet invalidated
        self.push_failures = 0
        self.uncached_opens = 0  # opens served with direct_io because the budget was full
        self.unused = 0  # staged files dropped before any open used them (wasted fetches)
        self.pushes = 0
        self.invalidations = 0
        self.limiter = trio.CapacityLimiter(2)
        self._retire_send, self._retire_recv = trio.open_memory_channel[int](100_000)

    # ------------------------------------------------------------------ staging

    def room(self) -> int:
        return min(self.limit - self.staged_bytes, self.budget.limit - self.budget.used)

    def has(self, entry: int) -> bool:
        """Staged or reserved for staging."""
        f = self.files.get(entry)
        return f is not None and f.staged

    def reserve(self, entry: int, nbytes: int) -> bool:
        """Claim room for ``entry`` before fetching it, so a fetch is never wasted for lack of room."""
        if entry in self.files:
            return False
        if self.staged_bytes + nbytes > self.limit or not self.budget.try_reserve(nbytes):
            return False
        self.files[entry] = StagedFile(nbytes, taken=False)
        self.staged_bytes += nbytes
        return True

    def cancel(self, entry: int) -> None:
        """Give back a reservation whose fetch failed (nothing was pushed)."""
        f = self.files.get(entry)
        if f is not None and f.staged and not f.pushed and f.data is None:
            del self.files[entry]
            self.staged_bytes -= f.nbytes
            self.budget.release(f.nbytes)

    async def fill(self, entry: int, data: bytes) -> None:
        """Put the fetched bytes of a reserved entry where the next open finds them."""
        f = self.files.get(entry)
        if f is None or not f.staged or f.pushed or f.data is not None:
            return  # retired meanwhile (the reservation was released with it)
        if self.mode == "memory":
            f.data = data
            return
        try:
            await trio.to_thread.run_sync(self._push, inode_of(entry), 0, data, limiter=self.limiter)
            f.pushed = True
            self.pushes += 1
        except OSError as exc:
            # ENOENT: the kernel does not know the inode yet (no lookup so far) or forgot it: serve from RAM.
            self.push_failures += 1
            f.data = data
            if exc.errno != errno.ENOENT:
                log.warning("notify_store of entry %d failed: %s", entry, exc)
        if self.files.get(entry) is not f:  # retired while we pushed: drop the pages we just stored
            await self._invalidate_inodes([inode_of(entry)])

    def take(self, entry: int) -> StagedFile | None:
        """What staging holds for an open of ``entry`` (stays until retired)."""
        f = self.files.get(entry)
        if f is None or not f.staged or (not f.pushed and f.data is None):
            return None  # not staged, or still being fetched (the open awaits the fetch instead)
        f.taken = True
        return f

    def note_read(self, entry: int, nbytes: int) -> bool:
        """A reader is about to pull ``entry`` through the mount, leaving its pages cached.

        False when the budget has no room: the open must then bypass the page cache (direct_io),
        since a read is never refused and the budget is never exceeded.
        """
        if entry in self.files:
            return True
        if not self.budget.try_reserve(nbytes):
            self.uncached_opens += 1
            return False
        self.files[entry] = StagedFile(nbytes, staged=False)
        self.cached_bytes += nbytes
        return True

    # ------------------------------------------------------------------ retiring

    def retire(self, entry: int) -> None:
        """``entry`` was consumed: drop its pages and its charge (batched in the background)."""
        if entry in self.files:
            try:
                self._retire_send.send_nowait(entry)
            except trio.WouldBlock:
                log.warning("retire queue full; dropping entry %d synchronously later", entry)

    async def run(self) -> None:
        """Drain the retire queue in batches: one thread hop per batch, not per file."""
        async with self._retire_recv:
            async for entry in self._retire_recv:
                batch = [entry]
                while len(batch) < 256:
                    try:
                        batch.append(self._retire_recv.receive_nowait())
                    except trio.WouldBlock:
                        break
                await self._invalidate_now(batch)

    async def _invalidate_now(self, entries: list[int]) -> None:
        inodes = []
        for entry in entries:
            f = self.files.pop(entry, None)
            if f is None:
                continue
            self.budget.release(f.nbytes)
            if f.staged:
                self.staged_bytes -= f.nbytes
                self.unused += not f.taken
            else:
                self.cached_bytes -= f.nbytes
            if f.pushed or not f.staged:
                inodes.append(inode_of(entry))
        await self._invalidate_inodes(inodes)

    async def _invalidate_inodes(self, inodes: list[int]) -> None:
        if inodes:
            self.invalidations += await trio.to_thread.run_sync(self._invalidate_all, inodes, limiter=self.limiter)

    def _invalidate_all(self, inodes: list[int]) -> int:
        done = 0
        for inode in inodes:
            try:
                self._invalidate(inode)
                done += 1
            except OSError:
                pass  # the kernel already forgot it: nothing cached
        return done

    async def clear(self) -> None:
        """Drop everything staged (a new plan makes the old window meaningless)."""
        await self._invalidate_now([e for e, f in self.files.items() if f.staged])

    def status(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "limit_bytes": self.limit,
            "staged_bytes": self.staged_bytes,
            "staged_files": sum(1 for f in self.files.values() if f.staged),
            "page_cache_bytes": self.cached_bytes + sum(f.nbytes for f in self.files.values() if f.pushed),
            "pushes": self.pushes,
            "push_failures": self.push_failures,
            "invalidations": self.invalidations,
            "uncached_opens": self.uncached_opens,
            "unused": self.unused,
        }
