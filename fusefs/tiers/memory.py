"""The memory tier: whole files as immutable ``bytes`` in daemon RAM, charged to a shared budget.

Reads return the stored object itself (no copy).  Digests are kept so a copy handed on to a
directory tier or a peer is checked without hashing again; re-verifying RAM on every get is off by
default because a ``bytes`` object cannot change after the put verified nothing (it is hashed from
the same buffer), and hashing on every hit would cost more than the hit.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import trio

from fusefs.meta.identity import SourceColumns, SourceId
from fusefs.tiers.base import MemoryTierStatus, PutSlot, TierCounters
from fusefs.tiers.budget import Budget
from fusefs.tiers.digest import BLOCK, BlockDigests

log = logging.getLogger(__name__)

MEMORY_ENTRY_OVERHEAD = 512
"""Bytes charged per file on top of its data: the bytes header, the record, digests and dict slot."""
_PAGE = 4096
_MMAP_THRESHOLD = 128 << 10
"""glibc serves allocations from this size on with whole pages (mmap), so they are charged so."""


@dataclass(slots=True)
class _Held:
    data: bytes
    digests: BlockDigests
    source: SourceId
    charge: int


class MemoryTier:
    kind: Literal["memory"] = "memory"

    def __init__(
        self,
        index: int,
        budget: Budget,
        threads: int,
        verify_reads: bool = False,
        on_drop: Callable[[int, int], None] | None = None,
    ) -> None:
        """``on_drop``: told (entry, ``index``) of every entry this tier forgets (the policy's port)."""
        self.index = index
        self.name = "memory" if index == 0 else f"memory:{index}"
        self.budget = budget
        self.threads = threads
        self.limiter = trio.CapacityLimiter(threads)
        self.verify_reads = verify_reads
        self.counters = TierCounters()
        self._held: dict[int, _Held] = {}
        self._inflight: dict[int, PutSlot] = {}
        self._data_bytes = 0
        self.on_drop = on_drop

    # ------------------------------------------------------------------ queries

    def contains(self, entry: int) -> bool:
        return entry in self._held

    def size_of(self, entry: int) -> int | None:
        held = self._held.get(entry)
        return None if held is None else len(held.data)

    def digests_of(self, entry: int) -> BlockDigests | None:
        held = self._held.get(entry)
        return None if held is None else held.digests

    def source_of(self, entry: int) -> SourceId | None:
        held = self._held.get(entry)
        return None if held is None else held.source

    def footprint(self, size: int) -> int:
        """Budget bytes a file of ``size`` bytes takes in this tier (its RAM, measured by bench_tiers)."""
        if size + 64 >= _MMAP_THRESHOLD:
            return -(-(size + 64) // _PAGE) * _PAGE + MEMORY_ENTRY_OVERHEAD
        return size + MEMORY_ENTRY_OVERHEAD

    def entries(self) -> list[int]:
        return list(self._held)

    # ------------------------------------------------------------------ put / get / drop

    async def put(
        self,
        entry: int,
        data: bytes,
        source: SourceId,
        digests: BlockDigests | None = None,
    ) -> bool:
        """Keep ``data`` (whole file) for ``entry``, made from the source file ``source``; False when
        it does not fit. Never evicts."""
        if source.size != len(data):
            raise ValueError(f"entry {entry}: source of {source.size} bytes, data has {len(data)}")
        held = self._held.get(entry)
        if held is not None:
            if held.source == source:
                return True
            self.drop(entry)
        slot = self._inflight.get(entry)
        if slot is not None:
            await slot.done.wait()
            return slot.ok
        if digests is not None and digests.size != len(data):
            raise ValueError(f"entry {entry}: digests for {digests.size} bytes, data has {len(data)}")
        charge = self.footprint(len(data))
        if not self.budget.try_reserve(charge):
            self.counters.put_refused += 1
            return False
        slot = self._inflight[entry] = PutSlot()
        try:
            blob = data if type(data) is bytes else bytes(data)
            if digests is None:
                if len(blob) > BLOCK:  # hashing a large file would stall the event loop
                    digests = await trio.to_thread.run_sync(BlockDigests.of, blob, limiter=self.limiter)
                else:
                    digests = BlockDigests.of(blob)
            if not slot.dropped:
                self._held[entry] = _Held(blob, digests, source, charge)
                self._data_bytes += len(blob)
                self.counters.puts += 1
                self.counters.put_bytes += len(blob)
                slot.ok = True
            return slot.ok
        finally:
            if not slot.ok:
                self.budget.release(charge)
            del self._inflight[entry]
            slot.done.set()

    async def get(self, entry: int) -> bytes | None:
        held = self._held.get(entry)
        if held is None:
            self.counters.misses += 1
            return None
        if self.verify_reads:
            ok = await trio.to_thread.run_sync(held.digests.verify, held.data, limiter=self.limiter)
            if not ok:
                self._corrupt(entry, held)
                return None
        self.counters.hits += 1
        self.counters.hit_bytes += len(held.data)
        return held.data

    async def read_range(self, entry: int, off: int, size: int) -> bytes | None:
        held = self._held.get(entry)
        if held is None:
            self.counters.misses += 1
            return None
        if self.verify_reads:
            start, end = held.digests.span(off, size)
            view = memoryview(held.data)[start:end]
            first = start // BLOCK
            ok = await trio.to_thread.run_sync(held.digests.verify, view, first, limiter=self.limiter)
            if not ok:
                self._corrupt(entry, held)
                return None
        out = held.data[max(off, 0) : max(off, 0) + max(size, 0)]
        self.counters.hits += 1
        self.counters.hit_bytes += len(out)
        return out

    def _corrupt(self, entry: int, held: _Held) -> None:
        if self._held.get(entry) is held:  # not dropped or replaced while we hashed
            self.counters.corrupt += 1
            log.warning("%s: entry %d failed its digest check; dropped", self.name, entry)
            self.drop(entry)
        else:
            self.counters.misses += 1

    def drop(self, entry: int) -> None:
        slot = self._inflight.get(entry)
        if slot is not None:
            slot.dropped = True
        held = self._held.pop(entry, None)
        if held is not None:
            self._data_bytes -= len(held.data)
            self.budget.release(held.charge)
            self.counters.drops += 1
            if self.on_drop is not None:
                self.on_drop(entry, self.index)

    def prune_stale(self, ids: SourceColumns) -> int:
        """Drop copies made from another source identity than the snapshot records; returns how many."""
        n = len(ids)
        stale = [e for e, h in self._held.items() if e >= n or ids.of(e) != h.source]
        for e in stale:
            self.drop(e)
        self.counters.stale += len(stale)
        return len(stale)

    def status(self) -> MemoryTierStatus:
        return {
            "name": self.name,
            "kind": self.kind,
            "path": None,
            "budget": self.budget.name,
            "budget_bytes": self.budget.limit,
            "used_bytes": self.budget.used,  # the whole shared budget (staging included)
            "tier_bytes": self._data_bytes + MEMORY_ENTRY_OVERHEAD * len(self._held),
            "data_bytes": self._data_bytes,
            "files": len(self._held),
            "inflight": len(self._inflight),
            "threads": self.threads,
            **self.counters.as_dict(),
        }

    async def close(self) -> None:
        """Nothing to persist: RAM does not survive a restart."""
        for entry in list(self._held):
            self.drop(entry)
