"""tools/bench/train end to end at a tiny size: real emulated PFS, real ranks, real seerfs mount."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from mounting import fuse_mounts

from fusefs.readpath.counters import OPEN_SOURCES
from tools.bench import train as bench_train

pytestmark = pytest.mark.mount

FILES, VAL, EPOCHS = 48, 8, 2


def test_small_run_counts_pfs_bytes_and_every_open_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Lower bound, direct, seerfs (no seed written) and seerfs+seed over 48+8 files for 2 epochs.  The emulator's
    counters say direct read the dataset once per epoch and seerfs with or without the seed about once in all;
    seerfs's opens per source add up to exactly the opens the job made (prefetches are not counted as opens), the
    targets compare seerfs without a seed with seerfs+seed, the daemon's CPU is taken, and nothing stays mounted."""
    argv = [
        "--files",
        str(FILES),
        "--val-files",
        str(VAL),
        "--epochs",
        str(EPOCHS),
        "--mean-size",
        "20000",
        "--batch",
        "8",
        "--compute-ms",
        "1",
        "--configs",
        "lower bound,direct,seerfs,seerfs+seed",
        "--json",
        "--workdir",
        str(tmp_path),
    ]
    assert bench_train.main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    total = doc["dataset_bytes"]
    by = {r["config"]: r for r in doc["results"]}
    assert list(by) == ["lower bound", "direct", "seerfs", "seerfs+seed"]
    for r in by.values():
        assert len(r["epoch_s"]) == EPOCHS and all(t > 0 for t in r["epoch_s"])
    assert by["lower bound"]["pfs_bytes"] == 0
    assert by["direct"]["pfs_bytes"] == EPOCHS * total
    assert by["lower bound"]["fs_cpu"] is None and by["direct"]["fs_cpu"] is None  # no FUSE daemon of their own
    assert by["lower bound"]["fs_us"] is None and by["direct"]["fs_us"] is None
    for config in ("seerfs", "seerfs+seed"):
        assert by[config]["fs_cpu"] > 0, config  # the daemon served every open: it took CPU
        # Its CPU per file of the later epochs: some, and no more than the whole run's over those files.
        later = (EPOCHS - 1) * (FILES + VAL)
        assert 0 < by[config]["fs_us"] * later <= 1.05e6 * by[config]["fs_cpu_s"], config
        assert total <= by[config]["pfs_bytes"] <= 1.05 * total, config
        sources = by[config]["sources"]
        assert sum(sources.values()) == EPOCHS * (FILES + VAL), (config, sources)
        assert set(sources) <= {*OPEN_SOURCES, "fetched"}, (config, sources)
    judged = {name: ok for name, ok, _detail in doc["targets"]}
    assert len(judged) == 9 and judged["PFS bytes <= 1.05x the dataset"] is True
    assert {
        "seerfs without a seed: epoch 0 <= 1.05x seerfs+seed's",
        "seerfs without a seed: PFS bytes 1.00x seerfs+seed's",
        f"writing the seed never costs time: seerfs+seed's total <= {bench_train.SEED_COST:.2f}x seerfs's without one",
    } <= set(judged)
    assert fuse_mounts(tmp_path) == []


def test_decode_mode_runs_direct_and_seerfs_side_by_side(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--decode at a tiny size (not timed): real JPEGs decoded in the workers, a CNN trained per batch.  Its three
    configurations ran in order; the emulator's counters say direct read the dataset each epoch and seerfs about
    once; seerfs's opens add up to the job's; the daemons' CPU seconds came from /proc and direct has none; the
    report holds seerfs's wall as ratios to direct's; and a lower bound, which cannot decode, is refused."""
    argv = ["--files", "24", "--val-files", "4", "--epochs", "2", "--mean-size", "20000", "--batch", "4"]
    assert bench_train.main([*argv, "--decode", "--json", "--workdir", str(tmp_path)]) == 0
    doc = json.loads(capsys.readouterr().out)
    total = doc["dataset_bytes"]
    by = {r["config"]: r for r in doc["results"]}
    assert list(by) == list(bench_train.DECODE_CONFIGS)
    assert by["direct"]["pfs_bytes"] == 2 * total and by["direct"]["fs_cpu_s"] is None
    for config in ("seerfs", "seerfs+seed"):
        assert total <= by[config]["pfs_bytes"] <= 1.05 * total, config
        assert sum(by[config]["sources"].values()) == 2 * (24 + 4), config
        assert by[config]["fs_cpu_s"] > 0, config
    report = doc["decode"]
    assert set(report["configs"]) == set(bench_train.DECODE_CONFIGS)
    assert set(report["ratios"]) == {"seerfs", "seerfs+seed"}
    direct_wall = report["configs"]["direct"]["wall_s"]
    assert report["ratios"]["seerfs"]["median"] == pytest.approx(report["configs"]["seerfs"]["wall_s"] / direct_wall)
    assert fuse_mounts(tmp_path) == []
    assert bench_train.main([*argv, "--decode", "--configs", "lower bound,direct"]) == 2
    assert "cannot be decoded" in capsys.readouterr().err


def test_misspelt_configuration_is_a_one_line_error(capsys: pytest.CaptureFixture[str]) -> None:
    """A typo in --configs is refused before anything is made, instead of silently measuring less."""
    assert bench_train.main(["--configs", "direct,seerfs-seed"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "unknown seerfs-seed" in err, err


def test_reference_filesystems_read_the_local_copy_through_fuse(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The pyfuse3 floor and mergerfs serve staging's local copy: the copy is the PFS read (once, by the
    first of them), each daemon served the opens (its CPU is taken), and nothing stays mounted.

    CPU time comes from /proc in 10 ms ticks: mergerfs (C) can serve this small run's opens within
    one tick and read 0 (it did once in CI), so only the floor (Python) is held to a nonzero share."""
    configs = ["pyfuse3 floor"] + (["mergerfs"] if shutil.which("mergerfs") else [])
    argv = ["--files", str(FILES), "--val-files", str(VAL), "--epochs", str(EPOCHS), "--mean-size", "20000"]
    argv += ["--batch", "8", "--compute-ms", "1", "--configs", ",".join(configs), "--json", "--workdir", str(tmp_path)]
    argv += ["--read-times"]
    assert bench_train.main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    by = {r["config"]: r for r in doc["results"]}
    assert list(by) == configs
    assert by["pyfuse3 floor"]["pfs_bytes"] == doc["dataset_bytes"]  # the local copy, made here
    for config in configs:
        fs_cpu = by[config]["fs_cpu"]
        assert len(by[config]["epoch_s"]) == EPOCHS and fs_cpu is not None and fs_cpu >= 0, config
    assert by["pyfuse3 floor"]["fs_cpu"] > 0
    if "mergerfs" in by:
        assert by["mergerfs"]["pfs_bytes"] == 0  # the same copy, reused
    # --read-times: the loader workers timed every file of every epoch; the summary covers the later ones.
    records = [json.loads((tmp_path / f"pyfuse3-floor.rank{rank}.json").read_text()) for rank in (0, 1)]
    for record in records:
        assert [len(e["reads_s"]) for e in record["epochs"]] == [(FILES + VAL) // 2] * EPOCHS
    later = [t for record in records for e in record["epochs"][1:] for t in e["reads_s"]]
    summary = by["pyfuse3 floor"]["read_ms"]
    assert 0 < summary["p50"] <= summary["p90"] <= summary["p99"] <= summary["max"] == pytest.approx(1e3 * max(later))
    assert summary["sum_s"] == pytest.approx(sum(later) / (2 * (EPOCHS - 1)))
    assert fuse_mounts(tmp_path) == []


@pytest.mark.slow  # 40 s: seerfs on two nodes by mpirun, then the floor on two mounts
@pytest.mark.mpi
def test_nodes_add_the_floor_on_as_many_mounts_each_serving_its_own_ranks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--nodes 2 with the pyfuse3 floor among the configurations adds "pyfuse3 floor x2": two floor
    daemons over the one local copy (read from the PFS once, by the single floor), rank r reading
    through mount r // ranks-per-node, so its epochs are what FUSE alone costs the two-node job."""
    argv = ["--files", str(FILES), "--val-files", str(VAL), "--epochs", str(EPOCHS), "--mean-size", "20000"]
    argv += ["--batch", "8", "--compute-ms", "1", "--configs", "lower bound,pyfuse3 floor", "--nodes", "2"]
    argv += ["--json", "--workdir", str(tmp_path)]
    assert bench_train.main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    by = {r["config"]: r for r in doc["results"]}
    assert list(by) == ["lower bound", "pyfuse3 floor", "seerfs+seed x2", "pyfuse3 floor x2"]
    assert by["pyfuse3 floor"]["pfs_bytes"] == doc["dataset_bytes"] and by["pyfuse3 floor x2"]["pfs_bytes"] == 0
    assert len(by["pyfuse3 floor x2"]["epoch_s"]) == EPOCHS and by["pyfuse3 floor x2"]["fs_cpu"] > 0
    spec = json.loads((tmp_path / "pyfuse3-floor-x2.spec.json").read_text())
    assert spec["roots"] == [str(tmp_path / f"pyfuse3-floor-x2-mnt{k}") for k in (0, 1)]
    for rank in (0, 1):  # each rank read its share of both datasets in every epoch, through its node's mount
        record = json.loads((tmp_path / f"pyfuse3-floor-x2.rank{rank}.json").read_text())
        assert record["samples"] == EPOCHS * (FILES + VAL) // 2 and record["bad"] == [], record
    assert fuse_mounts(tmp_path) == []


@pytest.mark.slow  # 50 s: two rounds of three configurations
def test_rounds_measure_every_configuration_afresh(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--rounds 2: each round makes its own staging copy and its own seerfs mount, so the emulator counts the
    dataset read again in each round (a round that reused the last one's copy or cache would read nothing),
    and the results shown are the rounds' per-epoch medians with PFS bytes the larger round's."""
    argv = ["--files", str(FILES), "--val-files", str(VAL), "--epochs", str(EPOCHS), "--mean-size", "20000"]
    argv += ["--batch", "8", "--compute-ms", "1", "--configs", "lower bound,staging,seerfs+seed", "--rounds", "2"]
    argv += ["--json", "--workdir", str(tmp_path)]
    assert bench_train.main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    total = doc["dataset_bytes"]
    rounds = doc["rounds"]
    assert [[r["config"] for r in runs] for runs in rounds] == [["lower bound", "staging", "seerfs+seed"]] * 2
    for runs in rounds:
        by = {r["config"]: r for r in runs}
        assert by["staging"]["pfs_bytes"] == total and by["staging"]["extra_s"] > 0  # copied again
        assert total <= by["seerfs+seed"]["pfs_bytes"] <= 1.05 * total  # a fresh mount: nothing carried over
    for k, r in enumerate(doc["results"]):
        per_round = [runs[k] for runs in rounds]
        assert r["rounds"] == [p["epoch_s"] for p in per_round]
        assert r["epoch_s"] == pytest.approx([(a + b) / 2 for a, b in zip(*r["rounds"], strict=True)])
        assert r["pfs_bytes"] == max(p["pfs_bytes"] for p in per_round)
        assert r["round_steal"] == [p["steal"] for p in per_round] and r["steal"] == max(r["round_steal"])
    assert fuse_mounts(tmp_path) == []


def test_the_later_epoch_target_is_judged_on_medians_and_names_the_worst_round() -> None:
    """Three rounds where one round's epoch 1 ran 1.10x (a disturbed round): the median passes, and the
    target's detail still shows that round's 1.10x, so a reader sees the spread behind the median."""
    lower = bench_train.combined([bench_train.Result("lower bound", [5.0, 4.0, 4.0]) for _ in range(3)])
    runs = [bench_train.Result("seerfs+seed", [8.0, 4.4 if k == 1 else 4.08, 4.04]) for k in range(3)]
    seed = bench_train.combined(runs)
    assert seed.epoch_s == [8.0, 4.08, 4.04] and seed.rounds == [r.epoch_s for r in runs]
    _name, ok, detail = bench_train.later_epochs_target("", seed, lower)
    assert ok is True, detail
    assert detail.startswith("1.020x, 1.010x") and "3 rounds" in detail and "1.100x" in detail, detail
    one = bench_train.combined(runs[1:2])
    assert one is runs[1] and bench_train.later_epochs_target("", one, lower)[1] is False


def test_seerfs_with_and_without_a_seed_are_compared_by_their_own_targets_not_by_fastest() -> None:
    """seerfs without a seed does the same reads as seerfs+seed once it found the seed, so "fastest" is
    judged among the other ways to train (direct here); writing the seed is judged against not writing
    it, within SEED_COST: a 0.5% tie passes, a seeded run 5% slower fails, and a seeded run slower
    than direct fails "fastest" whatever seerfs without a seed did."""
    args = bench_train.build_parser().parse_args([])
    total = 10**9

    def judged(seed_s: float, none_s: float, direct_s: float) -> dict[str, bool]:
        results = [
            bench_train.Result("lower bound", [5.0, 5.0]),
            bench_train.Result("direct", [direct_s, direct_s], pfs_bytes=2 * total),
            bench_train.Result("seerfs", [none_s, 5.0], pfs_bytes=total),
            bench_train.Result("seerfs+seed", [seed_s, 5.0], pfs_bytes=total),
        ]
        return {name: ok for name, ok, _detail in bench_train.targets(results, total, args)}

    fastest = "seerfs with the seed is the fastest way to train from the PFS"
    cost = next(k for k in judged(8.0, 8.0, 12.0) if k.startswith("writing the seed never costs time"))
    tie = judged(8.05, 8.0, 12.0)  # 13.05 s against 13.0 s: 0.4% slower, the ties seen between runs
    assert tie[fastest] is True and tie[cost] is True, tie
    slower = judged(8.7, 8.0, 12.0)  # 13.7 s against 13.0 s: 5.4%
    assert slower[fastest] is True and slower[cost] is False, slower
    assert judged(8.0, 8.0, 6.0)[fastest] is False  # direct (12 s) beat it (13 s)


def test_read_times_leave_out_epoch_0_and_pool_every_rank() -> None:
    """--read-times: epoch 0 (the PFS read, for every configuration but the lower bound) is left out,
    the later epochs of all ranks are pooled for the percentiles, and the sum is per rank and epoch."""
    ranks = [
        {"epochs": [{"reads_s": [9.0] * 10}, {"reads_s": [0.001 * k for k in range(1, 51)]}]},
        {"epochs": [{"reads_s": [9.0]}, {"reads_s": [0.001 * k for k in range(51, 101)]}]},
    ]
    summary = bench_train.read_time_summary(ranks)
    assert summary["max"] == pytest.approx(100.0)  # ms: epoch 0's 9 s never counts
    # The benchmarks' one convention (tools/harness/quantiles.py): the median, then sample int(q * (n - 1)).
    assert summary["p50"] == pytest.approx(50.5) and summary["p90"] == pytest.approx(90.0)
    assert summary["p99"] == pytest.approx(99.0)
    assert summary["sum_s"] == pytest.approx(sum(0.001 * k for k in range(1, 101)) / 2)
    assert bench_train.read_time_summary([{"epochs": [{"reads_s": [1.0]}]}]) == {}  # one epoch: nothing later
    assert bench_train.read_time_summary([{"epochs": [{}, {}]}]) == {}  # not timed (the lower bound)


def test_a_run_at_other_sizes_judges_only_the_byte_targets_and_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    """The demo's run (tools/demo: 800 files, 3 epochs) is smaller than the sizes the timing targets are
    set for: those print without a verdict ("--"), the PFS-bytes targets are judged, and the closing
    verdict line counts only what was judged.  At the default sizes every target is judged."""
    total = 10**9

    def printed(argv: list[str], seed_pfs: int) -> str:
        args = bench_train.build_parser().parse_args(argv)
        later = [5.0] * (args.epochs - 1)
        results = [
            bench_train.Result("lower bound", [5.0, *later]),
            bench_train.Result("direct", [6.0] * args.epochs, pfs_bytes=3 * total),  # seerfs is not 1.8x faster
            bench_train.Result("seerfs+seed", [8.0, *later], pfs_bytes=seed_pfs),
        ]
        bench_train.print_table(results, total, args, {})
        return capsys.readouterr().out

    small = printed(["--files", "800", "--epochs", "3"], total)
    assert "[--] total >= 1.8x faster than direct" in small and "MISSED" not in small, small
    assert "[ok] PFS bytes <= 1.05x the dataset" in small
    assert "verdict: 1 of 1 targets judged at this size held" in small and "--files 800" in small, small
    wasteful = printed(["--files", "800", "--epochs", "3"], 2 * total)
    assert "verdict: 0 of 1 targets judged at this size held; MISSED: PFS bytes" in wasteful, wasteful
    full = printed([], total)
    assert "[MISSED] total >= 1.8x faster than direct" in full and "[--]" not in full, full
