"""End-to-end harness: a dataset behind the PFS emulator, seerfs over it, real DDP reader processes.

Everything is real: the emulator's own counters say what the PFS served, seerfs is mounted with the
CLI, and readers are separate processes running torchvision ImageFolder, DataLoader workers and
DistributedSampler, kept in step by a gloo barrier.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mounting import mounted, status

from fusefs.waiting import WaitTimeout, wait_until
from tools.harness.jobs import (  # the shared job runner; re-exported here for the tests
    Job,
    daemon_pid,
    free_port,
    make_source,
    rss,
    run_readers,
    seerfs_config,
    wait_plan,
    write_seed,
)

__all__ = [
    "Job",
    "MemoryCgroup",
    "RssSampler",
    "daemon_pid",
    "du",
    "expected_opens",
    "free_port",
    "make_source",
    "rss",
    "run_readers",
    "seerfs_config",
    "seerfs_over",
    "status",
    "wait_plan",
    "write_seed",
]


def expected_opens(job: Job, train_files: int, val_files: int) -> int:
    """What the real samplers make the job open (computed with torch itself)."""
    from indices import Indices
    from torch.utils.data import DistributedSampler

    total = 0
    for epoch in range(job.start_epoch, job.epochs):
        for r in range(job.world_size):
            s: Any = DistributedSampler(Indices(train_files), num_replicas=job.world_size, rank=r, seed=job.seed)
            s.set_epoch(epoch)
            total += len(list(s))
            if job.val:
                v: Any = DistributedSampler(Indices(val_files), num_replicas=job.world_size, rank=r, shuffle=False)
                total += len(list(v))
    return total


@contextlib.contextmanager
def seerfs_over(pfs_mount: Path, mnt: Path, config: Path) -> Iterator[Path]:
    with mounted(pfs_mount, mnt, "-c", str(config)) as m:
        yield m


@dataclass
class MemoryCgroup:
    """A cgroup-v1 memory group for the daemon and readers: its page cache is what the mount holds.

    Pages are charged to the group of the process that allocates them: pages the daemon pushes and
    pages a reader pulls through the mount both land here, while the emulator's own page cache and
    libraries already resident stay charged elsewhere.
    """

    path: Path
    peak_cache: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    @classmethod
    def create(cls, name: str) -> MemoryCgroup | None:
        base = Path("/sys/fs/cgroup/memory")
        try:
            path = base / f"seerfs-test-{name}-{os.getpid()}"
            path.mkdir()
        except OSError:
            return None
        group = cls(path)
        group._thread = threading.Thread(target=group._poll, daemon=True)
        group._thread.start()
        return group

    def add(self, pid: int) -> None:
        (self.path / "cgroup.procs").write_text(str(pid))

    def cache(self) -> int:
        for line in (self.path / "memory.stat").read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "cache":
                return int(value)
        return 0

    def _poll(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(OSError):
                self.peak_cache = max(self.peak_cache, self.cache())
            time.sleep(0.02)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        root = Path("/sys/fs/cgroup/memory/cgroup.procs")
        with contextlib.suppress(OSError):
            for pid in (self.path / "cgroup.procs").read_text().split():
                with contextlib.suppress(OSError):
                    root.write_text(pid)
        with contextlib.suppress(OSError):
            (self.path / "memory.force_empty").write_text("0")

        def removed() -> bool:
            try:
                self.path.rmdir()
            except OSError:
                return False
            return True

        with contextlib.suppress(WaitTimeout):  # best effort: a group whose last process lingers stays
            wait_until(removed, 10, f"{self.path} to be removed", max_delay=0.1)


def du(path: Path) -> int:
    """Real disk usage (allocated blocks) under ``path``."""
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
    return total


class RssSampler:
    """Peak RSS of a process over a block, sampled every 20 ms in a thread."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak = rss(pid)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(OSError):
                self.peak = max(self.peak, rss(self.pid))
            time.sleep(0.02)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
