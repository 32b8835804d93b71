"""What every tier offers the read path and the prefetcher, and the counters they share.

Concurrency rules (all tiers):

* Every method is called from trio tasks on the one trio thread; bookkeeping (the index, used
  bytes, counters) changes only there, and only between two awaits, so no locks are needed.
  Blocking work (file I/O, hashing large buffers) runs in ``trio.to_thread.run_sync`` under the
  tier's ``limiter`` and returns results; worker threads never touch bookkeeping.
* A put reserves budget before it waits for anything and gives it back on every path that does
  not commit (budget refused, write error, cancellation while queued, drop while in flight).
  A put whose worker thread already finished commits even if cancelled meanwhile: trio delivers
  the cancellation at the caller's next checkpoint, after the data is safely recorded.
* Concurrent puts of one entry: the first registers an in-flight slot before its first await; the
  others wait for it and return its result, so nothing is charged twice.
* A get verifies what it read against the digests recorded when it started.  If the entry was
  dropped or replaced meanwhile, a mismatch is not counted as corruption and the get returns None;
  it can never return bytes that are not the entry's.
* Every copy records the identity of the source it was made from (``source_of``); whether that
  identity still holds is the read path's question (fusefs/readpath/revalidate.py), asked before
  a copy is served.  ``on_drop`` (given at construction) hears of every entry a tier forgets, whatever the cause
  (evicted, damaged, source changed), so a policy that counted it as kept can cache it again.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Annotated, Literal, Protocol, TypedDict, cast

import trio

from fusefs.meta.identity import SourceColumns, SourceId
from fusefs.tiers.budget import Budget
from fusefs.tiers.digest import BlockDigests
from placement.statusfields import counter, gauge, text

TierKind = Literal["memory", "directory"]


@dataclass
class TierCounters:
    """What a tier did; each field is shown under the same name in its status (:class:`TierCountersStatus`)."""

    puts: int = 0
    put_bytes: int = 0
    put_refused: int = 0  # did not fit the budget
    put_errors: int = 0  # the write failed (disk full, I/O error)
    hits: int = 0
    hit_bytes: int = 0
    misses: int = 0
    corrupt: int = 0  # a read that failed its digests (or size); the copy was dropped
    drops: int = 0
    stale: int = 0  # dropped by prune_stale: made from another source identity than the snapshot's

    def as_dict(self) -> TierCountersStatus:
        # TierCountersStatus documents these fields one to one (tests/test_status_schema.py checks it).
        return cast(TierCountersStatus, asdict(self))


class TierCountersStatus(TypedDict):
    """The counters every tier shows (the fields of :class:`TierCounters`)."""

    puts: Annotated[int, counter("copies stored")]
    put_bytes: Annotated[int, counter("bytes of those copies")]
    put_refused: Annotated[int, counter("copies not stored: they did not fit the budget")]
    put_errors: Annotated[int, counter("copies not stored: the write failed (disk full, I/O error)")]
    hits: Annotated[int, counter("reads served from a copy here")]
    hit_bytes: Annotated[int, counter("bytes of those reads")]
    misses: Annotated[int, counter("reads that found no copy here")]
    corrupt: Annotated[int, counter("copies whose digest (or size) did not match on read: dropped and fetched again")]
    drops: Annotated[int, counter("copies dropped (evicted, damaged, or their source changed)")]
    stale: Annotated[
        int, counter("copies dropped at mount because they were made from another version of their source")
    ]


class _TierFields(TypedDict):
    name: Annotated[str, text("memory, or directory:INDEX (the tier's position in the tiers key)")]
    kind: Annotated[TierKind, text("memory or directory")]
    path: Annotated[str | None, text("directory tiers: where copies live; null for memory")]
    budget_bytes: Annotated[int, gauge("the tier's byte budget")]
    used_bytes: Annotated[
        int, gauge("bytes charged to the budget (a memory tier's budget is shared with staging and the page cache)")
    ]
    data_bytes: Annotated[int, gauge("bytes of the copies themselves")]
    files: Annotated[int, gauge("copies held")]
    inflight: Annotated[int, gauge("copies being written now")]
    threads: Annotated[int, gauge("threads that fill it (tiers[].threads)")]


class TierStatus(_TierFields, TierCountersStatus):
    """What every tier shows."""


class MemoryTierStatus(TierStatus):
    """Memory tiers also show:"""

    budget: Annotated[str, text("the budget it shares (memory: with the staging window and the page cache)")]
    tier_bytes: Annotated[int, gauge("bytes this tier's copies take, with the per-copy overhead", metric="held_bytes")]


class JournalStatus(TypedDict):
    generation: Annotated[int, gauge("the journal's generation (bumped each time the index is written)")]
    fill: Annotated[float, gauge("share of the current journal file used", unit="ratio", metric="fill_ratio")]
    reserved: Annotated[bool, gauge("both journal files are preallocated: appends cannot fail for lack of space")]
    records: Annotated[int, counter("records appended")]
    errors: Annotated[int, counter("appends that failed")]
    note: Annotated[str | None, text("why the journal is not in use (copies not crash-safe), or null")]


class OpenedStatus(TypedDict):
    warm: Annotated[bool, text("true: a warm start from the persisted index; false: cold")]
    reason: Annotated[str, text("why (e.g. no index, or why the index was refused)")]
    kept_files: Annotated[int, text("copies kept from before")]
    kept_bytes: Annotated[int, text("their bytes")]
    journal_records: Annotated[int, text("journal records replayed")]
    removed_files: Annotated[int, text("files removed (incomplete, unknown or over budget)")]
    over_budget: Annotated[int, text("copies removed because they no longer fit the budget")]
    seconds: Annotated[float, text("time the opening took")]


class AuditStatus(TypedDict):
    real_bytes: Annotated[int, text("bytes the directory takes on disk, measured as du does")]
    used_bytes: Annotated[int, text("bytes the budget counted at that moment")]
    at: Annotated[float, text("when (timestamp)")]


class DirectoryTierStatus(TierStatus):
    """Directory tiers also show:"""

    base_bytes: Annotated[
        int, gauge("fixed overhead charged: directories, foreign files, index, journal and digest space")
    ]
    foreign_bytes: Annotated[int, gauge("files in the directory that are not seerfs's: left alone, charged")]
    name_slots: Annotated[int, gauge("file names charged (each costs its directory entry)")]
    stuck_bytes: Annotated[int, gauge("bytes of files that could not be unlinked, still charged")]
    unlinking: Annotated[int, gauge("copies being removed now")]
    index_memory_bytes: Annotated[int, gauge("memory of the in-RAM index")]
    index_unsaved_changes: Annotated[int, gauge("changes since the index was last written (the journal has them)")]
    index_write_errors: Annotated[int, counter("index writes that failed")]
    journal: Annotated[
        JournalStatus | None,
        text("the crash-consistency journal (see seerfs.yaml(5)); null when the tier runs without one"),
    ]
    opened: Annotated[OpenedStatus | None, text("how the tier started at mount (null until it has)")]
    audit: Annotated[AuditStatus | None, text("the last audit of the directory's real size, or null")]


AnyTierStatus = MemoryTierStatus | DirectoryTierStatus


class PutSlot:
    """One put in flight: later puts of the same entry wait for ``done`` and share ``ok``."""

    __slots__ = ("done", "dropped", "journal_gen", "ok")

    def __init__(self) -> None:
        self.done = trio.Event()
        self.ok = False
        self.dropped = False  # drop() arrived while the put was in flight: do not commit
        # Directory tier: the journal's generation just before this put's record was appended (at
        # most the record's own; set by the worker thread before the append).  See its persist().
        self.journal_gen: int | None = None


class Tier(Protocol):
    name: str  # "memory", "directory:1"
    index: int  # position in config.tiers (0 = fastest)
    limiter: trio.CapacityLimiter  # every blocking call of this tier runs under it
    budget: Budget
    on_drop: Callable[[int, int], None] | None  # (entry, index): told of every entry it forgets

    def contains(self, entry: int) -> bool: ...
    def size_of(self, entry: int) -> int | None: ...
    def digests_of(self, entry: int) -> BlockDigests | None: ...
    def source_of(self, entry: int) -> SourceId | None: ...
    def footprint(self, size: int) -> int: ...
    async def put(
        self,
        entry: int,
        data: bytes,
        source: SourceId,
        digests: BlockDigests | None = None,
    ) -> bool: ...
    async def get(self, entry: int) -> bytes | None: ...
    async def read_range(self, entry: int, off: int, size: int) -> bytes | None: ...
    def drop(self, entry: int) -> None: ...
    def entries(self) -> list[int]: ...
    def prune_stale(self, ids: SourceColumns) -> int: ...
    @property
    def kind(self) -> TierKind: ...
    def status(self) -> AnyTierStatus: ...
    async def close(self) -> None: ...


def in_trio() -> bool:
    """Whether we run inside the trio loop (startup pruning runs before it, and must not spawn)."""
    try:
        trio.lowlevel.current_task()
    except RuntimeError:
        return False
    return True
