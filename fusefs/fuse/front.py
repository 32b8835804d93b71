"""The seam between seerfs's handlers and a FUSE binding (a *front*), free of any binding.

:class:`~fusefs.fuse.operations.SeerOperations` and the read path name only what is here: a request
context, entry attributes, the answer to an open, the readdir reply, and errors as
:class:`~fusefs.errors.FsError` (an ``OSError`` carrying the errno).  A front turns kernel requests
into calls of those handlers and carries out the calls staging makes into the kernel
(:class:`Front`).  There are two: :mod:`fusefs.fuse.pyfuse3_front`, the only module of the daemon
that imports pyfuse3, and :mod:`fusefs.fuse.native_front`, the only one that imports the C extension
``fusefs.fuse._native`` (``tests/test_layering.py`` checks both); both call the same handlers.

PlainAttributes and an open's answer are built by the front's own record types (``Front.new_attrs``,
``Front.new_file_info``), so a front whose binding needs its own objects (pyfuse3 type-checks what a
handler returns) copies nothing per request; the plain :class:`PlainAttributes` and
:class:`PlainFileInfo` serve handlers run without a kernel (``tests/inprocess.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Annotated, Literal, NamedTuple, Protocol, TypedDict, TypeVar

from fusefs.errors import FsError
from fusefs.meta.ids import ROOT_INODE
from fusefs.readpath.staging import Kernel
from placement.statusfields import counter, info, state


class FrontStatus(TypedDict):
    """Status section ``front``: the FUSE binding serving the mount and what it answered itself."""

    name: Annotated[Literal["native", "pyfuse3"], info("the front in use (the fuse.front key of seerfs.yaml(5))")]
    native_opens: Annotated[
        int, counter("opens of files whose pages were cached, answered without Python (native front only)")
    ]
    native_releases: Annotated[int, counter("releases of those opens, answered without Python")]
    native_ioctls: Annotated[int, counter("ioctls answered ENOTTY without Python (isatty of every open file)")]
    native_getattrs: Annotated[
        int, counter("attribute requests of dataset entries answered from the snapshot without Python")
    ]
    forwarded: Annotated[int, counter("requests forwarded to the daemon's handlers (native front only)")]
    batches: Annotated[
        int,
        counter(
            "times the daemon drained the native front's ring and found records (forwarded requests and open or "
            "release events): records per batch = (forwarded + native_opens + native_releases) / batches"
        ),
    ]
    visits: Annotated[
        int,
        counter(
            "opens handed to the daemon together with their release, as one event (an open and its close with no "
            "other event on the file between them, in one drain of the ring): booked as one step"
        ),
    ]
    ring_full: Annotated[
        int, counter("opens or releases forwarded instead of answered natively because the event ring was full")
    ]
    open_mode: Annotated[
        Literal["requests", "no_open"],
        state(
            "how opens reach the daemon.  requests: each open and release is a FUSE request (answered natively "
            "where its pages are cached).  no_open: fuse.no_open armed, the kernel sends no OPEN or RELEASE at all "
            "and the daemon sees opens through fanotify (root, native front)"
        ),
    ]
    fanotify: Annotated[
        Literal["off", "fid", "fd"],
        state(
            "how no_open mode sees opens.  fid: inode marks on the directories holding files, each event naming "
            "the file by its handle; fd: one mount mark, each event carrying a descriptor (more CPU per open); "
            "off: not in no_open mode"
        ),
    ]
    observed_opens: Annotated[int, counter("opens seen through fanotify in no_open mode, the daemon's own excluded")]
    observed_releases: Annotated[
        int, counter("closes seen through fanotify in no_open mode, the daemon's own excluded")
    ]
    own_opens_dropped: Annotated[
        int,
        counter(
            "fanotify events of the daemon itself (its reads back; an open and its close may come as one), not booked"
        ),
    ]
    observed_overflows: Annotated[int, counter("fanotify queue overflows (never expected: the queue is unlimited)")]
    opens_answered_enosys: Annotated[
        int, counter("OPEN requests answered ENOSYS to arm no_open (the kernel stops sending them after the first)")
    ]


class RequestContext(Protocol):
    """Who sent a request (the kernel's view of the calling thread)."""

    @property
    def uid(self) -> int: ...
    @property
    def gid(self) -> int: ...
    @property
    def pid(self) -> int: ...
    @property
    def umask(self) -> int: ...


class Context(NamedTuple):
    """A :class:`RequestContext` a front or a test builds itself."""

    uid: int = 0
    gid: int = 0
    pid: int = 0
    umask: int = 0


class SetattrFields(Protocol):
    """Which fields a setattr changes."""

    @property
    def update_size(self) -> bool: ...
    @property
    def update_mode(self) -> bool: ...
    @property
    def update_uid(self) -> bool: ...
    @property
    def update_gid(self) -> bool: ...


class EntryAttributes(Protocol):
    """An entry's attributes as the kernel caches them (``entry_timeout``/``attr_timeout`` seconds)."""

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


class PlainAttributes:
    """The plain :class:`EntryAttributes` record (every field 0 until set)."""

    __slots__ = (
        "attr_timeout",
        "entry_timeout",
        "generation",
        "st_atime_ns",
        "st_blksize",
        "st_blocks",
        "st_ctime_ns",
        "st_gid",
        "st_ino",
        "st_mode",
        "st_mtime_ns",
        "st_nlink",
        "st_rdev",
        "st_size",
        "st_uid",
    )

    def __init__(self) -> None:
        self.st_ino = self.generation = self.st_mode = self.st_nlink = self.st_uid = self.st_gid = 0
        self.st_rdev = self.st_size = self.st_blksize = self.st_blocks = 0
        self.st_atime_ns = self.st_ctime_ns = self.st_mtime_ns = 0
        self.entry_timeout = self.attr_timeout = 0.0


class FileInfo(Protocol):
    """The answer to an open: the handle, and how the kernel may cache the file's pages."""

    @property
    def fh(self) -> int: ...
    @property
    def direct_io(self) -> bool: ...
    @property
    def keep_cache(self) -> bool: ...


NewFileInfo = Callable[[int, bool, bool], FileInfo]
"""A front's :class:`FileInfo` constructor: ``new_file_info(fh, direct_io, keep_cache)``."""


class PlainFileInfo(NamedTuple):
    """The plain :class:`FileInfo` record."""

    fh: int
    direct_io: bool = False
    keep_cache: bool = False


ReaddirReply = Callable[[bytes, EntryAttributes, int], bool]
"""A readdir request's reply, bound to it by the front: ``reply(name, attrs, next_id)`` adds one entry
and says whether it fit (False: the reply is full; stop, the kernel asks again from ``next_id``)."""

OpsT = TypeVar("OpsT", contravariant=True)


class Front(Kernel, Protocol[OpsT]):
    """A FUSE binding: it mounts, serves the handlers ``OpsT`` until unmounted, and makes the kernel
    calls staging needs (the :class:`~fusefs.readpath.staging.Kernel` calls, from worker threads only).

    Errors: :meth:`mount` raises ``RuntimeError`` with the binding's text; the kernel calls raise
    ``OSError`` (ENOENT: the kernel does not know the inode)."""

    new_attrs: Callable[[], EntryAttributes]  # the attribute record handlers fill and return
    new_file_info: NewFileInfo  # the answer to an open handlers return
    default_options: frozenset[str]  # the mount options the binding always passes

    def mount(self, ops: OpsT, mountpoint: str, options: Iterable[str]) -> None:
        """Mount ``mountpoint`` and route its requests to ``ops`` (not served before :meth:`run`)."""
        ...

    async def run(self, max_tasks: int) -> None:
        """Serve requests, at most ``max_tasks`` at once, until :meth:`terminate` or an unmount."""
        ...

    def terminate(self) -> None:
        """Make :meth:`run` return (from the trio thread)."""
        ...

    def unmount(self) -> None:
        """Unmount and release the binding (after :meth:`run` returned)."""
        ...

    def invalidate_entry(self, parent: int, name: bytes) -> None:
        """Make the kernel forget the name ``name`` in directory ``parent`` (its next lookup reaches us)."""
        ...

    def status(self) -> FrontStatus:
        """Status section ``front`` (from the trio thread)."""
        ...


__all__ = [
    "ROOT_INODE",
    "Context",
    "EntryAttributes",
    "FileInfo",
    "Front",
    "FrontStatus",
    "FsError",
    "NewFileInfo",
    "PlainAttributes",
    "PlainFileInfo",
    "ReaddirReply",
    "RequestContext",
    "SetattrFields",
]
