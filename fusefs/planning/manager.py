"""Keeping a plan for the current seed: built in a subprocess, cached on disk, replaced on re-seed.

Concurrency rules:
* One planning task.  A new seed cancels the plan being built (the subprocess is killed) and starts
  over, so a stale plan is never adopted after a newer seed was written.
* ``plan`` is replaced in one assignment on the trio thread; readers take a local reference and
  keep using that plan object for the whole of their step.
* Loading a saved plan (memory maps) runs in a thread; building never runs in the daemon.
* At most one stand-by worker: ``_standby`` is taken (set to None) in the same step as the planning
  task writes its request, and given back in the same step as the task reads the request's
  ``done`` (a worker serves plan after plan, its snapshot loaded once, at mount).  A build
  cancelled by a newer seed, or a failed one, kills its worker; the keeping task starts another
  only when none waits and no plan is being built, and kills the one waiting when the daemon
  stops.  A worker whose daemon died reads the end of its input and exits.

Where the last plan took long to compute, the near horizon comes first (:meth:`PlanManager._near`):
the seed's first epoch alone, planned in a fraction of the time and handed to the listener, which
the full plan then replaces.  Only on one node: a group's members must agree on one plan's owners.

A cached plan is used only after its digest checks (:func:`fusefs.planning.store.load_plan`); one
that fails is deleted, named in status (``cache_refused``) and planned again.  No error of the cache
directory (a full disk, say) stops the daemon: the plan fails with a one-line message in status and
the mount keeps serving without one.
"""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal, TypedDict

import trio

from fusefs.config import Config
from fusefs.planning.inputs import plan_key, planning_config
from fusefs.planning.store import load_plan
from fusefs.planning.workerproc import failure_reason, json_lines, prepared_worker, start_worker, stop_worker
from fusefs.progress import Progress
from placement.plan import Plan
from placement.statusfields import gauge, info, state, text

log = logging.getLogger(__name__)

KEEP_PLANS = 4
STALE_WRITE_S = 600.0
"""A plan's temporary directory untouched this long is a killed writer's (saving takes seconds)."""
WORKER = "fusefs.planning.worker"
STANDBY_AFTER = 30.0
"""Seconds after a plan for which the stand-by was lost (killed by a newer seed, or failed) before
another starts while a job runs."""
NEAR_AFTER_S = 1.0
"""A plan whose last build here took this long is preceded by its near horizon's (one epoch)."""
NEAR_SUFFIX = "-near"
"""The near-horizon plan's directory: the full plan's, with this suffix."""
LAST_BUILD = "last_build.json"
"""How long the last plan built under this plans directory took, for how many files: the remaining
time of the next build is estimated from it (status ``progress.plan.eta_s``)."""


def load_daemon_plan(directory: Path, node: int | None = None) -> Plan:
    """Plans in the daemon compute epochs with numpy: importing torch would hold the GIL for a second
    or more, stalling every FUSE request, and one numpy permutation per epoch is cheap enough.

    ``node``: the training node this daemon presumes to be.  A per-node plan saved by another node
    (daemons sharing ``cache_dir`` share plan directories) lacks this node's part; it is computed here,
    in the loading thread (a pass over the job's permutations), not later on the FUSE loop."""
    plan = load_plan(directory, backend="numpy")
    if node is not None and plan.per_node and 0 <= node < plan.nodes:
        plan.node_part(node)
    return plan


PlanState = Literal["idle", "planning", "ready", "failed"]


class PlanStatus(TypedDict):
    """Status section ``plan``: the placement plan for the current seed, built in a subprocess."""

    state: Annotated[PlanState, state("idle, planning, ready or failed")]
    seed: Annotated[int | None, info("the seed it is (being) planned for; null before any")]
    progress: Annotated[str, text("the planning phase")]
    digest: Annotated[
        str | None, info("xxh3 over the plan's inputs and outputs, equal on every node that agrees; null unless ready")
    ]
    reused: Annotated[
        bool,
        gauge(
            "a plan cached under the cache directory for the same snapshot, configuration and seed was "
            "loaded instead of built"
        ),
    ]
    seconds: Annotated[float, gauge("time planning took (while planning: so far)")]
    message: Annotated[str | None, text("why planning failed, or null")]
    cache_refused: Annotated[
        str | None,
        text(
            "why the last cached plan looked at was refused (another format, or its digest over every "
            "column did not match) and planned again; null when none was"
        ),
    ]
    nodes: Annotated[int | None, gauge("nodes the plan is for (null unless ready)")]
    files: Annotated[int | None, gauge("files the plan places, over every dataset (null unless ready)")]


class PlanManager:
    def __init__(
        self,
        snapshot_file: Path,
        fingerprint: str,
        cfg: Config,
        plans_dir: Path,
        on_plan: Callable[[Plan | None], None] | None = None,
        node_hint: Callable[[], int | None] | None = None,
    ) -> None:
        """``on_plan``: told of every plan made or reused (None: a failed one); the daemon's
        prefetcher follows it.  ``node_hint``: the training node this daemon presumes to be (its group
        index), for which a per-node plan computes its part while planning (None: node 0)."""
        self.snapshot_file = snapshot_file
        self.fingerprint = fingerprint
        self.config = planning_config(cfg)
        self.plans_dir = plans_dir
        self.plan: Plan | None = None
        self.state: PlanState = "idle"
        self.seed: int | None = None
        self.phase = ""
        self.message: str | None = None
        self.started = 0.0
        self.seconds = 0.0
        self.reused = False
        self.refused: str | None = None  # why the last cached plan looked at was not used
        self.near_seconds: float | None = None  # from the request to the last near-horizon plan handed on
        self.on_plan = on_plan
        self.node_hint = node_hint
        self.progress = Progress("plan", "files")
        self._wanted: int | None = None
        self._wakeup = trio.Event()
        self._standby: trio.Process | None = None  # a worker started and waiting for its request
        self._standby_wanted = trio.Event()
        self._standby_lost = False  # a plan's worker was killed or failed: the next stand-by waits STANDBY_AFTER

    def request(self, seed: int) -> None:
        """Plan for ``seed`` (cancelling a plan in progress for another seed)."""
        if seed == self._wanted and self.state in ("planning", "ready"):
            return
        self._wanted = seed
        self._wakeup.set()

    def use_layout(self, dataset: int, layout: str) -> None:
        """Plan dataset ``dataset`` in catalog order ``layout`` from now on (seed discovery found the
        job reading it): a plan for the old order is replanned, whatever its seed."""
        datasets = self.config["datasets"]
        if datasets[dataset].get("layout") == layout:
            return
        datasets = [*datasets]
        datasets[dataset] = {**datasets[dataset], "layout": layout}
        self.config = {**self.config, "datasets": datasets}
        log.info("dataset %s is read in the %s order: planning it so", datasets[dataset]["root"], layout)
        if self._wanted is not None:
            self._wakeup.set()

    async def run(self) -> None:
        self._standby_wanted.set()  # at mount: the first seed, written or found, finds it loaded
        async with trio.open_nursery() as standby:
            standby.start_soon(self._keep_standby)
            while True:
                await self._wakeup.wait()
                self._wakeup = trio.Event()
                seed = self._wanted
                assert seed is not None
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._plan, seed, nursery.cancel_scope)
                    await self._wakeup.wait()  # a newer seed: abandon this plan
                    nursery.cancel_scope.cancel()

    async def _plan(self, seed: int, scope: trio.CancelScope) -> None:
        self.state, self.seed, self.phase, self.message = "planning", seed, "starting", None
        self.started = time.monotonic()
        self.progress.start("starting", detail=f"seed {seed}")
        out = self.plans_dir / plan_key(self.fingerprint, self.config, seed)
        try:
            plan = await self._cached(out)
            self.reused = plan is not None
            if plan is None:
                if (last := self._last_build()) is not None:
                    self.progress.expect(last[0])  # until the worker names the file count
                try:
                    if self._near_worth_it():
                        await self._near(seed, out)
                    plan = await self._build(seed, out)
                except OSError as exc:  # the request file or the plans directory: e.g. cache_dir full
                    raise PlanFailed(f"cannot write in {self.plans_dir}: {exc.strerror or exc}") from None
        except PlanFailed as exc:
            self.state, self.message = "failed", str(exc)
            self.progress.finish("failed", detail=f"seed {seed}: {exc}")
            log.warning("planning for seed %d failed: %s", seed, exc)
            self._notify(None)
            return
        self.plan = plan
        self.state, self.phase = "ready", "done"
        self.seconds = time.monotonic() - self.started
        self.progress.finish(done=plan.files, detail=f"seed {seed}{', reused' if self.reused else ''}")
        log.info(
            "plan for seed %d ready (digest %s, %.2fs%s)",
            seed,
            plan.digest,
            self.seconds,
            ", reused" if self.reused else "",
        )
        try:
            self._prune(keep=out)
        except OSError as exc:
            log.warning("cannot prune old plans in %s: %s", self.plans_dir, exc.strerror or exc)
        self._notify(plan)
        self._standby_wanted.set()

    def _node(self) -> int | None:
        return None if self.node_hint is None else self.node_hint()

    def _notify(self, plan: Plan | None) -> None:
        if self.on_plan is not None:
            self.on_plan(plan)

    async def _cached(self, out: Path) -> Plan | None:
        if not (out / "plan.json").exists():
            return None
        try:
            return await trio.to_thread.run_sync(load_daemon_plan, out, self._node())
        except ValueError as exc:
            self.refused = str(exc)
            log.warning("cached plan refused: %s; planning again", exc)
            shutil.rmtree(out, ignore_errors=True)
            return None

    def _near_worth_it(self) -> bool:
        """Whether to plan the near horizon first: the last plan here took over :data:`NEAR_AFTER_S`
        to compute (the job's epochs multiply it), the plan spans several epochs, and one node plans alone (in a
        group every node must follow the plan whose digest and owners they agree on)."""
        job = self.config["job"]
        try:  # the worker's own planning time: a Python start or a busy node's wait is not the plan's
            last = json.loads((self.plans_dir / LAST_BUILD).read_text())
            planning = float(last.get("planning_s") or last["seconds"])
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return False
        return (
            planning >= NEAR_AFTER_S and int(job["epochs"]) > 1 and int(job["world_size"]) == int(job["ranks_per_node"])
        )

    async def _near(self, seed: int, out: Path) -> None:
        """The near horizon's plan (one epoch: the seed's epoch 0, whose first batches the local ranks
        read next), built and handed to the listener before the full plan, which replaces it; the
        status keeps saying planning until then.  A failed near plan only costs its time."""
        near_out = out.with_name(out.name + NEAR_SUFFIX)
        config = {**self.config, "job": {**self.config["job"], "epochs": 1}}
        near = await self._cached(near_out)
        if near is None:
            try:
                near = await self._build(seed, near_out, config)
            except PlanFailed as exc:
                log.info("near-horizon plan for seed %d failed (%s); the full plan follows", seed, exc)
                return
        self.near_seconds = time.monotonic() - self.started
        log.info("near-horizon plan for seed %d ready (%.2fs)", seed, self.near_seconds)
        self._notify(near)

    async def _build(self, seed: int, out: Path, config: dict[str, Any] | None = None) -> Plan:
        """Build a plan in the worker; ``config``: another than the daemon's (the near horizon's)."""
        full, began = config is None, time.monotonic()
        out.parent.mkdir(parents=True, exist_ok=True)
        request = {
            "snapshot": str(self.snapshot_file),
            "config": config or self.config,
            "seed": seed,
            "out": str(out),
            "node": self._node(),
        }
        proc = await self._worker_for(json.dumps(request).encode() + b"\n")
        last: dict[str, Any] = {}
        stderr: bytes = b""
        code: int | None = None
        kept = False
        try:
            assert proc.stdout is not None and proc.stderr is not None
            last = await self._answer(seed, proc.stdout)
            if last.get("phase") == "done" and self._standby is None:
                self._standby, kept = proc, True  # it waits for the next request, snapshot loaded
            elif last.get("phase") != "done":
                stderr = bytes(await proc.stderr.receive_some(65536))
                code = await proc.wait()
        finally:
            if not kept:
                self._standby_lost = True  # killed by a newer seed, or failed: another comes later
                await stop_worker(proc)
        if last.get("phase") != "done":
            # Nothing to remove: the worker wrote into its own temporary directory (removed by it, or,
            # if it was killed, by _prune), and ``out``, if there, is another daemon's whole plan.
            raise PlanFailed(failure_reason(last, stderr, code))
        try:
            plan = await trio.to_thread.run_sync(load_daemon_plan, out, self._node())
        except ValueError as exc:
            raise PlanFailed(str(exc)) from None
        if full:
            worker_s = last.get("seconds")  # the planning alone, as the worker timed it
            self._record_build(
                time.monotonic() - began, plan.files, worker_s if isinstance(worker_s, (int, float)) else None
            )
        return plan

    async def _answer(self, seed: int, stdout: trio.abc.ReceiveStream) -> dict[str, Any]:
        """The worker's lines for one request, up to its ``done`` or ``failed`` (or its end)."""
        last: dict[str, Any] = {}
        async with contextlib.aclosing(json_lines(stdout)) as lines:
            async for doc in lines:
                if doc.get("phase") in ("standing by", "loaded"):
                    continue
                last = doc
                self.phase = str(last.get("phase", ""))
                if self.phase in ("done", "failed"):
                    return last
                self._follow(seed, last)
        return last

    async def _worker_for(self, request: bytes) -> trio.Process:
        """The stand-by worker if one is waiting (else a new one), given ``request``: the caller owns it."""
        proc, self._standby = self._standby, None
        for fresh in (proc is None, True):
            if fresh:
                proc = await start_worker(WORKER)
            assert proc is not None and proc.stdin is not None
            try:
                await proc.stdin.send_all(request)
                return proc
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                await stop_worker(proc)  # a stand-by that died while waiting: start one that did not
            except BaseException:  # cancelled (a newer seed): the caller never got it to stop
                await stop_worker(proc)
                raise
        raise PlanFailed("the plan worker closed its input before taking the request")

    async def _keep_standby(self) -> None:
        """Keep one plan worker started, its snapshot loaded, and waiting for a request (see
        :mod:`fusefs.planning.worker`).

        One starts at mount and serves every plan after.  When a plan lost it (a newer seed killed
        the build, or it failed), another starts :data:`STANDBY_AFTER` seconds after that plan,
        which a written or found seed started while the job's ranks were starting: that is the
        moment a Python start on their cores costs most, and a second seed that soon is rare (it
        starts a worker as it comes, no slower).
        """
        try:
            while True:
                await self._standby_wanted.wait()
                self._standby_wanted = trio.Event()
                if self._standby_lost:
                    self._standby_lost = False
                    await trio.sleep(STANDBY_AFTER)
                if self._standby is None and self.state != "planning":  # else the plan's end asks again
                    # loads the snapshot now, not when the seed comes
                    load = json.dumps({"snapshot": str(self.snapshot_file)}).encode() + b"\n"
                    self._standby = await prepared_worker(WORKER, load)
        finally:
            waiting, self._standby = self._standby, None
            if waiting is not None:
                await stop_worker(waiting)

    def _last_build(self) -> tuple[float, int] | None:
        """(seconds, files) of the last plan built under this directory, if one was."""
        try:
            last = json.loads((self.plans_dir / LAST_BUILD).read_text())
            return float(last["seconds"]), int(last["files"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def _follow(self, seed: int, line: dict[str, Any]) -> None:
        """One progress line of the worker: its phase, and once it names the file count, the estimate
        of the whole build (the last build's time) scaled by files."""
        files = line.get("files")
        if not isinstance(files, int):
            self.progress.set_phase(self.phase)
            return
        self.progress.set_phase(self.phase, detail=f"seed {seed}, {files:,} files")
        last = self._last_build()
        if last is not None and last[1] > 0:
            self.progress.expect(last[0] * files / last[1])

    def _record_build(self, seconds: float, files: int, planning: float | None) -> None:
        record = {"seconds": round(seconds, 3), "files": files, "planning_s": planning}
        try:
            (self.plans_dir / LAST_BUILD).write_text(json.dumps(record))
        except OSError as exc:  # only the next estimate is lost
            log.debug("%s not written: %s", LAST_BUILD, exc)

    def _prune(self, keep: Path) -> None:
        """Keep the newest plans; remove temporary directories old enough to be a killed writer's
        (a plan for a seed replaced meanwhile), never one a writer may still be filling."""
        now = time.time()
        plans: list[tuple[float, Path]] = []
        for p in self.plans_dir.iterdir():
            try:
                if not p.is_dir() or p == keep:
                    continue
                mtime = p.stat().st_mtime
            except FileNotFoundError:
                continue  # another daemon sharing this cache_dir removed or renamed it meanwhile
            if p.name.startswith("."):
                if now - mtime > STALE_WRITE_S:
                    shutil.rmtree(p, ignore_errors=True)
                continue
            plans.append((mtime, p))
        plans.sort(reverse=True)
        for _mtime, old in plans[KEEP_PLANS - 1 :]:
            shutil.rmtree(old, ignore_errors=True)

    def status(self) -> PlanStatus:
        ready = self.plan if self.plan is not None and self.state == "ready" else None
        return {
            "state": self.state,
            "seed": self.seed,
            "progress": self.phase,
            "digest": ready.digest if ready is not None else None,
            "reused": self.reused,
            "seconds": round(self.seconds if self.state != "planning" else time.monotonic() - self.started, 3),
            "message": self.message,
            "cache_refused": self.refused,
            "nodes": int(ready.summary()["nodes"]) if ready is not None else None,
            "files": ready.files if ready is not None else None,
        }


class PlanFailed(Exception):
    """Planning could not produce a plan (the message is one line for status)."""
