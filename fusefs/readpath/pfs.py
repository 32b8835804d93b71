"""Reading files from the source (the PFS): verified against the snapshot, blocking I/O in threads.

A file whose size or mtime no longer match the snapshot is never served: the open fails with EIO
and status names it.  Checking twice (before and after a whole-file read) also catches a file
rewritten while we read it, so a reader never gets stale or mixed bytes.
"""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass

import trio

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
    def __init__(self, snapshot: Snapshot, threads: int, whole_file_max: int) -> None:
        self.snapshot = snapshot
        self.whole_file_max = whole_file_max
        # Why a limiter: unbounded threads against a PFS only add contention (NoPFS t(gamma)).
        self.limiter = trio.CapacityLimiter(threads)

    def _check(self, entry: int, st: os.stat_result) -> None:
        want_size = int(self.snapshot.tree.size[entry])
        want_mtime = int(self.snapshot.tree.mtime_ns[entry])
        if st.st_size != want_size:
            raise StaleFile(f"size changed from {want_size} to {st.st_size} since mount")
        if st.st_mtime_ns != want_mtime:
            raise StaleFile("modified since mount (mtime changed)")

    def open_sync(self, entry: int, whole: bool | None = None) -> SourceFile:
        """Open and verify; read the whole file when it is small. Runs in a worker thread."""
        path = self.snapshot.source_path(entry)
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        try:
            self._check(entry, os.fstat(fd))
            size = int(self.snapshot.tree.size[entry])
            if whole is None:
                whole = size <= self.whole_file_max
            if not whole:
                ranged = SourceFile(entry, size, fd=fd)
                fd = -1  # now owned by the SourceFile
                return ranged
            data = read_exact(fd, 0, size)
            self._check(entry, os.fstat(fd))
            return SourceFile(entry, size, data=data)
        finally:
            if fd >= 0:
                os.close(fd)

    async def open(self, entry: int, whole: bool | None = None) -> SourceFile:
        return await trio.to_thread.run_sync(self.open_sync, entry, whole, limiter=self.limiter)

    async def pread(self, src: SourceFile, off: int, size: int) -> bytes:
        size = max(0, min(size, src.size - off))
        return await trio.to_thread.run_sync(read_exact, src.fd, off, size, limiter=self.limiter)


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
