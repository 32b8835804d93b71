"""tools/bench/ceiling end to end at a tiny size: real tmpfs, real seerfs mount, real reader threads."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from mounting import fuse_mounts

from tools.bench import ceiling as bench_ceiling

pytestmark = pytest.mark.mount


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")
def test_small_run_reports_ratios_verified_bytes_and_leaves_no_mount(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """direct, seerfs and the pyfuse3 floor over 200 files: JSON has both ratios per config, every pass read the
    dataset's bytes, seerfs served every warm open from the page cache (no READ reached it), and nothing stays
    mounted."""
    argv = [
        "--files",
        "200",
        "--mean-size",
        "20KB",
        "--passes",
        "1",
        "--seconds",
        "0",
        "--configs",
        "direct,seerfs,pyfuse3",
        "--json",
        "--workdir",
        str(tmp_path),
    ]
    assert bench_ceiling.main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["dataset"]["files"] == 200
    total = doc["dataset"]["bytes"]
    by = {r["config"]: r for r in doc["results"]}
    assert set(by) == {"direct", "seerfs", "pyfuse3"}
    for r in by.values():
        assert r["bytes_verified"] is True
        assert r["cold"]["bytes"] == total and r["cold"]["files"] == 200
        assert [p["bytes"] for p in r["warm"]] == [total] * len(r["warm"]) and r["warm"]
        assert r["cold_ratio"] > 0 and r["warm_ratio"] > 0
    assert by["direct"]["warm_ratio"] == pytest.approx(1.0)
    assert by["seerfs"]["warm_median"]["fs_cores"] is not None  # the daemons' CPU was read
    assert by["pyfuse3"]["warm_median"]["fs_cores"] is not None
    assert by["direct"]["warm_median"]["fs_cores"] is None
    notes = by["seerfs"]["notes"]
    assert "warm opens from page_cache:200 of 200" in notes and "warm READ requests 0" in notes, notes
    assert doc["targets"][0][0].startswith("seerfs warm >= 0.5x")
    assert fuse_mounts(tmp_path) == []
    assert not any(str(tmp_path) in line for line in Path("/proc/self/mountinfo").read_text().splitlines())


def test_usage_errors_are_one_line_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    """An unknown configuration name is refused before anything is made or mounted."""
    assert bench_ceiling.main(["--configs", "direct,nfs"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "unknown nfs" in err


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")
def test_cold_runs_report_daemon_cpu_per_cold_open(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--cold-runs: each run is a fresh mount whose every open seerfs fetched from the source (its
    status, not this benchmark, counts them), the daemons' CPU comes from /proc, and nothing stays mounted."""
    argv = ["--files", "120", "--mean-size", "20KB", "--cold-runs", "2", "--cold-only", "--json"]
    assert bench_ceiling.main([*argv, "--workdir", str(tmp_path)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["results"] == []  # --cold-only: no passes but the cold ones
    runs = doc["cold_opens"]["runs"]
    assert [r["config"] for r in runs] == ["seerfs", "pyfuse3"] * 2
    for r in runs:
        assert r["pass"]["files"] == 120 and r["pass"]["bytes"] == doc["dataset"]["bytes"]
        assert r["pass"]["fs_cpu_s"] is not None and r["us_per_open"] > 0
        assert r["fetched"] == (120 if r["config"] == "seerfs" else None)
    assert set(doc["cold_opens"]["median_us"]) == {"seerfs", "pyfuse3"}
    assert fuse_mounts(tmp_path) == []


@pytest.mark.skipif(os.geteuid() != 0 or not bench_ceiling.no_open_possible(), reason="needs root and the native front")
def test_a_3_14_reader_costs_no_request_per_warm_open_in_no_open_mode(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--reader loader-3.14 opens as CPython 3.14's open() does (no isatty ioctl): through
    ``fuse.no_open`` its warm opens send the daemon no IOCTL, OPEN or RELEASE (only the status reads
    in between send a few), and every byte read is verified as with the other readers."""
    argv = ["--files", "150", "--mean-size", "20KB", "--passes", "2", "--seconds", "0"]
    argv += ["--configs", "direct,seerfs-noopen", "--reader", "loader-3.14", "--json", "--workdir", str(tmp_path)]
    assert bench_ceiling.main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    by = {r["config"]: r for r in doc["results"]}
    assert by["seerfs-noopen"]["bytes_verified"] is True
    notes = " | ".join(by["seerfs-noopen"]["notes"])
    assert "(no_open, fanotify fid)" in notes, notes
    answered_in_c = float(notes.split(" answered in C")[0].rsplit(" ", 1)[1])
    getattrs = float(notes.split(" of them GETATTR")[0].rsplit("(", 1)[1])
    # No IOCTL (the loader reader: 1.00 per open; status reads send none).  GETATTRs are the first
    # warm pass's: the cold pass's READs made atime stale, and open()'s fstat asks for it.
    assert answered_in_c - getattrs == 0.0, notes
    assert fuse_mounts(tmp_path) == []
