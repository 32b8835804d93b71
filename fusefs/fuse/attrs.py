"""EntryAttributes for snapshot entries: what the kernel caches for ``entry_timeout``/``attr_timeout``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from numpy.typing import NDArray

from fusefs.fuse.front import EntryAttributes, PlainAttributes
from fusefs.meta.ids import inode_of
from fusefs.meta.snapshot import Snapshot

BLKSIZE = 128 * 1024  # hints buffered readers to ask for FUSE's whole 128 KiB request size


class AttrFactory:
    def __init__(
        self,
        snapshot: Snapshot,
        entry_timeout: float,
        attr_timeout: float,
        new_attrs: Callable[[], EntryAttributes] = PlainAttributes,
    ) -> None:
        self.snapshot = snapshot
        self.new = new_attrs  # the front's attribute record (pyfuse3 takes only its own)
        self.entry_timeout = entry_timeout
        self.attr_timeout = attr_timeout

    def columns(self) -> tuple[NDArray[np.integer[Any]], ...]:
        """The snapshot's arrays every entry's attributes come from, in the order the native front
        answers GETATTR from them (``_native.set_attrs``: mode, nlink, uid, gid, size, atime_ns,
        mtime_ns, ctime_ns); with :data:`BLKSIZE` and ``attr_timeout`` they give what
        :meth:`__call__` gives."""
        s = self.snapshot
        t = s.tree
        return (s.mode, s.nlink, s.uid, s.gid, t.size, s.atime_ns, t.mtime_ns, s.ctime_ns)

    def batch(self, lo: int, hi: int) -> list[EntryAttributes]:
        """PlainAttributes of consecutive entries ``lo:hi``: columns converted once, not per field."""
        s = self.snapshot
        t = s.tree
        rows = zip(
            range(inode_of(lo), inode_of(hi)),
            s.mode[lo:hi].tolist(),
            s.nlink[lo:hi].tolist(),
            s.uid[lo:hi].tolist(),
            s.gid[lo:hi].tolist(),
            t.size[lo:hi].tolist(),
            s.atime_ns[lo:hi].tolist(),
            t.mtime_ns[lo:hi].tolist(),
            s.ctime_ns[lo:hi].tolist(),
            strict=True,
        )
        new = self.new
        out = []
        for ino, mode, nlink, uid, gid, size, atime, mtime, ctime in rows:
            a = new()
            a.st_ino = ino
            a.entry_timeout = self.entry_timeout
            a.attr_timeout = self.attr_timeout
            a.st_mode = mode
            a.st_nlink = nlink
            a.st_uid = uid
            a.st_gid = gid
            a.st_size = size
            a.st_blksize = BLKSIZE
            a.st_blocks = (size + 511) // 512
            a.st_atime_ns = atime
            a.st_mtime_ns = mtime
            a.st_ctime_ns = ctime
            out.append(a)
        return out

    def __call__(self, entry: int) -> EntryAttributes:
        s = self.snapshot
        t = s.tree
        a = self.new()
        a.st_ino = inode_of(entry)
        a.generation = 0
        a.entry_timeout = self.entry_timeout
        a.attr_timeout = self.attr_timeout
        a.st_mode = int(s.mode[entry])
        a.st_nlink = int(s.nlink[entry])
        a.st_uid = int(s.uid[entry])
        a.st_gid = int(s.gid[entry])
        size = int(t.size[entry])
        a.st_size = size
        a.st_blksize = BLKSIZE
        a.st_blocks = (size + 511) // 512
        a.st_atime_ns = int(s.atime_ns[entry])
        a.st_mtime_ns = int(t.mtime_ns[entry])
        a.st_ctime_ns = int(s.ctime_ns[entry])
        return a
