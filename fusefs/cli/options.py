"""Options and texts shared by every ``seerfs`` subcommand: config arguments, exit-status epilog."""

from __future__ import annotations

import argparse
from typing import Any

from fusefs.cli.mountopts import parse_mount_options
from fusefs.errors import EXIT_MEANINGS, ExitCode

EXIT_CODES = "\n".join(f"  {int(c):>2}  {EXIT_MEANINGS[c]}" for c in ExitCode)

EPILOG = f"""\
exit status:
{EXIT_CODES}

A job writes its sampler's seed to MOUNTPOINT/.control/seed (see seerfs-control(7)).
Configuration keys: seerfs config --defaults, seerfs.yaml(5)."""


def add_config_args(p: argparse.ArgumentParser) -> None:
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


def load_config(args: argparse.Namespace) -> Any:
    """The validated config named by ``-c``/``config=`` with the ``-o`` overrides applied."""
    from fusefs import config

    cfg_file, overrides, _ignored = parse_mount_options(args.options)
    return config.load(args.config or cfg_file, overrides)
