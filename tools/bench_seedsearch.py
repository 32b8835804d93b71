"""Seed-search benchmark: how long finding a job's sampler seed from one node's first opens takes, at
ImageNet-1k scale (1,281,167 files, 8 ranks, 4 per node, 2 batches of 256 per local rank by default).

The job's seed is by default a 64-bit value outside every plan, so each row searches its whole
plan (the worst case); each row runs in its own child process, so its peak RSS is its own.  Plans:
the common seeds with 0..65535; the whole likely tier of the default plan (adding seed + epoch of
the common seeds and every date YYYYMMDD with its epochs); the default plan (0..2**24 and the
likely tier).  The search always tests both sampler kinds; the job kind only changes the opens.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from typing import Any

PLANS = ("common", "likely", "full")
JOBS = ("distributed", "random")
DEFAULT_SEED = 0x9E3779B97F4A7C15  # low 32 bits 2135587861: in none of the plans


def _cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _peak_rss_mb() -> float:
    """This process's peak RSS.  VmHWM, not ru_maxrss: Linux carries ru_maxrss over fork and exec,
    so a child would report at least the parent's size when it forked."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def job_opens(args: argparse.Namespace, job: str) -> list[int]:
    """Node 1's first 2 batches per local rank, from the sampler models (bit-exact torch orders)."""
    from placement.samplers import DistributedSamplerModel, RandomSamplerModel, SamplerModel
    from placement.streams import JobShape, Streams

    shape = JobShape(args.world, args.ranks_per_node, args.batch, False)
    model: SamplerModel
    if job == "distributed":
        model = DistributedSamplerModel(args.files, args.world, args.seed, backend="numpy")
    else:
        model = RandomSamplerModel(args.files, args.seed, world_size=args.world, backend="numpy")
    node = min(1, shape.nodes - 1)
    opens: list[int] = Streams(model, shape).node_stream(0, node)[: 2 * args.batch * args.ranks_per_node].tolist()
    return opens


def child(args: argparse.Namespace, opens: list[int]) -> dict[str, Any]:
    """One search in this process, timed from building the plan to the result."""
    from placement import seedsearch as ss
    from placement.streams import JobShape

    shape = JobShape(args.world, args.ranks_per_node, args.batch, False)
    t0, c0 = time.perf_counter(), _cpu_s()
    if args.plan == "common":
        plan = ss.Candidates(first=ss.COMMON_SEEDS, ranges=[(0, ss.LIKELY_RANGE)])
    else:
        plan = ss.default_candidates(limit=ss.LIKELY_RANGE if args.plan == "likely" else args.limit)
    search = ss.SeedSearch(args.files, opens, shape, candidates=plan, chunk=args.chunk)
    result = search.run()
    wall, cpu = time.perf_counter() - t0, _cpu_s() - c0
    match = result.match
    return {
        "candidates": result.candidates_tried,
        "planned": result.candidates_planned,
        "wall": wall,
        "cpu": cpu,
        "checked": result.checked,
        "status": result.status,
        "found": None if match is None else {"value": match.value, "kind": match.kind, "node": match.node},
        "chance": result.best_chance,
        "rss": _peak_rss_mb(),
    }


def run_child(argv: list[str], plan: str, opens: list[int]) -> dict[str, Any]:
    """The child gets the opens on stdin, so its peak RSS is the search's (and numpy's) alone."""
    code = "import sys; from tools.bench_seedsearch import main; sys.exit(main(sys.argv[1:]))"
    cmd = [sys.executable, "-c", code, *argv, "--child", "--plan", plan]
    proc = subprocess.run(cmd, input=json.dumps(opens), capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"bench_seedsearch: {plan} child failed: {proc.stderr.strip().splitlines()[-1:]}")
    result: dict[str, Any] = json.loads(proc.stdout)
    return result


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="bench_seedsearch", description=__doc__)
    p.add_argument("--files", type=int, default=1_281_167, help="dataset size (default 1281167)")
    p.add_argument("--world", type=int, default=8, help="ranks in the job (default 8)")
    p.add_argument("--ranks-per-node", type=int, default=4, help="ranks per node (default 4)")
    p.add_argument(
        "--batch", type=int, default=256, help="per-rank batch size; 2 batches per rank are fed (default 256)"
    )
    p.add_argument("--seed", type=int, default=DEFAULT_SEED, help="the job's seed (default: one in no plan)")
    p.add_argument("--limit", type=int, default=1 << 24, help="end of the full plan's range (default 16777216)")
    p.add_argument("--plans", default=",".join(PLANS), help="rows to run: common,likely,full (default all)")
    p.add_argument("--chunk", type=int, default=1 << 16, help="candidates per vectorised step (default 65536)")
    p.add_argument("--json", action="store_true", help="print the raw numbers as JSON, not a table")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--plan", choices=PLANS, default="common", help=argparse.SUPPRESS)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.child:
        json.dump(child(args, json.load(sys.stdin)), sys.stdout)
        return 0
    plans = [p for p in args.plans.split(",") if p]
    if bad := [p for p in plans if p not in PLANS]:
        raise SystemExit(f"bench_seedsearch: --plans: unknown {', '.join(bad)} (expected {', '.join(PLANS)})")
    passthrough = [
        f"--files={args.files}",
        f"--world={args.world}",
        f"--ranks-per-node={args.ranks_per_node}",
        f"--batch={args.batch}",
        f"--seed={args.seed}",
        f"--limit={args.limit}",
        f"--chunk={args.chunk}",
    ]
    load_start = os.getloadavg()[0]
    opens = {job: job_opens(args, job) for job in JOBS}
    res = {f"{job}/{plan}": run_child(passthrough, plan, opens[job]) for plan in plans for job in JOBS}
    load_end = os.getloadavg()[0]
    if args.json:
        json.dump({**res, "load": {"start": load_start, "end": load_end}}, sys.stdout, indent=1)
        print()
        return 0
    print(
        f"bench_seedsearch: {args.files:,} files, world {args.world}, {args.ranks_per_node} ranks per node, "
        f"{2 * args.batch * args.ranks_per_node} opens (2 batches of {args.batch} per local rank)"
    )
    labels = {"common": "common seeds + 0..65535", "likely": "likely tier (+epochs, dates)", "full": "default plan"}
    head = f"{'job sampler':12} {'plan':30} {'candidates':>11} {'wall s':>8} {'CPU s':>7} {'CPU s/M':>8}"
    print(f"{head} {'exact':>6} {'RSS MB':>7}  result")
    for key, r in res.items():
        job, plan = key.split("/")
        per_m = r["cpu"] / max(1, r["candidates"]) * 1e6
        found = r["found"]
        outcome = r["status"] if found is None else f"found {found['value']} ({found['kind']})"
        print(
            f"{job:12} {labels[plan]:30} {r['candidates']:>11,} {r['wall']:8.2f} {r['cpu']:7.2f} {per_m:8.2f} "
            f"{r['checked']:>6} {r['rss']:7.0f}  {outcome}"
        )
    print("(one child per row, single-threaded; CPU s/M: CPU seconds per million candidates; exact: (candidate,")
    print(
        " hypothesis) pairs given the exact check; RSS: the child's peak (VmHWM), the interpreter and numpy included)"
    )
    print(f"(1-minute load average {load_start:.2f} at the start, {load_end:.2f} at the end: other work on the machine")
    print(" stretches wall times; compare CPU seconds, and rerun when the load is high)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
