"""The near horizon's plan: when the last build took long, one epoch's plan (the seed's epoch 0, the
batches the local ranks read next) is handed to the prefetcher before the full plan replaces it.

In-process: a real :class:`PlanManager` under trio, its plan worker a real subprocess over a real
snapshot; the plans handed on are compared with each other, not with the manager's own account.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import trio

from fusefs import config as cfgmod
from fusefs.meta.snapshot import load_or_scan, snapshot_file
from fusefs.planning.manager import LAST_BUILD, NEAR_AFTER_S, PlanManager
from placement.plan import Plan


def plans_handed_on(tmp_path: Path, last_build_s: float | None, world: int = 2) -> list[Plan | None]:
    src = tmp_path / "src"
    for c in range(3):
        (src / f"c{c}").mkdir(parents=True)
        for i in range(50):
            (src / f"c{c}" / f"{i}.jpg").write_bytes(os.urandom(500 + i))
    cache = tmp_path / "cache"
    snap, _ = load_or_scan(str(src), cache)
    plans_dir = cache / "plans"
    plans_dir.mkdir(parents=True)
    if last_build_s is not None:
        (plans_dir / LAST_BUILD).write_text(json.dumps({"seconds": last_build_s, "files": 150}))
    cfg = cfgmod.load(None, {"job.world_size": str(world), "job.ranks_per_node": "2", "job.epochs": "4"})
    got: list[Plan | None] = []

    async def main() -> None:
        manager = PlanManager(snapshot_file(cache, snap.source), snap.fingerprint, cfg, plans_dir, on_plan=got.append)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(manager.run)
            manager.request(5)
            with trio.fail_after(180):
                while manager.state != "ready" or manager.seed != 5:
                    assert manager.state != "failed", manager.message
                    await trio.sleep(0.05)
            nursery.cancel_scope.cancel()

    trio.run(main)
    return got


def lead_order(plan: Plan, epoch: int) -> np.ndarray:
    js = plan.job_streams()
    return np.asarray(js.node_stream(epoch, 0))


def test_a_slow_last_build_hands_on_the_near_horizon_first(tmp_path: Path) -> None:
    got = plans_handed_on(tmp_path, last_build_s=NEAR_AFTER_S + 1)
    assert len(got) == 2 and all(p is not None for p in got), got
    near, full = got
    assert near is not None and full is not None
    assert (near.epochs, full.epochs) == (1, 4)
    # the near horizon is the full plan's first epoch, file for file, in the order the node reads it
    assert np.array_equal(lead_order(near, 0), lead_order(full, 0))


def test_a_quick_last_build_or_a_group_plans_once(tmp_path: Path) -> None:
    assert [p.epochs for p in plans_handed_on(tmp_path / "quick", last_build_s=0.1) if p] == [4]
    assert [p.epochs for p in plans_handed_on(tmp_path / "first", last_build_s=None) if p] == [4]
    assert [p.epochs for p in plans_handed_on(tmp_path / "group", last_build_s=9.0, world=4) if p] == [4]
