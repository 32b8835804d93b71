"""An accelerate training loop under torchrun (CPU, gloo), as its examples write it.

``set_seed(SEED)``, a DataLoader with ``shuffle=True``, ``accelerator.prepare(model, optimizer,
loader)``, then plain epochs with no ``set_epoch`` call (accelerate's prepared loader counts
iterations itself).  ``--seedable`` turns on ``DataLoaderConfiguration(use_seedable_sampler=True)``.

``--write-seed`` is what the job writes to ``MOUNT/.control/seed`` (rank 0, after prepare(), before
the first epoch): ``set-seed`` writes SEED; ``generator`` writes the initial seed of the generator
prepare() gave the RandomSampler, the only number that decides the order in the default mode.

usage: torchrun --nproc-per-node N accelerate_loop.py --data MOUNT --out DIR [options]
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

import clientlib
import torch
from accelerate import Accelerator, DataLoaderConfiguration
from accelerate.utils import set_seed
from torch.utils.data import DataLoader


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--data", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("-b", "--batch-size", type=int, default=8)
    p.add_argument("-j", "--workers", type=int, default=2)
    p.add_argument("--seed", type=int, default=7, help="accelerate.utils.set_seed(SEED)")
    p.add_argument("--seedable", action="store_true", help="use_seedable_sampler=True")
    p.add_argument("--write-seed", choices=("none", "set-seed", "generator"), default="none")
    p.add_argument("--compute-ms", type=float, default=10.0)
    return p.parse_args()


def main() -> int:
    args = parse()
    accelerator = Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(use_seedable_sampler=args.seedable))
    set_seed(args.seed)
    rank = accelerator.process_index
    rec = clientlib.Recorder(args.out, rank, args.data)
    train = clientlib.image_folder(os.path.join(args.data, "train"))
    model = torch.nn.Linear(1, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(
        train, batch_size=args.batch_size, shuffle=True, num_workers=args.workers, collate_fn=clientlib.collate
    )
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    shard: Any = loader.batch_sampler  # BatchSamplerShard around the DataLoader's own BatchSampler
    sampler: Any = shard.batch_sampler.sampler
    generator = getattr(loader, "synchronized_generator", None)
    rec.extra["sampler"] = {
        "type": type(sampler).__name__,
        "batch_sampler": type(shard).__name__,
        "even_batches": shard.even_batches,
        "split_batches": shard.split_batches,
        "initial_seed": getattr(sampler, "initial_seed", None),
        "generator_initial_seed": generator.initial_seed() if generator is not None else None,
        "rng_types": loader.rng_types,
    }
    if rank == 0 and args.write_seed != "none":
        value = args.seed if args.write_seed == "set-seed" else generator.initial_seed() if generator else None
        if value is None:
            raise AssertionError("no synchronized generator to take the seed from")
        clientlib.write_seed(args.data, value)
        from tools.harness.jobs import wait_plan  # the job waits for the plan, as the harness does for seeds it writes

        wait_plan(Path(args.data), value)
    accelerator.wait_for_everyone()
    rec.snapshot("start")
    accelerator.wait_for_everyone()
    rec.start()
    x = torch.ones(1, 1)
    for epoch in range(args.epochs):
        model.train()
        for batch in loader:
            rec.batch("train", epoch, batch)
            clientlib.compute(args.compute_ms)
            loss = model(x).pow(2).sum()
            accelerator.backward(loss)  # DDP all-reduces the gradient: the ranks stay in step
            optimizer.step()
            optimizer.zero_grad()
        accelerator.wait_for_everyone()
        rec.snapshot(f"epoch{epoch}")
        accelerator.wait_for_everyone()
    rec.finish()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
