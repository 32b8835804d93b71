"""The contract of a :class:`fusefs.readpath.staging.Kernel`, one script for every implementation.

``run_contract`` makes the same calls on any kernel and returns what each call did; the recording
kernel (``readpath_fakes.RecordingKernel``) runs it in process, each front
(``fusefs.fuse.pyfuse3_front.Pyfuse3Front``, ``fusefs.fuse.native_front.NativeFront``) under a real
mount in a child process (``main`` below),
and ``tests/test_front.py`` asserts both logs are the same, so what in-process tests prove with the
recording kernel holds for the kernel the daemon uses.

Run as a script (``python tests/kernel_contract.py MOUNTPOINT [pyfuse3|native]``) it mounts two files, ``a``
(inode 2) and ``b`` (inode 3), with handlers that answer a read back (a thread in the front's
``readers``) with EAGAIN, as ``OpenFiles.read`` does, and any other read with ``DAEMON`` bytes;
it prints one JSON object: the contract's log and what the extra real-mount checks saw.
"""

from __future__ import annotations

import errno
import functools
import hashlib
import json
import os
import stat
import sys
import threading
import time
from collections import Counter
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fusefs.fuse.native_front import NativeFront

SIZE = 8192  # two pages
STORED = bytes(range(256)) * (SIZE // 256)  # what notify_store pushes
DAEMON = b"d" * SIZE  # what the handlers answer a reader's READ with
KNOWN, UNKNOWN = 2, 3  # inodes of a (looked up before the contract runs) and b (never looked up)
NAMES = {KNOWN: b"a", UNKNOWN: b"b"}
RING, OPENS_WHILE_BLOCKED = 8, 20  # the native front's ring is kept tiny, so opens overflow it


def _show(value: object) -> object:
    if isinstance(value, bytes | bytearray):
        return f"{len(value)} bytes sha256:{hashlib.sha256(value).hexdigest()[:16]}"
    return value


def run_contract(kernel: Any) -> list[list[object]]:
    """The Kernel calls staging makes, in an order that shows each rule; one ``[call, args, outcome]``
    per call.  ``kernel`` knows inode KNOWN and not UNKNOWN (the kernel refuses pages for an inode
    nobody looked up); asserts what every Kernel must do, and returns the log to compare."""
    log: list[list[object]] = []

    def call(name: str, *args: object) -> object:
        try:
            out = getattr(kernel, name)(*args)
        except OSError as exc:
            log.append([name, [_show(a) for a in args], "raised " + errno.errorcode.get(exc.errno or 0, "?")])
            return exc
        log.append([name, [_show(a) for a in args], _show(out)])
        return out

    assert call("notify_store", KNOWN, 0, STORED) is None
    assert call("read_pages", KNOWN, SIZE) == STORED  # the stored pages are what a read back gets
    assert call("invalidate_inode", KNOWN) is None
    assert call("read_pages", KNOWN, SIZE) is None  # dropped: a read back fails, it never fetches
    refused = call("notify_store", UNKNOWN, 0, STORED)
    assert isinstance(refused, OSError) and refused.errno == errno.ENOENT
    assert call("introduce", UNKNOWN) is True  # a lookup through the mount makes it known
    assert call("notify_store", UNKNOWN, 0, STORED) is None
    assert call("read_pages", UNKNOWN, SIZE) == STORED
    assert call("invalidate_inode", UNKNOWN) is None
    assert call("invalidate_inode", UNKNOWN) is None  # twice: nothing cached is no error
    return log


def main(mountpoint: str, front_name: str = "pyfuse3") -> None:  # pragma: no cover - a child of tests/test_front.py
    import trio

    from fusefs.errors import FsError
    from fusefs.fuse.front import EntryAttributes, FileInfo
    from fusefs.fuse.pyfuse3_front import Pyfuse3Front

    front: Pyfuse3Front | NativeFront
    if front_name == "native":
        from fusefs.fuse.native_front import NativeFront

        front = NativeFront(lambda entry: NAMES[entry + 1], inodes=UNKNOWN + 1, ring=RING)
    else:
        front = Pyfuse3Front(lambda entry: NAMES[entry + 1])
    calls: Counter[str] = Counter()
    read_back_handles: set[int] = set()
    known_handles: set[int] = set()  # handles the daemon was told of (its own opens, native open events)
    read_handles: list[bool] = []  # per READ that reached it: whether its handle was known then

    class Handlers:
        """The least a front needs to serve ``a`` and ``b`` (the root is inode 1)."""

        supports_dot_lookup = True
        enable_writeback_cache = False
        enable_acl = False

        def init(self) -> None:
            pass

        def attrs(self, inode: int) -> EntryAttributes:
            a = front.new_attrs()
            a.st_ino = inode
            a.st_mode = (stat.S_IFDIR | 0o555) if inode == 1 else (stat.S_IFREG | 0o444)
            a.st_nlink = 2 if inode == 1 else 1
            a.st_size = 0 if inode == 1 else SIZE
            a.st_uid, a.st_gid = os.getuid(), os.getgid()
            a.st_blksize = 4096
            a.entry_timeout = a.attr_timeout = 300.0  # cached: a second stat never reaches us
            return a

        async def lookup(self, parent: int, name: bytes, ctx: object) -> EntryAttributes:
            calls[f"lookup {name.decode()}"] += 1
            for inode, known in NAMES.items():
                if parent == 1 and name == known:
                    return self.attrs(inode)
            raise FsError(errno.ENOENT)

        async def getattr(self, inode: int, ctx: object) -> EntryAttributes:
            return self.attrs(inode)

        async def open(self, inode: int, flags: int, ctx: Any) -> FileInfo:
            calls["open"] += 1
            known_handles.add(inode)
            if ctx.pid in front.readers:
                read_back_handles.add(inode)
            return front.new_file_info(inode, False, True)  # keep_cache: an open keeps stored pages

        async def read(self, fh: int, off: int, size: int) -> bytes:
            read_handles.append(fh in known_handles)
            if fh in read_back_handles:
                raise FsError(errno.EAGAIN)
            calls["read"] += 1
            return DAEMON[off : off + size]

        async def release(self, fh: int) -> None:
            calls["release"] += 1
            read_back_handles.discard(fh)

        async def forget(self, inodes: object) -> None:
            pass

        def opened_natively(self, inode: int, fh: int, pid: int) -> None:  # the native front's events
            calls["native open"] += 1
            known_handles.add(fh)

        def released_natively(self, fh: int) -> None:
            calls["native release"] += 1

        def book_native(self, events: list[int]) -> None:  # a run of them, as the native front hands it over
            for k in range(0, len(events), 4):
                if events[k]:
                    self.opened_natively(events[k + 1], events[k + 2], events[k + 3])
                else:
                    self.released_natively(events[k + 2])

        async def getxattr(self, inode: int, name: bytes, ctx: object) -> bytes:
            raise FsError(errno.ENODATA)

    path_a = os.path.join(mountpoint, "a")

    def checks() -> dict[str, object]:
        """In a worker thread, as staging calls the kernel (the trio thread serves the requests)."""
        front.mounted(os.stat(mountpoint).st_dev, os.fsencode(mountpoint))
        os.stat(path_a)  # the kernel now knows a, not b
        log = run_contract(front)
        seen: dict[str, object] = {}
        front.notify_store(KNOWN, 0, STORED)
        with open(path_a, "rb") as fh:
            seen["reader_after_store"] = _show(fh.read())
        seen["reads_reaching_daemon_after_store"] = calls["read"]
        front.invalidate_inode(KNOWN)
        with open(path_a, "rb") as fh:
            seen["reader_after_invalidate"] = _show(fh.read())
        seen["reads_reaching_daemon_after_invalidate"] = calls["read"]
        lookups = calls["lookup a"]
        os.stat(path_a)
        seen["lookups_of_a_while_cached"] = calls["lookup a"] - lookups
        front.invalidate_entry(1, b"a")
        os.stat(path_a)
        seen["lookups_of_a_after_invalidate_entry"] = calls["lookup a"] - lookups
        # Pages known cached (Kernel.set_pages): a front may answer the open itself, but must tell.
        front.notify_store(KNOWN, 0, STORED)
        front.set_pages(KNOWN, True)
        opens = calls["open"]
        with open(path_a, "rb") as fh:
            seen["reader_while_marked"] = _show(fh.read())
        seen["opens_reaching_daemon_while_marked"] = calls["open"] - opens
        front.invalidate_inode(KNOWN)  # clears the mark: the next open reaches the daemon again
        with open(path_a, "rb") as fh:
            fh.read()
        seen["opens_reaching_daemon_after_invalidate"] = calls["open"] - opens
        # Pages dropped while a file is open on a handle the front answered itself: its READs reach
        # the daemon, which knows the handle (its open event was handled before the READ).
        front.notify_store(KNOWN, 0, STORED)
        front.set_pages(KNOWN, True)
        del read_handles[:]
        with open(path_a, "rb", buffering=0) as fh:
            front.invalidate_inode(KNOWN)
            seen["read_after_drop_while_open"] = _show(fh.read())
        seen["reads_after_drop_on_known_handles"] = read_handles[:1] and all(read_handles)
        # The kernel sends RELEASE after close() returned: wait (bounded) for the last one to arrive.
        deadline = time.monotonic() + 20
        while calls["native release"] < calls["native open"] and time.monotonic() < deadline:
            time.sleep(0.01)
        seen["native_events"] = [calls["native open"], calls["native release"]]
        if front_name == "native":
            seen["ring_overflow"] = overflow()
        return {"log": log, "seen": seen}

    def overflow() -> dict[str, int]:
        """The trio thread held up while a reader opens a marked file OPENS_WHILE_BLOCKED times: the
        RING-record ring fills; the opens that find it full are forwarded (they wait for room),
        never answered without their event.  Returns what each side counted."""
        front.notify_store(KNOWN, 0, STORED)
        front.set_pages(KNOWN, True)
        # One open first, served normally: the attributes an earlier invalidate_inode dropped come
        # back, so no open below needs a GETATTR (it would wait on the held trio thread, not fill).
        with open(path_a, "rb") as fh:
            fh.read()
        # ... and its events booked before the counts are taken; the kernel sends a RELEASE after
        # close() returns, so wait for that too (every handle opened natively so far released)
        settle = time.monotonic() + 20

        def unbooked() -> bool:
            now = front.status()
            booked = [calls["native open"], calls["native release"]]
            return booked != [now["native_opens"], now["native_releases"]] or booked[0] != booked[1]

        while unbooked() and time.monotonic() < settle:
            time.sleep(0.01)
        before = dict(calls)
        stats0 = front.status()
        asleep = threading.Event()

        def hold_up() -> None:  # runs on the trio thread: nothing is drained meanwhile
            # Held until an open has found the ring full (not for a fixed time: on a loaded machine
            # the reader may not even start its opens within any fixed span); 30 s at most.
            asleep.set()
            deadline = time.monotonic() + 30
            while front.status()["ring_full"] == stats0["ring_full"] and time.monotonic() < deadline:
                time.sleep(0.01)

        block = functools.partial(trio.from_thread.run_sync, hold_up, trio_token=token[0])
        blocker = threading.Thread(target=block, daemon=True)
        blocker.start()
        asleep.wait(30)
        for _ in range(OPENS_WHILE_BLOCKED):
            with open(path_a, "rb") as fh:
                fh.read()
        blocker.join()
        deadline = time.monotonic() + 20  # events are booked within a few ms of their reply: wait for them

        def lagging() -> bool:
            now = front.status()
            booked = [calls[f"native {k}"] - before.get(f"native {k}", 0) for k in ("open", "release")]
            done = [now["native_opens"] - stats0["native_opens"], now["native_releases"] - stats0["native_releases"]]
            return booked != done

        while lagging() and time.monotonic() < deadline:
            time.sleep(0.01)
        stats = front.status()
        return {
            "native_opens": stats["native_opens"] - stats0["native_opens"],
            "open_events_booked": calls["native open"] - before.get("native open", 0),
            "opens_forwarded": calls["open"] - before.get("open", 0),
            "native_releases": stats["native_releases"] - stats0["native_releases"],
            "release_events_booked": calls["native release"] - before.get("native release", 0),
            "releases_forwarded": calls["release"] - before.get("release", 0),
            "ring_full": stats["ring_full"] - stats0["ring_full"],
        }

    out: dict[str, object] = {}
    token: list[trio.lowlevel.TrioToken] = []

    async def serve() -> None:
        token.append(trio.lowlevel.current_trio_token())
        front.mount(Handlers(), mountpoint, set(front.default_options) | {"fsname=contract", "subtype=seerfs"})  # type: ignore[arg-type]
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(front.run, 4)
                try:
                    out.update(await trio.to_thread.run_sync(checks))
                finally:
                    front.terminate()
        finally:
            front.unmount()

    trio.run(serve)
    print(json.dumps(out))


if __name__ == "__main__":  # pragma: no cover
    main(sys.argv[1], *sys.argv[2:3])
