"""Read counters shown in status: opens, bytes per source, stalls, stale files.

Plain integers mutated only from the trio thread (handlers and tasks), so no locks: a counter is
never updated from a worker thread (threads return results; the awaiting task counts them).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

OPEN_SOURCES = ("page_cache", "memory", "directory", "inflight")
"""Where an open found its bytes (DESIGN section 3 read order): these count opens."""
FETCH_SOURCES = ("peer", "pfs")
"""Where a fetch got its bytes: these count fetches, a prefetch as much as an open's own fetch, since
PFS traffic is what they must show."""
SOURCES = OPEN_SOURCES + FETCH_SOURCES

_MAX_LISTED = 100


@dataclass
class SourceCounter:
    files: int = 0
    bytes: int = 0
    seconds: float = 0.0

    def add(self, nbytes: int, seconds: float) -> None:
        self.files += 1
        self.bytes += nbytes
        self.seconds += seconds


@dataclass
class ReadCounters:
    opens: int = 0
    reads: int = 0
    bytes_served: int = 0
    errors_eio: int = 0
    stall_seconds: float = 0.0
    stall_max_seconds: float = 0.0
    sources: dict[str, SourceCounter] = field(default_factory=lambda: {s: SourceCounter() for s in SOURCES})
    stale: dict[str, str] = field(default_factory=dict)  # relative path -> what changed
    stale_total: int = 0

    def stalled(self, seconds: float) -> None:
        self.stall_seconds += seconds
        self.stall_max_seconds = max(self.stall_max_seconds, seconds)

    def mark_stale(self, path: str, reason: str) -> None:
        if path not in self.stale:
            self.stale_total += 1
            if len(self.stale) < _MAX_LISTED:
                self.stale[path] = reason

    def status(self) -> dict[str, Any]:
        return {
            "opens": self.opens,
            "reads": self.reads,
            "bytes_served": self.bytes_served,
            "errors_eio": self.errors_eio,
            "stall_seconds": round(self.stall_seconds, 6),
            "stall_max_seconds": round(self.stall_max_seconds, 6),
            "pfs_bytes": self.sources["pfs"].bytes,
            "by_source": {
                name: {"files": c.files, "bytes": c.bytes, "seconds": round(c.seconds, 6)}
                for name, c in self.sources.items()
            },
            "stale_files": dict(self.stale),
            "stale_total": self.stale_total,
        }
