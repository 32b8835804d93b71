"""Per-mount runtime records (pid, source, log) so umount can find a daemon, even a dead one's mount,
and a start record so ``seerfs wait``/``status`` can show a daemon's progress before its mount answers.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import xxhash

from fusefs.waiting import WaitTimeout, wait_until

if TYPE_CHECKING:
    from fusefs.daemon.status import StartupTask
    from fusefs.progress import ProgressDoc


def runtime_dir() -> Path:
    if os.geteuid() == 0:
        base = Path("/run/seerfs")
    elif os.environ.get("XDG_RUNTIME_DIR"):
        base = Path(os.environ["XDG_RUNTIME_DIR"]) / "seerfs"
    else:
        base = Path(f"/tmp/seerfs-{os.geteuid()}")
    return base


@dataclass
class MountRecord:
    pid: int
    mountpoint: str
    source: str
    log_file: str
    started: float

    @staticmethod
    def path_for(mountpoint: str) -> Path:
        return runtime_dir() / f"{xxhash.xxh64_hexdigest(mountpoint.encode())}.json"

    def write(self) -> None:
        _write_json(self.path_for(self.mountpoint), asdict(self))

    def remove(self) -> None:
        _remove_if_mine(self.path_for(self.mountpoint), self.pid)

    @classmethod
    def read(cls, mountpoint: str) -> MountRecord | None:
        try:
            return cls(**json.loads(cls.path_for(mountpoint).read_text()))
        except (OSError, ValueError, TypeError):
            return None


@dataclass
class StartRecord:
    """A daemon that is starting (walking the source, forming its group): no mount answers yet, so
    this file is where ``seerfs wait`` and ``seerfs status`` find its progress.  Rewritten about once
    a second while starting and removed once the mount answers or startup failed."""

    pid: int
    mountpoint: str
    source: str
    log_file: str
    started: float
    progress: dict[StartupTask, ProgressDoc] = field(default_factory=dict)

    @staticmethod
    def path_for(mountpoint: str) -> Path:
        return runtime_dir() / f"{xxhash.xxh64_hexdigest(mountpoint.encode())}.starting.json"

    def write(self) -> None:
        _write_json(self.path_for(self.mountpoint), asdict(self))

    def remove(self) -> None:
        _remove_if_mine(self.path_for(self.mountpoint), self.pid)

    @classmethod
    def read(cls, mountpoint: str) -> StartRecord | None:
        try:
            return cls(**json.loads(cls.path_for(mountpoint).read_text()))
        except (OSError, ValueError, TypeError):
            return None


def _write_json(path: Path, data: dict[str, Any]) -> None:
    """Atomically: a reader sees the old or the new document, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def _remove_if_mine(path: Path, pid: int) -> None:
    """Remove ``path`` only if ``pid`` wrote it: a newer daemon on the same mountpoint keeps its record."""
    try:
        current = json.loads(path.read_text())
        if current.get("pid") == pid:
            path.unlink()
    except (OSError, ValueError):
        pass


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie is dead for our purposes
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def wait_pid_exit(pid: int, timeout: float) -> bool:
    """Whether ``pid`` exited within ``timeout`` seconds."""
    try:
        wait_until(lambda: not pid_alive(pid), timeout, f"process {pid} to exit")
    except WaitTimeout:
        return False
    return True
