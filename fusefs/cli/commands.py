"""What each ``seerfs`` subcommand does once its arguments are parsed.

Imports are local to each command: ``seerfs status`` must not pay for numpy, trio or pyfuse3.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from typing import Any

from fusefs.cli.options import load_config
from fusefs.errors import ExitCode, SeerfsError, TimeoutExpired


def cmd_mount(args: argparse.Namespace) -> int:
    from fusefs.cluster.formation import detect_mode
    from fusefs.daemon.checks import check_request
    from fusefs.daemon.lifecycle import mount_background, run_daemon

    os.umask(0o077)  # the cache directory and everything the daemon makes in it are this user's alone
    cfg = load_config(args)
    req = check_request(args.source, args.mountpoint, cfg, args.rescan)
    if not args.fg and detect_mode(cfg) == "mpi":
        raise SeerfsError(
            "launched by mpirun/srun: use 'seerfs mount --fg' (forking after MPI_Init is unsafe)", ExitCode.USAGE
        )
    if args.fg:
        return run_daemon(req, foreground=True)
    mount_background(req, args.timeout)
    return 0


def cmd_wait(args: argparse.Namespace) -> int:
    """Until the mount answers and its daemon group has formed (every expected node joined)."""
    from fusefs.daemon.lifecycle import wait_answering

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
    from fusefs.cli.umount import unmount

    print(unmount(args.mountpoint, lazy=args.lazy, timeout=args.timeout))
    return 0


def read_status(mountpoint: str, timeout: float) -> dict[str, Any]:
    """Read .control/status in a thread so a hung daemon costs a timeout, not a hung CLI."""
    from fusefs import mountinfo
    from fusefs.daemon.lifecycle import DEAD_ERRNOS, dead_mount
    from fusefs.errors import NotMounted

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
        if isinstance(err, OSError) and err.errno in DEAD_ERRNOS:
            raise dead_mount(mountpoint)
        raise SeerfsError(f"{mountpoint}: cannot read status: {getattr(err, 'strerror', None) or err}")
    doc: dict[str, Any] = result["doc"]
    return doc


def cmd_status(args: argparse.Namespace) -> int:
    from fusefs.cli.status_view import render

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
    from fusefs import config

    if args.defaults:
        sys.stdout.write(config.defaults_yaml())
        return 0
    sys.stdout.write(load_config(args).to_yaml())
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    from fusefs.cli import plan_report

    os.umask(0o077)  # the snapshot it may persist in cache_dir is private, as the daemon's are
    return plan_report.run(args)


COMMANDS = {
    "mount": cmd_mount,
    "wait": cmd_wait,
    "umount": cmd_umount,
    "status": cmd_status,
    "config": cmd_config,
    "plan": cmd_plan,
}
