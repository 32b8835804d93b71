"""The ``seerfs`` command line: the parser and dispatch (:mod:`.main`), what each subcommand does
(:mod:`.commands`), shared options, mount(8)'s ``-o`` syntax (:mod:`.mountopts`), the status view,
``seerfs umount`` and the ``seerfs plan`` report.
"""

from __future__ import annotations

from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    """The ``seerfs`` console script's entry point (``fusefs.cli:main``); see :mod:`.main`."""
    from fusefs.cli.main import main as run

    return run(argv)
