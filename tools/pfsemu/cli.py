"""The command line: ``pfsemu serve``, ``pfsemu stats``, ``pfsemu reset``."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import sys
from collections.abc import Sequence
from pathlib import Path

from tools.pfsemu.control import PfsemuClient, PfsStats, default_control_path
from tools.pfsemu.model import (
    DEFAULT_ACTIVE_WINDOW_MS,
    DEFAULT_ATTR_TIMEOUT_S,
    DEFAULT_CURVE,
    DEFAULT_META_LATENCY_MS,
    DEFAULT_NICE,
    DEFAULT_OPEN_LATENCY_MS,
    DEFAULT_READ_LATENCY_MS,
    DEFAULT_THREADS,
    EXIT_INTERNAL,
    EXIT_OK,
    EXIT_OPTION,
    EXIT_UNREACHABLE,
    LASSEN_CURVE,
    Curve,
    EmulatorConfig,
    PfsemuError,
)
from tools.pfsemu.serve import _check_paths, _serve_daemon, serve

# ----------------------------------------------------------------------------------------------------
# Command line
# ----------------------------------------------------------------------------------------------------

_EPILOG = f"""\
model:
  A reader is an open file handle with a read in flight, or whose last read ended less than the
  active window ago; gamma counts them.  All reads share one channel moving t(gamma) bytes/s in
  total, first come first served (each reader gets t(gamma)/gamma on average); a read replies no
  earlier than the read latency after it arrived (latency overlaps the transfer); a read at end
  of file replies at once.  Every open waits the open latency.  Files are served with direct_io,
  so the counters see every byte readers get (no page cache, no readahead); bytes count for the
  process that opened the file.

defaults (printed with every result):
  --curve {DEFAULT_CURVE} (MB/s, MB = 10^6 B) is NoPFS's Lassen curve
  t(1,2,4,8) = 330, 730, 1540, 2870 MB/s scaled to a 2-core box: t(1) divided by 16.5, growth
  with gamma compressed from 8.7x to 3x because readers, seerfs daemons and the emulator share two
  cores; the per-reader share t(gamma)/gamma falls from 20 to 7.5 MB/s as on a contended PFS.
  t is linear in gamma between points and flat beyond them.
  --open-latency-ms {DEFAULT_OPEN_LATENCY_MS:g} (an MDS open RPC),
  --read-latency-ms {DEFAULT_READ_LATENCY_MS:g} (an OST RPC), --meta-latency-ms {DEFAULT_META_LATENCY_MS:g}.

control socket (one request line, one JSON reply line):
  ping | stats | stats files | reset   (reset replies with the counters before zeroing them)
  default path: /tmp/pfsemu-UID-HASH.sock, HASH from the mountpoint's real path; stats and reset
  accept the mountpoint instead of the socket and derive it the same way.

exit status:
  0 ok, 1 internal error, 2 usage, 3 bad option value, 4 BACKING unusable, 5 MOUNTPOINT unusable
  or mount failed, 6 control socket unusable, 7 no emulator answers on the control socket.

stop a server: fusermount3 -u MOUNTPOINT (or SIGTERM/SIGINT to its process).
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pfsemu",
        description="Emulated contended parallel filesystem: a read-only FUSE passthrough with per-open "
        "and per-read latency, an aggregate bandwidth t(gamma) shared by all active readers, and "
        "exact traffic counters on a control socket.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="{serve,stats,reset}")
    s = sub.add_parser(
        "serve",
        help="mount BACKING at MOUNTPOINT as an emulated PFS",
        description="Mount BACKING read-only at MOUNTPOINT with the PFS model (see pfsemu --help).",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    s.add_argument("backing", type=Path, metavar="BACKING", help="directory to serve")
    s.add_argument("mountpoint", type=Path, metavar="MOUNTPOINT", help="empty directory to mount on")
    s.add_argument("--control", type=Path, metavar="SOCKET", help="control socket path (default: derived)")
    s.add_argument(
        "--curve",
        default=DEFAULT_CURVE,
        metavar="G:MBPS,...",
        help=f"aggregate throughput t(gamma) in MB/s at given gamma (default {DEFAULT_CURVE}; "
        f"NoPFS Lassen: {LASSEN_CURVE})",
    )
    s.add_argument(
        "--open-latency-ms",
        type=float,
        default=DEFAULT_OPEN_LATENCY_MS,
        metavar="MS",
        help=f"delay of every open (default {DEFAULT_OPEN_LATENCY_MS:g})",
    )
    s.add_argument(
        "--read-latency-ms",
        type=float,
        default=DEFAULT_READ_LATENCY_MS,
        metavar="MS",
        help=f"minimum time of every read request (default {DEFAULT_READ_LATENCY_MS:g})",
    )
    s.add_argument(
        "--meta-latency-ms",
        type=float,
        default=DEFAULT_META_LATENCY_MS,
        metavar="MS",
        help=f"delay of lookup/getattr/opendir/readlink (default {DEFAULT_META_LATENCY_MS:g})",
    )
    s.add_argument(
        "--active-window-ms",
        type=float,
        default=DEFAULT_ACTIVE_WINDOW_MS,
        metavar="MS",
        help=f"a handle stays an active reader this long after its last read (default {DEFAULT_ACTIVE_WINDOW_MS:g})",
    )
    s.add_argument(
        "--threads",
        type=int,
        default=DEFAULT_THREADS,
        metavar="N",
        help=f"threads for reads not in the page cache and for directory scans (default {DEFAULT_THREADS})",
    )
    s.add_argument(
        "--attr-timeout-s",
        type=float,
        default=DEFAULT_ATTR_TIMEOUT_S,
        metavar="S",
        help=f"kernel entry/attribute cache time (default {DEFAULT_ATTR_TIMEOUT_S:g})",
    )
    s.add_argument(
        "--nice",
        type=int,
        default=DEFAULT_NICE,
        metavar="N",
        help=f"scheduling priority, so busy readers do not stretch emulated delays (default {DEFAULT_NICE}, "
        "kept as is without the privilege)",
    )
    s.add_argument("--fg", action="store_true", help="stay in the foreground (default: daemonise once mounted)")
    s.add_argument("--log", type=Path, metavar="FILE", help="daemon log file (default: discard)")
    for name, text in (("stats", "print the counters"), ("reset", "zero the counters")):
        p = sub.add_parser(name, help=text, description=f"{text.capitalize()} of a running pfsemu.")
        p.add_argument("control", metavar="SOCKET", help="control socket, or the emulator's mountpoint")
        if name == "stats":
            p.add_argument("--json", action="store_true", help="print the raw JSON reply (with per-file counts)")
            p.add_argument("--top", type=int, default=10, metavar="N", help="files listed (default 10)")
    return parser


def _config_from_args(args: argparse.Namespace) -> EmulatorConfig:
    for name in (
        "open_latency_ms",
        "read_latency_ms",
        "meta_latency_ms",
        "active_window_ms",
        "attr_timeout_s",
    ):
        value = getattr(args, name)
        if not (value >= 0 and math.isfinite(value)):
            raise PfsemuError(f"--{name.replace('_', '-')} must be a number >= 0, not {value}", EXIT_OPTION)
    if args.threads < 1:
        raise PfsemuError("--threads must be >= 1", EXIT_OPTION)
    if not -20 <= args.nice <= 19:
        raise PfsemuError("--nice must be between -20 and 19", EXIT_OPTION)
    return EmulatorConfig(
        curve=Curve.parse(args.curve),
        open_latency_s=args.open_latency_ms / 1e3,
        read_latency_s=args.read_latency_ms / 1e3,
        meta_latency_s=args.meta_latency_ms / 1e3,
        active_window_s=args.active_window_ms / 1e3,
        threads=args.threads,
        attr_timeout_s=args.attr_timeout_s,
        nice=args.nice,
    )


def _control_of(arg: str) -> Path:
    path = Path(arg)
    return default_control_path(path) if path.is_dir() else path


def _printable(path: str) -> str:
    """A name as text any terminal takes: undecodable bytes (surrogateescape) shown as \\xNN."""
    return path.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def format_stats(stats: PfsStats, top: int = 10) -> str:
    """Human-readable rendering of a snapshot (``pfsemu stats``)."""
    emu = stats.raw["emulator"]
    lag = stats.raw["loop_lag_ms"]
    lines = [
        stats.describe_config(),
        f"emulator pid {emu['pid']}: {emu['backing']} at {emu['mountpoint']}, up {emu['uptime_s']:.1f} s, "
        f"cpu {emu['cpu_s']:.2f} s, loop lag max {lag['max']:.2f} ms mean {lag['mean']:.3f} ms",
        f"since reset {stats.since_reset_s:.1f} s: opens {stats.opens} (errors {stats.open_errors}), "
        f"reads {stats.reads}, bytes {stats.bytes}, meta ops {stats.meta_ops}, "
        f"channel busy {stats.raw['totals']['channel_busy_s']:.2f} s",
        f"now: open handles {stats.open_handles}, active readers {stats.active_readers}",
        "reads by gamma: " + (" ".join(f"{g}:{n}" for g, n in sorted(stats.reads_by_gamma.items())) or "-"),
        f"{'pid':>8} {'process':<16} {'opens':>8} {'reads':>10} {'bytes':>14}",
    ]
    for pid, (comm, c) in sorted(stats.pids.items(), key=lambda kv: -kv[1][1].bytes):
        lines.append(f"{pid:>8} {comm:<16} {c.opens:>8} {c.reads:>10} {c.bytes:>14}")
    if stats.files and top > 0:
        lines.append(f"{'opens':>8} {'bytes':>14}  file (top {top} by bytes of {len(stats.files)})")
        ranked = sorted(stats.files.items(), key=lambda kv: -kv[1].bytes)[:top]
        lines.extend(f"{c.opens:>8} {c.bytes:>14}  {_printable(path)}" for path, c in ranked)
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    try:
        if args.command == "serve":
            config = _config_from_args(args)
            if args.fg:
                serve(args.backing, args.mountpoint, config, args.control)
                return EXIT_OK
            _check_paths(args.backing, args.mountpoint)
            return _serve_daemon(args.backing, args.mountpoint, config, args.control, args.log)
        client = PfsemuClient(_control_of(args.control))
        try:
            if args.command == "reset":
                before = client.reset()
                text = f"pfsemu: counters reset (were opens {before.opens}, bytes {before.bytes})"
            elif args.json:
                text = json.dumps(client.request("stats files"), indent=1)
            else:
                text = format_stats(client.stats(files=args.top > 0), args.top)
        except (OSError, ValueError) as exc:
            raise PfsemuError(f"no pfsemu answers on {client.control}: {exc}", EXIT_UNREACHABLE) from None
        with contextlib.suppress(BrokenPipeError):
            print(text, flush=True)
        return EXIT_OK
    except PfsemuError as exc:
        print(f"pfsemu: {exc}", file=sys.stderr)
        return exc.code
    except KeyboardInterrupt:
        return EXIT_INTERNAL


if __name__ == "__main__":
    sys.exit(main())
