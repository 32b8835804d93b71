"""Peer data-plane benchmark: files/s, MB/s and latency of the seerfs peer protocol on loopback.

A server process (``bench_peers serve``) holds N files of each size in memory and answers with the
real :class:`fusefs.cluster.peer_server.PeerServer`; this process fetches them with a :class:`PeerClient`
allowing c concurrent requests (c tasks, each fetching the next index in turn), for a fixed time
per point.  Every byte is verified against its block digests, as in the daemon.  CPU time per
file is shown for each side (the server's from /proc): what serving peers costs a daemon's loop.  Server and client
are separate processes, as two daemons would be, but share this machine's cores: loopback numbers
are an upper bound on protocol overhead, not a network measurement.  The largest size's best
MB/s is the protocol's ceiling for ``model.network_mbps`` (b_c) on this machine; a real cluster's
b_c is the lower of that and the NIC.

Numbers vary with the machine's load: rerun when ``uptime`` is high.
"""

from __future__ import annotations

import argparse
import os
import random
import secrets
import select
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

import trio

from fusefs.cluster.peer_client import PeerClient
from fusefs.cluster.peer_server import PeerServer, Provider, Provision
from fusefs.cluster.protocol import FileId, Get
from fusefs.config import format_bytes, parse_bytes
from tools.bench.procstat import process_cpu

MB = 1e6
TOKEN_ENV = "SEERFS_PEER_TOKEN"
PLAN_DIGEST = b"bench-plan-digest"
ROOT = Path(__file__).resolve().parents[2]


def file_bytes(index: int, size: int) -> bytes:
    """The content of file ``index`` (the server and the checks agree on it without I/O)."""
    return random.Random(index * 1_000_003 + size).randbytes(size)


def file_id(index: int, size: int) -> FileId:
    """File ``index``'s identity in the benchmark's "snapshot": entry = index, mtime fixed."""
    return FileId(index, size, 1_700_000_000_000_000_000)


def snapshot_provider(files: list[bytes]) -> Provider:
    """A provider that answers as a daemon would: dataset 0 only, indices of its snapshot only,
    and only for the file identity it holds there."""

    async def provide(get: Get) -> Provision:
        if get.digest != PLAN_DIGEST:
            return Provision("bad_request", reason="plan digest differs")
        if get.dataset != 0 or not 0 <= get.index < len(files):
            return Provision("bad_request", reason=f"no file {get.index} in dataset {get.dataset}")
        mine = file_id(get.index, len(files[get.index]))
        if get.file != mine:
            return Provision("mismatch", reason=f"index {get.index} is {mine} here", file=mine)
        return Provision("ok", files[get.index], file=mine)

    return provide


# ---------------------------------------------------------------- server process


def serve(host: str, port: int, files: int, size: int, block_size: int) -> None:
    token = bytes.fromhex(os.environ[TOKEN_ENV])
    data = [file_bytes(i, size) for i in range(files)]
    server = PeerServer(token, snapshot_provider(data), block_size=block_size)

    async def run() -> None:
        async with trio.open_nursery() as nursery:
            actual = await nursery.start(server.serve, host, port)
            print(f"port {actual}", flush=True)

    with suppress(KeyboardInterrupt):
        trio.run(run)


@contextmanager
def server_process(
    token: bytes, files: int, size: int, *, block_size: int = 1 << 20, host: str = "127.0.0.1", port: int = 0
) -> Iterator[tuple[subprocess.Popen[str], int]]:
    """A ``bench_peers serve`` process and its port; killed (and reaped) on exit."""
    cmd = [sys.executable, "-m", "tools.bench.peers", "serve", "--host", host, "--port", str(port)]
    cmd += ["--files", str(files), "--size", str(size), "--block-size", str(block_size)]
    env = dict(os.environ, **{TOKEN_ENV: token.hex()})
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], 60)  # it prints its port once listening, or exits
        line = proc.stdout.readline() if ready else ""
        if not line.startswith("port "):
            raise RuntimeError(f"peer server did not start (exit status {proc.poll()})")
        yield proc, int(line.split()[1])
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()


# ---------------------------------------------------------------- client side


@dataclass(frozen=True)
class Point:
    size: int
    concurrency: int
    files: int
    seconds: float
    latencies: list[float]
    client_cpu: float = 0.0
    server_cpu: float = 0.0

    @property
    def files_per_s(self) -> float:
        return self.files / self.seconds

    @property
    def mbps(self) -> float:
        return self.files * self.size / MB / self.seconds

    def latency_ms(self, q: float) -> float:
        ordered = sorted(self.latencies)
        return 1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def measure(
    port: int, server_pid: int, token: bytes, files: int, size: int, concurrency: int, seconds: float
) -> Point:
    client = PeerClient(0, "127.0.0.1", port, token, timeout=30.0, max_requests=concurrency, down_after=3)
    expected = {i: file_bytes(i, size) for i in range(min(files, 4))}
    latencies: list[float] = []
    next_index = 0

    async def worker(stop_at: float, record: bool) -> None:
        nonlocal next_index
        while time.perf_counter() < stop_at:
            index = next_index % files
            next_index += 1
            t0 = time.perf_counter()
            data = await client.fetch(0, index, PLAN_DIGEST, file_id(index, size))
            if data is None:
                raise RuntimeError(f"fetch of {index} failed: {client.last_error}")
            if record:
                latencies.append(time.perf_counter() - t0)
            if index in expected and data != expected[index]:
                raise RuntimeError(f"file {index}: wrong bytes")

    try:
        async with trio.open_nursery() as nursery:  # warm-up: open the connections
            for _ in range(concurrency):
                nursery.start_soon(worker, time.perf_counter() + min(0.3, seconds / 4), False)
        t0, cpu0, server0 = time.perf_counter(), time.process_time(), process_cpu(server_pid)
        async with trio.open_nursery() as nursery:
            for _ in range(concurrency):
                nursery.start_soon(worker, t0 + seconds, True)
        elapsed = time.perf_counter() - t0
        cpu, server_cpu = time.process_time() - cpu0, process_cpu(server_pid) - server0
    finally:
        await client.aclose()
    return Point(size, concurrency, len(latencies), elapsed, latencies, cpu, server_cpu)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="bench/peers", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = p.add_subparsers(dest="command")
    s = sub.add_parser("serve", help="run a peer server over generated files (token in $SEERFS_PEER_TOKEN)")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=0)
    s.add_argument("--files", type=int, default=64)
    s.add_argument("--size", type=parse_bytes, default=110_000)
    s.add_argument("--block-size", type=parse_bytes, default=1 << 20)
    p.add_argument("--sizes", default="110KB,4MiB", help="file sizes (default: %(default)s)")
    p.add_argument("--concurrency", default="1,4,8", help="concurrent requests c (default: %(default)s)")
    p.add_argument("--files", type=int, default=64, help="distinct files per size (default: %(default)s)")
    p.add_argument("--seconds", type=float, default=3.0, help="measuring time per point (default: %(default)s)")
    p.add_argument("--block-size", type=parse_bytes, default=1 << 20, help="server block size (default: 1MiB)")
    return p


def main(argv: list[str] | None = None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    if args.command == "serve":
        serve(args.host, args.port, args.files, args.size, args.block_size)
        return 0
    try:
        sizes = [parse_bytes(x) for x in args.sizes.split(",")]
        levels = [int(x) for x in args.concurrency.split(",")]
    except ValueError as exc:
        print(f"bench_peers: {exc}", file=sys.stderr)
        return 2
    token = secrets.token_bytes(32)
    points: list[Point] = []
    for size in sizes:
        with server_process(token, args.files, size, block_size=args.block_size) as (proc, port):
            for c in levels:
                points.append(trio.run(measure, port, proc.pid, token, args.files, size, c, args.seconds))
    print(f"loopback, server and client in separate processes, {os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}")
    print(f"block size {format_bytes(args.block_size)}, {args.seconds:g} s per point, every block xxh3-verified")
    print(
        f"{'size':>10} {'c':>3} {'files/s':>9} {'MB/s':>8} {'x c=1':>6} {'mean ms':>8} {'p50 ms':>7} {'p99 ms':>7}"
        f" {'client us/f':>11} {'server us/f':>11}"
    )
    for pt in points:
        base = next(b for b in points if b.size == pt.size)
        mean_ms = 1000 * statistics.fmean(pt.latencies)
        print(
            f"{format_bytes(pt.size):>10} {pt.concurrency:>3} {pt.files_per_s:>9.0f} {pt.mbps:>8.0f} "
            f"{pt.files_per_s / base.files_per_s:>6.2f} {mean_ms:>8.2f} {pt.latency_ms(0.5):>7.2f} "
            f"{pt.latency_ms(0.99):>7.2f} {1e6 * pt.client_cpu / pt.files:>11.0f} "
            f"{1e6 * pt.server_cpu / pt.files:>11.0f}"
        )
    best = max(points, key=lambda q: (q.size, q.mbps))
    print(
        f"protocol ceiling for model.network_mbps (b_c) here: {best.mbps:.0f} MB/s "
        f"({format_bytes(best.size)} files, c={best.concurrency})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
