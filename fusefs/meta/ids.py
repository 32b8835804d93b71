"""The ID spaces a file has, and the one conversion between them that the kernel sees.

* entry: a row of the snapshot (:mod:`fusefs.meta.snapshot`), 0 = the source's root.
* inode: what the kernel knows a file by: ``entry + 1`` (FUSE's root inode is 1).
* gid: a file's position in the job's datasets (dataset offset + catalog index); the planner's id.
* object: what tiers cache; one per entry, several gids may share one (a symlinked directory).

PERSISTED.md (ID spaces) describes them all; only entry <-> inode is arithmetic, the rest are plan columns.
"""

from __future__ import annotations

ROOT_INODE = 1
"""FUSE's root inode (``pyfuse3.ROOT_INODE``); kept here so the read path needs no pyfuse3 for it."""


def inode_of(entry: int) -> int:
    return entry + ROOT_INODE


def entry_of(inode: int) -> int:
    return inode - ROOT_INODE
