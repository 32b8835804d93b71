"""Types of the C extension ``fusefs/fuse/_native.c`` (the native front's binding)."""

from collections.abc import Sequence
from typing import Any

Buffer = bytes | bytearray | memoryview

OP_END: int
OP_INIT: int
OP_LOOKUP: int
OP_GETATTR: int
OP_SETATTR: int
OP_READLINK: int
OP_MKNOD: int
OP_MKDIR: int
OP_UNLINK: int
OP_RMDIR: int
OP_SYMLINK: int
OP_RENAME: int
OP_LINK: int
OP_OPEN: int
OP_READ: int
OP_WRITE: int
OP_RELEASE: int
OP_OPENDIR: int
OP_READDIR: int
OP_READDIRPLUS: int
OP_RELEASEDIR: int
OP_STATFS: int
OP_SETXATTR: int
OP_GETXATTR: int
OP_LISTXATTR: int
OP_REMOVEXATTR: int
OP_CREATE: int
EV_OPEN: int
EV_RELEASE: int
EV_BATCH: int
EV_VISIT: int
NATIVE_FH_BASE: int
FUSE_SET_ATTR_SIZE: int
FUSE_SET_ATTR_MODE: int
FUSE_SET_ATTR_UID: int
FUSE_SET_ATTR_GID: int

class EntryAttributes:
    st_ino: int
    generation: int
    entry_timeout: float
    attr_timeout: float
    st_mode: int
    st_nlink: int
    st_uid: int
    st_gid: int
    st_rdev: int
    st_size: int
    st_blksize: int
    st_blocks: int
    st_atime_ns: int
    st_ctime_ns: int
    st_mtime_ns: int

class DirBuffer:
    def add(self, name: bytes, attrs: object, next_id: int, /) -> bool: ...
    def reply(self) -> None: ...

# A forwarded request: (op, req, a0..a7, s1, s2, uid, gid, pid, umask); a run of consecutive events:
# (EV_BATCH, 0, [opened, inode, fh, pid, ...]) in ring order (opened: 1 for an OPEN, 2 for an OPEN by one of
# the daemon's own threads, i.e. a read back through the mount, 0 for a RELEASE, 3 for a visit: an OPEN and
# its RELEASE folded into one).  Typed as the first, which
# is what the handlers index.
Record = tuple[int, int, int, int, int, int, int, int, int, int, bytes, bytes, int, int, int, int]

def mount(mountpoint: str, options: str, inodes: int, ring: int = 4096, no_open: bool = False, /) -> int: ...
def set_attrs(columns: Sequence[object], blksize: int, attr_timeout: float, /) -> None: ...
def start() -> None: ...
def stop() -> None: ...
def unmount() -> None: ...
def drain(most: int, /) -> list[Record]: ...
def fold_events(records: Sequence[tuple[int, int, int, int, int]], /) -> list[tuple[Any, ...]]: ...
def reply_err(req: int, err: int, /) -> None: ...
def reply_none(req: int, /) -> None: ...
def reply_entry(req: int, attrs: object, /) -> None: ...
def reply_attr(req: int, attrs: object, /) -> None: ...
def reply_open(req: int, fh: int, direct_io: bool, keep_cache: bool, /) -> None: ...
def reply_data(req: int, data: Buffer, /) -> None: ...
def reply_write(req: int, count: int, /) -> None: ...
def reply_xattr(req: int, size: int, /) -> None: ...
def reply_readlink(req: int, target: bytes, /) -> None: ...
def reply_statfs(
    req: int,
    bsize: int,
    frsize: int,
    blocks: int,
    bfree: int,
    bavail: int,
    files: int,
    ffree: int,
    favail: int,
    namemax: int,
    /,
) -> None: ...
def dir_buffer(req: int, size: int, plus: bool, /) -> DirBuffer: ...
def notify_store(inode: int, offset: int, data: Buffer, /) -> None: ...
def invalidate_inode(inode: int, /) -> None: ...
def invalidate_entry(parent: int, name: bytes, /) -> None: ...
def set_pages(inode: int, pushed: bool, /) -> None: ...
def watch(mountpoint: str, dirs: list[bytes], /) -> bool: ...
def stats() -> dict[str, int]: ...
