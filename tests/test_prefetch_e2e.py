"""Clairvoyant prefetch end to end: real DDP readers over seerfs over the emulated PFS.

Each test mounts the emulator over a generated train/val tree, seerfs over the emulator, writes (or
not) the sampler seed, and runs two real reader processes (ImageFolder + DataLoader workers +
DistributedSampler with set_epoch, in step through a gloo barrier).  PFS traffic comes from the
emulator's counters; what the job should open comes from torch's own samplers.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from e2e import (
    Job,
    MemoryCgroup,
    RssSampler,
    daemon_pid,
    du,
    expected_opens,
    make_source,
    rss,
    run_readers,
    seerfs_config,
    seerfs_over,
    wait_plan,
    write_seed,
)
from mounting import status
from pfsemu_fixture import running_pfsemu

pytestmark = [pytest.mark.mount, pytest.mark.torch]

TRAIN, VAL = 600, 60


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str], int]:
    root = tmp_path_factory.mktemp("pfs-backing") / "data"
    digests, total = make_source(root, TRAIN, VAL)
    return root, digests, total


@pytest.fixture(scope="module")
def big_source(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str], int]:
    """A 60 MB tree: large enough that fixed overheads are small next to the budgets it is given."""
    root = tmp_path_factory.mktemp("pfs-big") / "data"
    digests, total = make_source(root, 1500, 0, mean_size=40_000)
    return root, digests, total


def run_job(
    tmp_path: Path,
    source: tuple[Path, dict[str, str], int],
    job: Job,
    *,
    seed: int | None,
    tiers: list[dict[str, object]],
    lookahead: str = "4MiB",
    discovery: bool = True,
) -> tuple[dict, list[dict], int]:  # type: ignore[type-arg]
    """Mount, optionally write ``seed``, run the readers; returns (status, reader results, PFS bytes)."""
    root, digests, _total = source
    tmp_path.mkdir(parents=True, exist_ok=True)
    cfg = seerfs_config(
        tmp_path / "seerfs.yaml",
        job,
        cache_dir=tmp_path / "cache",
        tiers=tiers,
        lookahead=lookahead,
        seed_discovery={"enabled": discovery},
    )
    # The emulator counts from before the mount: whatever seerfs reads for the job is counted.
    with running_pfsemu(root) as emu, seerfs_over(emu.mountpoint, tmp_path / "mnt", cfg) as mnt:
        if seed is not None:
            write_seed(mnt, seed)
            wait_plan(mnt, seed)
        results = run_readers(mnt, job, digests, tmp_path / "run")
        doc = status(mnt)
        return doc, results, emu.counters().bytes


def test_seeded_job_is_predicted_and_reads_the_pfs_once(
    tmp_path: Path, source: tuple[Path, dict[str, str], int]
) -> None:
    """Hit rate >= 99.9%, every sample's bytes right, PFS bytes <= 1.05x the dataset over 3 epochs."""
    job = Job(seed=7)
    doc, results, pfs_bytes = run_job(
        tmp_path, source, job, seed=7, tiers=[{"kind": "memory", "bytes": "64MiB", "threads": 4}]
    )
    assert all(not r["bad"] for r in results), [r["bad"][:3] for r in results]
    opens = expected_opens(job, TRAIN, VAL)
    assert sum(r["samples"] for r in results) == opens
    cursor = doc["cursor"]
    assert doc["reads"]["opens"] == opens
    assert cursor["node"] == 0 and cursor["ranks"] == [0, 1] and cursor["epoch"] == job.epochs - 1
    assert cursor["hit_rate"] >= 0.999, cursor
    assert not cursor["mismatch"]
    assert pfs_bytes <= 1.05 * source[2], (pfs_bytes, source[2])
    by_source = doc["reads"]["by_source"]
    assert by_source["page_cache"]["files"] + by_source["memory"]["files"] > opens * 0.6


def test_seed_beats_no_seed_with_tiers_half_the_dataset(
    tmp_path: Path, source: tuple[Path, dict[str, str], int]
) -> None:
    """With tiers holding half the dataset, the plan reads less from the PFS and stalls less than the
    reactive fallback (seed discovery off: it would find the seed; tests/test_discovery.py covers it)."""
    half = source[2] // 2
    tiers = [{"kind": "memory", "bytes": half + (2 << 20), "threads": 4}]  # + the staging share
    job = Job(seed=11, compute_s=0.00125)  # per sample: compute to hide I/O behind, as in training
    seeded = run_job(tmp_path / "seeded", source, job, seed=11, tiers=tiers, lookahead="2MiB")
    seedless = run_job(tmp_path / "seedless", source, job, seed=None, tiers=tiers, lookahead="2MiB", discovery=False)
    for _doc, results, _pfs in (seeded, seedless):
        assert all(not r["bad"] for r in results)
    assert seedless[0]["prefetch"]["mode"] == "reactive"  # the assumed seed 0 did not match: said so
    assert seeded[0]["cursor"]["hit_rate"] >= 0.999
    assert seeded[2] < seedless[2], (seeded[2], seedless[2])
    # The stall a reader sees is how long its opens waited for data (seerfs's own accounting; the
    # batch waits measured in the readers mostly show CPU contention among loader workers here).
    stall_seeded = seeded[0]["reads"]["stall_seconds"]
    stall_seedless = seedless[0]["reads"]["stall_seconds"]
    waits = [sum(r["wait_s"] for r in run[1]) for run in (seeded, seedless)]
    print(
        json.dumps(
            {
                "pfs_bytes": [seeded[2], seedless[2]],
                "open_stall_s": [stall_seeded, stall_seedless],
                "batch_wait_s": waits,
            }
        )
    )
    assert stall_seeded < 0.5 * stall_seedless, (stall_seeded, stall_seedless)


def test_resumed_job_is_detected(tmp_path: Path, source: tuple[Path, dict[str, str], int]) -> None:
    job = Job(seed=5, epochs=4, start_epoch=2)
    doc, results, _ = run_job(tmp_path, source, job, seed=5, tiers=[{"kind": "memory", "bytes": "64MiB", "threads": 4}])
    assert all(not r["bad"] for r in results)
    cursor = doc["cursor"]
    # Found from the opens: at most two batches per local rank (all ranks are local here) go
    # unpredicted before the lock (they are not credited afterwards), then every open is predicted.
    assert cursor["epoch"] == 3 and cursor["state"] == "tracking", cursor
    assert cursor["opens"] - cursor["hits"] <= 2 * job.batch_size * job.world_size, cursor
    last = cursor["history"][-1]
    assert last["epoch"] == 3 and last["hits"] == last["opens"], cursor["history"]


def test_wrong_seed_is_flagged_fast_and_reads_stay_correct(
    tmp_path: Path, source: tuple[Path, dict[str, str], int]
) -> None:
    job = Job(seed=9, epochs=1, val=False)
    root, digests, _ = source
    cfg = seerfs_config(
        tmp_path / "seerfs.yaml",
        job,
        cache_dir=tmp_path / "cache",
        tiers=[{"kind": "memory", "bytes": "64MiB", "threads": 4}],
        seed_discovery={"enabled": False},  # the fallback itself (discovery corrects it: tests/test_discovery.py)
    )
    with running_pfsemu(root) as emu, seerfs_over(emu.mountpoint, tmp_path / "mnt", cfg) as mnt:
        write_seed(mnt, 123)  # not the sampler's seed
        wait_plan(mnt, 123)
        results = run_readers(mnt, job, digests, tmp_path / "run")
        doc = status(mnt)
    assert all(not r["bad"] for r in results)
    assert doc["prefetch"]["mode"] == "reactive"
    cursor = doc["cursor"]
    assert cursor["mismatch"] and "seed, catalog order or sampler is not the job's" in cursor["mismatch_reason"]
    assert "seed discovery: off: write the sampler's seed" in cursor["mismatch_reason"], cursor["mismatch_reason"]
    assert cursor["first_mismatch_open"] <= job.num_workers * job.batch_size, cursor


def test_budgets_hold_with_a_dataset_three_times_the_tiers(
    tmp_path: Path, big_source: tuple[Path, dict[str, str], int]
) -> None:
    """Tier directory sizes, daemon RSS and the mount's page cache stay within their budgets."""
    root, digests, total = big_source
    mem, disk = total // 6, total // 6  # together a third of the dataset
    job = Job(seed=3, val=False)
    cfg = seerfs_config(
        tmp_path / "seerfs.yaml",
        job,
        cache_dir=tmp_path / "cache",
        tiers=[
            {"kind": "memory", "bytes": mem, "threads": 4},
            {"kind": "directory", "path": str(tmp_path / "ssd"), "bytes": disk, "threads": 2},
        ],
        lookahead=str(mem // 4),
    )
    group = MemoryCgroup.create("budget")
    try:
        with running_pfsemu(root) as emu, seerfs_over(emu.mountpoint, tmp_path / "mnt", cfg) as mnt:
            pid = daemon_pid(mnt)
            if group is not None:
                group.add(pid)
            write_seed(mnt, 3)
            wait_plan(mnt, 3)
            rss_before = rss(pid)
            cache_before = group.cache() if group is not None else 0
            sampler = RssSampler(pid)
            with sampler:
                results = run_readers(mnt, job, digests, tmp_path / "run", cgroup=group)
            doc = status(mnt)
            disk_used = du(tmp_path / "ssd")
            # Plans in the daemon use numpy's randperm (proven equal to torch's): torch, ~190 MB of
            # RSS the budgets do not count, must never be imported there (a sampler variant once did).
            torch_libs = [m for m in Path(f"/proc/{pid}/maps").read_text().splitlines() if "libtorch" in m]
            assert not torch_libs, f"the daemon imported torch: {torch_libs[0]}"
    finally:
        if group is not None:
            group.close()
    assert all(not r["bad"] for r in results)
    assert disk_used <= disk, (disk_used, disk)
    assert doc["memory_budget"]["peak"] <= mem
    # RSS: the memory tier and staging (<= mem) plus in-flight fetch buffers and bookkeeping.
    assert sampler.peak - rss_before <= mem + (8 << 20), (sampler.peak - rss_before, mem)
    if group is not None:
        # Everything the daemon pushed and the readers pulled through the mount, at its peak.
        assert group.peak_cache - cache_before <= mem + (1 << 20), (group.peak_cache - cache_before, mem)
    assert all(t["used_bytes"] <= t["budget_bytes"] for t in doc["tiers"])
    print(
        json.dumps(
            {
                "dataset": total,
                "mem_budget": mem,
                "disk_budget": disk,
                "disk": disk_used,
                "rss_growth": sampler.peak - rss_before,
                "page_cache_growth": group.peak_cache - cache_before if group else None,
            }
        )
    )
