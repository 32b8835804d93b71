"""What the Operations class asks for a dataset file: open it, read from it, release it.

Read order at open: staged (pushed into the page cache, or held in RAM) -> local tiers
-> a fetch already in flight (await it) -> the owning peer -> the PFS.  Files up to
``fuse.whole_file_max`` are fetched whole and served from memory; bigger ones not held locally are
read from the PFS in ranges.  Every open records where its bytes came from and how long the
reader waited (the stall).  A file whose source was seen changed (revalidate.py) fails with EIO.
"""

from __future__ import annotations

import errno
import logging
import os
import time
from dataclasses import dataclass
from typing import Any, Literal

from fusefs.errors import FsError
from fusefs.meta.ids import ROOT_INODE
from fusefs.readpath.contract import UseHeld, UsePages
from fusefs.readpath.counters import ReadCounters, Source
from fusefs.readpath.fetcher import Fetcher, NotFromPeer
from fusefs.readpath.pfs import SourceFile, StaleFile
from fusefs.readpath.policy import VISIT
from fusefs.readpath.prefetch import Prefetcher
from fusefs.readpath.revalidate import Revalidator

log = logging.getLogger(__name__)


@dataclass
class OpenFile:
    """One open() of a dataset file."""

    entry: int
    size: int
    data: memoryview | None = None  # whole file, when read at open
    source: SourceFile | None = None  # ranged PFS reads of a big file
    pushed: bool = False  # its pages were pushed into the page cache before the open
    direct: bool = False  # the memory budget was full: bypass the page cache (direct_io)
    read_back: bool = False  # this daemon reading its own pages back (Staging.read_back), no reader's


@dataclass
class _Seen:
    """A file open in ``no_open`` mode, as fanotify told: how many opens are not closed yet, and the
    one handle its handle-less READs share (bytes fetched once while it is open)."""

    handle: OpenFile
    count: int = 0


OWN_OPEN = 2
"""book_native's ``opened`` for an open the front saw come from one of the daemon's own threads (a
read back, :meth:`Staging.read_back`): decided when the OPEN arrived, since by the time trio books
the event the read back may be over and its thread no longer in ``ThroughMount.readers``."""

VISIT_OPEN = 3
"""book_native's ``opened`` for a visit: an open and its release folded into one by the front (no
other event on the file between them; :data:`fusefs.readpath.policy.VISIT`)."""

_PAIRED = -1  # book_native: an open released in the same run (no handle)
_KEEP = -2  # a release whose pages the policy may keep (Staging.pages_kept)
_DIRECT = -3  # a release of a handle opened with direct_io: its pages are not kept
_UNSEEN = -4  # a no_open open whose handle is made and dropped within the run (none is made)
_SEEN = -5  # a no_open release: nothing for the pages table (no OPEN arrives to ask it)


class OpenFiles:
    def __init__(
        self,
        fetcher: Fetcher,
        prefetcher: Prefetcher,
        revalidator: Revalidator | None,
        counters: ReadCounters,
        whole_file_max: int,
    ) -> None:
        self.fetcher = fetcher
        self.pfs = fetcher.pfs
        self.tree = fetcher.snapshot.tree
        self.prefetcher = prefetcher
        self.counters = counters
        self.whole_file_max = whole_file_max
        self.revalidator = revalidator  # None: a changed source is only logged (no copies to drop)
        self.seen: dict[int, _Seen] = {}  # no_open: entry -> its observed opens (book_native with fh 0)

    def fail_stale(self, entry: int, reason: str) -> FsError:
        if self.revalidator is not None:
            self.revalidator.mark_changed(entry, reason)  # logs it, drops its copies and pages
        else:
            path = os.fsdecode(self.tree.path(entry))
            log.warning("%s: %s; failing with EIO", path, reason)
            self.counters.mark_stale(path, reason)
        self.counters.errors_eio += 1
        return FsError(errno.EIO)

    def _io_error(self, entry: int, exc: BaseException) -> FsError:
        if isinstance(exc, StaleFile):
            return self.fail_stale(entry, str(exc))
        code = exc.errno if isinstance(exc, OSError) and exc.errno else errno.EIO
        if code == errno.EIO:
            self.counters.errors_eio += 1
        return FsError(code)

    async def open(self, entry: int, pid: int) -> OpenFile:
        if self.prefetcher.staging.reads_back(pid):
            # Not a reader: no counters, no cursor; the kernel serves the cached pages (keep_cache).
            return OpenFile(entry, int(self.tree.size[entry]), pushed=True, read_back=True)
        self.counters.opens += 1
        t0 = time.monotonic()
        staged = self.prefetcher.opened(entry)
        size = int(self.tree.size[entry])
        if self.revalidator is not None and self.revalidator.is_changed(entry):
            self.counters.errors_eio += 1
            raise FsError(errno.EIO)
        try:
            handle, source = await self._locate(entry, size, staged)
        except (OSError, StaleFile) as exc:
            raise self._io_error(entry, exc) from None
        waited = time.monotonic() - t0
        self.counters.stalled(waited)
        if source != "fetched" and source != "pfs":
            self.counters.sources[source].add(size, waited)  # whole fetches are counted by the fetcher
        elif source == "pfs":
            self.counters.sources["pfs"].files += 1  # a big file: its bytes are counted as it is read
        if not handle.pushed and not self.prefetcher.read_through(entry, size):
            handle.direct = True
        return handle

    def opened_natively(self, entry: int, pid: int) -> OpenFile:
        """An open the front answered itself from pages it was told are cached (``Kernel.set_pages``):
        the same bookkeeping as :meth:`open`'s pushed branch (counters, prefetcher, cursor), after
        the fact.  It cannot fail any more: a file seen changed meanwhile has its pages dropped, and
        reads of pages gone are fetched (checked) like any pushed file's (:meth:`read`)."""
        size = int(self.tree.size[entry])
        if self.prefetcher.staging.reads_back(pid):
            return OpenFile(entry, size, pushed=True, read_back=True)
        self.counters.opens += 1
        staged = self.prefetcher.opened(entry)
        self.counters.stalled(0.0)
        self.counters.sources["page_cache"].add(size, 0.0)
        if isinstance(staged, UseHeld):  # staged in RAM since: reads of pages not cached use it
            return OpenFile(entry, size, data=memoryview(staged.data), pushed=True)
        return OpenFile(entry, size, pushed=True)

    def book_native(self, events: list[int], handles: dict[int, Any], entries: int) -> None:
        """A run of opens and releases the front answered itself (flat ``(opened, inode, fh, pid)``
        quads, in ring order; ``handles``: the daemon's fh -> handle table; ``entries``: the tree's
        size): for each, in order, exactly what :meth:`opened_natively` (registered in ``handles``)
        and :meth:`release` do, or with fh 0 (``no_open``: seen through fanotify, paired by inode)
        what :meth:`seen_natively` does, so the counters, the prefetcher's opened/consumed and the cursor
        see the same sequence.  An open whose release is in the same run gets no handle: no request
        came between them (a forwarded READ would have ended the run), so there is nothing to
        look up; its release does what :meth:`release` does for a pushed handle.

        In three passes, so that the policy's steps run as one call (``Prefetcher.book``): first
        what reaches the policy, in order, with everything that does not depend on its answers
        (the read-back opens, the handle table's pops, ``seen``'s counts); then the steps; then
        each answer applied where it goes (counters, handles, the pages table).  Exact because
        nothing the second and third passes change is read by the first: a release's handle is
        one of an earlier run (an open's handle in this run is never looked up, see above), a
        ``seen`` handle's ``direct`` is set only by READs, and the counters are only added to."""
        prefetcher = self.prefetcher
        staging = prefetcher.staging
        counters = self.counters
        sizes = self.tree.size
        seen_of = self.seen
        fhs = events[2::4]
        # handles released in this run (no_open: none, every fh is 0)
        closing = {fh for opened, fh in zip(events[0::4], fhs, strict=True) if not opened} if any(fhs) else set()
        paired: dict[int, int] = {}  # fh -> entry: opened in this run, released later in it
        # no_open: files with no handle before this run, opened in it: how many opens are not closed
        # yet, and those opens' positions in ops.  A handle is made only for those still open after
        # the run (an open and its close in one run, the common case, never needs one: nothing can
        # read through it in between, a READ would have ended the run).
        unseen_count: dict[int, int] = {}
        unseen_ops: dict[int, list[int]] = {}
        ops: list[int] = []  # the policy's steps: an open's entry, a release's ~entry
        # per op: an open's fh (_PAIRED: none), its seen handle (_UNSEEN: none yet); a release's _KEEP or _DIRECT
        targets: list[int | OpenFile] = []
        opens = 0
        for opened, inode, fh, pid in zip(events[0::4], events[1::4], events[2::4], events[3::4], strict=True):
            entry = inode - ROOT_INODE
            if opened == VISIT_OPEN:  # an open and its release as one step: no handle either way
                if not 0 <= entry < entries:
                    continue
                if fh == 0:
                    seen = seen_of.get(entry)
                    if seen is not None:  # also open across runs: its handle takes the open's answer
                        opens += 1
                        ops += (entry, ~entry)
                        targets += (seen.handle, _SEEN)
                        continue
                elif staging.reads_back(pid):
                    continue  # a read back opened and released: nothing to book
                opens += 1
                ops.append(entry + VISIT)
                targets.append(_UNSEEN if fh == 0 else _PAIRED)
                continue
            if fh == 0:  # no_open: seen through fanotify (never a handle of ours): what seen_natively does
                if not 0 <= entry < entries:
                    continue
                seen = seen_of.get(entry)
                if opened:
                    opens += 1
                    if seen is not None:
                        seen.count += 1
                        targets.append(seen.handle)
                    elif entry in unseen_count:
                        unseen_count[entry] += 1
                        unseen_ops[entry].append(len(ops))
                        targets.append(_UNSEEN)
                    else:
                        unseen_count[entry] = 1
                        unseen_ops[entry] = [len(ops)]
                        targets.append(_UNSEEN)
                    ops.append(entry)
                elif seen is not None:  # a close of an open never seen (made before the mark): ignored
                    seen.count -= 1
                    ops.append(~entry)
                    targets.append(_SEEN)
                    if seen.count <= 0:
                        del seen_of[entry]
                        if seen.handle.source is not None:
                            seen.handle.source.close()
                        seen.handle.data = None
                elif entry in unseen_count:  # its handle would have been made and dropped in this run
                    ops.append(~entry)
                    targets.append(_SEEN)
                    unseen_count[entry] -= 1
                    if unseen_count[entry] <= 0:
                        del unseen_count[entry], unseen_ops[entry]
                continue
            if opened:
                if not 0 <= entry < entries:
                    continue
                if opened == OWN_OPEN or staging.reads_back(pid):
                    handles[fh] = OpenFile(entry, sizes.item(entry), pushed=True, read_back=True)
                    continue
                opens += 1
                ops.append(entry)
                if fh in closing:
                    paired[fh] = entry
                    targets.append(_PAIRED)
                else:
                    targets.append(fh)
            else:
                entry = paired.pop(fh, -1)
                if entry >= 0:  # release() of a pushed handle opened natively (never direct)
                    ops.append(~entry)
                    targets.append(_KEEP)
                    continue
                handle = handles.pop(fh, None)
                if isinstance(handle, OpenFile) and not handle.read_back:  # what release() does
                    if handle.source is not None:
                        handle.source.close()
                    handle.data = None
                    ops.append(~handle.entry)
                    targets.append(_DIRECT if handle.direct else _KEEP)
        for entry, positions in unseen_ops.items():  # still open after the run: their shared handle
            handle = OpenFile(entry, sizes.item(entry))
            seen_of[entry] = _Seen(handle, unseen_count[entry])
            for k in positions:
                targets[k] = handle
        if not ops:
            return
        counters.opens += opens
        answers = prefetcher.book(ops)
        page_cache = counters.sources["page_cache"]
        for op, target, answer in zip(ops, targets, answers, strict=True):
            if op < 0:
                if answer is True and target == _KEEP:  # Staging.pages_kept, the policy asked already
                    staging.pages_kept(~op, cached=True)
                continue
            if isinstance(answer, tuple):  # a visit's (open's answer, kept after its release)
                op -= VISIT
                answer, kept_after = answer
                if target == _PAIRED:  # a native open (counted as such) and its release's pages mark
                    page_cache.files += 1
                    page_cache.bytes += sizes.item(op)
                    if kept_after:
                        staging.pages_kept(op, cached=True)
                    continue
                if isinstance(answer, UsePages):  # no_open, pages the kernel holds (the warm open)
                    page_cache.files += 1
                    page_cache.bytes += sizes.item(op)
                    continue
            size: int = sizes.item(op)
            if target == _UNSEEN or isinstance(target, OpenFile):
                # no_open, as seen_natively (a stall of 0 s changes no counter)
                if isinstance(answer, UsePages):
                    if isinstance(target, OpenFile):
                        target.pushed = True
                    page_cache.files += 1
                    page_cache.bytes += size
                elif isinstance(answer, UseHeld):
                    counters.sources["memory"].add(size, 0.0)
                    if isinstance(target, OpenFile) and target.data is None:
                        target.data = memoryview(answer.data)
                # not staged: its first READ fetches it (read_inode), counted there
                continue
            # counters.stalled(0.0) and page_cache.seconds += 0.0 change nothing: left out
            page_cache.files += 1
            page_cache.bytes += size
            if target == _PAIRED:
                continue
            if isinstance(answer, UseHeld):
                handles[target] = OpenFile(op, size, data=memoryview(answer.data), pushed=True)
            else:
                handles[target] = OpenFile(op, size, pushed=True)

    def seen_natively(self, opened: bool, entry: int) -> None:
        """One open or close fanotify reported (``no_open``: the kernel asked nothing), as
        :meth:`book_native` books a run of them (its test compares the two): the same
        bookkeeping as a Python open (counters, the prefetcher's opened/consumed, the cursor), the
        open's handle shared by the file's opens.  A close of an open never seen (made before the
        mark) is ignored."""
        seen = self.seen.get(entry)
        if opened:
            size = int(self.tree.size[entry])
            self.counters.opens += 1
            staged = self.prefetcher.opened(entry)
            if seen is None:
                seen = self.seen[entry] = _Seen(OpenFile(entry, size))
            seen.count += 1
            if isinstance(staged, UsePages):  # as book_native: a stall of 0 s changes no counter
                seen.handle.pushed = True
                cached = self.counters.sources["page_cache"]
                cached.files += 1
                cached.bytes += size
            elif isinstance(staged, UseHeld):
                self.counters.sources["memory"].add(size, 0.0)
                if seen.handle.data is None:
                    seen.handle.data = memoryview(staged.data)
            # not staged: its first READ fetches it (read_inode), counted there
            return
        if seen is None:
            return
        seen.count -= 1
        self.prefetcher.consumed(entry)  # no pages_kept: in this mode no OPEN asks the pages table
        if seen.count <= 0:
            del self.seen[entry]
            if seen.handle.source is not None:
                seen.handle.source.close()
            seen.handle.data = None

    async def read_inode(self, entry: int, off: int, size: int, pid: int) -> bytes | memoryview:
        """A READ without a handle (``no_open``): pages the kernel does not hold.  The file's first
        such READ while it is open fetches it as an open would (tiers, a fetch in flight, a peer,
        the PFS; a big file in ranges), and its later READs share the bytes.  A file seen changed
        fails with EIO: in this mode the open itself cannot fail."""
        if self.prefetcher.staging.reads_back(pid):
            raise FsError(errno.EAGAIN)  # the daemon reading its own pages back: never a fetch
        if self.revalidator is not None and self.revalidator.is_changed(entry):
            self.counters.errors_eio += 1
            raise FsError(errno.EIO)
        seen = self.seen.get(entry)
        handle = seen.handle if seen is not None else OpenFile(entry, int(self.tree.size[entry]))
        if handle.data is None and handle.source is None and not handle.pushed:
            t0 = time.monotonic()
            try:
                located, source = await self._locate(entry, handle.size, None)
            except (OSError, StaleFile) as exc:
                raise self._io_error(entry, exc) from None
            waited = time.monotonic() - t0
            self.counters.stalled(waited)
            if source != "fetched" and source != "pfs":
                self.counters.sources[source].add(handle.size, waited)
            elif source == "pfs":
                self.counters.sources["pfs"].files += 1
            handle.data, handle.source = located.data, located.source
            if seen is not None and not self.prefetcher.read_through(entry, handle.size):
                handle.direct = True  # the kernel keeps the pages anyway (no direct_io without an open)
        if seen is not None:
            return await self.read(handle, off, size)
        try:  # a READ of no open seen (a readahead after the close): its handle ends with it
            return await self.read(handle, off, size)
        finally:
            if handle.source is not None:
                handle.source.close()

    async def _locate(
        self, entry: int, size: int, staged: UsePages | UseHeld | None
    ) -> tuple[OpenFile, Source | Literal["fetched"]]:
        if isinstance(staged, UsePages):
            return OpenFile(entry, size, pushed=True), "page_cache"
        if isinstance(staged, UseHeld):
            return OpenFile(entry, size, data=memoryview(staged.data)), "memory"
        local = await self.fetcher.from_tiers(entry)
        if local is not None:
            return OpenFile(entry, size, data=memoryview(local.data)), local.source
        self._refuse_changed(entry)
        running = self.fetcher.joinable(entry)
        if running is not None:
            try:
                return OpenFile(entry, size, data=memoryview(await running.wait())), "inflight"
            except NotFromPeer:
                pass  # a fill or next-epoch fetch that may only use a peer found none ready: fetch it here
        if size > self.whole_file_max:
            ranged = await self.pfs.open(entry, whole=False)
            if self.revalidator is not None:
                self.revalidator.fresh(entry)
            return OpenFile(entry, size, source=ranged), "pfs"
        keep = self.prefetcher.keep_decision(entry, size)
        data = await self.fetcher.for_request(entry, keep_in=keep)
        return OpenFile(entry, size, data=memoryview(data)), "fetched"

    def _refuse_changed(self, entry: int) -> None:
        """Before fetching ``entry`` anew: a file seen changed fails, and never takes the old copy a
        peer may still serve (the PFS read would check its identity, a peer's bytes are not)."""
        if self.revalidator is not None and self.revalidator.is_changed(entry):
            raise StaleFile(self.revalidator.reason(entry))

    async def read(self, handle: OpenFile, off: int, size: int) -> bytes | memoryview:
        if handle.read_back:
            raise FsError(errno.EAGAIN)  # a page is not cached: the read back fails, never fetches
        self.counters.reads += 1
        out: bytes | memoryview
        if handle.data is None and handle.source is None:
            # Pushed pages the kernel dropped since (memory pressure): fetch the file again.
            try:
                local = await self.fetcher.from_tiers(handle.entry)
                if local is None:
                    self._refuse_changed(handle.entry)  # perhaps seen just now, by from_tiers' check
                data = local.data if local is not None else await self.fetcher.for_request(handle.entry, why="reread")
            except (OSError, StaleFile) as exc:
                raise self._io_error(handle.entry, exc) from None
            handle.data = memoryview(data)
        if handle.data is not None:
            out = handle.data[off : off + size]
        else:
            assert handle.source is not None
            t0 = time.monotonic()
            try:
                out = await self.pfs.pread(handle.source, off, size)
            except (OSError, StaleFile) as exc:
                raise self._io_error(handle.entry, exc) from None
            pfs = self.counters.sources["pfs"]
            pfs.bytes += len(out)
            pfs.seconds += time.monotonic() - t0
        self.counters.bytes_served += len(out)
        return out

    def release(self, handle: OpenFile) -> None:
        if handle.read_back:
            return
        if handle.source is not None:
            handle.source.close()
        handle.data = None
        self.prefetcher.consumed(handle.entry)
        if not handle.direct:
            self.prefetcher.staging.pages_kept(handle.entry)
