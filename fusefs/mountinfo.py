"""Reading the mount table without touching the mounts themselves (a dead FUSE mount hangs stat)."""

from __future__ import annotations

import contextlib
import os
import re
from dataclasses import dataclass

FSTYPE = "fuse.seerfs"


@dataclass(frozen=True)
class MountEntry:
    mountpoint: str
    fstype: str
    source: str
    device: str  # "major:minor", names the bdi for read_ahead_kb


def _unescape(field: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def mounts(path: str = "/proc/self/mountinfo") -> list[MountEntry]:
    out: list[MountEntry] = []
    with open(path, encoding="utf-8", errors="surrogateescape") as fh:
        for line in fh:
            left, _, right = line.partition(" - ")
            lf = left.split()
            rf = right.split()
            if len(lf) < 5 or len(rf) < 2:
                continue
            out.append(MountEntry(_unescape(lf[4]), rf[0], _unescape(rf[1]), lf[2]))
    return out


def normalize(path: str) -> str:
    """Absolute, normalised path *without* resolving the mount itself (which may be dead)."""
    path = os.path.abspath(path)
    head, tail = os.path.split(path)
    with contextlib.suppress(OSError):
        head = os.path.realpath(head)
    return os.path.join(head, tail) if tail else head


def find(mountpoint: str) -> MountEntry | None:
    """The topmost mount at ``mountpoint``, if any."""
    target = normalize(mountpoint)
    found = None
    for entry in mounts():
        if entry.mountpoint == target:
            found = entry
    return found


def is_seerfs(mountpoint: str) -> bool:
    entry = find(mountpoint)
    return entry is not None and entry.fstype == FSTYPE
