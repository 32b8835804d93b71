"""Subprocess that builds a plan: ``python -m fusefs.planning.worker REQUEST.json``.

Planning is seconds of numpy that would hold the GIL and stall the FUSE loop, so the daemon runs it
here (ARCHITECTURE.md, "Processes").  The request names the persisted snapshot, the config mapping,
the seed, the list/order files and the output directory.  Progress goes to stdout as JSON lines;
the last line is ``{"phase": "done", ...}`` or ``{"phase": "failed", "error": "..."}`` (one line a
user can read).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Literal

WorkerPhase = Literal["loading snapshot", "planning", "saving", "done", "failed"]
"""The ``phase`` of each line the plan worker prints (the manager waits for ``done``)."""


def say(phase: WorkerPhase, **fields: Any) -> None:
    print(json.dumps({"phase": phase, "t": round(time.monotonic() - T0, 3), **fields}), flush=True)


T0 = time.monotonic()
TORCH_WORTH_IT = 300_000  # files from which planning with torch beats importing it
PLAN_NICE = 10


def main(argv: list[str]) -> int:
    from fusefs.errors import SeerfsError

    # Planning is background work: the FUSE loop serving the job's opens must win every CPU race.
    os.nice(PLAN_NICE)

    request = json.loads(Path(argv[0]).read_text())
    try:
        from fusefs.meta.snapshot import Snapshot
        from fusefs.planning.inputs import build_plan
        from fusefs.planning.store import save_plan
        from placement.randperm import Backend

        say("loading snapshot")
        snapshot = Snapshot.load(Path(request["snapshot"]))
        config = request["config"]
        files = int(snapshot.counts()["files"])
        say("planning", files=files)
        # torch's randperm is ~10x faster, but importing it costs 1-2 s: worth it only at scale.
        backend: Backend = "auto" if files >= TORCH_WORTH_IT else "numpy"
        plan = build_plan(snapshot, config, int(request["seed"]), backend=backend)
        say("saving", digest=plan.digest)
        save_plan(plan, request["out"])
        say("done", digest=plan.digest, seconds=plan.summary().get("plan_seconds"))
        return 0
    except (ValueError, OSError, KeyError, SeerfsError) as exc:
        text = getattr(exc, "strerror", None) or str(exc)
        say("failed", error=f"{type(exc).__name__}: {text}" if isinstance(exc, KeyError) else text)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
