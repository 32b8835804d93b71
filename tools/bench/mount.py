"""Mirror-mount benchmark: mount time, remount with a reused snapshot, walk+stat through the mount
versus directly, and snapshot memory per entry at ImageNet-22k scale.

Prints one table; every ratio is computed from numbers measured in the same run.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from fusefs.meta.snapshot import Snapshot
from fusefs.meta.walker import STAT_FIELDS, DirChunk
from fusefs.waiting import WaitTimeout, wait_until
from placement.tree import KIND_DIR, KIND_FILE

SEERFS = [sys.executable, "-m", "fusefs"]


def make_tree(root: Path, files: int, per_dir: int) -> None:
    """``files`` small files in directories of ``per_dir`` (an ImageNet-like two-level layout)."""
    root.mkdir(parents=True, exist_ok=True)
    for k in range(files):
        d = root / f"n{k // per_dir:08d}"
        if k % per_dir == 0:
            d.mkdir()
        with open(d / f"img_{k:08d}.JPEG", "wb") as fh:
            fh.write(b"x" * 16)


def walk_stat(root: Path) -> tuple[int, float]:
    t0 = time.monotonic()
    n = 0
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            os.lstat(os.path.join(dirpath, name))
            n += 1
    return n, time.monotonic() - t0


def seerfs(*args: str) -> float:
    t0 = time.monotonic()
    res = subprocess.run([*SEERFS, *args], capture_output=True, text=True)
    if res.returncode != 0:
        raise SystemExit(f"bench_mount: seerfs {' '.join(args)}: {res.stderr.strip()}")
    return time.monotonic() - t0


def snapshot_status(mnt: Path) -> dict[str, object]:
    doc = json.loads((mnt / ".control" / "status").read_bytes())
    snap: dict[str, object] = doc["snapshot"]
    return snap


@contextlib.contextmanager
def pfs_emulator(backing: Path, work: Path, meta_ms: float) -> Iterator[Path]:
    """Serve ``backing`` through the PFS emulator (tools/pfsemu) with metadata latency."""
    from tools import pfsemu  # noqa: F401  (fails clearly when the emulator is missing)

    mnt = work / "pfs"
    mnt.mkdir()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tools.pfsemu",
            "serve",
            str(backing),
            str(mnt),
            "--fg",
            "--meta-latency-ms",
            str(meta_ms),
            "--control",
            str(work / "pfs.sock"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        with contextlib.suppress(WaitTimeout):
            wait_until(lambda: os.path.ismount(mnt) or proc.poll() is not None, 30, "the PFS emulator's mount")
        if not os.path.ismount(mnt):
            raise SystemExit("bench_mount: PFS emulator did not start")
        yield mnt
    finally:
        subprocess.run(["fusermount3", "-u", "-z", str(mnt)], capture_output=True)
        proc.terminate()
        proc.wait(10)


def bench_mounts(source: Path, work: Path, label: str, rows: list[tuple[str, str, str]]) -> None:
    slug = "".join(c if c.isalnum() else "-" for c in label)  # labels are prose; paths get a slug
    mnt, cache = work / f"mnt-{slug}", work / f"cache-{slug}"
    mnt.mkdir()
    first = seerfs("mount", str(source), str(mnt), "-o", f"cache_dir={cache}")
    first_snap = snapshot_status(mnt)
    n_direct, t_direct = walk_stat(source)
    n_mnt1, t_mnt1 = walk_stat(mnt)
    n_mnt2, t_mnt2 = walk_stat(mnt)
    assert n_direct == n_mnt1 == n_mnt2, (n_direct, n_mnt1, n_mnt2)
    seerfs("umount", str(mnt))
    times = []
    for _ in range(3):
        times.append(seerfs("mount", str(source), str(mnt), "-o", f"cache_dir={cache}"))
        again = snapshot_status(mnt)
        seerfs("umount", str(mnt))
    remount = float(np.median(times))
    assert again["reused"], again
    walk_s, load_s = float(first_snap["build_seconds"]), float(again["build_seconds"])  # type: ignore[arg-type]
    rows += [
        (f"[{label}] entries walked", f"{n_direct}", ""),
        (f"[{label}] first mount (seerfs mount, wall)", f"{first:.3f} s", ""),
        (f"[{label}]   of which snapshot walk", f"{walk_s:.3f} s", ""),
        (
            f"[{label}] remount, reused snapshot (median of 3)",
            f"{remount:.3f} s",
            f"{first / remount:.1f}x faster",
        ),
        (
            f"[{label}]   of which snapshot load+verify",
            f"{load_s:.3f} s",
            f"{walk_s / max(load_s, 1e-9):.1f}x faster",
        ),
        (f"[{label}] walk+stat direct", f"{t_direct:.3f} s", "1.00x"),
        (f"[{label}] walk+stat via mount, 1st pass", f"{t_mnt1:.3f} s", f"{t_direct / t_mnt1:.2f}x direct"),
        (f"[{label}] walk+stat via mount, 2nd pass", f"{t_mnt2:.3f} s", f"{t_direct / t_mnt2:.2f}x direct"),
    ]


def synthetic_snapshot(entries: int, per_dir: int) -> tuple[float, float, int]:
    """Build an ``entries``-entry snapshot in memory through the real assembly code.

    Returns (bytes per entry excluding names, names bytes per entry, RSS growth in bytes).
    """
    gc.collect()
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    dirs = max(1, (entries - 1) // (per_dir + 1))
    files_total = entries - 1 - dirs
    chunks: list[DirChunk] = []
    # level 1: the class directories under the root
    dir_names = [f"n{d:08d}".encode() for d in range(dirs)]
    stats = np.zeros((dirs, len(STAT_FIELDS)), np.int64)
    stats[:, 0] = 0o40755
    chunks.append(
        DirChunk(b"".join(dir_names), np.full(dirs, 9, np.uint8), np.full(dirs, KIND_DIR, np.uint8), stats, {})
    )
    base_stats = np.zeros((per_dir + 1, len(STAT_FIELDS)), np.int64)
    base_stats[:, 0] = 0o100644
    base_stats[:, 4] = 110_000
    name_len = len(b"n00000000_00000000.JPEG")
    for d in range(dirs):
        k = min(per_dir + (d < files_total % dirs), files_total - d * per_dir) if d == dirs - 1 else per_dir
        k = max(0, min(k, per_dir + 1))
        blob = b"".join(b"n%08d_%08d.JPEG" % (d, f) for f in range(k))
        chunks.append(
            DirChunk(blob, np.full(k, name_len, np.uint8), np.full(k, KIND_FILE, np.uint8), base_stats[:k], {})
        )
    dir_indices = [0, *range(1, dirs + 1)]
    st = os.stat("/")
    snap = Snapshot._assemble(b"/synthetic", st, dir_indices, chunks)
    del chunks
    gc.collect()
    rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    names_per_entry = snap.tree.names.nbytes / len(snap)
    return snap.bytes_per_entry(), names_per_entry, rss1 - rss0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="bench/mount", description=__doc__)
    p.add_argument("--files", type=int, default=100_000, help="files in the walked tree (default 100000)")
    p.add_argument("--per-dir", type=int, default=100, help="files per directory (default 100)")
    p.add_argument("--pfs", action="store_true", help="also measure with the source behind the PFS emulator")
    p.add_argument(
        "--meta-latency-ms",
        type=float,
        default=0.2,
        help="emulated PFS metadata latency per request with --pfs (default 0.2 ms)",
    )
    p.add_argument(
        "--snapshot-entries",
        type=int,
        default=14_200_000,
        help="entries of the synthetic in-memory snapshot (default 14.2M, ImageNet-22k)",
    )
    p.add_argument("--workdir", help="scratch directory (default: a temp dir, removed)")
    return p


def main(argv: list[str] | None = None) -> int:
    p = build_parser()
    a = p.parse_args(argv)

    work = Path(a.workdir or tempfile.mkdtemp(prefix="seerfs-bench-mount-"))
    rows: list[tuple[str, str, str]] = []
    try:
        src = work / "src"
        t0 = time.monotonic()
        make_tree(src, a.files, a.per_dir)
        print(f"bench_mount: made {a.files} files in {time.monotonic() - t0:.1f}s", file=sys.stderr)
        bench_mounts(src, work, "local disk", rows)
        if a.pfs:
            with pfs_emulator(src, work, a.meta_latency_ms) as pfs:
                bench_mounts(pfs, work, f"PFS emulator, {a.meta_latency_ms:g} ms metadata", rows)
        if a.snapshot_entries:
            per_entry, names, rss = synthetic_snapshot(a.snapshot_entries, 650)
            rows += [
                (
                    f"snapshot of {a.snapshot_entries:,} entries: bytes/entry",
                    f"{per_entry:.1f} B",
                    f"budget 200 B: {'ok' if per_entry <= 200 else 'OVER'}",
                ),
                ("  + name bytes/entry", f"{names:.1f} B", ""),
                ("  peak RSS growth while building", f"{rss / 2**30:.2f} GiB", ""),
            ]
    finally:
        for mnt in work.glob("mnt-*"):
            subprocess.run(["fusermount3", "-u", "-z", str(mnt)], capture_output=True)
        if not a.workdir:
            shutil.rmtree(work, ignore_errors=True)
    width = max(len(r[0]) for r in rows)
    print(f"\n{'measure':<{width}}  {'value':>12}  ratio")
    for name, value, ratio in rows:
        print(f"{name:<{width}}  {value:>12}  {ratio}")
    print(
        f"\nparameters: files={a.files} per_dir={a.per_dir} pfs={a.pfs} meta_latency_ms={a.meta_latency_ms} "
        f"cpus={os.cpu_count()}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
