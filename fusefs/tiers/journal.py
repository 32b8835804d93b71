"""The directory tier's journal: every copy made or dropped since the last index write, crash-safe.

Why: the index (index.py) is rewritten at most every 30 s; without a journal, kill -9 of the
daemon discarded every copy made since the last write.  Now a copy's record is written *before*
its file takes its final name, so after a crash at any moment every final-named copy has a record,
and the next open keeps it (the files scan still removes what has no record: temporaries, orphans).

Layout: two files, ``seerfs-journal.0`` and ``seerfs-journal.1``, each preallocated at open
(posix_fallocate), so appending never needs new disk space: a full tier filesystem cannot stop the
journal.  Generation g lives in file g % 2, records from offset 0, each carrying g and a checksum;
a reader stops at the first record that is torn, of another generation or preallocated zeros.

Generations and the index: an index claims generation G only once it is safely renamed into place,
and only then does the journal switch to G (truncating nothing: file G % 2 is overwritten from its
start, and the stale records after the new ones are of generation G - 2, where replay stops).  A
record of G - 1 may postdate the index's export (a put in flight while it was taken), so opening
replays G - 1 and then G over the index.  That covers every record only if the index claiming G
was exported once no put with a record of G - 2 was still on its way into the index: a put whose
continuation waited through two back-to-back index writes lost its copy at the next open (seen once
in tests/test_faults.py, entry 250 of 300).  So an index write first waits for those puts
(directory.py, ``persist``).  Records are last-writer-wins per entry, so replaying one the index
already holds changes nothing.  A failed index write does not switch: records keep going
to the current generation, which the last good index still covers.

fsync policy: records are written with pwrite and never fsynced.  That survives the daemon's own
death (kill -9, OOM, a crash), because the written bytes are in the kernel's page cache; after a
power loss or kernel crash the journal's tail may be lost (those copies are then removed as
orphans) or a record may outlive its file's data (the read verifies every block's digest and drops
a bad copy).  The index itself is fsynced, file and directory, at each write.  So a crash can cost
warmth, never correctness.

Concurrency: appends come from worker threads (a put writes its record just before its rename)
and from the trio thread (a drop); one lock orders them and guards the write position.
"""

from __future__ import annotations

import os
import struct
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import xxhash

from fusefs.meta.identity import SourceId
from fusefs.tiers.digest import BlockDigests

JOURNAL_NAMES = ("seerfs-journal.0", "seerfs-journal.1")
ADD, REMOVE = 1, 2
_MAGIC = 0x5EE5
_HEAD = struct.Struct("<HBxIqqqqQQI")  # magic, op, generation, entry, size, mtime, ctime, ino, digest0, extra
_SUM = struct.Struct("<Q")
MAX_ENTRIES = 1 << 32
"""Snapshots hold fewer entries; a record naming more is damage (and must not size the index)."""
MIN_BYTES = 16 << 10
MAX_BYTES = 64 << 20


def journal_bytes(budget: int) -> int:
    """Size of each journal file for a tier of ``budget`` bytes: about 1/2048 of it, 16 KiB..64 MiB
    (a record takes 68 bytes, 8 more per digest block past the first)."""
    return min(MAX_BYTES, max(MIN_BYTES, budget // 2048 // 4096 * 4096))


class JournalFull(Exception):
    """The current generation's file has no room left: the index must be written first."""


@dataclass(frozen=True)
class Record:
    op: int
    entry: int
    source: SourceId | None = None  # ADD only
    digests: BlockDigests | None = None  # ADD only


def encode(gen: int, rec: Record) -> bytes:
    if rec.op == ADD:
        assert rec.source is not None and rec.digests is not None
        s, d = rec.source, rec.digests
        head = _HEAD.pack(
            _MAGIC, ADD, gen, rec.entry, s.size, s.mtime_ns, s.ctime_ns, s.ino, d.digests[0], d.blocks - 1
        )
        body = head + struct.pack(f"<{d.blocks - 1}Q", *d.digests[1:])
    else:
        body = _HEAD.pack(_MAGIC, REMOVE, gen, rec.entry, 0, 0, 0, 0, 0, 0)
    return body + _SUM.pack(xxhash.xxh3_64_intdigest(body))


def decode(buf: bytes, gen: int) -> Iterator[tuple[Record, int]]:
    """The valid records of generation ``gen`` at the start of ``buf``, up to the first bad one,
    each with the offset just after it."""
    pos = 0
    while pos + _HEAD.size + _SUM.size <= len(buf):
        magic, op, g, entry, size, mtime, ctime, ino, d0, extra = _HEAD.unpack_from(buf, pos)
        end = pos + _HEAD.size + 8 * extra + _SUM.size
        bad_entry = not 0 <= entry < MAX_ENTRIES
        if magic != _MAGIC or g != gen or op not in (ADD, REMOVE) or bad_entry or end > len(buf):
            return
        body = buf[pos : end - _SUM.size]
        if _SUM.unpack_from(buf, end - _SUM.size)[0] != xxhash.xxh3_64_intdigest(body):
            return  # torn (a power loss mid-write): nothing after it is trusted
        if op == ADD:
            rest = struct.unpack_from(f"<{extra}Q", buf, pos + _HEAD.size)
            try:
                digests = BlockDigests(size, (d0, *rest))
            except ValueError:
                return
            yield Record(ADD, entry, SourceId(size, mtime, ctime, ino), digests), end
        else:
            yield Record(REMOVE, entry), end
        pos = end


class Journal:
    def __init__(self, root: Path, size: int) -> None:
        self.paths = [root / name for name in JOURNAL_NAMES]
        self.size = size
        self.gen = 0
        self.tail = 0
        self.reserved = False  # both files preallocated: appends cannot fail for lack of space
        self.records = 0
        self._lock = threading.Lock()
        self._fds = [os.open(p, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600) for p in self.paths]
        for p in self.paths:
            os.chmod(p, 0o600)

    def allocated_bytes(self) -> int:
        return sum(os.fstat(fd).st_blocks * 512 for fd in self._fds)

    def reserve(self) -> str | None:
        """Preallocate both files (blocking); None, or why the space could not be had."""
        try:
            for fd in self._fds:
                os.posix_fallocate(fd, 0, self.size)
        except OSError as exc:
            self.reserved = False
            return exc.strerror or str(exc)
        self.reserved = True
        return None

    def _buffer(self, gen: int) -> bytes:
        fd = self._fds[gen % 2]
        size = os.fstat(fd).st_size
        return os.pread(fd, size, 0) if size and gen >= 1 else b""

    def read(self, gen: int) -> list[Record]:
        """The records of generation ``gen`` (blocking)."""
        return [rec for rec, _end in decode(self._buffer(gen), gen)]

    def length(self, gen: int) -> int:
        """Bytes taken by the valid records of generation ``gen`` (where the next one goes)."""
        ends = [end for _rec, end in decode(self._buffer(gen), gen)]
        return ends[-1] if ends else 0

    def reset(self) -> None:
        """Forget every record (a cold start): zero both files, keeping their space."""
        with self._lock:
            for fd in self._fds:
                os.ftruncate(fd, 0)
            self.gen, self.tail = 0, 0

    def switch(self, gen: int) -> None:
        """From now on, records go to generation ``gen`` (an index claiming it is in place)."""
        with self._lock:
            self.gen, self.tail = gen, 0

    def append(self, rec: Record) -> None:
        """Write one record (blocking, any thread); JournalFull or OSError when it cannot."""
        with self._lock:
            if self.gen < 1:
                raise JournalFull("journal not started")
            data = encode(self.gen, rec)
            if self.tail + len(data) > self.size:
                raise JournalFull(f"generation {self.gen} full")
            fd = self._fds[self.gen % 2]
            done = 0
            while done < len(data):
                done += os.pwrite(fd, data[done:], self.tail + done)
            self.tail += len(data)
            self.records += 1

    def fill(self) -> float:
        return self.tail / self.size if self.size else 1.0

    def close(self) -> None:
        with self._lock:
            for fd in self._fds:
                if fd >= 0:
                    os.close(fd)
            self._fds = [-1, -1]
