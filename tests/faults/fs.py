"""Small filesystems to fill up: tmpfs with a size limit, mounted for the duration of a block."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path


def can_mount_tmpfs() -> str | None:
    """Why a sized tmpfs cannot be mounted here (None: it can)."""
    if os.geteuid() != 0:
        return "mounting tmpfs needs root"
    if shutil.which("mount") is None:
        return "mount(8) not found"
    return None


@contextlib.contextmanager
def small_tmpfs(path: Path, size: str = "4m") -> Iterator[Path]:
    """A tmpfs of ``size`` at ``path`` (created); always unmounted on exit (lazily if busy)."""
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        if subprocess.run(["umount", str(path)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(path)], capture_output=True)


def fill(path: Path, name: str = "filler", keep_free: int = 0) -> Path:
    """Write a file under ``path`` until the filesystem is full (ENOSPC); returns the filler file.

    ``keep_free`` bytes are given back afterwards (truncating the filler), for "almost full"."""
    filler = path / name
    chunk = b"\0" * (64 << 10)
    with open(filler, "wb", buffering=0) as fh:
        try:
            while True:
                fh.write(chunk)
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise
    # small writes too, until not one more byte fits
    with open(filler, "ab", buffering=0) as fh, contextlib.suppress(OSError):
        while True:
            if not fh.write(b"\0" * 512):
                break
    if keep_free:
        os.truncate(filler, max(0, filler.stat().st_size - keep_free))
    return filler


def free_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize
