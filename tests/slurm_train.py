"""The ``train.py`` of the Slurm tests: one rank per Slurm task, its place in the job from Slurm's variables.

``srun python slurm_train.py --data MOUNT/train`` starts one per task.  The rank is ``SLURM_PROCID``,
the world ``SLURM_NTASKS``, and the gloo rendezvous is rank 0's node: the node srun ran on
(``SLURM_LAUNCH_NODE_IPADDR``; block distribution puts rank 0 there), port ``MASTER_PORT``.  The
reading loop is tools.harness.train_reader's, unchanged: torchvision ImageFolder on ``--data``, DataLoader
workers, DistributedSampler with set_epoch, a gloo barrier per batch, and every sample's bytes checked
against a manifest computed from the source beforehand.  ``SEERFS_TRAIN_SPEC`` names the job's spec
(tools.harness.jobs.Job fields, ``digests``, ``out``); each rank writes ``OUT.rankN.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tools.harness import train_reader


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data", required=True, help="the ImageFolder's root (MOUNT/train)")
    args = parser.parse_args()
    rank, world = int(os.environ["SLURM_PROCID"]), int(os.environ["SLURM_NTASKS"])
    spec = json.loads(Path(os.environ["SEERFS_TRAIN_SPEC"]).read_text())
    data = Path(args.data)
    if data.name != "train":
        parser.error("--data must be the dataset's train directory (train_reader reads ROOT/train)")
    spec.update(
        world_size=world,
        roots=[str(data.parent)] * world,
        port=int(os.environ["MASTER_PORT"]),
        master_addr=os.environ.get("MASTER_ADDR") or os.environ["SLURM_LAUNCH_NODE_IPADDR"],
    )
    spec_file = Path(spec["out"]).with_suffix(f".spec{rank}.json")
    spec_file.write_text(json.dumps(spec))
    sys.argv = [sys.argv[0], str(spec_file), str(rank)]
    return train_reader.main()


if __name__ == "__main__":
    sys.exit(main())
