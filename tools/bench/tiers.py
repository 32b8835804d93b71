"""Tier throughput benchmark: w_j(p) and r_j(p) of seerfs's local tiers, measured through the tier API.

For every file size and thread count p, p trio tasks put N distinct files into a fresh tier with p
worker threads (write: hashing, write, write-back, page-cache drop and rename included), then get
them all back in shuffled order (read: cold from the disk, since the tier dropped its pages, and
verified against the digests).  The memory tier's get returns the stored object (no copy), so its
read column measures bookkeeping, not bandwidth.  The directory tier lives under --dir (default: a
temporary directory in the current directory's filesystem, which is where a local SSD tier
would be); pass the real tier path to measure it.

It also checks the memory tier's charge against reality: the process's RSS growth per file (the
slope between two fill counts, so one-off allocator slack cancels) beside the bytes charged.

Prints a table and the YAML for ``model.directory_read_mbps``/``directory_write_mbps`` (MB = 10^6
bytes, as in the config).  Numbers vary with the machine's load: rerun when ``uptime`` is high.
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import trio

from fusefs.config import parse_bytes
from fusefs.meta.identity import SourceId
from fusefs.tiers import Budget, DirectoryTier, MemoryTier

MB = 1e6


@dataclass(frozen=True)
class Point:
    kind: str
    size: int
    threads: int
    files: int
    write_s: float
    read_s: float

    @property
    def write_mbps(self) -> float:
        return self.files * self.size / MB / self.write_s

    @property
    def read_mbps(self) -> float:
        return self.files * self.size / MB / self.read_s


def make_files(n: int, size: int, seed: int) -> list[bytes]:
    """``n`` distinct buffers of ``size`` bytes (one random pool, a different window per file)."""
    rng = random.Random(seed)
    pool = rng.randbytes(size + 4096 * 64)
    return [pool[(i % 64) * 4096 : (i % 64) * 4096 + size - 8] + i.to_bytes(8, "little") for i in range(n)]


async def measure(tier: DirectoryTier | MemoryTier, files: list[bytes], threads: int) -> tuple[float, float]:
    order = list(range(len(files)))

    async def run_all(op: str) -> float:
        queue = iter(order)

        async def worker() -> None:
            for e in queue:
                if op == "put":
                    if not await tier.put(e, files[e], SourceId(len(files[e]), 0, 0, 0)):
                        raise SystemExit(f"bench_tiers: {tier.name} refused a put: budget too small")
                else:
                    got = await tier.get(e)
                    if got is None or len(got) != len(files[e]):
                        raise SystemExit(f"bench_tiers: {tier.name} lost entry {e}")

        t0 = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for _ in range(threads):
                nursery.start_soon(worker)
        return time.perf_counter() - t0

    write_s = await run_all("put")
    random.Random(threads).shuffle(order)
    read_s = await run_all("get")
    return write_s, read_s


def run_point(kind: str, size: int, threads: int, total: int, base_dir: Path, clean_cache: bool) -> Point:
    n = max(threads * 4, total // size)
    files = make_files(n, size, seed=size + threads)
    budget = n * (size + 8192) + (64 << 20)

    async def go() -> tuple[float, float]:
        if kind == "memory":
            return await measure(MemoryTier(0, Budget(budget, "memory"), threads), files, threads)
        path = Path(tempfile.mkdtemp(prefix="bench-tier-", dir=base_dir))
        try:
            tier = DirectoryTier(1, path, budget, threads, "bench", clean_cache=clean_cache)
            result = await measure(tier, files, threads)
            await tier.close()
            return result
        finally:
            shutil.rmtree(path, ignore_errors=True)

    write_s, read_s = trio.run(go)
    return Point(kind, size, threads, n, write_s, read_s)


def rss_bytes() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def memory_charge_check(n: int, size: int) -> tuple[int, int]:
    """(RSS growth, bytes charged) for ``n`` files of ``size`` bytes held by a memory tier."""
    gc.collect()
    before = rss_bytes()
    budget = Budget(1 << 40, "memory")
    tier = MemoryTier(0, budget, 1)

    async def fill() -> None:
        pool = os.urandom(size + 64)
        for e in range(n):
            await tier.put(e, pool[e % 64 : e % 64 + size], SourceId(size, 0, 0, 0))  # a new bytes object per file

    trio.run(fill)
    gc.collect()
    return rss_bytes() - before, budget.used


def fmt_size(n: int) -> str:
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale}{unit}"
    return f"{n}B"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="bench/tiers", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--dir", type=Path, default=Path.cwd(), help="where directory tiers go (default: .)")
    p.add_argument("--sizes", default="128KiB,4MiB", help="file sizes (default: %(default)s)")
    p.add_argument("--threads", default="1,2,4,8", help="thread counts p (default: 1,2,4,8)")
    p.add_argument("--total", default="256MiB", help="bytes written per point (default: 256MiB)")
    p.add_argument("--kinds", default="memory,directory", help="tiers to measure (default: %(default)s)")
    p.add_argument("--keep-cache", action="store_true", help="directory tier: leave pages cached")
    return p


def main(argv: list[str] | None = None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    try:
        sizes = [parse_bytes(s) for s in args.sizes.split(",")]
        threads = [int(t) for t in args.threads.split(",")]
        total = parse_bytes(args.total)
    except ValueError as exc:
        p.error(str(exc))
    kinds = args.kinds.split(",")
    if not set(kinds) <= {"memory", "directory"} or min(threads) < 1 or min(sizes) < 1:
        p.error("kinds are memory and directory; sizes and threads must be positive")
    if not args.dir.is_dir():
        p.error(f"--dir {args.dir}: not a directory")

    print(
        f"bench_tiers: {total / MB:.0f} MB per point, directory tiers under {args.dir.resolve()}"
        f"{' (page cache kept)' if args.keep_cache else ''}; load {os.getloadavg()[0]:.2f}"
    )
    print(
        f"{'tier':<10} {'size':>7} {'p':>3} {'files':>6} {'write MB/s':>11} {'w/w(1)':>7} "
        f"{'read MB/s':>10} {'r/r(1)':>7}"
    )
    points: list[Point] = []
    for kind in kinds:
        for size in sizes:
            first: Point | None = None
            for t in threads:
                pt = run_point(kind, size, t, total, args.dir, not args.keep_cache)
                first = first or pt
                points.append(pt)
                print(
                    f"{kind:<10} {fmt_size(size):>7} {t:>3} {pt.files:>6} {pt.write_mbps:>11.0f} "
                    f"{pt.write_mbps / first.write_mbps:>7.2f} {pt.read_mbps:>10.0f} "
                    f"{pt.read_mbps / first.read_mbps:>7.2f}",
                    flush=True,
                )
    if "directory" in kinds:
        print("\n# measured r_j(p), w_j(p) of the directory tier, for seerfs.yaml (per file size):")
        for size in sizes:
            pts = [pt for pt in points if pt.kind == "directory" and pt.size == size]
            reads = ", ".join(f"{pt.threads}: {pt.read_mbps:.0f}" for pt in pts)
            writes = ", ".join(f"{pt.threads}: {pt.write_mbps:.0f}" for pt in pts)
            print(f"# {fmt_size(size)} files\n  read_mbps: {{{reads}}}\n  write_mbps: {{{writes}}}")
    if "memory" in kinds:
        print("\nmemory tier: RAM per file (RSS slope between two fill counts) beside the budget charge")
        print(f"{'size':>9} {'RSS/file':>10} {'charge/file':>12} {'RSS/charge':>11}")
        for size, n1 in ((100, 40000), (8192, 20000), (128 << 10, 1500), (1 << 20, 300)):
            g1, c1 = memory_charge_check(n1, size)
            g2, c2 = memory_charge_check(3 * n1, size)
            rss, charge = (g2 - g1) / (2 * n1), (c2 - c1) / (2 * n1)
            print(f"{size:>9} {rss:>10.0f} {charge:>12.0f} {rss / charge:>11.3f}")
        print("(memory get returns the stored object: its read column is bookkeeping, not bandwidth)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
