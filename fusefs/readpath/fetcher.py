"""Getting a file's bytes from the fastest place that has them (local tiers, in-flight, peer, PFS).

A local copy is served only once the revalidator says its source is unchanged in this mount
(fusefs/readpath/revalidate.py); a PFS read checks the source's identity itself.

Concurrency rules:
* One fetch per entry at a time.  The first caller starts it as a task in the fetcher's own
  nursery and everyone (that caller included) awaits its :class:`Inflight`.  A caller that is
  cancelled (a prefetch made obsolete by a re-plan) therefore never cancels the fetch other
  callers wait on, and an open never waits on a fetch nobody will finish.  One exception: a FUSE
  request's fetch that finds none in flight runs in the request's own task (registered the same
  way, so others join it).  A request handler is cancelled only when the daemon stops, and then
  the fetch's joiners get the same EIO as from a cancelled nursery task; a task of its own cost a
  cold open a spawn and two more turns of the event loop (bench_ceiling --cold-runs, READPATH.md).
* ``inflight`` is only touched on the trio thread, between awaits: an entry is registered before
  the first await of its fetch and removed after its last.
* A fetch that fails stores its exception; waiters re-raise it.
* A FUSE request handler never waits on a read back.  A read back reads the file through this
  mount, so it needs the daemon to answer its own OPEN (a pyfuse3 task free to read it), and the
  kernel holds the pages a READ is for locked until that READ is answered: a READ whose handler
  awaited a fetch reading the same file back waited for itself (seen: a reader's pages dropped,
  its READ refetching, that fetch reading the file back, the read back stuck on the READ's locked
  page, the mount hung), and enough handlers awaiting read backs would leave no task to read the
  OPEN they need.  So :meth:`Fetcher.for_request`, the handlers' fetch, never reads back, and
  never joins a fetch in its read-back step: it runs apart from it, in ``apart``.
* Still one PFS read per entry: a fetch whose read back found no pages takes the bytes of the
  request fetch running apart from it, if any, instead of fetching them again (seen: a stage's
  read back and a reader's open of the same file, both reading the PFS in the same millisecond),
  and request fetches join the one running apart.  Waiting on that one is safe for everybody: it
  never reads back.
* A file this node read from the PFS for a peer and keeps no copy of (``remember``) is remembered
  for ``RECENT_SECONDS`` (at most ``RECENT_BYTES`` in all, oldest out first), and a fetch of the
  same entry in that time takes those bytes.  The window decides a stage on what it knew then: a
  file of its own window that a peer asked for while every stage thread was busy is staged just
  after the read for the peer ended, and read the PFS again (seen: 13-45 ms apart).  The bytes
  are at most a second old, fresher than any tier copy (fusefs/readpath/revalidate.py).
"""

from __future__ import annotations

import enum
import errno
import logging
import os
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import trio

from fusefs.readpath.counters import FETCH_SOURCES, ReadCounters, Source
from fusefs.readpath.pfs import PfsReader, StaleFile
from fusefs.tiers import Tier

log = logging.getLogger(__name__)

RECENT_SECONDS = 1.0
"""How long bytes read for a peer serve this node's fetches of the same entry (concurrency rules)."""
RECENT_BYTES = 8 << 20
"""The most bytes so remembered (beside the peer server's reply memory, which held them a moment ago)."""


class PeerFetch(Protocol):
    """Ask peers for an entry: ``owner``, its current owner (who reads it from the PFS for us if it
    does not hold it); ``holders``, the members that may hold it from an earlier regime, for a copy
    they hold now (asked just before this node would read the PFS).  None when nobody answered with
    it (not-yet, not-owned, down, timeout)."""

    def __call__(self, entry: int, *, owner: bool, holders: bool) -> Awaitable[bytes | None]: ...


class PageReader(Protocol):
    """What the fetcher needs from staging: this mount's page cache."""

    async def read_back(self, entry: int) -> bytes | None:
        """The entry's pages read back through this mount; None when they are not all there."""
        ...


class SourceChecks(Protocol):
    """What the fetcher needs from the revalidator: whether a copy's source is unchanged."""

    async def ensure(self, entry: int) -> bool: ...
    def is_changed(self, entry: int) -> bool: ...
    def fresh(self, entry: int) -> None: ...
    def reason(self, entry: int) -> str: ...


class Sources(enum.Flag):
    """Where a fetch may look, after the bytes read for a peer a moment ago (always).  Local tiers
    are not among them: callers ask :meth:`Fetcher.from_tiers` first."""

    PAGES = enum.auto()
    """This mount's page cache, read back (never for a FUSE request: see the concurrency rules)."""
    OWNER = enum.auto()
    """The entry's owning peer, who reads it from the PFS for us if it holds no copy."""
    PFS = enum.auto()
    """The PFS, after asking the members that may hold a copy from an earlier regime.  Without it a
    fetch that found no peer's copy fails with :class:`NotFromPeer`."""

    ALL = PAGES | OWNER | PFS
    REQUEST = OWNER | PFS
    """A FUSE request's fetch: everything but a read back."""


class NotFromPeer(Exception):
    """A fetch that may only come from a peer (a replica's fill) found none ready: try again later."""


@dataclass
class Inflight:
    entry: int
    done: trio.Event = field(default_factory=trio.Event)
    data: bytes | None = None
    error: BaseException | None = None
    source: Source = "pfs"
    reading_pfs: bool = False  # past every peer: reading the PFS now (a held-only request may wait for it)
    reading_pages: bool = False  # reading the file back through this mount (a READ handler must not wait on it)

    async def wait(self) -> bytes:
        await self.done.wait()
        if self.error is not None:
            raise self.error
        assert self.data is not None
        return self.data


@dataclass
class Fetched:
    data: bytes
    source: Source


class Fetcher:
    def __init__(
        self,
        pfs: PfsReader,
        tiers: Sequence[Tier],
        counters: ReadCounters,
        pages: PageReader,
        checks: SourceChecks,
        on_pfs_read: Callable[[int], None],
        peer_fetch: PeerFetch,
    ) -> None:
        """``pages``: this mount's page cache (kept or pushed pages); ``checks``: the revalidator,
        asked before a local copy is served; ``on_pfs_read``: told of each entry read from the PFS
        (the policy's port, ``PolicyPort.pfs_read``: a policy step, ``ReadFromPfs``);
        ``peer_fetch``: asks the peers (the policy's port, ``PolicyPort.peer_fetch``: the executor
        knows who owns a file now, and holds the peer group's fetch)."""
        self.pfs = pfs
        self.snapshot = pfs.snapshot
        self.tiers = list(tiers)
        self.counters = counters
        self.inflight: dict[int, Inflight] = {}
        self.apart: dict[int, Inflight] = {}  # request fetches beside a registered one reading back
        self._recent: OrderedDict[int, tuple[float, bytes]] = OrderedDict()  # entry -> (fetched at, bytes)
        self._recent_bytes = 0
        self.recent_hits = 0  # fetches served by those bytes
        self.pages = pages
        self.revalidator = checks
        self.peer_fetch = peer_fetch
        self.on_pfs_read = on_pfs_read
        self._nursery: trio.Nursery | None = None

    def attach(self, nursery: trio.Nursery) -> None:
        """Fetches run in this long-lived nursery (the daemon's), not in their callers' scopes."""
        self._nursery = nursery

    def spawn(self, fn: Callable[..., Awaitable[None]], *args: object) -> None:
        """Run a background task in the daemon's nursery (prefetch work outlives its trigger)."""
        assert self._nursery is not None, "Fetcher.attach() was not called"
        self._nursery.start_soon(fn, *args)

    # ------------------------------------------------------------------ lookups

    def local_tier(self, entry: int) -> Tier | None:
        for tier in self.tiers:
            if tier.contains(entry):
                return tier
        return None

    async def from_tiers(self, entry: int) -> Fetched | None:
        """The entry from the fastest tier holding a good copy (a corrupt copy is dropped by the tier),
        once its source was seen unchanged in this mount; None when there is none or it changed."""
        if self.local_tier(entry) is not None and not await self.revalidator.ensure(entry):
            return None  # changed: its copies are gone, and the open fails with EIO
        for tier in self.tiers:
            if tier.contains(entry):
                data = await tier.get(entry)
                if data is not None:
                    return Fetched(data, "memory" if tier.kind == "memory" else "directory")
        return None

    async def from_pages(self, entry: int) -> bytes | None:
        """The entry from this mount's page cache (pages a reader left, or staging pushed), or None.
        Those pages were made from bytes checked when this mount fetched them, and the revalidator
        drops them once the source is seen changed: served like the local readers are served."""
        if self.revalidator.is_changed(entry):
            return None
        return await self.pages.read_back(entry)

    # ------------------------------------------------------------------ fetching

    def start(
        self,
        entry: int,
        sources: Sources,
        keep_in: Tier | None = None,
        why: str = "open",
        remember: bool = False,
    ) -> Inflight:
        """The in-flight fetch of ``entry`` (started now unless one is running, whatever its
        sources); ``remember``: a read for a peer that keeps no copy here (see the concurrency
        rules).  Callers await :meth:`Inflight.wait`; a FUSE request handler uses
        :meth:`for_request` instead."""
        running = self.inflight.get(entry)
        if running is not None:
            return running
        assert self._nursery is not None, "Fetcher.attach() was not called"
        job = Inflight(entry, reading_pages=Sources.PAGES in sources)  # from now on: its task may not have started yet
        self.inflight[entry] = job
        self._nursery.start_soon(self._run, job, sources, keep_in, why, remember)
        return job

    async def _run(self, job: Inflight, sources: Sources, keep_in: Tier | None, why: str, remember: bool) -> None:
        entry = job.entry
        owner, pfs = Sources.OWNER in sources, Sources.PFS in sources
        t0 = time.monotonic()
        try:
            data = self._recently_fetched(entry)
            if data is not None:
                job.source = "inflight"  # counted once, by the fetch that got it
            elif Sources.PAGES in sources:
                data = await self.from_pages(entry)
                job.reading_pages = False
                if data is not None:
                    job.source = "page_cache"
                else:
                    data = await self._from_apart(job)
            if data is None and (owner or pfs):
                # The owner (when asked to), then, just before a PFS read, whoever may hold a copy
                # from an earlier regime: the PFS is read for a file only when no member has it.
                data = await self.peer_fetch(entry, owner=owner, holders=pfs)
                if data is not None:
                    job.source = "peer"
            if data is None and not pfs:
                raise NotFromPeer(entry)
            if data is None:
                log.debug("pfs fetch of entry %d (%s)", entry, why)
                job.reading_pfs = True
                # A stage's read under the window's own limiter (PfsReader: its bytes are reserved)
                src = await self.pfs.open(entry, whole=True, staging=why == "staging")
                assert src.data is not None
                data = src.data
                job.source = "pfs"
                self.revalidator.fresh(entry)
                self.on_pfs_read(entry)  # a policy step: on the trio thread, between awaits, so never
                # inside another step (those never await)
            if job.source in FETCH_SOURCES:
                self.counters.sources[job.source].add(len(data), time.monotonic() - t0)
                if remember:
                    self._remember(entry, data)
            if keep_in is not None and not keep_in.contains(entry):
                if self.revalidator.is_changed(entry):
                    raise StaleFile(self.revalidator.reason(entry))  # seen changed while we fetched
                # A peer's bytes are its copy of the same snapshot entry (plan digests agree).
                await keep_in.put(entry, data, self.pfs.ids.of(entry))
            job.data = data
        except trio.Cancelled:
            # Only at daemon shutdown (the nursery is the daemon's); waiters get an I/O error, never
            # a Cancelled that belongs to another task's scope.
            job.error = OSError(errno.EIO, "fetch cancelled: daemon stopping")
            raise
        except Exception as exc:  # stored for the waiters, who turn it into EIO or a stale-file error
            job.error = exc
            if not isinstance(exc, OSError | StaleFile | NotFromPeer):
                log.exception("fetch of %s failed", os.fsdecode(self.snapshot.tree.path(entry)))
        finally:
            if self.inflight.get(entry) is job:
                del self.inflight[entry]
            job.done.set()

    def _remember(self, entry: int, data: bytes) -> None:
        old = self._recent.pop(entry, None)
        if old is not None:
            self._recent_bytes -= len(old[1])
        if len(data) <= RECENT_BYTES:
            self._recent[entry] = (time.monotonic(), data)
            self._recent_bytes += len(data)
        self._trim_recent()

    def _trim_recent(self) -> None:
        oldest = time.monotonic() - RECENT_SECONDS
        recent = self._recent
        while recent and (self._recent_bytes > RECENT_BYTES or next(iter(recent.values()))[0] < oldest):
            _entry, (_at, data) = recent.popitem(last=False)
            self._recent_bytes -= len(data)

    def _recently_fetched(self, entry: int) -> bytes | None:
        """The bytes of ``entry`` read for a peer within ``RECENT_SECONDS``, unless the source was
        seen changed since (the revalidator drops nothing here: it is asked)."""
        if not self._recent:
            return None  # the usual case, on every fetch: no clock read, no trim
        self._trim_recent()
        hit = self._recent.get(entry)
        if hit is None or self.revalidator.is_changed(entry):
            return None
        self.recent_hits += 1
        return hit[1]

    def joinable(self, entry: int) -> Inflight | None:
        """The fetch of ``entry`` in flight that a FUSE request handler may wait on: the registered
        one unless it is in its read-back step, else the request fetch running apart from it (see
        the module's concurrency rules)."""
        running = self.inflight.get(entry)
        if running is not None and not running.reading_pages:
            return running
        return self.apart.get(entry)

    async def for_request(self, entry: int, keep_in: Tier | None = None, why: str = "open") -> bytes:
        """A fetch a FUSE request handler awaits: never a read back, and never waiting on one.  When
        a fetch of the file is reading it back now, this one runs apart from it (in ``apart``, where
        other requests join it and the fetch reading back takes its bytes)."""
        running = self.inflight.get(entry)
        if running is None:
            return await self._fetch_here(entry, keep_in, why)
        if not running.reading_pages:
            return await self._fetch(entry, keep_in, why)
        apart = self.apart.get(entry)
        if apart is not None:
            return await apart.wait()
        assert self._nursery is not None, "Fetcher.attach() was not called"
        job = Inflight(entry)  # reads peers and the PFS, never NotFromPeer
        self.apart[entry] = job
        self._nursery.start_soon(self._run_apart, job, keep_in, why)  # a handler's cancel never fails its joiners
        return await job.wait()

    async def _run_apart(self, job: Inflight, keep_in: Tier | None, why: str) -> None:
        try:
            await self._run(job, Sources.REQUEST, keep_in, why, remember=False)
        finally:
            if self.apart.get(job.entry) is job:
                del self.apart[job.entry]

    async def _from_apart(self, job: Inflight) -> bytes | None:
        """The bytes of the request fetch running apart from ``job`` (which found no pages to read
        back), so that the two never both read the PFS; None when there is none or it failed."""
        apart = self.apart.get(job.entry)
        if apart is None or apart is job:
            return None
        try:
            data = await apart.wait()
        except Exception:  # its error is its requester's; this fetch tries on its own
            return None
        job.source = "inflight"  # counted once, by the fetch that got it
        return data

    async def _fetch_here(self, entry: int, keep_in: Tier | None, why: str) -> bytes:
        """A request's fetch with none in flight, run in this task (see the concurrency rules):
        registered before its first await, so other requests and prefetches join it."""
        job = Inflight(entry)
        self.inflight[entry] = job
        await self._run(job, Sources.REQUEST, keep_in, why, remember=False)
        if job.error is not None:  # done: no need to wait on its event (a checkpoint, one more turn)
            raise job.error
        assert job.data is not None
        return job.data

    async def _fetch(self, entry: int, keep_in: Tier | None, why: str) -> bytes:
        """A request's fetch, joining one in flight (which may be a peer-only one)."""
        try:
            return await self.start(entry, Sources.REQUEST, keep_in, why).wait()
        except NotFromPeer:  # joined a fetch that may only use a peer and found none ready: read it now
            return await self.start(entry, Sources.REQUEST, keep_in, why).wait()
