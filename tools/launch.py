"""Shared body of the executable launchers in tools/: run a tool under the project's venv.

The launchers are called as `tools/NAME` or `tools/bench/NAME` from any shell (``module`` is then
``NAME`` or ``bench.NAME``); the system python lacks pyfuse3, torch and the package, so the launcher
re-executes under `.venv/bin/python` when that exists and is not the interpreter already running.
"""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path
from typing import NoReturn

ROOT = Path(__file__).resolve().parent.parent


def run(module: str) -> NoReturn:
    venv = ROOT / ".venv"
    python = venv / "bin" / "python"
    if python.exists() and Path(sys.prefix).resolve() != venv.resolve():
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
        os.execve(python, [str(python), "-m", f"tools.{module}", *sys.argv[1:]], env)
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    sys.exit(importlib.import_module(f"tools.{module}").main())
