"""Starting, stopping and reading the end of the daemon's numpy workers (plan and seed search).

Both run ``python -m MODULE`` with pipes on all three streams and report JSON lines on stdout; a
failure's reason is its last line's ``error``, else the last line of its stderr (a traceback), else
its exit status.  BLAS runs single-threaded: a worker is background work on cores the job uses.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import AsyncGenerator
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


async def prepared_worker(module: str, first: bytes) -> trio.Process | None:
    """A worker started and given its first line (what it loads while it waits for the request that
    matters); None if it died at once (whoever needs one later starts its own)."""
    proc = await start_worker(module)
    assert proc.stdin is not None
    try:
        await proc.stdin.send_all(first)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        await stop_worker(proc)
        return None
    return proc


async def json_lines(stdout: trio.abc.ReceiveStream) -> AsyncGenerator[dict[str, Any], None]:
    """The worker's report lines, each a JSON object, in order until its stdout closes (anything
    else on a line, such as a stray print, is skipped)."""
    buf = bytearray()
    while chunk := await stdout.receive_some(65536):
        buf += chunk
        while b"\n" in buf:
            line, _, rest = bytes(buf).partition(b"\n")
            buf = bytearray(rest)
            try:
                doc = json.loads(line)
            except ValueError:
                continue
            if isinstance(doc, dict):
                yield doc


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
