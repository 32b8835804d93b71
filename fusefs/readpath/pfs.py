"""Reading files from the source (the PFS): verified against the snapshot, blocking I/O in threads.

A file whose identity (size, mtime, ctime, inode: :mod:`fusefs.meta.identity`) no longer matches
the snapshot is never served: the open fails with EIO and status names it.  Checking twice (before
and after a whole-file read) also catches a file rewritten while we read it, and a file served in
ranges is checked after every range (fstat of the open descriptor), so a reader never gets stale or
mixed bytes: a change during a ranged read fails that read with EIO.

Sources are opened with O_NONBLOCK and checked with fstat before any read: a FIFO, socket or
device put where a file was would otherwise block the reader forever (D state).  Only regular files
are served; anything else reads as EIO with a status note.
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass

import trio

from fusefs.meta.identity import SourceId
from fusefs.meta.snapshot import Snapshot


class StaleFile(Exception):
    """The source file differs from the snapshot (args: human-readable reason)."""


@dataclass
class SourceFile:
    """An open source file: its bytes when read whole, else a descriptor for ranged reads."""

    entry: int
    size: int
    data: bytes | None = None
    fd: int = -1

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class PfsReader:
    def __init__(self, snapshot: Snapshot, threads: int, whole_file_max: int, stage_threads: int = 1) -> None:
        """``threads``: readers' opens, fills, the next epoch's lane (``fuse.io_threads``);
        ``stage_threads``: the staging window's reads to start with (``prefetch.threads``).

        Concurrency rule: the staging window's reads run under their own limiter, sized by the read
        policy's stage limit (:meth:`stage_slots`, from its ``StageSlots`` instruction): that limit
        grows while readers catch the window, and a shared pool would then let readers' opens take
        threads whose bytes nothing reserved.  So reads in flight that the budget does not charge
        stay at most ``fuse.io_threads`` (the memory reserve's ``inflight``), and each staging read's
        bytes were reserved by the window before it started.  Both limiters are used on the trio
        thread only."""
        self.snapshot = snapshot
        self.ids = snapshot.source_ids()
        self.whole_file_max = whole_file_max
        # Why a limiter: unbounded threads against a PFS only add contention (NoPFS t(gamma)).
        self.limiter = trio.CapacityLimiter(threads)
        self.stage_limiter = trio.CapacityLimiter(max(1, stage_threads))

    def stage_slots(self, limit: int) -> None:
        """The staging window may have ``limit`` stages in flight: as many threads for their reads.
        Lowered below those borrowed, the reads in flight finish and no new one starts until below."""
        self.stage_limiter.total_tokens = max(1, limit)

    def check(self, entry: int, st: os.stat_result) -> None:
        """StaleFile unless ``st`` is a regular file with the identity the snapshot recorded."""
        if not stat.S_ISREG(st.st_mode):
            raise StaleFile("not a regular file any more (a FIFO, socket, device or directory)")
        why = SourceId.of(st).change_from(self.ids.of(entry))
        if why is not None:
            raise StaleFile(f"{why} since the snapshot")

    def open_sync(self, entry: int, whole: bool | None = None) -> SourceFile:
        """Open and verify; read the whole file when it is small. Runs in a worker thread."""
        path = self.snapshot.source_path(entry)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError as exc:
            if exc.errno in (errno.ENXIO, errno.ELOOP, errno.ENOENT):  # a socket, a symlink, gone
                raise StaleFile(f"cannot be opened as the file it was ({exc.strerror})") from None
            raise
        try:
            self.check(entry, os.fstat(fd))
            size = int(self.snapshot.tree.size[entry])
            if whole is None:
                whole = size <= self.whole_file_max
            if not whole:
                ranged = SourceFile(entry, size, fd=fd)
                fd = -1  # now owned by the SourceFile
                return ranged
            data = read_exact(fd, 0, size)
            self.check(entry, os.fstat(fd))
            return SourceFile(entry, size, data=data)
        finally:
            if fd >= 0:
                os.close(fd)

    async def open(self, entry: int, whole: bool | None = None, staging: bool = False) -> SourceFile:
        limiter = self.stage_limiter if staging else self.limiter
        return await trio.to_thread.run_sync(self.open_sync, entry, whole, limiter=limiter)

    def pread_sync(self, src: SourceFile, off: int, size: int) -> bytes:
        """One range, then the identity check: bytes read before a change are never mixed with
        bytes after it (the open checked it too, so every range served came from one version)."""
        data = read_exact(src.fd, off, size)
        self.check(src.entry, os.fstat(src.fd))
        return data

    async def pread(self, src: SourceFile, off: int, size: int) -> bytes:
        size = max(0, min(size, src.size - off))
        return await trio.to_thread.run_sync(self.pread_sync, src, off, size, limiter=self.limiter)


def read_exact(fd: int, off: int, size: int) -> bytes:
    """pread until ``size`` bytes; a short file means it changed under us (EIO, not short data)."""
    parts: list[bytes] = []
    got = 0
    while got < size:
        chunk = os.pread(fd, min(size - got, 8 << 20), off + got)
        if not chunk:
            raise StaleFile(f"shrank while being read (got {got} of {size} bytes)")
        parts.append(chunk)
        got += len(chunk)
    return parts[0] if len(parts) == 1 else b"".join(parts)


def errno_of(exc: OSError) -> int:
    return exc.errno if exc.errno is not None else errno.EIO
