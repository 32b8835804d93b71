"""A torchrun loop over a custom Dataset that lists its own files: the shape of countless research scripts.

The Dataset is a plain list of paths (``glob('**/*.jpg')``), in one of two orders:

* ``--order natural``: sorted by the usual natural-sort recipe (digit runs compared as numbers,
  case folded: ``img_2`` before ``img_10``), the order natsort and timm's folder reader give;
* ``--order shuffled``: shuffled once by rank 0 with Python's unseeded ``random`` and broadcast, so
  every rank indexes the same list: an order no catalog can know.

``DistributedSampler(dataset)`` (seed 0 unless ``--sampler-seed``), ``set_epoch`` every epoch, an
all-reduce per step.  Nothing is written to ``.control/seed``.

usage: torchrun --nproc-per-node N custom_loop.py --data MOUNT --out DIR [options]
"""

from __future__ import annotations

import argparse
import glob
import os
import random
import re
from typing import Any

import clientlib
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset, DistributedSampler


def natural_key(text: str) -> list[Any]:
    return [int(s) if s.isdigit() else s for s in re.split(r"(\d+)", text.lower())]


class FileList(Dataset[Any]):
    def __init__(self, paths: list[str]) -> None:
        self.paths = paths

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> tuple[tuple[str, str, float, float], int]:
        return clientlib.digest_of_file(self.paths[i]), 0


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--data", required=True, help="dataset root (train/ inside)")
    p.add_argument("--out", required=True, help="directory for rank<N>.json")
    p.add_argument("--order", choices=("natural", "shuffled"), default="natural")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("-b", "--batch-size", type=int, default=8)
    p.add_argument("-j", "--workers", type=int, default=2)
    p.add_argument("--sampler-seed", type=int, default=None)
    p.add_argument("--compute-ms", type=float, default=10.0, help="sleep per step (GPU time)")
    return p.parse_args()


def main() -> int:
    args = parse()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    rec = clientlib.Recorder(args.out, rank, args.data)
    paths = glob.glob(os.path.join(args.data, "train", "**", "*.jpg"), recursive=True)
    if args.order == "natural":
        paths.sort(key=natural_key)
    else:
        box: list[Any] = [None]
        if rank == 0:
            random.shuffle(paths)  # unseeded: the order of this run only
            box[0] = paths
        dist.broadcast_object_list(box, src=0)
        paths = box[0]
    dataset = FileList(paths)
    kw: dict[str, Any] = {} if args.sampler_seed is None else {"seed": args.sampler_seed}
    sampler: DistributedSampler[Any] = DistributedSampler(dataset, **kw)
    loader = DataLoader(
        dataset, batch_size=args.batch_size, sampler=sampler, num_workers=args.workers, collate_fn=clientlib.collate
    )
    dist.barrier()
    rec.snapshot("start")
    dist.barrier()
    rec.start()
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for batch in loader:
            rec.batch("train", epoch, batch)
            clientlib.compute(args.compute_ms)
            dist.all_reduce(torch.zeros(1))
        dist.barrier()
        rec.snapshot(f"epoch{epoch}")
        dist.barrier()
    dist.barrier()
    rec.finish()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
