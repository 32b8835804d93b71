"""Three seerfs nodes on one machine: epoch times and PFS bytes with peers on versus off.

Each node is a daemon with its own mountpoint, cache and loopback address, all over one PFS
emulator; the job is world size 3 (one rank per node: ImageFolder + DataLoader workers +
DistributedSampler, ranks in step).  "Peers on" forms a group through a rendezvous directory, so a
file this node does not hold comes from its owner; "peers off" runs the same daemons alone, so such
files come from the PFS.  Tiers hold --tier-share of the dataset per node.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from tools.harness.jobs import Job, make_source, run_readers, wait_plan, write_seed
from tools.harness.mounts import status
from tools.harness.nodes import rendezvous_group
from tools.pfsemu import running as running_pfsemu


def run(source: Path, total: int, work: Path, job: Job, share: float, peers: bool) -> dict[str, Any]:
    with running_pfsemu(source) as emu:
        emu.reset()
        with rendezvous_group(emu.mountpoint, work, job, tier_bytes=int(total * share), alone=not peers) as mnts:
            for mnt in mnts if not peers else mnts[:1]:  # alone, every node needs the seed written
                write_seed(mnt, job.seed)
            for mnt in mnts:
                wait_plan(mnt, job.seed)
            results = run_readers(mnts, job, None, work / "run")
            docs = [status(m) for m in mnts]
        epochs = [max(r["epochs"][e]["seconds"] for r in results) for e in range(len(results[0]["epochs"]))]
        return {
            "peers": peers,
            "epoch_s": epochs,
            "pfs_bytes": emu.counters().bytes,
            "peer_files": [d["reads"]["by_source"]["peer"]["files"] for d in docs],
            "hit_rate": [d["cursor"]["hit_rate"] for d in docs],
        }


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="bench/nodes", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--files", type=int, default=1500, help="training files (default 1500)")
    p.add_argument("--val-files", type=int, default=150, help="validation files (default 150)")
    p.add_argument("--mean-size", type=int, default=30_000, help="mean file size in bytes (default 30000)")
    p.add_argument("--epochs", type=int, default=3, help="epochs (default 3)")
    p.add_argument("--batch", type=int, default=16, help="per-rank batch size (default 16)")
    p.add_argument("--workers", type=int, default=2, help="DataLoader workers per rank (default 2)")
    p.add_argument("--compute-ms", type=float, default=1.0, help="compute per sample, ms of sleep (default 1)")
    p.add_argument("--tier-share", type=float, default=0.4, help="tier bytes per node / dataset (default 0.4)")
    p.add_argument("--json", action="store_true", help="print results as JSON")
    return p


def main(argv: list[str] | None = None) -> int:
    p = build_parser()
    a = p.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="seerfs-bench-nodes-"))
    try:
        src = work / "data"
        _digests, total = make_source(src, a.files, a.val_files, mean_size=a.mean_size)
        job = Job(
            world_size=3,
            epochs=a.epochs,
            batch_size=a.batch,
            num_workers=a.workers,
            seed=3,
            val=a.val_files > 0,
            compute_s=a.compute_ms / 1000,
        )
        rows = []
        for peers in (True, False):
            d = work / ("on" if peers else "off")
            d.mkdir()
            rows.append(run(src, total, d, job, a.tier_share, peers))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if a.json:
        print(json.dumps({"parameters": vars(a), "dataset_bytes": total, "runs": rows}, indent=1))
        return 0
    print(f"parameters: {json.dumps(vars(a))}; dataset {total / 1e6:.1f} MB; 3 nodes, 1 rank each\n")
    head = "  ".join(f"epoch {e}" for e in range(a.epochs))
    print(f"{'peers':<6}  {head}  {'PFS bytes / dataset':>20}  peer reads per node")
    for r in rows:
        cells = "  ".join(f"{t:6.2f}s" for t in r["epoch_s"])
        print(f"{'on' if r['peers'] else 'off':<6}  {cells}  {r['pfs_bytes'] / total:20.2f}x  {r['peer_files']}")
    on, off = rows
    print(
        f"\nlater epochs with peers: {sum(off['epoch_s'][1:]) / max(1e-9, sum(on['epoch_s'][1:])):.2f}x faster; "
        f"PFS bytes {off['pfs_bytes'] / max(1, on['pfs_bytes']):.2f}x fewer"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
