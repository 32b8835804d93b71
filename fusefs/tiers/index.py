"""The directory tier's index: entry -> size, source identity, digests; kept in numpy columns.

Why columns indexed by entry: a tier on a large SSD holds millions of files, and a Python object
per file would cost ~250 bytes each; here a slot costs COLUMN_BYTES whether used or not, like the
snapshot's own columns.  Files of more than one digest block keep their other digests in a dict
(few files, many blocks each).

Each copy records the identity of the source it was made from (size, mtime, ctime, inode:
:mod:`fusefs.meta.identity`), and is served only while the source still has it.

The index is persisted in the tier directory as one .npz written to a temporary name (mode 0600),
fsynced and renamed, so a crash leaves the previous index or the new one, never a torn one.  It
carries its format version, the snapshot fingerprint, the journal generation it is current up to
(journal.py) and a checksum over all of that and every column; any mismatch means a cold start.
Changes between two index writes are in the journal; opening replays it (see directory.py), and
every read is verified anyway.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from fusefs.meta.digests import persisted_digest
from fusefs.meta.identity import SourceId
from fusefs.tiers.digest import BLOCK, BlockDigests, block_count

FORMAT = 2
"""2: source identity columns (ctime, inode), the journal generation and a checksum over the metadata."""
INDEX_NAME = "seerfs-index.npz"
RESERVE_NAME = "seerfs-index.reserve"
"""Space held for the next index write: freed and reused when the disk is full (directory.py)."""
COLUMN_BYTES = 8 * 5 + 4
"""Bytes per entry slot in memory: size, source mtime/ctime/inode, first digest, generation."""
ROW_BYTES = 8 * 6
"""Bytes per cached file in the persisted index (entry, size, mtime, ctime, inode, first digest)."""

_ABSENT = -1
_COLUMNS = (("size", _ABSENT), ("mtime", 0), ("ctime", 0), ("ino", 0), ("digest0", 0), ("gen", 0))


class IndexError_(ValueError):
    """The persisted index cannot be used (unreadable, other format, other source)."""


class TierIndex:
    def __init__(self) -> None:
        self.size: npt.NDArray[np.int64] = np.full(0, _ABSENT, np.int64)
        self.mtime: npt.NDArray[np.int64] = np.zeros(0, np.int64)
        self.ctime: npt.NDArray[np.int64] = np.zeros(0, np.int64)
        self.ino: npt.NDArray[np.uint64] = np.zeros(0, np.uint64)
        self.digest0: npt.NDArray[np.uint64] = np.zeros(0, np.uint64)
        self.gen: npt.NDArray[np.uint32] = np.zeros(0, np.uint32)
        self.extra: dict[int, tuple[int, ...]] = {}  # digests after the first, for multi-block files
        self.count = 0
        self.data_bytes = 0

    def _grow(self, entry: int) -> None:
        n = max(entry + 1, 2 * len(self.size), 1024)
        old = len(self.size)
        for name, fill in _COLUMNS:
            col = getattr(self, name)
            new = np.full(n, fill, col.dtype)
            new[:old] = col
            setattr(self, name, new)

    def has(self, entry: int) -> bool:
        return 0 <= entry < len(self.size) and int(self.size[entry]) != _ABSENT

    def size_of(self, entry: int) -> int | None:
        return int(self.size[entry]) if self.has(entry) else None

    def source_of(self, entry: int) -> SourceId:
        e = entry
        return SourceId(int(self.size[e]), int(self.mtime[e]), int(self.ctime[e]), int(self.ino[e]))

    def generation(self, entry: int) -> int:
        return int(self.gen[entry]) if 0 <= entry < len(self.gen) else 0

    def digests(self, entry: int) -> BlockDigests:
        size = int(self.size[entry])
        rest = self.extra.get(entry, ()) if size > BLOCK else ()
        return BlockDigests(size, (int(self.digest0[entry]), *rest))

    def add(self, entry: int, source: SourceId, digests: BlockDigests) -> None:
        if entry < 0:
            raise ValueError(f"negative entry {entry}")
        if source.size != digests.size:
            raise ValueError(f"entry {entry}: source of {source.size} bytes, digests of {digests.size}")
        if entry >= len(self.size):
            self._grow(entry)
        if self.has(entry):
            self.remove(entry)
        self.size[entry] = source.size
        self.mtime[entry] = source.mtime_ns
        self.ctime[entry] = source.ctime_ns
        self.ino[entry] = source.ino
        self.digest0[entry] = digests.digests[0]
        if digests.blocks > 1:
            self.extra[entry] = digests.digests[1:]
        self.gen[entry] += 1
        self.count += 1
        self.data_bytes += source.size

    def remove(self, entry: int) -> int:
        """Forget ``entry``; returns its size."""
        size = int(self.size[entry])
        self.size[entry] = _ABSENT
        self.extra.pop(entry, None)
        self.gen[entry] += 1
        self.count -= 1
        self.data_bytes -= size
        return size

    def entries(self) -> npt.NDArray[np.intp]:
        return np.flatnonzero(self.size != _ABSENT)

    def memory_bytes(self) -> int:
        return len(self.size) * COLUMN_BYTES + 120 * len(self.extra)

    # ------------------------------------------------------------------ persistence

    def export(self) -> dict[str, npt.NDArray[Any]]:
        """Copies of the live rows (taken on the trio thread, written by a worker thread)."""
        ents = self.entries()
        multi = [e for e in ents.tolist() if e in self.extra]
        return {
            "entry": ents.astype(np.int64),
            "size": self.size[ents],
            "mtime": self.mtime[ents],
            "ctime": self.ctime[ents],
            "ino": self.ino[ents],
            "digest0": self.digest0[ents],
            "multi": np.array(multi, np.int64),
            "extra": np.array([d for e in multi for d in self.extra[e]], np.uint64),
        }

    @classmethod
    def from_arrays(cls, arrays: dict[str, npt.NDArray[Any]]) -> TierIndex:
        idx = cls()
        ents = arrays["entry"].astype(np.int64)
        sizes = arrays["size"].astype(np.int64)
        n = len(ents)
        if not all(len(arrays[k]) == n for k in ("size", "mtime", "ctime", "ino", "digest0")):
            raise ValueError("columns of different lengths")
        if n == 0:
            return idx
        if int(ents.min()) < 0 or int(ents.max()) >= 1 << 32 or int(sizes.min()) < 0 or len(np.unique(ents)) != n:
            raise ValueError("entries out of range or repeated, or negative sizes")
        idx._grow(int(ents.max()))
        idx.size[ents] = sizes
        idx.mtime[ents] = arrays["mtime"]
        idx.ctime[ents] = arrays["ctime"]
        idx.ino[ents] = arrays["ino"]
        idx.digest0[ents] = arrays["digest0"]
        idx.gen[ents] = 1
        idx.count = n
        idx.data_bytes = int(sizes.sum())
        extra = arrays["extra"].tolist()
        pos = 0
        for e in arrays["multi"].tolist():
            k = block_count(int(idx.size[e])) - 1 if idx.has(e) else -1
            if k < 1 or pos + k > len(extra):
                raise ValueError("extra digests do not match the sizes")
            idx.extra[e] = tuple(extra[pos : pos + k])
            pos += k
        if pos != len(extra) or len(idx.extra) != int(np.count_nonzero(sizes > BLOCK)):
            raise ValueError("extra digests do not match the sizes")
        return idx


_ARRAYS = ("entry", "size", "mtime", "ctime", "ino", "digest0", "multi", "extra")


def _meta(fingerprint: str, journal_gen: int) -> dict[str, Any]:
    return {"format": FORMAT, "block": BLOCK, "fingerprint": fingerprint, "journal_gen": journal_gen}


def fsync_dir(path: Path) -> None:
    dfd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def save(path: Path, arrays: dict[str, npt.NDArray[Any]], fingerprint: str, journal_gen: int) -> int:
    """Write atomically (temp name, fsync, rename, fsync the directory); returns the bytes written.

    Runs in a worker thread.  On any error the temporary file is removed and the error raised."""
    meta = _meta(fingerprint, journal_gen)
    meta["checksum"] = persisted_digest(meta, arrays)
    tmp = path.with_name(path.name + ".tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as fh:
            members: dict[str, Any] = {"meta": np.frombuffer(json.dumps(meta).encode(), np.uint8), **arrays}
            np.savez(fh, **members)
            fh.flush()
            os.fsync(fh.fileno())
            written = fh.tell()
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)
    return written


def _read(path: Path) -> tuple[dict[str, Any], dict[str, npt.NDArray[Any]]]:
    """The index's metadata and columns, of this format; IndexError_ saying why not."""
    try:
        with np.load(path, allow_pickle=False) as data:
            meta = json.loads(data["meta"].tobytes())
            arrays = {k: data[k] for k in _ARRAYS}
    except FileNotFoundError:
        raise IndexError_("no index") from None
    except Exception as exc:  # OSError, ValueError, KeyError, zipfile.BadZipFile... from a damaged file
        raise IndexError_(f"index unreadable ({exc.__class__.__name__})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT or meta.get("block") != BLOCK:
        found = meta.get("format") if isinstance(meta, dict) else "?"
        raise IndexError_(f"index of another format ({found}, this seerfs reads {FORMAT})")
    return meta, arrays


def written_by_seerfs(path: Path) -> str | None:
    """None when ``path`` is an index this user's seerfs wrote (a regular file of this user's whose
    checksum holds, for whatever snapshot); else why not.  What lets a tier directory from before
    tier markers be marked (layout.py)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return "no index"
    except OSError as exc:
        return f"index unreadable ({exc.strerror})"
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
        return f"{path.name} is not a file of this user's"
    try:
        meta, arrays = _read(path)
    except IndexError_ as exc:
        return str(exc)
    fingerprint, gen = meta.get("fingerprint"), meta.get("journal_gen")
    if not isinstance(fingerprint, str) or not isinstance(gen, int):
        return "index without a fingerprint or journal generation"
    if meta.get("checksum") != persisted_digest(_meta(fingerprint, gen), arrays):
        return "index checksum mismatch"
    return None


def load(path: Path, fingerprint: str) -> tuple[TierIndex, int]:
    """The persisted index and its journal generation, or IndexError_ saying why it cannot be used."""
    meta, arrays = _read(path)
    if meta.get("fingerprint") != fingerprint:
        raise IndexError_("source changed (snapshot fingerprint differs)")
    gen = meta.get("journal_gen")
    if not isinstance(gen, int) or gen < 1:
        raise IndexError_("index without a journal generation")
    if meta.get("checksum") != persisted_digest(_meta(fingerprint, gen), arrays):
        raise IndexError_("index checksum mismatch")
    try:
        return TierIndex.from_arrays(arrays), gen
    except ValueError as exc:
        raise IndexError_(f"index inconsistent ({exc})") from None
