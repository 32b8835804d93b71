"""``seerfs`` command line: mount, wait, umount, status, config, plan.

Also accepts the form mount.fuse3 uses for ``mount -t fuse.seerfs`` and fstab entries:
``seerfs SOURCE MOUNTPOINT -o OPTS`` (no subcommand; generic mount options are ignored).
Every user error is one line on stderr and a documented exit code (see ``--help`` epilog).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

from . import __version__
from .errors import EXIT_MEANINGS, ExitCode, SeerfsError, TimeoutExpired

EXIT_CODES = "\n".join(f"  {int(c):>2}  {EXIT_MEANINGS[c]}" for c in ExitCode)

EPILOG = f"""\
exit status:
{EXIT_CODES}

A job writes its sampler's seed to MOUNTPOINT/.control/seed (see seerfs-control(7)).
Configuration keys: seerfs config --defaults, seerfs.yaml(5)."""

SUBCOMMANDS = ("mount", "wait", "umount", "status", "config", "plan")


def _add_config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("-c", "--config", metavar="CONFIG", help="YAML configuration file (seerfs.yaml(5))")
    p.add_argument(
        "-o",
        dest="options",
        metavar="KEY=VAL[,...]",
        action="append",
        default=[],
        help="override config keys (dotted, e.g. job.epochs=3,tiers.0.bytes=8G); "
        "config=FILE names the config; generic mount options (rw, dev, suid, noauto, ...) are ignored",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="seerfs", description="Clairvoyant per-node FUSE cache for deep-learning datasets.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    parser.add_argument("--version", action="version", version=f"seerfs {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser(
        "mount",
        help="mount SOURCE read-only on MOUNTPOINT",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Mount SOURCE (a dataset directory on the PFS) on MOUNTPOINT. Daemonises and "
        "returns once the mount answers, unless --fg.",
    )
    p.add_argument("source", metavar="SOURCE", help="the dataset directory on the PFS")
    p.add_argument("mountpoint", metavar="MOUNTPOINT", help="an empty directory to mount on")
    _add_config_args(p)
    p.add_argument("--fg", action="store_true", help="serve in the foreground (what srun/mpirun launch)")
    p.add_argument("--rescan", action="store_true", help="walk the source even if a persisted snapshot matches")
    p.add_argument(
        "--timeout",
        type=float,
        default=600.0,
        metavar="S",
        help="seconds to wait for the mount to answer (default 600)",
    )

    p = sub.add_parser(
        "wait",
        help="wait until MOUNTPOINT answers and its daemon group has formed",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("mountpoint", metavar="MOUNTPOINT", help="a seerfs mountpoint")
    p.add_argument("--timeout", type=float, default=300.0, metavar="S", help="give up after S seconds (default 300)")

    p = sub.add_parser(
        "umount",
        help="unmount MOUNTPOINT and wait for its daemon",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Unmount; also cleans up a mount whose daemon died. When busy, names the processes holding it.",
    )
    p.add_argument("mountpoint", metavar="MOUNTPOINT", help="a seerfs mountpoint")
    p.add_argument("--lazy", action="store_true", help="detach now; the daemon exits when the last user closes it")
    p.add_argument(
        "--timeout",
        type=float,
        default=30.0,
        metavar="S",
        help="seconds to wait for the daemon to exit (default 30)",
    )

    p = sub.add_parser(
        "status",
        help="show a mount's status",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("mountpoint", metavar="MOUNTPOINT", help="a seerfs mountpoint")
    p.add_argument("--json", action="store_true", help="print the raw JSON document (seerfs-control(7))")
    p.add_argument(
        "--watch",
        nargs="?",
        const=1.0,
        type=float,
        metavar="S",
        help="refresh every S seconds (default 1) until interrupted",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=10.0,
        metavar="S",
        help="give up if the mount does not answer within S seconds (default 10)",
    )

    p = sub.add_parser(
        "config",
        help="print the default or effective configuration",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--defaults", action="store_true", help="every key with its default and meaning")
    _add_config_args(p)

    from . import plan_cmd

    plan_cmd.add_parser(sub, EPILOG)
    return parser


def _mount_form(argv: list[str]) -> list[str] | None:
    """Rewrite mount.fuse3's ``SOURCE MOUNTPOINT -o OPTS`` call into ``mount ... -o OPTS``."""
    if not argv or argv[0] in SUBCOMMANDS or argv[0].startswith("-"):
        return None
    return ["mount", *argv]


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    rewritten = _mount_form(args_list)
    parser = build_parser()
    args = parser.parse_args(rewritten if rewritten is not None else args_list)
    if args.command is None:
        parser.print_help()
        return int(ExitCode.USAGE)
    try:
        return int(COMMANDS[args.command](args) or 0)
    except SeerfsError as exc:
        print(f"seerfs: {exc}", file=sys.stderr)
        return int(exc.code)
    except KeyboardInterrupt:
        return 130


# --------------------------------------------------------------------------- commands


def _load_config(args: argparse.Namespace) -> Any:
    from . import config

    cfg_file, overrides, _ignored = config.parse_mount_options(args.options)
    return config.load(args.config or cfg_file, overrides)


def cmd_mount(args: argparse.Namespace) -> int:
    from .daemon import check_request, mount_background, run_daemon
    from .group import detect_mode

    cfg = _load_config(args)
    req = check_request(args.source, args.mountpoint, cfg, args.rescan)
    if not args.fg and detect_mode(cfg) == "mpi":
        raise SeerfsError("launched by mpirun/srun: use 'seerfs mount --fg' (forking after MPI_Init is unsafe)",
                          ExitCode.USAGE)  # fmt: skip
    if args.fg:
        return run_daemon(req, foreground=True)
    mount_background(req, args.timeout)
    return 0


def cmd_wait(args: argparse.Namespace) -> int:
    """Until the mount answers and its daemon group has formed (every expected node joined)."""
    from .daemon import wait_answering

    mp = os.path.abspath(args.mountpoint)
    deadline = time.monotonic() + args.timeout
    wait_answering(mp, args.timeout)
    delay = 0.01
    while True:
        group = read_status(mp, max(1.0, deadline - time.monotonic())).get("group", {})
        if group.get("state", "ready") == "ready":
            return 0
        if time.monotonic() >= deadline:
            raise TimeoutExpired(
                f"{mp}: daemon group still forming after {args.timeout:g}s ({group.get('size')} of "
                f"{group.get('expect')} nodes)"
            )
        time.sleep(delay)
        delay = min(delay * 2, 0.2)


def cmd_umount(args: argparse.Namespace) -> int:
    from .umount import unmount

    print(unmount(args.mountpoint, lazy=args.lazy, timeout=args.timeout))
    return 0


def read_status(mountpoint: str, timeout: float) -> dict[str, Any]:
    """Read .control/status in a thread so a hung daemon costs a timeout, not a hung CLI."""
    from . import mountinfo
    from .errors import NotMounted

    if not mountinfo.is_seerfs(mountpoint):
        raise NotMounted(f"{mountpoint}: not a seerfs mount")
    result: dict[str, Any] = {}

    def read() -> None:
        try:
            with open(os.path.join(mountpoint, ".control", "status"), "rb") as fh:
                result["doc"] = json.loads(fh.read())
        except (OSError, ValueError) as exc:
            result["error"] = exc

    t = threading.Thread(target=read, daemon=True)
    t.start()
    t.join(timeout)
    if t.is_alive():
        raise TimeoutExpired(f"{mountpoint}: daemon not answering after {timeout:g}s (hung?)")
    if "error" in result:
        err = result["error"]
        raise SeerfsError(f"{mountpoint}: cannot read status: {getattr(err, 'strerror', None) or err}")
    doc: dict[str, Any] = result["doc"]
    return doc


def cmd_status(args: argparse.Namespace) -> int:
    from .status_view import render

    mp = os.path.abspath(args.mountpoint)
    if args.watch is None:
        doc = read_status(mp, args.timeout)
        print(json.dumps(doc, indent=2) if args.json else render(doc))
        return 0
    while True:
        doc = read_status(mp, args.timeout)
        text = json.dumps(doc, indent=2) if args.json else render(doc)
        if sys.stdout.isatty():
            sys.stdout.write("\033[H\033[2J")
        print(text, flush=True)
        time.sleep(max(0.1, args.watch))


def cmd_config(args: argparse.Namespace) -> int:
    from . import config

    if args.defaults:
        sys.stdout.write(config.defaults_yaml())
        return 0
    sys.stdout.write(_load_config(args).to_yaml())
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    from . import plan_cmd

    return plan_cmd.run(args)


COMMANDS = {
    "mount": cmd_mount,
    "wait": cmd_wait,
    "umount": cmd_umount,
    "status": cmd_status,
    "config": cmd_config,
    "plan": cmd_plan,
}


if __name__ == "__main__":
    sys.exit(main())
