"""Starting, stopping and reading the end of the daemon's numpy workers (plan and seed search).

Both run ``python -m MODULE`` with pipes on all three streams and report JSON lines on stdout; a
failure's reason is its last line's ``error``, else the last line of its stderr (a traceback), else
its exit status.  BLAS runs single-threaded: a worker is background work on cores the job uses.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import trio


async def start_worker(module: str) -> trio.Process:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
    return await trio.lowlevel.open_process(
        [sys.executable, "-m", module],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )


async def stop_worker(proc: trio.Process) -> None:
    """Kill it if it still runs and reap it, even while the caller is being cancelled."""
    with trio.CancelScope(shield=True):
        if proc.returncode is None:
            proc.kill()
        await proc.wait()


def failure_reason(last: dict[str, Any], stderr: bytes, code: int | None) -> str:
    """One line saying why a worker did not finish (see the module's docstring)."""
    error = last.get("error")
    if isinstance(error, str) and error:
        return error
    lines = stderr.decode(errors="replace").strip().splitlines()
    return lines[-1] if lines else f"exit {code}"
