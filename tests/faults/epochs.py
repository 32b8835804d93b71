"""One rank of a data-parallel job whose epochs a test starts one at a time (the soak test's reader).

Real torchvision ImageFolder + DataLoader + DistributedSampler with ``set_epoch``, as in training;
unlike tools/harness/train_reader.py the epochs are driven from stdin, so the test can rewrite the seed,
kill a daemon and sample the daemons between (or during) epochs.  Every sample's bytes are compared
with a manifest the test made from the source directly (size and xxh3_64), never through a mount.

usage: python tests/faults/epochs.py SPEC.json RANK
  stdin:  "EPOCH <epoch> <seed>" per epoch, "QUIT" to end
  stdout: one JSON line per epoch: epoch, seed, samples, bytes, bad (up to 5 wrong paths),
          bad_count, errors (up to 5 "path: errno"), error_count, seconds, read_max_s
SPEC.json: {"root": mount, "world_size": n, "batch_size": b, "num_workers": w, "manifest": {rel: [size, xxh3]}}
"""

from __future__ import annotations

import errno
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def timed_read(path: str) -> tuple[str, bytes | None, float, str]:
    """The sample: its path, bytes (None on an error, with its errno name) and open+read seconds."""
    t0 = time.monotonic()
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except OSError as exc:
        return path, None, time.monotonic() - t0, errno.errorcode.get(exc.errno or 0, str(exc))
    return path, data, time.monotonic() - t0, ""


def collate(batch: list[Any]) -> list[Any]:
    return batch


def main() -> int:
    spec = json.loads(Path(sys.argv[1]).read_text())
    rank = int(sys.argv[2])
    import xxhash
    from torch.utils.data import DataLoader, DistributedSampler

    from tools.harness import torchvision_cpu

    tv = torchvision_cpu.load()
    root = spec["root"]
    manifest: dict[str, list[int]] = spec["manifest"]
    train = tv.datasets.ImageFolder(os.path.join(root, "train"), loader=timed_read)
    samplers: dict[int, Any] = {}
    print("READY", flush=True)
    for line in sys.stdin:
        words = line.split()
        if not words or words[0] == "QUIT":
            break
        epoch, seed = int(words[1]), int(words[2])
        sampler = samplers.get(seed)
        if sampler is None:  # a job restarted with another seed builds a new sampler, as here
            sampler = samplers[seed] = DistributedSampler(train, num_replicas=spec["world_size"], rank=rank, seed=seed)
        sampler.set_epoch(epoch)
        loader = DataLoader(
            train,
            batch_size=spec["batch_size"],
            sampler=sampler,
            num_workers=spec["num_workers"],
            collate_fn=collate,
        )
        out: dict[str, Any] = {"epoch": epoch, "seed": seed, "samples": 0, "bytes": 0, "bad": [], "errors": []}
        bad = errors = 0
        worst = 0.0
        t0 = time.monotonic()
        for batch in loader:
            for (path, data, seconds, err), _label in batch:
                rel = os.path.relpath(path, root)
                worst = max(worst, seconds)
                out["samples"] += 1
                if data is None:
                    errors += 1
                    if len(out["errors"]) < 5:
                        out["errors"].append(f"{rel}: {err}")
                    continue
                out["bytes"] += len(data)
                size, digest = manifest[rel]
                if len(data) != size or xxhash.xxh3_64_intdigest(data) != digest:
                    bad += 1
                    if len(out["bad"]) < 5:
                        out["bad"].append(rel)
        out.update(bad_count=bad, error_count=errors, seconds=time.monotonic() - t0, read_max_s=worst)
        print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
