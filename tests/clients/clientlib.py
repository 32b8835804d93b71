"""What every client script shares: the dataset it reads, what each rank records, status snapshots.

The clients are real training loops (torchrun with gloo, DataLoader worker processes, torchvision
ImageFolder over the mount, and Lightning, accelerate or torchdata where the shape is theirs).  Only
image decoding is left out: a sample is its file's raw bytes and path, so the harness can check
every byte a rank consumed against digests computed from the source directly.

The loader also times each sample's ``open()`` + ``read()`` as the DataLoader worker does it (and
how much of that the worker waited for a CPU), and the times travel with the sample: the harness
judges prediction by them without asking seerfs (a predicted file is served from seerfs's caches;
an unpredicted one waits for a PFS open).

Rank 0 also reads ``MOUNT/.control/status`` at epoch boundaries (after a barrier, once the loader's
workers are gone), so the harness can split the daemon's counters per epoch: the status document
itself only has totals since the mount.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # tools.harness.torchvision_cpu

from statusfields import status_fields  # noqa: E402  (the harness judges by the same fields)

from tools.harness import torchvision_cpu  # noqa: E402  (needs ROOT on sys.path)

# Lightning and accelerate import torchvision themselves (through torchmetrics and friends): it must
# be loaded the CPU-safe way before either, so importing this module first does it.
torchvision_cpu.load()


def cpu_wait_s() -> float:
    """Seconds the calling thread has spent runnable but waiting for a CPU (the kernel's schedstat), 0.0 where
    Linux does not say: the part of a call's wall time that host load, not the filesystem, made it wait."""
    try:
        with open("/proc/thread-self/schedstat", "rb") as fh:
            return int(fh.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0


def digest_of_file(path: str) -> tuple[str, str, float, float]:
    """ImageFolder's ``loader``: reads the whole file through the mount and returns its path, its sha1, the
    seconds its ``open()`` + ``read()`` took and the seconds of that the worker waited for a CPU.

    The digest is taken in the DataLoader worker from exactly the bytes read; the batch then carries
    short strings instead of the bytes, which keeps Lightning's batch-size probing (it recurses into
    every iterable it finds, bytes included) out of the picture.  The timed span (monotonic clock)
    covers the open and the whole read, not the close nor the digest, and encloses both schedstat
    reads, so the CPU wait is never more than the span holds: a reader blocked on a PFS open sleeps,
    which is not CPU wait, and no part of that sleep can be taken off the span.
    """
    t0 = time.perf_counter()
    w0 = cpu_wait_s()
    with open(path, "rb") as fh:
        data = fh.read()
    w1 = cpu_wait_s()
    seconds = time.perf_counter() - t0
    return path, hashlib.sha1(data).hexdigest(), seconds, w1 - w0


def image_folder(root: str) -> Any:
    """Unchanged torchvision ImageFolder (its class scan and sample order) with the digesting loader."""
    return torchvision_cpu.image_folder(root, loader=digest_of_file)


def collate(batch: list[Any]) -> dict[str, Any]:
    """collate_fn: a tensor per batch (what frameworks probe for the batch size) and each sample's path, digest,
    open+read seconds and CPU wait in them (plain lists: frameworks move or probe tensors only)."""
    import torch

    return {
        "x": torch.zeros(len(batch), 1),
        "labels": torch.tensor([label for _s, label in batch]),
        "paths": [p for (p, _d, _t, _w), _l in batch],
        "sha1": [d for (_p, d, _t, _w), _l in batch],
        "open_read_s": [t for (_p, _d, t, _w), _l in batch],
        "cpu_wait_s": [w for (_p, _d, _t, w), _l in batch],
    }


def read_status(mount: str) -> dict[str, Any] | None:
    """The mount's status once its counters stopped moving (opens are placed asynchronously)."""
    path = os.path.join(mount, ".control", "status")
    if not os.path.exists(path):
        return None  # not a seerfs mount (a run straight on the source)
    previous: tuple[Any, ...] | None = None
    deadline = time.monotonic() + 2.0
    while True:
        with open(path, "rb") as fh:
            doc: dict[str, Any] = json.loads(fh.read())
        fields = status_fields(doc)
        key = (fields["reads_opens"], fields["predicted_opens"], fields["unplanned_opens"], fields["cursor"]["opens"])
        if key == previous or time.monotonic() > deadline:
            return fields
        previous = key
        time.sleep(0.05)


class Recorder:
    """One rank's record: every sample consumed (phase, epoch, path, sha1, open+read seconds, CPU wait seconds
    in them) in the order the loop consumed it, status snapshots, timings."""

    def __init__(self, out: str, rank: int, mount: str) -> None:
        self.out, self.rank, self.mount = out, rank, os.path.abspath(mount)
        self.samples: list[tuple[str, int, str, str, float, float]] = []
        self.snapshots: list[dict[str, Any]] = []
        self.extra: dict[str, Any] = {}
        self.started = time.monotonic()

    def batch(self, phase: str, epoch: int, batch: dict[str, Any]) -> None:
        timed = zip(batch["paths"], batch["sha1"], batch["open_read_s"], batch["cpu_wait_s"], strict=True)
        for path, sha, seconds, waited in timed:
            self.samples.append(
                (phase, epoch, os.path.relpath(path, self.mount), sha, round(seconds, 7), round(waited, 7))
            )

    def snapshot(self, label: str) -> None:
        """Status at a boundary: call on every rank after a barrier; only rank 0 reads it."""
        if self.rank != 0:
            return
        fields = read_status(self.mount)
        if fields is not None:
            self.snapshots.append({"label": label, "t": time.monotonic() - self.started, **fields})

    def start(self) -> None:
        self.started = time.monotonic()

    def finish(self) -> None:
        doc = {
            "rank": self.rank,
            "wall_s": time.monotonic() - self.started,
            "samples": self.samples,
            "snapshots": self.snapshots,
            **self.extra,
        }
        Path(self.out, f"rank{self.rank}.json").write_text(json.dumps(doc))


def write_seed(mount: str, seed: int) -> None:
    """What a job script does: ``echo SEED > MOUNT/.control/seed``."""
    Path(mount, ".control", "seed").write_text(f"{seed}\n")


def compute(ms: float) -> None:
    """Stands for the GPU time of a step: sleeping uses no CPU on this 2-core host."""
    if ms > 0:
        time.sleep(ms / 1000)
