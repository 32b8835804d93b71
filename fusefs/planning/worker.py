"""Subprocess that builds plans: ``python -m fusefs.planning.worker``, requests on stdin.

Planning is seconds of numpy that would hold the GIL and stall the FUSE loop, so the daemon runs it
here (ARCHITECTURE.md, "Processes").  Each request is one JSON line on stdin naming the persisted
snapshot, the config mapping, the seed and the output directory.  Progress goes to stdout as JSON
lines; a request's last line is ``{"phase": "done", ...}`` or ``{"phase": "failed", "error":
"..."}`` (one line a user can read).  After ``done`` the worker waits for the next request; after
``failed`` it exits (status 1).

The worker imports everything and says ``standing by`` *before* it reads a request, and a line
naming only the snapshot (``{"snapshot": PATH}``) loads it ahead (``loaded``): the daemon starts
one at mount and keeps it (:mod:`fusefs.planning.manager`), so a seed written or found as the job's
ranks start costs only the planning, not the ~0.4 s CPU of a Python start and numpy's import nor
the snapshot's load, on the cores the ranks are starting on.  The snapshot is kept while its file
is unchanged (device, inode, size, mtime).  End of stdin (the daemon stopped, or died) ends the
worker quietly.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any, Literal

WorkerPhase = Literal["standing by", "loaded", "loading snapshot", "planning", "saving", "done", "failed"]
"""The ``phase`` of each line the plan worker prints (the manager waits for ``done``)."""


def say(phase: WorkerPhase, **fields: Any) -> None:
    print(json.dumps({"phase": phase, "t": round(time.monotonic() - T0, 3), **fields}), flush=True)


T0 = time.monotonic()
TORCH_WORTH_IT = 300_000  # files from which planning with torch beats importing it
PLAN_NICE = 10


def main() -> int:
    # Planning is background work: the FUSE loop serving the job's opens must win every CPU race.
    os.nice(PLAN_NICE)

    from pathlib import Path

    from fusefs.errors import SeerfsError
    from fusefs.meta.snapshot import Snapshot
    from fusefs.planning.inputs import build_plan
    from fusefs.planning.store import save_plan
    from placement.randperm import Backend

    say("standing by")
    loaded: tuple[str, tuple[int, ...], Snapshot] | None = None  # (path, its identity, the snapshot)

    def snapshot_of(path: str) -> Snapshot:
        nonlocal loaded
        st = os.stat(path)
        identity = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        if loaded is None or loaded[:2] != (path, identity):
            loaded = (path, identity, Snapshot.load(Path(path)))
        return loaded[2]

    global T0
    while True:
        line = sys.stdin.readline()
        if not line.strip():
            return 0  # no request: the daemon let this worker go
        T0 = time.monotonic()  # phase times count from the request, not from the stand-by
        try:
            request = json.loads(line)
            if not isinstance(request, dict):
                raise ValueError("expected one JSON object per line on stdin")
            if "seed" not in request and set(request) == {"snapshot"}:
                files = int(snapshot_of(str(request["snapshot"])).counts()["files"])
                say("loaded", files=files)
                continue
            say("loading snapshot")
            snapshot = snapshot_of(str(request["snapshot"]))
            config = request["config"]
            files = int(snapshot.counts()["files"])
            say("planning", files=files)
            # torch's randperm is ~10x faster, but importing it costs 1-2 s: worth it only at scale.
            backend: Backend = "auto" if files >= TORCH_WORTH_IT else "numpy"
            node = request.get("node")  # a per-node plan's part computed at once (placement.nodeplan)
            plan = build_plan(snapshot, config, int(request["seed"]), backend=backend, node=node)
            say("saving", digest=plan.digest)
            save_plan(plan, request["out"])
            say("done", digest=plan.digest, seconds=plan.summary().get("plan_seconds"))
        except (ValueError, OSError, KeyError, SeerfsError) as exc:
            text = getattr(exc, "strerror", None) or str(exc)
            say("failed", error=f"{type(exc).__name__}: {text}" if isinstance(exc, KeyError) else text)
            return 1


if __name__ == "__main__":
    sys.exit(main())
