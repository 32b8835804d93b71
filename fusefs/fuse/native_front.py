"""The native front: libfuse3's low-level session run by native threads, Python only where needed.

The C extension :mod:`fusefs.fuse._native` (the only importer is this module,
``tests/test_layering.py``) creates and mounts the session and runs it in its own receive threads,
outside the GIL.  It answers natively what needs no daemon state: FLUSH and FSYNC (ENOSYS, so the
kernel stops sending them), IOCTL (ENOTTY: CPython asks ``isatty`` of every file it opens), FORGET,
and OPEN/RELEASE of a file whose pages are known pushed (:meth:`NativeFront.set_pages`).  Every
other request is forwarded: its record goes into one ordered ring, an eventfd wakes the trio task
:meth:`NativeFront.run`, which drains the ring in batches and starts one trio task per request
calling the same :class:`~fusefs.fuse.operations.SeerOperations` handler the pyfuse3 front calls,
then answers with the extension's reply functions.

``no_open`` mode (``fuse.no_open``, root only): once the session serves, :meth:`NativeFront.run`
has the extension mark the mount with fanotify and answer every OPEN with ENOSYS, after which the
kernel sends no OPEN or RELEASE on the connection at all (``fs/fuse/file.c``: fh 0, pages kept
across opens).  A warm open then costs no request; the fanotify thread (C, ``_native.c``) feeds
each open and close, with its pid, into the same ring as the same events (fh 0, paired by inode),
and a READ arrives with fh 0 and is served by inode (``SeerOperations.read_inode``).

An OPEN or RELEASE answered natively is also a record in the same ring (an *event*), handled
inline by the drain loop in ring order, before any later record starts: the handle is registered
with the daemon's bookkeeping (``SeerOperations.book_native``, the same counters, prefetcher and
cursor as a Python open of a pushed file) before a READ on it (pages dropped since) can run.  The
extension hands each run of consecutive events over as one record (a flat list of ints), booked
in one call: warm opens are nothing but events, and a tuple and a call per event cost more than
the booking itself.  Within such a run the extension folds an open and its release into one
*visit* when no other event on the same file lies between them (``fold()`` in ``_native.c``;
status ``front.visits``), booked as one step (``ReadPolicy.readers``).  The release so moves earlier,
past events of other files only; booking those never reads the moved file's state (an open or
release of a file touches that file's pages, kept charge and handle, and sums the run only adds
to), so each file's steps and every counter come out as before.  Two things are not the same: where
the file lands in the order of kept pages (reclaimed oldest first) among files released in the
same run, a few milliseconds apart; and a moved release's CancelStage (a file still being staged)
is carried out before, not after, what later opens of the run decided (StageSlots), which are
independent of it.

Concurrency rules (also CONCURRENCY.md; the C side's are at the top of ``_native.c``):
* Only the trio thread drains the ring and replies to forwarded requests; each request is
  answered exactly once, by the task that runs it (in a ``finally``: a cancelled or failed task
  answers EINTR/EIO).  After :meth:`run` returns nothing replies, and :meth:`unmount` answers
  what was left in the ring.
* The kernel calls (``notify_store``, ``invalidate_inode``, ``invalidate_entry``) block and run in
  worker threads only, with the GIL released, as staging requires of every front.
* :meth:`terminate` may be called from any thread (signals, ``seerfs umount``): it stops the
  receive threads, whose last one puts END in the ring; :meth:`run` returns when it drains END
  after the requests before it, and also when the kernel ends the session (an unmount).
* ``no_open``: :meth:`_watch` runs once, in a worker thread, after INIT; until it armed the mode the
  front serves opens as requests (an open in between is booked as a request and, if the mark saw
  it, as an event too: never missed).  The fanotify thread lives until :meth:`unmount`, which joins
  it after the receive threads; its events enter the ring in the order the kernel queued them, and
  a READ with fh 0 moves the queue into the ring before itself (the reader's open first).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, cast

import trio

from fusefs.errors import FsError
from fusefs.fuse import _native
from fusefs.fuse.attrs import BLKSIZE
from fusefs.fuse.front import Context, EntryAttributes, FrontStatus, NewFileInfo, PlainAttributes, PlainFileInfo
from fusefs.fuse.operations import SeerOperations
from fusefs.readpath.staging import ThroughMount

if TYPE_CHECKING:
    from fusefs.fuse._native import Record

log = logging.getLogger(__name__)

_BATCH = 1024  # records per drain at most (the extension's DRAIN_MAX)
EVENT_DELAY = 0.008
"""Seconds trio waits, after a drain that found records, before draining again without a wake: open
and release events do not wake it while it is busy (``_native.c``, the ring), so a burst of cached
opens costs one wake per this interval, not one per open; they are booked at most this late.  4 ms
rather than 1: about 60 records per drain instead of 30 at 11k opens/s, and 8 us less daemon CPU per
warm open; 8 ms rather than 4 (with drains of up to 1,024 records, :data:`_BATCH`): about 1 us less
on the trio thread per warm open at 20k opens/s, each drain's own cost spread over twice the opens
(ARCHITECTURE.md, section 7); still inside the cursor loop's 10-30 ms turn."""


class _Fields:
    """A setattr's ``fields`` (:class:`fusefs.fuse.front.SetattrFields`) from libfuse's ``to_set``."""

    __slots__ = ("update_gid", "update_mode", "update_size", "update_uid")

    def __init__(self, to_set: int) -> None:
        self.update_size = bool(to_set & _native.FUSE_SET_ATTR_SIZE)
        self.update_mode = bool(to_set & _native.FUSE_SET_ATTR_MODE)
        self.update_uid = bool(to_set & _native.FUSE_SET_ATTR_UID)
        self.update_gid = bool(to_set & _native.FUSE_SET_ATTR_GID)


class NativeFront(ThroughMount):
    """The :class:`~fusefs.fuse.front.Front` through :mod:`fusefs.fuse._native`: one per process
    (the extension holds one session).  ``inodes``: the highest inode + 1 whose opens may be
    answered natively (the pages table's size; 0 turns native opens off); ``ring``: records the
    ring holds (a full ring forwards native opens and makes requests wait, never drops one)."""

    def __init__(
        self,
        path_of: Callable[[int], bytes] | None = None,
        inodes: int = 0,
        ring: int = 4096,
        no_open: bool = False,
        watch_dirs: Callable[[], list[bytes]] | None = None,
    ) -> None:
        super().__init__(path_of)
        self.watch_dirs = watch_dirs  # no_open: the directories holding files (relative paths) to mark
        self.no_open = no_open  # asked for: armed by _watch once serving (status front.open_mode says if it was)
        self._mountpoint = ""
        self.new_attrs = cast(Callable[[], EntryAttributes], _native.EntryAttributes)
        self.new_file_info: NewFileInfo = PlainFileInfo
        self.default_options: frozenset[str] = frozenset({"default_permissions"})  # as pyfuse3's
        self.inodes = inodes
        self.ring = ring
        self.ops: Any = None
        self._wake_fd = -1
        self._limit = 0
        self._running = 0
        self._room = trio.Event()
        self._ended = False
        self._dispatch: dict[int, Callable[[Record], Any]] = {}
        self._inline: frozenset[int] = frozenset()

    # ------------------------------------------------------------------ Front

    def mount(self, ops: SeerOperations, mountpoint: str, options: Iterable[str]) -> None:
        self.ops = ops
        self._mountpoint = mountpoint
        self._wake_fd = _native.mount(mountpoint, ",".join(sorted(options)), self.inodes, self.ring, self.no_open)
        # GETATTR of snapshot entries from the snapshot's own arrays, in C: the kernel asks again
        # after every READ answered from the daemon (it marks atime stale, and the fstat() CPython's
        # open() makes wants it), i.e. once per file read cold, on its next open.
        # Handlers whose attributes are not a snapshot's (tests/kernel_contract.py) answer it themselves.
        columns = getattr(ops.attrs, "columns", None)
        try:
            if columns is not None:
                _native.set_attrs(columns(), BLKSIZE, ops.attrs.attr_timeout)
        except (ValueError, BufferError) as exc:  # arrays C cannot read: answered in Python, as before
            log.info("fuse.front native: GETATTR answered by the daemon (%s)", exc)
        self._dispatch = {
            _native.OP_LOOKUP: self._lookup,
            _native.OP_GETATTR: self._getattr,
            _native.OP_SETATTR: self._setattr,
            _native.OP_READLINK: self._readlink,
            _native.OP_OPEN: self._open,
            _native.OP_READ: self._read,
            _native.OP_WRITE: self._write,
            _native.OP_RELEASE: self._release,
            _native.OP_OPENDIR: self._opendir,
            _native.OP_READDIR: self._readdir,
            _native.OP_READDIRPLUS: self._readdir,
            _native.OP_RELEASEDIR: self._releasedir,
            _native.OP_STATFS: self._statfs,
            _native.OP_GETXATTR: self._getxattr,
            _native.OP_LISTXATTR: self._listxattr,
            _native.OP_MKNOD: self._entry_of("mknod", lambda r: (r[2], r[10], r[3], r[4])),
            _native.OP_MKDIR: self._entry_of("mkdir", lambda r: (r[2], r[10], r[3])),
            _native.OP_SYMLINK: self._entry_of("symlink", lambda r: (r[2], r[10], r[11])),
            _native.OP_LINK: self._entry_of("link", lambda r: (r[2], r[3], r[10])),
            _native.OP_UNLINK: self._done_of("unlink", lambda r: (r[2], r[10])),
            _native.OP_RMDIR: self._done_of("rmdir", lambda r: (r[2], r[10])),
            _native.OP_RENAME: self._done_of("rename", lambda r: (r[2], r[10], r[3], r[11], r[4])),
            _native.OP_SETXATTR: self._done_of("setxattr", lambda r: (r[2], r[10], r[11])),
            _native.OP_REMOVEXATTR: self._done_of("removexattr", lambda r: (r[2], r[10])),
            _native.OP_CREATE: self._create,
        }
        # Served inline by the drain loop, in ring order: their handlers answer from the snapshot's
        # arrays or the handle table and never wait on anything, so running them as tasks would only
        # let trio reorder them (a RELEASE answered after the status read that followed it).  OPEN,
        # READ, WRITE and STATFS may wait (a fetch, a thread): they run as tasks.
        self._inline = frozenset(
            {
                _native.OP_LOOKUP,
                _native.OP_GETATTR,
                _native.OP_READLINK,
                _native.OP_RELEASE,
                _native.OP_OPENDIR,
                _native.OP_READDIR,
                _native.OP_READDIRPLUS,
                _native.OP_RELEASEDIR,
                _native.OP_GETXATTR,
                _native.OP_LISTXATTR,
            }
        )

    async def run(self, max_tasks: int) -> None:
        """Drain the ring until END: events and the requests whose handlers never wait inline, in
        ring order; each other forwarded request as a task (at most ``max_tasks`` at once: the drain
        waits for room, so the order of starts is kept)."""
        _native.start()
        self._limit = max(1, max_tasks)
        dispatch = self._dispatch
        ev_batch = _native.EV_BATCH
        async with trio.open_nursery() as nursery:
            while not self._ended:
                batch = _native.drain(_BATCH)
                if not batch:
                    await trio.lowlevel.wait_readable(self._wake_fd)
                    continue
                for rec in batch:
                    op = rec[0]
                    if op == ev_batch:
                        self.ops.book_native(cast("list[int]", rec[2]))  # a run of events, in one call
                    elif op == _native.OP_INIT:
                        self.ops.init()
                        if self.no_open:
                            nursery.start_soon(self._watch)
                    elif op == _native.OP_END:
                        self._ended = True
                    else:
                        handler = dispatch.get(op)
                        if handler is None:
                            _native.reply_err(rec[1], errno.ENOSYS)
                            continue
                        if op in self._inline:
                            self._running += 1
                            await self._serve(handler, rec)  # in ring order, before any later record
                            continue
                        while self._running >= self._limit:
                            self._room = trio.Event()
                            await self._room.wait()
                        self._running += 1
                        nursery.start_soon(self._serve, handler, rec)
                if self._ended:
                    break  # END was the last record: nothing comes after it
                if len(batch) < _BATCH:
                    # Events pushed from now on wake nobody (trio is not idle): come back for them
                    # after EVENT_DELAY, or at once for a request.  (A timerfd polled with the
                    # eventfd instead of this timeout cost less CPU; it was withdrawn over a
                    # Lightning test's lost staging, whose cause was later found in the cursor:
                    # ARCHITECTURE.md, section 7.)
                    with trio.move_on_after(EVENT_DELAY):
                        await trio.lowlevel.wait_readable(self._wake_fd)
                else:
                    await trio.lowlevel.checkpoint()  # a ring never empty must not starve the other tasks
            nursery.cancel_scope.cancel()  # requests still running are answered EINTR

    async def _watch(self) -> None:
        """Arm ``no_open``: the fanotify mark on the mount, then OPEN answered ENOSYS (a worker
        thread: the mark's permission check may ask this daemon for the root's attributes).  Where
        fanotify refuses (no CAP_SYS_ADMIN, a kernel without it), opens stay requests."""
        # Control files first: served by inode (their attributes now carry the document's size), and
        # what the kernel cached of them before forgotten, so no read after the arming finds size 0.
        for inode in self.ops.opens_unseen():
            with contextlib.suppress(OSError):  # ENOENT: the kernel never looked it up
                await trio.to_thread.run_sync(_native.invalidate_inode, inode)
        dirs = self.watch_dirs() if self.watch_dirs is not None else []
        try:
            fid = await trio.to_thread.run_sync(_native.watch, self._mountpoint, dirs)
        except OSError as exc:
            log.warning("fuse.no_open: fanotify refused (%s): opens are served as requests", exc.strerror or exc)
            return
        how = f"file handles, {len(dirs)} directories marked" if fid else "an fd per event, the mount marked"
        log.info("fuse.no_open: no OPEN or RELEASE requests; opens seen through fanotify (%s)", how)

    def terminate(self) -> None:
        _native.stop()

    def unmount(self) -> None:
        _native.unmount()
        self._wake_fd = -1

    def notify_store(self, inode: int, offset: int, data: bytes) -> None:
        _native.notify_store(inode, offset, data)

    def invalidate_inode(self, inode: int) -> None:
        _native.invalidate_inode(inode)  # also clears its mark in the pages table, before the pages go

    def invalidate_entry(self, parent: int, name: bytes) -> None:
        _native.invalidate_entry(parent, name)

    # ------------------------------------------------------------------ the pages table

    def set_pages(self, inode: int, pushed: bool) -> None:
        """Mark ``inode``'s pages as pushed (its opens are then answered natively) or not."""
        _native.set_pages(inode, pushed)

    def status(self) -> FrontStatus:
        """What the extension answered natively and forwarded, since it was loaded."""
        stats = _native.stats()
        armed = stats.pop("no_open")  # 0: not armed; 1: an fd per event; 2: file handles
        mode = "no_open" if armed else "requests"
        seen = ("off", "fd", "fid")[armed]
        return cast(FrontStatus, {"name": "native", "open_mode": mode, "fanotify": seen, **stats})

    # ------------------------------------------------------------------ serving

    async def _serve(self, handler: Callable[[Record], Any], rec: Record) -> None:
        """Run one forwarded request; whatever happens, it is answered exactly once."""
        answered = False
        try:
            await handler(rec)
            answered = True
        except FsError as e:
            answered = True
            _native.reply_err(rec[1], e.errno)
        except trio.Cancelled:
            answered = True
            _native.reply_err(rec[1], errno.EINTR)
            raise
        finally:
            if not answered:  # a bug: answer EIO, then let it end the loop as pyfuse3 does
                _native.reply_err(rec[1], errno.EIO)
            self._running -= 1
            self._room.set()

    @staticmethod
    def _ctx(rec: Record) -> Context:
        return Context(rec[12], rec[13], rec[14], rec[15])

    async def _lookup(self, rec: Record) -> None:
        _native.reply_entry(rec[1], await self.ops.lookup(rec[2], rec[10], self._ctx(rec)))

    async def _getattr(self, rec: Record) -> None:
        _native.reply_attr(rec[1], await self.ops.getattr(rec[2], self._ctx(rec)))

    async def _setattr(self, rec: Record) -> None:
        attr = PlainAttributes()
        attr.st_size, attr.st_mode, attr.st_uid, attr.st_gid = rec[4], rec[5], rec[6], rec[7]
        fh = rec[8] if rec[9] else None
        _native.reply_attr(rec[1], await self.ops.setattr(rec[2], attr, _Fields(rec[3]), fh, self._ctx(rec)))

    async def _readlink(self, rec: Record) -> None:
        _native.reply_readlink(rec[1], await self.ops.readlink(rec[2], self._ctx(rec)))

    async def _open(self, rec: Record) -> None:
        fi = await self.ops.open(rec[2], rec[3], self._ctx(rec))
        _native.reply_open(rec[1], fi.fh, fi.direct_io, fi.keep_cache)

    async def _read(self, rec: Record) -> None:
        if rec[2] == 0:  # no_open: no handle (fh 0, never one of ours), served by inode
            _native.reply_data(rec[1], await self.ops.read_inode(rec[5], rec[3], rec[4], self._ctx(rec)))
            return
        _native.reply_data(rec[1], await self.ops.read(rec[2], rec[3], rec[4]))

    async def _write(self, rec: Record) -> None:
        if rec[2] == 0:
            _native.reply_write(rec[1], await self.ops.write_inode(rec[5], rec[3], rec[11], self._ctx(rec)))
            return
        _native.reply_write(rec[1], await self.ops.write(rec[2], rec[3], rec[11]))

    async def _release(self, rec: Record) -> None:
        await self.ops.release(rec[2])
        _native.reply_err(rec[1], 0)

    async def _opendir(self, rec: Record) -> None:
        fh = await self.ops.opendir(rec[2], self._ctx(rec))
        _native.reply_open(rec[1], fh, False, False)

    async def _readdir(self, rec: Record) -> None:
        buf = _native.dir_buffer(rec[1], rec[4], rec[0] == _native.OP_READDIRPLUS)
        await self.ops.readdir(rec[2], rec[3], buf.add)
        buf.reply()

    async def _releasedir(self, rec: Record) -> None:
        await self.ops.releasedir(rec[2])
        _native.reply_err(rec[1], 0)

    async def _statfs(self, rec: Record) -> None:
        st = await self.ops.statfs(self._ctx(rec))
        _native.reply_statfs(
            rec[1],
            st.f_bsize,
            st.f_frsize,
            st.f_blocks,
            st.f_bfree,
            st.f_bavail,
            st.f_files,
            st.f_ffree,
            st.f_favail,
            st.f_namemax,
        )

    async def _getxattr(self, rec: Record) -> None:
        value = await self.ops.getxattr(rec[2], rec[10], self._ctx(rec))
        self._reply_sized(rec, bytes(value))

    async def _listxattr(self, rec: Record) -> None:
        names = await self.ops.listxattr(rec[2], self._ctx(rec))
        self._reply_sized(rec, b"".join(bytes(n) + b"\0" for n in names))

    @staticmethod
    def _reply_sized(rec: Record, value: bytes) -> None:
        """An xattr answer: its size when asked with size 0, ERANGE when it does not fit."""
        size = rec[3]
        if size == 0:
            _native.reply_xattr(rec[1], len(value))
        elif len(value) > size:
            _native.reply_err(rec[1], errno.ERANGE)
        else:
            _native.reply_data(rec[1], value)

    async def _create(self, rec: Record) -> None:
        await self.ops.create(rec[2], rec[10], rec[3], rec[4], self._ctx(rec))
        raise FsError(errno.EROFS)  # the mount is read-only: create raises before this

    def _entry_of(self, name: str, args: Callable[[Record], tuple[Any, ...]]) -> Callable[[Record], Any]:
        """A write-type call answered with an entry (it raises EROFS here: the mount is read-only)."""

        async def handler(rec: Record) -> None:
            _native.reply_entry(rec[1], await getattr(self.ops, name)(*args(rec), self._ctx(rec)))

        return handler

    def _done_of(self, name: str, args: Callable[[Record], tuple[Any, ...]]) -> Callable[[Record], Any]:
        """A write-type call answered with success or an error."""

        async def handler(rec: Record) -> None:
            await getattr(self.ops, name)(*args(rec), self._ctx(rec))
            _native.reply_err(rec[1], 0)

        return handler


def may_watch() -> bool:
    """Whether this process has CAP_SYS_ADMIN (fanotify's mount marks and unlimited queue need it):
    ``fuse.no_open: auto`` turns the mode on only then."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("CapEff:"):
                    return bool(int(line.split()[1], 16) & (1 << 21))  # CAP_SYS_ADMIN
    except (OSError, ValueError):
        pass
    return os.geteuid() == 0


__all__ = ["NativeFront", "may_watch"]
