"""Seed discovery: the daemon finds the sampler's seed from a node's first opens when none is written
or the written one is wrong, adopts it only below the cursor's false-lock chance, and never stalls.

Three levels, each checked against something the code under test does not compute:

* the decisions (placement.discovery): which dataset and sampler a config makes searchable, when
  the opens suffice, how the outcome reads;
* the search worker as the daemon runs it (a subprocess fed JSON lines), over a real snapshot,
  with opens from torch's own DistributedSampler;
* real mounts over the PFS emulator with real DDP reader processes (ImageFolder, DataLoader
  workers, DistributedSampler or a seeded shuffling DataLoader): nothing written, a wrong seed
  written, a seed no search range holds.  Every sample's bytes are checked against digests made
  from the source before mounting; PFS traffic comes from the emulator's own counters.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import trio
from e2e import Job, make_source, run_readers, seerfs_config, seerfs_over, status, write_seed
from indices import Indices
from pfsemu_fixture import running_pfsemu
from torch.utils.data import DistributedSampler

from fusefs import config as cfgmod
from fusefs.meta.snapshot import load_or_scan, snapshot_file
from fusefs.planning.discovery import SeedDiscovery
from fusefs.planning.seed import SeedState
from placement import discovery as dv
from placement import seedsearch as ss
from placement.catalog import build_catalogs
from placement.plan import job_streams_of
from placement.streams import JobShape

ROOT = Path(__file__).resolve().parent.parent
WRONG_SEED = 0x9E3779B97F4A7C15  # a 64-bit seed: low 32 bits 2135587861, beyond every default range
TRAIN, VAL = 600, 60
PACE = 0.005
"""Seconds of (slept) compute per sample in the jobs that must be predicted from the next epoch on: a
GPU's pace.  With none, an epoch of this dataset takes about two seconds on a busy machine, less than
starting the search process, the search at low priority, the plan and the relock may take there."""


CONFIG = {
    "datasets.0.root": "train",
    "datasets.1.root": "val",
    "datasets.1.follows": "train",
    "datasets.1.sampler.shuffle": "false",
    "job.world_size": "4",
    "job.ranks_per_node": "2",
    "job.batch_size": "8",
}


def config_dict(**overrides: str) -> dict[str, Any]:
    return cfgmod.load(None, {**CONFIG, **overrides}).to_dict()


# ---- the decisions -------------------------------------------------------------------------------


def test_search_setup_is_the_lead_dataset_and_its_configured_sampler() -> None:
    cfg = config_dict()
    setup = dv.search_setup(cfg, job_streams_of(cfg, [1000, 100]))
    assert (setup.lead, setup.root, setup.n, setup.kinds, setup.reason) == (0, "train", 1000, ("distributed",), None)
    assert setup.start_opens == 2 * 8 * 2  # two batches per local rank
    cfg = config_dict(**{"datasets.0.sampler.kind": "random"})
    setup = dv.search_setup(cfg, job_streams_of(cfg, [1000, 100]))
    assert setup.kinds == ("random",) and setup.start_opens == 2 * 8  # every rank reads the same order
    # a validation set is never the lead, even when it is larger
    cfg = config_dict()
    assert dv.search_setup(cfg, job_streams_of(cfg, [100, 5000])).root == "train"


@pytest.mark.parametrize(
    ("overrides", "why"),
    [
        ({"datasets.0.sampler.kind": "sequential"}, "sampler.kind sequential"),
        ({"datasets.0.sampler.shuffle": "false"}, "sampler.shuffle false"),
    ],
)
def test_samplers_without_a_seed_are_not_searchable(overrides: dict[str, str], why: str) -> None:
    cfg = config_dict(**overrides)
    setup = dv.search_setup(cfg, job_streams_of(cfg, [1000, 100]))
    assert not setup.searchable and why in (setup.reason or "")
    one = config_dict()
    assert "single order" in (dv.search_setup(one, job_streams_of(one, [1, 1])).reason or "")


def test_start_waits_for_two_batches_but_never_past_half_an_epoch() -> None:
    cfg = config_dict(**{"job.batch_size": "256", "job.ranks_per_node": "4", "job.world_size": "8"})
    assert dv.search_setup(cfg, job_streams_of(cfg, [1_281_167, 100])).start_opens == 2048
    small = dv.search_setup(cfg, job_streams_of(cfg, [80, 10]))  # 10 files per rank, 40 per node
    assert small.start_opens == 20
    huge = config_dict(**{"job.batch_size": "4096"})
    assert dv.search_setup(huge, job_streams_of(huge, [10**6, 10])).start_opens == dv.MAX_OPENS


def test_gate_asks_for_half_as_many_more_opens_after_too_few_and_gives_up_at_the_cap() -> None:
    gate = dv.OpensGate(32)
    assert not gate.ready(31) and gate.ready(32)
    gate.too_few(32)
    assert gate.need == 48 and not gate.ready(47) and gate.ready(48)
    gate.too_few(3000)
    assert gate.need == dv.MAX_OPENS
    gate.too_few(dv.MAX_OPENS)
    assert gate.exhausted and not gate.ready(10**6)


def test_candidates_try_the_likely_tier_first() -> None:
    plan, likely = dv.candidates(1 << 24, 1000)
    assert len(plan) == len(ss.default_candidates()) and likely == len(ss.default_candidates(limit=1 << 16))
    first = np.concatenate([c for _, c in zip(range(8), plan.chunks(1 << 16), strict=False)])[:likely]
    assert {0, 42, 3407, 65535, 20240229, 20240229 + 3} <= set(first.tolist())
    small, likely_small = dv.candidates(1000, 10)
    assert likely_small == len(small)  # a range inside the likely tier: everything is likely


def test_outcome_lines() -> None:
    shape = JobShape(2, 2, 8, False)
    orders = []
    for rank in (0, 1):
        s: Any = DistributedSampler(Indices(500), num_replicas=2, rank=rank, seed=45)
        orders.append([int(i) for i in s][:16])
    opens = [i for pair in zip(*orders, strict=True) for i in pair]
    plan = ss.Candidates(first=ss.COMMON_SEEDS, ranges=[(0, 1 << 12)])
    found = ss.SeedSearch(500, opens, shape, candidates=plan).run()
    assert dv.describe(found) == "seed+epoch = 45 (DistributedSampler, node 0)"
    fields = dv.result_fields(found)
    assert fields["seed"] == 45 and fields["identifies"] == "seed+epoch" and fields["false_match_chance"] < 1e-6
    missing = ss.SeedSearch(500, opens, shape, candidates=ss.Candidates(ranges=[(100, 200)])).run()
    assert dv.describe(missing) == "not found (searched 100 candidates)"
    assert dv.result_fields(missing)["seed"] is None


def test_a_match_fits_the_seed_in_use_in_one_of_its_plans_epochs() -> None:
    """A DistributedSampler seeded 17 reads in epoch 12 what one seeded 29 reads in epoch 0 (torch's
    own sampler says so here), so a search that finds 29 does not contradict a written 17 when the
    plan covers epoch 12; outside the plan's epochs, or for a seeded DataLoader (found only from its
    epoch 0), it does."""

    def order(seed: int, epoch: int) -> list[int]:
        s: Any = DistributedSampler(Indices(500), num_replicas=2, rank=1, seed=seed)
        s.set_epoch(epoch)
        return [int(i) for i in s]

    assert order(17, 12) == order(29, 0) != order(17, 0)
    assert dv.epoch_in_plan(17, 29, "seed+epoch", 50) == 12
    assert dv.epoch_in_plan(17, 29, "seed+epoch", 12) is None  # the plan ends at epoch 11
    assert dv.epoch_in_plan(17, 17, "seed+epoch", 1) == 0
    assert dv.epoch_in_plan(29, 17, "seed+epoch", 50) is None  # no epoch before 0
    assert dv.epoch_in_plan(2**32 + 5, 7, "seed+epoch", 3) == 2  # torch keeps the low 32 bits
    assert dv.epoch_in_plan(17, 29, "seed", 50) is None
    assert dv.epoch_in_plan(17, 17, "seed", 50) == 0


def test_status_view_shows_the_search_in_one_line() -> None:
    from fusefs.cli.status_view import render

    base = {"enabled": True, "candidates_planned": 17_067_160, "opens_recorded": 80, "opens_needed": 64}
    found = {
        **base,
        "state": "found",
        "result": "seed+epoch = 45 (DistributedSampler, node 0)",
        "hits": 64,
        "opens_used": 64,
        "false_match_chance": 3e-40,
        "candidates_tried": 65536,
        "seconds": 0.31,
    }
    text = render({"discovery": found})
    assert "discovery seed+epoch = 45 (DistributedSampler, node 0): 64 of 64 opens fit" in text
    assert "65,536 candidates in 0.31s" in text
    running = {**base, "state": "searching", "tier": "range", "candidates_tried": 1_000_000, "fraction": 0.06}
    assert "searching (range tier)" in render({"discovery": running})
    missing = {**base, "state": "not_found", "result": "not found (searched 17,067,160 candidates)"}
    assert "discovery not found (searched 17,067,160 candidates)" in render({"discovery": missing})
    assert "discovery" not in render({"discovery": {**base, "state": "idle"}})


# ---- the search worker ---------------------------------------------------------------------------


def interleaved(n: int, world: int, ranks: tuple[int, ...], seed: int, epoch: int, batch: int) -> list[int]:
    """A node's opens of its ranks' first batches, each rank's two DataLoader workers alternating batches
    and the ranks taking turns, from torch's own DistributedSampler."""
    streams = []
    for r in ranks:
        s: Any = DistributedSampler(Indices(n), num_replicas=world, rank=r, seed=seed)
        s.set_epoch(epoch)
        order = [int(i) for i in s]
        b0, b1 = order[:batch], order[batch : 2 * batch]
        streams.append([f for pair in zip(b0, b1, strict=True) for f in pair] + order[2 * batch : 8 * batch])
    return [f for group in zip(*streams, strict=True) for f in group]


def run_worker(request: dict[str, Any], feeds: list[list[int]], code: int = 0) -> list[dict[str, Any]]:
    lines = [json.dumps(request)] + [json.dumps({"opens": f}) for f in feeds]
    proc = subprocess.run(
        [sys.executable, "-m", "fusefs.planning.search_worker"],
        input="\n".join(lines) + "\n",
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
        check=False,
    )
    assert proc.returncode == code, proc.stderr[-2000:]
    return [json.loads(line) for line in proc.stdout.splitlines()]


@pytest.fixture(scope="module")
def snapshot(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    root = tmp_path_factory.mktemp("disc-src") / "data"
    make_source(root, TRAIN, VAL, mean_size=200)
    cache = root.parent / "cache"
    snap, _ = load_or_scan(str(root), cache)
    return snapshot_file(cache, snap.source), snap


def request_for(snap_file: Path, cfg: dict[str, Any], limit: int = 1 << 24) -> dict[str, Any]:
    return {"snapshot": str(snap_file), "config": cfg, "limit": limit, "epoch_span": 1000, "threshold": 1e-6}


def test_worker_finds_seed_plus_epoch_from_exactly_two_batches_per_local_rank(snapshot: tuple[Path, Any]) -> None:
    snap_file, snap = snapshot
    cfg = config_dict()
    train = build_catalogs(snap.tree, cfg)[0]
    val_entries = build_catalogs(snap.tree, cfg)[1].entry[:5].tolist()
    # node 1 (ranks 2 and 3) of a job with seed 3400 resumed in epoch 7; a validation pass opened first
    idx = interleaved(TRAIN, 4, (2, 3), 3400, 7, 8)
    entries = val_entries + train.entry[idx].tolist()
    feeds = [entries[i : i + 5] for i in range(0, len(entries), 5)]
    out = run_worker(request_for(snap_file, cfg), feeds)
    phases = [d["phase"] for d in out]
    assert phases[:2] == ["preparing", "ready"] and phases[-1] == "done", phases
    ready = out[1]
    assert (ready["dataset"], ready["files"], ready["sampler"], ready["need"]) == ("train", TRAIN, ["distributed"], 32)
    # no layout given: the modelled orders, the likely seeds only; this tree lists alike in every one, so
    # one order is searched
    likely = len(dv.candidates(1 << 16, 1000)[0])
    assert ready["orders"] == ["imagefolder"] and ready["planned"] == ready["likely"] == likely
    searching = next(d for d in out if d["phase"] == "searching")
    assert searching["opens"] == 32 and searching["tier"] == "likely"
    done = out[-1]
    assert (done["status"], done["seed"], done["identifies"], done["node"]) == ("found", 3407, "seed+epoch", 1)
    assert done["opens"] == 32 and done["false_match_chance"] < 1e-6
    assert done["result"] == "seed+epoch = 3407 (DistributedSampler, node 1, imagefolder order)"
    assert done["order"] == "imagefolder" and done["orders"] == ["imagefolder"] and done["candidates_planned"] == likely
    configured = config_dict(**{"datasets.0.layout": "imagefolder"})  # a layout given: the whole range too
    ready = run_worker(request_for(snap_file, configured), feeds)[1]
    assert ready["planned"] == len(ss.default_candidates()) and ready["likely"] < ready["planned"]


def test_worker_reports_too_few_opens_and_unsearchable_jobs(snapshot: tuple[Path, Any]) -> None:
    snap_file, snap = snapshot
    cfg = config_dict()
    train = build_catalogs(snap.tree, cfg)[0]
    idx = interleaved(TRAIN, 4, (0, 1), 42, 0, 8)
    out = run_worker(request_for(snap_file, cfg), [train.entry[idx[:2]].tolist()])  # then EOF: no more
    done = out[-1]
    assert done["phase"] == "done" and done["status"] == "too_few_opens", done
    assert "distinct files of 'train'" in done["reason"]
    seq = config_dict(**{"datasets.0.sampler.kind": "sequential"})
    out = run_worker(request_for(snap_file, seq), [train.entry[idx].tolist()])
    assert out[-1]["status"] == "not_searchable" and "sequential" in out[-1]["reason"]
    assert out[-1]["result"].startswith("not searchable (")


def test_worker_refuses_a_bad_request_in_one_line(snapshot: tuple[Path, Any]) -> None:
    snap_file, _snap = snapshot
    out = run_worker({**request_for(snap_file, config_dict()), "snapshot": "/nonexistent/snap.npz"}, [], code=1)
    assert out[-1]["phase"] == "failed" and "\n" not in out[-1]["error"]


def seed_followed_by(followers: list[SeedDiscovery], me: int) -> SeedState:
    """A seed whose adoptions the discoveries in ``followers`` hear of, as the daemon wires them
    (``SeedState.listeners``, given at construction); a discovery built later joins the list."""

    def tell(seed: SeedState) -> None:
        for disc in followers:
            disc.seed_changed(seed)

    return SeedState(me=me, listeners=(tell,))


def search_to_the_end(disc: SeedDiscovery) -> None:
    """Run the discovery task until the search it was asked for has ended."""

    async def main() -> None:
        with trio.fail_after(120):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(disc.run)
                while disc.state in ("waiting", "preparing", "searching"):
                    await trio.sleep(0.05)
                nursery.cancel_scope.cancel()

    trio.run(main)


def test_a_match_found_after_a_newer_seed_arrived_is_dropped(snapshot: tuple[Path, Any]) -> None:
    """The daemon's discovery path in-process (SeedDiscovery, its real search worker, torch's own
    opens): the cursor calls the written 99 a mismatch, which asks for a search; a peer's newer write,
    17, arrives before the search ends (here: before it even started, the one window in which it
    arrives without killing the search).  The search finds 3407 and reports it, but 17 stays the
    seed: a match never replaces a seed that came after the search was asked for.  Only a mismatch
    of 17 itself then adopts it."""
    snap_file, snap = snapshot
    # a layout given: a seed arriving starts no search of its own for the order the job reads
    cfg = cfgmod.load(None, {**CONFIG, "seed_discovery.limit": str(1 << 16), "datasets.0.layout": "imagefolder"})
    train = build_catalogs(snap.tree, cfg.to_dict())[0]
    followers: list[SeedDiscovery] = []
    here, peer = seed_followed_by(followers, me=1), SeedState(me=0)
    here.set(99, "written")
    peer.set(99, "peer", generation=here.generation, writer=here.writer)
    disc = SeedDiscovery(snap_file, cfg, here)
    followers.append(disc)
    disc.on_cursor("mismatch", 99)
    assert disc.state == "waiting"
    peer.set(17, "written")
    here.set(17, "peer", generation=peer.generation, writer=peer.writer)
    for entry in train.entry[interleaved(TRAIN, 4, (2, 3), 3400, 7, 8)].tolist():
        disc.on_open(entry)
    search_to_the_end(disc)
    st = disc.status()
    assert (st["result"], st["seed"]) == ("seed+epoch = 3407 (DistributedSampler, node 1, imagefolder order)", 3407), st
    assert (here.value, here.origin) == (17, "peer")
    assert (st["state"], st["superseded"]) == ("stopped", 1), st
    assert "17" in (st["note"] or "") and "3407" in (st["note"] or ""), st
    disc.on_cursor("mismatch", 17)  # its opens are 17's too: the answer holds for 17
    assert (here.value, here.origin) == (3407, "discovered")


def test_opens_from_before_a_written_seed_never_replace_it(snapshot: tuple[Path, Any]) -> None:
    """A job reseeds mid-run: seed 5 from epoch 0, then 17 written (on a peer) before epoch 12.  The
    cursor calls 17 a mismatch at once (its new plan is first tried on the opens of epoch 11, seed
    5's order), which asks for a search.  The mount's first opens are seed 5's: a search on them finds
    5, which says nothing about 17.  The search must compare only opens recorded since 17 arrived;
    those fit 17 in its epoch 12 (found as 29), so 17 stays, and status says the mismatch has
    another cause.  (Before: 5 replaced 17 as discovered, on every node.)"""
    snap_file, snap = snapshot
    cfg = cfgmod.load(None, {**CONFIG, "job.epochs": "50", "seed_discovery.limit": str(1 << 16)})
    train = build_catalogs(snap.tree, cfg.to_dict())[0]
    followers: list[SeedDiscovery] = []
    here, peer = seed_followed_by(followers, me=1), SeedState(me=0)
    peer.set(5, "written")
    here.set(5, "peer", generation=peer.generation, writer=peer.writer)
    disc = SeedDiscovery(snap_file, cfg, here)
    followers.append(disc)
    for entry in train.entry[interleaved(TRAIN, 4, (2, 3), 5, 0, 8)].tolist():  # epoch 0 under seed 5
        disc.on_open(entry)
    peer.set(17, "written")
    here.set(17, "peer", generation=peer.generation, writer=peer.writer)
    disc.on_cursor("mismatch", 17)
    for entry in train.entry[interleaved(TRAIN, 4, (2, 3), 17, 12, 8)].tolist():  # epoch 12 under seed 17
        disc.on_open(entry)

    search_to_the_end(disc)
    st = disc.status()
    assert (here.value, here.origin) == (17, "peer"), (st["result"], st["note"])
    assert (st["state"], st["seed"], st["identifies"]) == ("found", 29, "seed+epoch"), st
    assert "17, fits the opens" in (st["note"] or ""), st
    # A later mismatch of 17 reuses this search's answer: 17 fits, nothing is adopted.
    disc.on_cursor("mismatch", 17)
    assert (here.value, here.origin, disc.state) == (17, "peer", "found")


# ---- real mounts -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str], int]:
    root = tmp_path_factory.mktemp("disc-pfs") / "data"
    digests, total = make_source(root, TRAIN, VAL)
    return root, digests, total


def run_job(
    tmp_path: Path,
    source: tuple[Path, dict[str, str], int],
    job: Job,
    *,
    written: int | None = None,
    **extra: Any,
) -> tuple[dict[str, Any], list[dict[str, Any]], int]:
    """Mount over the emulator, write ``written`` (if any) before the job starts, run the readers;
    returns (status after the job, reader results, PFS bytes the emulator served since before the mount)."""
    root, digests, total = source
    tmp_path.mkdir(parents=True, exist_ok=True)
    tiers = [{"kind": "memory", "bytes": f"{int(total * 1.5) + (16 << 20)}", "threads": 4}]
    cfg = seerfs_config(tmp_path / "seerfs.yaml", job, cache_dir=tmp_path / "cache", tiers=tiers, **extra)
    with running_pfsemu(root) as emu, seerfs_over(emu.mountpoint, tmp_path / "mnt", cfg) as mnt:
        if written is not None:
            write_seed(mnt, written)
        results = run_readers(mnt, job, digests, tmp_path / "run")
        doc = status(mnt)
        return doc, results, emu.counters().bytes


def assert_found(doc: dict[str, Any], job: Job, value: int, identifies: str = "seed+epoch") -> None:
    """Found ``value`` from exactly two batches per local rank, planned and followed to the end."""
    disc, seed, plan, cursor = doc["discovery"], doc["seed"], doc["plan"], doc["cursor"]
    assert disc["state"] == "found", disc
    assert (disc["seed"], disc["identifies"]) == (value, identifies), disc
    ranks = job.world_size if job.sampler == "distributed" else 1
    assert disc["opens_used"] == 2 * job.batch_size * ranks, disc  # the first two batches per local rank
    assert disc["false_match_chance"] < disc["threshold"] == 1e-6
    assert disc["seconds"] is not None and disc["candidates_tried"] <= disc["candidates_planned"]
    assert (seed["value"], seed["origin"]) == (value, "discovered"), seed
    assert (plan["state"], plan["seed"]) == ("ready", value), plan
    # The last epoch wholly predicted: the cursor's epoch under the discovered plan.  (Not the history's
    # last row: a plan replaced earlier numbers its own epochs, and the assumed seed 0's plan may have
    # locked on its epoch 5 when the job's seed is 5.)
    last = next(row for row in cursor["history"] if row["epoch"] == cursor["epoch"])
    # On failure, each dataset's counters too: which pass (training or validation) the miss fell in.
    per_dataset = [
        {k: d[k] for k in ("dataset", "opens", "hits", "strays", "locks", "lock_opens", "passes")}
        for d in cursor["datasets"]
    ]
    assert last["hits"] == last["opens"] > 0, (cursor["history"], per_dataset)


@pytest.mark.mount
@pytest.mark.torch
def test_nothing_written_finds_the_seed_and_plans_it(tmp_path: Path, source: tuple[Path, dict[str, str], int]) -> None:
    job = Job(seed=42, epochs=2, compute_s=PACE)
    doc, results, pfs = run_job(tmp_path, source, job)
    assert all(not r["bad"] for r in results), [r["bad"][:3] for r in results]
    assert_found(doc, job, 42)
    assert doc["discovery"]["trigger"] == "no seed written"
    assert pfs <= 1.05 * source[2], pfs / source[2]


@pytest.mark.mount
@pytest.mark.torch
def test_a_wrong_written_seed_is_corrected(tmp_path: Path, source: tuple[Path, dict[str, str], int]) -> None:
    """The search starts only once the cursor calls the written seed a mismatch; three epochs, so the
    search process, the plan and the relock fit before the last one even on a busy machine."""
    job = Job(seed=1234, epochs=3, compute_s=PACE)
    doc, results, pfs = run_job(tmp_path, source, job, written=99)
    assert all(not r["bad"] for r in results), [r["bad"][:3] for r in results]
    assert_found(doc, job, 1234)
    assert doc["discovery"]["trigger"] == "the written seed 99 does not match the opens"
    assert doc["seed"]["generation"] == 3  # written (2), then discovered under it (3: next_generation)
    assert pfs <= 1.05 * source[2], pfs / source[2]


@pytest.mark.mount
@pytest.mark.torch
def test_a_seed_outside_the_range_is_not_found_and_never_locked(
    tmp_path: Path, source: tuple[Path, dict[str, str], int]
) -> None:
    """A random 64-bit seed: the likely tier of every modelled order finds nothing (no layout given:
    no range follows), the seed stays assumed, the cursor reports the mismatch and the reactive policy
    serves every byte correctly."""
    job = Job(seed=WRONG_SEED, epochs=2)
    doc, results, pfs = run_job(tmp_path, source, job)
    assert all(not r["bad"] for r in results), [r["bad"][:3] for r in results]
    disc = doc["discovery"]
    assert disc["state"] == "not_found" and disc["seed"] is None, disc
    assert disc["result"].startswith(dv.NO_ORDER_FITS), disc["result"]
    # the likely seeds of each order (here all list the tree as ImageFolder does: one searched), no range
    assert disc["candidates_tried"] == disc["candidates_planned"] == len(dv.candidates(1 << 16, 1000)[0]), disc
    assert disc["orders"] == "imagefolder", disc
    assert "write the seed" in disc["reason"], disc["reason"]
    assert disc["best_chance"] > 1e-6
    assert (doc["seed"]["value"], doc["seed"]["origin"]) == (0, "assumed")
    assert doc["cursor"]["state"] == "mismatch" and doc["prefetch"]["mode"] == "reactive"
    assert pfs <= 2.05 * source[2], pfs / source[2]


# ---- slow: the rest of the cases -------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.mount
@pytest.mark.torch
@pytest.mark.parametrize(("seed", "value"), [(0, 0), (3407, 3407), (20240229, 20240229), (2**32 + 5, 5)])
def test_nothing_written_finds_common_seeds_dates_and_the_low_32_bits(
    tmp_path: Path, source: tuple[Path, dict[str, str], int], seed: int, value: int
) -> None:
    job = Job(seed=seed, epochs=3, compute_s=PACE)  # a date is late in the likely tier: an epoch to spare
    doc, results, pfs = run_job(tmp_path, source, job)
    assert all(not r["bad"] for r in results), [r["bad"][:3] for r in results]
    assert_found(doc, job, value)
    assert doc["discovery"]["candidates_tried"] <= doc["discovery"]["likely_candidates"]  # the likely tier
    assert pfs <= 1.05 * source[2], pfs / source[2]


@pytest.mark.slow
@pytest.mark.mount
@pytest.mark.torch
def test_a_job_resumed_in_epoch_3_is_found_as_seed_plus_3_and_followed_into_epoch_4(
    tmp_path: Path, source: tuple[Path, dict[str, str], int]
) -> None:
    job = Job(seed=42, start_epoch=3, epochs=5, compute_s=PACE)
    doc, results, pfs = run_job(tmp_path, source, job)
    assert all(not r["bad"] for r in results), [r["bad"][:3] for r in results]
    assert_found(doc, job, 45)  # the plan for 45 reads job epoch 3 as its epoch 0, epoch 4 as its epoch 1
    assert doc["cursor"]["epoch"] == 1, doc["cursor"]["history"]
    assert pfs <= 1.05 * source[2], pfs / source[2]


@pytest.mark.slow
@pytest.mark.mount
@pytest.mark.torch
def test_a_seeded_shuffling_dataloader_is_found(tmp_path: Path, source: tuple[Path, dict[str, str], int]) -> None:
    job = Job(seed=1337, epochs=2, world_size=1, sampler="random", compute_s=PACE)
    doc, results, pfs = run_job(tmp_path, source, job)
    assert all(not r["bad"] for r in results), [r["bad"][:3] for r in results]
    assert_found(doc, job, 1337, identifies="seed")
    assert doc["discovery"]["sampler"] == "random"
    assert pfs <= 1.05 * source[2], pfs / source[2]


@pytest.mark.slow
@pytest.mark.mount
@pytest.mark.torch
@pytest.mark.mpi
def test_two_nodes_each_find_the_seed(tmp_path: Path, source: tuple[Path, dict[str, str], int]) -> None:
    """Two daemons (a rendezvous group), one rank each: the seed is found from each node's own opens
    (or taken from the peer that found it first), the group plans it and reads the PFS about once."""
    from tools.harness.nodes import rendezvous_group

    root, digests, total = source
    job = Job(seed=42, epochs=2, world_size=2)
    with running_pfsemu(root) as emu, rendezvous_group(emu.mountpoint, tmp_path, job, tier_bytes=total, n=2) as mnts:
        results = run_readers(mnts, job, digests, tmp_path / "run")
        docs = [status(m) for m in mnts]
        pfs = emu.counters().bytes
    assert all(not r["bad"] for r in results), [r["bad"][:3] for r in results]
    for d in docs:
        assert (d["seed"]["value"], d["plan"]["seed"]) == (42, 42), d["seed"]
        assert d["seed"]["origin"] in ("discovered", "peer")
        last = d["cursor"]["history"][-1]
        assert last["hits"] == last["opens"] > 0, d["cursor"]["history"]
    assert any(d["discovery"]["state"] == "found" for d in docs), [d["discovery"] for d in docs]
    assert sorted(d["cursor"]["node"] for d in docs) == [0, 1]
    assert pfs <= 1.05 * total, pfs / total


def wait_discovery(mnt: Path, timeout: float) -> dict[str, Any]:
    from tools.harness.mounts import wait_for

    wait_for(lambda: status(mnt)["discovery"]["state"] not in ("waiting", "preparing", "searching"), timeout=timeout)
    return status(mnt)


@pytest.mark.slow
@pytest.mark.mount
@pytest.mark.torch
@pytest.mark.parametrize(("seed", "value"), [(2**24 - 1, 2**24 - 1), (WRONG_SEED, None)])
def test_the_whole_default_range(
    tmp_path: Path, source: tuple[Path, dict[str, str], int], seed: int, value: int | None
) -> None:
    """2**24 - 1, the last value of the default range, is found after the whole range (at nice 19: on a
    busy machine this takes long); a random 64-bit seed is not, and nothing is locked on.  A first job
    of one epoch gives the opens; a second one, started after the search ended, reads epoch 1."""
    root, digests, total = source
    tiers = [{"kind": "memory", "bytes": f"{int(total * 1.5) + (16 << 20)}", "threads": 4}]
    first, second = Job(seed=seed, epochs=1), Job(seed=seed, start_epoch=1, epochs=2)
    layout = [  # the configured order: searched over the whole range
        {"root": "train", "layout": "imagefolder", "sampler": {"kind": "distributed"}},
        {"root": "val", "follows": "train", "sampler": {"shuffle": False}},
    ]
    cfg = seerfs_config(tmp_path / "seerfs.yaml", first, cache_dir=tmp_path / "cache", tiers=tiers, datasets=layout)
    with running_pfsemu(root) as emu, seerfs_over(emu.mountpoint, tmp_path / "mnt", cfg) as mnt:
        results = run_readers(mnt, first, digests, tmp_path / "run1")
        doc = wait_discovery(mnt, timeout=3600)
        disc = doc["discovery"]
        assert disc["candidates_tried"] == disc["candidates_planned"] == len(ss.default_candidates()), disc
        results += run_readers(mnt, second, digests, tmp_path / "run2")
        after = status(mnt)
        pfs = emu.counters().bytes
    assert all(not r["bad"] for r in results), [r["bad"][:3] for r in results]
    if value is None:
        assert disc["state"] == "not_found" and disc["best_chance"] > 1e-6, disc
        assert after["seed"]["origin"] == "assumed" and after["prefetch"]["mode"] == "reactive"
    else:
        assert (disc["state"], disc["seed"]) == ("found", value), disc
        assert (after["seed"]["value"], after["plan"]["seed"]) == (value, value)
        last = after["cursor"]["history"][-1]
        assert last["hits"] >= 0.9 * last["opens"] > 0, after["cursor"]["history"]  # relocked in epoch 1
    assert pfs <= 1.05 * total, pfs / total
