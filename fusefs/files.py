"""What the Operations class asks for a dataset file: open it, read from it, release it.

``DirectFiles`` is the mirror mount's read path: straight from the source, verified against the
snapshot, small files read whole at open.  The caching read path (tiers, prefetcher, peers) offers
the same three calls, so the Operations class never changes shape.
"""

from __future__ import annotations

import errno
import logging
import os
import time
from dataclasses import dataclass
from typing import Protocol

import pyfuse3

from .counters import ReadCounters
from .pfs import PfsReader, SourceFile, StaleFile

log = logging.getLogger(__name__)


@dataclass
class OpenFile:
    """One open() of a dataset file; ``data`` holds the whole file when it was read at open."""

    entry: int
    size: int
    data: memoryview | None = None
    source: SourceFile | None = None


class FileService(Protocol):
    async def open(self, entry: int, pid: int) -> OpenFile: ...
    async def read(self, handle: OpenFile, off: int, size: int) -> bytes | memoryview: ...
    def release(self, handle: OpenFile) -> None: ...


class DirectFiles:
    def __init__(self, reader: PfsReader, counters: ReadCounters) -> None:
        self.reader = reader
        self.counters = counters

    def fail_stale(self, entry: int, reason: str) -> pyfuse3.FUSEError:
        path = os.fsdecode(self.reader.snapshot.tree.path(entry))
        log.warning("%s: %s; failing with EIO", path, reason)
        self.counters.mark_stale(path, reason)
        self.counters.errors_eio += 1
        return pyfuse3.FUSEError(errno.EIO)

    async def open(self, entry: int, pid: int) -> OpenFile:
        self.counters.opens += 1
        t0 = time.monotonic()
        try:
            src = await self.reader.open(entry)
        except StaleFile as exc:
            raise self.fail_stale(entry, str(exc)) from None
        except OSError as exc:
            self.counters.errors_eio += exc.errno in (None, errno.EIO)
            raise pyfuse3.FUSEError(exc.errno or errno.EIO) from None
        elapsed = time.monotonic() - t0
        self.counters.stalled(elapsed)
        if src.data is not None:
            self.counters.sources["pfs"].add(len(src.data), elapsed)
            return OpenFile(entry, src.size, data=memoryview(src.data))
        return OpenFile(entry, src.size, source=src)

    async def read(self, handle: OpenFile, off: int, size: int) -> bytes | memoryview:
        self.counters.reads += 1
        out: bytes | memoryview
        if handle.data is not None:
            out = handle.data[off : off + size]
        else:
            assert handle.source is not None
            t0 = time.monotonic()
            try:
                out = await self.reader.pread(handle.source, off, size)
            except StaleFile as exc:
                raise self.fail_stale(handle.entry, str(exc)) from None
            except OSError as exc:
                raise pyfuse3.FUSEError(exc.errno or errno.EIO) from None
            pfs = self.counters.sources["pfs"]
            pfs.bytes += len(out)
            pfs.seconds += time.monotonic() - t0
        self.counters.bytes_served += len(out)
        return out

    def release(self, handle: OpenFile) -> None:
        if handle.source is not None:
            handle.source.close()
