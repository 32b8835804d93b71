"""Where the directory tier keeps what, and how it recognises its own files.

Layout under the tier path::

    seerfs-tier.json       the marker: the daemon's uid and a tier id; proves seerfs made this tier
    seerfs.lock            empty; flock-ed while a daemon uses the directory
    seerfs-index.npz       the persisted index (index.py)
    00/ .. ff/             fan-out by entry % 256, so no directory holds millions of names
        <entry>            one cached file, named by its snapshot entry index (decimal)
        <entry>.tmp        being written; renamed to <entry> when complete

What a tier may touch: the marker is written only into a directory that is empty (or holds nothing
but a lock file and empty fan-out directories, all a tier makes before its first copy), or that
holds a seerfs index whose checksum holds (a cache made before markers existed); any other
directory is refused at mount, and nothing in it is created or removed.  The lock file proves
nothing (it is created on first use).  In a marked directory, only names of exactly the shapes
above and owned by the daemon's user are ever deleted; an entry-named file of another user means
the mount is refused, and other names are kept (and charged to the budget).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import stat
from dataclasses import dataclass, field
from pathlib import Path

from fusefs.trust import read_file_itself

FANOUT = 256
LOCK_NAME = "seerfs.lock"
MARKER_NAME = "seerfs-tier.json"
MARKER_KIND = "seerfs directory tier"
TMP_SUFFIX = ".tmp"
_SUBDIR_RE = re.compile(r"^[0-9a-f]{2}$")
_FILE_RE = re.compile(r"^(0|[1-9][0-9]*)(\.tmp)?$")
DEFAULT_ALLOC = 4096


def subdir_name(entry: int) -> str:
    return f"{entry % FANOUT:02x}"


def file_path(root: Path, entry: int) -> str:
    return f"{root}/{entry % FANOUT:02x}/{entry}"


def tmp_path(root: Path, entry: int) -> str:
    return file_path(root, entry) + TMP_SUFFIX


def alloc_unit(root: Path) -> int:
    """The filesystem's allocation unit: file sizes are charged rounded up to it (at least 4 KiB)."""
    try:
        frsize = os.statvfs(root).f_frsize
    except OSError:
        return DEFAULT_ALLOC
    if frsize <= 0 or frsize & (frsize - 1) or frsize > (1 << 16):
        return DEFAULT_ALLOC
    return max(DEFAULT_ALLOC, frsize)


@dataclass(frozen=True)
class Marker:
    """What the marker records: whose tier this is, and which one (a random id, kept for its life)."""

    uid: int
    tier: str


def read_marker(root: Path) -> Marker | None:
    """The tier's marker; None when there is none.  ValueError saying why, when the file there is not
    this user's seerfs marker (another user's tier, a symlink, something else under that name)."""
    try:
        st, raw = read_file_itself(root / MARKER_NAME, 4096)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ValueError(f"{MARKER_NAME} cannot be read ({exc.strerror})") from None
    if raw is None or st.st_uid != os.geteuid():
        raise ValueError(f"{MARKER_NAME} is not a file of this user's (uid {st.st_uid})")
    try:
        doc = json.loads(raw)
    except ValueError:
        doc = None
    if not isinstance(doc, dict) or doc.get("seerfs") != MARKER_KIND:
        raise ValueError(f"{MARKER_NAME} is not a seerfs tier marker")
    uid, tier = doc.get("uid"), doc.get("tier")
    if not isinstance(uid, int) or not isinstance(tier, str) or not tier:
        raise ValueError(f"{MARKER_NAME} is not a seerfs tier marker")
    if uid != os.geteuid():
        raise ValueError(f"{MARKER_NAME} says it is the tier of uid {uid}, not of this user")
    return Marker(uid, tier)


def write_marker(root: Path) -> Marker:
    """Mark ``root`` as this user's tier: written whole under a fresh name (O_EXCL, 0600), fsynced,
    renamed into place.  Only once :func:`looks_fresh` or a valid index allowed it (directory.py)."""
    marker = Marker(os.geteuid(), secrets.token_hex(8))
    data = json.dumps({"seerfs": MARKER_KIND, "uid": marker.uid, "tier": marker.tier}).encode() + b"\n"
    tmp = root / f".{MARKER_NAME}.{secrets.token_hex(4)}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, root / MARKER_NAME)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return marker


def looks_fresh(root: Path) -> bool:
    """Whether ``root`` holds nothing a tier could take for someone else's: it is empty, or holds
    only a lock file and empty fan-out directories (what a tier makes before its first copy)."""
    with os.scandir(root) as it:
        for de in it:
            if de.name == LOCK_NAME and de.is_file(follow_symlinks=False):
                continue
            if not (_SUBDIR_RE.match(de.name) and de.is_dir(follow_symlinks=False)):
                return False
            with os.scandir(de.path) as sub:
                if next(sub, None) is not None:
                    return False
    return True


@dataclass
class SubdirScan:
    """Our names found in one fan-out directory."""

    dir_bytes: int = 0  # the directory's own allocated bytes (0 when missing)
    foreign_bytes: int = 0  # allocated bytes of names that are not ours (kept, but charged)
    files: dict[int, tuple[int, int]] = field(default_factory=dict)  # entry -> (size, allocated bytes)
    temporary: list[str] = field(default_factory=list)  # leftover <entry>.tmp paths
    foreign_owned: list[tuple[str, int]] = field(default_factory=list)  # entry-named, another uid's: (path, uid)


def scan_subdir(root: Path, name: str) -> SubdirScan:
    """List one fan-out directory (blocking; runs in a thread pool at open).  An entry-named file
    owned by another user is not ours: it is listed in ``foreign_owned`` (the tier refuses to open)."""
    out = SubdirScan()
    path = root / name
    uid = os.geteuid()
    try:
        out.dir_bytes = os.lstat(path).st_blocks * 512
        it = os.scandir(path)
    except FileNotFoundError:
        return out
    with it:
        for de in it:
            m = _FILE_RE.match(de.name)
            st = de.stat(follow_symlinks=False)
            if m is not None and st.st_uid != uid:
                out.foreign_owned.append((de.path, st.st_uid))
            if m is None or not stat.S_ISREG(st.st_mode) or st.st_uid != uid:
                is_dir = stat.S_ISDIR(st.st_mode)
                out.foreign_bytes += disk_usage(Path(de.path)) if is_dir else st.st_blocks * 512
                continue
            if m.group(2):
                out.temporary.append(de.path)
            else:
                out.files[int(m.group(1))] = (st.st_size, st.st_blocks * 512)
    return out


def subdir_names() -> list[str]:
    return [f"{i:02x}" for i in range(FANOUT)]


def foreign_top_level(root: Path, ours: set[str]) -> int:
    """Allocated bytes of what sits in the tier directory beside our names (never deleted)."""
    total = 0
    with os.scandir(root) as it:
        for de in it:
            if de.name in ours or _SUBDIR_RE.match(de.name):
                continue
            st = de.stat(follow_symlinks=False)
            total += disk_usage(Path(de.path)) if stat.S_ISDIR(st.st_mode) else st.st_blocks * 512
    return total


def disk_usage(path: Path) -> int:
    """What ``du -s --block-size=1`` reports: allocated bytes of everything under ``path``
    (the directory itself included), hard links counted once, symlinks not followed."""
    seen: set[tuple[int, int]] = set()
    total = 0
    stack = [str(path)]
    first = True
    while stack:
        top = stack.pop()
        if first:
            st = os.lstat(top)
            seen.add((st.st_dev, st.st_ino))
            total += st.st_blocks * 512
            first = False
        try:
            it = os.scandir(top)
        except OSError:
            continue
        with it:
            for de in it:
                try:
                    st = de.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                if st.st_nlink > 1 or stat.S_ISDIR(st.st_mode):  # only these can be met twice
                    key = (st.st_dev, st.st_ino)
                    if key in seen:
                        continue
                    seen.add(key)
                total += st.st_blocks * 512
                if stat.S_ISDIR(st.st_mode):
                    stack.append(de.path)
    return total
