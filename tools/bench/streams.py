"""Access-stream benchmark: torch.randperm versus its numpy replay, and the planner's per-node read
counts at ImageNet-1k scale (1,281,167 files, 90 epochs, 16 nodes x 4 ranks by default).

Each backend runs in its own child process, so the numpy column is a process where torch cannot
be imported at all (its peak RSS carries no torch), and both columns come from the same run.
Prints one table; ratios are numpy over torch.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

NO_TORCH = "sys.modules['torch'] = None"  # makes `import torch` raise ImportError in the child


def _best(fn: Callable[[], object], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def _cpu_s() -> float:
    """CPU seconds of this process, all threads (what a loaded machine inflates least)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def child(args: argparse.Namespace) -> dict[str, Any]:
    """Measure in this process (torch already hidden by the parent when backend is numpy)."""
    from fusefs.planning.inputs import plan_pool
    from placement.randperm import randperm, torch_available
    from placement.samplers import DistributedSamplerModel
    from placement.streams import JobShape, Streams

    backend = "torch" if torch_available() else "numpy"
    world = args.nodes * args.ranks_per_node
    model = DistributedSamplerModel(args.files, world, args.seed, cache_epochs=2)
    streams = Streams(model, JobShape(world, args.ranks_per_node, args.batch, True), cache_epochs=2)
    out: dict[str, Any] = {"backend": backend}
    if args.part == "micro":
        out["randperm"] = _best(lambda: randperm(args.files, args.seed), args.repeat)
        fresh = iter(range(1000, 1000 + args.repeat))  # an epoch not computed yet, each time
        out["counts_1"] = _best(lambda: streams.node_counts([next(fresh)]), args.repeat)
        out["counts_only"] = _best(lambda: streams.node_counts(range(1)), args.repeat)
        out["inverse"] = _best(lambda: streams._build_inverse(1), args.repeat)
        out["node_stream"] = _best(lambda: streams.node_stream(1, 0), args.repeat)
    else:
        with plan_pool(args.workers) as (pool, width):  # 1: no pool, every epoch in its turn
            t0, c0 = time.perf_counter(), _cpu_s()
            counts = streams.node_counts(range(args.epochs), pool=pool, width=width)
            out["counts_all"] = time.perf_counter() - t0
            out["cpu_all"] = _cpu_s() - c0
        out["reads"] = int(counts.sum())
    out["rss"] = _peak_rss_mb()
    return out


def run_child(argv: list[str], backend: str, part: str, workers: int) -> dict[str, Any]:
    prelude = f"import sys; {NO_TORCH}; " if backend == "numpy" else "import sys; "
    code = prelude + "from tools.bench.streams import main; sys.exit(main(sys.argv[1:]))"
    cmd = [sys.executable, "-c", code, *argv, "--child", "--part", part, "--workers", str(workers)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"bench_streams: {backend} child failed: {proc.stderr.strip().splitlines()[-1:]}")
    result: dict[str, Any] = json.loads(proc.stdout)
    if result["backend"] != backend:
        raise SystemExit(f"bench_streams: expected a {backend} child, got {result['backend']}")
    return result


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="bench/streams", description=__doc__)
    p.add_argument("--files", type=int, default=1_281_167, help="dataset size (default 1281167)")
    p.add_argument("--epochs", type=int, default=90, help="epochs folded into node counts (default 90)")
    p.add_argument("--nodes", type=int, default=16, help="nodes (default 16)")
    p.add_argument("--ranks-per-node", type=int, default=4, help="ranks per node (default 4)")
    p.add_argument("--batch", type=int, default=256, help="per-rank batch size, drop_last=True (default 256)")
    p.add_argument("--seed", type=int, default=0, help="DistributedSampler seed (default 0)")
    p.add_argument("--repeat", type=int, default=5, help="repeats of each micro timing, best kept (default 5)")
    p.add_argument(
        "--workers",
        type=int,
        default=2,
        help="threads computing epochs ahead in the parallel multi-epoch row (default 2)",
    )
    p.add_argument("--json", action="store_true", help="print the raw numbers as JSON, not a table")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--part", choices=["micro", "all"], default="micro", help=argparse.SUPPRESS)
    return p


def main(argv: list[str] | None = None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    if args.child:
        json.dump(child(args), sys.stdout)
        return 0

    passthrough = [
        f"--files={args.files}",
        f"--epochs={args.epochs}",
        f"--nodes={args.nodes}",
        f"--ranks-per-node={args.ranks_per_node}",
        f"--batch={args.batch}",
        f"--seed={args.seed}",
        f"--repeat={args.repeat}",
    ]
    res: dict[str, dict[str, Any]] = {}
    load_start = os.getloadavg()[0]
    for backend in ("torch", "numpy"):
        res[f"{backend}/micro"] = run_child(passthrough, backend, "micro", 1)
        res[f"{backend}/serial"] = run_child(passthrough, backend, "all", 1)
        res[f"{backend}/parallel"] = run_child(passthrough, backend, "all", args.workers)
    if res["torch/serial"]["reads"] != res["numpy/serial"]["reads"]:
        raise SystemExit("bench_streams: torch and numpy children counted different reads")
    load_end = os.getloadavg()[0]
    if args.json:
        json.dump({**res, "load": {"start": load_start, "end": load_end}}, sys.stdout, indent=1)
        print()
        return 0

    shape = f"{args.nodes} nodes x {args.ranks_per_node} ranks, batch {args.batch}"
    rows = [
        (f"randperm({args.files:,})", "micro", "randperm", 1e3, "ms"),
        ("epoch inverse (file -> rank, pos)", "micro", "inverse", 1e3, "ms"),
        ("node stream, one node, one epoch", "micro", "node_stream", 1e3, "ms"),
        ("node_counts, 1 epoch (permutation cached)", "micro", "counts_only", 1e3, "ms"),
        ("node_counts, 1 new epoch", "micro", "counts_1", 1e3, "ms"),
        (f"node_counts, {args.epochs} epochs, 1 thread", "serial", "counts_all", 1.0, "s"),
        (f"node_counts, {args.epochs} epochs, {args.workers} threads", "parallel", "counts_all", 1.0, "s"),
        (f"  CPU seconds, {args.epochs} epochs, 1 thread", "serial", "cpu_all", 1.0, "s"),
        (f"  CPU seconds, {args.epochs} epochs, {args.workers} threads", "parallel", "cpu_all", 1.0, "s"),
        (f"peak RSS, {args.epochs} epochs, 1 thread", "serial", "rss", 1.0, "MB"),
        (f"peak RSS, {args.epochs} epochs, {args.workers} threads", "parallel", "rss", 1.0, "MB"),
    ]
    print(f"bench_streams: {args.files:,} files, DistributedSampler, {shape}")
    print(f"{'measure':44} {'torch':>10} {'numpy':>10} {'numpy/torch':>12}")
    for label, part, key, scale, unit in rows:
        t = res[f"torch/{part}"][key] * scale
        n = res[f"numpy/{part}"][key] * scale
        fmt = "{:8.1f} " if unit != "s" else "{:8.2f} "
        print(f"{label:44} {fmt.format(t)}{unit:<2}{fmt.format(n)}{unit:<2}{n / t:11.2f}x")
    print("(micro rows: best of --repeat, wall; numpy child has torch unimportable; RSS: ru_maxrss)")
    print(f"(1-minute load average {load_start:.2f} at the start, {load_end:.2f} at the end: other work on the machine")
    print(" stretches wall times; compare CPU seconds, and rerun when the load is high)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
