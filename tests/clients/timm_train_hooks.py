"""What tests/test_clients_timm_train.py puts around timm's real ``train.py``, which it runs unmodified.

Loaded by ``timm_train_site/sitecustomize.py`` in each torchrun rank (never in the launcher, never
without ``SEERFS_TIMM_TRAIN_OUT``), before train.py's first line.  It changes nothing train.py
decides (model, samplers, loaders, order, epochs); it adapts one call to CPU and observes:

* CPU: torchvision's import is made to work on this CPU-only torch (:mod:`tools.harness.torchvision_cpu`,
  as for every client here), and ``DistributedDataParallel.__init__`` drops ``device_ids`` and
  ``output_device`` when every parameter of the module is on the CPU: train.py passes
  ``device_ids=[device]`` (through ``task.prepare_distributed``) and torch refuses device ids for a
  CPU module; for a CPU module ``None`` is what they mean.
* bytes: timm's ``ReaderImageFolder.__getitem__`` still opens the file itself; the wrapper then reads
  it whole (timed, with the worker's CPU wait, as :func:`clientlib.digest_of_file`), takes its sha1,
  appends ``[path, sha1, seconds, cpu_wait, t_open]`` to ``OUT/rank<R>-w<pid>.jsonl`` (the DataLoader
  worker's own file, a line per sample) and hands PIL the same bytes (``io.BytesIO``): timm decodes
  and augments exactly what was digested.
* epochs: ``DataLoader.__iter__`` of a loader over an ``ImageDataset`` marks its pass (training or
  validation, by the split folder) on the monotonic clock, which every process of the host shares,
  so the harness assigns each worker's reads to the pass whose window holds them.  Before the first
  pass and after each, all ranks meet at a barrier and rank 0 snapshots the mount's status
  (``start``, ``train<E>`` after training, ``epoch<E>`` after validation: the labels the other timm
  test uses), then they meet again.  The loaders' workers are persistent and idle between passes,
  so every read of a pass lies inside its window.  ``OUT/rank<R>.json`` is rewritten after each pass.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import clientlib  # first: loads torchvision the CPU-safe way, which timm imports

OUT = os.environ.get("SEERFS_TIMM_TRAIN_OUT", "")
TRAIN_SPLIT = os.environ.get("SEERFS_TIMM_TRAIN_SPLIT", "train")


class Rank:
    """This rank's record: pass windows, status snapshots, the samplers train.py's loaders got."""

    def __init__(self, rank: int, mount: str) -> None:
        self.rank, self.mount = rank, mount
        self.rec = clientlib.Recorder(OUT, rank, mount)
        self.passes: list[list[Any]] = []  # [phase, epoch, t_start, t_end, batches, sampler epoch]
        self.samplers: dict[str, str] = {}
        self.counts: dict[str, int] = {}
        self.begun = False

    def meet(self, label: str) -> None:
        """All ranks at a barrier, rank 0 reads status, all ranks at a barrier again."""
        import torch.distributed as dist

        dist.barrier()
        self.rec.snapshot(label)
        dist.barrier()

    def write(self) -> None:
        doc = {
            "rank": self.rank,
            "wall_s": (self.passes[-1][3] - self.passes[0][2]) if self.passes else 0.0,
            "snapshots": self.rec.snapshots,
            "passes": self.passes,
            "samplers": self.samplers,
            "pid": os.getpid(),
        }
        tmp = Path(OUT, f".rank{self.rank}.json")
        tmp.write_text(json.dumps(doc))
        tmp.replace(Path(OUT, f"rank{self.rank}.json"))


STATE: Rank | None = None


def phase_of(loader: Any) -> str | None:
    """``train`` or ``val`` for a loader over a timm folder dataset, None for any other loader."""
    reader = getattr(getattr(loader, "dataset", None), "reader", None)
    root = getattr(reader, "root", None)
    if not isinstance(root, str):
        return None
    return "train" if os.path.basename(os.path.normpath(root)) == TRAIN_SPLIT else "val"


def install_ddp_cpu() -> None:
    """DDP on a CPU module: ``device_ids``/``output_device`` dropped (torch accepts only None there)."""
    from torch.nn.parallel import DistributedDataParallel

    original = DistributedDataParallel.__init__

    def init(self: Any, module: Any, *args: Any, **kwargs: Any) -> None:
        if all(p.device.type == "cpu" for p in module.parameters()):
            if args:  # positional (device_ids, output_device, ...)
                args = (None, None, *args[2:]) if len(args) > 1 else (None,)
            kwargs.pop("device_ids", None)
            kwargs.pop("output_device", None)
        original(self, module, *args, **kwargs)

    DistributedDataParallel.__init__ = init  # type: ignore[method-assign]


def install_reader() -> None:
    """timm's folder reader opens as before; the bytes are read once, digested, logged and handed on."""
    from timm.data.readers.reader_image_folder import ReaderImageFolder

    original = ReaderImageFolder.__getitem__
    logs: dict[int, Any] = {}

    def getitem(self: Any, index: int) -> tuple[Any, Any]:
        t0 = time.perf_counter()
        opened = time.monotonic()
        w0 = clientlib.cpu_wait_s()
        fh, target = original(self, index)  # type: ignore[no-untyped-call]
        with fh:
            data = fh.read()
        w1 = clientlib.cpu_wait_s()
        seconds = time.perf_counter() - t0
        pid = os.getpid()
        if pid not in logs:
            logs[pid] = open(Path(OUT, f"rank{os.environ['RANK']}-w{pid}.jsonl"), "a", buffering=1)  # noqa: SIM115
        line = [fh.name, hashlib.sha1(data).hexdigest(), round(seconds, 7), round(w1 - w0, 7), opened]
        logs[pid].write(json.dumps(line) + "\n")
        return io.BytesIO(data), target

    ReaderImageFolder.__getitem__ = getitem  # type: ignore[method-assign]


def install_passes() -> None:
    """Marks each pass of a timm folder loader, with the barriers and snapshots around it."""
    from torch.utils.data import DataLoader

    original = DataLoader.__iter__

    def passes(self: Any) -> Iterator[Any]:
        phase = phase_of(self)
        state = STATE
        if phase is None or state is None:
            yield from original(self)
            return
        if not state.begun:
            state.begun = True
            state.meet("start")
        epoch = state.counts.get(phase, 0)
        state.counts[phase] = epoch + 1
        state.samplers[phase] = type(self.sampler).__name__
        t0, batches = time.monotonic(), 0
        for batch in original(self):
            batches += 1
            yield batch
        t1 = time.monotonic()
        state.meet(f"train{epoch}" if phase == "train" else f"epoch{epoch}")
        state.passes.append([phase, epoch, t0, t1, batches, getattr(self.sampler, "epoch", None)])
        state.write()

    DataLoader.__iter__ = passes  # type: ignore[method-assign,assignment]


def install() -> None:
    """Everything above, in a torchrun rank whose harness named ``SEERFS_TIMM_TRAIN_OUT``."""
    global STATE
    STATE = Rank(int(os.environ["RANK"]), os.path.abspath(os.environ["SEERFS_TIMM_TRAIN_MOUNT"]))
    install_ddp_cpu()
    install_reader()
    install_passes()
