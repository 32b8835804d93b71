"""Stand-ins for what only a mounted kernel or another node provides, for in-process read-path tests.

Used by tests only: the product, the benchmarks and the acceptance checks run against the real
kernel (pyfuse3) and real peers.
"""

from __future__ import annotations

import errno
import threading

import trio


class RecordingKernel:
    """The kernel's page cache as notify_store / invalidate_inode see it.

    ``pages`` holds what was pushed (by inode) until invalidated.  A push can be held mid-way
    (``hold`` cleared; ``entered`` is set once a push is waiting) to open a race; inodes in
    ``unknown`` are refused with ENOENT, as the kernel does before any lookup of them.
    """

    def __init__(self) -> None:
        self.pages: dict[int, bytes] = {}
        self.pushed: list[int] = []
        self.invalidated: list[int] = []
        self.unknown: set[int] = set()
        self.marked: set[int] = set()  # inodes whose opens a native front would answer (set_pages)
        self.hold = threading.Event()
        self.hold.set()
        self.entered = threading.Event()
        self.readers: set[int] = set()  # pages are read back here directly, never through an open
        self.lookups_work = True  # introduce() makes an unknown inode known (False: it stays unknown)
        self.read_gate = threading.Event()  # cleared: a read back waits (as one stuck on a page lock)
        self.read_gate.set()
        self.read_waiting = threading.Event()  # set once a read back is waiting at the gate

    def notify_store(self, inode: int, offset: int, data: bytes) -> None:
        self.entered.set()
        self.hold.wait(10)
        if inode in self.unknown:
            raise OSError(errno.ENOENT, "no such inode in the kernel")
        assert offset == 0
        self.pages[inode] = bytes(data)
        self.pushed.append(inode)

    def invalidate_inode(self, inode: int) -> None:
        self.pages.pop(inode, None)
        self.invalidated.append(inode)
        self.marked.discard(inode)

    def set_pages(self, inode: int, pushed: bool) -> None:
        (self.marked.add if pushed else self.marked.discard)(inode)

    def introduce(self, inode: int) -> bool:
        if self.lookups_work:
            self.unknown.discard(inode)
        return self.lookups_work

    def read_pages(self, inode: int, size: int) -> bytes | None:
        if not self.read_gate.is_set():
            self.read_waiting.set()
            self.read_gate.wait(10)
        data = self.pages.get(inode)
        return data if data is not None and len(data) == size else None


class MemoryPeer:
    """The owning peer of some files, in memory: answers with their bytes, else None (not owned).

    A request for an entry in ``gates`` waits until its event is set, holding the fetch in flight.
    """

    def __init__(self, files: dict[int, bytes] | None = None) -> None:
        self.files = dict(files or {})
        self.asked: list[int] = []
        self.gates: dict[int, trio.Event] = {}

    async def fetch(
        self, entry: int, *, owner: bool = True, holders: bool = True, owners: object = None
    ) -> bytes | None:
        """As the owner; there are no earlier regimes here, so ``holders`` asks nobody, and the owner
        is this peer whatever ``owners`` (the executor asking) would say."""
        if not owner:
            return None
        self.asked.append(entry)
        gate = self.gates.get(entry)
        if gate is not None:
            await gate.wait()
        return self.files.get(entry)
