"""Everything a plan is computed from, in one place: the daemon, the plan worker, ``seerfs plan`` and
the benchmarks all plan through here, so they compute the same plan and report the same digest.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import xxhash

from fusefs.errors import ConfigError

if TYPE_CHECKING:
    from fusefs.config import Config
    from fusefs.meta.snapshot import Snapshot
    from placement.plan import Plan
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


def build_plan(snapshot: Snapshot, config: Mapping[str, Any], seed: int, backend: Backend = "auto") -> Plan:
    """The plan for ``seed`` over ``snapshot`` (``config`` from :func:`planning_config`)."""
    from placement.plan import Plan

    lists, orders = side_inputs(config["datasets"], snapshot.source)
    return Plan.build(snapshot.tree, config, seed, lists=lists, orders=orders, backend=backend)
