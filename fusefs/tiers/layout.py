"""Where the directory tier keeps what, and how it recognises its own files.

Layout under the tier path::

    seerfs.lock            empty; flock-ed while a daemon uses the directory
    seerfs-index.npz       the persisted index (index.py)
    00/ .. ff/             fan-out by entry % 256, so no directory holds millions of names
        <entry>            one cached file, named by its snapshot entry index (decimal)
        <entry>.tmp        being written; renamed to <entry> when complete

Only names of exactly these shapes are ever deleted: a tier path that also holds other files
keeps them.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path

FANOUT = 256
LOCK_NAME = "seerfs.lock"
TMP_SUFFIX = ".tmp"
_SUBDIR_RE = re.compile(r"^[0-9a-f]{2}$")
_FILE_RE = re.compile(r"^(0|[1-9][0-9]*)(\.tmp)?$")
DEFAULT_ALLOC = 4096


def subdir_name(entry: int) -> str:
    return f"{entry % FANOUT:02x}"


def file_path(root: Path, entry: int) -> str:
    return f"{root}/{entry % FANOUT:02x}/{entry}"


def tmp_path(root: Path, entry: int) -> str:
    return file_path(root, entry) + TMP_SUFFIX


def alloc_unit(root: Path) -> int:
    """The filesystem's allocation unit: file sizes are charged rounded up to it (at least 4 KiB)."""
    try:
        frsize = os.statvfs(root).f_frsize
    except OSError:
        return DEFAULT_ALLOC
    if frsize <= 0 or frsize & (frsize - 1) or frsize > (1 << 16):
        return DEFAULT_ALLOC
    return max(DEFAULT_ALLOC, frsize)


@dataclass
class SubdirScan:
    """Our names found in one fan-out directory."""

    dir_bytes: int = 0  # the directory's own allocated bytes (0 when missing)
    foreign_bytes: int = 0  # allocated bytes of names that are not ours (kept, but charged)
    files: dict[int, tuple[int, int]] = field(default_factory=dict)  # entry -> (size, allocated bytes)
    temporary: list[str] = field(default_factory=list)  # leftover <entry>.tmp paths


def scan_subdir(root: Path, name: str) -> SubdirScan:
    """List one fan-out directory (blocking; runs in a thread pool at open)."""
    out = SubdirScan()
    path = root / name
    try:
        out.dir_bytes = os.lstat(path).st_blocks * 512
        it = os.scandir(path)
    except FileNotFoundError:
        return out
    with it:
        for de in it:
            m = _FILE_RE.match(de.name)
            st = de.stat(follow_symlinks=False)
            if m is None or not stat.S_ISREG(st.st_mode):
                is_dir = stat.S_ISDIR(st.st_mode)
                out.foreign_bytes += disk_usage(Path(de.path)) if is_dir else st.st_blocks * 512
                continue
            if m.group(2):
                out.temporary.append(de.path)
            else:
                out.files[int(m.group(1))] = (st.st_size, st.st_blocks * 512)
    return out


def subdir_names() -> list[str]:
    return [f"{i:02x}" for i in range(FANOUT)]


def foreign_top_level(root: Path, ours: set[str]) -> int:
    """Allocated bytes of what sits in the tier directory beside our names (never deleted)."""
    total = 0
    with os.scandir(root) as it:
        for de in it:
            if de.name in ours or _SUBDIR_RE.match(de.name):
                continue
            st = de.stat(follow_symlinks=False)
            total += disk_usage(Path(de.path)) if stat.S_ISDIR(st.st_mode) else st.st_blocks * 512
    return total


def disk_usage(path: Path) -> int:
    """What ``du -s --block-size=1`` reports: allocated bytes of everything under ``path``
    (the directory itself included), hard links counted once, symlinks not followed."""
    seen: set[tuple[int, int]] = set()
    total = 0
    stack = [str(path)]
    first = True
    while stack:
        top = stack.pop()
        if first:
            st = os.lstat(top)
            seen.add((st.st_dev, st.st_ino))
            total += st.st_blocks * 512
            first = False
        try:
            it = os.scandir(top)
        except OSError:
            continue
        with it:
            for de in it:
                try:
                    st = de.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                if st.st_nlink > 1 or stat.S_ISDIR(st.st_mode):  # only these can be met twice
                    key = (st.st_dev, st.st_ino)
                    if key in seen:
                        continue
                    seen.add(key)
                total += st.st_blocks * 512
                if stat.S_ISDIR(st.st_mode):
                    stack.append(de.path)
    return total
