"""The metadata snapshot: every entry of the source tree in numpy columns, walked once per mount.

Why: directory scans of millions of files through FUSE are the most reported failure of the
alternatives.  After the walk, lookup/getattr/readdir/readlink are answered from
memory and never touch the PFS.  Memory budget (asserted by tests and the benchmark): 82 bytes per
entry plus its name bytes, far under the 200-byte budget; see :meth:`Snapshot.bytes_per_entry`.  Of
those, 8 hold the inode number, which with size, mtime and ctime is each file's identity
(:mod:`fusefs.meta.identity`): cached copies are served only while their source still has it.

The persisted snapshot carries its format version and a digest over every column and its JSON part
(:mod:`fusefs.meta.digests`); a snapshot of another format or failing its digest is walked again.

Inode numbers are ``entry index + 1`` so the root (entry 0) is FUSE's ROOT_INODE, and they are
stable across remounts that reuse the persisted snapshot.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, TypedDict

import numpy as np
import numpy.typing as npt
import xxhash

from fusefs.errors import SourceError
from fusefs.meta.digests import persisted_digest, roundtrip
from fusefs.meta.identity import SourceColumns
from fusefs.meta.walker import STAT_FIELDS, DirChunk, stat_paths, stat_row, walk_levels
from fusefs.progress import Progress
from placement.statusfields import gauge
from placement.tree import (
    KIND_DIR,
    KIND_FILE,
    KIND_SYMLINK,
    LINK_DANGLING,
    LINK_NONE,
    LINK_OUTSIDE,
    TreeArrays,
)

FORMAT_VERSION = 2
"""2: the inode column and the persisted digest."""
STALE_SUFFIX = ".stale"
"""Next to a persisted snapshot: files a mount saw change since it was walked (the next mount walks again)."""
_MAX_LINK_DEPTH = 40  # the kernel's own limit (ELOOP)

_EXTRA_COLUMNS = {
    "mode": np.uint32,
    "uid": np.uint32,
    "gid": np.uint32,
    "nlink": np.uint32,
    "atime_ns": np.int64,
    "ctime_ns": np.int64,
    "ino": np.uint64,
}
_TREE_COLUMNS = (
    "names",
    "name_off",
    "name_len",
    "parent",
    "kind",
    "size",
    "mtime_ns",
    "child_start",
    "child_count",
    "link_target",
)


class SnapshotCounts(TypedDict):
    entries: Annotated[int, gauge("entries of the tree (files, directories, symlinks)")]
    files: Annotated[int, gauge("regular files")]
    dirs: Annotated[int, gauge("directories")]
    symlinks: Annotated[int, gauge("symlinks")]
    bytes: Annotated[int, gauge("sum of the files' sizes")]


@dataclass(eq=False)
class Snapshot:
    """The source tree's metadata; ``tree`` is the plain-array view handed to ``placement``."""

    source: bytes  # realpath of the source root
    tree: TreeArrays
    mode: npt.NDArray[np.uint32]
    uid: npt.NDArray[np.uint32]
    gid: npt.NDArray[np.uint32]
    nlink: npt.NDArray[np.uint32]
    atime_ns: npt.NDArray[np.int64]
    ctime_ns: npt.NDArray[np.int64]
    ino: npt.NDArray[np.uint64]
    link_index: npt.NDArray[np.uint32]  # sorted entry indices of symlinks
    link_off: npt.NDArray[np.uint64]  # len(link_index) + 1 offsets into link_blob
    link_blob: npt.NDArray[np.uint8]
    fingerprint: str = ""
    reused: bool = False
    build_seconds: float = 0.0
    external_links: list[str] = field(default_factory=list)  # relative paths of links leaving the tree
    errors: list[str] = field(default_factory=list)  # directories that could not be listed

    # ------------------------------------------------------------------ queries

    def __len__(self) -> int:
        return len(self.tree)

    def readlink(self, i: int) -> bytes:
        k = int(np.searchsorted(self.link_index, i))
        if k >= len(self.link_index) or int(self.link_index[k]) != i:
            raise KeyError(i)
        return self.link_blob[int(self.link_off[k]) : int(self.link_off[k + 1])].tobytes()

    def source_ids(self) -> SourceColumns:
        """Every entry's identity as recorded by the walk (views of the snapshot's columns)."""
        return SourceColumns(self.tree.size, self.tree.mtime_ns, self.ctime_ns, self.ino)

    def source_path(self, i: int) -> bytes:
        rel = self.tree.path(i)
        return os.path.join(self.source, rel) if rel else self.source

    def counts(self) -> SnapshotCounts:
        kind = self.tree.kind
        files = kind == KIND_FILE
        return {
            "entries": len(self),
            "files": int(files.sum()),
            "dirs": int((kind == KIND_DIR).sum()),
            "symlinks": int((kind == KIND_SYMLINK).sum()),
            "bytes": int(self.tree.size[files].sum()),
        }

    def columns(self) -> dict[str, npt.NDArray[Any]]:
        cols: dict[str, npt.NDArray[Any]] = {name: getattr(self.tree, name) for name in _TREE_COLUMNS}
        cols.update({name: getattr(self, name) for name in _EXTRA_COLUMNS})
        cols.update(link_index=self.link_index, link_off=self.link_off, link_blob=self.link_blob)
        return cols

    def memory_bytes(self) -> int:
        return sum(int(a.nbytes) for a in self.columns().values())

    def bytes_per_entry(self) -> float:
        """Memory per entry excluding name and link-target bytes (the budgeted figure)."""
        variable = int(self.tree.names.nbytes) + int(self.link_blob.nbytes)
        return (self.memory_bytes() - variable) / max(1, len(self))

    # ------------------------------------------------------------------ building

    @classmethod
    def scan(cls, source: str | bytes, threads: int = 8, progress: Progress | None = None) -> Snapshot:
        """Walk ``source`` (a directory) into a new snapshot; ``progress`` counts the entries walked."""
        t0 = time.monotonic()
        root = os.path.realpath(os.fsencode(source))
        try:
            root_stat = os.stat(root)
        except OSError as exc:
            raise SourceError(f"source {os.fsdecode(source)}: {exc.strerror}") from None
        if not os.path.isdir(root):
            raise SourceError(f"source {os.fsdecode(source)}: not a directory")
        if not os.access(root, os.R_OK | os.X_OK):
            raise SourceError(f"source {os.fsdecode(source)}: permission denied")

        chunks: list[DirChunk] = []
        dir_indices: list[int] = []
        for indices, level_chunks in walk_levels(root, threads, progress):
            dir_indices.extend(indices)
            chunks.extend(level_chunks)
        if progress is not None:
            progress.set_phase("indexing")
        snap = cls._assemble(root, root_stat, dir_indices, chunks)
        if progress is not None:
            progress.set_phase("fingerprinting directories")
        snap.fingerprint = snap.compute_fingerprint(threads)
        snap.build_seconds = time.monotonic() - t0
        return snap

    @classmethod
    def _assemble(
        cls, root: bytes, root_stat: os.stat_result, dir_indices: list[int], chunks: list[DirChunk]
    ) -> Snapshot:
        n = 1 + sum(len(c) for c in chunks)
        if n >= 2**32:
            raise SourceError("source has more than 2**32 entries")
        lens = np.concatenate([np.zeros(1, np.uint8)] + [c.lens for c in chunks])
        blob = b"".join(c.blob for c in chunks)
        names = np.frombuffer(blob, dtype=np.uint8)  # a view: TreeArrays.blob reuses the bytes object
        name_off = np.zeros(n, np.uint64)
        np.cumsum(lens[:-1], out=name_off[1:])
        stats = np.concatenate([np.array([stat_row(root_stat)], np.int64)] + [c.stats for c in chunks])
        kind = np.concatenate([np.array([KIND_DIR], np.uint8)] + [c.kind for c in chunks])
        parent = np.zeros(n, np.uint32)
        child_start = np.zeros(n, np.uint32)
        child_count = np.zeros(n, np.uint32)
        links: dict[int, bytes] = {}
        base = 1
        for d, chunk in zip(dir_indices, chunks, strict=True):
            k = len(chunk)
            child_start[d] = base
            child_count[d] = k
            parent[base : base + k] = d
            for pos, target in chunk.links.items():
                links[base + pos] = target
            base += k
        col = {name: stats[:, STAT_FIELDS.index(name)] for name in STAT_FIELDS}
        link_index = np.array(sorted(links), dtype=np.uint32)
        link_targets = [links[int(i)] for i in link_index]
        link_off = np.zeros(len(link_index) + 1, np.uint64)
        np.cumsum([len(t) for t in link_targets], out=link_off[1:])
        link_blob = np.frombuffer(b"".join(link_targets), np.uint8).copy()
        tree = TreeArrays(
            names=names,
            name_off=name_off,
            name_len=lens,
            parent=parent,
            kind=kind,
            size=col["size"].copy(),
            mtime_ns=col["mtime_ns"].copy(),
            child_start=child_start,
            child_count=child_count,
            link_target=np.full(n, LINK_NONE, np.int32),
        )
        extra: dict[str, Any] = {name: col[name].astype(dtype) for name, dtype in _EXTRA_COLUMNS.items()}
        snap = cls(
            source=root,
            tree=tree,
            **extra,
            link_index=link_index,
            link_off=link_off,
            link_blob=link_blob,
            errors=[c.error for c in chunks if c.error],
        )
        snap._resolve_links()
        return snap

    def _resolve_links(self) -> None:
        """Resolve every symlink the way the kernel would *through the mount*.

        An absolute target, or a relative one climbing above the root, leaves the mount: reads
        through it bypass seerfs, so it is LINK_OUTSIDE and listed in status.
        """
        targets = self.tree.link_target
        external: list[str] = []
        for i in self.link_index.tolist():
            r = self._follow(int(self.tree.parent[i]), self.readlink(i), 0)
            targets[i] = r
            if r == LINK_OUTSIDE:
                external.append(os.fsdecode(self.tree.path(i)))
        self.external_links = external

    def _follow(self, cur: int, target: bytes, depth: int) -> int:
        if depth >= _MAX_LINK_DEPTH:
            return LINK_DANGLING
        if target.startswith(b"/"):
            return LINK_OUTSIDE
        tree = self.tree
        parts = [p for p in target.split(b"/") if p not in (b"", b".")]
        for k, part in enumerate(parts):
            if tree.kind[cur] != KIND_DIR:
                return LINK_DANGLING
            if part == b"..":
                if cur == 0:
                    return LINK_OUTSIDE
                cur = int(tree.parent[cur])
                continue
            child = tree.find_child(cur, part)
            if child < 0:
                return LINK_DANGLING
            if tree.kind[child] == KIND_SYMLINK:
                child = self._follow(int(tree.parent[child]), self.readlink(child), depth + 1)
                if child < 0:
                    return child
            if k < len(parts) - 1 and tree.kind[child] != KIND_DIR:
                return LINK_DANGLING
            cur = child
        return cur

    # ------------------------------------------------------------------ fingerprint and persistence

    def dir_paths(self) -> list[bytes]:
        """Absolute source paths of every directory, in index order (parents precede children)."""
        tree = self.tree
        dirs = np.flatnonzero(tree.kind == KIND_DIR)
        paths: dict[int, bytes] = {0: self.source}
        out: list[bytes] = []
        for d in dirs.tolist():
            if d:
                paths[d] = os.path.join(paths[int(tree.parent[d])], tree.name(d))
            out.append(paths[d])
        return out

    def content_digest(self) -> str:
        """What the tree holds (names, shape, sizes, mtimes), independent of the host it was read on.

        The fingerprint includes st_dev and inode numbers, which differ between nodes mounting the
        same PFS; nodes compare this instead to agree that they plan over the same dataset.
        """
        h = xxhash.xxh3_128()
        t = self.tree
        for col in (t.names, t.name_len, t.parent, t.kind, t.size, t.mtime_ns, t.link_target):
            h.update(np.ascontiguousarray(col).astype(col.dtype.newbyteorder("<"), copy=False).tobytes())
        return h.hexdigest()

    def compute_fingerprint(self, threads: int = 8) -> str:
        """Cheap change detector: the identity and times of every directory (not of every file).

        Adding, removing or renaming an entry changes its directory's mtime/ctime; a file rewritten
        in place is caught at read time instead (size/mtime check, EIO).
        """
        return _fingerprint(self.source, self.dir_paths(), threads)

    def _meta(self) -> dict[str, Any]:
        return roundtrip(
            {
                "format": FORMAT_VERSION,
                "source": os.fsdecode(self.source),
                "fingerprint": self.fingerprint,
                "external_links": self.external_links,
                "errors": self.errors,
                "build_seconds": self.build_seconds,
            }
        )

    def save(self, path: Path) -> None:
        """Persist atomically: a crash mid-write never leaves a snapshot that loads as valid.

        Raises OSError (a full disk, say) after removing its temporary file."""
        path.parent.mkdir(parents=True, exist_ok=True)
        meta = self._meta()
        columns = self.columns()
        meta["digest"] = persisted_digest(meta, columns)
        # A name no other writer has: daemons on several nodes may share cache_dir (the default is
        # under $HOME) and persist the same source's snapshot at once, with the same process ids.
        fd, name = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
        tmp = Path(name)
        try:
            with open(fd, "wb") as fh:
                meta_bytes = np.frombuffer(json.dumps(meta).encode(), np.uint8)
                arrays: dict[str, Any] = {"meta": meta_bytes, **columns}
                np.savez(fh, **arrays)
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    @classmethod
    def load(cls, path: Path) -> Snapshot:
        """The persisted snapshot, verified; ValueError saying why it cannot be used."""
        try:
            with np.load(path, allow_pickle=False) as data:
                meta = json.loads(data["meta"].tobytes())
                cols: dict[str, Any] = {k: data[k] for k in data.files if k != "meta"}
        except (OSError, ValueError, KeyError, EOFError) as exc:
            raise ValueError(f"unreadable ({exc.__class__.__name__}: {exc})") from None
        except Exception as exc:  # zipfile.BadZipFile and whatever else a damaged file raises
            raise ValueError(f"unreadable ({exc.__class__.__name__})") from None
        if not isinstance(meta, dict) or meta.get("format") != FORMAT_VERSION:
            found = meta.get("format") if isinstance(meta, dict) else "?"
            raise ValueError(f"written in format {found}, this seerfs reads format {FORMAT_VERSION}")
        recorded = meta.pop("digest", None)
        if recorded != persisted_digest(meta, cols):
            raise ValueError("digest mismatch (the file was changed or damaged)")
        expected = set(_TREE_COLUMNS) | set(_EXTRA_COLUMNS) | {"link_index", "link_off", "link_blob"}
        if set(cols) != expected:
            raise ValueError(f"columns {sorted(set(cols) ^ expected)} missing or unexpected")
        cols["names"] = np.frombuffer(cols["names"].tobytes(), np.uint8)  # see TreeArrays.blob
        tree = TreeArrays(**{k: cols.pop(k) for k in _TREE_COLUMNS})
        return cls(
            source=os.fsencode(meta["source"]),
            tree=tree,
            fingerprint=meta["fingerprint"],
            external_links=meta["external_links"],
            errors=meta["errors"],
            build_seconds=meta["build_seconds"],
            **cols,
        )


def _fingerprint(root: bytes, dir_paths: list[bytes], threads: int) -> str:
    h = xxhash.xxh3_128()
    h.update(f"seerfs-snapshot-{FORMAT_VERSION}\0".encode() + root + b"\0")
    for row in stat_paths(dir_paths, threads):
        h.update(repr(row).encode())
    return h.hexdigest()


def snapshot_file(cache_dir: Path, source: bytes) -> Path:
    return cache_dir / "snapshots" / f"{xxhash.xxh64_hexdigest(source)}.npz"


def mark_stale(cache_dir: Path, source: bytes, lines: list[str]) -> None:
    """Record next to the persisted snapshot that files changed since it was walked.

    A rewrite in place changes no directory, so the fingerprint alone would let the next mount reuse
    the old sizes and serve EIO for these files forever; the marker makes it walk again.  Raises
    OSError (the caller logs it: a full cache_dir must not stop the daemon)."""
    path = snapshot_file(cache_dir, source)
    marker = path.with_name(path.name + STALE_SUFFIX)
    fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    with open(fd, "a") as fh:  # O_NOFOLLOW: never written through a symlink at its name
        fh.write("".join(line.replace("\n", " ") + "\n" for line in lines))


def previous_entries(path: Path) -> int | None:
    """Entries in the persisted snapshot at ``path`` (one byte per entry is read), or None."""
    try:
        with np.load(path) as data:
            return int(data["kind"].shape[0])
    except Exception:  # a damaged file: the walk just shows no total
        return None


def load_or_scan(
    source: str,
    cache_dir: Path,
    threads: int = 8,
    reuse: bool = True,
    rescan: bool = False,
    progress: Progress | None = None,
) -> tuple[Snapshot, str]:
    """The mount's snapshot: the persisted one when its fingerprint still matches, else a new walk.

    Returns the snapshot and a one-line reason for the choice (shown in status).  ``progress``
    follows the walk; a persisted snapshot of the same source, even a stale one, gives the walk its
    expected entry count, hence a remaining time.
    """
    root = os.path.realpath(os.fsencode(source))
    path = snapshot_file(cache_dir, root)
    marker = path.with_name(path.name + STALE_SUFFIX)
    if progress is not None:
        progress.start("checking the persisted snapshot")
    expected: int | None = None
    reason = "no persisted snapshot"
    if rescan:
        reason = "rescan requested"
    elif not reuse:
        reason = "snapshot.reuse is off"
    elif marker.exists():
        reason = "files changed since the persisted snapshot (seen by an earlier mount)"
    elif path.exists():
        t0 = time.monotonic()
        try:
            old = Snapshot.load(path)
        except ValueError as exc:
            reason = f"persisted snapshot refused: {exc}"
        else:
            if old.source == root and _fingerprint(root, old.dir_paths(), threads) == old.fingerprint:
                old.reused = True
                old.build_seconds = time.monotonic() - t0
                if progress is not None:
                    progress.finish(done=len(old), detail="persisted snapshot reused")
                return old, "source unchanged since the persisted snapshot"
            reason = "source changed since the persisted snapshot"
            expected = len(old)
    if progress is not None:
        if expected is None and path.exists():
            expected = previous_entries(path)
        progress.start("walking", total=expected)
    try:
        snap = Snapshot.scan(root, threads, progress)
    except BaseException:
        if progress is not None:
            progress.finish("failed")
        raise
    try:
        snap.save(path)
        marker.unlink(missing_ok=True)
    except OSError as exc:
        snap.errors.append(f"snapshot not persisted: {path}: {exc.strerror}")
    if progress is not None:
        progress.finish(done=len(snap))
    return snap, reason
