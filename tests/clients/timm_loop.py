"""timm's train.py data path under torchrun, unmodified: its dataset, its loaders, its epoch loop.

timm's wheel does not install ``train.py`` (it lives in the timm repository only), so this script makes
the calls train.py makes for its data, with train.py's defaults for the rest (``--no-prefetcher``, as
on CPU): ``timm.utils.random_seed(seed, rank)``; ``create_dataset('', root=DATA, split='train',
is_training=True, ...)`` and ``split='validation'`` (timm finds ``val/``), both read by timm's folder
reader (``find_images_and_targets``: natural order of the full path); ``create_loader(...,
distributed=True)``, which gives training a ``DistributedSampler`` (seed 0: train.py's ``--seed``
only seeds the global RNGs) with ``drop_last=True`` and validation timm's ``OrderedDistributedSampler``
without drop_last; ``loader_train.sampler.set_epoch(epoch)`` before each epoch, validation after each.
No model: an all-reduce per step stands for DDP's gradient all-reduce (so no ``device_ids`` reaches
DDP on CPU and no shim is needed).

Only decoding is left out, as in every client here: timm's ``ImageDataset`` runs with
``load_bytes=True`` and its reader's file opens are timed and digested (``TimedReader``: the same
files at the same indices), and the loaders' transforms are dropped after ``create_loader`` built them.

usage: torchrun --nproc-per-node N timm_loop.py --data MOUNT --out DIR [options]
"""

from __future__ import annotations

import argparse
import hashlib
import time
from typing import Any

import clientlib  # first: loads torchvision the CPU-safe way, which timm imports
import torch
import torch.distributed as dist
from timm.data.dataset_factory import create_dataset
from timm.data.loader import create_loader
from timm.utils.random import random_seed


class TimedRead:
    """What the reader hands ImageDataset instead of an open file: ``read()`` gives the digest tuple."""

    def __init__(self, value: tuple[str, str, float, float]) -> None:
        self.value = value

    def read(self) -> tuple[str, str, float, float]:
        return self.value


class TimedReader:
    """timm's ReaderImageFolder, its samples and order untouched; each item's file read and timed whole."""

    def __init__(self, reader: Any) -> None:
        self.reader = reader

    def __len__(self) -> int:
        return len(self.reader)

    def __getitem__(self, index: int) -> tuple[TimedRead, int]:
        path, target = self.reader.samples[index]
        t0 = time.perf_counter()
        w0 = clientlib.cpu_wait_s()
        with open(path, "rb") as fh:
            data = fh.read()
        w1 = clientlib.cpu_wait_s()
        seconds = time.perf_counter() - t0
        return TimedRead((path, hashlib.sha1(data).hexdigest(), seconds, w1 - w0)), target

    def __getattr__(self, name: str) -> Any:
        return getattr(self.reader, name)


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--data", required=True, help="dataset root (train/ and val/ inside)")
    p.add_argument("--out", required=True, help="directory for rank<N>.json")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("-b", "--batch-size", type=int, default=8)
    p.add_argument("-vb", "--validation-batch-size", type=int, default=None)
    p.add_argument("-j", "--workers", type=int, default=2)
    p.add_argument("--seed", type=int, default=42, help="train.py's --seed (default 42): the global RNGs only")
    p.add_argument("--snapshot-train", action="store_true", help="also snapshot status between train and val")
    p.add_argument("--aug-repeats", type=float, default=0, help="train.py's --aug-repeats: RepeatAugSampler")
    p.add_argument("--compute-ms", type=float, default=10.0, help="sleep per step (GPU time)")
    return p.parse_args()


def timed(dataset: Any) -> Any:
    dataset.reader = TimedReader(dataset.reader)
    dataset.load_bytes = True
    return dataset


def main() -> int:
    args = parse()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    random_seed(args.seed, rank)  # type: ignore[no-untyped-call]
    rec = clientlib.Recorder(args.out, rank, args.data)
    common: dict[str, Any] = {"input_size": (3, 32, 32), "use_prefetcher": False, "device": torch.device("cpu")}
    train = timed(create_dataset("", root=args.data, split="train", is_training=True, batch_size=args.batch_size))
    val = timed(create_dataset("", root=args.data, split="validation", is_training=False, batch_size=args.batch_size))
    loader_train = create_loader(
        train,
        batch_size=args.batch_size,
        is_training=True,
        num_aug_repeats=args.aug_repeats,
        num_workers=args.workers,
        distributed=True,
        collate_fn=clientlib.collate,
        **common,
    )
    loader_eval = create_loader(
        val,
        batch_size=args.validation_batch_size or args.batch_size,
        is_training=False,
        num_workers=args.workers,
        distributed=True,
        collate_fn=clientlib.collate,
        **common,
    )
    train.transform = val.transform = None  # no decoding: the sample is the digest of its bytes
    rec.extra["samplers"] = [type(loader_train.sampler).__name__, type(loader_eval.sampler).__name__]

    def step() -> None:
        clientlib.compute(args.compute_ms)
        dist.all_reduce(torch.zeros(1))

    dist.barrier()
    rec.snapshot("start")
    dist.barrier()
    rec.start()
    for epoch in range(args.epochs):
        if hasattr(loader_train.sampler, "set_epoch"):
            loader_train.sampler.set_epoch(epoch)
        for batch in loader_train:
            rec.batch("train", epoch, batch)
            step()
        if args.snapshot_train:
            dist.barrier()
            rec.snapshot(f"train{epoch}")
            dist.barrier()
        for batch in loader_eval:
            rec.batch("val", epoch, batch)
            step()
        dist.barrier()
        rec.snapshot(f"epoch{epoch}")
        dist.barrier()
    dist.barrier()
    rec.finish()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
