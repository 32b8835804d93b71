"""A Lightning fit under torchrun (DDP, gloo on CPU), the way its docs show it.

The train DataLoader is built with ``shuffle=True`` and the val DataLoader with ``shuffle=False``;
Lightning replaces both samplers with a ``DistributedSampler`` (seeded from ``seed_everything`` via
``PL_GLOBAL_SEED``) and calls ``set_epoch`` itself.  The model is one parameter (no real compute:
a sleep per step stands for GPU time); every sample's bytes are recorded for the harness.

usage: torchrun --nproc-per-node N lightning_loop.py --data MOUNT --out DIR [options]
"""

from __future__ import annotations

import argparse
import os
from typing import Any

import clientlib
import lightning as L
import torch
from torch.utils.data import DataLoader


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--data", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("-b", "--batch-size", type=int, default=8)
    p.add_argument("-j", "--workers", type=int, default=2)
    p.add_argument("--seed", type=int, default=7, help="seed_everything(SEED)")
    p.add_argument(
        "--val",
        choices=("none", "epoch", "steps"),
        default="none",
        help="validation: none, every epoch, or every --val-every training steps (val_check_interval)",
    )
    p.add_argument("--val-every", type=int, default=10)
    p.add_argument("--sanity-steps", type=int, default=None, help="num_sanity_val_steps (default: Lightning's, 2)")
    p.add_argument("--compute-ms", type=float, default=10.0)
    return p.parse_args()


class Model(L.LightningModule):
    def __init__(self, rec: clientlib.Recorder, compute_ms: float) -> None:
        super().__init__()
        self.rec, self.compute_ms = rec, compute_ms
        self.w = torch.nn.Parameter(torch.zeros(1))

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        self.rec.batch("train", self.current_epoch, batch)
        clientlib.compute(self.compute_ms)
        return (self.w - 1.0).pow(2).sum()  # DDP all-reduces its gradient: the ranks stay in step

    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        self.rec.batch("sanity" if self.trainer.sanity_checking else "val", self.current_epoch, batch)
        clientlib.compute(self.compute_ms)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


class Snapshots(L.Callback):
    """Status snapshots at the boundaries Lightning defines: after the sanity check and every epoch."""

    def __init__(self, rec: clientlib.Recorder) -> None:
        self.rec = rec

    def _snap(self, trainer: L.Trainer, label: str) -> None:
        trainer.strategy.barrier()
        self.rec.snapshot(label)
        trainer.strategy.barrier()

    def on_sanity_check_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._snap(trainer, "sanity")

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._snap(trainer, f"epoch{trainer.current_epoch}")


def main() -> int:
    args = parse()
    L.seed_everything(args.seed)
    rank = int(os.environ["RANK"])
    rec = clientlib.Recorder(args.out, rank, args.data)
    train = clientlib.image_folder(os.path.join(args.data, "train"))
    train_loader = DataLoader(
        train, batch_size=args.batch_size, shuffle=True, num_workers=args.workers, collate_fn=clientlib.collate
    )
    val_loader = None
    if args.val != "none":
        val = clientlib.image_folder(os.path.join(args.data, "val"))
        val_loader = DataLoader(
            val, batch_size=args.batch_size, shuffle=False, num_workers=args.workers, collate_fn=clientlib.collate
        )
    kw: dict[str, Any] = {}
    if args.sanity_steps is not None:
        kw["num_sanity_val_steps"] = args.sanity_steps
    if args.val == "steps":
        kw["val_check_interval"] = args.val_every
    trainer = L.Trainer(
        accelerator="cpu",
        devices=int(os.environ["LOCAL_WORLD_SIZE"]),
        num_nodes=1,
        strategy="ddp",
        max_epochs=args.epochs,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[Snapshots(rec)],
        **kw,
    )
    model = Model(rec, args.compute_ms)
    # The status snapshot before anything is read: Lightning has set up the process group by then.
    if torch.distributed.is_initialized():
        raise AssertionError("the process group is Lightning's to create")
    rec.snapshot("start")  # every rank waits for nothing here: no file was opened yet
    rec.start()
    trainer.fit(model, train_dataloaders=train_loader, val_dataloaders=val_loader)
    sampler = trainer.train_dataloader.sampler if trainer.train_dataloader is not None else None
    rec.extra["train_sampler"] = {
        "type": type(sampler).__name__,
        "seed": getattr(sampler, "seed", None),
        "shuffle": getattr(sampler, "shuffle", None),
    }
    rec.finish()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
