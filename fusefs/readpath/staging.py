"""The kernel side of staging: pushing a staged file's pages into the page cache and dropping them.

Staged files are either pushed into the page cache (``notify_store``: later reads never reach the
daemon) or held in daemon RAM, as ``prefetch.staging`` says.  Both are charged to the memory budget
they share with the memory tier, and so is every file a reader pulled through the mount (with
``keep_cache`` its pages stay cached after close).  An open that does not fit is served with
``direct_io`` so the kernel caches none of it.

A consumed file's pages are *kept* while the budget has room: with a budget that holds the dataset,
later epochs never reach the daemon for data at all.  When anything else needs the room (the
staging window, a tier, a reader), the budget reclaims kept pages and they are dropped from the
page cache (``invalidate_inode``).  So the mount never holds more page cache than its budget, and
holds as much as the budget allows.  Which files are staged, kept, retired or reclaimed is decided
by :mod:`fusefs.readpath.policy` (its ``pages`` and ``kept``); this module carries out the kernel
calls.

Concurrency rules:
* ``notify_store`` and ``invalidate_inode`` run in worker threads, never on the trio thread: the
  kernel locks the target pages, and a READ of the same pages waiting for the trio thread would
  deadlock the mount.
* The policy records an entry as being pushed before the push starts, so a drop decided while the
  push is in flight is seen when it ends (the policy then drops the pages just stored).
* An open can arrive while its file is still being fetched or pushed.  It then reads the bytes
  through the mount (keep_cache puts them in the page cache) and the policy marks the entry taken;
  its release keeps the pages, and a push that finishes after that release must not undo them:
  they are the same bytes, now charged as kept.  Before this rule a third of epoch 0's files lost
  their pages here and epoch 1 read them again through FUSE.
* A reclaimed charge is released at once and its invalidation queued; the pages disappear a few
  milliseconds later, so the page cache can briefly exceed the budget by one batch.
* Pages are read back (for a peer, or to fill a tier) through the mount itself, in a worker thread:
  the kernel sends that thread's OPEN to this daemon like any other, tagged with the thread's id,
  which :meth:`Staging.reads_back` recognises so the open is not a reader's (no cursor, no counters,
  ``keep_cache``), and a READ on such a handle (a page the kernel no longer holds) fails at once
  rather than fetching.  The trio thread never waits for such a read, so it cannot deadlock the
  mount; pages dropped meanwhile make the read fail, and the caller reads elsewhere.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
import threading
from collections.abc import Callable
from typing import Annotated, Protocol

import trio

from fusefs.meta.ids import entry_of, inode_of
from fusefs.readpath.contract import Event, SourceChanged
from fusefs.readpath.policy import Pages, ReadPolicy, WindowStatus
from placement.statusfields import counter

log = logging.getLogger(__name__)


class StagingStatus(WindowStatus):
    """Status field ``prefetch.staging``: the staging window and the kernel calls that carry it out."""

    pushes: Annotated[int, counter("files pushed into the page cache (notify_store)")]
    push_failures: Annotated[
        int,
        counter(
            "pushes the kernel refused even after a lookup of the file through the mount (ENOENT: it does "
            "not know the inode); served from RAM"
        ),
    ]
    introduced: Annotated[
        int,
        counter(
            "pushes of files the kernel had not looked up yet (the loader had not listed their directory): "
            "looked up through the mount first, then stored"
        ),
    ]
    invalidations: Annotated[int, counter("files whose pages were dropped from the page cache")]
    read_backs: Annotated[
        int, counter("files read back from the page cache through the mount, for a peer or to fill a tier")
    ]
    read_back_misses: Annotated[
        int, counter("reads back that found a page missing (the kernel dropped it): served from elsewhere")
    ]


class Kernel(Protocol):
    """The page-cache calls staging makes (blocking: called from worker threads only)."""

    readers: set[int]  # native ids of the threads reading pages back now

    def notify_store(self, inode: int, offset: int, data: bytes) -> None: ...
    def invalidate_inode(self, inode: int) -> None: ...
    def read_pages(self, inode: int, size: int) -> bytes | None: ...
    def introduce(self, inode: int) -> bool: ...
    def set_pages(self, inode: int, pushed: bool) -> None:
        """Whether ``inode``'s pages are known cached, so a front may answer its opens without the
        daemon (:mod:`fusefs.fuse.native_front`); from the trio thread, never blocks."""


class ThroughMount:
    """The half of a :class:`Kernel` every FUSE front shares: pages are read back, and inodes made
    known, through the mountpoint itself.  A front (:mod:`fusefs.fuse.pyfuse3_front`) adds the
    binding's ``notify_store`` and ``invalidate_inode``."""

    def __init__(self, path_of: Callable[[int], bytes] | None = None) -> None:
        self.path_of = path_of  # entry -> path relative to the mountpoint
        self.mountpoint: bytes | None = None  # set once mounted (with device): no reads back before
        self.device: int | None = None  # st_dev of this mount: what every read back must be on
        self.readers: set[int] = set()

    def set_pages(self, inode: int, pushed: bool) -> None:
        """A front that answers every open through the daemon ignores the pages table."""

    def mounted(self, device: int, mountpoint: bytes) -> None:
        """The mount is up on ``mountpoint`` (its st_dev ``device``): pages can be read back from now on."""
        self.device = device
        self.mountpoint = mountpoint

    def introduce(self, inode: int) -> bool:
        """Make the kernel know ``inode`` (a lookup of its path through the mount, answered by this
        daemon like any other); whether it now does.  The kernel refuses pages for an inode it has
        not looked up, and a job that writes its seed before its loader lists the dataset (a Slurm
        recipe) had every staged file refused.  The path is checked as :meth:`read_pages` checks it."""
        if self.mountpoint is None or self.path_of is None or self.device is None:
            return False
        try:
            st = os.lstat(os.path.join(self.mountpoint, self.path_of(entry_of(inode))))
        except OSError:
            return False
        return st.st_dev == self.device and st.st_ino == inode

    def read_pages(self, inode: int, size: int) -> bytes | None:
        """The file's ``size`` bytes from the page cache, or None (not mounted, or a page is missing).

        The path is the mountpoint's, and a mount detached meanwhile (``umount -l``) would resolve it
        in the directory underneath: what is opened is read only when it is this mount's inode
        (device and inode number checked on the open file), and opened so that neither a FIFO nor
        a symlink there could block or redirect it.  No descriptor of the mount is kept between
        reads: one would keep a plain unmount busy."""
        if self.mountpoint is None or self.path_of is None or self.device is None:
            return None
        path = os.path.join(self.mountpoint, self.path_of(entry_of(inode)))
        tid = threading.get_native_id()
        self.readers.add(tid)  # before the open: the daemon looks it up when the OPEN arrives
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOFOLLOW)
            try:
                st = os.fstat(fd)
                if st.st_dev != self.device or st.st_ino != inode or not stat.S_ISREG(st.st_mode):
                    return None
                buf = bytearray(size)
                view, got = memoryview(buf), 0
                while got < size:
                    n = os.preadv(fd, [view[got:]], got)
                    if n <= 0:
                        return None  # shorter than the snapshot says: not ours to serve
                    got += n
                return bytes(buf)
            finally:
                os.close(fd)
        except OSError:
            return None  # a page was no longer cached (its READ was refused), or the mount is going
        finally:
            self.readers.discard(tid)


class Staging:
    def __init__(self, policy: ReadPolicy, kernel: Kernel, report: Callable[[Event], None]) -> None:
        """``report``: where staging reports what the policy must learn (:meth:`forget`: a source
        changed), the policy's port (``PolicyPort.report``, fusefs/readpath/port.py): the executor
        feeds the policy and carries out what it decides, so staging never calls its handle itself."""
        self.policy = policy
        self.kernel = kernel
        self.read_backs = 0
        self.read_back_misses = 0
        self.introduced = 0
        self._read_limiter = trio.CapacityLimiter(4)
        self.mode = policy.settings.staging_mode  # "page_cache" or "memory"
        self.limit = policy.staging_limit  # bytes the staging window may hold (a share of the budget)
        self.push_failures = 0
        self.pushes = 0
        self.invalidations = 0
        self.drops_queued = 0
        self.limiter = trio.CapacityLimiter(2)
        self._drop_send, self._drop_recv = trio.open_memory_channel[int](1_000_000)
        self.report = report

    @property
    def files(self) -> dict[int, Pages]:
        """Staged files and files readers have open (the policy's record; ``.data``: bytes held in RAM)."""
        return self.policy.pages

    @property
    def kept(self) -> dict[int, int]:
        """Consumed files whose pages stay cached -> their charge, oldest first."""
        return self.policy.kept

    async def push(self, entry: int, data: bytes) -> bool:
        """Store ``data`` as ``entry``'s pages; False when the kernel refused (serve them from RAM)."""
        try:
            await trio.to_thread.run_sync(self._store, inode_of(entry), data, limiter=self.limiter)
        except OSError as exc:
            # ENOENT: the kernel does not know the inode yet (no lookup so far) or forgot it.
            self.push_failures += 1
            if exc.errno != errno.ENOENT:
                log.warning("notify_store of entry %d failed: %s", entry, exc)
            return False
        self.pushes += 1
        self.kernel.set_pages(inode_of(entry), True)
        return True

    def reads_back(self, pid: int) -> bool:
        """Whether an open comes from :meth:`read_back` (the requesting thread is one of ours)."""
        return pid in self.kernel.readers

    async def read_back(self, entry: int) -> bytes | None:
        """``entry``'s bytes from its pages in the page cache (kept after a read, or pushed), or None
        when the policy knows of none or the kernel dropped some: a peer or a tier fill is then
        served from elsewhere.  Pages are the same bytes readers are served, checked when fetched."""
        if not self.policy.in_page_cache(entry):
            return None
        size = int(self.policy.sizes[entry])
        data = await trio.to_thread.run_sync(self.kernel.read_pages, inode_of(entry), size, limiter=self._read_limiter)
        if data is None:
            self.read_back_misses += 1
        else:
            self.read_backs += 1
        return data

    def _store(self, inode: int, data: bytes) -> None:
        """notify_store; an inode the kernel does not know yet is looked up first, then stored again."""
        try:
            self.kernel.notify_store(inode, 0, data)
        except OSError as exc:
            if exc.errno != errno.ENOENT or not self.kernel.introduce(inode):
                raise
            self.introduced += 1
            self.kernel.notify_store(inode, 0, data)

    def drop_pages(self, entry: int) -> None:
        """Queue the invalidation of ``entry``'s pages (carried out in batches by :meth:`run`); its
        opens reach the daemon again from now on, before the pages go."""
        self.kernel.set_pages(inode_of(entry), False)
        try:
            self._drop_send.send_nowait(inode_of(entry))
            self.drops_queued += 1
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
                self.kernel.invalidate_inode(inode)
                done += 1
            except OSError:
                pass  # the kernel already forgot it: nothing cached
        return done

    def forget(self, entry: int) -> None:
        """The source of ``entry`` changed: drop every copy of it here and its pages in the kernel.

        Reported to the executor as :class:`SourceChanged`: the policy drops its record of the file
        (staged, open, kept) and always asks for the invalidation, which comes back here through
        :meth:`drop_pages`: pages a reader pulled with direct_io off may be cached unrecorded, and an
        inode the kernel does not know costs nothing.  Its opens reach the daemon again at once
        (the front's pages table, ``Kernel.set_pages``), which fails them with EIO."""
        self.kernel.set_pages(inode_of(entry), False)
        self.report(SourceChanged(entry))

    def serves(self, entry: int) -> bool:
        """Whether this node's pages have ``entry`` in hand: kept pages, or a file the window staged
        or is staging, or one a reader has open.  Its next open then uses those pages (or, for a
        stage in flight or an open file, whatever that fetch or open checked), not a tier copy."""
        policy = self.policy
        return entry in policy.kept or entry in policy.pages

    def pages_kept(self, entry: int, cached: bool | None = None) -> None:
        """A reader released ``entry`` (opened without direct_io): when the policy keeps its pages,
        later opens may be answered by the front itself.  ``cached``: the policy's
        ``in_page_cache(entry)`` when the caller asked it already, right after the release."""
        if cached if cached is not None else self.policy.in_page_cache(entry):
            self.kernel.set_pages(inode_of(entry), True)

    def cached_entries(self) -> list[int]:
        """Entries whose bytes this node holds here (staged, or pages in the page cache)."""
        return self.policy.held_entries()

    def status(self) -> StagingStatus:
        return {
            **self.policy.staging_status(),
            "pushes": self.pushes,
            "push_failures": self.push_failures,
            "introduced": self.introduced,
            "invalidations": self.invalidations,
            "read_backs": self.read_backs,
            "read_back_misses": self.read_back_misses,
        }
