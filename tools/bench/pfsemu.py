"""Calibration benchmark of the emulated PFS (tools/pfsemu): does it deliver the curve it claims?

For gamma = 1, 2, 4, 8 concurrent reader *processes*, each reading its own file through the mount
with back-to-back ``pread`` calls, it measures the aggregate throughput and sets it beside the
configured t(gamma); then it measures the latency of ``open()`` alone and with several concurrent
openers beside the configured open latency.  For each point it also reports the emulator's CPU use
(from its own counters) and how late its event loop woke, because the emulator must not become the
bottleneck it emulates.  The acceptance criterion of the emulator is a ratio within 0.85-1.15 on
every row; the benchmark prints whether each row meets it.

Throughput estimator: each reader timestamps every completed read.  Its rate is the bytes of the
reads completed strictly after its first completion in the measurement window, divided by the time
from that completion to its last one in the window (no quantisation error from reads cut by the
window edges); the aggregate is the sum over readers.  The first ``--warmup`` seconds are skipped.

Library use (tests): :func:`make_backing`, :func:`measure_throughput`, :func:`measure_open_latency`.
"""

from __future__ import annotations

import argparse
import math
import multiprocessing
import multiprocessing.connection
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tools import pfsemu
from tools.harness.quantiles import quantile

TOLERANCE = 0.15


def make_backing(directory: Path, sizes: dict[str, int]) -> None:
    """Write files of the given sizes (pseudo-random bytes, distinct per file) under ``directory``."""
    for rel, size in sizes.items():
        path = directory / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        block = os.urandom(min(size, 1 << 20)) if size else b""
        with open(path, "wb") as f:
            left = size
            while left > 0:
                f.write(block[:left])
                left -= len(block)
            f.flush()
            os.fsync(f.fileno())  # written back now, not while the emulator is being measured


@dataclass(frozen=True)
class ThroughputPoint:
    gamma: int
    configured_mbps: float
    measured_mbps: float
    per_reader_mbps: tuple[float, ...]
    reader_bytes: tuple[int, ...]  # everything each reader read, window or not
    reader_pids: tuple[int, ...]
    wall_s: float
    emulator_cpu_pct: float
    loop_lag_max_ms: float
    reads_by_gamma: dict[int, int]

    @property
    def ratio(self) -> float:
        return self.measured_mbps / self.configured_mbps


@dataclass(frozen=True)
class OpenLatency:
    concurrency: int
    configured_ms: float
    median_ms: float
    mean_ms: float
    p90_ms: float
    samples: int

    @property
    def ratio(self) -> float:
        return self.median_ms / self.configured_ms if self.configured_ms > 0 else math.nan


def _reader(
    path: str, read_size: int, start_at: float, stop_at: float, conn: multiprocessing.connection.Connection
) -> None:
    """One reader process: pread back to back from start_at until the first read ending after stop_at."""
    fd = os.open(path, os.O_RDONLY)
    size = os.fstat(fd).st_size
    marks: list[tuple[float, int]] = []
    time.sleep(max(0.0, start_at - time.monotonic()))
    off = 0
    while True:
        n = len(os.pread(fd, read_size, off))
        now = time.monotonic()
        marks.append((now, n))
        off = 0 if n == 0 or off + n >= size else off + n
        if now >= stop_at:
            break
    os.close(fd)
    conn.send((os.getpid(), marks))
    conn.close()


def _window_rate(marks: Sequence[tuple[float, int]], t0: float, t1: float) -> float:
    inside = [(t, n) for t, n in marks if t0 <= t <= t1]
    if len(inside) < 2:
        return 0.0
    moved = sum(n for _, n in inside[1:])
    return moved / (inside[-1][0] - inside[0][0])


def measure_throughput(
    emu: pfsemu.RunningEmulator,
    files: Sequence[str],
    duration_s: float = 3.0,
    read_size: int = 1 << 20,
    warmup_s: float = 0.3,
) -> ThroughputPoint:
    """Aggregate MB/s of ``len(files)`` reader processes, one per file (paths relative to the mount)."""
    gamma = len(files)
    ctx = multiprocessing.get_context("fork")
    before = emu.reset()
    del before
    stats0 = emu.counters(files=False)
    start_at = time.monotonic() + 0.3 + 0.05 * gamma  # time for every process to fork and open
    stop_at = start_at + warmup_s + duration_s
    procs, conns = [], []
    for rel in files:
        parent, child = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=_reader, args=(str(emu.mountpoint / rel), read_size, start_at, stop_at, child))
        proc.start()
        child.close()
        procs.append(proc)
        conns.append(parent)
    results = [conn.recv() for conn in conns]
    for proc in procs:
        proc.join()
    stats1 = emu.counters(files=False)
    wall = stats1.since_reset_s - stats0.since_reset_s
    rates = tuple(_window_rate(marks, start_at + warmup_s, stop_at) / pfsemu.MB for _, marks in results)
    return ThroughputPoint(
        gamma=gamma,
        configured_mbps=pfsemu.Curve(tuple((g, r) for g, r in stats1.config["curve"])).mbps(gamma),
        measured_mbps=sum(rates),
        per_reader_mbps=rates,
        reader_bytes=tuple(sum(n for _, n in marks) for _, marks in results),
        reader_pids=tuple(pid for pid, _ in results),
        wall_s=wall,
        emulator_cpu_pct=100.0 * (stats1.cpu_s - stats0.cpu_s) / wall,
        loop_lag_max_ms=float(stats1.raw["loop_lag_ms"]["max"]),
        reads_by_gamma=stats1.reads_by_gamma,
    )


def _opener(path: str, count: int, start_at: float, conn: multiprocessing.connection.Connection) -> None:
    time.sleep(max(0.0, start_at - time.monotonic()))
    times = []
    for _ in range(count):
        t = time.perf_counter()
        fd = os.open(path, os.O_RDONLY)
        times.append(time.perf_counter() - t)
        os.close(fd)
    conn.send(times)
    conn.close()


def measure_open_latency(
    emu: pfsemu.RunningEmulator, rel: str, samples: int = 200, concurrency: int = 1
) -> OpenLatency:
    """Latency of ``os.open`` of one file through the mount, by ``concurrency`` processes at once.

    Processes, not threads: with threads the GIL, not the emulator, decides when a finished open is
    timed once other work shares the two cores.
    """
    path = str(emu.mountpoint / rel)
    os.close(os.open(path, os.O_RDONLY))  # the kernel now knows the name: no lookup in the timing
    ctx = multiprocessing.get_context("fork")
    start_at = time.monotonic() + 0.1 + 0.02 * concurrency
    procs, conns = [], []
    for _ in range(concurrency):
        parent, child = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=_opener, args=(path, samples // concurrency, start_at, child))
        proc.start()
        child.close()
        procs.append(proc)
        conns.append(parent)
    times = sorted(t for conn in conns for t in conn.recv())
    for proc in procs:
        proc.join()
    configured = float(emu.counters(files=False).config["open_latency_ms"])
    return OpenLatency(
        concurrency=concurrency,
        configured_ms=configured,
        median_ms=statistics.median(times) * 1e3,
        mean_ms=statistics.fmean(times) * 1e3,
        p90_ms=quantile(times, 0.9) * 1e3,
        samples=len(times),
    )


def _verdict(ratio: float) -> str:
    if math.isnan(ratio):
        return "n/a"
    return "ok" if abs(ratio - 1.0) <= TOLERANCE else "OUT"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="bench/pfsemu",
        description="Calibrate tools/pfsemu: configured vs measured aggregate throughput for several "
        "concurrent readers, open latency, and the emulator's own CPU use.",
    )
    parser.add_argument("--gammas", default="1,2,4,8", help="reader counts (default 1,2,4,8)")
    parser.add_argument("--duration", type=float, default=3.0, help="seconds measured per point (default 3)")
    parser.add_argument("--warmup", type=float, default=0.3, help="seconds skipped per point (default 0.3)")
    parser.add_argument("--read-size", type=int, default=1 << 20, help="bytes per pread (default 1 MiB)")
    parser.add_argument("--file-mb", type=int, default=64, help="size of each reader's file (default 64)")
    parser.add_argument("--opens", type=int, default=300, help="opens timed per latency row (default 300)")
    parser.add_argument("--curve", help=f"t(gamma) for the emulator (default {pfsemu.DEFAULT_CURVE})")
    parser.add_argument("--open-latency-ms", type=float, help="emulator open latency (default 3)")
    parser.add_argument("--read-latency-ms", type=float, help="emulator read latency (default 0.5)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        gammas = [int(g) for g in args.gammas.split(",")]
        if any(g < 1 for g in gammas):
            raise ValueError
    except ValueError:
        print(f"bench_pfsemu: --gammas wants positive integers, not {args.gammas!r}", file=sys.stderr)
        return 2
    if pfsemu.fuse_unavailable_reason() is not None:
        print(f"bench_pfsemu: {pfsemu.fuse_unavailable_reason()}", file=sys.stderr)
        return 1

    with tempfile.TemporaryDirectory(prefix="bench-pfsemu-") as tmp:
        backing = Path(tmp) / "pfs"
        names = [f"r{i}.bin" for i in range(max(gammas))]
        make_backing(backing, {name: args.file_mb * pfsemu.MB for name in names} | {"small": 4096})
        load0 = os.getloadavg()[0]
        verdicts: list[str] = []
        with pfsemu.running(
            backing,
            curve=args.curve,
            open_latency_ms=args.open_latency_ms,
            read_latency_ms=args.read_latency_ms,
        ) as emu:
            print(emu.counters(files=False).describe_config())
            print(
                f"{os.cpu_count()} CPUs, load average {load0:.2f}; {args.duration:g} s per point after "
                f"{args.warmup:g} s warm-up; reader processes, one {args.file_mb} MB file each, "
                f"pread of {args.read_size} B"
            )
            print()
            print(
                f"{'readers':>7} {'t(gamma) MB/s':>13} {'measured MB/s':>13} {'ratio':>6} "
                f"{'per reader MB/s':>17} {'emu CPU %':>9} {'loop lag ms':>11}  verdict"
            )
            for gamma in gammas:
                p = measure_throughput(emu, names[:gamma], args.duration, args.read_size, args.warmup)
                verdicts.append(_verdict(p.ratio))
                spread = f"{min(p.per_reader_mbps):.2f}-{max(p.per_reader_mbps):.2f}"
                print(
                    f"{gamma:>7} {p.configured_mbps:>13.2f} {p.measured_mbps:>13.2f} {p.ratio:>6.3f} "
                    f"{spread:>17} {p.emulator_cpu_pct:>9.1f} {p.loop_lag_max_ms:>11.2f}  {_verdict(p.ratio)}",
                    flush=True,
                )
            print()
            print(
                f"{'openers':>7} {'configured ms':>13} {'median ms':>13} {'ratio':>6} {'mean ms':>9} "
                f"{'p90 ms':>8}  verdict"
            )
            for concurrency in (1, 4):
                emu.reset()
                cpu0 = emu.counters(files=False)
                o = measure_open_latency(emu, "small", args.opens, concurrency)
                verdicts.append(_verdict(o.ratio))
                cpu1 = emu.counters(files=False)
                cpu = 100.0 * (cpu1.cpu_s - cpu0.cpu_s) / (cpu1.since_reset_s - cpu0.since_reset_s)
                print(
                    f"{concurrency:>7} {o.configured_ms:>13.2f} {o.median_ms:>13.3f} {o.ratio:>6.3f} "
                    f"{o.mean_ms:>9.3f} {o.p90_ms:>8.3f}  {_verdict(o.ratio)}   (emu CPU {cpu:.1f} %)",
                    flush=True,
                )
        outside = verdicts.count("OUT")
        print(
            f"\n{len(verdicts) - outside} of {len(verdicts)} rows within {TOLERANCE:.0%} of the configured value; "
            f"load average after: {os.getloadavg()[0]:.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
