"""The hidden ``.control/`` directory: ``seed`` (read-write), ``status`` (JSON) and ``config`` (YAML).

``.control`` is reachable by lookup but never listed by the root's readdir: ImageFolder would make a
listed ``.control`` class 0 and shift every label (its order: :mod:`placement.catalog`).  ``status``
and ``config`` are opened with ``direct_io`` so ``cat`` always sees fresh, whole text; their content
is rendered once per open so a reader paging through it sees one consistent document.  Only the
mounting user and root may write ``seed`` (the kernel enforces the 0644 mode under
default_permissions; open re-checks).

Whatever is written, at whatever offset, in however many writes: the seed is the whole text of the
handle (at most ``MAX_SEED_TEXT`` bytes, so a write past that is refused before anything is
allocated), every write that leaves it not a seed fails with EINVAL and the reason in status, and a
write that leaves it a seed adopts it.

``fuse.no_open`` (:meth:`ControlFiles.serve_by_inode`): the kernel then opens files without asking,
keeps their pages and sends READ and WRITE without a handle.  ``status`` is then rendered when the
kernel asks its attributes (at most once a second: ``attr_timeout``), its size is the document's and
its mtime the render's, so the kernel drops the old pages (libfuse's default ``auto_inval_data``) and
reads the new document: a ``cat`` sees one whole document at most a second old.  ``seed`` is written
through one handle per mount: a truncate to 0 (``O_TRUNC``, a SETATTR in this mode: the native front
turns atomic O_TRUNC off) starts its text afresh.  An open cannot fail here, so a write to ``status``
or ``config`` (root passes the mode check) fails at the write, with EACCES.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import time
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import NoReturn

from fusefs.errors import FsError
from fusefs.fuse.front import ROOT_INODE, EntryAttributes, PlainAttributes, RequestContext
from fusefs.planning.seed import MAX_SEED_TEXT, SeedState, SeedSyntaxError, parse_seed

CONTROL_NAME = b".control"
# Far above any snapshot inode (entries are < 2**32), so the two ranges never meet.
CTL_DIR = 1 << 48
CTL_SEED = CTL_DIR + 1
CTL_STATUS = CTL_DIR + 2
CTL_CONFIG = CTL_DIR + 3
_FILES = {b"seed": CTL_SEED, b"status": CTL_STATUS, b"config": CTL_CONFIG}
_NAMES = {v: k for k, v in _FILES.items()}


@dataclass
class ControlHandle:
    inode: int
    content: bytes = b""
    writable: bool = False
    buffer: bytearray = field(default_factory=bytearray)


class ControlFiles:
    def __init__(
        self,
        seed: SeedState,
        status: Callable[[], Mapping[str, object]],
        config_yaml: str,
        uid: int,
        gid: int,
        started_ns: int,
        timeout: float,
        new_attrs: Callable[[], EntryAttributes] = PlainAttributes,
    ) -> None:
        self.seed = seed
        self.status = status
        self.config_yaml = config_yaml.encode()
        self.uid, self.gid = uid, gid
        self.started_ns = started_ns
        self.timeout = timeout
        self.new_attrs = new_attrs  # the front's attribute record
        self.by_inode = False  # fuse.no_open armed: no OPEN, READ/WRITE by inode
        self._docs: dict[int, tuple[bytes, int]] = {}  # by inode: (content, mtime_ns) last given to the kernel
        self._writer: ControlHandle | None = None  # the seed's text being written (by inode)

    def serve_by_inode(self) -> list[int]:
        """No OPEN will reach the daemon (``fuse.no_open``): serve by inode; the files' inodes."""
        self.by_inode = True
        return [CTL_SEED, CTL_STATUS, CTL_CONFIG]

    def _doc(self, inode: int, fresh: bool) -> tuple[bytes, int]:
        """The content the kernel is told about for ``inode`` (by inode only); ``fresh``: render it now."""
        if inode == CTL_STATUS:
            doc = self._docs.get(inode)
            if fresh or doc is None:
                content = (json.dumps(self.status(), indent=1, sort_keys=False) + "\n").encode()
                doc = self._docs[inode] = (content, max(time.time_ns(), doc[1] + 1 if doc else 0))
            return doc
        content = self.config_yaml if inode == CTL_CONFIG else self.seed.content()
        return content, self.started_ns + zlib.crc32(content)  # a changed seed changes the mtime too

    @staticmethod
    def owns(inode: int) -> bool:
        return CTL_DIR <= inode <= CTL_CONFIG

    def lookup(self, parent: int, name: bytes) -> int | None:
        if parent == ROOT_INODE and name == CONTROL_NAME:
            return CTL_DIR
        if parent == CTL_DIR:
            return _FILES.get(name)
        return None

    def entries(self) -> list[tuple[bytes, int]]:
        return sorted(_FILES.items())

    def attrs(self, inode: int) -> EntryAttributes:
        a = self.new_attrs()
        a.st_ino = inode
        a.st_uid, a.st_gid = self.uid, self.gid
        a.st_atime_ns = a.st_mtime_ns = a.st_ctime_ns = self.started_ns
        a.st_blksize = 4096
        # Short timeouts: the seed's size changes when it is rewritten.
        a.entry_timeout = self.timeout
        a.attr_timeout = 1.0
        if inode == CTL_DIR:
            a.st_mode = stat.S_IFDIR | 0o755
            a.st_nlink = 2
        else:
            a.st_mode = stat.S_IFREG | (0o644 if inode == CTL_SEED else 0o444)
            a.st_nlink = 1
            a.st_size = len(self.seed.content()) if inode == CTL_SEED else 0
            if self.by_inode:  # the kernel reads these through its page cache: the size and mtime say when to drop it
                content, a.st_mtime_ns = self._doc(inode, fresh=True)
                a.st_size = len(content)
        return a

    def read_inode(self, inode: int, off: int, size: int) -> bytes:
        """A READ without a handle (``no_open``): the document the kernel was last told about."""
        if inode == CTL_DIR:
            raise FsError(errno.EISDIR)
        return self._doc(inode, fresh=False)[0][off : off + size]

    def write_inode(self, inode: int, off: int, buf: bytes, ctx: RequestContext) -> int:
        """A WRITE without a handle (``no_open``): the seed's one writer, as :meth:`write`."""
        if inode != CTL_SEED or ctx.uid not in (0, self.uid):
            raise FsError(errno.EACCES)
        if self._writer is None:
            self._writer = ControlHandle(CTL_SEED, writable=True, buffer=bytearray(self.seed.content()))
        return self.write(self._writer, off, buf)

    def open(self, inode: int, flags: int, ctx: RequestContext) -> tuple[ControlHandle, bool]:
        """Return the handle and whether the kernel should bypass its page cache (direct_io)."""
        if inode == CTL_DIR:
            raise FsError(errno.EISDIR)
        writing = (flags & os.O_ACCMODE) != os.O_RDONLY or bool(flags & os.O_TRUNC)
        if writing:
            if inode != CTL_SEED:
                raise FsError(errno.EACCES)
            if ctx.uid not in (0, self.uid):
                raise FsError(errno.EACCES)
        if inode == CTL_STATUS:
            content = (json.dumps(self.status(), indent=1, sort_keys=False) + "\n").encode()
        elif inode == CTL_CONFIG:
            content = self.config_yaml
        else:
            content = self.seed.content()
        handle = ControlHandle(inode, content, writable=writing)
        if writing and not flags & os.O_TRUNC:
            handle.buffer[:] = content
        return handle, True

    def read(self, handle: ControlHandle, off: int, size: int) -> bytes:
        return handle.content[off : off + size]

    def write(self, handle: ControlHandle, off: int, buf: bytes) -> int:
        if not handle.writable:
            raise FsError(errno.EBADF)
        end = off + len(buf)
        if end > MAX_SEED_TEXT:  # before touching the buffer: a pwrite at 1 GB must not allocate 1 GB
            self._refuse(f"seed text would end at byte {end} (at most {MAX_SEED_TEXT})")
        if off > len(handle.buffer):
            handle.buffer.extend(b"\0" * (off - len(handle.buffer)))
        handle.buffer[off:end] = buf
        try:
            value = parse_seed(bytes(handle.buffer))
        except SeedSyntaxError as exc:
            self._refuse(str(exc))
        if value != self.seed.value or self.seed.origin != "written":
            self.seed.set(value, "written")
        return len(buf)

    def _refuse(self, reason: str) -> NoReturn:
        self.seed.reject(reason)
        raise FsError(errno.EINVAL)

    def truncate(self, inode: int, size: int, ctx: RequestContext, handle: ControlHandle | None) -> None:
        """``echo N > seed`` may arrive as setattr(size=0) before open: accept it, change nothing yet.

        An ftruncate on an open handle empties that handle's text, so its next write starts afresh;
        any other size is not a seed edit and is refused like a bad seed.
        """
        if inode != CTL_SEED:
            raise FsError(errno.EACCES if inode != CTL_DIR else errno.EISDIR)
        if ctx.uid not in (0, self.uid):
            raise FsError(errno.EACCES)
        if size != 0:
            self._refuse(f"seed truncated to {size} bytes (only to 0)")
        if handle is not None and handle.inode == CTL_SEED and handle.writable:
            handle.buffer.clear()
        elif handle is None and self.by_inode:  # O_TRUNC without an OPEN: the next write starts afresh
            self._writer = ControlHandle(CTL_SEED, writable=True)

    @staticmethod
    def name_of(inode: int) -> bytes:
        return _NAMES.get(inode, CONTROL_NAME)
