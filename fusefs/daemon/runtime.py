"""Per-mount runtime records (pid, source, log) so umount can find a daemon, even a dead one's mount."""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import xxhash


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
        path = self.path_for(self.mountpoint)
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(asdict(self)))
        os.replace(tmp, path)

    def remove(self) -> None:
        path = self.path_for(self.mountpoint)
        try:
            current = json.loads(path.read_text())
            if current.get("pid") == self.pid:
                path.unlink()
        except (OSError, ValueError):
            pass

    @classmethod
    def read(cls, mountpoint: str) -> MountRecord | None:
        try:
            return cls(**json.loads(cls.path_for(mountpoint).read_text()))
        except (OSError, ValueError, TypeError):
            return None


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
    deadline = time.monotonic() + timeout
    delay = 0.01
    while pid_alive(pid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(delay)
        delay = min(delay * 2, 0.2)
    return True
