"""Subprocess that finds the sampler's seed from a node's first opens: ``python -m fusefs.planning.search_worker``.

Trying millions of candidate seeds is seconds to a minute of numpy that would stall the FUSE loop,
so the daemon (:mod:`fusefs.planning.discovery`) runs it here, at low priority: nice 10 for the
likely tier (the common seeds, 0..65535, seed + epoch, dates: under a second at ImageNet scale),
then nice 19 for the rest of the range, which only uses a core nobody else wants.

stdin, JSON lines: first the request ``{"snapshot", "config", "limit", "epoch_span", "threshold"}``,
then ``{"opens": [entry, ...]}`` with the node's opens in order (snapshot entries, every dataset),
as the daemon records them; EOF: no more will come.

stdout, JSON lines, each with ``phase``: ``preparing``; ``ready`` (``dataset``, ``files``,
``sampler``, ``lead``: its index among the datasets, ``orders``: the catalog orders tried, ``need``:
distinct opens of the dataset to wait for, ``planned``, ``likely``: over every order);
``waiting`` (``opens``, ``need``, ``reason``: the search said too few opens, it waits for more);
``searching`` (``opens``, ``tried``, ``planned``, ``checked``, ``tier``, ``order``, at most 4 a second);
last ``done`` with the result's fields (:func:`placement.discovery.result_fields`, ``order`` the match's
catalog order), ``opens``,
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
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Literal

import numpy as np
import numpy.typing as npt

from fusefs.errors import SeerfsError
from fusefs.meta.snapshot import Snapshot
from fusefs.planning.inputs import side_inputs
from placement import discovery as dv
from placement import seedsearch as ss
from placement.catalog import DEFAULT_LAYOUT, build_catalog, build_catalogs
from placement.plan import job_streams_of

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


@dataclass
class _Order:
    """One catalog order of the lead dataset the search tries: its setup and entry -> index map."""

    layout: str
    setup: dv.SearchSetup
    index: npt.NDArray[np.int64]  # snapshot entry -> index in this order (-1: not in the dataset)
    full_range: bool  # searched past the likely seeds
    search: ss.SeedSearch | None = None
    steps: Iterator[ss.SearchProgress] | None = None
    tried: int = 0
    result: ss.SearchResult | None = None


def _orders(snapshot: Snapshot, config: dict[str, Any], lists: Any, orders: Any) -> list[_Order]:
    """The lead dataset in each order to try (:func:`placement.discovery.orders_to_try`); an order that
    lists the same files in the same index order as an earlier one is searched once, as the earlier."""
    catalogs = build_catalogs(snapshot.tree, config, lists)
    sizes = [len(c) for c in catalogs]
    lead = job_streams_of(config, sizes, orders).lead
    ds = config["datasets"][lead]
    tried = dv.orders_to_try(config, lead)
    ranged = dv.range_orders(config, lead, tried)
    out: list[_Order] = []
    seen: list[npt.NDArray[np.int32]] = []
    for layout in tried:
        if layout == (ds.get("layout") or DEFAULT_LAYOUT):
            cat = catalogs[lead]
        else:
            try:
                cat = build_catalog(snapshot.tree, ds["root"], layout, ds.get("extensions"))
            except ValueError:
                continue  # a tree this order cannot list (the configured one's error was raised above)
        if any(np.array_equal(cat.entry, e) for e in seen):
            continue
        seen.append(cat.entry)
        variant = {**config, "datasets": [*config["datasets"]]}
        variant["datasets"][lead] = {**ds, "layout": layout}
        setup = dv.search_setup(variant, job_streams_of(variant, [*sizes[:lead], len(cat), *sizes[lead + 1 :]], orders))
        if setup.lead != lead:
            continue  # so many more files in this order that another dataset would lead: not this job
        # a file listed twice (through a symlinked directory) counts as its first index, as the plan's ids do
        entry = cat.entry.astype(np.int64)
        index = np.full(len(snapshot.tree), -1, dtype=np.int64)
        index[entry[::-1]] = np.arange(entry.shape[0] - 1, -1, -1, dtype=np.int64)
        out.append(_Order(layout, setup, index, layout in ranged))
    return out


def search(request: dict[str, Any], stdin: BinaryIO, parent: int) -> int:
    say("preparing")
    snapshot = Snapshot.load(Path(request["snapshot"]))
    config = request["config"]
    lists, orders = side_inputs(config["datasets"], snapshot.source)
    tries = _orders(snapshot, config, lists, orders)
    first = tries[0].setup
    if not first.searchable:
        say("done", **_unsearchable(first), opens=0, seconds=0.0, cpu_seconds=0.0)
        return 0
    tries = [o for o in tries if o.setup.searchable]
    # snapshot entries of the lead dataset in any order tried (the same files, in most trees)
    member = np.zeros(len(snapshot.tree), dtype=np.bool_)
    for o in tries:
        member |= o.index >= 0
    full, likely = dv.candidates(int(request["limit"]), int(request["epoch_span"]))
    likely_only, _ = dv.candidates(min(int(request["limit"]), ss.LIKELY_RANGE), int(request["epoch_span"]))
    # each order at threshold / orders: a wrong seed fitting in any of them stays below the threshold
    threshold = float(request["threshold"]) / len(tries)
    gate = dv.OpensGate(first.start_opens)
    planned = sum(len(full if o.full_range else likely_only) for o in tries)
    say(
        "ready",
        dataset=first.root,
        lead=first.lead,
        files=first.n,
        sampler=list(first.kinds),
        orders=[o.layout for o in tries],
        need=gate.need,
        planned=planned,
        likely=likely * len(tries),
    )
    seen = np.zeros(len(snapshot.tree), dtype=np.bool_)
    opens: list[int] = []  # distinct lead entries, in the order first opened
    more = True
    while True:
        while more and not gate.ready(len(opens)):
            doc = _read_json(stdin)
            if doc is None:
                more = False
                break
            got = np.asarray(doc.get("opens", []), dtype=np.int64)
            got = got[(got >= 0) & (got < member.shape[0])]
            for e in got.tolist():
                if member[e] and not seen[e]:
                    seen[e] = True
                    opens.append(e)
        # Exactly the first ``need`` distinct opens (two batches per local rank): the evidence, and so
        # the outcome, do not depend on how far the job got while this process started.  With no
        # more opens to come (the mount recorded all it keeps), whatever there is.
        use = np.asarray(opens[: gate.need] if gate.ready(len(opens)) else opens, dtype=np.int64)
        for o in tries:
            idx = o.index[use]
            o.search = ss.SeedSearch(
                o.setup.n,
                idx[idx >= 0],
                o.setup.shape,
                kinds=o.setup.kinds,
                candidates=full if o.full_range else likely_only,
                threshold=threshold,
                max_opens=dv.MAX_OPENS,
            )
        searchers = [o.search for o in tries if o.search is not None]
        if any(x.status != "too_few_opens" for x in searchers):
            break
        gate.too_few(len(use))
        lead = searchers[0]
        if not more or gate.exhausted:
            reason = f"{lead.reason} (the node opened {len(opens)} distinct files of {first.root!r})"
            fields = {**dv.result_fields(lead.run()), "reason": reason, "result": f"too few opens ({reason})"}
            say("done", **fields, opens=len(use), seconds=0.0, cpu_seconds=0.0)
            return 0
        say("waiting", opens=len(use), need=gate.need, reason=lead.reason)
    tries = [o for o in tries if o.search is not None and o.search.status != "too_few_opens"]
    return _run(tries, likely, parent, len(use), planned, first)


def _run(tries: list[_Order], likely: int, parent: int, opens: int, planned: int, first: dv.SearchSetup) -> int:
    """Every order's likely seeds, in turn, then the range of those searched past them."""
    t0, c0 = time.monotonic(), _cpu_s()
    last = t0
    reniced = False
    say("searching", opens=opens, tried=0, planned=planned, checked=0, tier="likely", seconds=0.0)
    for o in tries:
        assert o.search is not None
        o.steps = o.search.steps()
    for tier in ("likely", "range"):
        for o in tries:
            if o.steps is None or o.result is not None:
                continue
            if tier == "range" and not reniced:
                os.nice(RANGE_NICE - SEARCH_NICE)
                reniced = True
            for step in o.steps:
                if os.getppid() != parent:  # the daemon is gone: nobody will read the answer
                    return 1
                o.tried = step.tried
                if step.result is not None:
                    o.result = step.result
                    break
                now = time.monotonic()
                if now - last >= PROGRESS_INTERVAL:
                    last = now
                    say(
                        "searching",
                        opens=opens,
                        tried=sum(x.tried for x in tries),
                        planned=planned,
                        checked=step.checked,
                        tier=tier,
                        order=o.layout,
                        seconds=round(now - t0, 3),
                    )
                if tier == "likely" and step.tried >= likely:
                    break
            if o.result is not None and o.result.match is not None:
                _done(o, tries, planned, first, opens, t0, c0)
                return 0
    _done(None, tries, planned, first, opens, t0, c0)
    return 0


def _done(
    found: _Order | None, tries: list[_Order], planned: int, first: dv.SearchSetup, opens: int, t0: float, c0: float
) -> None:
    """The last line: the match and its order, or why no order fit and what to write."""
    timing = {"opens": opens, "seconds": round(time.monotonic() - t0, 3), "cpu_seconds": round(_cpu_s() - c0, 3)}
    tried = sum(o.tried for o in tries)
    if found is not None:
        assert found.result is not None
        match = dv.result_fields(found.result, found.layout, len(tries))
        say("done", **{**match, **timing, "candidates_tried": tried, "candidates_planned": planned})
        return
    ends = [o.result for o in tries if o.result is not None]
    best = min((r.best_chance for r in ends), default=1.0)
    base = ends[-1] if ends else None
    what = dv.WHAT_DECIDES.get(first.kinds[0], "") if first.kinds else ""
    ranged = [o.layout for o in tries if o.full_range]
    names = ", ".join(o.layout for o in tries)
    if ranged:
        result = f"not found (searched {tried:,} candidates in the {names} order{'s' if len(tries) > 1 else ''})"
    else:
        result = f"{dv.NO_ORDER_FITS} (tried {names} with the likely seeds)"
    fields: dict[str, Any] = {
        **(dv.result_fields(base, None, len(tries)) if base is not None else {}),
        "status": "not_found",
        "result": result,
        "best_chance": min(1.0, best * len(tries)),
        "candidates_tried": tried,
        "candidates_planned": planned,
        "reason": f"{base.reason if base else 'nothing searched'}; {what}" if what else (base.reason if base else ""),
    }
    say("done", **fields, **timing)


def _unsearchable(setup: dv.SearchSetup) -> dict[str, Any]:
    return {"status": "not_searchable", "result": f"not searchable ({setup.reason})", "reason": setup.reason}


if __name__ == "__main__":
    sys.exit(main())
