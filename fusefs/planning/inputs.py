"""Everything a plan is computed from, in one place: the daemon, the plan worker, ``seerfs plan`` and
the benchmarks all plan through here, so they compute the same plan and report the same digest.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import xxhash

from fusefs.errors import ConfigError

if TYPE_CHECKING:
    from fusefs.config import Config
    from fusefs.meta.snapshot import Snapshot
    from placement.plan import Plan, PlanPhase
    from placement.randperm import Backend


def planning_config(cfg: Config) -> dict[str, Any]:
    """The config the planner sees: memory tiers lose the share the staging window keeps.

    Staging and the memory tier charge one budget; the planner must only give long-term files the
    part staging does not need, or staging would find no room.  Every node derives the same mapping.
    """
    data = cfg.to_dict()
    lookahead = cfg.prefetch.lookahead_bytes
    for tier in data["tiers"]:
        if tier["kind"] == "memory" and lookahead:
            take = min(lookahead, tier["bytes"])
            tier["bytes"] -= take
            lookahead -= take
    return data


def plan_key(fingerprint: str, config: dict[str, Any], seed: int) -> str:
    h = xxhash.xxh3_128()
    h.update(json.dumps({"fingerprint": fingerprint, "config": config, "seed": seed}, sort_keys=True).encode())
    return h.hexdigest()[:24]


def _read_lines(base: bytes, name: str, key: str) -> list[str]:
    path = name if os.path.isabs(name) else os.path.join(os.fsdecode(base), name)
    try:
        with open(path, encoding="utf-8", errors="surrogateescape") as fh:
            return [line.rstrip("\n") for line in fh]
    except OSError as exc:
        raise ConfigError(f"{key}: cannot read {path}: {exc.strerror}") from None


def side_inputs(
    datasets: Sequence[Mapping[str, Any]], source: bytes
) -> tuple[dict[int, list[str]], dict[int, list[int]]]:
    """Contents of list_file and order_file (the planner does no I/O); shared with the plan worker."""
    lists: dict[int, list[str]] = {}
    orders: dict[int, list[int]] = {}
    for i, ds in enumerate(datasets):
        if ds["layout"] == "list" and ds["list_file"]:
            lists[i] = _read_lines(source, ds["list_file"], f"datasets.{i}.list_file")
        if ds["sampler"]["kind"] == "list" and ds["sampler"]["order_file"]:
            key = f"datasets.{i}.sampler.order_file"
            lines = [x.strip() for x in _read_lines(source, ds["sampler"]["order_file"], key) if x.strip()]
            try:
                orders[i] = [int(x) for x in lines]
            except ValueError:
                raise ConfigError(f"{key}: expected one integer dataset index per line") from None
    return lists, orders


class PlanTimer:
    """Wall time of each step of :meth:`placement.plan.Plan.from_catalogs`, taken here because
    placement reads no clock: pass it as ``phases``, then :meth:`stamp` the plan's summary."""

    def __init__(self) -> None:
        self.started: dict[PlanPhase, float] = {}

    def __call__(self, phase: PlanPhase) -> None:
        self.started[phase] = time.monotonic()

    def fields(self) -> dict[str, Any]:
        """``plan_seconds`` (catalogs excluded) and the ``timings`` of the access pass, the
        assignment and the summary, as ``seerfs plan``, the plan worker and ``tools/bench/plan`` show them."""
        t = self.started
        return {
            "plan_seconds": round(t["done"] - t["streams"], 3),
            "timings": {
                "access_s": round(t["assign"] - t["access"], 3),
                "assign_s": round(t["summary"] - t["assign"], 3),
                "summary_s": round(t["done"] - t["summary"], 3),
            },
        }

    def stamp(self, plan: Plan) -> Plan:
        """``plan`` with :meth:`fields` added to its summary (persisted with it, never digested)."""
        plan.summary().update(self.fields())
        return plan


PLAN_THREADS = 2
"""Threads a plan's independent numpy passes run in (:mod:`placement.parallel`): a second one saves
about a third of the access pass (``tools/bench/plan``); the plan worker shares the node's cores."""


@contextlib.contextmanager
def plan_pool(threads: int | None = None) -> Iterator[tuple[ThreadPoolExecutor | None, int]]:
    """``(pool, width)`` for :meth:`placement.plan.Plan.build`: ``threads`` of them (default: up to
    :data:`PLAN_THREADS`, as the machine's cores allow), or ``(None, 1)`` for 1 or fewer (the calling
    thread does everything).  The cores are counted here because placement may not look at the machine:
    the plan must not depend on which one makes it (``tests/test_layering.py``)."""
    width = min(PLAN_THREADS, os.cpu_count() or 1) if threads is None else threads
    if width <= 1:
        yield None, 1
        return
    with ThreadPoolExecutor(max_workers=width, thread_name_prefix="seerfs-plan") as pool:
        yield pool, width


def build_plan(
    snapshot: Snapshot, config: Mapping[str, Any], seed: int, backend: Backend = "auto", node: int | None = None
) -> Plan:
    """The plan for ``seed`` over ``snapshot`` (``config`` from :func:`planning_config`), its
    summary carrying how long planning took (:class:`PlanTimer`).  ``node``: the node a per-node
    plan is made for (:meth:`placement.plan.Plan.from_catalogs`); the digest does not depend on it."""
    from placement.plan import Plan

    lists, orders = side_inputs(config["datasets"], snapshot.source)
    timer = PlanTimer()
    with plan_pool() as (pool, width):
        plan = Plan.build(
            snapshot.tree,
            config,
            seed,
            lists=lists,
            orders=orders,
            backend=backend,
            pool=pool,
            width=width,
            phases=timer,
            node=node,
        )
    return timer.stamp(plan)
