"""Reference FUSE filesystems the benchmarks set seerfs beside: the least a pyfuse3 daemon costs, and mergerfs.

``pyfuse3 floor`` is a read-only passthrough that does nothing per request beyond what pyfuse3 needs (open
replies keep_cache at once; no bookkeeping) on the same pyfuse3 + trio loop as seerfs: whatever seerfs
costs above it is seerfs's own work; what it costs above the files' own page cache is FUSE's and
pyfuse3's, which no pyfuse3 filesystem can avoid.  mergerfs is a C passthrough, the same FUSE round
trips without Python.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pyfuse3
import trio

from tools.harness.mounts import force_unmount, is_mounted, wait_for

ROOT = Path(__file__).resolve().parents[2]

# Page cache kept across opens while mtime and size are unchanged, and lookups cached as long as
# seerfs and rclone cache them here: mergerfs at its fastest for read-only small files.
MERGERFS_OPTIONS = (
    "cache.files=auto-full,cache.entry=3600,cache.attr=3600,cache.negative_entry=3600,"
    "cache.readdir=true,dropcacheonclose=false,fsname=ceiling-mergerfs"
)


class MountError(Exception):
    """A reference filesystem did not mount: one line for the user."""


class FloorOperations(pyfuse3.Operations):
    """Read-only passthrough doing the least per request: what any pyfuse3 daemon pays, seerfs included."""

    def __init__(self, source: str) -> None:
        super().__init__()
        self.paths: dict[int, bytes] = {pyfuse3.ROOT_INODE: os.fsencode(source)}
        self.inodes: dict[bytes, int] = {}
        self.opened: dict[int, int] = {}  # fh -> inode
        self.numbers = itertools.count(pyfuse3.ROOT_INODE + 1)
        self.fhs = itertools.count(1)

    def attrs(self, inode: int) -> pyfuse3.EntryAttributes:
        st = os.lstat(self.paths[inode])
        a = pyfuse3.EntryAttributes()
        a.st_ino = pyfuse3.InodeT(inode)
        a.entry_timeout = a.attr_timeout = 86400.0  # as seerfs: the tree does not change
        a.st_mode = pyfuse3.ModeT(st.st_mode)
        a.st_nlink, a.st_uid, a.st_gid, a.st_size = st.st_nlink, st.st_uid, st.st_gid, st.st_size
        a.st_blksize, a.st_blocks = 128 * 1024, (st.st_size + 511) // 512
        a.st_atime_ns, a.st_mtime_ns, a.st_ctime_ns = st.st_atime_ns, st.st_mtime_ns, st.st_ctime_ns
        return a

    def inode_of(self, parent_inode: int, name: bytes) -> int:
        path = self.paths[parent_inode] + b"/" + name
        inode = self.inodes.get(path)
        if inode is None:
            if not os.path.lexists(path):
                raise pyfuse3.FUSEError(errno.ENOENT)
            inode = self.inodes[path] = next(self.numbers)
            self.paths[inode] = path
        return inode

    async def lookup(self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        return self.attrs(self.inode_of(parent_inode, name))

    async def opendir(self, inode: int, ctx: pyfuse3.RequestContext) -> pyfuse3.FileHandleT:
        return pyfuse3.FileHandleT(inode)

    async def readdir(self, fh: int, start_id: int, token: pyfuse3.ReaddirToken) -> None:
        """Entries in name order; ``start_id`` is how many were already given (a listing is read once)."""
        names = sorted(os.listdir(self.paths[fh]))
        for k, name in enumerate(names[start_id:], start_id + 1):
            attrs = self.attrs(self.inode_of(fh, os.fsencode(name)))
            if not pyfuse3.readdir_reply(token, os.fsencode(name), attrs, k):
                break

    async def getattr(self, inode: int, ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        return self.attrs(inode)

    async def open(self, inode: int, flags: int, ctx: pyfuse3.RequestContext) -> pyfuse3.FileInfo:
        fh = next(self.fhs)
        self.opened[fh] = inode
        return pyfuse3.FileInfo(fh=pyfuse3.FileHandleT(fh), keep_cache=True)

    async def read(self, fh: int, off: int, size: int) -> bytes:
        fd = os.open(self.paths[self.opened[fh]], os.O_RDONLY)  # cold pass only: later reads hit the page cache
        try:
            return os.pread(fd, size, off)
        finally:
            os.close(fd)

    async def release(self, fh: int) -> None:
        self.opened.pop(fh, None)


def serve_floor(source: str, mountpoint: str) -> None:
    """The pyfuse3 floor's daemon, in the process :func:`command` starts."""
    pyfuse3.init(FloorOperations(source), mountpoint, set(pyfuse3.default_options) | {"fsname=ceiling-pyfuse3"})
    try:
        trio.run(pyfuse3.main, 2, 64)  # seerfs's min_tasks and default fuse.max_tasks
    finally:
        pyfuse3.close(unmount=True)


def command(source: Path, mountpoint: Path) -> list[str]:
    """The command line of a pyfuse3 floor serving ``source`` at ``mountpoint`` in the foreground."""
    code = "import sys; from tools.bench.floorfs import serve_floor; serve_floor(sys.argv[1], sys.argv[2])"
    return [sys.executable, "-c", code, str(source), str(mountpoint)]


def mergerfs_command(source: Path, mountpoint: Path) -> list[str] | None:
    """mergerfs serving ``source`` at ``mountpoint`` in the foreground, or None where it is not installed."""
    exe = shutil.which("mergerfs")
    return None if exe is None else [exe, "-f", "-o", MERGERFS_OPTIONS, str(source), str(mountpoint)]


@contextlib.contextmanager
def foreground(cmd: list[str], mnt: Path, what: str) -> Iterator[subprocess.Popen[bytes]]:
    """A filesystem process serving in the foreground at ``mnt`` (made here); unmounted and stopped in all cases."""
    mnt.mkdir()
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_for(lambda: is_mounted(mnt) or proc.poll() is not None, timeout=30, what=f"{what} mount")
        if proc.poll() is not None:
            err = proc.stderr.read().decode().strip() if proc.stderr else ""
            raise MountError(f"{what} exited {proc.returncode}: {err[-500:]}")
        yield proc
    finally:
        force_unmount(mnt)
        stop(proc)


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
