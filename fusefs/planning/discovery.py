"""Finding the sampler's seed from the node's first opens, when nobody wrote it or the one in use is wrong.

The daemon records the first opens of the mount, and again the first ones after each seed written
here or on a peer (:meth:`SeedDiscovery.on_open`, every dataset; the search keeps the lead
dataset's).  A search runs in a subprocess
(:mod:`fusefs.planning.search_worker`, at low priority) when

* no seed was written (origin ``assumed``): from the start, so the seed is known about as soon as
  the node has opened enough files (two batches per local rank);
* the seed in use was written (here or on a peer) and the cursor reports that the lead dataset's
  opens do not fit its plan (a mismatch).

A match is adopted as if it had been written (:class:`fusefs.planning.seed.SeedState` origin
``discovered``): the plan manager plans it and the cursor locks on.  A DistributedSampler job seen
in epoch e is found as ``seed + e`` (its order in epoch e + k is seed + e's in epoch k), which is
the value planned.  Only a match below the cursor's false-lock chance is accepted.

A search judges a written seed only on opens recorded since it was written: a job may change its
sampler's seed mid-run (write 17 before epoch 12), and the opens before the write show the old
seed's order, which says nothing about the new one.  The cursor tries a new plan on the opens just
before it, so such a write is at first called a mismatch; the search then finds that the written
seed fits the opens since (in one of its plan's epochs: :func:`placement.discovery.epoch_in_plan`)
and nothing is adopted.  A search on the same opens always ends the same, so it runs once per
recording: a later mismatch reuses its answer (adopts the match found before, or, without one,
leaves the reactive policy in charge) while no seed was written since, and asks for a new search
on the new recording otherwise.

A search worker is started ahead, prepared (snapshot, catalogs, the search's setup loaded) and
waiting for opens: at mount (beside the first search's own, when no seed is written: a seed the
job writes then cancels that search, and a mismatch of it comes seconds later), and
:data:`STANDBY_AFTER` seconds after each search, so a later search never waits for a Python start
or the snapshot's load (:meth:`_keep_standby`).

Concurrency rules (all on the trio thread):
* At most one prepared worker waits (``_standby``); a search takes it (sets it to None) in the step
  that starts the search; the keeping task kills it when the daemon stops.
* One search at a time, in :meth:`run`'s cancel scope.  A seed written here or arriving from a peer
  cancels it (the subprocess is killed); the discovery's own :meth:`SeedState.set` does not
  (``_adopting``).
* A stale search never overrides a newer seed: a match is adopted only if the seed in use is still
  the version (generation, writer) it was asked for under (``_since``, taken in :meth:`_want`),
  otherwise it is dropped (state ``stopped``, counted in ``superseded``).  The cancel alone is not
  enough: a seed can arrive between the ask and the search's start, when there is no scope to
  cancel.  A write elsewhere that this node has not heard of yet is settled by the generations
  (:func:`fusefs.planning.seed.next_generation`).
* The recorded opens only grow (up to :data:`OPENS_CAP`) until a seed is written here or arrives
  from a peer: that starts a new list in the same step that cancels the running search.  The feeder
  keeps the list it started with and sends what was added since its last send, in order, until the
  worker starts searching.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal, TypedDict

import trio

from fusefs.config import Config
from fusefs.planning.seed import SeedState
from fusefs.planning.workerproc import failure_reason, json_lines, prepared_worker, start_worker, stop_worker
from placement.catalog import DEFAULT_LAYOUT
from placement.cursor import FALSE_LOCK, CursorStatus, DatasetState
from placement.discovery import epoch_in_plan
from placement.statusfields import counter, gauge, info, state, text

log = logging.getLogger(__name__)

OPENS_CAP = 16384
"""Opens recorded at most: the search compares at most 4096 distinct files of the lead dataset,
and the node may open other datasets' files (a validation sanity pass) in between."""
FEED_INTERVAL = 0.02  # seconds the feeder lets opens gather between two sends
STANDBY_AFTER = 30.0
"""Seconds after a search took the prepared worker before the next one starts (the job runs then)."""
WORKER = "fusefs.planning.search_worker"
DiscoveryState = Literal[
    "off", "idle", "waiting", "preparing", "searching", "found", "not_found", "not_searchable", "stopped"
]


class DiscoveryStatus(TypedDict):
    """Status section ``discovery``: the search for the sampler's seed from the node's first opens."""

    enabled: Annotated[bool, gauge("seed_discovery.enabled")]
    state: Annotated[
        DiscoveryState,
        state(
            "off; idle: nothing to search, a written seed is in use; waiting: for enough opens of the lead "
            "dataset, or for the search process to start; preparing: the search process loads the snapshot; "
            "searching; found; not_found (the whole range searched, no modelled order fits with a likely seed, or too "
            "few opens ever came); "
            "not_searchable; stopped: a newer seed was written, here or on a peer, after the search was asked "
            "for: the search was killed, or its match dropped (note)"
        ),
    ]
    trigger: Annotated[
        str | None,
        text(
            'why it ran: "no seed written", "the written seed N does not match the opens", or "the written seed '
            'N: which catalog order the job reads (no layout configured)"'
        ),
    ]
    result: Annotated[
        str | None,
        text(
            'one line: "seed+epoch = V (DistributedSampler, node K, ORDER order)", "seed = V '
            '(DataLoader(shuffle=True, seeded generator), ORDER order)", "not found (searched N candidates in the '
            'ORDER order)", "no modelled order with a likely seed fits (tried ORDERS with the likely seeds)": '
            "the job is served as without a seed, reason says what decides its order and what to write; "
            '"not searchable (why)" or "too few opens (why)"'
        ),
    ]
    seed: Annotated[int | None, info("the value found: the 32-bit generator seed, which is what is planned")]
    identifies: Annotated[
        str | None,
        text(
            "seed+epoch: a DistributedSampler's order in epoch e depends on seed + e alone, so a job seen in "
            "epoch e is found as seed + e and planning that value predicts epoch e as the plan's epoch 0; "
            "seed: a seeded shuffling DataLoader, seen in its epoch 0"
        ),
    ]
    sampler: Annotated[str | None, info("distributed or random: the lead dataset's configured kind, the one searched")]
    order: Annotated[
        str | None,
        info(
            "the catalog order of the lead dataset the match fits (imagefolder, timm_folder, files, or the "
            "configured layout): the plan is made in this order; null without a match"
        ),
    ]
    orders: Annotated[
        str | None,
        text(
            "the orders searched, comma-separated: the configured layout, or, when datasets.N.layout is not "
            "given, every modelled order (imagefolder, timm_folder, files) that lists the dataset differently "
            "from the ones before it; their likely seeds are searched together, a chunk of each in turn"
        ),
    ]
    node: Annotated[int | None, gauge("the node whose ranks the opens fit (null: a DataLoader without ranks)")]
    dataset: Annotated[str | None, text("the lead dataset searched (its root in the mount)")]
    files: Annotated[int | None, gauge("its file count")]
    opens_recorded: Annotated[
        int,
        gauge(
            "opens of any dataset recorded for the search since the mount or the last seed written here or on a "
            "peer (earlier opens show an earlier seed's order), at most 16384"
        ),
    ]
    opens_needed: Annotated[
        int | None,
        gauge(
            "distinct opens of the lead dataset the search waits for: two batches per local rank, at most "
            "half an epoch and at most 4096; more each time the search answered too few"
        ),
    ]
    opens_used: Annotated[int | None, gauge("distinct lead opens the search compared (the first opens_needed)")]
    hits: Annotated[int | None, gauge("how many of them the match predicts")]
    candidates_tried: Annotated[int | None, gauge("seeds tried")]
    candidates_planned: Annotated[int | None, gauge("seeds in the search's plan")]
    likely_candidates: Annotated[int | None, gauge("seeds in its likely tier, tried first")]
    tier: Annotated[str | None, text("while searching: likely or range")]
    fraction: Annotated[float | None, gauge("candidates_tried / candidates_planned", unit="ratio")]
    false_match_chance: Annotated[
        float | None,
        gauge(
            "the chance that any wrong candidate of the whole plan fits the opens as well as the match: a "
            "match is accepted only below threshold"
        ),
    ]
    best_chance: Annotated[float | None, gauge("the smallest false-match chance any candidate reached")]
    threshold: Annotated[float, gauge("the cursor's false-lock chance")]
    seconds: Annotated[
        float | None, gauge("the search's time so far or in all (the process start and snapshot load before)")
    ]
    cpu_seconds: Annotated[float | None, gauge("the search process's CPU time", unit="seconds")]
    found_at_opens: Annotated[int | None, gauge("opens recorded (as opens_recorded) when the match was adopted")]
    attempts: Annotated[int, counter("search processes started")]
    superseded: Annotated[
        int,
        counter(
            "searches a newer seed, written here or on a peer after they were asked for, made stale: killed while "
            "they ran, or their match dropped when they ended (a match never replaces a newer seed)"
        ),
    ]
    reason: Annotated[str | None, text("the search's own sentence: how the match fits, or why nothing did")]
    note: Annotated[
        str | None,
        text(
            "what happened since: a newer seed stopped it or made its match stale (dropped), a match found before "
            "was adopted for a later mismatch, a discovered seed no longer matches"
        ),
    ]
    message: Annotated[str | None, text("why the search process failed, or null")]
    limit: Annotated[int, gauge("seed_discovery.limit")]


class SeedDiscovery:
    def __init__(
        self, snapshot_file: Path, cfg: Config, seed: SeedState, on_order: Callable[[int, str], None] | None = None
    ) -> None:
        """``on_order``: told (dataset, layout) for the lead dataset and each one without a configured
        layout when a match fits the lead in a catalog order, before the seed is adopted: the planner
        plans that order."""
        self.on_order = on_order
        self.order: str | None = None  # the lead's order the last match fitted (None: none yet)
        self.settings = cfg.seed_discovery
        self.config = cfg.to_dict()
        self.epochs = cfg.job.epochs  # the planning horizon: a plan predicts its seed's epochs 0..epochs-1
        self.snapshot_file = snapshot_file
        self.seed = seed
        self.threshold = FALSE_LOCK
        self.state: DiscoveryState = "idle" if self.settings.enabled else "off"
        self.trigger: str | None = None  # why the last search was started
        self.note: str | None = None  # what happened after it ended (a newer seed, a later mismatch)
        self.opens: list[int] = []  # the first opens (snapshot entries) since the mount or the last written seed
        self.result: dict[str, Any] | None = None  # the last finished search's fields
        self.setup: dict[str, Any] = {}  # what the worker said it searches (dataset, files, sampler, ...)
        self.progress: dict[str, Any] = {}  # the worker's last waiting/searching line
        self.attempts = 0
        self.superseded = 0  # searches a newer seed made stale (killed, or their match dropped)
        self._since = seed.version()  # the seed version the wanted or running search was asked under
        self._recordings = 0  # lists of opens started so far (one more at each seed written here or on a peer)
        self._fed = 0  # the recording the running search is fed from
        self._result_recording = 0  # the recording the last finished search (``result``) compared
        self.started_at: float | None = None  # monotonic: the search (not the preparation) began
        self.seconds: float | None = None  # from the search's start to its end
        self.found_at_opens: int | None = None  # opens recorded when the match was adopted
        self.message: str | None = None  # why the last worker failed
        self._recording = self.settings.enabled
        self._opens_changed = trio.Event()
        self._wanted = trio.Event()
        self._scope: trio.CancelScope | None = None
        self._adopting = False
        self._order_only = False  # the wanted search only asks which order a written seed is read in
        self._standby: trio.Process | None = None  # a worker given the request, prepared, waiting for opens
        self._standby_wanted = trio.Event()

    # ------------------------------------------------------------------ events (trio thread)

    def on_open(self, entry: int) -> None:
        """A dataset file was opened (the prefetcher's hook): record the first ones."""
        if not self._recording:
            return
        self.opens.append(entry)
        if len(self.opens) >= OPENS_CAP:
            self._recording = False
        self._opens_changed.set()

    def on_cursor(self, lead_state: DatasetState, plan_seed: int | None) -> None:
        """The cursor published a view; ``lead_state``: the lead dataset's state under the plan for
        ``plan_seed``.  A mismatch under the seed in use, when it was written, starts a search."""
        if self.state == "off" or lead_state != "mismatch" or plan_seed != self.seed.value:
            return
        origin = self.seed.origin
        if self._scope is not None:
            return  # a search is under way
        if origin == "discovered":
            self.note = f"the discovered seed {plan_seed} no longer matches the opens; write the seed"
            return
        if origin not in ("written", "peer"):
            return
        if self.result is None or self._result_recording != self._recordings:
            # No answer yet, or one from opens before this seed was written: search the opens since.
            self._want(f"the {origin} seed {plan_seed} does not match the opens")
            return
        found = self.result.get("seed")
        if found is not None and self._fits(int(found)) is None:
            self.trigger = f"the {origin} seed {plan_seed} does not match the opens"
            self.note = f"adopted the seed found before, {found}"
            self._tell_order(self.result.get("order"))
            self._adopt(int(found), self.seed.version())  # a decision under the seed in use: its version

    def _fits(self, found: int) -> int | None:
        """The epoch of its plan in which the seed in use reads what the last search found, or None."""
        identifies = (self.result or {}).get("identifies")
        return epoch_in_plan(self.seed.value, found, identifies, self.epochs)

    def seed_changed(self, seed: SeedState) -> None:
        """A seed adopted (one of ``SeedState.listeners``, given where the seed is made)."""
        if self._adopting or seed.origin not in ("written", "peer"):
            return
        leads = [ds for ds in self.config["datasets"] if ds["follows"] is None]  # the lead is one of these
        order_unknown = self.settings.enabled and self.order is None and any(ds["layout"] is None for ds in leads)
        if order_unknown and self._scope is not None and not self.opens and self.state in ("preparing", "waiting"):
            # The search under way has not been given an open yet: every open it will get is this seed's.
            # Kept (its process and loaded snapshot), it answers for this seed: which order it is read in.
            self._recordings += 1
            self._fed = self._recordings
            self.trigger, self._since, self.note = self._order_trigger(seed), seed.version(), None
            self._order_only = True
            return
        # Opens before a write show the order of the seed before it: a new recording judges this one.
        self.opens, self._recordings = [], self._recordings + 1
        self._recording = self.settings.enabled
        if self._scope is not None:
            self._scope.cancel()
            self.superseded += 1
            self.note = f"stopped: a seed was {seed.origin} ({seed.value})"
            log.info("seed discovery stopped: seed %d was %s", seed.value, seed.origin)
        if order_unknown:
            # No layout configured and no match has told the order yet: the seed's plan lists the files
            # as ImageFolder does, which the job may not.  Its first opens say, without waiting for the
            # cursor to call the seed a mismatch (which takes an epoch's worth of opens or more).
            self._want(self._order_trigger(seed))
            self._order_only = True

    @staticmethod
    def _order_trigger(seed: SeedState) -> str:
        return f"the {seed.origin} seed {seed.value}: which catalog order the job reads (no layout configured)"

    def _want(self, trigger: str) -> None:
        self._order_only = False  # a search for the order alone sets it after this
        self.trigger = trigger
        self._since = self.seed.version()
        self.note = None
        self.state = "waiting"
        self._wanted.set()

    def _adopt(self, value: int, since: tuple[int, int]) -> None:
        self.found_at_opens = len(self.opens)
        self._adopting = True
        try:
            self.seed.set(value, "discovered", since=since)
        finally:
            self._adopting = False

    # ------------------------------------------------------------------ the search task

    async def run(self) -> None:
        if not self.settings.enabled:
            return
        if self.seed.origin == "assumed":
            self._want("no seed written")  # the first search starts its own worker at once
        self._standby_wanted.set()  # and one waits for the next: a written seed's mismatch, say
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._keep_standby)
            await self._searches()

    async def _keep_standby(self) -> None:
        """Keep one search worker prepared and waiting for opens (see the module's docstring)."""
        delay = 0.0  # at mount: at once
        try:
            while True:
                await self._standby_wanted.wait()
                self._standby_wanted = trio.Event()
                await trio.sleep(delay)
                delay = STANDBY_AFTER
                if self._standby is None:
                    self._standby = await prepared_worker(WORKER, self._request())
        finally:
            waiting, self._standby = self._standby, None
            if waiting is not None:
                await stop_worker(waiting)

    def _request(self) -> bytes:
        """The search worker's first line: what it prepares before any open comes."""
        request = {
            "snapshot": str(self.snapshot_file),
            "config": self.config,
            "limit": self.settings.limit,
            "epoch_span": self.settings.epoch_span,
            "threshold": self.threshold,
        }
        return json.dumps(request).encode() + b"\n"

    async def _searches(self) -> None:
        while True:
            await self._wanted.wait()
            self._wanted = trio.Event()
            with trio.CancelScope() as scope:
                self._scope = scope
                try:
                    await self._search()
                except SearchFailed as exc:
                    self.state, self.message = "idle", str(exc)
                    log.warning("seed discovery failed: %s", exc)
                finally:
                    self._scope = None
            if scope.cancelled_caught:
                self.state = "stopped"

    async def _search(self) -> None:
        self.attempts += 1
        self._fed = self._recordings
        self.state, self.result, self.setup, self.progress = "preparing", None, {}, {}
        self.started_at = self.seconds = None
        self.message = None
        proc, self._standby = self._standby, None
        prepared = proc is not None
        self._standby_wanted.set()  # another, STANDBY_AFTER later, for a later search
        if proc is None:
            proc = await start_worker(WORKER)
        last: dict[str, Any] = {}
        try:
            assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._feed, proc.stdin, prepared)
                last = await self._follow(proc.stdout)
                nursery.cancel_scope.cancel()
            stderr = bytes(await proc.stderr.receive_some(65536))
            code = await proc.wait()
        finally:
            await stop_worker(proc)
        if last.get("phase") != "done":
            raise SearchFailed(failure_reason(last, stderr, code))
        self._finished(last)

    async def _feed(self, stdin: trio.abc.SendStream, prepared: bool) -> None:
        """The request (unless the worker was given it ahead), then the recorded opens as they come,
        until the worker searches."""
        if not prepared:
            await stdin.send_all(self._request())
        opens, sent = self.opens, 0  # this recording's list, even if a written seed starts another
        while self.state in ("preparing", "waiting"):
            if sent < len(opens):
                chunk, sent = opens[sent:], len(opens)
                await stdin.send_all(json.dumps({"opens": chunk}).encode() + b"\n")
            elif not self._recording or opens is not self.opens:
                await stdin.aclose()  # every open it will ever get: let it answer with what it has
                return
            else:
                await self._opens_changed.wait()
                self._opens_changed = trio.Event()
                await trio.sleep(FEED_INTERVAL)

    async def _follow(self, stdout: trio.abc.ReceiveStream) -> dict[str, Any]:
        """Take in the worker's progress lines until its last one."""
        last: dict[str, Any] = {}
        async with contextlib.aclosing(json_lines(stdout)) as lines:
            async for doc in lines:
                last = doc
                phase = doc.get("phase")
                if phase == "ready":
                    keys = ("dataset", "lead", "files", "sampler", "orders", "need", "planned", "likely")
                    self.setup = {k: doc.get(k) for k in keys}
                    self.state = "waiting"
                elif phase == "waiting":
                    self.progress = doc
                    self.state = "waiting"
                elif phase == "searching":
                    if self.state != "searching":
                        self.started_at = time.monotonic()
                        log.info("seed discovery: searching with %s opens", doc.get("opens"))
                    self.progress = doc
                    self.state = "searching"
                elif phase in ("done", "failed"):
                    return last
        return last

    def _finished(self, doc: dict[str, Any]) -> None:
        status = str(doc.get("status"))
        if self.started_at is not None:
            self.seconds = round(time.monotonic() - self.started_at, 3)
        self.result = {k: v for k, v in doc.items() if k not in ("phase", "t")}
        self._result_recording = self._fed
        log.info("seed discovery: %s (%s)", self.result.get("result"), self.trigger)
        if status == "found":
            self.state = "found"
            value = int(doc["seed"])
            if self.seed.version() != self._since:
                # A seed written here or on a peer after the search was asked for: it wins (the result
                # stays in status, and a later mismatch of that seed adopts it at once, see on_cursor).
                self.state = "stopped"
                newer = f"seed {self.seed.value} ({self.seed.origin})"
                self.note = f"dropped the match {value}: {newer} came after the search was asked for"
                self.superseded += 1
                log.info("seed discovery: dropped the match %d, seed %d came after the search", value, self.seed.value)
                return
            epoch = self._fits(value) if self.seed.origin != "assumed" else None
            reordered = self._tell_order(doc.get("order"))  # before the seed: its plan is made in this order
            if epoch is not None:
                where = f" in its epoch {epoch}" if epoch else ""
                if reordered:
                    self.note = (
                        f"the seed in use, {self.seed.value}, fits the opens{where} in the {doc.get('order')} "
                        "order: planned in that order"
                    )
                else:
                    self.note = (
                        f"the seed in use, {self.seed.value}, fits the opens{where}: the mismatch has another cause"
                    )
                return
            if self._order_only:
                # Asked only which order the written seed is read in: another seed fits, so the written
                # one is wrong, but that is for the cursor to say; a mismatch then adopts this answer.
                self.note = f"the opens fit {value}, not the {self.seed.origin} seed {self.seed.value}"
                return
            self._adopt(value, self._since)
        elif status == "not_searchable":
            self.state = "not_searchable"
        else:
            self.state = "not_found"  # not_found, or too_few_opens with every open the mount recorded

    def _tell_order(self, order: object) -> bool:
        """Hand a match's catalog order to ``on_order``: for the lead and for every dataset without a
        configured layout (one training script lists all its datasets alike).  Returns whether it
        differs from the order told before (at first: the lead's configured layout or imagefolder)."""
        lead = self.setup.get("lead")
        if not isinstance(order, str) or not isinstance(lead, int) or self.on_order is None:
            return False
        datasets = self.config["datasets"]
        before, self.order = self.order or datasets[lead].get("layout") or DEFAULT_LAYOUT, order
        if order == before:
            return False
        for i, ds in enumerate(datasets):
            if ds.get("layout") is None or i == lead:
                self.on_order(i, order)
        return True

    # ------------------------------------------------------------------ status

    def explained(self, cursor: CursorStatus | None) -> CursorStatus | None:
        """The cursor's section, a mismatch of the lead dataset told what seed discovery found.

        The cursor alone can only say that the opens fit another order than the plan's; whether the
        seed, the catalog order or the sampler differs, and whether any modelled order fits at all,
        is what the search tells: a person reads one sentence, not "wrong seed" for a job whose order
        seerfs does not model."""
        if cursor is None or cursor["mismatch_kind"] != "wrong_seed" or not cursor["mismatch_reason"]:
            return cursor
        lead = next((ds for ds in cursor["datasets"] if ds["lead"]), None)
        said = self.verdict()
        if said is None or lead is None or lead["mismatch_kind"] != "wrong_seed":
            return cursor
        out = cursor.copy()
        out["mismatch_reason"] = f"{cursor['mismatch_reason']}; seed discovery: {said}"
        return out

    def verdict(self) -> str | None:
        """What seed discovery says of the lead dataset's order, for a mismatch's reason (None: nothing yet)."""
        r = self.result or {}
        if self.state == "off":
            return (
                "off: write the sampler's seed to .control/seed, and set datasets.N.layout if the dataset is not "
                "listed as ImageFolder lists it"
            )
        if self.state in ("waiting", "preparing", "searching"):
            return "searching the opens for the job's seed and catalog order"
        if self.state == "not_found":
            return f"{r.get('result')}: served as without a seed (discovery.reason says what decides the order)"
        if self.state in ("not_searchable", "found"):
            return f"{r.get('result')}{f'; {self.note}' if self.note else ''}"
        return self.note

    def status(self) -> DiscoveryStatus:
        r = self.result or {}
        p = self.progress
        tried = r.get("candidates_tried", p.get("tried"))
        planned = r.get("candidates_planned", p.get("planned", self.setup.get("planned")))
        running = self.state == "searching" and self.started_at is not None
        return {
            "enabled": self.settings.enabled,
            "state": self.state,
            "trigger": self.trigger,
            "result": r.get("result"),
            "seed": r.get("seed"),
            "identifies": r.get("identifies"),
            "sampler": r.get("sampler"),
            "order": r.get("order"),
            "orders": _joined(r.get("orders", self.setup.get("orders"))),
            "node": r.get("node"),
            "dataset": self.setup.get("dataset"),
            "files": self.setup.get("files"),
            "opens_recorded": len(self.opens),
            "opens_needed": p.get("need", self.setup.get("need")),
            "opens_used": r.get("opens", p.get("opens")),
            "hits": r.get("hits"),
            "candidates_tried": tried,
            "candidates_planned": planned,
            "likely_candidates": self.setup.get("likely"),
            "tier": p.get("tier") if self.state == "searching" else None,
            "fraction": round(tried / planned, 4) if isinstance(tried, int) and planned else None,
            "false_match_chance": r.get("false_match_chance"),
            "best_chance": r.get("best_chance"),
            "threshold": self.threshold,
            "seconds": round(time.monotonic() - self.started_at, 3) if running and self.started_at else self.seconds,
            "cpu_seconds": r.get("cpu_seconds"),
            "found_at_opens": self.found_at_opens,
            "attempts": self.attempts,
            "superseded": self.superseded,
            "reason": r.get("reason") or p.get("reason"),
            "note": self.note,
            "message": self.message,
            "limit": self.settings.limit,
        }


def _joined(names: object) -> str | None:
    return ", ".join(str(x) for x in names) if isinstance(names, list) else None


class SearchFailed(Exception):
    """The search worker failed (the message is one line for status)."""
