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


class _Orders:
    """The lead dataset in each order to try (:func:`placement.discovery.orders_to_try`), all listed
    while the worker waits for opens (a timm-order catalog of ImageNet costs seconds, paid at mount or
    by the prepared worker, not by the search).  An order that lists the same files in the same index
    order as an earlier one is searched once, as the earlier."""

    def __init__(self, snapshot: Snapshot, config: dict[str, Any], lists: Any, orders: Any) -> None:
        self.snapshot, self.config, self.orders = snapshot, config, orders
        self.catalogs = build_catalogs(snapshot.tree, config, lists)
        self.sizes = [len(c) for c in self.catalogs]
        self.lead = job_streams_of(config, self.sizes, orders).lead
        self.names = dv.orders_to_try(config, self.lead)
        self.ranged = dv.range_orders(config, self.lead, self.names)
        self._seen: list[npt.NDArray[np.int32]] = []

    def build(self, layout: str) -> _Order | None:
        """The order ``layout`` (None: it cannot list this tree, lists it as an earlier one did, or
        would make another dataset the lead)."""
        ds = self.config["datasets"][self.lead]
        if layout == (ds.get("layout") or DEFAULT_LAYOUT):
            cat = self.catalogs[self.lead]
        else:
            try:
                cat = build_catalog(self.snapshot.tree, ds["root"], layout, ds.get("extensions"))
            except ValueError:
                return None  # a tree this order cannot list (the configured one's error was raised above)
        if any(np.array_equal(cat.entry, e) for e in self._seen):
            return None
        self._seen.append(cat.entry)
        variant = {**self.config, "datasets": [*self.config["datasets"]]}
        variant["datasets"][self.lead] = {**ds, "layout": layout}
        sizes = [*self.sizes[: self.lead], len(cat), *self.sizes[self.lead + 1 :]]
        setup = dv.search_setup(variant, job_streams_of(variant, sizes, self.orders))
        if setup.lead != self.lead:
            return None  # so many more files in this order that another dataset would lead: not this job
        # a file listed twice (through a symlinked directory) counts as its first index, as the plan's ids do
        entry = cat.entry.astype(np.int64)
        index = np.full(len(self.snapshot.tree), -1, dtype=np.int64)
        index[entry[::-1]] = np.arange(entry.shape[0] - 1, -1, -1, dtype=np.int64)
        return _Order(layout, setup, index, layout in self.ranged)


@dataclass
class _Plan:
    """What every order's search shares: the candidates, the threshold, the opens compared."""

    full: ss.Candidates
    likely_only: ss.Candidates
    likely: int
    threshold: float
    use: npt.NDArray[np.int64]  # the opened entries compared (any dataset's: each order keeps its own)

    def searcher(self, o: _Order) -> ss.SeedSearch:
        idx = o.index[self.use]
        return ss.SeedSearch(
            o.setup.n,
            idx[idx >= 0],
            o.setup.shape,
            kinds=o.setup.kinds,
            candidates=self.full if o.full_range else self.likely_only,
            threshold=self.threshold,
            max_opens=dv.MAX_OPENS,
        )


def search(request: dict[str, Any], stdin: BinaryIO, parent: int) -> int:
    say("preparing")
    snapshot = Snapshot.load(Path(request["snapshot"]))
    config = request["config"]
    lists, orders = side_inputs(config["datasets"], snapshot.source)
    builder = _Orders(snapshot, config, lists, orders)
    # Every order listed now, while the worker waits for opens (at mount, or prepared ahead): a search
    # that starts then spends its time on seeds, not on a catalog (a timm-order ImageNet costs seconds).
    tried_orders = [o for name in builder.names if (o := builder.build(name)) is not None]
    head = tried_orders[0]  # the configured (or default) order: always listed, never a duplicate
    assert head.layout == builder.names[0], (head.layout, builder.names)
    first = head.setup
    if not first.searchable:
        say("done", **_unsearchable(first), opens=0, seconds=0.0, cpu_seconds=0.0)
        return 0
    limit, span = int(request["limit"]), int(request["epoch_span"])
    full, likely = dv.candidates(limit, span)
    likely_only, _ = dv.candidates(min(limit, ss.LIKELY_RANGE), span)
    # small chunks first: a common seed answers in milliseconds (the same values, in the same order)
    full, likely_only = Ramped(full), Ramped(likely_only)
    searchable = [o for o in tried_orders if o.setup.searchable]
    # each order at threshold / orders: a wrong seed fitting in any of them stays below the threshold (an
    # order listing the files as an earlier one adds no comparison: it is not searched)
    plan = _Plan(full, likely_only, likely, float(request["threshold"]) / len(searchable), np.zeros(0, np.int64))
    gate = dv.OpensGate(first.start_opens)
    planned = sum(len(full if o.full_range else likely_only) for o in searchable)
    say(
        "ready",
        dataset=first.root,
        lead=first.lead,
        files=first.n,
        sampler=list(first.kinds),
        orders=[o.layout for o in searchable],
        need=gate.need,
        planned=planned,
        likely=likely * len(searchable),
    )
    seen = np.zeros(len(snapshot.tree), dtype=np.bool_)
    opens: list[int] = []  # distinct entries, in the order first opened
    counted = 0  # of them, files of the lead dataset in the first order: what the gate counts
    more = True
    while True:
        while more and not gate.ready(counted):
            doc = _read_json(stdin)
            if doc is None:
                more = False
                break
            got = np.asarray(doc.get("opens", []), dtype=np.int64)
            got = got[(got >= 0) & (got < seen.shape[0])]
            for e in got.tolist():
                if not seen[e]:
                    seen[e] = True
                    opens.append(e)
                    counted += int(head.index[e] >= 0)
        # Exactly the opens up to the first ``need`` distinct lead ones (two batches per local rank): the
        # evidence, and so the outcome, do not depend on how far the job got while this process started.
        # With no more opens to come (the mount recorded all it keeps), whatever there is.
        all_opens = np.asarray(opens, dtype=np.int64)
        ends = np.flatnonzero(head.index[all_opens] >= 0)
        cut = int(ends[gate.need - 1]) + 1 if gate.ready(counted) else all_opens.shape[0]
        plan.use = all_opens[:cut]
        head.search = plan.searcher(head)
        if head.search.status != "too_few_opens":
            break
        lead_opens = min(counted, gate.need)
        gate.too_few(lead_opens)
        if not more or gate.exhausted:
            reason = f"{head.search.reason} (the node opened {counted} distinct files of {first.root!r})"
            fields = {**dv.result_fields(head.search.run()), "reason": reason, "result": f"too few opens ({reason})"}
            say("done", **fields, opens=lead_opens, seconds=0.0, cpu_seconds=0.0)
            return 0
        say("waiting", opens=lead_opens, need=gate.need, reason=head.search.reason)
    return _run(searchable, plan, parent, min(counted, gate.need), planned, first, len(searchable))


def _run(
    orders: list[_Order], plan: _Plan, parent: int, opens: int, planned: int, first: dv.SearchSetup, shared: int
) -> int:
    """Every order's likely seeds together, a chunk of each in turn (the ramped chunks put each order's
    common seeds in its first), then the range of those searched past them, one after another.

    Taking turns changes which candidate is tried when, never which ones nor any bound: each order's
    search keeps its own plan and its ``threshold / shared`` (``shared``: the orders to try).  A job
    read in the second order with a common seed is found in milliseconds, not after the first
    order's whole likely tier (0.3-0.5 s on a busy node: a hundred opens unpredicted).
    """
    t0, c0 = time.monotonic(), _cpu_s()
    last = t0
    say("searching", opens=opens, tried=0, planned=planned, checked=0, tier="likely", seconds=0.0)
    tries: list[_Order] = []
    for o in orders:
        o.search = o.search or plan.searcher(o)
        if o.search.status != "too_few_opens":
            o.steps = o.search.steps()
            tries.append(o)
    for tier in ("likely", "range"):
        turn = [o for o in tries if o.result is None and (tier == "likely" or o.full_range)]
        if tier == "range" and turn:
            os.nice(RANGE_NICE - SEARCH_NICE)
        while turn:
            for o in turn if tier == "likely" else turn[:1]:  # the range: one order at a time, in turn's order
                assert o.steps is not None
                step = next(o.steps)
                if os.getppid() != parent:  # the daemon is gone: nobody will read the answer
                    return 1
                o.tried = step.tried
                if step.result is not None:
                    o.result = step.result
                    if o.result.match is not None:
                        best = _best_order(o, [x for x in tries if tier == "likely" or x.full_range])
                        _done(best, tries, planned, first, opens, t0, c0, shared)
                        return 0
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
            # an order leaves its turn when its plan ended, or (likely tier) when its likely seeds were tried
            # and its range waits for every order's likely seeds
            turn = [
                o for o in turn if o.result is None and (tier == "range" or not o.full_range or o.tried < plan.likely)
            ]
    _done(None, tries, planned, first, opens, t0, c0, shared)
    return 0


def _best_order(found: _Order, others: list[_Order]) -> _Order:
    """The order in which the match's seed fits the opens best, among ``others`` whose plan holds it.

    Orders that list nearly the same files alike (a tree with one ``class10``) may both accept the true
    seed; its exact check in each other order (milliseconds) says which list the job reads, so the turn
    taken first does not decide it."""
    assert found.result is not None and found.result.match is not None
    best, chance = found, found.result.match.false_match_chance
    for o in others:
        if o is found or o.search is None:
            continue
        m = o.search.evaluate(found.result.match.value)
        if m is not None and m.false_match_chance < min(chance, o.search.threshold):
            best, chance = o, m.false_match_chance
            o.result = ss.SearchResult(
                "found", m, o.tried, o.search.planned, o.search.comparisons, 0, m.false_match_chance, m.describe()
            )
    return best


def _done(
    found: _Order | None,
    tries: list[_Order],
    planned: int,
    first: dv.SearchSetup,
    opens: int,
    t0: float,
    c0: float,
    orders: int,
) -> None:
    """The last line: the match and its order, or why no order fit and what to write.  ``orders``: how
    many the threshold was shared by (the false-match chances stated are bounds over all of them)."""
    searched = [o.layout for o in tries]
    timing = {"opens": opens, "seconds": round(time.monotonic() - t0, 3), "cpu_seconds": round(_cpu_s() - c0, 3)}
    tried = sum(o.tried for o in tries)
    # the plan as it turned out: orders that listed the tree as an earlier one were not searched
    planned = sum(o.search.planned for o in tries if o.search is not None) or planned
    counts = {"candidates_tried": tried, "candidates_planned": planned, "orders": searched}
    if found is not None:
        assert found.result is not None
        say("done", **{**dv.result_fields(found.result, found.layout, orders), **timing, **counts})
        return
    ends = [o.result for o in tries if o.result is not None]
    best = min((r.best_chance for r in ends), default=1.0)
    base = ends[-1] if ends else None
    what = dv.WHAT_DECIDES.get(first.kinds[0], "") if first.kinds else ""
    names = ", ".join(searched)
    if any(o.full_range for o in tries):
        result = f"not found (searched {tried:,} candidates in the {names} order{'s' if len(tries) > 1 else ''})"
    else:
        result = f"{dv.NO_ORDER_FITS} (tried {names} with the likely seeds)"
    said = base.reason if base is not None else "nothing searched"
    fields: dict[str, Any] = {
        **(dv.result_fields(base, None, orders) if base is not None else {}),
        "status": "not_found",
        "result": result,
        "best_chance": min(1.0, best * orders),
        "reason": f"{said}; {what}" if what else said,
    }
    say("done", **{**fields, **timing, **counts})


def _unsearchable(setup: dv.SearchSetup) -> dict[str, Any]:
    return {"status": "not_searchable", "result": f"not searchable ({setup.reason})", "reason": setup.reason}


if __name__ == "__main__":
    sys.exit(main())
