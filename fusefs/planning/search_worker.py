"""Subprocess that finds the sampler's seed from a node's first opens: ``python -m fusefs.planning.search_worker``.

Trying millions of candidate seeds is seconds to a minute of numpy that would stall the FUSE loop,
so the daemon (:mod:`fusefs.planning.discovery`) runs it here, at low priority: nice 10 for the
likely tier (the common seeds, 0..65535, seed + epoch, dates: under a second at ImageNet scale),
then nice 19 for the rest of the range, which only uses a core nobody else wants.

stdin, JSON lines: first the request ``{"snapshot", "config", "limit", "epoch_span", "threshold"}``,
then ``{"opens": [entry, ...]}`` with the node's opens in order (snapshot entries, every dataset),
as the daemon records them; EOF: no more will come.

stdout, JSON lines, each with ``phase``: ``preparing``; ``ready`` (``dataset``, ``files``,
``sampler``, ``need``: distinct opens of the dataset to wait for, ``planned``, ``likely``);
``waiting`` (``opens``, ``need``, ``reason``: the search said too few opens, it waits for more);
``searching`` (``opens``, ``tried``, ``planned``, ``checked``, ``tier``, at most 4 a second);
last ``done`` with the result's fields (:func:`placement.discovery.result_fields`), ``opens``,
``seconds`` and ``cpu_seconds``, or ``failed`` with ``error`` (one line a user can read).

The worker exits on its own when its parent is gone (it checks between chunks), so a daemon killed
with -9 does not leave a search burning a core.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from pathlib import Path
from typing import Any, BinaryIO, Literal

import numpy as np

from fusefs.errors import SeerfsError
from fusefs.meta.snapshot import Snapshot
from fusefs.planning.inputs import side_inputs
from placement import discovery as dv
from placement import seedsearch as ss
from placement.catalog import build_catalogs
from placement.plan import job_streams_of
from placement.searchramp import Ramped

T0 = time.monotonic()
SEARCH_NICE = 10  # the likely tier: background, like the plan worker
RANGE_NICE = 19  # the rest of the range: only idle CPU
PROGRESS_INTERVAL = 0.25  # seconds between progress lines


SearchPhase = Literal["preparing", "ready", "waiting", "searching", "done", "failed"]
"""The ``phase`` of each line the seed-search worker prints (seed discovery follows them)."""


def say(phase: SearchPhase, **fields: Any) -> None:
    print(json.dumps({"phase": phase, "t": round(time.monotonic() - T0, 3), **fields}), flush=True)


def _cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _read_json(stream: BinaryIO) -> dict[str, Any] | None:
    """The next JSON line of ``stream`` (None at EOF); a line that is not a JSON object is an error."""
    line = stream.readline()
    if not line:
        return None
    doc = json.loads(line)
    if not isinstance(doc, dict):
        raise ValueError("expected one JSON object per line on stdin")
    return doc


def main() -> int:
    os.nice(SEARCH_NICE)
    parent = os.getppid()
    stdin = sys.stdin.buffer
    try:
        request = _read_json(stdin)
        if request is None:
            return 0
        return search(request, stdin, parent)
    except (ValueError, OSError, KeyError, SeerfsError) as exc:
        text = getattr(exc, "strerror", None) or str(exc)
        say("failed", error=f"{type(exc).__name__}: {text}" if isinstance(exc, KeyError) else text)
        return 1


def search(request: dict[str, Any], stdin: BinaryIO, parent: int) -> int:
    say("preparing")
    snapshot = Snapshot.load(Path(request["snapshot"]))
    config = request["config"]
    lists, orders = side_inputs(config["datasets"], snapshot.source)
    catalogs = build_catalogs(snapshot.tree, config, lists)
    setup = dv.search_setup(config, job_streams_of(config, [len(c) for c in catalogs], orders))
    if not setup.searchable:
        say("done", **_unsearchable(setup), opens=0, seconds=0.0, cpu_seconds=0.0)
        return 0
    # snapshot entry -> index in the lead dataset (-1: another dataset's file or none); a file listed
    # twice (through a symlinked directory) counts as its first index, as the plan's ids do
    entry = catalogs[setup.lead].entry.astype(np.int64)
    index = np.full(len(snapshot.tree), -1, dtype=np.int64)
    index[entry[::-1]] = np.arange(entry.shape[0] - 1, -1, -1, dtype=np.int64)
    plan, likely = dv.candidates(int(request["limit"]), int(request["epoch_span"]))
    plan = Ramped(plan)  # small chunks first: a common seed answers in milliseconds
    threshold = float(request["threshold"])
    gate = dv.OpensGate(setup.start_opens)
    say(
        "ready",
        dataset=setup.root,
        files=setup.n,
        sampler=list(setup.kinds),
        need=gate.need,
        planned=len(plan),
        likely=likely,
    )
    seen = np.zeros(setup.n, dtype=np.bool_)
    opens: list[int] = []  # distinct lead indices, in the order first opened
    more = True
    while True:
        while more and not gate.ready(len(opens)):
            doc = _read_json(stdin)
            if doc is None:
                more = False
                break
            got = np.asarray(doc.get("opens", []), dtype=np.int64)
            got = got[(got >= 0) & (got < index.shape[0])]
            for i in index[got].tolist():
                if i >= 0 and not seen[i]:
                    seen[i] = True
                    opens.append(i)
        # Exactly the first ``need`` distinct opens (two batches per local rank): the evidence, and so
        # the outcome, do not depend on how far the job got while this process started.  With no
        # more opens to come (the mount recorded all it keeps), whatever there is.
        use = opens[: gate.need] if gate.ready(len(opens)) else opens
        searcher = ss.SeedSearch(
            setup.n, use, setup.shape, kinds=setup.kinds, candidates=plan, threshold=threshold, max_opens=dv.MAX_OPENS
        )
        if searcher.status != "too_few_opens":
            break
        gate.too_few(len(use))
        if not more or gate.exhausted:
            reason = f"{searcher.reason} (the node opened {len(opens)} distinct files of {setup.root!r})"
            fields = {**dv.result_fields(searcher.run()), "reason": reason, "result": f"too few opens ({reason})"}
            say("done", **fields, opens=len(use), seconds=0.0, cpu_seconds=0.0)
            return 0
        say("waiting", opens=len(use), need=gate.need, reason=searcher.reason)
    return _run(searcher, likely, parent, len(use))


def _run(searcher: ss.SeedSearch, likely: int, parent: int, opens: int) -> int:
    t0, c0 = time.monotonic(), _cpu_s()
    last = t0
    reniced = False
    say("searching", opens=opens, tried=0, planned=searcher.planned, checked=0, tier="likely", seconds=0.0)
    for step in searcher.steps():
        if os.getppid() != parent:  # the daemon is gone: nobody will read the answer
            return 1
        if not reniced and step.tried >= likely:
            os.nice(RANGE_NICE - SEARCH_NICE)
            reniced = True
        if step.result is not None:
            say(
                "done",
                **dv.result_fields(step.result),
                opens=opens,
                seconds=round(time.monotonic() - t0, 3),
                cpu_seconds=round(_cpu_s() - c0, 3),
            )
            return 0
        now = time.monotonic()
        if now - last >= PROGRESS_INTERVAL:
            last = now
            say(
                "searching",
                opens=opens,
                tried=step.tried,
                planned=step.planned,
                checked=step.checked,
                tier="likely" if step.tried < likely else "range",
                seconds=round(now - t0, 3),
            )
    return 1


def _unsearchable(setup: dv.SearchSetup) -> dict[str, Any]:
    return {"status": "not_searchable", "result": f"not searchable ({setup.reason})", "reason": setup.reason}


if __name__ == "__main__":
    sys.exit(main())
