"""Blocking file I/O of the directory tier (run in worker threads), keeping the page cache clean.

Why the page-cache care: a file the mount serves can sit in RAM three times: in the
mount's page cache, in a RAM tier, and in the page cache of the tier disk.  Tier files are written
back to disk and dropped from the page cache right after writing, and dropped again after each
read, so the disk tier costs disk, not memory.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import stat
from collections.abc import Callable
from typing import cast

from fusefs.tiers.digest import BLOCK, BlockDigests

_SYNC_FILE_RANGE_ALL = 1 | 2 | 4  # WAIT_BEFORE | WRITE | WAIT_AFTER: data on disk, no journal commit
_MAX_PREAD = 64 << 20


def _load_sync_file_range() -> Callable[[int, int, int, int], int] | None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.sync_file_range
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return cast(Callable[[int, int, int, int], int], fn)


_sync_file_range = _load_sync_file_range()


def write_back(fd: int) -> None:
    """Put the file's data on disk so its pages are clean and DONTNEED can drop them.

    sync_file_range writes the data without a journal commit (much cheaper than fdatasync); where
    it is missing or refused, fdatasync.
    """
    if _sync_file_range is not None and _sync_file_range(fd, 0, 0, _SYNC_FILE_RANGE_ALL) == 0:
        return
    os.fdatasync(fd)


def advise(fd: int, advice: int, off: int = 0, size: int = 0) -> None:
    with contextlib.suppress(OSError):  # advice only; some filesystems refuse it
        os.posix_fadvise(fd, off, size, advice)


def drop_cache(fd: int, off: int = 0, size: int = 0) -> None:
    advise(fd, os.POSIX_FADV_DONTNEED, off, size)


def write_atomic(
    final: str,
    tmp: str,
    data: bytes | memoryview,
    clean_cache: bool,
    before_rename: Callable[[], None] | None = None,
) -> int:
    """Write ``data`` to ``tmp``, then rename it to ``final``; returns the bytes allocated on disk.

    The rename makes a file at ``final`` always whole: a crash leaves only a temporary name, which
    the next open removes.  ``before_rename`` runs once the data is written (the journal record a
    final name needs).  On any error the temporary file is removed and the error raised.
    O_NONBLOCK: a FIFO someone left at the temporary name fails the open (ENXIO) instead of
    blocking the writer forever; the fstat then refuses anything but a regular file.
    """
    view = memoryview(data).cast("B")
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK
    try:
        fd = os.open(tmp, flags, 0o600)
    except OSError:
        unlink_quiet(tmp)
        raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EIO, f"{tmp} is not a regular file")
        done = 0
        while done < len(view):
            done += os.pwrite(fd, view[done : done + _MAX_PREAD], done)
        if clean_cache:
            write_back(fd)
            drop_cache(fd)
        allocated = os.fstat(fd).st_blocks * 512
        if before_rename is not None:
            before_rename()
    except BaseException:
        os.close(fd)
        unlink_quiet(tmp)
        raise
    os.close(fd)
    try:
        os.rename(tmp, final)
    except BaseException:
        unlink_quiet(tmp)
        raise
    return allocated


def pread_exact(fd: int, off: int, size: int) -> bytes | None:
    """``size`` bytes at ``off``, or None if the file ends first."""
    first = os.pread(fd, min(size, _MAX_PREAD), off)
    if len(first) == size:
        return first
    parts = [first]
    got = len(first)
    while got < size:
        chunk = os.pread(fd, min(size - got, _MAX_PREAD), off + got)
        if not chunk:
            return None
        parts.append(chunk)
        got += len(chunk)
    return b"".join(parts)


def read_verified(
    path: str, digests: BlockDigests, start: int, end: int, clean_cache: bool
) -> tuple[bytes | None, str | None]:
    """Bytes [start, end) of a tier file (block-aligned range), checked against ``digests``.

    Returns (data, None), or (None, why) when the file is missing, is not a regular file, has the
    wrong size or fails its digests.  Other I/O errors are raised.  O_NONBLOCK: a FIFO (or device)
    in place of a copy must not block the reader; it is refused as damage.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return None, "file missing"
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENXIO, errno.EACCES, errno.EPERM):
            return None, f"cannot be opened ({exc.strerror})"
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None, "not a regular file"
        st_size = st.st_size
        if st_size != digests.size:
            return None, f"size {st_size}, recorded {digests.size}"
        if clean_cache and end - start < digests.size:
            advise(fd, os.POSIX_FADV_RANDOM)  # no read-ahead past the range
        data = pread_exact(fd, start, end - start)
        if clean_cache:
            drop_cache(fd, start, end - start)
    finally:
        os.close(fd)
    if data is None:
        return None, "file shorter than its size"
    if not digests.verify(data, start // BLOCK):
        return None, f"digest mismatch in bytes {start}..{end}"
    return data, None


def unlink_quiet(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def is_enospc(exc: OSError) -> bool:
    return exc.errno in (errno.ENOSPC, errno.EDQUOT)
