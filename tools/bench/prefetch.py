"""Prefetch benchmark: per-epoch read time with the seed versus directly from the emulated PFS,
page-cache pushes versus in-memory serving, and open latency while a 1.28M-file plan is computed.

Part 1 runs the same reading job (real ImageFolder + DataLoader workers + DistributedSampler, no
compute: pure read time) directly on the PFS emulator and through seerfs with the seed, once with
``prefetch.staging: page_cache`` and once with ``memory``, and prints per-epoch times side by side
with their ratio to direct reading, and PFS bytes from the emulator's counters.

Part 2 (``--planning-latency``) mounts a tree of 1,281,167 files (hard links, so it is quick to
make), writes a seed so the daemon plans ImageNet-scale (16 nodes x 4 ranks, 90 epochs) in its
planning subprocess, and meanwhile opens random files through the mount, recording each open's
latency: the FUSE loop must stay responsive while planning runs.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from tools.harness.jobs import Job, make_source, run_readers, seerfs_config, wait_plan, write_seed
from tools.harness.mounts import seerfs as run_seerfs
from tools.harness.mounts import status
from tools.harness.quantiles import quantile
from tools.pfsemu import running as running_pfsemu


def seerfs(*args: str) -> None:
    run_seerfs(*args, check=True, timeout=900)


def epoch_times(results: list[dict[str, Any]]) -> list[float]:
    """Per epoch, the slowest rank's time (ranks run in step)."""
    return [max(r["epochs"][e]["seconds"] for r in results) for e in range(len(results[0]["epochs"]))]


def part1(a: argparse.Namespace, work: Path) -> list[tuple[str, list[float], int]]:
    src = work / "data"
    _digests, total = make_source(src, a.files, a.val_files, mean_size=a.mean_size)
    job = Job(
        world_size=2, epochs=a.epochs, batch_size=a.batch, num_workers=a.workers, seed=a.seed, val=a.val_files > 0
    )
    rows: list[tuple[str, list[float], int]] = []
    with running_pfsemu(src) as emu:
        emu.reset()
        res = run_readers(emu.mountpoint, job, None, work / "direct")
        rows.append(("direct from the emulated PFS", epoch_times(res), emu.counters().bytes))
        for staging in ("page_cache", "memory"):
            run = work / staging
            run.mkdir()
            cfg = seerfs_config(
                run / "seerfs.yaml",
                job,
                cache_dir=run / "cache",
                tiers=[{"kind": "memory", "bytes": f"{int(total * 1.2) + (64 << 20)}", "threads": 8}],
                lookahead="64MiB",
            )
            text = cfg.read_text().replace("prefetch:\n", f"prefetch:\n  staging: {staging}\n")
            cfg.write_text(text)
            mnt = run / "mnt"
            mnt.mkdir()
            emu.reset()  # counted from before the mount: everything seerfs reads for the job
            seerfs("mount", str(emu.mountpoint), str(mnt), "-c", str(cfg))
            try:
                write_seed(mnt, a.seed)
                wait_plan(mnt, a.seed)
                res = run_readers(mnt, job, None, run / "run")
                doc = status(mnt)
                hit = doc["cursor"]["hit_rate"] if doc.get("cursor") else 0.0
                rows.append(
                    (
                        f"seerfs with the seed, staging={staging} (hit rate {hit:.2%})",
                        epoch_times(res),
                        emu.counters().bytes,
                    )
                )
            finally:
                seerfs("umount", str(mnt))
    return rows


def make_big_tree(root: Path, classes: int, per_class: int) -> None:
    """``classes * per_class`` files as hard links (ext4 allows 65000 links per inode: one per class)."""
    marker = root / f".complete-{classes}x{per_class}"
    if marker.exists():
        return
    shutil.rmtree(root, ignore_errors=True)
    for c in range(classes):
        d = root / "train" / f"n{c:08d}"
        d.mkdir(parents=True)
        proto = d / "i0000000.JPEG"
        proto.write_bytes(os.urandom(2000))
        for f in range(1, per_class):
            os.link(proto, d / f"i{f:07d}.JPEG")
    marker.write_text("")


def planning_latency(root: Path, cache: Path, work: Path) -> dict[str, Any]:
    """Open latency through the mount while the daemon plans ImageNet-1k scale (the tree at ``root``)."""
    t0 = time.monotonic()
    make_big_tree(root, 1000, 1281)
    print(f"bench_prefetch: 1,281,000-file tree ready in {time.monotonic() - t0:.1f}s", file=sys.stderr)
    files = sorted(str(p.relative_to(root)) for p in (root / "train").glob("n0000000*/i000000*.JPEG"))
    job = Job(world_size=64, epochs=90, batch_size=256, num_workers=8, seed=1, val=False)
    cfg = seerfs_config(
        work / "big.yaml",
        job,
        cache_dir=cache,
        ranks_per_node=4,
        tiers=[{"kind": "memory", "bytes": "256MiB", "threads": 4}],
        lookahead="64MiB",
    )
    mnt = work / "bigmnt"
    mnt.mkdir()
    t0 = time.monotonic()
    seerfs("mount", str(root), str(mnt), "-c", str(cfg), "--timeout", "900")
    mount_s = time.monotonic() - t0
    try:
        wait_plan(mnt, 0, timeout=600)  # the assumed seed's plan first
        latencies: list[float] = []
        stop = threading.Event()

        def opener() -> None:
            rng = random.Random(0)
            while not stop.is_set():
                rel = rng.choice(files)
                t = time.monotonic()
                with open(mnt / rel, "rb") as fh:
                    latencies.append(time.monotonic() - t)
                    fh.read()
                time.sleep(0.002)

        thread = threading.Thread(target=opener, daemon=True)
        t0 = time.monotonic()
        write_seed(mnt, 1)
        thread.start()
        doc = wait_plan(mnt, 1, timeout=600)
        plan_s = time.monotonic() - t0
        stop.set()
        thread.join()
    finally:
        seerfs("umount", str(mnt))
    lat = sorted(latencies)
    return {
        "mount_s": mount_s,
        "plan_s": plan_s,
        "plan_digest": doc["plan"]["digest"],
        "opens": len(lat),
        "p50_ms": 1000 * statistics.median(lat),
        "p99_ms": 1000 * quantile(lat, 0.99),
        "max_ms": 1000 * lat[-1],
    }


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="bench/prefetch", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--files", type=int, default=2000, help="training files (default 2000)")
    p.add_argument("--val-files", type=int, default=200, help="validation files (default 200)")
    p.add_argument("--mean-size", type=int, default=110_000, help="mean file size in bytes (default 110000)")
    p.add_argument("--epochs", type=int, default=3, help="epochs (default 3)")
    p.add_argument("--batch", type=int, default=32, help="per-rank batch size (default 32)")
    p.add_argument("--workers", type=int, default=2, help="DataLoader workers per rank (default 2)")
    p.add_argument("--seed", type=int, default=7, help="sampler seed (default 7)")
    p.add_argument("--skip-epochs", action="store_true", help="skip part 1 (per-epoch read times)")
    p.add_argument("--planning-latency", action="store_true", help="run part 2 (1.28M-file planning latency)")
    p.add_argument("--big-tree", help="where the 1.28M-file tree is kept (default /var/tmp/seerfs-bench-1281167)")
    p.add_argument("--big-cache", default="/var/tmp/seerfs-bench-cache", help="cache dir for part 2 (snapshot reuse)")
    p.add_argument("--json", action="store_true", help="print results as JSON")
    return p


def main(argv: list[str] | None = None) -> int:
    p = build_parser()
    a = p.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="seerfs-bench-prefetch-"))
    out: dict[str, Any] = {"parameters": {k: v for k, v in vars(a).items() if k != "json"}}
    try:
        if not a.skip_epochs:
            out["epochs"] = [{"config": c, "epoch_s": t, "pfs_bytes": b} for c, t, b in part1(a, work)]
        if a.planning_latency:
            tree = Path(a.big_tree or "/var/tmp/seerfs-bench-1281167")
            out["planning_latency"] = planning_latency(tree, Path(a.big_cache), work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if a.json:
        print(json.dumps(out, indent=1))
        return 0
    print(f"parameters: {json.dumps(out['parameters'])}")
    if "epochs" in out:
        rows = out["epochs"]
        direct = rows[0]["epoch_s"]
        width = max(len(r["config"]) for r in rows)
        head = "  ".join(f"epoch {e:>2} (ratio)" for e in range(len(direct)))
        print(f"\n{'configuration':<{width}}  {head}  PFS bytes")
        for r in rows:
            cells = "  ".join(f"{t:6.2f}s ({t / d:4.2f}x)" for t, d in zip(r["epoch_s"], direct, strict=True))
            print(f"{r['config']:<{width}}  {cells}  {r['pfs_bytes'] / 1e6:8.1f} MB")
        later = [sum(r["epoch_s"][1:]) for r in rows[1:]]
        if len(later) == 2 and later[1] > 0:
            print(f"\nlater epochs, page-cache push / in-memory serving: {later[0] / later[1]:.2f}x the time")
    if "planning_latency" in out:
        pl = out["planning_latency"]
        print(
            f"\nplanning 1,281,000 files (16 nodes x 4 ranks, 90 epochs) took {pl['plan_s']:.1f}s; "
            f"{pl['opens']} opens meanwhile: p50 {pl['p50_ms']:.2f} ms, p99 {pl['p99_ms']:.2f} ms, "
            f"max {pl['max_ms']:.2f} ms (target p99 < 20 ms); mount took {pl['mount_s']:.1f}s"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
