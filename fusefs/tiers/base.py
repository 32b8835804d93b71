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
  a copy is served.  ``drop_listeners`` hear of every entry a tier forgets, whatever the cause
  (evicted, damaged, source changed), so a policy that counted it as kept can cache it again.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, Protocol

import trio

from fusefs.meta.identity import SourceColumns, SourceId
from fusefs.tiers.budget import Budget
from fusefs.tiers.digest import BlockDigests


@dataclass
class TierCounters:
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

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


class PutSlot:
    """One put in flight: later puts of the same entry wait for ``done`` and share ``ok``."""

    __slots__ = ("done", "dropped", "ok")

    def __init__(self) -> None:
        self.done = trio.Event()
        self.ok = False
        self.dropped = False  # drop() arrived while the put was in flight: do not commit


class Tier(Protocol):
    name: str  # "memory", "directory:1"
    kind: str  # "memory" | "directory"
    index: int  # position in config.tiers (0 = fastest)
    limiter: trio.CapacityLimiter  # every blocking call of this tier runs under it
    budget: Budget
    drop_listeners: list[Callable[[int], None]]

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
    def status(self) -> dict[str, Any]: ...
    async def close(self) -> None: ...


def in_trio() -> bool:
    """Whether we run inside the trio loop (startup pruning runs before it, and must not spawn)."""
    try:
        trio.lowlevel.current_task()
    except RuntimeError:
        return False
    return True
