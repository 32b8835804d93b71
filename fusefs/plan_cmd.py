"""``seerfs plan``: placeholder until the planner lands (owned by the planner work)."""

from __future__ import annotations

import argparse
from typing import Any

from .errors import SeerfsError


def add_parser(sub: Any, epilog: str) -> None:
    p = sub.add_parser(
        "plan",
        help="show the placement plan for a config, source and seed",
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("source", metavar="SOURCE")


def run(args: argparse.Namespace) -> int:
    raise SeerfsError("seerfs plan is not available yet")
