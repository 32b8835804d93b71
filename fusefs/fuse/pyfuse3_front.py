"""The pyfuse3 front: the only module of the daemon that imports pyfuse3 (``tests/test_layering.py``).

:class:`Pyfuse3Operations` is the ``pyfuse3.Operations`` pyfuse3 calls; each handler awaits the same
handler of :class:`~fusefs.fuse.operations.SeerOperations` and turns an
:class:`~fusefs.errors.FsError` into the ``pyfuse3.FUSEError`` pyfuse3 replies with.  This is the hot
path (a cached open is ~150 us of Python), so a handler adds one coroutine frame and a ``try`` (free
in 3.11 unless raised) and converts nothing else: the handlers build ``pyfuse3.EntryAttributes`` and
``pyfuse3.FileInfo`` from the start (``Pyfuse3Front.new_attrs``, ``new_file_info``); only statfs
(rare) is copied.  Any other exception propagates as before: pyfuse3 ends its main loop on it.

flush and fsync are deliberately not defined here: pyfuse3's default answers ENOSYS, after which
the kernel stops sending FLUSH on every close(), saving one round trip per file read.

:class:`Pyfuse3Front` mounts, runs and ends pyfuse3's loop and makes staging's kernel calls
(``notify_store``, ``invalidate_inode``; reads back through the mount as every front does,
:class:`~fusefs.readpath.staging.ThroughMount`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Coroutine, Iterable, Sequence
from typing import Any, cast

import pyfuse3

from fusefs.errors import FsError
from fusefs.fuse.front import EntryAttributes, FrontStatus, NewFileInfo
from fusefs.fuse.operations import SeerOperations
from fusefs.readpath.staging import ThroughMount

FUSEError = pyfuse3.FUSEError
_readdir_reply = pyfuse3.readdir_reply


def _delegate(name: str) -> Callable[..., Coroutine[Any, Any, Any]]:
    """A handler that awaits ``SeerOperations.<name>`` with pyfuse3's arguments as they come, for
    the calls no training job makes (write-type calls, which answer EROFS, and xattrs): one
    generic frame more than a handler written out, where it costs nothing."""

    async def handler(self: Pyfuse3Operations, *args: Any) -> Any:
        try:
            return await getattr(self.ops, name)(*args)
        except FsError as e:
            raise FUSEError(e.errno) from None

    handler.__name__ = handler.__qualname__ = name
    return handler


class Pyfuse3Operations(pyfuse3.Operations):
    """pyfuse3's view of :class:`SeerOperations`: every handler delegates; errors become FUSEError."""

    def __init__(self, ops: SeerOperations) -> None:
        super().__init__()
        self.ops = ops
        # Read by pyfuse3 while it answers INIT.
        self.supports_dot_lookup = ops.supports_dot_lookup
        self.enable_writeback_cache = ops.enable_writeback_cache
        self.enable_acl = ops.enable_acl

    def init(self) -> None:
        self.ops.init()

    # pyfuse3 types every attribute object and open answer as its own; ours are made by its classes
    # (Pyfuse3Front.new_attrs, new_file_info), which pyfuse3 checks at runtime: the ignores below hold.

    async def lookup(
        self, parent_inode: pyfuse3.InodeT, name: bytes, ctx: pyfuse3.RequestContext
    ) -> pyfuse3.EntryAttributes:
        try:
            return await self.ops.lookup(parent_inode, name, ctx)  # type: ignore[return-value]
        except FsError as e:
            raise FUSEError(e.errno) from None

    async def getattr(self, inode: pyfuse3.InodeT, ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        try:
            return await self.ops.getattr(inode, ctx)  # type: ignore[return-value]
        except FsError as e:
            raise FUSEError(e.errno) from None

    async def readlink(self, inode: pyfuse3.InodeT, ctx: pyfuse3.RequestContext) -> bytes:
        try:
            return await self.ops.readlink(inode, ctx)
        except FsError as e:
            raise FUSEError(e.errno) from None

    async def opendir(self, inode: pyfuse3.InodeT, ctx: pyfuse3.RequestContext) -> pyfuse3.FileHandleT:
        try:
            return await self.ops.opendir(inode, ctx)
        except FsError as e:
            raise FUSEError(e.errno) from None

    async def readdir(self, fh: pyfuse3.FileHandleT, start_id: int, token: pyfuse3.ReaddirToken) -> None:
        try:
            await self.ops.readdir(fh, start_id, functools.partial(_readdir_reply, token))
        except FsError as e:
            raise FUSEError(e.errno) from None

    async def releasedir(self, fh: pyfuse3.FileHandleT) -> None:
        await self.ops.releasedir(fh)

    async def statfs(self, ctx: pyfuse3.RequestContext) -> pyfuse3.StatvfsData:
        try:
            st = await self.ops.statfs(ctx)
        except FsError as e:
            raise FUSEError(e.errno) from None
        data = pyfuse3.StatvfsData()
        data.f_bsize, data.f_frsize = st.f_bsize, st.f_frsize
        data.f_blocks, data.f_bfree, data.f_bavail = st.f_blocks, st.f_bfree, st.f_bavail
        data.f_files, data.f_ffree, data.f_favail = st.f_files, st.f_ffree, st.f_favail
        data.f_namemax = st.f_namemax
        return data

    async def forget(self, inode_list: Sequence[tuple[pyfuse3.InodeT, int]]) -> None:
        await self.ops.forget(inode_list)

    async def open(self, inode: pyfuse3.InodeT, flags: int, ctx: pyfuse3.RequestContext) -> pyfuse3.FileInfo:
        try:
            return await self.ops.open(inode, flags, ctx)  # type: ignore[return-value]
        except FsError as e:
            raise FUSEError(e.errno) from None

    async def read(self, fh: pyfuse3.FileHandleT, off: int, size: int) -> bytes:
        try:
            return await self.ops.read(fh, off, size)
        except FsError as e:
            raise FUSEError(e.errno) from None

    async def write(self, fh: pyfuse3.FileHandleT, off: int, buf: bytes) -> int:
        try:
            return await self.ops.write(fh, off, buf)
        except FsError as e:
            raise FUSEError(e.errno) from None

    async def release(self, fh: pyfuse3.FileHandleT) -> None:
        await self.ops.release(fh)

    async def setattr(
        self,
        inode: pyfuse3.InodeT,
        attr: pyfuse3.EntryAttributes,
        fields: pyfuse3.SetattrFields,
        fh: pyfuse3.FileHandleT | None,
        ctx: pyfuse3.RequestContext,
    ) -> pyfuse3.EntryAttributes:
        try:
            return await self.ops.setattr(inode, attr, fields, fh, ctx)  # type: ignore[return-value]
        except FsError as e:
            raise FUSEError(e.errno) from None

    # ------------------------------------------------------------------ read-only: every write-type call

    mknod = _delegate("mknod")
    mkdir = _delegate("mkdir")
    unlink = _delegate("unlink")
    rmdir = _delegate("rmdir")
    symlink = _delegate("symlink")
    rename = _delegate("rename")
    link = _delegate("link")
    create = _delegate("create")
    setxattr = _delegate("setxattr")
    removexattr = _delegate("removexattr")
    getxattr = _delegate("getxattr")
    listxattr = _delegate("listxattr")


class Pyfuse3Front(ThroughMount):
    """The :class:`~fusefs.fuse.front.Front` through pyfuse3: one per process (pyfuse3's state is
    global).  The kernel calls block and run in worker threads only (:mod:`fusefs.readpath.staging`)."""

    def __init__(self, path_of: Callable[[int], bytes] | None = None) -> None:
        super().__init__(path_of)
        self.new_attrs = cast(Callable[[], EntryAttributes], pyfuse3.EntryAttributes)
        self.new_file_info = cast(NewFileInfo, pyfuse3.FileInfo)  # (fh, direct_io, keep_cache)
        self.default_options: frozenset[str] = frozenset(pyfuse3.default_options)

    def mount(self, ops: SeerOperations, mountpoint: str, options: Iterable[str]) -> None:
        pyfuse3.init(Pyfuse3Operations(ops), mountpoint, set(options))

    async def run(self, max_tasks: int) -> None:
        await pyfuse3.main(min_tasks=2, max_tasks=max_tasks)

    def terminate(self) -> None:
        pyfuse3.terminate()

    def unmount(self) -> None:
        pyfuse3.close(unmount=True)

    def notify_store(self, inode: int, offset: int, data: bytes) -> None:
        pyfuse3.notify_store(pyfuse3.InodeT(inode), offset, data)

    def invalidate_inode(self, inode: int) -> None:
        pyfuse3.invalidate_inode(pyfuse3.InodeT(inode), attr_only=False)

    def invalidate_entry(self, parent: int, name: bytes) -> None:
        pyfuse3.invalidate_entry(pyfuse3.InodeT(parent), pyfuse3.FileNameT(name))

    def status(self) -> FrontStatus:
        return {
            "name": "pyfuse3",
            "native_opens": 0,
            "native_releases": 0,
            "native_ioctls": 0,
            "native_getattrs": 0,
            "forwarded": 0,
            "batches": 0,
            "visits": 0,
            "ring_full": 0,
            "open_mode": "requests",
            "fanotify": "off",
            "observed_opens": 0,
            "observed_releases": 0,
            "own_opens_dropped": 0,
            "observed_overflows": 0,
            "opens_answered_enosys": 0,
        }


__all__ = ["Pyfuse3Front", "Pyfuse3Operations"]
