"""A source file's identity: what a cached copy records it was made from, and is served only while it matches.

Why these four fields: size and mtime catch an ordinary rewrite; ctime also catches a rewrite whose
writer restored the old mtime (``touch -d``, ``rsync -t``, ``cp -p``), since on a POSIX filesystem
the kernel sets ctime on every change and no user can set it; the inode number catches a file
replaced by another one under the same name (``mv new old``, which is how most tools write files
atomically), even when size and times happen to agree.

What a stat cannot see: a rewrite in place that keeps the size and puts the mtime back, on a source
that does not maintain ctime (object-store FUSE clients, which derive it from an object's metadata
that a writer sets, not from a change the kernel saw; bindfs ``--ctime-from-mtime``): there all four
fields stay as they were.  Likewise a same-size rewrite within one tick of the filesystem's
timestamps after the stat the snapshot recorded.  ``snapshot.identity: content`` covers both by
comparing the source's bytes with a copy's block digests each round (fusefs/readpath/revalidate.py),
at the cost of reading them; seerfs.yaml(5) says how much.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

INO_MASK = (1 << 64) - 1


@dataclass(frozen=True, slots=True)
class SourceId:
    """The identity of one source file (an inode number as unsigned 64-bit)."""

    size: int
    mtime_ns: int
    ctime_ns: int
    ino: int

    @classmethod
    def of(cls, st: os.stat_result) -> SourceId:
        return cls(st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino & INO_MASK)

    def change_from(self, recorded: SourceId) -> str | None:
        """Why this (fresh) identity differs from ``recorded``, in words; None when it matches."""
        if self.size != recorded.size:
            return f"size changed from {recorded.size} to {self.size}"
        if self.ino != recorded.ino:
            return "replaced by another file (inode changed)"
        if self.mtime_ns != recorded.mtime_ns:
            return "modified (mtime changed)"
        if self.ctime_ns != recorded.ctime_ns:
            return "modified (ctime changed)"
        return None


@dataclass(frozen=True)
class SourceColumns:
    """The identities of every snapshot entry, as columns (the snapshot's own arrays, not copies)."""

    size: npt.NDArray[np.int64]
    mtime_ns: npt.NDArray[np.int64]
    ctime_ns: npt.NDArray[np.int64]
    ino: npt.NDArray[np.uint64]

    def __len__(self) -> int:
        return int(self.size.shape[0])

    def of(self, entry: int) -> SourceId:
        return SourceId(
            int(self.size[entry]), int(self.mtime_ns[entry]), int(self.ctime_ns[entry]), int(self.ino[entry])
        )

    def matches(
        self,
        entries: npt.NDArray[Any],
        size: npt.NDArray[Any],
        mtime_ns: npt.NDArray[Any],
        ctime_ns: npt.NDArray[Any],
        ino: npt.NDArray[Any],
    ) -> npt.NDArray[np.bool_]:
        """Per row: does a copy of ``entries[i]`` with these recorded fields match the snapshot?"""
        inside = entries < len(self)
        e = np.where(inside, entries, 0)
        ok: npt.NDArray[np.bool_] = (
            inside
            & (self.size[e] == size)
            & (self.mtime_ns[e] == mtime_ns)
            & (self.ctime_ns[e] == ctime_ns)
            & (self.ino[e] == ino.astype(np.uint64))
        )
        return ok
