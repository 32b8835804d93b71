"""``seerfs umount``: unmount, wait for the daemon, clean up dead mounts, name who keeps it busy.

A busy mount's holders come from two places: /proc (open files, cwd, root, mappings under the
mount), and the daemon itself, which knows the pid of every request it is serving (a reader blocked
inside open, on a hung source, holds the mount but has no descriptor yet): status section
``requests`` (:mod:`fusefs.fuse.inflight`), read with a timeout so a hung daemon costs seconds,
not a hung umount.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from fusefs import mountinfo
from fusefs.daemon.runtime import MountRecord, StartRecord, pid_alive, wait_pid_exit
from fusefs.errors import BusyError, FuseUnavailable, NotMounted, SeerfsError, TimeoutExpired

STATUS_TIMEOUT = 5.0
"""Seconds a busy umount waits for the daemon to say which requests it serves (seerfs(1) says so)."""

OWN_HOLD_WAIT = 5.0
"""Seconds a busy umount retries while no process but the daemon holds the mount (seerfs(1) says so).

The daemon reads its own pages back through the mount (to fill a tier, or for a peer), a few
milliseconds a file; an umount that lands on one gets EBUSY although no user holds anything, and an
epilogue's umount failing on the daemon's own work is the daemon's fault.  A user's holder fails it
at once, as before."""


def holders(
    mountpoint: str, requests: Iterable[dict[str, Any]] = (), daemon_pid: int = 0
) -> list[tuple[int, str, str]]:
    """(pid, command, why) of each process holding ``mountpoint``: a cwd, root, open file or mapping
    under it (like fuser -m), or a request the daemon is serving for it (``requests``: status
    ``requests.waiting``; the daemon's own, ``daemon_pid``, left out).

    Only /proc is read, never the mount itself, so this works on a hung mount.
    """
    prefix = mountpoint.rstrip("/") + "/"
    found: dict[int, list[str]] = {}
    me = os.getpid()
    for pid_dir in Path("/proc").iterdir():
        if not pid_dir.name.isdigit() or int(pid_dir.name) == me:
            continue
        why = found.setdefault(int(pid_dir.name), [])
        links = [(pid_dir / "cwd", "cwd"), (pid_dir / "root", "root")]
        with contextlib.suppress(OSError):
            links.extend((fd, "open file") for fd in (pid_dir / "fd").iterdir())
        for link, what in links:
            try:
                target = os.readlink(link)
            except OSError:
                continue
            if (target == mountpoint or target.startswith(prefix)) and what not in why:
                why.append(what)
        with contextlib.suppress(OSError, IndexError):
            if any(
                line.rstrip("\n").split(maxsplit=5)[-1].startswith(prefix)
                for line in (pid_dir / "maps").read_text().splitlines()
                if "/" in line
            ):
                why.append("mapping")
    for req in requests:
        pid = _tgid(int(req.get("pid", 0)))  # the kernel gives the requesting thread
        if pid in (0, me, daemon_pid):
            continue  # the daemon reading its own pages back, or this command reading status
        found.setdefault(pid, []).append(f"waiting on {req.get('op', 'a request')} for {req.get('seconds', 0):g}s")
    return [(pid, _comm(pid), ", ".join(why)) for pid, why in sorted(found.items()) if why]


def _tgid(tid: int) -> int:
    """The process of thread ``tid`` (/proc/TID is there for every thread, though not listed)."""
    try:
        for line in Path(f"/proc/{tid}/status").read_text().splitlines():
            if line.startswith("Tgid:"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return tid


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "?"


def served_requests(mountpoint: str, timeout: float) -> tuple[int, list[dict[str, Any]]] | None:
    """(daemon pid, the requests it is serving) from its status, or None when it does not answer within
    ``timeout`` (hung) or cannot (dead, an older daemon without the section).  The read runs in a
    daemon thread: a hung mount leaves that thread behind, never this command."""
    result: dict[str, Any] = {}

    def read() -> None:
        with contextlib.suppress(OSError, ValueError), open(os.path.join(mountpoint, ".control", "status"), "rb") as fh:
            result["doc"] = json.loads(fh.read())

    reader = threading.Thread(target=read, name="status", daemon=True)
    reader.start()
    reader.join(timeout)
    doc = result.get("doc")
    if not isinstance(doc, dict) or not isinstance(doc.get("requests"), dict):
        return None
    waiting = doc["requests"].get("waiting")
    return int(doc.get("pid", 0)), [r for r in waiting if isinstance(r, dict)] if isinstance(waiting, list) else []


def busy_message(mountpoint: str, timeout: float) -> str:
    """Who holds a busy mount, in words (or why they cannot be named)."""
    wait = min(timeout, STATUS_TIMEOUT)
    served = served_requests(mountpoint, wait)
    daemon_pid, requests = served if served is not None else (0, [])
    users = holders(mountpoint, requests, daemon_pid)
    if users:
        who = ", ".join(f"{pid} ({comm}) [{why}]" for pid, comm, why in users)
    elif served is None:
        who = f"unknown processes (the daemon did not say which requests it serves within {wait:g}s)"
    else:
        who = "unknown processes"
    return f"{mountpoint}: busy, held by {who}; close them or use --lazy"


def fusermount() -> str:
    exe = shutil.which("fusermount3") or shutil.which("fusermount")
    if exe is None:
        raise FuseUnavailable("fusermount3 not found (install the fuse3 package)")
    return exe


def unmount(mountpoint: str, lazy: bool = False, timeout: float = 30.0) -> str:
    """Unmount a seerfs mount and wait for its daemon; returns a one-line summary."""
    mp = mountinfo.normalize(mountpoint)
    entry = mountinfo.find(mp)
    record = MountRecord.read(mp)
    if entry is None:
        if record is not None:
            record.remove()
        starting = StartRecord.read(mp)
        if starting is not None and pid_alive(starting.pid):
            return _stop_starting(starting, timeout)
        raise NotMounted(f"{mp}: not mounted")
    if entry.fstype != mountinfo.FSTYPE:
        raise NotMounted(f"{mp}: not a seerfs mount (type {entry.fstype})")
    cmd = [fusermount(), "-u", *(["-z"] if lazy else []), mp]
    deadline = time.monotonic() + min(timeout, OWN_HOLD_WAIT)
    while True:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        if res.returncode == 0:
            break
        err = res.stderr.strip()
        if "busy" not in err.lower():
            raise SeerfsError(f"{mp}: unmount failed: {err or 'fusermount3 exit ' + str(res.returncode)}")
        daemon_pid = record.pid if record is not None else 0
        if time.monotonic() >= deadline or any(pid != daemon_pid for pid, _, _ in holders(mp)):
            raise BusyError(busy_message(mp, timeout))
        time.sleep(0.05)  # only the daemon's own read back holds it: over in milliseconds
    if record is None:
        return f"unmounted {mp}"
    if lazy:
        return f"detached {mp}; daemon {record.pid} exits when the last user closes it"
    if not wait_pid_exit(record.pid, timeout):
        raise TimeoutExpired(f"{mp}: unmounted, but daemon {record.pid} still running after {timeout:g}s")
    record.remove()
    return f"unmounted {mp}"


def _stop_starting(starting: StartRecord, timeout: float) -> str:
    """A daemon still walking its source (a mount of the wrong tree can take hours) is stopped.

    SIGTERM ends it before it mounts; should it mount in the meantime, its mount is left without a
    daemon, which a second ``seerfs umount`` cleans up like any dead daemon's.
    """
    with contextlib.suppress(ProcessLookupError):
        os.kill(starting.pid, signal.SIGTERM)
    if not wait_pid_exit(starting.pid, timeout):
        raise TimeoutExpired(f"{starting.mountpoint}: daemon {starting.pid} still starting after {timeout:g}s")
    starting.remove()
    if mountinfo.find(starting.mountpoint) is not None:
        return unmount(starting.mountpoint, timeout=timeout)
    return f"stopped daemon {starting.pid}, which was still starting on {starting.mountpoint}"
