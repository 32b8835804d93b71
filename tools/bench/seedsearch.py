"""Seed-search benchmark: how long finding a job's sampler seed from one node's first opens takes, at
ImageNet-1k scale (1,281,167 files, 8 ranks, 4 per node, 2 batches of 256 per local rank by default).

The job's seed is by default a 64-bit value outside every plan, so each row searches its whole
plan (the worst case); each row runs in its own child process, so its peak RSS is its own.  Plans:
the common seeds with 0..65535; the whole likely tier of the default plan (adding seed + epoch of
the common seeds and every date YYYYMMDD with its epochs); the default plan (0..2**24 and the
likely tier).  The search always tests both sampler kinds; the job kind only changes the opens.

``--open-latency`` instead times opens through a real mount of a tree of ``--files`` files (hard
links, made once under ``--tree``) while the daemon's search process runs, and without one: one
thread opens and reads random files, as fast as it can until the node has opened the two batches
per local rank the search waits for, then one every 2 ms.  Random files fit no seed, so the search
runs its whole plan (the longest it can take).  The same mount with ``seed_discovery.enabled:
false`` gives the opens without a search, for as long as the search ran (at most ``--seconds``).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from tools.harness.quantiles import quantile

PLANS = ("common", "likely", "full")
JOBS = ("distributed", "random")
DEFAULT_SEED = 0x9E3779B97F4A7C15  # low 32 bits 2135587861: in none of the plans
LIKELY_TARGET_S = 1.0  # common seeds + 0..65535, wall seconds, at the default sizes
FULL_TARGET_S = 60.0  # the default plan (0..2**24 and the likely tier), wall seconds, at the default sizes
P99_TARGET_MS = 20.0  # open latency through the mount while the search runs
CLASSES = 1000  # --open-latency: the tree's class directories


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
    code = "import sys; from tools.bench.seedsearch import main; sys.exit(main(sys.argv[1:]))"
    cmd = [sys.executable, "-c", code, *argv, "--child", "--plan", plan]
    proc = subprocess.run(cmd, input=json.dumps(opens), capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"bench_seedsearch: {plan} child failed: {proc.stderr.strip().splitlines()[-1:]}")
    result: dict[str, Any] = json.loads(proc.stdout)
    return result


def _tree(args: argparse.Namespace) -> tuple[Path, int]:
    """The tree of about --files files (CLASSES directories of hard links) and its files per class."""
    from tools.bench.prefetch import make_big_tree

    per_class = max(1, args.files // CLASSES)
    root = Path(args.tree or f"/var/tmp/seerfs-bench-tree-{CLASSES * per_class}")
    t0 = time.monotonic()
    make_big_tree(root, CLASSES, per_class)
    print(f"bench_seedsearch: {CLASSES * per_class:,}-file tree ready in {time.monotonic() - t0:.1f}s", file=sys.stderr)
    return root, per_class


def _percentiles(lat: list[float]) -> dict[str, float]:
    lat = sorted(lat)
    if not lat:
        return {"opens": 0, "p50_ms": float("nan"), "p99_ms": float("nan"), "max_ms": float("nan")}
    return {
        "opens": len(lat),
        "p50_ms": 1000 * statistics.median(lat),
        "p99_ms": 1000 * quantile(lat, 0.99),
        "max_ms": 1000 * lat[-1],
    }


def latency_run(
    args: argparse.Namespace, root: Path, per_class: int, work: Path, search: bool, window: float
) -> dict[str, Any]:
    """One mount: open random files, and time those opened while the search runs (``search``) or,
    without one, during ``window`` seconds after as many opens as a search waits for."""
    from tools.harness.jobs import Job, seerfs_config, wait_plan
    from tools.harness.mounts import force_unmount, seerfs, status, wait_for

    label = "search" if search else "nosearch"
    job = Job(world_size=args.world, epochs=2, batch_size=args.batch, num_workers=2, seed=0, val=False)
    cfg = seerfs_config(
        work / f"{label}.yaml",
        job,
        cache_dir=work / "cache",  # shared: the second mount reuses the snapshot
        ranks_per_node=args.ranks_per_node,
        tiers=[{"kind": "memory", "bytes": "256MiB", "threads": 4}],
        seed_discovery={"enabled": search, "limit": args.limit},
    )
    mnt = work / f"mnt-{label}"
    mnt.mkdir()
    seerfs("mount", str(root), str(mnt), "-c", str(cfg), "--timeout", "900", check=True, timeout=900)
    need = 2 * args.batch * args.ranks_per_node
    times: list[tuple[float, float]] = []  # (start, seconds) of each open
    paced = threading.Event()
    stop = threading.Event()

    def opener() -> None:
        rng = random.Random(1)
        while not stop.is_set():
            rel = f"train/n{rng.randrange(CLASSES):08d}/i{rng.randrange(per_class):07d}.JPEG"
            t = time.monotonic()
            with open(mnt / rel, "rb") as fh:
                times.append((t, time.monotonic() - t))
                fh.read()
            if paced.is_set():
                time.sleep(0.002)

    thread = threading.Thread(target=opener, daemon=True)
    try:
        wait_plan(mnt, 0, timeout=900)  # the assumed seed's plan: not what is measured
        thread.start()
        disc: dict[str, Any] = {}
        if search:
            disc = wait_for(
                lambda: (d := status(mnt)["discovery"])["state"] not in ("idle", "waiting", "preparing") and d,
                timeout=900,
                what="the search to start",
            )
            paced.set()
            start = time.monotonic()
            while disc["state"] == "searching" and time.monotonic() - start < window:
                time.sleep(0.1)
                disc = status(mnt)["discovery"]
        else:
            wait_for(lambda: len(times) >= need, timeout=900, what=f"{need} opens")
            paced.set()
            start = time.monotonic()
            time.sleep(window)
        end = time.monotonic()
    finally:
        stop.set()
        if thread.is_alive():
            thread.join(timeout=30)
        if seerfs("umount", str(mnt), timeout=120).returncode != 0:
            force_unmount(mnt)
    lat = [dt for t, dt in times if start <= t <= end]
    out: dict[str, Any] = {**_percentiles(lat), "seconds": end - start}
    if search:
        out["search"] = {k: disc.get(k) for k in ("state", "candidates_tried", "candidates_planned", "cpu_seconds")}
    return out


def open_latency(args: argparse.Namespace) -> int:
    load_start = os.getloadavg()[0]
    root, per_class = _tree(args)
    work = Path(tempfile.mkdtemp(prefix="seerfs-bench-seedsearch-"))
    try:
        during = latency_run(args, root, per_class, work, True, args.seconds)
        without = latency_run(args, root, per_class, work, False, max(1.0, during["seconds"]))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    load_end = os.getloadavg()[0]
    if args.json:
        json.dump({"without": without, "during": during, "load": {"start": load_start, "end": load_end}}, sys.stdout)
        print()
        return 0
    s = during["search"]
    print(
        f"bench_seedsearch --open-latency: {CLASSES * per_class:,} files, world {args.world}, "
        f"{args.ranks_per_node} ranks per node, range 0..{args.limit - 1}; one thread opens a random file "
        "every 2 ms through the mount"
    )
    print(f"{'':28} {'opens':>7} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'seconds':>8}")
    for name, r in (("without a search", without), ("during the search", during)):
        print(f"{name:28} {r['opens']:>7} {r['p50_ms']:8.2f} {r['p99_ms']:8.2f} {r['max_ms']:8.2f} {r['seconds']:8.1f}")
    print(
        f"(the search: {s['state']}, {s['candidates_tried'] or 0:,} of {s['candidates_planned'] or 0:,} candidates, "
        f"{s['cpu_seconds'] or 0:.1f} CPU s when timing stopped)"
    )
    ok = during["p99_ms"] < P99_TARGET_MS
    print(f"target: [{'ok' if ok else 'MISSED'}] open p99 during the search < {P99_TARGET_MS:g} ms")
    print(f"(1-minute load average {load_start:.2f} at the start, {load_end:.2f} at the end)")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="bench/seedsearch", description=__doc__)
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
    p.add_argument(
        "--open-latency",
        action="store_true",
        help="time opens through a mount while the daemon searches, and without a search (see above)",
    )
    p.add_argument(
        "--tree",
        help="--open-latency: where the tree of --files files is kept (default /var/tmp/seerfs-bench-tree-FILES)",
    )
    p.add_argument(
        "--seconds", type=float, default=120.0, help="--open-latency: longest time to time opens for (default 120)"
    )
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--plan", choices=PLANS, default="common", help=argparse.SUPPRESS)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.child:
        json.dump(child(args, json.load(sys.stdin)), sys.stdout)
        return 0
    if args.open_latency:
        return open_latency(args)
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
    checks = [
        (plan, target, [res[f"{job}/{plan}"]["wall"] for job in JOBS])
        for plan, target in (("common", LIKELY_TARGET_S), ("full", FULL_TARGET_S))
        if plan in plans
    ]
    if checks:
        sizing = ("files", "world", "ranks_per_node", "batch", "limit")
        defaults = build_parser().parse_args([])
        same = all(getattr(args, k) == getattr(defaults, k) for k in sizing)
        print("targets (set for the default sizes" + (")" if same else ", which this run does not use)"))
        for plan, target, walls in checks:
            ok = max(walls) < target
            print(
                f"  [{'ok' if ok else 'MISSED'}] {labels[plan]} searched in < {target:g} s wall: "
                + ", ".join(f"{w:.2f} s ({job})" for w, job in zip(walls, JOBS, strict=True))
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
