"""One rank of real data-parallel training minus the model: what the tests and benchmarks run.

Unchanged torchvision ImageFolder + DataLoader (worker processes) + DistributedSampler with
set_epoch, ranks kept in step by a gloo barrier per batch (what the allreduce of real training
does), and a compute step that sleeps (it stands for GPU time, so it uses no CPU).  With
``digests`` every sample's bytes are checked against digests computed beforehand from the backing
store, so the check itself reads nothing that could be cached.  Writes a JSON result next to
``out``: per epoch its seconds, the time spent waiting for batches and where the rest went (the
compute sleeps as slept, the barrier, and each batch waited for over 20 ms: the first batch of
each loader, whose fresh workers read it file by file while the rank waits, shows there).

With ``decode`` the rank trains for real on the CPU instead: each worker decodes its JPEGs with PIL
(torchvision's own loader) and applies the usual training transforms, and the rank runs a small CNN
forward and backward on each batch under DistributedDataParallel (gloo: its gradient all-reduce keeps
the ranks in step, no barrier), one torch thread per rank as torchrun sets it.  Nothing sleeps.

usage: python -m tools.harness.train_reader SPEC.json RANK   (SPEC: see tools.harness.jobs.Job)
"""

from __future__ import annotations

import hashlib
import json
import os
import resource
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def raw(path: str) -> bytes:
    with open(path, "rb") as fh:
        return fh.read()


def raw_timed(path: str) -> tuple[bytes, float, float]:
    """The file's bytes, how long open+read took (in the DataLoader worker that read it) and when the open
    began (``time.monotonic()``, one clock machine-wide: comparable with the PFS emulator's first opens)."""
    t0 = time.monotonic()
    with open(path, "rb") as fh:
        data = fh.read()
    return data, time.monotonic() - t0, t0


SIZES: dict[str, int] = {}  # in_memory runs: each sample's size, taken before training
SLOW_BATCH_S = 0.02  # a batch waited for longer than this is listed by number in the epoch's record


def from_memory(path: str) -> bytes:
    """A sample of the file's size made in RAM: no I/O at all (NoPFS's synthetic-data lower bound).

    Sizes only, not contents, live in the parent: holding the whole dataset there would make every
    DataLoader worker fork heavier and the "lower bound" slower than reading files.
    """
    return bytes(SIZES[path])


def _mount_counts(root: str) -> dict[str, int] | None:
    """A seerfs mount's counters so far, or None (not a seerfs mount): the read requests it answered
    (``reads``), the opens, the opens served locally (``local``: the page cache or a tier, with
    no fetch of their own or in flight) and the opens its plan predicted (``predicted``)."""
    try:
        with open(os.path.join(root, ".control", "status"), "rb") as fh:
            doc = json.loads(fh.read())
    except OSError:
        return None
    reads = doc["reads"]
    served = reads["by_source"]
    local = sum(int(served[k]["files"]) for k in ("page_cache", "memory", "directory"))
    predicted = int(doc["prefetch"]["predicted_opens"])
    return {"reads": int(reads["reads"]), "opens": int(reads["opens"]), "local": local, "predicted": predicted}


def collate(batch: list[Any]) -> list[Any]:
    return batch


class Indexed:
    """A dataset whose items carry their index: a shuffling DataLoader's order is known only as it is read
    (listing its sampler first would draw from the generator and change the order)."""

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset
        self.samples = dataset.samples

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, i: int) -> tuple[int, Any]:
        return i, self.dataset[i]


DECODE_SIDE = 112
"""--decode: the side of the training crops (ImageNet's 224 halved: two CPU cores train it)."""


def small_cnn(classes: int) -> Any:
    """Three strided convolutions and a linear head: ~50 MFLOP per 112x112 sample, forward and backward
    (decoding and transforming the sample costs its worker more: the job is bound by both)."""
    from torch import nn

    return nn.Sequential(
        nn.Conv2d(3, 16, 3, stride=2, padding=1),
        nn.ReLU(),
        nn.Conv2d(16, 32, 3, stride=2, padding=1),
        nn.ReLU(),
        nn.Conv2d(32, 64, 3, stride=2, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(64, classes),
    )


def train_transform(tv: Any) -> Any:
    """What an ImageNet training script applies to each decoded image (at DECODE_SIDE)."""
    t = tv.transforms
    return t.Compose(
        [
            t.RandomResizedCrop(DECODE_SIDE),
            t.RandomHorizontalFlip(),
            t.ToTensor(),
            t.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225]),
        ]
    )


def _cpu_seconds() -> float:
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def main() -> int:
    spec = json.loads(Path(sys.argv[1]).read_text())
    rank = int(sys.argv[2])
    import torch
    import torch.distributed as dist
    from torch.utils.data import DataLoader, DistributedSampler

    from tools.harness import torchvision_cpu
    from tools.harness.quantiles import quantile

    tv = torchvision_cpu.load()
    world = spec["world_size"]
    sync = spec.get("sync", True)
    if sync:
        master = spec.get("master_addr", "127.0.0.1")  # rank 0's address: another node's under Slurm
        dist.init_process_group("gloo", init_method=f"tcp://{master}:{spec['port']}", rank=rank, world_size=world)
    digests: dict[str, str] | None = spec.get("digests")
    root = spec["roots"][rank]
    started = time.monotonic()
    if spec.get("write_seed") and rank == 0:  # what a training script does before building its loaders
        Path(root, ".control", "seed").write_text(f"{spec['seed']}\n")
    decode = bool(spec.get("decode"))
    loader_fn = raw_timed if spec.get("time_reads") else raw
    image_kw: dict[str, Any] = {"transform": train_transform(tv)} if decode else {"loader": loader_fn}
    train = tv.datasets.ImageFolder(os.path.join(root, "train"), **image_kw)
    sampler: Any = None
    loader: Any
    if spec.get("sampler", "distributed") == "random":
        assert not decode, "decode runs with the distributed sampler"
        # DataLoader(shuffle=True) with a seeded generator: every rank reads the same order
        generator = torch.Generator()
        generator.manual_seed(spec["seed"])
        indexed: Any = Indexed(train)
        loader = DataLoader(
            indexed,
            batch_size=spec["batch_size"],
            shuffle=True,
            generator=generator,
            num_workers=spec["num_workers"],
            collate_fn=collate,
        )
    else:
        sampler = DistributedSampler(train, num_replicas=world, rank=rank, seed=spec["seed"])
        loader = DataLoader(
            train,
            batch_size=spec["batch_size"],
            sampler=sampler,
            num_workers=spec["num_workers"],
            collate_fn=None if decode else collate,  # decoded: the default collate stacks the tensors
            persistent_workers=False,
        )
    val_loader = None
    if spec.get("val"):
        val = tv.datasets.ImageFolder(os.path.join(root, "val"), **image_kw)
        val_sampler: Any = DistributedSampler(val, num_replicas=world, rank=rank, shuffle=False)
        val_loader = DataLoader(
            val,
            batch_size=spec["batch_size"],
            sampler=val_sampler,
            num_workers=spec["num_workers"],
            collate_fn=None if decode else collate,
        )
    if spec.get("in_memory"):  # the no-I/O lower bound: the same loop, samples made in RAM
        for ds in (train, *([val_loader.dataset] if val_loader is not None else [])):
            for path, _label in ds.samples:
                SIZES[path] = os.path.getsize(path)
            ds.loader = from_memory
    result: dict[str, Any] = {"rank": rank, "samples": 0, "bytes": 0, "bad": [], "epochs": [], "wait_s": 0.0}
    read_times: list[float] = []
    opened_at: list[tuple[str, float]] = []  # with time_reads: (path under root, open began), in consumed order
    cpu0 = _cpu_seconds()

    parts: dict[str, Any] = {}
    model: Any = None
    if decode:
        torch.set_num_threads(1)  # as torchrun sets OMP_NUM_THREADS for several ranks on one node
        torch.manual_seed(spec["seed"])
        model = small_cnn(len(train.classes))
        if sync:
            model = torch.nn.parallel.DistributedDataParallel(model)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        loss_fn = torch.nn.CrossEntropyLoss()

    def step(images: Any, labels: Any, training: bool) -> None:
        """--decode: one real step on the CPU (validation: forward only, no gradients)."""
        if not training:
            with torch.no_grad():
                model(images)
            return
        optimizer.zero_grad()
        loss_fn(model(images), labels).backward()  # DDP all-reduces the gradients here
        optimizer.step()

    def consume_decoded(batches: Any, training: bool) -> float:
        """Train on (validate over) every decoded batch; returns the time spent waiting for batches."""
        waited = 0.0
        it = iter(batches)
        while True:
            t0 = time.monotonic()
            try:
                images, labels = next(it)
            except StopIteration:
                break
            waited += time.monotonic() - t0
            result["samples"] += len(labels)
            t1 = time.monotonic()
            step(images, labels, training)
            parts["compute_s"] = parts.get("compute_s", 0.0) + time.monotonic() - t1
        return waited

    def consume(dataset: Any, batches: Any, indices: list[int] | None) -> float:
        """Read every batch; ``indices``: the sampler's order (None: the items carry their index).

        Besides the wait it returns, it adds to ``parts`` where the rest of the time went: the
        compute sleeps as slept (a busy host wakes a sleeper late), the barrier (the other ranks'
        lateness) and each batch waited for over :data:`SLOW_BATCH_S` (its number and seconds)."""
        waited = 0.0
        it = iter(batches)
        pos = 0
        number = 0
        while True:
            t0 = time.monotonic()
            try:
                batch = next(it)
            except StopIteration:
                break
            wait = time.monotonic() - t0
            waited += wait
            reads_before = len(read_times)
            for item in batch:
                if indices is None:
                    index, (sample, _label) = item
                else:
                    index, (sample, _label) = indices[pos], item
                data = sample
                if isinstance(sample, tuple):
                    data, seconds, began = sample
                    read_times.append(seconds)
                    opened_at.append((os.path.relpath(dataset.samples[index][0], root), began))
                if digests is not None:
                    rel = os.path.relpath(dataset.samples[index][0], root)
                    if hashlib.sha1(data).hexdigest() != digests[rel]:
                        result["bad"].append(rel)
                pos += 1
                result["samples"] += 1
                result["bytes"] += len(data)
            if wait > SLOW_BATCH_S:  # with time_reads, also its files' slowest and summed open+read
                reads = read_times[reads_before:]
                slow = [number, round(wait, 4)] + ([round(max(reads), 4), round(sum(reads), 4)] if reads else [])
                parts.setdefault("slow", []).append(slow)
            number += 1
            t1 = time.monotonic()
            if spec.get("compute_s"):
                time.sleep(spec["compute_s"] * len(batch))  # per sample, like GPU time per image
            t2 = time.monotonic()
            if sync:
                dist.barrier()
            parts["sleep_s"] = parts.get("sleep_s", 0.0) + t2 - t1
            parts["barrier_s"] = parts.get("barrier_s", 0.0) + time.monotonic() - t2
        return waited

    result["setup_s"] = time.monotonic() - started  # seed written (if asked) to the first epoch's start
    for epoch in range(spec["start_epoch"], spec["epochs"]):
        started_at = time.time()  # wall clock: other processes (a test's status poller) can compare
        # The mount's counters as they stand here, where the last epoch's reads are done and this
        # one's not begun (a poller from outside can miss that moment by a sampling period).
        counts_before = _mount_counts(root) if spec.get("status_counts") else None
        t0 = time.monotonic()
        if sampler is not None:
            sampler.set_epoch(epoch)
        before, opened_before, files_before = len(read_times), len(opened_at), result["samples"]
        parts.clear()
        if decode:
            model.train()
            waited = consume_decoded(loader, True)
            if val_loader is not None:
                model.eval()
                waited += consume_decoded(val_loader, False)
        else:
            waited = consume(train, loader, list(sampler) if sampler is not None else None)
            if val_loader is not None:
                waited += consume(val_loader.dataset, val_loader, list(val_loader.sampler))
        result["epochs"].append(
            {
                "epoch": epoch,
                "start": started_at,
                "seconds": time.monotonic() - t0,
                "end": time.time(),  # wall clock, as start (a status read may lie between start and t0)
                "wait_s": waited,
                "read_s": sum(read_times[before:]),
                "files": result["samples"] - files_before,
                # With time_reads: each file's open+read, in the order the rank consumed them.
                **({"reads_s": [round(x, 6) for x in read_times[before:]]} if spec.get("time_reads") else {}),
                # With time_reads: each file's path and when its open began (time.monotonic()).
                **({"opened_at": opened_at[opened_before:]} if spec.get("time_reads") else {}),
                "counts_before": counts_before,
                **parts,
            }
        )
        result["wait_s"] += waited
    result["cpu_s"] = _cpu_seconds() - cpu0  # this rank and its loader workers
    if read_times:
        read_times.sort()
        result["read_max_s"] = read_times[-1]
        result["read_p99_s"] = quantile(read_times, 0.99)
    if sync:
        dist.destroy_process_group()
    Path(spec["out"]).with_suffix(f".rank{rank}.json").write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
