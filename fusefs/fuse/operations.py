"""The FUSE handlers: thin, delegating to the snapshot, control files and file service.

They name no binding: a front (:mod:`fusefs.fuse.front`; today :mod:`fusefs.fuse.pyfuse3_front`)
calls them with binding-free arguments and answers the kernel with what they return or raise
(:class:`~fusefs.errors.FsError`).

Concurrency rule: handlers run as trio tasks on one thread.  Nothing here blocks; blocking work
lives behind ``await`` in the file service.  The handle table is only touched between awaits, so a
handle is never seen half-registered.  A handler that awaits registers its request in ``requests``
while it waits (:mod:`fusefs.fuse.inflight`: who holds a busy mount).
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import logging
import os
import time
from collections.abc import Iterator, Sequence

import trio

from fusefs.errors import FsError
from fusefs.fuse.attrs import AttrFactory
from fusefs.fuse.control import CONTROL_NAME, CTL_DIR, ControlFiles, ControlHandle
from fusefs.fuse.front import (
    ROOT_INODE,
    EntryAttributes,
    FileInfo,
    NewFileInfo,
    PlainFileInfo,
    ReaddirReply,
    RequestContext,
    SetattrFields,
)
from fusefs.fuse.inflight import InFlight
from fusefs.meta.ids import entry_of
from fusefs.meta.snapshot import Snapshot
from fusefs.readpath.openfiles import OpenFile, OpenFiles
from placement.tree import KIND_DIR, KIND_FILE, KIND_SYMLINK

log = logging.getLogger(__name__)

_READDIR_BATCH = 32
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_TRUNC | os.O_APPEND | os.O_CREAT


def _erofs() -> FsError:
    return FsError(errno.EROFS)


@contextlib.contextmanager
def _contained(what: str) -> Iterator[None]:
    """Turn a bug in a control-file handler into EIO and a log line.

    A front ends its main loop (and so the mount) on any exception but FsError; control files
    take arbitrary user input, so a mistake there must cost one request, never the daemon.
    """
    try:
        yield
    except FsError:
        raise
    except Exception:
        log.exception("%s failed", what)
        raise FsError(errno.EIO) from None


class SeerOperations:
    supports_dot_lookup = True
    enable_writeback_cache = False
    enable_acl = False

    def __init__(
        self,
        snapshot: Snapshot,
        control: ControlFiles,
        open_files: OpenFiles,
        attrs: AttrFactory,
        new_file_info: NewFileInfo = PlainFileInfo,
    ) -> None:
        self.snapshot = snapshot
        self.tree = snapshot.tree
        self.control = control
        self.open_files = open_files
        self.attrs = attrs
        self.file_info = new_file_info  # the front's answer to an open (pyfuse3 takes only its own)
        self._fh = itertools.count(1)
        self.handles: dict[int, OpenFile | ControlHandle] = {}
        self._statfs: tuple[float, os.statvfs_result] | None = None
        self.initialized = trio.Event()  # set when the kernel's INIT request has been answered
        self.requests = InFlight()

    def init(self) -> None:
        # Called while the front handles INIT, before its reply: whoever waits runs after the reply.
        self.initialized.set()

    # ------------------------------------------------------------------ helpers

    def _entry(self, inode: int) -> int:
        entry = entry_of(inode)
        if not 0 <= entry < len(self.tree):
            raise FsError(errno.ENOENT)
        return entry

    # ------------------------------------------------------------------ metadata

    async def lookup(self, parent_inode: int, name: bytes, ctx: RequestContext) -> EntryAttributes:
        ctl = self.control.lookup(parent_inode, name)
        if ctl is not None:
            return self.control.attrs(ctl)
        if self.control.owns(parent_inode):
            if name == b"..":
                return await self.getattr(ROOT_INODE, ctx) if parent_inode == CTL_DIR else self.control.attrs(CTL_DIR)
            if name == b".":
                return self.control.attrs(parent_inode)
            raise FsError(errno.ENOENT)
        parent = self._entry(parent_inode)
        if name == b".":
            return self.attrs(parent)
        if name == b"..":
            return self.attrs(int(self.tree.parent[parent]))
        if self.tree.kind[parent] != KIND_DIR:
            raise FsError(errno.ENOTDIR)
        child = self.tree.find_child(parent, name)
        if child < 0:
            raise FsError(errno.ENOENT)
        return self.attrs(child)

    async def getattr(self, inode: int, ctx: RequestContext) -> EntryAttributes:
        if self.control.owns(inode):
            return self.control.attrs(inode)
        return self.attrs(self._entry(inode))

    async def readlink(self, inode: int, ctx: RequestContext) -> bytes:
        entry = self._entry(inode)
        if self.tree.kind[entry] != KIND_SYMLINK:
            raise FsError(errno.EINVAL)
        return self.snapshot.readlink(entry)

    async def opendir(self, inode: int, ctx: RequestContext) -> int:
        if self.control.owns(inode):
            if inode != CTL_DIR:
                raise FsError(errno.ENOTDIR)
            return inode
        if self.tree.kind[self._entry(inode)] != KIND_DIR:
            raise FsError(errno.ENOTDIR)
        return inode

    async def readdir(self, fh: int, start_id: int, reply: ReaddirReply) -> None:
        # start_id is the position after the last entry the kernel received.
        if fh == CTL_DIR:
            listing = self.control.entries()
            for pos in range(start_id, len(listing)):
                name, ino = listing[pos]
                if not reply(name, self.control.attrs(ino), pos + 1):
                    return
            return
        entry = self._entry(fh)
        first = int(self.tree.child_start[entry])
        end = first + int(self.tree.child_count[entry])
        hide_control = entry == 0
        pos = start_id
        # A reply holds one page (~25 entries): convert a small batch at a time, never the whole dir.
        while first + pos < end:
            lo = first + pos
            hi = min(end, lo + _READDIR_BATCH)
            for name, attrs in zip(self.tree.names_of(lo, hi), self.attrs.batch(lo, hi), strict=True):
                pos += 1
                if hide_control and name == CONTROL_NAME:
                    continue  # the source's own .control is shadowed by ours and must not become a class
                if not reply(name, attrs, pos):
                    return

    async def releasedir(self, fh: int) -> None:
        return None

    async def statfs(self, ctx: RequestContext) -> os.statvfs_result:
        """The source's statvfs, at most 5 s old (the front copies the fields it replies with)."""
        now = time.monotonic()
        if self._statfs is None or now - self._statfs[0] > 5.0:
            key = self.requests.begin(ctx.pid, "statfs")
            try:
                st = await trio.to_thread.run_sync(os.statvfs, self.snapshot.source)
            finally:
                self.requests.end(key)
            self._statfs = (now, st)
        return self._statfs[1]

    async def forget(self, inode_list: Sequence[tuple[int, int]]) -> None:
        return None  # inodes are the snapshot's and live as long as the mount

    # ------------------------------------------------------------------ files

    async def open(self, inode: int, flags: int, ctx: RequestContext) -> FileInfo:
        if self.control.owns(inode):
            with _contained("control open"):
                handle, direct = self.control.open(inode, flags, ctx)
            fh = next(self._fh)
            self.handles[fh] = handle
            return self.file_info(fh, direct, False)
        entry = self._entry(inode)
        if flags & _WRITE_FLAGS:
            raise _erofs()
        if self.tree.kind[entry] != KIND_FILE:
            raise FsError(errno.EISDIR if self.tree.kind[entry] == KIND_DIR else errno.EACCES)
        key = self.requests.begin(ctx.pid, "open")
        try:
            opened = await self.open_files.open(entry, ctx.pid)
        finally:
            self.requests.end(key)
        fh = next(self._fh)
        self.handles[fh] = opened
        # keep_cache: the tree is immutable, so cached pages stay valid across opens (pushed pages
        # are served without reaching us); direct_io only when the memory budget cannot hold it.
        return self.file_info(fh, opened.direct, not opened.direct)

    def opened_natively(self, inode: int, fh: int, pid: int) -> None:
        """The front answered an OPEN of ``inode`` itself with handle ``fh`` (pages known cached):
        register the handle as an open of a pushed file, before any request on it is served."""
        entry = entry_of(inode)
        if 0 <= entry < len(self.tree):
            self.handles[fh] = self.open_files.opened_natively(entry, pid)

    def book_native(self, events: list[int]) -> None:
        """A run of OPENs and RELEASEs the front answered itself, in order, as flat
        ``(opened, inode, fh, pid)`` quads: what :meth:`opened_natively` and
        :meth:`released_natively` would book one by one, in one pass (``OpenFiles.book_native``)."""
        self.open_files.book_native(events, self.handles, len(self.tree))

    def released_natively(self, fh: int) -> None:
        """The front answered the RELEASE of its own handle ``fh``."""
        handle = self.handles.pop(fh, None)
        if isinstance(handle, OpenFile):
            self.open_files.release(handle)

    async def read(self, fh: int, off: int, size: int) -> bytes:
        handle = self.handles.get(fh)
        if handle is None:
            raise FsError(errno.EBADF)
        if isinstance(handle, ControlHandle):
            return self.control.read(handle, off, size)
        # A front accepts any buffer here; a memoryview slice of a whole-file read is zero-copy.
        return await self.open_files.read(handle, off, size)  # type: ignore[return-value]

    def opens_unseen(self) -> list[int]:
        """The front is arming ``no_open`` (``fuse.no_open``): soon no OPEN or RELEASE arrives, so
        control files are served by inode from now on (:meth:`ControlFiles.serve_by_inode`, which
        works with OPENs too); returns their inodes, whose cached attributes the front drops."""
        return self.control.serve_by_inode()

    async def read_inode(self, inode: int, off: int, size: int, ctx: RequestContext) -> bytes:
        """A READ without a handle (``no_open``: the kernel opened the file without asking)."""
        if self.control.owns(inode):
            with _contained("control read"):
                return self.control.read_inode(inode, off, size)
        entry = self._entry(inode)
        if self.tree.kind[entry] != KIND_FILE:
            raise FsError(errno.EISDIR)
        key = self.requests.begin(ctx.pid, "read")
        try:
            return await self.open_files.read_inode(entry, off, size, ctx.pid)  # type: ignore[return-value]
        finally:
            self.requests.end(key)

    async def write_inode(self, inode: int, off: int, buf: bytes, ctx: RequestContext) -> int:
        """A WRITE without a handle (``no_open``): only the seed is writable."""
        if not self.control.owns(inode):
            raise _erofs()
        with _contained("control write"):
            return self.control.write_inode(inode, off, buf, ctx)

    async def write(self, fh: int, off: int, buf: bytes) -> int:
        handle = self.handles.get(fh)
        if not isinstance(handle, ControlHandle):
            raise _erofs()
        with _contained("control write"):
            return self.control.write(handle, off, buf)

    async def release(self, fh: int) -> None:
        handle = self.handles.pop(fh, None)
        if isinstance(handle, OpenFile):
            self.open_files.release(handle)

    # flush and fsync are deliberately not implemented: the front leaves them to its binding, whose
    # default answers ENOSYS, after which the kernel stops sending FLUSH on every close(), saving one
    # round trip per file read.
    # IOCTL cannot be silenced that way: Python's open() asks isatty() (TCGETS) of every file, the
    # kernel forwards each one and never caches the ENOSYS that libfuse answers in C for us.  So a
    # page-cached file read by torchvision's loader still costs OPEN, IOCTL and RELEASE here.

    async def setattr(
        self,
        inode: int,
        attr: EntryAttributes,
        fields: SetattrFields,
        fh: int | None,
        ctx: RequestContext,
    ) -> EntryAttributes:
        if (
            self.control.owns(inode)
            and fields.update_size
            and not (fields.update_mode or fields.update_uid or fields.update_gid)
        ):
            handle = self.handles.get(fh) if fh is not None else None
            with _contained("control truncate"):
                self.control.truncate(inode, attr.st_size, ctx, handle if isinstance(handle, ControlHandle) else None)
            return self.control.attrs(inode)
        raise _erofs()

    # ------------------------------------------------------------------ read-only: every write-type call

    async def mknod(self, parent_inode: int, name: bytes, mode: int, rdev: int, ctx: RequestContext) -> EntryAttributes:
        raise _erofs()

    async def mkdir(self, parent_inode: int, name: bytes, mode: int, ctx: RequestContext) -> EntryAttributes:
        raise _erofs()

    async def unlink(self, parent_inode: int, name: bytes, ctx: RequestContext) -> None:
        raise _erofs()

    async def rmdir(self, parent_inode: int, name: bytes, ctx: RequestContext) -> None:
        raise _erofs()

    async def symlink(self, parent_inode: int, name: bytes, target: bytes, ctx: RequestContext) -> EntryAttributes:
        raise _erofs()

    async def rename(
        self,
        parent_inode_old: int,
        name_old: bytes,
        parent_inode_new: int,
        name_new: bytes,
        flags: int,
        ctx: RequestContext,
    ) -> None:
        raise _erofs()

    async def link(self, inode: int, new_parent_inode: int, new_name: bytes, ctx: RequestContext) -> EntryAttributes:
        raise _erofs()

    async def create(
        self, parent_inode: int, name: bytes, mode: int, flags: int, ctx: RequestContext
    ) -> tuple[FileInfo, EntryAttributes]:
        raise _erofs()

    async def setxattr(self, inode: int, name: bytes, value: bytes, ctx: RequestContext) -> None:
        raise _erofs()

    async def removexattr(self, inode: int, name: bytes, ctx: RequestContext) -> None:
        raise _erofs()

    async def getxattr(self, inode: int, name: bytes, ctx: RequestContext) -> bytes:
        raise FsError(errno.ENODATA)

    async def listxattr(self, inode: int, ctx: RequestContext) -> Sequence[bytes]:
        return []


__all__ = ["SeerOperations"]
