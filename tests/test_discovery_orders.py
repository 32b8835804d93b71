"""Seed discovery over the catalog orders training code uses, when the config names none.

The tree below lists differently in each modelled order (ImageFolder sorts ``c10`` before ``c2`` and
``img_10`` before ``img_2``; timm sorts both naturally; ``files`` keeps a stray text file).  The opens
come from torch's own DistributedSampler over the order timm's reader gives (the timm_folder catalog,
checked against timm in test_catalog.py), or from a list the "script" shuffled itself.  Checked: the
order is named and handed to the planner before the seed; an order seerfs does not model costs the
likely seeds of each order only and says so; messages say what decides the order and what to write.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import trio
from indices import Indices
from test_cursor import Loop, replay, settings, training
from test_cursor import plan as cursor_plan
from torch.utils.data import DistributedSampler

from fusefs import config as cfgmod
from fusefs.meta.snapshot import load_or_scan, snapshot_file
from fusefs.planning.discovery import SeedDiscovery
from fusefs.planning.inputs import plan_key
from fusefs.planning.manager import PlanManager
from fusefs.planning.seed import SeedState
from placement import discovery as dv
from placement import seedsearch as ss
from placement.catalog import build_catalog
from placement.cursor import NodeCursor
from placement.plan import job_streams_of
from placement.searchramp import FIRST

ROOT = Path(__file__).resolve().parent.parent
CLASSES, PER_CLASS = 12, 50
CONFIG = {"datasets.0.root": "train", "job.world_size": "4", "job.ranks_per_node": "2", "job.batch_size": "8"}


def config_dict(**overrides: str) -> dict[str, Any]:
    return cfgmod.load(None, {**CONFIG, **overrides}).to_dict()


@pytest.fixture(scope="module")
def snapshot(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    root = tmp_path_factory.mktemp("orders") / "data"
    for c in range(CLASSES):
        (root / "train" / f"c{c}").mkdir(parents=True)
        for i in range(PER_CLASS):
            (root / "train" / f"c{c}" / f"img_{i}.jpg").write_bytes(b"x" * (100 + i))
    (root / "train" / "README.txt").write_text("not an image")
    cache = root.parent / "cache"
    snap, _ = load_or_scan(str(root), cache)
    return snapshot_file(cache, snap.source), snap


def node_opens(order: list[int], seed: int, epoch: int = 0, batch: int = 8) -> list[int]:
    """Node 1's (ranks 2 and 3 of 4) first batches from torch's DistributedSampler, ranks alternating,
    as dataset indices of ``order`` (the list the training code's Dataset indexes)."""
    rows = []
    for r in (2, 3):
        s: Any = DistributedSampler(Indices(len(order)), num_replicas=4, rank=r, seed=seed)
        s.set_epoch(epoch)
        rows.append([order[int(i)] for i in list(s)[: 6 * batch]])
    return [f for pair in zip(*rows, strict=True) for f in pair]


def run_worker(snap_file: Path, cfg: dict[str, Any], entries: list[int]) -> list[dict[str, Any]]:
    request = {"snapshot": str(snap_file), "config": cfg, "limit": 1 << 24, "epoch_span": 1000, "threshold": 1e-6}
    lines = [json.dumps(request)] + [json.dumps({"opens": entries[i : i + 7]}) for i in range(0, len(entries), 7)]
    proc = subprocess.run(
        [sys.executable, "-m", "fusefs.planning.search_worker"],
        input="\n".join(lines) + "\n",
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return [json.loads(line) for line in proc.stdout.splitlines()]


def catalog_entries(snap: Any, layout: str) -> list[int]:
    return [int(e) for e in build_catalog(snap.tree, "train", layout).entry]


def test_the_orders_differ_in_this_tree(snapshot: tuple[Path, Any]) -> None:
    _snap_file, snap = snapshot
    lists = [catalog_entries(snap, layout) for layout in dv.MODELLED_ORDERS]
    assert len({tuple(x) for x in lists}) == 3 and len(lists[2]) == len(lists[0]) + 1  # README.txt


def test_a_timm_order_is_found_and_named(snapshot: tuple[Path, Any]) -> None:
    snap_file, snap = snapshot
    entries = node_opens(catalog_entries(snap, "timm_folder"), seed=42)
    out = run_worker(snap_file, config_dict(), entries)
    ready, done = out[1], out[-1]
    assert ready["orders"] == ["imagefolder", "timm_folder", "files"] and ready["lead"] == 0
    likely = len(dv.candidates(1 << 16, 1000)[0])
    assert ready["planned"] == ready["likely"] == 3 * likely  # no layout given: the likely seeds only
    assert (done["status"], done["seed"], done["order"], done["node"]) == ("found", 42, "timm_folder", 1), done
    assert done["result"] == "seed+epoch = 42 (DistributedSampler, node 1, timm_folder order)"
    assert done["false_match_chance"] < 1e-6
    # the orders' likely seeds take turns, a chunk each: 42 is in every order's first chunk, so it is found
    # after imagefolder's first chunk and timm_folder's, not after imagefolder's whole likely tier
    assert done["candidates_tried"] == 2 * FIRST, done


def test_an_order_no_model_has_costs_the_likely_seeds_and_says_so(snapshot: tuple[Path, Any]) -> None:
    """The script shuffled its file list once (any RNG) and reads it with DistributedSampler(seed=0):
    no modelled order explains it.  Each order's likely seeds are tried, never the range."""
    snap_file, snap = snapshot
    shuffled = catalog_entries(snap, "imagefolder")
    np.random.default_rng(2024).shuffle(shuffled)
    out = run_worker(snap_file, config_dict(), node_opens(shuffled, seed=0))
    done = out[-1]
    assert (done["status"], done["seed"], done["order"]) == ("not_found", None, None), done
    likely = len(dv.candidates(1 << 16, 1000)[0])
    assert done["candidates_tried"] == done["candidates_planned"] == 3 * likely
    assert done["result"] == f"{dv.NO_ORDER_FITS} (tried imagefolder, timm_folder, files with the likely seeds)"
    assert "write the seed" in done["reason"] and "shuffles itself" in done["reason"], done["reason"]
    assert done["best_chance"] > 1e-6
    assert all(d.get("tier", "likely") == "likely" for d in out if d["phase"] == "searching")


def test_a_configured_layout_is_the_only_order_and_gets_the_range(snapshot: tuple[Path, Any]) -> None:
    snap_file, snap = snapshot
    cfg = config_dict(**{"datasets.0.layout": "timm_folder"})
    out = run_worker(snap_file, cfg, node_opens(catalog_entries(snap, "timm_folder"), seed=7))
    assert out[1]["orders"] == ["timm_folder"] and out[1]["planned"] == len(ss.default_candidates())
    assert (out[-1]["seed"], out[-1]["order"]) == (7, "timm_folder")
    assert dv.range_orders(cfg, 0, ("timm_folder",)) == ("timm_folder",)
    unset = config_dict()
    assert dv.orders_to_try(unset, 0) == dv.MODELLED_ORDERS and dv.range_orders(unset, 0, dv.MODELLED_ORDERS) == ()
    every = config_dict(**{"seed_discovery.range_orders": "all"})
    assert dv.range_orders(every, 0, dv.MODELLED_ORDERS) == dv.MODELLED_ORDERS


def test_the_planner_is_told_the_order_before_the_seed(snapshot: tuple[Path, Any], tmp_path: Path) -> None:
    """In-process: SeedDiscovery with its real worker hands (dataset, order) to ``on_order`` before it
    adopts the seed, and the plan manager then plans that order (another plan key)."""
    snap_file, snap = snapshot
    cfg = cfgmod.load(None, CONFIG)
    calls: list[tuple[str, Any]] = []
    seed = SeedState(me=0, listeners=(lambda s: calls.append(("seed", s.value)),))
    disc = SeedDiscovery(snap_file, cfg, seed, on_order=lambda d, o: calls.append(("order", (d, o))))
    for entry in node_opens(catalog_entries(snap, "timm_folder"), seed=1234):
        disc.on_open(entry)

    async def main() -> None:
        with trio.fail_after(120):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(disc.run)
                while disc.state in ("idle", "waiting", "preparing", "searching"):
                    await trio.sleep(0.05)
                nursery.cancel_scope.cancel()

    trio.run(main)
    assert calls == [("order", (0, "timm_folder")), ("seed", 1234)], calls
    st = disc.status()
    # searched together: every modelled order (they list this tree differently); it fitted timm's
    assert (st["order"], st["orders"], st["seed"]) == ("timm_folder", "imagefolder, timm_folder, files", 1234)
    manager = PlanManager(snap_file, "fp", cfg, tmp_path)
    before = plan_key("fp", manager.config, 1234)
    manager.use_layout(0, "timm_folder")
    assert manager.config["datasets"][0]["layout"] == "timm_folder" and cfg.datasets[0].layout is None
    assert plan_key("fp", manager.config, 1234) != before


def test_unpredictable_samplers_say_what_decides_them_and_what_to_write() -> None:
    cases = {
        "accelerate_default": ("64-bit", "synchronized_generator.initial_seed()"),
        "torchdata_random": ("64-bit", "generator.initial_seed()"),
        "accelerate": ("set_seed's value", "write that value"),
    }
    for kind, words in cases.items():
        cfg = config_dict(**{"datasets.0.sampler.kind": kind})
        setup = dv.search_setup(cfg, job_streams_of(cfg, [600]))
        assert not setup.searchable and all(w in (setup.reason or "") for w in words), (kind, setup.reason)
        assert "no seed decides it" not in (setup.reason or "")
    for kind in ("ordered_distributed", "repeat_aug"):
        cfg = config_dict(**{"datasets.0.sampler.kind": kind})
        assert "no seed decides it" in (dv.search_setup(cfg, job_streams_of(cfg, [600])).reason or ""), kind


def test_a_mismatch_says_what_seed_discovery_found(snapshot: tuple[Path, Any]) -> None:
    """The cursor alone can only say that the opens fit another order than the plan's; the status's
    mismatch reason adds what the search found: here (the job shuffled its list itself) that no
    modelled order fits with a likely seed, not a "wrong seed" for the user to go and fix."""
    snap_file, snap = snapshot
    shuffled = catalog_entries(snap, "imagefolder")
    np.random.default_rng(2024).shuffle(shuffled)
    b = 8
    loop = Loop(world=4, per_node=2, node=1, batch=b, rng=random.Random(3))
    training(loop, len(shuffled), seed=7, epochs=range(1))
    cur = NodeCursor(cursor_plan(len(shuffled), 7 + 10_000, 4, 2, b, epochs=2), settings(b))
    replay(cur, loop.opens)
    section = cur.status()
    assert section["mismatch_kind"] == "wrong_seed" and "seed, catalog order or sampler" in str(
        section["mismatch_reason"]
    )
    disc = SeedDiscovery(snap_file, cfgmod.load(None, CONFIG), SeedState(me=0))
    assert disc.explained(section) == section  # nothing searched yet: nothing to add
    for entry in node_opens(shuffled, seed=0):
        disc.on_open(entry)

    async def main() -> None:
        with trio.fail_after(120):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(disc.run)
                await trio.sleep(0.05)
                while disc.state in ("idle", "waiting", "preparing", "searching"):
                    told = disc.explained(section)
                    assert told is not None and told["mismatch_reason"] == (
                        f"{section['mismatch_reason']}; seed discovery: searching the opens for the job's seed and "
                        "catalog order"
                    )
                    await trio.sleep(0.05)
                nursery.cancel_scope.cancel()

    trio.run(main)
    told = disc.explained(section)
    assert disc.state == "not_found" and told is not None
    assert f"; seed discovery: {dv.NO_ORDER_FITS} (tried imagefolder, timm_folder, files" in str(
        told["mismatch_reason"]
    )
    assert told["datasets"] == section["datasets"] and section["mismatch_reason"] != told["mismatch_reason"]
    off = SeedDiscovery(snap_file, cfgmod.load(None, {**CONFIG, "seed_discovery.enabled": "false"}), SeedState(me=0))
    told = off.explained(section)
    assert told is not None and "; seed discovery: off: write the sampler's seed" in str(told["mismatch_reason"])


@pytest.fixture(scope="module")
def nearly_alike(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    """Ten classes whose files ImageFolder and timm list alike (zero-padded names) except in ``c0``,
    whose names are not padded: the two orders differ in a tenth of the dataset only."""
    root = tmp_path_factory.mktemp("nearly") / "data"
    for c in range(10):
        (root / "train" / f"c{c}").mkdir(parents=True)
        for i in range(50):
            name = f"img_{i}.jpg" if c == 0 else f"img_{i:02d}.jpg"
            (root / "train" / f"c{c}" / name).write_bytes(b"x" * (100 + i))
    cache = root.parent / "cache"
    snap, _ = load_or_scan(str(root), cache)
    return snapshot_file(cache, snap.source), snap


def test_orders_that_both_fit_name_the_one_that_fits_best(nearly_alike: tuple[Path, Any]) -> None:
    """The job reads timm's order with seed 42; ImageFolder's order lists nine tenths of the files
    alike, so 42 fits there too, and its chunk comes first.  The match is checked in every order and
    the one it fits best is named (timm's), not the one whose turn came first."""
    snap_file, snap = nearly_alike
    timm, folder = catalog_entries(snap, "timm_folder"), catalog_entries(snap, "imagefolder")
    assert timm != folder and sum(a != b for a, b in zip(timm, folder, strict=True)) < len(timm) // 5
    entries = node_opens(timm, seed=42)
    alone = run_worker(snap_file, config_dict(**{"datasets.0.layout": "imagefolder"}), entries)[-1]
    assert (alone["status"], alone["seed"]) == ("found", 42), alone  # it fits ImageFolder's order too
    done = run_worker(snap_file, config_dict(), entries)[-1]
    assert (done["status"], done["seed"], done["order"]) == ("found", 42, "timm_folder"), done
    assert done["hits"] > alone["hits"], (done["hits"], alone["hits"])
