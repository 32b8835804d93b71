"""Running a data-parallel reading job for tests and benchmarks: dataset, config, ranks, seed.

The ranks are :mod:`tools.harness.train_reader` processes (real ImageFolder, DataLoader workers,
DistributedSampler, a gloo barrier per batch); this module prepares what they read and launches
them, and talks to a mount through its control files the way a job script would.
"""

from __future__ import annotations

import hashlib
import json
import socket
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

from tools.harness.mounts import status, wait_for
from tools.mkdataset import Spec, make_dataset

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Job:
    world_size: int = 2
    epochs: int = 3
    start_epoch: int = 0
    batch_size: int = 16
    num_workers: int = 2
    seed: int = 7
    val: bool = True
    compute_s: float = 0.0  # seconds of (sleeping) compute per sample
    sync: bool = True  # ranks in step through a gloo barrier per batch (False: independent readers)
    time_reads: bool = False  # record each file's open+read time (read_max_s, read_p99_s)
    in_memory: bool = False  # the no-I/O lower bound: samples of the files' sizes made in RAM
    write_seed: bool = False  # rank 0 writes the seed to ROOT/.control/seed first thing, as a job script does
    sampler: str = "distributed"  # random: DataLoader(shuffle=True, generator seeded with seed), no DistributedSampler
    status_counts: bool = False  # each rank records its mount's read counters as each epoch starts
    decode: bool = False  # real training on CPU: PIL decode + transforms in the workers, a small CNN under DDP


def make_source(
    root: Path,
    files: int,
    val_files: int,
    mean_size: int = 16_000,
    sigma: float = 0.5,
    classes: int = 6,
    photos: bool = False,
) -> tuple[dict[str, str], int]:
    """A train/val ImageFolder tree; returns per-file sha1 (computed now, before any mount) and total bytes.
    ``photos``: real JPEGs whose pixels fill the files (tools/mkdataset.py), for a job that decodes them."""
    spec = Spec(
        classes=classes, files=files, val_files=val_files, mean_size=mean_size, sigma=sigma, seed=3, photos=photos
    )
    written = make_dataset(root if val_files else root / "train", spec)  # always a train/ (and val/) tree
    digests = {str(p.relative_to(root)): hashlib.sha1(p.read_bytes()).hexdigest() for p in written}
    return digests, sum(p.stat().st_size for p in written)


def seerfs_config(
    path: Path,
    job: Job,
    *,
    cache_dir: Path,
    tiers: list[dict[str, Any]],
    lookahead: str = "4MiB",
    ranks_per_node: int | None = None,
    prefetch_threads: int | None = 8,  # None: the product's defaults (prefetch.threads, max_in_flight)
    **extra: Any,
) -> Path:
    cfg: dict[str, Any] = {
        "cache_dir": str(cache_dir),
        "datasets": [{"root": "train", "sampler": {"kind": job.sampler}}]
        + ([{"root": "val", "follows": "train", "sampler": {"shuffle": False}}] if job.val else []),
        "job": {
            "world_size": job.world_size,
            "ranks_per_node": ranks_per_node or job.world_size,
            "epochs": job.epochs,
            "batch_size": job.batch_size,
            "num_workers": job.num_workers,
        },
        "tiers": tiers,
        "prefetch": {
            "lookahead_bytes": lookahead,
            **({} if prefetch_threads is None else {"threads": prefetch_threads}),
        },
        **extra,
    }
    path.write_text(yaml.safe_dump(cfg))
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_readers(
    root: Path | list[Path],
    job: Job,
    digests: dict[str, str] | None,
    out: Path,
    ranks: list[int] | None = None,
    cgroup: Any = None,
    timeout: float = 600,
) -> list[dict[str, Any]]:
    """Run the job's ranks (all, or only ``ranks``) and return their results.

    ``root`` is the dataset for every rank, or a list with one per rank (each node's own mount).
    """
    roots = [str(r) for r in root] if isinstance(root, list) else [str(root)] * job.world_size
    spec = {**asdict(job), "roots": roots, "digests": digests, "port": free_port(), "out": str(out)}
    spec_file = out.with_suffix(".spec.json")
    spec_file.write_text(json.dumps(spec))
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "tools.harness.train_reader", str(spec_file), str(r)],
            cwd=ROOT,
            stderr=subprocess.PIPE,
            text=True,
        )
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


def daemon_pid(mnt: Path) -> int:
    return int(status(mnt)["pid"])


def write_seed(mnt: Path, seed: int) -> None:
    (mnt / ".control" / "seed").write_text(f"{seed}\n")


def wait_plan(mnt: Path, seed: int, timeout: float = 60) -> dict[str, Any]:
    """The status document once the plan for ``seed`` is ready; a failed plan fails at once."""
    plan: dict[str, Any] = {}

    def ready() -> dict[str, Any] | None:
        nonlocal plan
        doc = status(mnt)
        plan = doc["plan"]
        if plan["state"] == "failed":
            raise AssertionError(f"planning failed: {plan['message']}")
        return doc if plan["state"] == "ready" and plan["seed"] == seed else None

    doc: dict[str, Any] = wait_for(ready, timeout, lambda: f"the plan for seed {seed} (last: {plan})")
    return doc


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0
