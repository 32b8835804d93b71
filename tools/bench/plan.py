"""Benchmark: full placement plan at ImageNet-1k scale, with torch and with numpy only.

The dataset is built directly as :class:`placement.tree.TreeArrays` in memory (no filesystem):
1000 class directories, 1,281,167 files of lognormal sizes (mean 110 kB), optionally a 50,000-file
validation set read after every epoch.  Each configuration runs in a fresh subprocess so its
peak RSS is its own; "numpy" hides torch from that process (``sys.modules['torch'] = None``),
which is how a node without torch plans.  Prints one row per backend: catalog, access pass,
assignment and summary seconds, total, peak RSS, and the ratio to the targets (15 s, 1.5 GB).

    tools/bench/plan                    # both backends, default ImageNet job
    tools/bench/plan --modes numpy --epochs 10
    tools/bench/plan --modes numpy --nodes 1024 --ranks-per-node 8 --files 14000000 --val-files 0
    tools/bench/plan --modes numpy --per-node off,on   # today's dense plan next to the per-node one

``--per-node``: auto (the planner's choice: per node above ``placement.plan.DENSE_CELLS``), on, off,
or a comma list of them, one row each.  A per-node plan is built for ``--node``; its saved size is
that node's share, and "load" maps it and reads that node's fill order.
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

import numpy as np
import numpy.typing as npt

TARGET_SECONDS = 15.0
TARGET_RSS_MB = 1500.0


def synthetic_tree(classes: int, files: int, val_files: int, mean_size: int, sigma: float, seed: int) -> Any:
    """TreeArrays of ``train/<class>/<file>.JPEG`` (and ``val/...``), names sorted as the snapshot keeps them."""
    from placement.tree import KIND_DIR, KIND_FILE, LINK_NONE, TreeArrays

    rng = np.random.default_rng(seed)
    splits = [("train", files)] + ([("val", val_files)] if val_files else [])
    names: list[bytes] = [b""]
    kind = [KIND_DIR]
    parent = [0]
    sizes = [0]
    child_start = [0]
    child_count = [0]
    # level 1: split dirs; level 2: class dirs; level 3: files (breadth-first, children contiguous)
    split_ids = []
    child_start[0], child_count[0] = 1, len(splits)
    for name, _ in splits:
        split_ids.append(len(names))
        names.append(name.encode())
        kind.append(KIND_DIR)
        parent.append(0)
        sizes.append(0)
        child_start.append(0)
        child_count.append(0)
    class_ids: list[list[int]] = []
    for s, (_, _) in zip(split_ids, splits, strict=True):
        child_start[s], child_count[s] = len(names), classes
        ids = []
        for c in range(classes):
            ids.append(len(names))
            names.append(f"n{c:08d}".encode())
            kind.append(KIND_DIR)
            parent.append(s)
            sizes.append(0)
            child_start.append(0)
            child_count.append(0)
        class_ids.append(ids)
    mu = np.log(mean_size) - sigma**2 / 2
    # level 3, built as arrays (14 million files as Python objects would take gigabytes)
    file_names: list[npt.NDArray[np.uint8]] = []
    file_parent: list[npt.NDArray[np.int64]] = []
    file_sizes: list[npt.NDArray[np.int64]] = []
    next_file = len(names)
    for ids, (_, total) in zip(class_ids, splits, strict=True):
        per_class = np.full(classes, total // classes)
        per_class[: total % classes] += 1
        for c, d in enumerate(ids):
            k = int(per_class[c])
            child_start[d], child_count[d] = next_file, k
            next_file += k
            file_parent.append(np.full(k, d, np.int64))
            file_sizes.append(np.maximum(1, rng.lognormal(mu, sigma, k)).astype(np.int64))
            file_names.append(_file_names(c, k))
    n_files = sum(a.shape[0] for a in file_parent)
    lens = np.concatenate([np.array([len(x) for x in names], np.uint8), np.full(n_files, _NAME_LEN, np.uint8)])
    off = np.zeros(lens.shape[0], np.uint64)
    np.cumsum(lens[:-1], out=off[1:])
    n = lens.shape[0]
    blob = np.concatenate([np.frombuffer(b"".join(names), np.uint8), *(a.reshape(-1) for a in file_names)])
    kinds = np.concatenate([np.array(kind, np.uint8), np.full(n_files, KIND_FILE, np.uint8)])
    zeros = np.zeros(n_files, np.uint32)
    return TreeArrays(
        names=blob,
        name_off=off,
        name_len=lens,
        parent=np.concatenate([np.array(parent, np.uint32), *(a.astype(np.uint32) for a in file_parent)]),
        kind=kinds,
        size=np.concatenate([np.array(sizes, np.int64), *file_sizes]),
        mtime_ns=np.zeros(n, np.int64),
        child_start=np.concatenate([np.array(child_start, np.uint32), zeros]),
        child_count=np.concatenate([np.array(child_count, np.uint32), zeros]),
        link_target=np.full(n, LINK_NONE, np.int32),
    )


_NAME_LEN = len("n00000000_000000.JPEG")


def _file_names(c: int, k: int) -> npt.NDArray[np.uint8]:
    """``n{c:08d}_{i:06d}.JPEG`` for i < k, as a (k, 21) byte array."""
    out = np.empty((k, _NAME_LEN), np.uint8)
    out[:, :10] = np.frombuffer(f"n{c:08d}_".encode(), np.uint8)
    i = np.arange(k, dtype=np.int64)
    for d in range(6):
        out[:, 10 + d] = 48 + (i // 10 ** (5 - d)) % 10
    out[:, 16:] = np.frombuffer(b".JPEG", np.uint8)
    return out


def job_config(args: argparse.Namespace) -> dict[str, Any]:
    from fusefs.config import load

    datasets = "[{root: train}" + (", {root: val, follows: train, sampler: {shuffle: false}}" if args.val_files else "")
    overrides = {
        "datasets": datasets + "]",
        "job.world_size": str(args.nodes * args.ranks_per_node),
        "job.ranks_per_node": str(args.ranks_per_node),
        "job.epochs": str(args.epochs),
        "job.batch_size": str(args.batch_size),
        "tiers": f"[{{kind: memory, bytes: {args.ram}}}, {{kind: directory, path: /ssd, bytes: {args.ssd}}}]",
        "peers.spread": "false" if args.no_spread else "true",
    }
    cfg: dict[str, Any] = load(None, overrides).to_dict()
    return cfg


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def child(args: argparse.Namespace) -> dict[str, Any]:
    if args.child == "numpy":
        sys.modules["torch"] = None  # type: ignore[assignment]  # import torch now raises ImportError
    from fusefs.planning.inputs import PlanTimer, plan_pool
    from placement.catalog import build_catalogs
    from placement.plan import Plan
    from placement.randperm import torch_available

    tree = synthetic_tree(1000, args.files, args.val_files, args.mean_size, args.sigma, args.seed)
    cfg = job_config(args)
    load0 = os.getloadavg()[0]
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    cpu0 = _cpu()
    t0 = time.perf_counter()
    catalogs = build_catalogs(tree, cfg)
    t1 = time.perf_counter()
    timer = PlanTimer()
    per_node = {"auto": None, "on": True, "off": False}[args.per_node]
    with plan_pool(args.workers) as (pool, width):
        plan = Plan.from_catalogs(
            catalogs,
            cfg,
            args.seed,
            entries=len(tree),
            pool=pool,
            width=width,
            phases=timer,
            node=args.node,
            per_node=per_node,
        )
    t2 = time.perf_counter()
    s = timer.stamp(plan).summary()
    import tempfile

    from fusefs.planning.store import load_plan, save_plan

    with tempfile.TemporaryDirectory() as tmp:
        t3 = time.perf_counter()
        save_plan(plan, tmp)
        t4 = time.perf_counter()
        loaded = load_plan(tmp)
        loaded.fill_order(args.node)
        t5 = time.perf_counter()
        disk = sum(os.path.getsize(os.path.join(tmp, f)) for f in os.listdir(tmp))
    return {
        "mode": args.child,
        "per_node": plan.per_node,
        "torch": torch_available(),
        "catalog_s": t1 - t0,
        "timings": s["timings"],
        "total_s": t2 - t0,
        "cpu_s": _cpu() - cpu0,
        "save_s": t4 - t3,
        "load_s": t5 - t4,
        "plan_mb": disk / 1e6,
        "rss_before_mb": rss0,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "coverage": s["coverage"],
        "pfs_bytes_job": s["pfs_bytes_job"],
        "pfs_bytes_without_cache": s["pfs_bytes_without_cache"],
        "frequency": s["frequency"],
        "load_start": load0,
        "load": os.getloadavg()[0],
    }


def _forwarded(args: argparse.Namespace) -> list[str]:
    """The job options again, for a child process."""
    out = []
    for key in ("files", "val_files", "epochs", "nodes", "ranks_per_node", "batch_size", "ram", "ssd"):
        out += [f"--{key.replace('_', '-')}", str(getattr(args, key))]
    out += ["--mean-size", str(args.mean_size), "--sigma", str(args.sigma), "--seed", str(args.seed)]
    if args.workers is not None:
        out += ["--workers", str(args.workers)]
    out += ["--node", str(args.node)]
    return out + (["--no-spread"] if args.no_spread else [])


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="bench/plan", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--modes", default="torch,numpy", help="comma list of torch, numpy (default both)")
    p.add_argument("--files", type=int, default=1_281_167)
    p.add_argument("--val-files", type=int, default=50_000, help="validation files read after each epoch (0: none)")
    p.add_argument("--epochs", type=int, default=90)
    p.add_argument("--nodes", type=int, default=16)
    p.add_argument("--ranks-per-node", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--ram", default="8GiB", help="memory tier bytes per node")
    p.add_argument("--ssd", default="32GiB", help="directory tier bytes per node")
    p.add_argument("--mean-size", type=int, default=110_000)
    p.add_argument("--sigma", type=float, default=0.5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workers", type=int, default=None, help="planning threads (default: planner's; 1: none)")
    p.add_argument("--no-spread", action="store_true")
    p.add_argument("--per-node", default="auto", help="auto, on, off, or a comma list (a row each; see above)")
    p.add_argument("--node", type=int, default=0, help="the node a per-node plan is built for (default 0)")
    p.add_argument("--json", action="store_true", help="print the raw results")
    p.add_argument("--child", choices=["torch", "numpy"], help=argparse.SUPPRESS)
    return p


def main(argv: list[str] | None = None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(child(args)))
        return 0
    rows = []
    kinds = [k.strip() for k in args.per_node.split(",") if k.strip()]
    if any(k not in ("auto", "on", "off") for k in kinds):
        p.error(f"--per-node: expected auto, on or off, got {args.per_node!r}")
    for mode, kind in [(m.strip(), k) for m in args.modes.split(",") if m.strip() for k in kinds]:
        cmd = [sys.executable, "-m", "tools.bench.plan", "--child", mode, "--per-node", kind, *_forwarded(args)]
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        out = subprocess.run(cmd, capture_output=True, text=True, cwd=root, check=False)
        if out.returncode:
            print(out.stderr, file=sys.stderr)
            return 1
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(
        f"plan of {args.files:,} files (+{args.val_files:,} val), {args.epochs} epochs, "
        f"{args.nodes} nodes x {args.ranks_per_node} ranks, tiers {args.ram} RAM + {args.ssd} SSD, "
        f"spread={'off' if args.no_spread else 'on'}"
    )
    head = (
        f"{'backend':<8}{'plan':>9}{'catalog':>9}{'pass':>8}{'assign':>8}{'summary':>9}{'total s':>9}{'/15s':>7}"
        f"{'cpu s':>8}{'peak MB':>9}{'/1.5GB':>8}{'load':>11}"
    )
    print(head)
    print("(seconds are wall time; cpu s sums all threads; load: 1-minute load average at the start/end")
    print(" of the plan: other work on the machine stretches wall time, compare cpu s and rerun when high)")
    print("-" * len(head))
    for r in rows:
        t = r["timings"]
        print(
            f"{r['mode']:<8}{'per node' if r['per_node'] else 'dense':>9}{r['catalog_s']:>9.2f}"
            f"{t['access_s']:>8.2f}{t['assign_s']:>8.2f}{t['summary_s']:>9.2f}"
            f"{r['total_s']:>9.2f}{r['total_s'] / TARGET_SECONDS:>7.2f}{r['cpu_s']:>8.2f}{r['peak_rss_mb']:>9.0f}"
            f"{r['peak_rss_mb'] / TARGET_RSS_MB:>8.2f}{r['load_start']:>6.1f}/{r['load']:<4.1f}"
        )
    for r in rows:
        kind = "per node" if r["per_node"] else "dense"
        print(f"{kind} plan: {r['plan_mb']:.0f} MB on disk, save {r['save_s']:.2f} s, load {r['load_s'] * 1000:.0f} ms")
        cov = r["coverage"]
        print(
            f"  coverage: {cov['held_objects']:,}/{cov['read_objects']:,} files held; PFS bytes over the job "
            f"{r['pfs_bytes_job']:,} B ({r['pfs_bytes_job'] / 1e9:,.1f} GB) vs "
            f"{r['pfs_bytes_without_cache'] / 1e9:,.1f} GB uncached"
        )
    r = rows[-1]
    f = r["frequency"]
    if f:
        print(
            f"files read >= {f['threshold']} times by a node: expected {f['expected_heavy_per_node']:,.0f} "
            f"(NoPFS 3.1), observed mean {np.mean(f['observed_heavy_per_node']):,.0f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
