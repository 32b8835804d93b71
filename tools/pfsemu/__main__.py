"""``python -m tools.pfsemu`` and ``python3 tools/pfsemu``: the emulator's command line (see --help).

Run as a directory (``python3 tools/pfsemu``, what the launcher script of this name did), it takes the
launchers' path: the repository root goes on sys.path in place of this directory, and the command
re-executes under the project's .venv when that exists (tools/launch.py).
"""

import sys
from pathlib import Path

if not __package__:
    sys.path[0] = str(Path(__file__).resolve().parent.parent.parent)
    from tools.launch import run

    run("pfsemu")

from tools.pfsemu.cli import main

sys.exit(main())
