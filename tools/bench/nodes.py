"""Three seerfs nodes on one machine: epoch times and PFS bytes with peers on versus off.

Each node is a daemon with its own mountpoint, cache and loopback address, all over one PFS
emulator; the job is world size 3 (one rank per node: ImageFolder + DataLoader workers +
DistributedSampler, ranks in step).  "Peers on" forms a group through a rendezvous directory, so a
file this node does not hold comes from its owner; "peers off" runs the same daemons alone, so such
files come from the PFS.  Tiers hold --tier-share of the dataset per node.

``--plan-latency N``: no readers; ``--nodes`` daemons (default 2) in a group, each node's seed file
written (as each node's job script does) N times with a new seed, and the seconds from the write to
``plan.state`` ready for that seed on every node, with the daemons' CPU seconds (their plan workers
included) and the load average, one row per write.  Run it under another checkout's code with
``cd OTHER && PYTHONPATH=OTHER python THIS/tools/bench/nodes.py ...`` (the daemons run OTHER's code).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from fusefs.waiting import wait_until
from tools.bench.procstat import CLK_TCK
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


def tree_cpu(pid: int) -> float:
    """CPU seconds of ``pid``, of its children it waited for and of its live children (the plan and
    seed-search workers)."""
    total = 0.0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        fields = text[text.rindex(")") + 2 :].split()
        if stat.parent.name == str(pid):
            total += sum(int(f) for f in fields[11:15]) / CLK_TCK
        elif fields[1] == str(pid):
            total += (int(fields[11]) + int(fields[12])) / CLK_TCK
    return total


def ready_times(mnts: list[Path], seed: int, t0: float, timeout: float = 300) -> list[float]:
    """Per mount, the seconds from ``t0`` until its status said the plan for ``seed`` is ready."""
    ready: dict[int, float] = {}

    def all_ready() -> bool:
        for k, mnt in enumerate(mnts):
            if k not in ready:
                plan = status(mnt)["plan"]
                if plan["state"] == "failed":
                    raise AssertionError(f"planning failed: {plan['message']}")
                if plan["state"] == "ready" and plan["seed"] == seed:
                    ready[k] = time.perf_counter() - t0
        return len(ready) == len(mnts)

    wait_until(all_ready, timeout, f"the plan for seed {seed} on every node", max_delay=0.02)  # status is cheap
    return [ready[k] for k in range(len(mnts))]


def plan_latency(
    source: Path, total: int, work: Path, job: Job, share: float, nodes: int, repeats: int
) -> list[dict[str, Any]]:
    """Seed write to plan ready on every node of a group, ``repeats`` times, each with a new seed
    (a seed planned before would be loaded from the cache)."""
    rows = []
    with rendezvous_group(source, work, job, tier_bytes=int(total * share), n=nodes) as mnts:
        pids = [int(status(m)["pid"]) for m in mnts]
        for r in range(repeats):
            seed = 1000 + r
            load = os.getloadavg()[0]
            cpu0 = sum(tree_cpu(p) for p in pids)
            t0 = time.perf_counter()
            for mnt in mnts:
                write_seed(mnt, seed)
            ready = ready_times(mnts, seed, t0)
            rows.append(
                {
                    "seed": seed,
                    "ready_s": ready,
                    "plan_s": [status(m)["plan"]["seconds"] for m in mnts],
                    "cpu_s": sum(tree_cpu(p) for p in pids) - cpu0,
                    "load": [load, os.getloadavg()[0]],
                }
            )
    return rows


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
    p.add_argument("--plan-latency", type=int, default=0, metavar="N", help="time N seed writes to plan ready instead")
    p.add_argument("--nodes", type=int, default=2, help="nodes with --plan-latency (default 2)")
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
        if a.plan_latency:
            job.world_size = a.nodes
            latency = plan_latency(src, total, work / "plan", job, a.tier_share, a.nodes, a.plan_latency)
            return print_latency(a, total, latency)
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


def print_latency(a: argparse.Namespace, total: int, rows: list[dict[str, Any]]) -> int:
    if a.json:
        print(json.dumps({"parameters": vars(a), "dataset_bytes": total, "writes": rows}, indent=1))
        return 0
    print(f"parameters: {json.dumps(vars(a))}; dataset {total / 1e6:.1f} MB; {a.nodes} nodes, 1 rank each")
    print("seed write to plan ready on every node (wall seconds; the daemons' CPU seconds with their workers)\n")
    print(f"{'seed':>6}  {'ready s per node':>22}  {'all ready s':>11}  {'plan s':>14}  {'cpu s':>6}  {'load':>9}")
    for r in rows:
        each = " ".join(f"{t:.2f}" for t in r["ready_s"])
        plan = " ".join(f"{t:.2f}" for t in r["plan_s"])
        load = f"{r['load'][0]:.1f}/{r['load'][1]:.1f}"
        print(f"{r['seed']:>6}  {each:>22}  {max(r['ready_s']):>11.2f}  {plan:>14}  {r['cpu_s']:>6.2f}  {load:>9}")
    ready = sorted(max(r["ready_s"]) for r in rows)
    print(f"\nmedian all ready: {ready[len(ready) // 2]:.2f} s over {len(rows)} writes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
