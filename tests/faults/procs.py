"""Daemons as processes: find one's pid, kill or stop it, measure its memory, read with a deadline."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from tools.harness.mounts import force_unmount, is_mounted, seerfs, wait_for


def daemon_pid(mnt: Path) -> int:
    """The serving daemon's pid, from ``seerfs status --json`` (what an operator would use)."""
    res = seerfs("status", str(mnt), "--json", "--timeout", "10", check=True)
    return int(json.loads(res.stdout)["pid"])


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def kill9(mnt: Path, pid: int | None = None) -> int:
    """kill -9 the daemon of ``mnt``, wait until it is gone and clean up its dead mount."""
    pid = daemon_pid(mnt) if pid is None else pid
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not alive(pid), 20, f"daemon {pid} to die of SIGKILL")
    if is_mounted(mnt):
        seerfs("umount", str(mnt), timeout=30)
    force_unmount(mnt)
    return pid


def proc_status_kib(pid: int, key: str) -> int:
    """A ``/proc/PID/status`` field in KiB (VmHWM: peak resident set; VmRSS: now)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise KeyError(key)


def vm_hwm(pid: int) -> int:
    """Peak resident bytes of ``pid`` so far (the kernel's high-water mark, no sampling gaps)."""
    return proc_status_kib(pid, "VmHWM") * 1024


@dataclass
class ReadOutcome:
    state: str  # "ok" | "error" | "hung"
    data: bytes = b""
    error: str = ""  # errno name when state == "error"
    wchan: str = ""  # where the reader slept when it was declared hung
    proc_state: str = ""  # its /proc state letter then (D: uninterruptible)


_READER = r"""
import errno, os, sys
try:
    with open(sys.argv[1], "rb") as fh:
        data = fh.read()
except OSError as exc:
    sys.stdout.write("ERR " + errno.errorcode.get(exc.errno or 0, str(exc)))
    sys.exit(0)
sys.stdout.buffer.write(b"OK " + data)
"""


def bounded_read(path: Path, timeout: float, unblock: Callable[[], object] | None = None) -> ReadOutcome:
    """Read ``path`` whole in a child process; after ``timeout`` it is declared hung and killed.

    A reader stuck in a FUSE request cannot be interrupted from inside the test process, so it runs
    outside it.  Its state and wait channel are recorded before the kill (the evidence of a hang).
    A reader whose request the daemon is still working on may not die until that request ends:
    ``unblock`` (e.g. opening the FIFO the daemon waits on) is called after the kill to end it.
    """
    proc = subprocess.Popen(
        [sys.executable, "-c", _READER, str(path)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        wchan = _read(f"/proc/{proc.pid}/wchan")
        state = _read(f"/proc/{proc.pid}/stat").rsplit(")", 1)[-1].split()[:1]
        proc.kill()
        if unblock is not None:
            unblock()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.communicate(timeout=10)
        return ReadOutcome("hung", wchan=wchan, proc_state=state[0] if state else "?")
    if out.startswith(b"OK "):
        return ReadOutcome("ok", data=out[3:])
    return ReadOutcome("error", error=out[4:].decode(errors="replace"))


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def log_text(cache_dir: Path) -> str:
    """Every daemon log under ``cache_dir/log`` (they name the mechanism behind a failure)."""
    return "\n".join(p.read_text(errors="replace") for p in sorted((cache_dir / "log").glob("*.log")))


def last_exception(cache_dir: Path) -> str:
    """The last exception a daemon logged under ``cache_dir/log``: its innermost frame and message."""
    lines = [ln.strip(" |") for ln in log_text(cache_dir).splitlines()]
    for i in range(len(lines) - 1, -1, -1):
        if "Error: " in lines[i] or lines[i].endswith("Error") or "Exception: " in lines[i]:
            frame = next((lines[j] for j in range(i, -1, -1) if lines[j].startswith("File ")), "")
            return f"{lines[i]} [{frame}]"
    return "(no exception in the log)"


@contextlib.contextmanager
def stopped(pid: int) -> Iterator[int]:
    """SIGSTOP ``pid`` for the block (a hung daemon), SIGCONT after in any case."""
    os.kill(pid, signal.SIGSTOP)
    try:
        yield pid
    finally:
        os.kill(pid, signal.SIGCONT)
