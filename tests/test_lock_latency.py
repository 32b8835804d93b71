"""Lock latency: how soon a mount predicts a job's opens when the seed comes late or not at all.

Real mounts over the PFS emulator (20 ms opens, as a PFS under load) with real DDP reader processes
(ImageFolder, DataLoader workers, DistributedSampler, a gloo barrier per batch and 10 ms of slept
compute per batch of 8, a GPU's pace).  What is judged, and where it comes from:

* bytes: every sample against digests made from the source before mounting;
* PFS bytes: the emulator's own counters;
* the share of opens predicted, three ways: the mount's counters as the reader process reads them
  at each epoch's start (``reads.opens``, ``prefetch.predicted_opens``; the status keeps totals
  only); from outside seerfs, the readers' open log against the emulator's: an open is *served
  ahead* when the PFS had completed its file's first open before the reader began opening it (one
  machine-wide monotonic clock); and the readers' own clock: an open+read under the emulator's
  open latency did not wait for the PFS (reported only: on this shared host a cached read waits
  for a CPU past 20 ms often enough to decide a 90% bound).  Served ahead depends on how busy the
  machine is (the prefetch races the reader), so only the ``[wall-clock]`` twin asserts it;
* when the seed was found: status ``discovery.found_at_opens`` (opens the node had made).

The cases are the issue's bounds on lock latency: a job whose sampler seed is 42 with nothing
written is >= 90% predicted over 3 epochs and found within the node's first 128 opens; a seed
written by the job right before its loop predicts >= 95% of epoch 0 on a 2,000-file dataset.
"""

from __future__ import annotations

import itertools
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from e2e import Job, make_source, run_readers, seerfs_config, seerfs_over, status, write_seed
from mounting import wait_for
from pfsemu_fixture import PfsStats, requires_fuse, running_pfsemu

from fusefs.planning.discovery import STANDBY_AFTER

pytestmark = [pytest.mark.mount, pytest.mark.torch, requires_fuse, pytest.mark.timeout(900)]

OPEN_MS = 20  # the emulator's open latency: an unpredicted open waits this long at least
PACE = 0.01 / 8  # slept compute per sample: 10 ms per batch of 8
FOUND_WITHIN = 128  # opens of the node by which the seed must be found
ALL_MIN = 0.90  # share of all opens predicted with nothing written
EPOCH0_MIN = 0.95  # share of epoch 0 predicted with a seed written right before the loop
PFS_FACTOR = 1.05


def run(
    tmp_path: Path, files: int, job: Job, **extra: Any
) -> tuple[dict[str, Any], list[dict[str, Any]], PfsStats, int]:
    """Mount over the emulator, run the job; (status after, reader results, PFS bytes, dataset bytes)."""
    root = tmp_path / "pfs" / "data"
    digests, total = make_source(root, files, 0)
    tiers = [{"kind": "memory", "bytes": f"{int(total * 1.5) + (16 << 20)}", "threads": 4}]
    cfg = seerfs_config(
        tmp_path / "seerfs.yaml",
        job,
        cache_dir=tmp_path / "cache",
        tiers=tiers,
        prefetch_threads=None,
        **extra,
    )
    with (
        running_pfsemu(root, open_latency_ms=OPEN_MS, extra_args=("--threads", "64")) as emu,
        seerfs_over(emu.mountpoint, tmp_path / "mnt", cfg) as mnt,
    ):
        results = run_readers(mnt, job, digests, tmp_path / "run")
        doc = status(mnt)
        return doc, results, emu.counters(files=True), total


def per_epoch(doc: dict[str, Any], rank0: dict[str, Any]) -> list[dict[str, Any]]:
    """Opens and predicted opens per epoch: counters at each epoch's start, and at the end."""
    marks = [e["counts_before"] for e in rank0["epochs"]]
    marks.append({"opens": doc["reads"]["opens"], "predicted": doc["prefetch"]["predicted_opens"]})
    out = []
    for before, after in itertools.pairwise(marks):
        opens, predicted = after["opens"] - before["opens"], after["predicted"] - before["predicted"]
        out.append({"opens": opens, "predicted": predicted, "rate": round(predicted / opens, 4) if opens else None})
    return out


def fast_share(results: list[dict[str, Any]], epoch: int) -> float:
    """The readers' own measure: the share of the epoch's opens+reads shorter than the PFS's open latency."""
    times: list[float] = [t for r in results for e in r["epochs"] if e["epoch"] == epoch for t in e["reads_s"]]
    return sum(t < OPEN_MS / 1000 for t in times) / len(times)


def served_ahead(results: list[dict[str, Any]], pfs: PfsStats, epoch: int) -> float:
    """From outside seerfs: the share of the epoch's opens whose file the PFS had opened (completed)
    before the reader began to open it."""
    opened = [(rel, at) for r in results for e in r["epochs"] if e["epoch"] == epoch for rel, at in e["opened_at"]]
    ahead = 0
    for rel, at in opened:
        first = pfs.files[rel].first_open if rel in pfs.files else None
        ahead += first is not None and first < at
    return ahead / len(opened)


def ahead_by_tenth(results: list[dict[str, Any]], pfs: PfsStats, epoch: int) -> list[float]:
    """Served ahead per tenth of the epoch, in each rank's consumption order: where the misses are
    (a late lock misses the start, a prefetch slower than the readers misses throughout)."""
    tenths: list[list[bool]] = [[] for _ in range(10)]
    for r in results:
        opened = next(e["opened_at"] for e in r["epochs"] if e["epoch"] == epoch)
        for i, (rel, at) in enumerate(opened):
            first = pfs.files[rel].first_open if rel in pfs.files else None
            tenths[i * 10 // len(opened)].append(first is not None and first < at)
    return [round(sum(t) / len(t), 3) if t else 0.0 for t in tenths]


def report(name: str, **fields: Any) -> None:
    print(json.dumps({"test": name, **fields}))


def test_nothing_written_seed_42_is_found_within_128_opens(tmp_path: Path, wall_clock: bool) -> None:
    """Sampler seed 42, nothing written, 503 files, 3 epochs, 2 ranks, batch 8, 2 workers."""
    job = Job(seed=42, epochs=3, batch_size=8, num_workers=2, val=False, compute_s=PACE)
    job.status_counts = job.time_reads = True
    doc, results, emu, total = run(tmp_path, 503, job)
    pfs = emu.bytes
    assert all(not r["bad"] for r in results), [r["bad"][:3] for r in results]
    epochs = per_epoch(doc, results[0])
    disc = doc["discovery"]
    opens = sum(e["opens"] for e in epochs)
    predicted = sum(e["predicted"] for e in epochs)
    fast = [round(fast_share(results, e), 4) for e in range(job.epochs)]
    ahead = [round(served_ahead(results, emu, e), 4) for e in range(job.epochs)]
    report(
        "nothing_written_42",
        epochs=epochs,
        all_rate=round(predicted / opens, 4),
        found_at_opens=disc["found_at_opens"],
        discovery_seconds=disc["seconds"],
        fast=fast,
        ahead=ahead,
        ahead_epoch0_by_tenth=ahead_by_tenth(results, emu, 0),
        pfs=round(pfs / total, 3),
    )
    assert (disc["state"], disc["seed"]) == ("found", 42), disc
    assert disc["found_at_opens"] is not None and disc["found_at_opens"] <= FOUND_WITHIN, disc
    assert predicted >= ALL_MIN * opens, epochs
    assert pfs <= PFS_FACTOR * total, pfs / total
    if wall_clock:
        per = [len(e["opened_at"]) for e in results[0]["epochs"]]  # the same count on every rank
        assert sum(a * n for a, n in zip(ahead, per, strict=True)) >= ALL_MIN * sum(per), ahead


def test_a_seed_written_right_before_the_loop_predicts_epoch_0(tmp_path: Path, wall_clock: bool) -> None:
    """Rank 0 writes the seed first thing, right before building its loaders; 2,000 files, 2 epochs."""
    job = Job(seed=7, epochs=2, batch_size=8, num_workers=2, val=False, compute_s=PACE, write_seed=True)
    job.status_counts = job.time_reads = True
    doc, results, emu, total = run(tmp_path, 2000, job)
    pfs = emu.bytes
    ahead = [round(served_ahead(results, emu, e), 4) for e in range(job.epochs)]
    assert all(not r["bad"] for r in results), [r["bad"][:3] for r in results]
    epochs = per_epoch(doc, results[0])
    report(
        "written_right_before",
        epochs=epochs,
        plan_seconds=doc["plan"]["seconds"],
        fast=[round(fast_share(results, e), 4) for e in range(job.epochs)],
        ahead=ahead,
        ahead_epoch0_by_tenth=ahead_by_tenth(results, emu, 0),
        pfs=round(pfs / total, 3),
        in_flight_limit_max=doc["prefetch"]["staging"]["in_flight_limit_max"],
        caught_opens=doc["prefetch"]["staging"]["caught_opens"],
    )
    assert epochs[0]["predicted"] >= EPOCH0_MIN * epochs[0]["opens"], epochs
    assert pfs <= PFS_FACTOR * total, pfs / total
    if wall_clock:
        assert ahead[0] >= EPOCH0_MIN, ahead


SEARCH_WORKER = "fusefs.planning.search_worker"


def search_workers(parent: int) -> set[int]:
    """The daemon's search-worker children, from /proc (each thread's children, their command lines)."""
    found: set[int] = set()
    try:
        tids = os.listdir(f"/proc/{parent}/task")
    except OSError:
        return found
    for tid in tids:
        try:
            with open(f"/proc/{parent}/task/{tid}/children") as fh:
                kids = [int(x) for x in fh.read().split()]
        except OSError:
            continue
        for pid in kids:
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as fh:
                    if SEARCH_WORKER.encode() in fh.read().split(b"\0"):
                        found.add(pid)
            except OSError:
                continue
    return found


def test_a_written_seeds_mismatch_is_searched_by_the_worker_prepared_at_mount(tmp_path: Path) -> None:
    """Seed 99 written, the sampler's is 1234: the search on the mismatch runs in a search worker that
    was already there when the seed was written (sampled every 2 ms from /proc), none started for it."""
    job = Job(seed=1234, epochs=2, batch_size=8, num_workers=2, val=False, compute_s=PACE)
    root = tmp_path / "pfs" / "data"
    digests, total = make_source(root, 503, 0)
    tiers = [{"kind": "memory", "bytes": f"{int(total * 1.5) + (16 << 20)}", "threads": 4}]
    cfg = seerfs_config(tmp_path / "seerfs.yaml", job, cache_dir=tmp_path / "cache", tiers=tiers, prefetch_threads=32)
    first_seen: dict[int, float] = {}
    stop = threading.Event()
    with running_pfsemu(root) as emu, seerfs_over(emu.mountpoint, tmp_path / "mnt", cfg) as mnt:
        pid = int(status(mnt)["pid"])

        def sample() -> None:
            while not stop.wait(0.002):
                for w in search_workers(pid):
                    first_seen.setdefault(w, time.monotonic())

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        try:
            present: set[int] = wait_for(
                lambda: w if len(w := search_workers(pid)) >= 2 else None,
                60,
                "the first search's worker and the prepared one",
            )
            written = time.monotonic()
            write_seed(mnt, 99)
            results = run_readers(mnt, job, digests, tmp_path / "run")
            doc = status(mnt)
        finally:
            stop.set()
            sampler.join()
    assert all(not r["bad"] for r in results), [r["bad"][:3] for r in results]
    disc = doc["discovery"]
    report("mismatch_search", found_at_opens=disc["found_at_opens"], seconds=disc["seconds"], workers=len(first_seen))
    assert (disc["state"], disc["seed"]) == ("found", 1234), disc
    assert disc["trigger"] == "the written seed 99 does not match the opens", disc
    late = {
        w: round(t - written, 2)
        for w, t in first_seen.items()
        if w not in present and t < written + STANDBY_AFTER - 5  # the next prepared one comes STANDBY_AFTER later
    }
    assert not late, f"search workers started after the seed was written (seconds after): {late}"
