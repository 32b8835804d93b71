"""Per-node plans (placement.nodeplan): a node's own reads exactly, owners by the first-reader rule,
the same owners and digest on every node, and the dense plan's coverage and PFS bytes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_plan import CASES, config, plan_config, small_tree

from fusefs.meta.snapshot import Snapshot
from fusefs.planning.store import load_plan, save_plan
from placement import nodeplan
from placement import plan as P
from placement import randperm as rp
from placement.assign import earliest_reader
from placement.frequency import access_stats, count_type_for
from placement.nodeplan import NEVER_KEY, designate, node_pass, node_room
from placement.plan import Plan


def _pass_inputs(job: dict[str, str], sizes: list[int], seed: int, **extra: str) -> tuple[Any, ...]:
    inputs = P.plan_inputs(config(**{f"job.{k}": v for k, v in job.items()}, **extra), seed=seed)
    streams = P._streams(inputs, sizes, {}, "auto")
    js = P._job_streams(inputs, streams)
    segments = P._segments(js, P._shape(inputs).ranks_per_node)
    offsets = np.concatenate([[0], np.cumsum(sizes)]).tolist()
    return inputs, streams, segments, offsets


@pytest.mark.parametrize(("chunk", "sparse"), [(1 << 20, rp._SPARSE_AT), (7, 1 << 40)])
@pytest.mark.parametrize("case", sorted(CASES))
def test_a_nodes_pass_equals_its_row_of_the_dense_pass_and_the_job_first_reads(
    case: str, chunk: int, sparse: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Counts, epoch-0 counts and first uses of each node, and per file the job's first read (position
    and node, ties to the lowest), equal what the dense pass (checked against node streams in
    tests/test_plan.py) finds with every node's rows; also with the first reads found in slices of 7
    entries (padding across a slice's end) and with the later epochs' entries of this node always
    replayed alone (at these sizes a node reads more than 1 in 32 entries, so the whole permutation
    is taken otherwise)."""
    monkeypatch.setattr(nodeplan, "_KEY_CHUNK", chunk)
    monkeypatch.setattr(rp, "_SPARSE_AT", sparse)
    monkeypatch.setattr(rp, "_SPARSE_AT_CACHED", sparse)
    job, sizes = CASES[case]
    extra = {"datasets.0.sampler.drop_last": "true"} if job.get("drop_last") == "true" else {}
    _inputs, streams, segments, offsets = _pass_inputs(job, sizes, 11, **extra)
    stats = access_stats(streams, offsets, segments)
    earliest, reader = earliest_reader(stats.first_use)
    ctype = count_type_for(streams, segments)
    for k in range(streams[0].shape.nodes):
        p = node_pass(streams, offsets, segments, k, ctype)
        assert np.array_equal(p.counts, stats.counts[k])
        assert np.array_equal(p.first_epoch_counts, stats.first_epoch_counts[k])
        assert np.array_equal(p.first.astype(np.int64), stats.first_use[k].astype(np.int64))
        assert np.array_equal(p.first_reader(), reader)
        assert np.array_equal(p.earliest(), earliest.astype(np.int64))
        assert np.array_equal(p.total.astype(np.int64), stats.counts.sum(axis=0, dtype=np.int64))


def test_validation_and_shared_orders_in_a_nodes_pass() -> None:
    """A validation set read in order every 2nd epoch (every rank the same order) and a random sampler."""
    for sampler in ("distributed", "random"):
        over = {
            "datasets": f"[{{root: train, sampler: {{kind: {sampler}}}}}, "
            "{root: val, follows: train, every: 2, sampler: {shuffle: false}}]",
            "job.world_size": "6",
            "job.ranks_per_node": "2",
            "job.batch_size": "3",
            "job.epochs": "4",
        }
        inputs = P.plan_inputs(config(**over), seed=2)
        streams = P._streams(inputs, [50, 13], {}, "auto")
        js = P._job_streams(inputs, streams)
        segments = P._segments(js, 2)
        stats = access_stats(streams, [0, 50, 63], segments)
        earliest, reader = earliest_reader(stats.first_use)
        for k in range(3):
            p = node_pass(streams, [0, 50, 63], segments, k, count_type_for(streams, segments))
            assert np.array_equal(p.counts, stats.counts[k])
            assert np.array_equal(p.first.astype(np.int64), stats.first_use[k].astype(np.int64))
            assert np.array_equal(p.first_reader(), reader)
            assert np.array_equal(p.earliest(), earliest.astype(np.int64))


def test_designation_respects_room_and_covers_when_there_is_room() -> None:
    rng = np.random.default_rng(5)
    m, nodes = 5000, 7
    sizes = rng.integers(1, 1000, m).astype(np.int64)
    keys = rng.permutation(m).astype(np.int64) * nodes + rng.integers(0, nodes, m)
    keys[:10] = NEVER_KEY  # never read: nobody is designated
    read = keys != NEVER_KEY
    total = rng.integers(1, 5, m)
    roomy = designate(keys, total, sizes, read, nodes, np.array([10**6, 10**6]))
    assert (roomy[~read] == -1).all() and (roomy[read] == keys[read] % nodes).all()
    tight_budget = np.array([int(sizes.sum()) // (3 * nodes), int(sizes.sum()) // (3 * nodes)])
    tight = designate(keys, total, sizes, read, nodes, tight_budget)
    room = node_room(tight_budget, int(sizes[read].max()))
    held = np.bincount(tight[tight >= 0], weights=sizes[tight >= 0], minlength=nodes)
    assert (held <= room).all() and held.min() > 0.9 * room
    assert 0 < int((tight[read] == -1).sum()) < m
    again = designate(keys.copy(), total.copy(), sizes.copy(), read.copy(), nodes, tight_budget)
    assert np.array_equal(again, tight)
    # what is left out is what is read least: no held object is read less than most left-out ones
    out = read & (tight == -1)
    assert np.median(total[out]) <= np.median(total[read & (tight >= 0)])


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return Snapshot.scan(str(small_tree(tmp_path_factory.mktemp("nodeplan") / "src", val=5))).tree


def test_every_node_computes_the_same_owners_and_digest_and_its_own_tiers(tree: Any, tmp_path: Path) -> None:
    """Plans built for different nodes agree on owners and digest; each holds its designated objects,
    keeps its budgets, and equals the part another node's plan computes for it when asked; a saved
    per-node plan holds only its node's share and loads to the same plan."""
    cfg = plan_config(**{"tiers": "[{kind: memory, bytes: 200000}, {kind: directory, path: /x, bytes: 300000}]"})
    plans = [Plan.build(tree, cfg, seed=3, per_node=True, node=k) for k in range(4)]
    assert len({p.digest for p in plans}) == 1
    owner = plans[0].owner_obj
    assert all(np.array_equal(p.owner_obj, owner) for p in plans)
    assert all(p.per_node and p.planned_nodes() == [k] for k, p in enumerate(plans))
    save_plan(plans[1], tmp_path / "p")
    for k, p in enumerate(plans):
        tiers = p.node_tiers(k)
        assert (tiers[owner == k] >= 0).all()
        sizes = p.objects.size
        assert int(sizes[tiers == 0].sum()) <= 200000 and int(sizes[tiers == 1].sum()) <= 300000
        other = plans[(k + 1) % 4].node_part(k)
        assert np.array_equal(other.tier_of, tiers)
        assert np.array_equal(other.fill_obj, p.fill_order(k)[0])
    again = load_plan(tmp_path / "p")
    assert again.digest == plans[1].digest == again.recompute_digest()
    assert again.planned_nodes() == [1] and np.array_equal(again.node_tiers(1), plans[1].node_tiers(1))
    assert np.array_equal(again.fill_order(1)[1], plans[1].fill_order(1)[1])
    assert not (tmp_path / "p" / "tier_of.npy").exists()


def test_per_node_plans_cover_and_read_the_pfs_as_the_dense_plan_does(tree: Any) -> None:
    """With room for every file (spread_covers), both rules give every read file a holder: same files
    held, same PFS bytes over the job."""
    cfg = plan_config(**{"tiers": "[{kind: memory, bytes: 200000}, {kind: directory, path: /x, bytes: 300000}]"})
    dense = Plan.build(tree, cfg, seed=3, per_node=False)
    per = Plan.build(tree, cfg, seed=3, per_node=True)
    assert dense.summary()["coverage"] == per.summary()["coverage"]
    assert dense.summary()["pfs_bytes_job"] == per.summary()["pfs_bytes_job"]
    assert dense.summary()["pfs_bytes_without_cache"] == per.summary()["pfs_bytes_without_cache"]
    assert dense.digest != per.digest
    with pytest.raises(ValueError, match="spread"):
        Plan.build(tree, plan_config(**{"peers.spread": "false"}), seed=3, per_node=True)


def test_large_spread_jobs_plan_per_node_small_ones_densely(tree: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    assert not Plan.build(tree, plan_config(), seed=3).per_node
    monkeypatch.setattr(P, "DENSE_CELLS", 10)
    assert Plan.build(tree, plan_config(), seed=3).per_node
    assert not Plan.build(tree, plan_config(**{"peers.spread": "false"}), seed=3).per_node


def test_a_daemon_loading_another_nodes_plan_computes_its_own_part_while_loading(tree: Any, tmp_path: Path) -> None:
    """Daemons sharing cache_dir share plan directories: the one saved may be another node's.  The
    loader (a thread of the plan manager) computes the presumed node's part, equal to that node's
    own plan, so the FUSE loop never does."""
    from fusefs.planning.manager import load_daemon_plan

    cfg = plan_config()
    save_plan(Plan.build(tree, cfg, seed=3, per_node=True, node=1), tmp_path / "p")
    loaded = load_daemon_plan(tmp_path / "p", node=2)
    assert loaded.planned_nodes() == [1, 2]
    own = Plan.build(tree, cfg, seed=3, per_node=True, node=2)
    assert np.array_equal(loaded.node_tiers(2), own.node_tiers(2))
    assert np.array_equal(loaded.fill_order(2)[1], own.fill_order(2)[1])
    assert load_daemon_plan(tmp_path / "p").planned_nodes() == [1]


@pytest.mark.parametrize("memory,disk", [(60_000, 120_000), (100_000, 200_000)])
def test_without_room_for_every_file_the_rules_leave_out_as_much(tmp_path: Path, memory: int, disk: int) -> None:
    """Aggregate room below the dataset (a third to two thirds of it): the dense plan drops what its
    nodes read least, the per-node plan what the job reads least; the per-node plan holds no fewer
    files and reads no more PFS bytes over the job than the dense one, within 1%."""
    tree = Snapshot.scan(str(small_tree(tmp_path / "src", classes=8, per_class=100, val=10))).tree
    tiers = f"[{{kind: memory, bytes: {memory}}}, {{kind: directory, path: /x, bytes: {disk}}}]"
    dense = Plan.build(tree, plan_config(tiers=tiers), seed=3, per_node=False).summary()
    per = Plan.build(tree, plan_config(tiers=tiers), seed=3, per_node=True).summary()
    assert dense["coverage"]["held_bytes"] < dense["coverage"]["read_bytes"]
    assert per["coverage"]["held_objects"] >= 0.99 * dense["coverage"]["held_objects"]
    assert per["pfs_bytes_job"] <= 1.01 * dense["pfs_bytes_job"]
