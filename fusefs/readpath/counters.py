"""Read counters shown in status: opens, bytes per source, stalls, stale files.

Plain integers mutated only from the trio thread (handlers and tasks), so no locks: a counter is
never updated from a worker thread (threads return results; the awaiting task counts them).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Literal, TypedDict

from placement.statusfields import counter, gauge, text

Source = Literal["page_cache", "memory", "directory", "inflight", "peer", "pfs"]
"""Where bytes came from (the ``source`` label of the read metrics)."""

OPEN_SOURCES: tuple[Source, ...] = ("page_cache", "memory", "directory", "inflight")
"""Where an open found its bytes (the read order of :mod:`fusefs.readpath.openfiles`): these count opens."""
FETCH_SOURCES: tuple[Source, ...] = ("peer", "pfs")
"""Where a fetch got its bytes: these count fetches, a prefetch as much as an open's own fetch, since
PFS traffic is what they must show."""
SOURCES = OPEN_SOURCES + FETCH_SOURCES

_MAX_LISTED = 100


class SourceReads(TypedDict):
    files: Annotated[int, counter("opens served from there (peer, pfs: whole-file fetches from there)")]
    bytes: Annotated[int, counter("bytes of those files")]
    seconds: Annotated[float, counter("time they took")]


class ReadsStatus(TypedDict):
    """Status section ``reads``: what readers asked for and where it came from."""

    opens: Annotated[int, counter("dataset files opened")]
    reads: Annotated[int, counter("read requests served", metric="requests")]
    bytes_served: Annotated[int, counter("bytes returned to readers", unit="bytes", metric="served_bytes")]
    errors_eio: Annotated[int, counter("reads failed with EIO", metric="eio_errors")]
    stall_seconds: Annotated[float, counter("total time opens waited for their data")]
    stall_max_seconds: Annotated[float, gauge("longest time one open waited for its data")]
    pfs_bytes: Annotated[int, counter("bytes read from the source (by_source.pfs.bytes)")]
    by_source: Annotated[
        dict[Source, SourceReads],
        text(
            "per source: page_cache, memory, directory and inflight count the opens served from there, "
            "while peer and pfs count the whole-file fetches from there, prefetches included, so the two "
            "halves do not add up to opens",
            label="source",
            metric="source",
        ),
    ]
    stale_files: Annotated[
        dict[str, str],
        text(
            "up to 100 relative paths whose source changed since the snapshot (size, mtime, ctime or inode "
            "number, or no longer a regular file), with what changed; they read as EIO until a remount or "
            "seerfs mount --rescan"
        ),
    ]
    stale_total: Annotated[int, counter("files seen changed since the snapshot", metric="stale_files")]


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
    sources: dict[Source, SourceCounter] = field(default_factory=lambda: {s: SourceCounter() for s in SOURCES})
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

    def status(self) -> ReadsStatus:
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
