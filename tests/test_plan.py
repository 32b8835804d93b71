"""The plan: frequency analysis, exact per-node counts and first uses, digest, persistence, summary."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from fractions import Fraction
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pytest

from fusefs.config import load
from fusefs.meta.snapshot import Snapshot
from fusefs.planning.inputs import PlanTimer
from fusefs.planning.store import load_plan, save_plan
from placement import plan as P
from placement import streams as streams_module
from placement.frequency import (
    access_stats,
    expected_heavy_files,
    heavy_threshold,
    lemma1_other_reader_bound,
)
from placement.plan import Plan
from placement.prob import binomial_tail

REPO = Path(__file__).resolve().parent.parent
A = TypeVar("A")
T = TypeVar("T")


def config(**overrides: str) -> dict[str, Any]:
    cfg: dict[str, Any] = load(None, dict(overrides)).to_dict()
    return cfg


def small_tree(root: Path, classes: int = 4, per_class: int = 30, val: int = 0, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    for split, n in (("train", per_class), ("val", val)):
        if not n:
            continue
        for c in range(classes):
            d = root / split / f"class{c}"
            d.mkdir(parents=True)
            for i in range(n):
                (d / f"img{i:03d}.jpg").write_bytes(b"x" * int(rng.integers(1, 4000)))
    return root


# --------------------------------------------------------------------------- NoPFS 3.1


def test_the_papers_imagenet_example_expects_about_31635_heavy_files() -> None:
    assert heavy_threshold(16, 90, 0.8) == 11
    assert round(expected_heavy_files(1_281_167, 16, 90, 0.8)) == 31_635


def test_binomial_tail_and_lemma1() -> None:
    assert binomial_tail(4, 0.5, 3) == pytest.approx(5 / 16)
    assert binomial_tail(10, 0.3, 0) == 1.0 and binomial_tail(10, 0.3, 11) == 0.0
    # large E: the log-space sum must not overflow; reference from exact integers (1 - lower tail)
    lower = sum(math.comb(5000, k) * 99 ** (5000 - k) for k in range(60))
    exact = 1 - Fraction(lower, 100**5000)
    assert binomial_tail(5000, 0.01, 60) == pytest.approx(float(exact), rel=1e-9)
    assert lemma1_other_reader_bound(16, 90, 0.8) == 6  # ceil((15 - 0.8) / 15 * 90 / 16) = ceil(5.325)


# --------------------------------------------------------------------------- the access pass


def brute_force(plan_inputs: dict[str, Any], sizes: list[int], orders: dict[int, Any]) -> tuple[Any, Any, Any]:
    """Counts and first uses straight from Streams.node_stream, segment by segment."""
    streams = P._streams(plan_inputs, sizes, orders, "auto")
    js = P._job_streams(plan_inputs, streams)
    segments = P._segments(js, P._shape(plan_inputs).ranks_per_node)
    nodes, total = P._shape(plan_inputs).nodes, sum(sizes)
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    counts = np.zeros((nodes, total), np.int64)
    first = np.full((nodes, total), np.iinfo(np.int64).max, np.int64)
    for seg in segments:
        for k in range(nodes):
            s = streams[seg.dataset].node_stream(seg.ds_epoch, k) + offsets[seg.dataset]
            assert s.size == seg.length
            np.add.at(counts[k], s, 1)
            np.minimum.at(first[k], s, seg.start + np.arange(s.size))
    # the segments line up with the job's own per-epoch node streams
    for e in range(js.epochs):
        joined = np.concatenate(
            [streams[g.dataset].node_stream(g.ds_epoch, 0) + offsets[g.dataset] for g in segments if g.job_epoch == e]
        )
        assert np.array_equal(joined, js.node_stream(e, 0))
    stats = access_stats(streams, offsets.tolist(), segments)
    return counts, first, stats


CASES = {
    "padding, 3 nodes, odd batch": (dict(world_size="6", ranks_per_node="2", batch_size="5", epochs="4"), [101]),
    "drop_last both": (
        dict(world_size="8", ranks_per_node="4", batch_size="4", epochs="3", drop_last="true"),
        [99],
    ),
    "round robin": (
        dict(world_size="6", ranks_per_node="3", batch_size="2", epochs="3", rank_order="round_robin"),
        [40],
    ),
    "power of two": (dict(world_size="8", ranks_per_node="2", batch_size="4", epochs="5"), [64]),
    # a 64-bit "read before" mask per file, then too many nodes for one (and for byte compares)
    "64 nodes": (dict(world_size="128", ranks_per_node="2", batch_size="2", epochs="3"), [300]),
    "100 nodes": (dict(world_size="100", ranks_per_node="1", batch_size="3", epochs="3"), [250]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_counts_and_first_uses_equal_a_brute_force_over_node_streams(case: str) -> None:
    job, sizes = CASES[case]
    over = {f"job.{k}": v for k, v in job.items()}
    if job.get("drop_last") == "true":
        over["datasets.0.sampler.drop_last"] = "true"
    inputs = P.plan_inputs(config(**over), seed=11)
    counts, first, stats = brute_force(inputs, sizes, {})
    assert np.array_equal(stats.counts, counts)
    streams = P._streams(inputs, sizes, {}, "auto")  # and with the streams' own counting
    assert np.array_equal(stats.counts, streams[0].node_counts(range(int(job["epochs"]))))
    never = stats.never
    expect = np.where(first == np.iinfo(np.int64).max, never, first)
    assert np.array_equal(stats.first_use.astype(np.int64), expect)


@pytest.mark.parametrize("sparse_new", [1, 10**9])
def test_first_uses_are_exact_with_and_without_the_order_inverse(
    monkeypatch: pytest.MonkeyPatch, sparse_new: int
) -> None:
    """NodeReads skips the inverse once few (node, file) pairs are new; force that from the
    second epoch on (1), or never (10**9), and compare both with the brute force."""
    monkeypatch.setattr(streams_module, "_SPARSE_NEW", sparse_new)
    sparse_epochs = []
    real = streams_module.NodeReads._add_strided_sparse

    def counted(self: streams_module.NodeReads, *args: Any) -> None:
        sparse_epochs.append(1)
        real(self, *args)

    monkeypatch.setattr(streams_module.NodeReads, "_add_strided_sparse", counted)
    for case in ("padding, 3 nodes, odd batch", "round robin", "power of two", "64 nodes"):
        job, sizes = CASES[case]
        inputs = P.plan_inputs(config(**{f"job.{k}": v for k, v in job.items()}), seed=4)
        counts, first, stats = brute_force(inputs, sizes, {})
        assert np.array_equal(stats.counts, counts)
        assert np.array_equal(
            stats.first_use.astype(np.int64), np.where(first == np.iinfo(np.int64).max, stats.never, first)
        )
    assert bool(sparse_epochs) == (sparse_new == 1)


def test_shared_orders_lists_and_validation_follow_the_same_streams() -> None:
    """random (every rank reads one order), list with repeats, a validation set every 2nd epoch."""
    cfg = config(
        **{
            "datasets": "[{root: a, sampler: {kind: random}}, {root: b, sampler: {kind: list, order_file: o}},"
            " {root: c, follows: a, every: 2, sampler: {kind: sequential}}]",
            "job.world_size": "4",
            "job.ranks_per_node": "2",
            "job.batch_size": "3",
            "job.epochs": "4",
        }
    )
    inputs = P.plan_inputs(cfg, seed=5)
    orders = {1: np.array([3, 1, 3, 0, 2, 3, 1])}
    counts, first, stats = brute_force(inputs, [17, 5, 9], orders)
    assert np.array_equal(stats.counts, counts)
    expect = np.where(first == np.iinfo(np.int64).max, stats.never, first)
    assert np.array_equal(stats.first_use.astype(np.int64), expect)
    assert int(counts[:, 17 + 3].max()) == 4 * 3 * 2  # index 3 of b: thrice per epoch, two ranks per node


def test_measured_heavy_files_match_the_analytic_estimate() -> None:
    inputs = P.plan_inputs(config(**{"job.world_size": "16", "job.epochs": "40", "job.batch_size": "8"}), seed=1)
    n = 20_000
    streams = P._streams(inputs, [n], {}, "auto")
    segments = P._segments(P._job_streams(inputs, streams), 1)
    stats = access_stats(streams, [0, n], segments)
    threshold = heavy_threshold(16, 40, 0.8)
    observed = (stats.counts >= threshold).sum(axis=1).mean()
    assert observed == pytest.approx(expected_heavy_files(n, 16, 40, 0.8), rel=0.05)
    # Lemma 1: where one node reads a file that often, another reads it at most the bound
    heavy = (stats.counts >= threshold).any(axis=0)
    assert heavy.sum() > 1000
    assert (stats.counts[:, heavy].min(axis=0) <= lemma1_other_reader_bound(16, 40, 0.8)).all()


# --------------------------------------------------------------------------- plans from real trees


def plan_config(**extra: str) -> dict[str, Any]:
    over = {
        "datasets": "[{root: train}, {root: val, follows: train, sampler: {shuffle: false}}]",
        "job.world_size": "8",
        "job.ranks_per_node": "2",
        "job.epochs": "6",
        "job.batch_size": "4",
        "tiers": "[{kind: memory, bytes: 40000}, {kind: directory, path: /x, bytes: 60000}]",
    }
    over.update(extra)
    return config(**over)


@pytest.fixture(scope="module")
def tree_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return small_tree(tmp_path_factory.mktemp("plan") / "src", val=5)


def test_plan_respects_budgets_and_reports_per_node(tree_dir: Path) -> None:
    tree = Snapshot.scan(str(tree_dir)).tree
    plan = Plan.build(tree, plan_config(), seed=3)
    s = plan.summary()
    assert s["nodes"] == 4 and len(s["per_node"]) == 4 and s["digest"] == plan.digest
    sizes = plan.objects.size
    for k, node in enumerate(s["per_node"]):
        assert node["tier_bytes"][0] <= 40000 and node["tier_bytes"][1] <= 60000
        assert node["tier_bytes"] == [int(sizes[plan.node_tiers(k) == j].sum()) for j in range(2)]
        for phase in ("first_epoch", "later_epochs"):
            share = node[phase]["share"]
            assert sum(share.values()) == pytest.approx(1.0, abs=1e-3)
    cov = s["coverage"]
    assert cov["read_objects"] == 4 * 30 + 4 * 5
    assert s["pfs_bytes_job"] < s["pfs_bytes_without_cache"]
    assert [d["root"] for d in s["datasets"]] == ["train", "val"] and s["datasets"][1]["follows"] == "train"
    # the daemon's view: node streams over global ids, owners and tiers per id
    stream = plan.node_stream(0, 1)
    assert stream.min() >= 0 and stream.max() < plan.files
    assert np.array_equal(stream, plan.job_streams().node_stream(0, 1))
    assert (plan.owner()[stream] >= -1).all() and plan.tier_of(1).shape == (plan.files,)
    assert plan.dataset_of(int(plan.offsets[1])) == (1, 0)
    emap = plan.epoch_map(0)
    gid = int(stream[0])
    assert plan.shape.node_of_rank(int(emap.rank_of[gid])) == 1


def test_a_symlinked_class_is_one_cached_object_per_entry(tmp_path: Path) -> None:
    root = small_tree(tmp_path / "src", classes=2, per_class=10)
    os.symlink("class0", root / "train" / "class0_again")
    tree = Snapshot.scan(str(root)).tree
    plan = Plan.build(tree, plan_config(datasets="[{root: train}]"), seed=0)
    assert plan.files == 30 and len(plan.objects) == 20
    entries = plan.entry_of(np.arange(plan.files))
    for node in range(plan.nodes):
        tiers = plan.tier_of(node)
        for e in np.unique(entries):
            assert len(set(tiers[entries == e].tolist())) == 1  # one object, one tier, however reached


def test_a_plan_builds_over_the_timm_folder_layout(tmp_path: Path) -> None:
    root = small_tree(tmp_path / "src", classes=2, per_class=10)
    (root / "train" / "loose.jpg").write_bytes(b"x" * 10)  # a root file: a sample in timm's order only
    tree = Snapshot.scan(str(root)).tree
    plan = Plan.build(tree, plan_config(datasets="[{root: train, layout: timm_folder}]"), seed=0)
    assert plan.files == 21 and plan.summary()["coverage"]["read_objects"] == 21


WRITERS, ROUNDS = 4, 12


def _save_and_load(plan: Plan, out: Path, start: Any, errors: Any) -> None:
    """One daemon's plan worker and then the daemon itself, as a forked process (see the test below)."""
    try:
        start.wait()
        save_plan(plan, out)
        assert load_plan(out).digest == plan.digest
    except BaseException as exc:  # reported by the parent, with what it was
        errors.put(f"{type(exc).__name__}: {exc}")


def test_daemons_sharing_a_cache_dir_save_the_same_plan_at_once_and_all_load_it(tree_dir: Path, tmp_path: Path) -> None:
    """cache_dir defaults to ~/.cache/seerfs, which a cluster's nodes usually share, so the daemons of
    one job write the same plan into the same directory at the same moment.  With fixed temporary
    names there, one writer renamed away the file another had just written (ENOENT) and that node
    predicted nothing; every writer must succeed, load the plan, and leave no temporary behind."""
    import multiprocessing

    plan = Plan.build(Snapshot.scan(str(tree_dir)).tree, plan_config(), seed=3)
    ctx = multiprocessing.get_context("fork")
    errors = ctx.Queue()
    for k in range(ROUNDS):
        out = tmp_path / "plans" / f"key{k}"
        start = ctx.Barrier(WRITERS)
        procs = [ctx.Process(target=_save_and_load, args=(plan, out, start, errors)) for _ in range(WRITERS)]
        for proc in procs:
            proc.start()
        for proc in procs:
            proc.join(60)
        assert [proc.exitcode for proc in procs] == [0] * WRITERS
    failures = []
    while not errors.empty():
        failures.append(errors.get())
    assert failures == [], f"{len(failures)} of {WRITERS * ROUNDS} writers failed: {failures[:3]}"
    assert sorted(p.name for p in (tmp_path / "plans").iterdir()) == sorted(f"key{k}" for k in range(ROUNDS))


def test_a_plan_directory_left_without_plan_json_is_replaced(tree_dir: Path, tmp_path: Path) -> None:
    """A writer killed mid-way under the old layout left columns and no plan.json: the next save
    replaces that directory rather than failing, or keeping columns of another plan."""
    plan = Plan.build(Snapshot.scan(str(tree_dir)).tree, plan_config(), seed=3)
    out = tmp_path / "p"
    out.mkdir()
    (out / "tier_of.npy").write_bytes(b"left by a killed writer")
    save_plan(plan, out)
    assert load_plan(out).digest == plan.digest
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p"]


def test_save_load_roundtrip_is_memory_mapped_and_self_consistent(tree_dir: Path, tmp_path: Path) -> None:
    tree = Snapshot.scan(str(tree_dir)).tree
    plan = Plan.build(tree, plan_config(), seed=3)
    save_plan(plan, tmp_path / "p")
    again = load_plan(tmp_path / "p")
    assert again.digest == plan.digest == again.recompute_digest()
    assert again.assignment is not None and plan.assignment is not None
    assert isinstance(again.assignment.tier_of, np.memmap)
    assert np.array_equal(again.assignment.tier_of, plan.assignment.tier_of)
    for k in range(plan.nodes):
        assert np.array_equal(again.fill_order(k)[0], plan.fill_order(k)[0])
        assert np.array_equal(again.node_stream(2, k), plan.node_stream(2, k))
    assert again.summary() == json.loads(json.dumps(plan.summary()))
    assert list(again.catalogs[0].paths(tree)) == list(plan.catalogs[0].paths(tree))
    (tmp_path / "p" / "owner.npy").unlink()
    with pytest.raises(ValueError, match="incomplete"):
        load_plan(tmp_path / "p")
    with pytest.raises(ValueError, match="no readable plan"):
        load_plan(tmp_path / "nothing")


def test_digest_covers_seed_budgets_and_layout_but_not_paths_or_model(tree_dir: Path) -> None:
    tree = Snapshot.scan(str(tree_dir)).tree
    base = Plan.build(tree, plan_config(), seed=3).digest
    assert Plan.build(tree, plan_config(), seed=4).digest != base
    assert Plan.build(tree, plan_config(**{"tiers.0.bytes": "40001"}), seed=3).digest != base
    assert Plan.build(tree, plan_config(**{"peers.spread": "false"}), seed=3).digest != base
    same = plan_config(**{"tiers.1.path": "/elsewhere", "model.network_mbps": "10", "tiers.0.threads": "1"})
    assert Plan.build(tree, same, seed=3).digest == base
    # The staging window's stage limits (the model's p_0 and the adaptive ceiling) decide no placement.
    staging = plan_config(**{"prefetch.threads": "8", "prefetch.max_in_flight": "1024", "fuse.io_threads": "64"})
    assert Plan.build(tree, staging, seed=3).digest == base


class RecordingPool:
    """A real ThreadPoolExecutor that notes what placement hands it and which threads ran it."""

    def __init__(self, pool: ThreadPoolExecutor) -> None:
        self.pool = pool
        self.seen: set[str] = set()
        self.threads: set[str] = set()

    def _noted(self, fn: Callable[..., T]) -> Callable[..., T]:
        def run(*args: Any) -> T:
            self.threads.add(threading.current_thread().name)
            return fn(*args)

        return run

    def map(self, fn: Callable[[A], T], iterable: Iterable[A], /) -> Iterator[T]:
        items = list(iterable)
        self.seen.add("columns" if items and isinstance(items[0], slice) else "nodes")
        return self.pool.map(self._noted(fn), items)

    def submit(self, fn: Callable[[], T], /) -> Future[T]:
        self.seen.add("ahead")
        return self.pool.submit(self._noted(fn))


def test_threads_change_no_plan_only_how_fast_it_is_made(tree_dir: Path) -> None:
    """placement starts no threads (tests/test_layering.py); given the caller's pool, it makes the
    plan the calling thread alone makes: same digest, same summary; and the pool's threads really ran
    every kind of step (per node, per range of objects, permutations ahead)."""
    tree = Snapshot.scan(str(tree_dir)).tree
    for spread in ("true", "false"):
        cfg = plan_config(**{"peers.spread": spread})
        alone = Plan.build(tree, cfg, seed=3)
        with ThreadPoolExecutor(max_workers=3, thread_name_prefix="test-plan") as pool:
            threaded = Plan.build(tree, cfg, seed=3, pool=pool, width=3)
            recording = RecordingPool(pool)
            recorded = Plan.build(tree, cfg, seed=3, pool=recording, width=3)
        assert recording.seen == {"nodes", "columns", "ahead"}
        assert recording.threads and all(t.startswith("test-plan") for t in recording.threads)
        for plan in (threaded, recorded):
            assert plan.digest == alone.digest
            assert plan.summary() == alone.summary()


def test_a_plan_reads_no_clock_its_caller_times_the_phases(tree_dir: Path) -> None:
    """The summary is the same on every build; the timings come from the caller (PlanTimer)."""
    tree = Snapshot.scan(str(tree_dir)).tree
    seen: list[str] = []
    plan = Plan.build(tree, plan_config(), seed=3, phases=seen.append)
    assert seen == ["streams", "access", "assign", "summary", "done"]
    assert "plan_seconds" not in plan.summary() and "timings" not in plan.summary()
    assert plan.summary() == Plan.build(tree, plan_config(), seed=3).summary()
    timer = PlanTimer()
    stamped = timer.stamp(Plan.build(tree, plan_config(), seed=3, phases=timer)).summary()
    assert stamped["plan_seconds"] >= sum(stamped["timings"].values()) - 0.002  # rounding
    assert set(stamped["timings"]) == {"access_s", "assign_s", "summary_s"}


DIGEST_SCRIPT = """
import sys
if sys.argv[2] == "numpy":
    sys.modules["torch"] = None
from fusefs.config import load
from fusefs.meta.snapshot import Snapshot
from placement.plan import Plan
from placement.randperm import torch_available
cfg = load(None, {"datasets": "[{root: train}, {root: val, follows: train, sampler: {shuffle: false}}]",
    "job.world_size": "8", "job.ranks_per_node": "2", "job.epochs": "6", "job.batch_size": "4",
    "tiers": "[{kind: memory, bytes: 40000}, {kind: directory, path: /x, bytes: 60000}]"}).to_dict()
plan = Plan.build(Snapshot.scan(sys.argv[1]).tree, cfg, seed=3)
print(plan.digest, torch_available())
"""


@pytest.mark.torch
def test_digest_is_the_same_in_other_processes_hash_seeds_and_without_torch(tree_dir: Path) -> None:
    tree = Snapshot.scan(str(tree_dir)).tree
    here = Plan.build(tree, plan_config(), seed=3).digest
    seen = set()
    for hashseed, backend in (("1", "auto"), ("987654", "numpy")):
        env = {**os.environ, "PYTHONHASHSEED": hashseed, "PYTHONPATH": str(REPO)}
        out = subprocess.run(
            [sys.executable, "-c", DIGEST_SCRIPT, str(tree_dir), backend],
            capture_output=True,
            text=True,
            env=env,
            check=True,
            cwd=REPO,
        )
        digest, has_torch = out.stdout.split()
        assert digest == here
        seen.add(has_torch)
    assert seen == {"True", "False"}  # one run really planned without torch


def test_unpredictable_or_incomplete_setups_raise_one_line(tree_dir: Path) -> None:
    tree = Snapshot.scan(str(tree_dir)).tree
    bad = plan_config(**{"datasets.0.sampler.kind": "random", "datasets.0.sampler.persistent_workers": "true"})
    with pytest.raises(ValueError, match=r"datasets\.0\.sampler: persistent_workers=True needs num_workers"):
        Plan.build(tree, bad, seed=0)
    with pytest.raises(ValueError, match="order_file"):
        Plan.build(
            tree, plan_config(**{"datasets.0.sampler.kind": "list", "datasets.0.sampler.order_file": "o"}), seed=0
        )
    with pytest.raises(ValueError, match="no files"):
        Plan.build(tree, plan_config(**{"datasets.0.extensions": "[.png]"}), seed=0)


def test_pruning_keeps_the_newest_plans_and_a_writer_still_writing(tmp_path: Path) -> None:
    """Old plans beyond KEEP_PLANS go, and so does a temporary directory left by a killed writer; a
    temporary directory another daemon sharing the cache_dir is filling now stays."""
    from fusefs.config import Config
    from fusefs.planning.manager import KEEP_PLANS, STALE_WRITE_S, PlanManager

    plans = tmp_path / "plans"
    now = time.time()
    ages = {f"key{k}": 100.0 * k for k in range(KEEP_PLANS + 2)}  # key0 the newest
    ages |= {".key9.abc.tmp": 1.0, ".key8.def.tmp": STALE_WRITE_S + 60}
    for name, age in ages.items():
        (plans / name).mkdir(parents=True)
        (plans / name / "plan.json").write_text("{}")
        os.utime(plans / name, (now - age, now - age))
    manager = PlanManager(tmp_path / "s.npz", "fp", Config(), plans)
    manager._prune(keep=plans / "key5")
    kept = sorted(p.name for p in plans.iterdir())
    assert kept == sorted([".key9.abc.tmp", *(f"key{k}" for k in range(KEEP_PLANS - 1)), "key5"]), kept
