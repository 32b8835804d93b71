"""The staging window's data and everything the mount leaves in the kernel page cache.

Staged files are either pushed into the page cache (``notify_store``: later reads never reach the
daemon) or held in daemon RAM, as ``prefetch.staging`` says.  Both are charged to the memory budget
they share with the memory tier, and so is every file a reader pulled through the mount (with
``keep_cache`` its pages stay cached after close).  An open that does not fit is served with
``direct_io`` so the kernel caches none of it.

A consumed file's pages are *kept* while the budget has room: with a budget that holds the dataset,
later epochs never reach the daemon for data at all.  When anything else needs the room (the
staging window, a tier, a reader), the budget reclaims kept pages oldest first: they are dropped
from the page cache (``invalidate_inode``) and their charge released.  So the mount never holds
more page cache than its budget, and holds as much as the budget allows.

Concurrency rules:
* ``notify_store`` and ``invalidate_inode`` run in worker threads, never on the trio thread: the
  kernel locks the target pages, and a READ of the same pages waiting for the trio thread would
  deadlock the mount (DESIGN 5).
* Bookkeeping (``files``, ``kept``, charges) changes only on the trio thread.  An entry is recorded
  before the await that pushes it, so a concurrent drop sees it and undoes the push afterwards.
* An open can arrive while its file is still being fetched or pushed.  It then reads the bytes
  through the mount (keep_cache puts them in the page cache) and marks the entry taken; its release
  keeps the pages, and a push that finishes after that release must not undo them: they are the
  same bytes, now charged as kept.  Before this rule a third of epoch 0's files lost their pages
  here and epoch 1 read them again through FUSE.
* A reclaimed charge is released at once and its invalidation queued; the pages disappear a few
  milliseconds later, so the page cache can briefly exceed the budget by one batch.
"""

from __future__ import annotations

import errno
import logging
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import pyfuse3
import trio

from fusefs.meta.ids import inode_of

log = logging.getLogger(__name__)


class BudgetLike(Protocol):
    limit: int
    used: int
    reclaim: Callable[[int], int] | None

    def try_reserve(self, n: int) -> bool: ...
    def release(self, n: int) -> None: ...


@dataclass
class StagedFile:
    nbytes: int
    data: bytes | None = None  # held in RAM (memory staging, or a push the kernel refused)
    pushed: bool = False  # its pages are in the kernel page cache (pushed, or kept from earlier reads)
    staged: bool = True  # False: pages a reader pulls through the mount (keep_cache), not the window's
    taken: bool = False  # an open used it


Push = Callable[[int, int, bytes], None]
Invalidate = Callable[[int], None]


def _kernel_push(inode: int, offset: int, data: bytes) -> None:
    pyfuse3.notify_store(pyfuse3.InodeT(inode), offset, data)


def _kernel_invalidate(inode: int) -> None:
    pyfuse3.invalidate_inode(pyfuse3.InodeT(inode), attr_only=False)


class Staging:
    def __init__(
        self,
        budget: BudgetLike,
        limit: int,
        mode: str,
        push: Push = _kernel_push,
        invalidate: Invalidate = _kernel_invalidate,
    ) -> None:
        self.budget = budget
        self.limit = limit  # bytes the staging window may hold (a share of the budget)
        self.mode = mode  # "page_cache" or "memory"
        self._push = push
        self._invalidate = invalidate
        self.files: dict[int, StagedFile] = {}  # staged (the window) or open by readers
        self.kept: OrderedDict[int, int] = OrderedDict()  # consumed, pages still cached -> charge; oldest first
        self.staged_bytes = 0
        self.cached_bytes = 0  # pages of files readers have open, pulled through the mount
        self.kept_bytes = 0
        self.push_failures = 0
        self.uncached_opens = 0  # opens served with direct_io because the budget was full
        self.unused = 0  # staged files dropped before any open used them (wasted fetches)
        self.pushes = 0
        self.invalidations = 0
        self.reused = 0  # opens served by pages kept from an earlier read
        self.limiter = trio.CapacityLimiter(2)
        self._drop_send, self._drop_recv = trio.open_memory_channel[int](1_000_000)
        self.protect: Callable[[], frozenset[int]] = frozenset  # entries due soon: reclaimed last
        budget.reclaim = self.reclaim

    # ------------------------------------------------------------------ staging

    def room(self) -> int:
        return min(self.limit - self.staged_bytes, self.budget.limit - self.budget.used)

    def has(self, entry: int) -> bool:
        """Staged or reserved for staging."""
        f = self.files.get(entry)
        return f is not None and f.staged

    def reserve(self, entry: int, nbytes: int) -> bool:
        """Claim room for ``entry`` before fetching it, so a fetch is never wasted for lack of room."""
        if entry in self.files or entry in self.kept:
            return False
        if self.staged_bytes + nbytes > self.limit or not self.budget.try_reserve(nbytes):
            return False
        self.files[entry] = StagedFile(nbytes)
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
        if f.taken:
            return  # a reader opened it before its bytes came: its reads put the pages in the cache
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
        current = self.files.get(entry)
        if current is not f and not (f.taken and (current is not None or entry in self.kept)):
            # Dropped while we pushed: drop the pages we just stored.  Not when a reader took it
            # meanwhile: it read the same bytes through the mount, and its release kept them.
            self._drop_pages(entry)

    def take(self, entry: int) -> StagedFile | None:
        """What an open of ``entry`` can use: staged data, or pages kept from an earlier read."""
        f = self.files.get(entry)
        if f is not None:
            if f.staged and not f.pushed and f.data is None:
                # Still being fetched or pushed: the open gets the bytes elsewhere and its reads fill
                # the page cache, so the file counts as taken (kept at release, never dropped).
                f.taken = True
                return None
            if not f.staged:
                return None  # open by another reader, who pulls its pages through the mount
            f.taken = True
            return f
        charge = self.kept.pop(entry, None)
        if charge is None:
            return None
        self.kept_bytes -= charge
        self.cached_bytes += charge
        self.reused += 1
        f = StagedFile(charge, pushed=True, staged=False, taken=True)
        self.files[entry] = f
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
        """``entry`` was consumed: keep its pages while the budget allows, free its RAM copy."""
        f = self.files.pop(entry, None)
        if f is None:
            return
        if f.staged:
            self.staged_bytes -= f.nbytes
            self.unused += not f.taken
        else:
            self.cached_bytes -= f.nbytes
        f.data = None
        if f.pushed or f.taken or not f.staged:  # its pages are in the page cache
            self.kept[entry] = f.nbytes
            self.kept_bytes += f.nbytes
        else:  # staged in RAM and never opened: nothing cached, nothing to keep
            self.budget.release(f.nbytes)

    def reclaim(self, need: int) -> int:
        """Budget callback: drop kept pages until ``need`` bytes are free.

        Oldest first, but pages the plan says are due soon (``protect``: the predicted horizon) go
        last (NoPFS rule 2: evict what is needed furthest ahead); without a plan it is plain FIFO.
        """
        protected = self.protect()
        freed = self._reclaim(need, protected)
        if freed < need and protected:
            freed += self._reclaim(need - freed, frozenset())
        return freed

    def _reclaim(self, need: int, protected: frozenset[int]) -> int:
        freed = 0
        for entry in list(self.kept):
            if freed >= need:
                break
            if entry in protected:
                continue
            charge = self.kept.pop(entry)
            self.kept_bytes -= charge
            self.budget.release(charge)
            freed += charge
            self._drop_pages(entry)
        return freed

    def _drop_pages(self, entry: int) -> None:
        try:
            self._drop_send.send_nowait(inode_of(entry))
        except trio.WouldBlock:
            log.warning("invalidation queue full; pages of entry %d stay until evicted", entry)

    async def run(self) -> None:
        """Drain the invalidation queue in batches: one thread hop per batch, not per file."""
        async with self._drop_recv:
            async for inode in self._drop_recv:
                batch = [inode]
                while len(batch) < 256:
                    try:
                        batch.append(self._drop_recv.receive_nowait())
                    except trio.WouldBlock:
                        break
                self.invalidations += await trio.to_thread.run_sync(self._invalidate_all, batch, limiter=self.limiter)

    def _invalidate_all(self, inodes: list[int]) -> int:
        done = 0
        for inode in inodes:
            try:
                self._invalidate(inode)
                done += 1
            except OSError:
                pass  # the kernel already forgot it: nothing cached
        return done

    def forget(self, entry: int) -> None:
        """The source of ``entry`` changed: drop every copy of it here and its pages in the kernel.

        The invalidation is queued even when nothing is recorded: pages a reader pulled with
        direct_io off may still be cached, and an inode the kernel does not know costs nothing."""
        f = self.files.pop(entry, None)
        if f is not None:
            if f.staged:
                self.staged_bytes -= f.nbytes
            else:
                self.cached_bytes -= f.nbytes
            f.data = None
            self.budget.release(f.nbytes)
        charge = self.kept.pop(entry, None)
        if charge is not None:
            self.kept_bytes -= charge
            self.budget.release(charge)
        self._drop_pages(entry)

    def cached_entries(self) -> list[int]:
        """Entries whose bytes this node holds here (staged, or pages in the page cache)."""
        return [*self.kept, *(e for e, f in self.files.items() if f.pushed or f.data is not None)]

    async def clear(self) -> None:
        """Drop the staging window (a new or failed plan makes it meaningless); kept pages stay valid."""
        for entry in [e for e, f in self.files.items() if f.staged and not f.taken]:
            f = self.files.pop(entry)
            self.staged_bytes -= f.nbytes
            self.unused += 1
            self.budget.release(f.nbytes)
            if f.pushed:
                self._drop_pages(entry)

    def status(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "limit_bytes": self.limit,
            "staged_bytes": self.staged_bytes,
            "staged_files": sum(1 for f in self.files.values() if f.staged),
            "page_cache_bytes": self.cached_bytes
            + self.kept_bytes
            + sum(f.nbytes for f in self.files.values() if f.staged and f.pushed),
            "kept_files": len(self.kept),
            "kept_bytes": self.kept_bytes,
            "reused": self.reused,
            "pushes": self.pushes,
            "push_failures": self.push_failures,
            "invalidations": self.invalidations,
            "uncached_opens": self.uncached_opens,
            "unused": self.unused,
        }
