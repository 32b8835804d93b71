"""The daemon's own memory cgroup: where it is, its limit, what it holds and its pressure events.

Both hierarchies are read.  cgroup v2: the ``0::PATH`` line of ``/proc/self/cgroup`` under the
``cgroup2`` mount, with ``memory.max``, ``memory.high``, ``memory.current``, ``memory.stat`` and
``memory.events`` (high, max, oom, oom_kill).  cgroup v1, where the memory controller has a
hierarchy of its own (``memory:`` line, a ``cgroup`` mount with the ``memory`` option):
``memory.limit_in_bytes``, ``memory.usage_in_bytes``, ``memory.stat`` (``total_*``),
``memory.failcnt`` (the charges that hit the limit: v2's ``max``) and ``memory.oom_control``
(``oom_kill``, ``under_oom``).  The mounts are found in ``/proc/self/mountinfo``, never at a fixed
path, and a mount of a subtree (a container's) is followed through its root.  When both
hierarchies exist the one that has the memory controller wins: v1's ``memory`` line, or a v2 cgroup
whose directory has ``memory.current``.

The limit that binds is the smallest over the cgroup and its ancestors (Slurm puts the job's limit
on the job's cgroup, the step's processes in a child), so every level up to the mount's root is
read, and each level that has a limit is one whose room can run out.

What can be OOM-killed for: a cgroup's usage includes the page cache its processes brought in,
which the kernel reclaims before it kills anyone, and which fills every cgroup to its limit when
files are read.  So ``unreclaimable`` is the usage less the file pages that are not shared memory
(v2 ``file - shmem``, v1 ``total_cache - total_shmem``): anonymous memory, tmpfs and the kernel's
own.  ``high`` and ``max`` events rise whenever the page cache reaches the limit too; ``oom`` and
``oom_kill`` only when reclaiming was not enough.

Parsing is pure (:func:`locate`, :func:`parse_flat`, :func:`parse_limit`): the tests feed it the
files of both hierarchies as text.  :func:`read` does the I/O; the daemon calls it in a worker thread.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

Version = Literal["v1", "v2"]

UNLIMITED = 1 << 62
"""A limit at or above this is none: v1 shows "no limit" as the page counter's maximum (9223372036854771712
with 4 KiB pages), v2 as ``max``."""

EVENTS = ("high", "max", "oom", "oom_kill")
"""The pressure counters read from each level (v1: ``failcnt`` stands for max, ``oom_control``'s
``oom_kill`` for both oom and oom_kill; it has no high)."""


@dataclass(frozen=True)
class MemoryCgroup:
    """Where the daemon's memory cgroup is: its path in the hierarchy and the directories of it and
    every ancestor up to the mount's root, innermost first."""

    version: Version
    path: str
    dirs: tuple[str, ...]


@dataclass(frozen=True)
class Level:
    """One cgroup of the chain as read now."""

    path: str
    limit: int | None  # memory.max / memory.limit_in_bytes (None: no limit)
    high: int | None  # memory.high (v2 only; None: none)
    usage: int
    unreclaimable: int  # usage less the page cache the kernel can reclaim (see the module docstring)
    events: dict[str, int] = field(default_factory=dict)

    @property
    def bound(self) -> int | None:
        """The least of its limit and its high: the usage this cgroup keeps below."""
        limits = [x for x in (self.limit, self.high) if x is not None]
        return min(limits) if limits else None


@dataclass(frozen=True)
class Reading:
    """The chain read at one moment, innermost first."""

    cgroup: MemoryCgroup
    levels: tuple[Level, ...]

    @property
    def binding(self) -> Level | None:
        """The level with the least room under its bound (None: no level has a limit)."""
        limited = [lv for lv in self.levels if lv.bound is not None]
        return min(limited, key=lambda lv: (lv.bound or 0) - lv.unreclaimable) if limited else None

    @property
    def limit(self) -> int | None:
        """The effective limit: the smallest over the cgroup and its ancestors."""
        limits = [lv.limit for lv in self.levels if lv.limit is not None]
        return min(limits) if limits else None

    def events(self) -> dict[str, dict[str, int]]:
        """Each limited level's counters, by path (counters are compared level by level)."""
        return {lv.path: lv.events for lv in self.levels if lv.bound is not None}


# --------------------------------------------------------------------------- parsing (pure)


def _unescape(field_text: str) -> str:
    """mountinfo escapes space, tab, newline and backslash as octal (``\\040``)."""
    out, i = [], 0
    while i < len(field_text):
        c = field_text[i]
        if c == "\\" and i + 3 < len(field_text) and field_text[i + 1 : i + 4].isdigit():
            out.append(chr(int(field_text[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(c)
            i += 1
    return "".join(out)


@dataclass(frozen=True)
class _Mount:
    mountpoint: str
    root: str
    fstype: str
    super_options: frozenset[str]


def _mounts(mountinfo: str) -> list[_Mount]:
    out = []
    for line in mountinfo.splitlines():
        head, sep, tail = line.partition(" - ")
        fields, rest = head.split(), tail.split()
        if not sep or len(fields) < 5 or len(rest) < 2:
            continue
        opts = frozenset(rest[2].split(",")) if len(rest) > 2 else frozenset()
        out.append(_Mount(_unescape(fields[4]), _unescape(fields[3]), rest[0], opts))
    return out


def _inside(path: str, mount: _Mount) -> str | None:
    """The directory of cgroup ``path`` under ``mount``, or None when the mount does not show it."""
    root = mount.root.rstrip("/")
    if root and path != root and not path.startswith(root + "/"):
        return None
    rel = path[len(root) :].strip("/")
    return os.path.join(mount.mountpoint, rel) if rel else mount.mountpoint


def _chain(directory: str, top: str) -> tuple[str, ...]:
    """``directory`` and each parent up to ``top`` (the mount's root), innermost first."""
    dirs = [directory]
    while dirs[-1].rstrip("/") != top.rstrip("/") and len(dirs) < 64:
        parent = os.path.dirname(dirs[-1].rstrip("/"))
        if parent == dirs[-1] or not parent.startswith(top.rstrip("/")):
            break
        dirs.append(parent)
    return tuple(dirs)


def locate(proc_cgroup: str, mountinfo: str, exists: Callable[[str], bool] = os.path.exists) -> MemoryCgroup | None:
    """The memory cgroup ``/proc/self/cgroup`` names, under the mount ``/proc/self/mountinfo`` lists;
    None when neither hierarchy has the memory controller for this process.  ``exists`` is asked for
    ``memory.current`` of a v2 cgroup (a v2 hierarchy without the memory controller has none)."""
    v1_path = v2_path = None
    for line in proc_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hier, controllers, path = parts
        if hier == "0" and controllers == "":
            v2_path = path
        elif "memory" in controllers.split(","):
            v1_path = path
    mounts = _mounts(mountinfo)
    if v1_path is not None:
        for m in mounts:
            if m.fstype == "cgroup" and "memory" in m.super_options:
                d = _inside(v1_path, m)
                if d is not None:
                    return MemoryCgroup("v1", v1_path, _chain(d, m.mountpoint))
    if v2_path is not None:
        for m in mounts:
            if m.fstype == "cgroup2":
                d = _inside(v2_path, m)
                if d is not None and exists(os.path.join(d, "memory.current")):
                    return MemoryCgroup("v2", v2_path, _chain(d, m.mountpoint))
    return None


def parse_flat(text: str) -> dict[str, int]:
    """``KEY VALUE`` lines (memory.stat, memory.events, memory.oom_control)."""
    out = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].lstrip("-").isdigit():
            out[parts[0]] = int(parts[1])
    return out


def parse_limit(text: str) -> int | None:
    """A limit file: bytes, or None for ``max`` (v2) or the v1 page counter's maximum."""
    value = text.strip()
    if not value.isdigit():
        return None  # "max", or nothing readable: no limit to fit
    n = int(value)
    return None if n >= UNLIMITED else n


def _count(text: str | None) -> int:
    value = (text or "").strip()
    return int(value) if value.isdigit() else 0


def level_of(version: Version, path: str, files: Callable[[str], str | None]) -> Level:
    """One level from its files; ``files(name)`` gives a file's text, or None when it is missing
    (a root cgroup has no limit files)."""
    stat = parse_flat(files("memory.stat") or "")
    if version == "v2":
        limit = parse_limit(files("memory.max") or "max")
        high = parse_limit(files("memory.high") or "max")
        usage = _count(files("memory.current"))
        reclaimable = max(0, stat.get("file", 0) - stat.get("shmem", 0))
        raw = parse_flat(files("memory.events") or "")
        events = {k: raw.get(k, 0) for k in EVENTS}
    else:
        limit = parse_limit(files("memory.limit_in_bytes") or "max")
        high = None
        usage = _count(files("memory.usage_in_bytes"))
        reclaimable = max(0, stat.get("total_cache", 0) - stat.get("total_shmem", 0))
        oom = parse_flat(files("memory.oom_control") or "")
        kills = oom.get("oom_kill", 0)
        events = {
            "high": 0,
            "max": _count(files("memory.failcnt")),
            "oom": kills + oom.get("under_oom", 0),
            "oom_kill": kills,
        }
    return Level(path, limit, high, usage, max(0, usage - reclaimable), events)


# --------------------------------------------------------------------------- reading (I/O)


def _read_text(path: str) -> str | None:
    try:
        with open(path, encoding="ascii", errors="replace") as fh:
            return fh.read()
    except OSError:
        return None


def find() -> MemoryCgroup | None:
    """This process's memory cgroup, or None (no memory controller, or /proc unreadable)."""
    proc = _read_text("/proc/self/cgroup")
    mountinfo = _read_text("/proc/self/mountinfo")
    if proc is None or mountinfo is None:
        return None
    return locate(proc, mountinfo)


def read(cgroup: MemoryCgroup) -> Reading:
    """Every level of the chain now (blocking: a worker thread in the daemon).  A level whose files
    vanished (its cgroup was removed) reads as unlimited and empty."""
    levels = []
    path = cgroup.path.rstrip("/") or "/"
    for d in cgroup.dirs:
        levels.append(level_of(cgroup.version, path, functools.partial(_read_in, d)))
        path = os.path.dirname(path) or "/"
    return Reading(cgroup, tuple(levels))


def _read_in(directory: str, name: str) -> str | None:
    return _read_text(os.path.join(directory, name))


def children_rss() -> int:
    """Bytes resident in this process's children (the plan and seed-search workers), from each
    thread's ``children`` list: trio starts them from worker threads."""
    pids: set[str] = set()
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return 0
    for tid in tids:
        pids.update((_read_text(f"/proc/self/task/{tid}/children") or "").split())
    return sum(_status_rss(_read_text(f"/proc/{pid}/status") or "") for pid in pids)


def _status_rss(text: str) -> int:
    for line in text.splitlines():
        if line.startswith("VmRSS:"):
            parts = line.split()
            return int(parts[1]) * 1024 if len(parts) >= 2 and parts[1].isdigit() else 0
    return 0
