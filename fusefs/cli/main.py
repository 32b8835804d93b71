"""``seerfs`` command line: mount, wait, umount, status, config, plan.

Also accepts the form mount.fuse3 uses for ``mount -t fuse.seerfs`` and fstab entries:
``seerfs SOURCE MOUNTPOINT -o OPTS`` (no subcommand; generic mount options are ignored).
Every user error is one line on stderr and a documented exit code (see ``--help`` epilog).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from fusefs import __version__
from fusefs.cli import commands, plan_report
from fusefs.cli.options import EPILOG, add_config_args
from fusefs.errors import ExitCode, SeerfsError

SUBCOMMANDS = ("mount", "wait", "umount", "status", "config", "plan")

SIGNALS = (
    "Signals to the daemon: TERM, INT and HUP each stop a serving daemon the same way (HUP does not "
    "reload: the configuration is read only at mount): it logs the signal, stops serving, unmounts and "
    "exits 0.  The unmount detaches the mount even while it is in use: files still open there then fail "
    "with ENOTCONN (transport endpoint is not connected).  A request waiting on a hung source holds all "
    "of this back until the source answers (the thread reading it cannot be interrupted); KILL ends the "
    "daemon at once and leaves a mount without a daemon, which 'seerfs umount' cleans up.  Before the "
    "mount answers (the walk of SOURCE, group formation) TERM and HUP end the daemon at once and INT "
    "stops it (exit status 130 with --fg); 'seerfs mount' then fails with exit status 1 (daemon exited "
    "during startup).  'seerfs umount' sends TERM to a daemon still starting."
)
"""What each signal does (the handlers: fusefs/daemon/assembly.py ``Daemon._signals``; before them,
Python's defaults); in ``seerfs mount --help`` and seerfs(1)."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="seerfs",
        description="Clairvoyant per-node FUSE cache for deep-learning datasets.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"seerfs {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser(
        "mount",
        help="mount SOURCE read-only on MOUNTPOINT",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Mount SOURCE (a dataset directory on the PFS) on MOUNTPOINT. Daemonises and "
        "returns once the mount answers, unless --fg. The walk of SOURCE shows its progress on stderr "
        "(entries walked, per second, and the time left when a previous snapshot gives the count): a "
        "refreshing line on a terminal, else a line every 10 s; with --fg, a log line every 10 s.\n\n" + SIGNALS,
    )
    p.add_argument("source", metavar="SOURCE", help="the dataset directory on the PFS")
    p.add_argument("mountpoint", metavar="MOUNTPOINT", help="an empty directory to mount on")
    add_config_args(p)
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
        description="Wait until MOUNTPOINT answers and its daemon group has formed. While the daemon walks "
        "the source, and with --plan while it plans, progress shows on stderr: a refreshing line on a "
        "terminal, else a line every 10 s.",
    )
    p.add_argument("mountpoint", metavar="MOUNTPOINT", help="a seerfs mountpoint")
    p.add_argument(
        "--plan",
        action="store_true",
        help="also wait until the plan for the current seed is ready (exit 3 if planning fails)",
    )
    p.add_argument("--timeout", type=float, default=300.0, metavar="S", help="give up after S seconds (default 300)")

    p = sub.add_parser(
        "umount",
        help="unmount MOUNTPOINT and wait for its daemon",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Unmount; also cleans up a mount whose daemon died, and stops a daemon still starting "
        "(walking its source). When busy, names the processes holding it and why: an open file, cwd, root or "
        "mapping under it, or a request the daemon is serving for it now (a reader blocked in open on a hung "
        "source has no open file yet; the daemon is asked through its status, for at most 5 s). While no process "
        "but the daemon holds it (its own read back through the mount, to fill a tier or for a peer), it retries "
        "for up to 5 s.",
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
        description="Show a mount's status (seerfs-control(7)); while its daemon is still starting, the "
        "progress of the walk of the source, from the daemon's start record.",
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
    add_config_args(p)

    plan_report.add_parser(sub, EPILOG)
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
        return int(commands.COMMANDS[args.command](args) or 0)
    except SeerfsError as exc:
        print(f"seerfs: {exc}", file=sys.stderr)
        return int(exc.code)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
