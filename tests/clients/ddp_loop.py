"""A torchrun training loop in the style of pytorch/examples' ImageNet main.py, with the shapes users write.

What the ImageNet example does and this script keeps: ``--seed`` only seeds ``random`` and
``torch.manual_seed``; ``DistributedSampler(train_dataset)`` gets no seed (so 0); validation uses
``DistributedSampler(val, shuffle=False, drop_last=True)`` and then every rank reads the tail that
drop_last left out through a plain DataLoader over a ``Subset``; ``set_epoch(epoch)`` before each
epoch; an all-reduce per step keeps the ranks in step (what DDP's gradient all-reduce does).

The shapes on top (each a flag): a sampler seed, no set_epoch, an early break, a late seed write,
a mid-epoch resume by skipping the sampler's first positions (what resume code does with a
consumed-samples counter) or by torchdata's StatefulDataLoader state_dict.

usage: torchrun --nproc-per-node N ddp_loop.py --data MOUNT --out DIR [options]
"""

from __future__ import annotations

import argparse
import itertools
import os
import random
from collections.abc import Iterator
from typing import Any

import clientlib
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler, Subset


class ResumableDistributedSampler(DistributedSampler):  # type: ignore[type-arg]
    """DistributedSampler that skips its first ``skip`` positions once: resume from a consumed-samples count.

    The permutation is the one DistributedSampler draws for the epoch (seed + epoch); the skipped
    positions are never handed to the DataLoader, so their files are never opened.
    """

    skip = 0

    def __iter__(self) -> Iterator[int]:
        it = super().__iter__()
        skip, self.skip = self.skip, 0
        return itertools.islice(it, skip, None)


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--data", required=True, help="dataset root (train/ and val/ inside)")
    p.add_argument("--out", required=True, help="directory for rank<N>.json")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--start-epoch", type=int, default=0)
    p.add_argument("-b", "--batch-size", type=int, default=8)
    p.add_argument("-j", "--workers", type=int, default=2)
    p.add_argument("--seed", type=int, default=None, help="the example's --seed: random and torch.manual_seed only")
    p.add_argument("--sampler-seed", type=int, default=None, help="pass seed= to the train DistributedSampler")
    p.add_argument("--val", action="store_true", help="validate after every epoch, as the ImageNet example does")
    p.add_argument("--no-set-epoch", action="store_true", help="never call train_sampler.set_epoch")
    p.add_argument("--break-after", type=int, default=0, help="stop every epoch after N batches")
    p.add_argument("--write-seed", type=int, default=None, help="rank 0 writes this to MOUNT/.control/seed")
    p.add_argument("--write-seed-after", type=int, default=0, help="... after N batches of the first epoch")
    p.add_argument("--skip", type=int, default=0, help="resume: skip the first N samples of --start-epoch")
    p.add_argument("--stateful", action="store_true", help="torchdata StatefulDataLoader for training")
    p.add_argument("--stop-at", default=None, help="EPOCH:BATCHES: save the loader's state_dict there and exit")
    p.add_argument("--resume-state", default=None, help="state file written by --stop-at: resume from it")
    p.add_argument("--compute-ms", type=float, default=10.0, help="sleep per step (GPU time)")
    return p.parse_args()


def main() -> int:
    args = parse()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.seed is not None:
        random.seed(args.seed)
        torch.manual_seed(args.seed)
    rec = clientlib.Recorder(args.out, rank, args.data)
    train = clientlib.image_folder(os.path.join(args.data, "train"))
    sampler_kw: dict[str, Any] = {} if args.sampler_seed is None else {"seed": args.sampler_seed}
    sampler = ResumableDistributedSampler(train, **sampler_kw)
    loader_cls: Any = DataLoader
    if args.stateful:
        from torchdata.stateful_dataloader import StatefulDataLoader

        loader_cls = StatefulDataLoader
    loader = loader_cls(
        train, batch_size=args.batch_size, sampler=sampler, num_workers=args.workers, collate_fn=clientlib.collate
    )
    val_loader = aux_loader = None
    if args.val:
        val = clientlib.image_folder(os.path.join(args.data, "val"))
        val_sampler: DistributedSampler[int] = DistributedSampler(val, shuffle=False, drop_last=True)
        val_loader = DataLoader(
            val, batch_size=args.batch_size, sampler=val_sampler, num_workers=args.workers, collate_fn=clientlib.collate
        )
        if len(val_sampler) * world < len(val):  # the example's tail pass, on every rank
            aux = Subset(val, range(len(val_sampler) * world, len(val)))
            aux_loader = DataLoader(
                aux, batch_size=args.batch_size, shuffle=False, num_workers=args.workers, collate_fn=clientlib.collate
            )

    start_epoch = args.start_epoch
    resume_state = None
    if args.resume_state:
        saved = torch.load(f"{args.resume_state}.rank{rank}", weights_only=False)
        start_epoch, resume_state = saved["epoch"], saved["loader"]
        rec.extra["resumed_state"] = saved["summary"]
    stop_epoch, stop_batches = (int(x) for x in args.stop_at.split(":")) if args.stop_at else (-1, -1)

    def step() -> None:
        clientlib.compute(args.compute_ms)
        dist.all_reduce(torch.zeros(1))  # the gradient all-reduce: ranks stay in step

    dist.barrier()
    rec.snapshot("start")
    dist.barrier()  # no rank opens a file while rank 0 reads the status
    rec.start()
    for epoch in range(start_epoch, args.epochs):
        if not args.no_set_epoch:
            sampler.set_epoch(epoch)
        if epoch == start_epoch:
            sampler.skip = args.skip
        if resume_state is not None:
            loader.load_state_dict(resume_state)  # after set_epoch: the state holds no epoch for this sampler
            resume_state = None
        for i, batch in enumerate(loader):
            rec.batch("train", epoch, batch)
            step()
            if epoch == start_epoch and args.write_seed is not None and i + 1 == args.write_seed_after and rank == 0:
                clientlib.write_seed(args.data, args.write_seed)
            if epoch == stop_epoch and i + 1 == stop_batches:
                state = loader.state_dict()
                summary = {"epoch": epoch, "batches": i + 1}
                torch.save({"epoch": epoch, "loader": state, "summary": summary}, f"{args.out}/state.rank{rank}")
                rec.extra["stopped_at"] = summary
                rec.extra["state_dict_keys"] = sorted(state)
                del loader  # the process ends here, as a job killed after its checkpoint
                dist.barrier()
                rec.finish()
                dist.destroy_process_group()
                return 0
            if args.break_after and i + 1 == args.break_after:
                break
        if val_loader is not None:
            for batch in val_loader:
                rec.batch("val", epoch, batch)
                step()
            if aux_loader is not None:
                for batch in aux_loader:
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
