"""Everything seerfs persists is verified before use: a damaged plan or snapshot is refused and rebuilt.

The faults are made on disk between two real mounts, the way a bad disk, a stray script or an older
seerfs would leave them; each test checks in status that the damaged copy was looked up and refused,
and that what the mount serves is the source's bytes (compared with the source read directly).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from e2e import make_source, wait_plan
from mounting import mounted, status

from placement.plan import Plan

pytestmark = pytest.mark.mount


def _config(tmp_path: Path) -> Path:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        f"cache_dir: {tmp_path / 'cache'}\ndatasets: [{{root: train}}]\n"
        "job: {world_size: 2, ranks_per_node: 1, epochs: 2, batch_size: 4}\n"
        f"tiers: [{{kind: directory, path: {tmp_path / 'ssd'}, bytes: 64MiB}}]\n"
    )
    return cfg


def _read_tree(mnt: Path, src: Path, rels: list[str]) -> None:
    for rel in rels:
        assert (mnt / rel).read_bytes() == (src / rel).read_bytes(), rel


def test_a_plan_column_shifted_between_mounts_is_refused_and_planned_again(tmp_path: Path) -> None:
    src = tmp_path / "src"
    digests, _ = make_source(src, 60, 0, mean_size=3000)
    rels = sorted(digests)
    cfg = _config(tmp_path)
    with mounted(src, tmp_path / "mnt", "-c", str(cfg)) as mnt:
        first = wait_plan(mnt, 0)["plan"]
        assert not first["reused"]
    [plan_json] = list((tmp_path / "cache" / "plans").glob("*/*/plan.json"))
    column = plan_json.parent / "obj_entry.npy"
    obj_entry = np.load(column)
    np.save(column, np.roll(obj_entry, 1))  # same dtype, shape and header: only the rows moved
    assert json.loads(plan_json.read_text())["digest"] == first["digest"]
    with mounted(src, tmp_path / "mnt", "-c", str(cfg)) as mnt:
        doc = wait_plan(mnt, 0)
        _read_tree(mnt, src, rels)
    plan = doc["plan"]
    assert not plan["reused"], "the damaged plan was used"
    assert plan["cache_refused"] and "digest" in plan["cache_refused"], plan
    assert plan["digest"] == first["digest"]  # planned again: the same plan as before the damage
    assert np.array_equal(np.load(column), obj_entry)  # and the damaged copy replaced by a good one


def test_a_snapshot_column_changed_on_disk_is_refused_and_walked_again(tmp_path: Path) -> None:
    src = tmp_path / "src"
    digests, _ = make_source(src, 30, 0, mean_size=2000)
    rels = sorted(digests)
    cfg = _config(tmp_path)
    with mounted(src, tmp_path / "mnt", "-c", str(cfg)) as mnt:
        assert not status(mnt)["snapshot"]["reused"]
    [snap] = list((tmp_path / "cache" / "snapshots").glob("*.npz"))
    with np.load(snap) as data:
        arrays = {k: data[k] for k in data.files}
    arrays["size"] = arrays["size"].copy()
    arrays["size"][-1] += 1  # a size one byte off: the tree would promise a byte the file lacks
    with open(snap, "wb") as fh:
        np.savez(fh, **arrays)
    with mounted(src, tmp_path / "mnt", "-c", str(cfg)) as mnt:
        doc = status(mnt)
        _read_tree(mnt, src, rels)
        assert (mnt / rels[-1]).stat().st_size == (src / rels[-1]).stat().st_size
    assert not doc["snapshot"]["reused"], doc["snapshot"]
    assert "refused" in doc["snapshot"]["reason"] and "digest" in doc["snapshot"]["reason"], doc["snapshot"]


def test_the_plan_digest_covers_objects_and_fill_order(tmp_path: Path) -> None:
    """Nodes compare plan digests to agree; one that maps objects to other entries must not agree."""
    from fusefs.config import Config
    from fusefs.meta.snapshot import Snapshot
    from fusefs.planning.inputs import planning_config

    make_source(tmp_path / "src", 100, 0, mean_size=1000)
    cfg = planning_config(Config())
    cfg["datasets"][0]["root"] = "train"
    cfg["job"].update(world_size=2, ranks_per_node=1, epochs=2, batch_size=4)
    cfg["tiers"][0]["bytes"] = 60_000
    plan = Plan.build(Snapshot.scan(str(tmp_path / "src")).tree, cfg, seed=0, backend="numpy")
    assert plan.recompute_digest() == plan.digest
    assert plan.assignment is not None  # a dense plan: every node's fill order is digested
    columns: dict[str, np.ndarray[Any, Any]] = {
        "obj_entry": plan.objects.obj_entry,
        "obj_size": plan.objects.size,
        "fill_obj": plan.assignment.fill_obj,
        "fill_due": plan.assignment.fill_due,
    }
    for name, col in columns.items():
        saved = col.copy()
        col[:] = np.roll(saved, 1) if name != "obj_size" else saved + 1
        assert plan.recompute_digest() != plan.digest, f"{name} is not covered by the digest"
        col[:] = saved
    assert plan.recompute_digest() == plan.digest


@pytest.mark.slow
def test_the_plan_digest_stays_fast_at_imagenet_scale() -> None:
    from placement.plan import Objects, _digest, _outputs

    n = 1_281_167
    rng = np.random.default_rng(0)
    objects = Objects(None, np.arange(n, dtype=np.int32), rng.integers(1, 200_000, n), np.ones(n, np.bool_))
    from placement.assign import Assignment

    assignment = Assignment(
        rng.integers(-1, 2, (8, n)).astype(np.int8),
        rng.integers(0, 8, n).astype(np.int32),
        rng.integers(0, n, 2 * n).astype(np.int32),
        np.sort(rng.integers(0, 10 * n, 2 * n)),
        np.linspace(0, 2 * n, 9).astype(np.int64),
        np.zeros((8, 2), np.int64),
        np.zeros((8, 2), np.int64),
    )
    t0 = time.perf_counter()
    _digest({"seed": 0}, [], {}, _outputs(objects, assignment, assignment.owner))
    assert time.perf_counter() - t0 < 0.5


def test_caches_written_in_another_format_are_refused_with_the_reason(tmp_path: Path) -> None:
    """What an older (or newer) seerfs left in cache_dir is never read as this version's layout."""
    from fusefs.meta.snapshot import FORMAT_VERSION, Snapshot
    from fusefs.planning.store import FORMAT, load_plan, save_plan
    from fusefs.tiers import DirectoryTier
    from fusefs.tiers import index as index_io

    make_source(tmp_path / "src", 20, 0, mean_size=500)
    snap = Snapshot.scan(str(tmp_path / "src"))
    snap.save(tmp_path / "s.npz")
    with np.load(tmp_path / "s.npz") as data:
        arrays = {k: data[k] for k in data.files}
    meta = json.loads(arrays["meta"].tobytes())
    meta["format"] = FORMAT_VERSION - 1
    arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), np.uint8)
    np.savez(tmp_path / "s.npz", **arrays)
    with pytest.raises(ValueError, match=f"format {FORMAT_VERSION - 1}"):
        Snapshot.load(tmp_path / "s.npz")

    from fusefs.config import Config
    from fusefs.planning.inputs import build_plan, planning_config

    cfg = planning_config(Config())
    cfg["datasets"][0]["root"] = "train"
    save_plan(build_plan(snap, cfg, 0, backend="numpy"), tmp_path / "plan")
    plan_meta = json.loads((tmp_path / "plan" / "plan.json").read_text())
    plan_meta["format"] = FORMAT + 1
    (tmp_path / "plan" / "plan.json").write_text(json.dumps(plan_meta))
    with pytest.raises(ValueError, match=f"format {FORMAT + 1}"):
        load_plan(tmp_path / "plan")

    tier = DirectoryTier(1, tmp_path / "tier", 8 << 20, 1, "fp")
    tier.abandon()
    path = tmp_path / "tier" / index_io.INDEX_NAME
    with np.load(path) as data:
        arrays = {k: data[k] for k in data.files}
    meta = json.loads(arrays["meta"].tobytes())
    meta["format"] = index_io.FORMAT - 1
    arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), np.uint8)
    np.savez(path, **arrays)
    again = DirectoryTier(1, tmp_path / "tier", 8 << 20, 1, "fp")
    assert again.opened is not None  # the constructor opened the tier
    assert not again.opened["warm"] and "another format" in again.opened["reason"], again.opened
    again.abandon()
