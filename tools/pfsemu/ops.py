"""The filesystem: inodes, handles and the read-only FUSE operations that apply the model."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import itertools
import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar, cast

import pyfuse3
import trio

from tools.pfsemu.model import PROTOCOL_VERSION, ActiveReaders, EmulatorConfig, ServerCounters, SharedChannel
from tools.pfsemu.timer import PreciseTimer

T = TypeVar("T")

log = logging.getLogger("pfsemu")


# ----------------------------------------------------------------------------------------------------
# Inodes and handles
# ----------------------------------------------------------------------------------------------------


class InodeTable:
    """Inode number <-> path relative to the backing root (bytes; b"" is the root).

    Entries are never forgotten: the emulator serves datasets, not churning trees, and a stable
    number per path keeps the table trivially correct against kernel lookup counts.
    """

    def __init__(self) -> None:
        self._paths: dict[int, bytes] = {pyfuse3.ROOT_INODE: b""}
        self._inodes: dict[bytes, int] = {b"": pyfuse3.ROOT_INODE}
        self._next = pyfuse3.ROOT_INODE + 1

    def path(self, inode: int) -> bytes:
        try:
            return self._paths[inode]
        except KeyError:
            raise pyfuse3.FUSEError(errno.ESTALE) from None

    def inode(self, path: bytes) -> int:
        ino = self._inodes.get(path)
        if ino is None:
            ino = self._inodes[path] = self._next
            self._paths[ino] = path
            self._next += 1
        return ino

    def child(self, parent: int, name: bytes) -> bytes:
        base = self.path(parent)
        if name == b".":
            return base
        if name == b"..":
            return base.rpartition(b"/")[0]
        return base + b"/" + name if base else name


@dataclass
class OpenFile:
    fd: int
    size: int  # at open: tells a short non-blocking read from the end of the file
    path: str
    tgid: int
    comm: str


def _client_of(pid: int) -> tuple[int, str]:
    """(thread-group id, process name) of the task that sent a request; (pid, "?") once it is gone.

    The kernel reports the calling *thread*; counters are per process, so map it to its tgid.
    """
    tgid = pid
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"Tgid:"):
                    tgid = int(line.split()[1])
                    break
        with open(f"/proc/{tgid}/comm", "rb") as f:
            comm = f.read().strip().decode("utf-8", "replace")
    except (OSError, ValueError):
        return tgid, "?"
    return tgid, comm


def _open_backing(path: bytes) -> tuple[int, int]:
    """Open for the loop's inline reads: O_NOATIME, since the first read of a freshly written file
    would otherwise update atime through the filesystem journal and can wait behind writeback."""
    flags = os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW
    try:
        fd = os.open(path, flags | os.O_NOATIME)
    except PermissionError:  # O_NOATIME needs ownership or CAP_FOWNER
        fd = os.open(path, flags)
    try:
        return fd, os.fstat(fd).st_size
    except OSError:
        os.close(fd)
        raise


def _pread_nowait(fd: int, size: int, off: int) -> memoryview | None:
    """Read what the page cache holds without ever waiting for a disk: None if that is nothing.

    Raises :class:`_NoWaitUnsupported` where the backing filesystem lacks RWF_NOWAIT (tmpfs).
    """
    buf = bytearray(size)
    try:
        n = os.preadv(fd, [buf], off, os.RWF_NOWAIT)
    except BlockingIOError:
        return None
    except OSError as exc:
        if exc.errno in (errno.EOPNOTSUPP, errno.EINVAL):
            raise _NoWaitUnsupported from None
        raise
    return memoryview(buf)[:n]


class _NoWaitUnsupported(Exception):
    pass


_MEMORY_FS_MAGIC = (0x01021994, 0x858458F6)  # tmpfs, ramfs


def _is_memory_fs(path: bytes) -> bool:
    """True when ``path`` lives on tmpfs/ramfs, whose reads never wait for a disk (swap aside)."""
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    buf = ctypes.create_string_buffer(256)  # struct statfs is 120 bytes on x86_64; f_type comes first
    if libc.statfs(path, buf) != 0:
        return False
    return ctypes.c_long.from_buffer(buf).value in _MEMORY_FS_MAGIC


def _scan_dir(path: bytes) -> list[tuple[bytes, os.stat_result]]:
    out: list[tuple[bytes, os.stat_result]] = []
    with os.scandir(path) as it:
        for entry in it:
            with contextlib.suppress(FileNotFoundError):
                out.append((entry.name, entry.stat(follow_symlinks=False)))
    out.sort(key=lambda item: item[0])
    return out


def _fuse_error(exc: Exception) -> pyfuse3.FUSEError:
    if isinstance(exc, pyfuse3.FUSEError):
        return exc
    if isinstance(exc, OSError) and exc.errno:
        return pyfuse3.FUSEError(exc.errno)
    log.exception("unexpected error in a request handler")
    return pyfuse3.FUSEError(errno.EIO)


# ----------------------------------------------------------------------------------------------------
# The filesystem
# ----------------------------------------------------------------------------------------------------


class PfsemuOperations(pyfuse3.Operations):
    """Read-only passthrough of ``backing`` with the latency, bandwidth and counting model above."""

    def __init__(self, backing: Path, config: EmulatorConfig, timer: PreciseTimer) -> None:
        super().__init__()
        self._root = os.fsencode(os.path.realpath(backing))
        self.config = config
        self._timer = timer
        self._limiter = trio.CapacityLimiter(config.threads)
        self._nowait = hasattr(os, "RWF_NOWAIT")
        self._memory_fs = _is_memory_fs(self._root)
        self._inodes = InodeTable()
        self._files: dict[int, OpenFile] = {}
        self._dirs: dict[int, list[tuple[bytes, int, os.stat_result]]] = {}
        self._fh = itertools.count(1)
        self._active = ActiveReaders(config.active_window_s)
        self._channel = SharedChannel(config.curve)
        self.counters = ServerCounters()

    # -- helpers -------------------------------------------------------------------------------------

    def _backing(self, rel: bytes) -> bytes:
        return self._root + b"/" + rel if rel else self._root

    def _entry(self, inode: int, st: os.stat_result) -> pyfuse3.EntryAttributes:
        attr = pyfuse3.EntryAttributes()
        attr.st_ino = inode
        attr.generation = 0
        attr.entry_timeout = self.config.attr_timeout_s
        attr.attr_timeout = self.config.attr_timeout_s
        attr.st_mode = st.st_mode
        attr.st_nlink = st.st_nlink
        attr.st_uid = st.st_uid
        attr.st_gid = st.st_gid
        attr.st_rdev = st.st_rdev
        attr.st_size = st.st_size
        attr.st_blksize = st.st_blksize
        attr.st_blocks = st.st_blocks
        attr.st_atime_ns = st.st_atime_ns
        attr.st_mtime_ns = st.st_mtime_ns
        attr.st_ctime_ns = st.st_ctime_ns
        return attr

    async def _thread(self, fn: Callable[..., T], *args: Any) -> T:
        return await trio.to_thread.run_sync(fn, *args, limiter=self._limiter)

    async def _meta_delay(self, arrival: float) -> None:
        self.counters.meta_ops += 1
        if self.config.meta_latency_s > 0:
            await self._timer.sleep_until(arrival + self.config.meta_latency_s)

    # -- metadata ------------------------------------------------------------------------------------

    async def lookup(
        self, parent_inode: pyfuse3.InodeT, name: pyfuse3.FileNameT, ctx: pyfuse3.RequestContext
    ) -> pyfuse3.EntryAttributes:
        arrival = trio.current_time()
        try:
            rel = self._inodes.child(parent_inode, name)
            st = os.lstat(self._backing(rel))
        except Exception as exc:
            raise _fuse_error(exc) from None
        await self._meta_delay(arrival)
        return self._entry(self._inodes.inode(rel), st)

    async def getattr(self, inode: pyfuse3.InodeT, ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        arrival = trio.current_time()
        try:
            st = os.lstat(self._backing(self._inodes.path(inode)))
        except Exception as exc:
            raise _fuse_error(exc) from None
        await self._meta_delay(arrival)
        return self._entry(inode, st)

    async def readlink(self, inode: pyfuse3.InodeT, ctx: pyfuse3.RequestContext) -> pyfuse3.FileNameT:
        arrival = trio.current_time()
        try:
            target = os.readlink(self._backing(self._inodes.path(inode)))
        except Exception as exc:
            raise _fuse_error(exc) from None
        await self._meta_delay(arrival)
        return target

    async def opendir(self, inode: pyfuse3.InodeT, ctx: pyfuse3.RequestContext) -> pyfuse3.FileHandleT:
        arrival = trio.current_time()
        try:
            rel = self._inodes.path(inode)
            entries = await self._thread(_scan_dir, self._backing(rel))
        except Exception as exc:
            raise _fuse_error(exc) from None
        await self._meta_delay(arrival)
        fh = next(self._fh)
        self._dirs[fh] = [(name, self._inodes.inode(rel + b"/" + name if rel else name), st) for name, st in entries]
        return fh

    async def readdir(self, fh: pyfuse3.FileHandleT, start_id: int, token: pyfuse3.ReaddirToken) -> None:
        entries = self._dirs.get(fh)
        if entries is None:
            raise pyfuse3.FUSEError(errno.EBADF)
        for index in range(start_id, len(entries)):
            name, inode, st = entries[index]
            if not pyfuse3.readdir_reply(token, name, self._entry(inode, st), index + 1):
                break

    async def releasedir(self, fh: pyfuse3.FileHandleT) -> None:
        self._dirs.pop(fh, None)

    async def statfs(self, ctx: pyfuse3.RequestContext) -> pyfuse3.StatvfsData:
        try:
            sv = os.statvfs(self._root)
        except Exception as exc:
            raise _fuse_error(exc) from None
        data = pyfuse3.StatvfsData()
        for name in ("f_bsize", "f_frsize", "f_blocks", "f_bfree", "f_bavail"):
            setattr(data, name, getattr(sv, name))
        for name in ("f_files", "f_ffree", "f_favail", "f_namemax"):
            setattr(data, name, getattr(sv, name))
        return data

    async def forget(self, inode_list: Sequence[tuple[pyfuse3.InodeT, int]]) -> None:
        return None

    # -- data ----------------------------------------------------------------------------------------

    async def open(self, inode: pyfuse3.InodeT, flags: pyfuse3.FlagT, ctx: pyfuse3.RequestContext) -> pyfuse3.FileInfo:
        arrival = trio.current_time()
        if flags & os.O_ACCMODE != os.O_RDONLY or flags & os.O_TRUNC:
            raise pyfuse3.FUSEError(errno.EROFS)
        try:
            rel = self._inodes.path(inode)
            fd, size = _open_backing(self._backing(rel))
            tgid, comm = _client_of(ctx.pid)
        except Exception as exc:
            self.counters.open_errors += 1
            await self._timer.sleep_until(arrival + self.config.open_latency_s)
            raise _fuse_error(exc) from None
        try:
            await self._timer.sleep_until(arrival + self.config.open_latency_s)
        except BaseException:
            os.close(fd)
            raise
        fh = next(self._fh)
        path = os.fsdecode(rel)
        self._files[fh] = OpenFile(fd, size, path, tgid, comm)
        self.counters.count_open(path, tgid, comm)
        return pyfuse3.FileInfo(fh=fh, direct_io=True, keep_cache=False)

    async def read(self, fh: pyfuse3.FileHandleT, off: int, size: int) -> bytes:
        arrival = trio.current_time()
        handle = self._files.get(fh)
        if handle is None:
            raise pyfuse3.FUSEError(errno.EBADF)
        self._active.begin(fh)
        try:
            try:
                data = await self._pread(handle, size, off)
            except Exception as exc:
                raise _fuse_error(exc) from None
            gamma = self._active.count(trio.current_time())
            if data:  # at EOF a PFS client answers from the size it knows: no RPC, no delay
                end = self._channel.reserve(arrival, len(data), gamma)
                await self._timer.sleep_until(max(arrival + self.config.read_latency_s, end))
        finally:
            self._active.end(fh, trio.current_time())
        self.counters.count_read(handle.path, handle.tgid, handle.comm, len(data), gamma)
        return data

    async def _pread(self, handle: OpenFile, size: int, off: int) -> bytes:
        """Cached data inline (a copy costs less CPU than a thread hop), anything else in a thread."""
        if self._memory_fs:
            return os.pread(handle.fd, size, off)
        if self._nowait:
            try:
                view = _pread_nowait(handle.fd, size, off)
            except _NoWaitUnsupported:
                self._nowait = False
                view = None
            if view is not None and (len(view) == size or off + len(view) >= handle.size):
                # pyfuse3 replies from any contiguous buffer (PyObject_GetBuffer): no copy to bytes.
                return cast(bytes, view)
        self.counters.thread_reads += 1
        return await self._thread(os.pread, handle.fd, size, off)

    async def flush(self, fh: pyfuse3.FileHandleT) -> None:
        # ENOSYS makes the kernel stop sending FLUSH on every close (fuse_flush sets no_flush):
        # a read-only passthrough has nothing to flush and each request costs event-loop CPU.
        raise pyfuse3.FUSEError(errno.ENOSYS)

    async def release(self, fh: pyfuse3.FileHandleT) -> None:
        handle = self._files.pop(fh, None)
        self._active.drop(fh)
        if handle is not None:
            os.close(handle.fd)

    # -- observation ---------------------------------------------------------------------------------

    def close_all(self) -> None:
        for handle in self._files.values():
            with contextlib.suppress(OSError):
                os.close(handle.fd)
        self._files.clear()

    def snapshot(self, *, files: bool, started_at: float, backing: str, mountpoint: str) -> dict[str, Any]:
        """The counters as JSON-able data (layout: :class:`PfsStats`)."""
        c = self.counters
        now = time.monotonic()
        cpu = os.times()
        snap: dict[str, Any] = {
            "version": PROTOCOL_VERSION,
            "emulator": {
                "pid": os.getpid(),
                "backing": backing,
                "mountpoint": mountpoint,
                "uptime_s": now - started_at,
                "cpu_s": cpu.user + cpu.system,
                "nice": os.getpriority(os.PRIO_PROCESS, 0),
            },
            "config": self.config.to_json(),
            "since_reset_s": now - c.reset_at,
            "totals": {
                **c.total.to_json(),
                "open_errors": c.open_errors,
                "meta_ops": c.meta_ops,
                "thread_reads": c.thread_reads,
                "channel_busy_s": self._channel.busy_s - c.channel_busy_s,
            },
            "gauges": {
                "open_handles": len(self._files),
                "active_readers": self._active.count(trio.current_time()),
            },
            "reads_by_gamma": {str(g): n for g, n in sorted(c.reads_by_gamma.items())},
            "loop_lag_ms": {
                "max": c.lag_max_s * 1e3,
                "mean": (c.lag_sum_s / c.lag_samples * 1e3) if c.lag_samples else 0.0,
            },
            "clients": [
                {"pid": pid, "comm": c.client_comm.get(pid, "?"), **t.to_json()} for pid, t in sorted(c.clients.items())
            ],
            "comms": {name: t.to_json() for name, t in sorted(c.comms.items())},
        }
        if files:
            snap["files"] = {path: t.to_json() for path, t in sorted(c.files.items())}
        return snap

    def reset_counters(self) -> None:
        busy = self._channel.busy_s
        self.counters = ServerCounters()
        self.counters.channel_busy_s = busy

    async def watch_loop_lag(self, period_s: float = 0.05) -> None:
        """Measure how late the event loop wakes: blocking work on it would show up here."""
        while True:
            deadline = trio.current_time() + period_s
            await self._timer.sleep_until(deadline)
            lag = max(0.0, trio.current_time() - deadline)
            c = self.counters
            c.lag_max_s = max(c.lag_max_s, lag)
            c.lag_sum_s += lag
            c.lag_samples += 1
