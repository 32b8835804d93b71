"""``seerfs umount``: unmount, wait for the daemon, clean up dead mounts, name who keeps it busy."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
from pathlib import Path

from fusefs import mountinfo
from fusefs.daemon.runtime import MountRecord, StartRecord, pid_alive, wait_pid_exit
from fusefs.errors import BusyError, FuseUnavailable, NotMounted, SeerfsError, TimeoutExpired


def holders(mountpoint: str) -> list[tuple[int, str]]:
    """Processes with a cwd, root, open file or mapping under ``mountpoint`` (like fuser -m).

    Only /proc symlinks are read, never the mount itself, so this works on a hung mount.
    """
    prefix = mountpoint.rstrip("/") + "/"
    found: list[tuple[int, str]] = []
    me = os.getpid()
    for pid_dir in Path("/proc").iterdir():
        if not pid_dir.name.isdigit() or int(pid_dir.name) == me:
            continue
        links = [pid_dir / "cwd", pid_dir / "root"]
        with contextlib.suppress(OSError):
            links.extend((pid_dir / "fd").iterdir())
        hit = False
        for link in links:
            try:
                target = os.readlink(link)
            except OSError:
                continue
            if target == mountpoint or target.startswith(prefix):
                hit = True
                break
        if not hit:
            with contextlib.suppress(OSError, IndexError):
                hit = any(
                    line.rstrip("\n").split(maxsplit=5)[-1].startswith(prefix)
                    for line in (pid_dir / "maps").read_text().splitlines()
                    if "/" in line
                )
        if hit:
            try:
                comm = (pid_dir / "comm").read_text().strip()
            except OSError:
                comm = "?"
            found.append((int(pid_dir.name), comm))
    return found


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
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if res.returncode != 0:
        err = res.stderr.strip()
        if "busy" in err.lower():
            users = holders(mp)
            who = ", ".join(f"{pid} ({comm})" for pid, comm in users) or "unknown processes"
            raise BusyError(f"{mp}: busy, held by {who}; close them or use --lazy")
        raise SeerfsError(f"{mp}: unmount failed: {err or 'fusermount3 exit ' + str(res.returncode)}")
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
