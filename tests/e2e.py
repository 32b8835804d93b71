"""End-to-end harness: a dataset behind the PFS emulator, seerfs over it, real DDP reader processes.

Everything is real: the emulator's own counters say what the PFS served, seerfs is mounted with the
CLI, and readers are separate processes running torchvision ImageFolder, DataLoader workers and
DistributedSampler, kept in step by a gloo barrier.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml
from mounting import mounted, status

from tools.mkdataset import Spec, make_dataset

READER = Path(__file__).resolve().parent / "ddp_reader.py"


@dataclass
class Job:
    world_size: int = 2
    epochs: int = 3
    start_epoch: int = 0
    batch_size: int = 16
    num_workers: int = 2
    seed: int = 7
    val: bool = True
    compute_s: float = 0.0


def make_source(root: Path, files: int, val_files: int, mean_size: int = 16_000) -> tuple[dict[str, str], int]:
    """A train/val ImageFolder tree; returns per-file sha1 (computed now, before any mount) and total bytes."""
    spec = Spec(classes=6, files=files, val_files=val_files, mean_size=mean_size, seed=3)
    written = make_dataset(root if val_files else root / "train", spec)  # always a train/ (and val/) tree
    digests = {str(p.relative_to(root)): hashlib.sha1(p.read_bytes()).hexdigest() for p in written}
    return digests, sum(p.stat().st_size for p in written)


def seerfs_config(path: Path, job: Job, *, cache_dir: Path, tiers: list[dict[str, Any]],
                  lookahead: str = "4MiB", ranks_per_node: int | None = None, **extra: Any) -> Path:  # fmt: skip
    cfg: dict[str, Any] = {
        "cache_dir": str(cache_dir),
        "datasets": [{"root": "train"}, {"root": "val", "follows": "train", "sampler": {"shuffle": False}}]
        if job.val else [{"root": "train"}],
        "job": {"world_size": job.world_size, "ranks_per_node": ranks_per_node or job.world_size,
                "epochs": job.epochs, "batch_size": job.batch_size, "num_workers": job.num_workers},
        "tiers": tiers,
        "prefetch": {"lookahead_bytes": lookahead, "threads": 8},
        **extra,
    }  # fmt: skip
    path.write_text(yaml.safe_dump(cfg))
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_readers(root: Path, job: Job, digests: dict[str, str], out: Path, ranks: list[int] | None = None,
                cgroup: MemoryCgroup | None = None, timeout: float = 300) -> list[dict[str, Any]]:  # fmt: skip
    """Run the job's ranks (all of them, or ``ranks`` with the rest elsewhere) and return their results."""
    spec = {**asdict(job), "root": str(root), "digests": digests, "port": free_port(), "out": str(out)}
    spec_file = out.with_suffix(".spec.json")
    spec_file.write_text(json.dumps(spec))
    procs = [
        subprocess.Popen([sys.executable, str(READER), str(spec_file), str(r)], stderr=subprocess.PIPE, text=True)
        for r in (ranks if ranks is not None else range(job.world_size))
    ]
    if cgroup is not None:
        for p in procs:
            cgroup.add(p.pid)
    try:
        errors = [p.communicate(timeout=timeout)[1] for p in procs]
    finally:
        for p in procs:
            p.kill()
    results = []
    for p, err, r in zip(procs, errors, ranks if ranks is not None else range(job.world_size), strict=True):
        assert p.returncode == 0, f"rank {r} failed ({p.returncode}):\n{err[-3000:]}"
        results.append(json.loads(out.with_suffix(f".rank{r}.json").read_text()))
    return results


def expected_opens(job: Job, train_files: int, val_files: int) -> int:
    """What the real samplers make the job open (computed with torch itself)."""
    import torch
    from torch.utils.data import DistributedSampler

    class Sized(torch.utils.data.Dataset[int]):
        def __init__(self, n: int) -> None:
            self.n = n

        def __len__(self) -> int:
            return self.n

        def __getitem__(self, i: int) -> int:
            return i

    total = 0
    for epoch in range(job.start_epoch, job.epochs):
        for r in range(job.world_size):
            s: Any = DistributedSampler(Sized(train_files), num_replicas=job.world_size, rank=r, seed=job.seed)
            s.set_epoch(epoch)
            total += len(list(s))
            if job.val:
                v: Any = DistributedSampler(Sized(val_files), num_replicas=job.world_size, rank=r, shuffle=False)
                total += len(list(v))
    return total


def daemon_pid(mnt: Path) -> int:
    return int(status(mnt)["pid"])


def write_seed(mnt: Path, seed: int) -> None:
    (mnt / ".control" / "seed").write_text(f"{seed}\n")


def wait_plan(mnt: Path, seed: int, timeout: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        doc = status(mnt)
        plan = doc["plan"]
        if plan["state"] == "ready" and plan["seed"] == seed:
            return doc
        if plan["state"] == "failed":
            raise AssertionError(f"planning failed: {plan['message']}")
        if time.monotonic() > deadline:
            raise AssertionError(f"no plan for seed {seed} after {timeout}s: {plan}")
        time.sleep(0.05)


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
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                self.path.rmdir()
                return
            except OSError:
                time.sleep(0.1)


def du(path: Path) -> int:
    """Real disk usage (allocated blocks) under ``path``."""
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
    return total


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


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
