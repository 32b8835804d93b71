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
from fusefs.progress import ProgressPrinter, current_line
from fusefs.waiting import WaitTimeout, wait_until


def cmd_mount(args: argparse.Namespace) -> int:
    from fusefs.cluster.formation import detect_mode, mpi_unavailable
    from fusefs.daemon.checks import check_request
    from fusefs.daemon.lifecycle import mount_background, run_daemon
    from fusefs.errors import GroupError

    os.umask(0o077)  # the cache directory and everything the daemon makes in it are this user's alone
    cfg = load_config(args)
    req = check_request(args.source, args.mountpoint, cfg, args.rescan)
    mode = detect_mode(cfg)
    if mode == "mpi" and (missing := mpi_unavailable(cfg)) is not None:
        raise GroupError(missing)
    if not args.fg and mode == "mpi":
        raise SeerfsError(
            "launched by mpirun/srun: use 'seerfs mount --fg' (forking after MPI_Init is unsafe)", ExitCode.USAGE
        )
    if args.fg:
        return run_daemon(req, foreground=True)
    mount_background(req, args.timeout)
    return 0


def cmd_wait(args: argparse.Namespace) -> int:
    """Until the mount answers and its daemon group has formed (every expected node joined), and with
    --plan until the plan for the current seed is ready; the progress of each shows on stderr."""
    from fusefs.daemon.lifecycle import wait_answering

    mp = os.path.abspath(args.mountpoint)
    deadline = time.monotonic() + args.timeout
    printer = ProgressPrinter(sys.stderr)
    try:
        wait_answering(mp, args.timeout, poll=lambda: _show_starting(mp, printer))
        waiting_for = ""

        def done() -> bool:
            nonlocal waiting_for
            doc = read_status(mp, max(1.0, deadline - time.monotonic()))
            group = doc.get("group", {})
            if group.get("state", "ready") != "ready":
                waiting_for = f"daemon group still forming ({group.get('size')} of {group.get('expect')} nodes)"
                printer.show(f"group: forming, {group.get('size')} of {group.get('expect')} nodes")
                return False
            if not args.plan:
                return True
            plan, seed = doc.get("plan") or {}, (doc.get("seed") or {}).get("value")
            if plan.get("state") == "ready" and plan.get("seed") == seed:
                return True
            if plan.get("state") == "failed" and plan.get("seed") == seed:
                raise SeerfsError(f"{mp}: plan for seed {seed} failed: {plan.get('message')}", ExitCode.CONFIG)
            waiting_for = f"plan for seed {seed} not ready ({plan.get('state')}, {plan.get('progress')})"
            printer.show(str(((doc.get("progress") or {}).get("plan") or {}).get("line", waiting_for)))
            return False

        try:
            wait_until(done, deadline - time.monotonic(), lambda: waiting_for)
        except WaitTimeout:
            raise TimeoutExpired(f"{mp}: {waiting_for} after {args.timeout:g}s") from None
        return 0
    finally:
        printer.close()


def _show_starting(mountpoint: str, printer: ProgressPrinter) -> None:
    """While the daemon walks the source its mount does not answer yet: show its start record."""
    doc = starting_status(mountpoint)
    if doc is not None:
        printer.show(current_line(doc["progress"]))


def starting_status(mountpoint: str) -> dict[str, Any] | None:
    """The status of a daemon still starting on ``mountpoint`` (from its start record), or None.

    A record whose daemon is gone (killed while starting) is ignored: a new mount may be on its way.
    """
    from fusefs import __version__
    from fusefs.daemon.runtime import StartRecord, pid_alive

    rec = StartRecord.read(mountpoint)
    if rec is None or not pid_alive(rec.pid):
        return None
    return {
        "version": __version__,
        "state": "starting",
        "pid": rec.pid,
        "source": rec.source,
        "mountpoint": rec.mountpoint,
        "log_file": rec.log_file,
        "started_at": round(rec.started, 3),
        "uptime_s": round(time.time() - rec.started, 3),
        "progress": rec.progress,
    }


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


def current_status(mountpoint: str, timeout: float) -> dict[str, Any]:
    """The mount's status document, or while its daemon is still starting, the start record's."""
    from fusefs.errors import NotMounted

    try:
        return read_status(mountpoint, timeout)
    except NotMounted:
        doc = starting_status(mountpoint)
        if doc is None:
            raise
        return doc


def cmd_status(args: argparse.Namespace) -> int:
    from fusefs.cli.status_view import render

    mp = os.path.abspath(args.mountpoint)
    if args.watch is None:
        doc = current_status(mp, args.timeout)
        print(json.dumps(doc, indent=2) if args.json else render(doc))
        return 0
    while True:
        doc = current_status(mp, args.timeout)
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
