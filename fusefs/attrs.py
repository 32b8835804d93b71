"""EntryAttributes for snapshot entries: what the kernel caches for ``entry_timeout``/``attr_timeout``."""

from __future__ import annotations

import pyfuse3

from .snapshot import Snapshot

BLKSIZE = 128 * 1024  # hints buffered readers to ask for FUSE's whole 128 KiB request size


def inode_of(entry: int) -> int:
    return entry + pyfuse3.ROOT_INODE


def entry_of(inode: int) -> int:
    return inode - pyfuse3.ROOT_INODE


class AttrFactory:
    def __init__(self, snapshot: Snapshot, entry_timeout: float, attr_timeout: float) -> None:
        self.snapshot = snapshot
        self.entry_timeout = entry_timeout
        self.attr_timeout = attr_timeout

    def __call__(self, entry: int) -> pyfuse3.EntryAttributes:
        s = self.snapshot
        t = s.tree
        a = pyfuse3.EntryAttributes()
        a.st_ino = pyfuse3.InodeT(inode_of(entry))
        a.generation = 0
        a.entry_timeout = self.entry_timeout
        a.attr_timeout = self.attr_timeout
        a.st_mode = pyfuse3.ModeT(int(s.mode[entry]))
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
