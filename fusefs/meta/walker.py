"""Walk a source tree once, level by level, with a thread pool, into compact per-directory chunks.

Why level-synchronous BFS: it gives every directory's children a contiguous index range (the
layout :class:`placement.tree.TreeArrays` promises) while letting many directories be scanned at
once, which is what hides a PFS's metadata latency.  Each scanned directory is packed into numpy
arrays inside the worker thread, so the walk of a huge tree never holds a Python object per file
beyond the directory currently being scanned.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from fusefs.progress import Progress
from placement.tree import KIND_DIR, KIND_FILE, KIND_OTHER, KIND_SYMLINK

# Columns recorded per entry, in this order, by scan_dir.
STAT_FIELDS = ("mode", "uid", "gid", "nlink", "size", "atime_ns", "mtime_ns", "ctime_ns", "ino")
"""The inode number is kept as the same 64 bits in a signed column (``ino_bits``); the snapshot stores it
unsigned.  With size, mtime and ctime it is a file's identity (:mod:`fusefs.meta.identity`)."""


def ino_bits(ino: int) -> int:
    """An unsigned 64-bit inode number as the signed int64 with the same bits."""
    return ino - (1 << 64) if ino >= 1 << 63 else ino


@dataclass
class DirChunk:
    """One directory's children, sorted by name bytes, packed so a huge level holds few objects."""

    blob: bytes  # the names, concatenated
    lens: npt.NDArray[np.uint8]  # name lengths (NAME_MAX is 255)
    kind: npt.NDArray[np.uint8]
    stats: npt.NDArray[np.int64]  # shape (k, len(STAT_FIELDS))
    links: dict[int, bytes]  # position in this chunk -> symlink target bytes
    error: str | None = None  # why the directory could not be listed (it is then served empty)

    def __len__(self) -> int:
        return int(self.lens.shape[0])

    def names(self) -> Iterator[bytes]:
        off = 0
        for n in self.lens.tolist():
            yield self.blob[off : off + n]
            off += n


def _kind(mode: int) -> int:
    if stat.S_ISDIR(mode):
        return KIND_DIR
    if stat.S_ISREG(mode):
        return KIND_FILE
    if stat.S_ISLNK(mode):
        return KIND_SYMLINK
    return KIND_OTHER


def stat_row(st: os.stat_result) -> tuple[int, ...]:
    return (
        st.st_mode,
        st.st_uid,
        st.st_gid,
        st.st_nlink,
        st.st_size,
        st.st_atime_ns,
        st.st_mtime_ns,
        st.st_ctime_ns,
        ino_bits(st.st_ino),
    )


def _empty(error: str | None = None) -> DirChunk:
    return DirChunk(
        b"",
        np.zeros(0, np.uint8),
        np.zeros(0, np.uint8),
        np.zeros((0, len(STAT_FIELDS)), np.int64),
        {},
        error,
    )


def scan_dir(path: bytes) -> DirChunk:
    """List one directory with lstat of each entry; entries that vanish meanwhile are skipped."""
    rows: list[tuple[bytes, tuple[int, ...]]] = []
    links: dict[bytes, bytes] = {}
    try:
        with os.scandir(path) as it:
            for entry in it:
                try:
                    st = entry.stat(follow_symlinks=False)
                    if stat.S_ISLNK(st.st_mode):
                        links[entry.name] = os.readlink(entry.path)
                except OSError:
                    continue  # vanished or unreadable while we listed: not part of the snapshot
                rows.append((entry.name, stat_row(st)))
    except OSError as exc:
        return _empty(f"{os.fsdecode(path)}: {exc.strerror}")
    if not rows:
        return _empty()
    rows.sort(key=lambda r: r[0])
    names = [r[0] for r in rows]
    stats = np.array([r[1] for r in rows], dtype=np.int64).reshape(len(rows), len(STAT_FIELDS))
    kind = np.fromiter((_kind(m) for m in stats[:, 0].tolist()), dtype=np.uint8, count=len(rows))
    lens = np.fromiter((len(n) for n in names), dtype=np.uint8, count=len(rows))
    pos_links = {i: links[n] for i, n in enumerate(names) if n in links}
    return DirChunk(b"".join(names), lens, kind, stats, pos_links)


def walk_levels(
    root: bytes, threads: int, progress: Progress | None = None
) -> Iterator[tuple[list[int], list[DirChunk]]]:
    """Yield, level by level, (directory indices, their chunks) in index order.

    Indices are assigned BFS: the root is 0 and each level's children follow, grouped by parent in
    parent-index order.  The caller assigns child indices from the chunk lengths.  ``progress``
    counts entries as each directory is scanned, not per level: an ImageFolder tree is two levels.
    """

    def scan(path: bytes) -> DirChunk:
        chunk = scan_dir(path)
        if progress is not None:
            progress.add(len(chunk))
        return chunk

    next_index = 1
    level: list[tuple[int, bytes]] = [(0, root)]
    with ThreadPoolExecutor(max_workers=max(1, threads), thread_name_prefix="walk") as pool:
        while level:
            chunks = list(pool.map(scan, (p for _, p in level), chunksize=max(1, len(level) // (threads * 8))))
            yield [i for i, _ in level], chunks
            nxt: list[tuple[int, bytes]] = []
            for (_, dpath), chunk in zip(level, chunks, strict=True):
                base = next_index
                next_index += len(chunk)
                if not (chunk.kind == KIND_DIR).any():
                    continue
                for pos, (name, kind) in enumerate(zip(chunk.names(), chunk.kind.tolist(), strict=True)):
                    if kind == KIND_DIR:
                        nxt.append((base + pos, os.path.join(dpath, name)))
            level = nxt


def stat_paths(paths: Iterable[bytes], threads: int) -> list[tuple[int, ...] | None]:
    """lstat many paths in parallel (None where it fails): the fingerprint check."""

    def one(p: bytes) -> tuple[int, ...] | None:
        try:
            st = os.lstat(p)
        except OSError:
            return None
        return (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_ctime_ns, st.st_mode)

    items = list(paths)
    with ThreadPoolExecutor(max_workers=max(1, threads), thread_name_prefix="fprint") as pool:
        return list(pool.map(one, items, chunksize=max(1, len(items) // (threads * 8))))
