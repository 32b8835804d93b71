"""A full cache directory never stops the daemon: one log line, a status note, correct bytes served.

cache_dir lives on a real tmpfs of a few MiB that the test fills up; the daemon's log is there too.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from e2e import make_source, write_seed
from mounting import mounted, status, wait_for
from tmpfs import fill_disk, small_tmpfs

pytestmark = pytest.mark.mount


def _read_all(mnt: Path, src: Path, rels: list[str]) -> None:
    for rel in rels:
        assert (mnt / rel).read_bytes() == (src / rel).read_bytes(), rel


def test_a_seed_written_while_cache_dir_is_full_fails_the_plan_not_the_daemon(tmp_path: Path) -> None:
    src = tmp_path / "src"
    digests, _ = make_source(src, 30, 0, mean_size=3000)
    rels = sorted(digests)
    with small_tmpfs(tmp_path / "cache", "4m") as cache:
        cfg = tmp_path / "c.yaml"
        cfg.write_text(f"cache_dir: {cache}\ndatasets: [{{root: train}}]\n")
        with mounted(src, tmp_path / "mnt", "-c", str(cfg)) as mnt:
            pid = int(status(mnt)["pid"])
            wait_for(lambda: status(mnt)["plan"]["state"] in ("ready", "failed"), 60, "the first plan")
            filler = fill_disk(cache)
            write_seed(mnt, 5)
            doc = wait_for(
                lambda: (d := status(mnt))["plan"]["seed"] == 5 and d["plan"]["state"] == "failed" and d,
                60,
                "planning for seed 5 to fail",
            )
            assert "No space left" in doc["plan"]["message"], doc["plan"]
            _read_all(mnt, src, rels)
            assert os.path.exists(f"/proc/{pid}") and status(mnt)["state"] == "serving"
            filler.unlink()
            write_seed(mnt, 6)  # once there is room again, planning works again
            wait_for(lambda: status(mnt)["plan"]["state"] == "ready" and status(mnt)["plan"]["seed"] == 6, 60)


def test_snapshot_persistence_on_a_full_cache_dir_is_a_note_not_an_error(tmp_path: Path) -> None:
    """The walk's result is used even when it cannot be saved (a mount refuses a cache_dir that is
    already full, but it can fill up during the walk); nothing half-written is left behind."""
    from fusefs.meta.snapshot import load_or_scan

    src = tmp_path / "src"
    make_source(src, 30, 0, mean_size=500)
    with small_tmpfs(tmp_path / "cache", "1m") as cache:
        (cache / "snapshots").mkdir()
        filler = fill_disk(cache)
        snap, reason = load_or_scan(str(src), cache)
        assert snap.counts()["files"] == 30 and reason == "no persisted snapshot"
        assert any("not persisted" in e and "No space left" in e for e in snap.errors), snap.errors
        assert list((cache / "snapshots").iterdir()) == []  # no temporary file left taking space
        filler.unlink()


def test_a_full_tier_filesystem_keeps_its_index_and_every_copy_across_a_remount(tmp_path: Path) -> None:
    """A tier whose budget is larger than its disk: the disk fills, puts fail, and the index (in its
    reserved space) still lists every copy on disk, so the next mount starts warm with all of them."""
    src = tmp_path / "src"
    digests, _ = make_source(src, 600, 0, mean_size=4096, sigma=0.01)
    rels = sorted(digests)
    with small_tmpfs(tmp_path / "fs", "2m") as fs:
        cfg = tmp_path / "c.yaml"
        cfg.write_text(
            f"cache_dir: {tmp_path / 'cache'}\ndatasets: [{{root: train}}]\n"
            f"tiers: [{{kind: directory, path: {fs / 'tier'}, bytes: 64MiB}}]\nprefetch: {{lookahead_bytes: 32KiB}}\n"
        )
        with mounted(src, tmp_path / "mnt", "-c", str(cfg)) as mnt:
            _read_all(mnt, src, rels)
            wait_for(lambda: status(mnt)["prefetch"]["fetches_inflight"] == 0, 30, "fetches to settle")
            doc = status(mnt)["tiers"][0]
            assert doc["put_errors"] > 0, doc  # the disk did fill up
        held = [p for p in (fs / "tier").rglob("*") if p.is_file() and p.name.isdigit()]
        assert len(held) > 100
        with mounted(src, tmp_path / "mnt", "-c", str(cfg)) as mnt:
            opened = status(mnt)["tiers"][0]["opened"]
            assert opened["warm"] and opened["kept_files"] == len(held), opened
            _read_all(mnt, src, rels)
