"""kill -9 of a daemon filling a directory tier keeps every complete copy; damaged copies are cached again.

Crashes are real (SIGKILL of a daemon serving a real mount, then a lazy unmount of the dead mount);
copies are checked byte for byte against the source read directly, never against the tier's records.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import time
from pathlib import Path

import pytest
from e2e import make_source
from mounting import force_unmount, is_mounted, mounted, status, wait_for

from fusefs.tiers.layout import file_path

pytestmark = pytest.mark.mount


def _config(tmp_path: Path) -> Path:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        f"cache_dir: {tmp_path / 'cache'}\ndatasets: [{{root: train}}]\n"
        f"tiers: [{{kind: directory, path: {tmp_path / 'ssd'}, bytes: 256MiB}}]\n"
        "prefetch: {lookahead_bytes: 32KiB}\n"
    )
    return cfg


def tier_copies(tier: Path) -> dict[int, Path]:
    return {int(p.name): p for p in tier.rglob("*") if p.name.isdigit() and p.is_file()}


def manifest(mnt: Path, src: Path, rels: list[str]) -> dict[int, bytes]:
    """entry -> the source's bytes, read from the source directly (entries from the mount's inodes)."""
    return {os.stat(mnt / rel).st_ino - 1: (src / rel).read_bytes() for rel in rels}


def kill_daemon(mnt: Path, pid: int) -> None:
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text(), 10)
    force_unmount(mnt)
    assert not is_mounted(mnt)


def test_kill_9_seconds_after_filling_a_directory_tier_keeps_every_copy(tmp_path: Path) -> None:
    src = tmp_path / "src"
    digests, _ = make_source(src, 300, 0, mean_size=4000)
    rels = sorted(digests)
    cfg = _config(tmp_path)
    mnt = tmp_path / "mnt"
    with mounted(src, mnt, "-c", str(cfg)):
        files = manifest(mnt, src, rels)
        for rel in rels:
            (mnt / rel).read_bytes()
        wait_for(lambda: len(tier_copies(tmp_path / "ssd")) == len(rels), 30, "the tier to take every file")
        assert status(mnt)["tiers"][0]["index_unsaved_changes"] > 0  # the periodic index write is 30 s away
        kill_daemon(mnt, int(status(mnt)["pid"]))
    with mounted(src, mnt, "-c", str(cfg)):
        opened = status(mnt)["tiers"][0]["opened"]
        assert opened["warm"] and opened["kept_files"] == len(rels), opened
        copies = tier_copies(tmp_path / "ssd")
        for entry, data in files.items():
            assert copies[entry].read_bytes() == data


def bounded_read(path: Path, fifo: Path, seconds: float = 15) -> bytes:
    """The file's bytes, read by a child process; fails the test if the read blocks (on ``fifo``)."""
    reader = subprocess.Popen(["cat", str(path)], stdout=subprocess.PIPE)
    try:
        out, _ = reader.communicate(timeout=seconds)
    except subprocess.TimeoutExpired:
        # The failure caught here: the daemon's open of the FIFO blocks, and the reader with it (not
        # even SIGKILL ends it until the daemon answers).  A writer end releases both.
        with contextlib.suppress(OSError):
            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            reader.kill()
            reader.communicate(timeout=30)
            os.close(fd)
        pytest.fail(f"reading {path.name} blocked for {seconds} s (a FIFO in place of its tier copy)")
    assert reader.returncode == 0, f"cat {path} failed"
    return out


def _cached_tier(tmp_path: Path, files: int) -> tuple[Path, list[str]]:
    src = tmp_path / "src"
    digests, _ = make_source(src, files, 0, mean_size=5000)
    return src, sorted(digests)


def test_a_damaged_copy_is_dropped_refetched_and_cached_again(tmp_path: Path) -> None:
    src, rels = _cached_tier(tmp_path, 60)
    tier = tmp_path / "ssd"
    with mounted(src, tmp_path / "mnt", "-c", str(_config(tmp_path))) as mnt:
        files = manifest(mnt, src, rels)
        for rel in rels:
            (mnt / rel).read_bytes()
        wait_for(lambda: len(tier_copies(tier)) == len(rels), 30, "the tier to take every file")
        damaged = os.stat(mnt / rels[0]).st_ino - 1
        copy = tier_copies(tier)[damaged]
        copy.write_bytes(b"X" + copy.read_bytes()[1:])
        for _ in range(3):  # the first read finds the damage; later ones would be cached reads again
            assert (mnt / rels[0]).read_bytes() == (src / rels[0]).read_bytes()
        assert status(mnt)["tiers"][0]["corrupt"] == 1  # looked up, refused, fetched again
        # ... and cached again: a damaged copy must not leave its file uncached for the session
        wait_for(
            lambda: damaged in (c := tier_copies(tier)) and c[damaged].read_bytes() == files[damaged],
            20,
            "the damaged file to be cached again",
        )


def test_a_fifo_in_place_of_a_tier_copy_is_dropped_instead_of_blocking(tmp_path: Path) -> None:
    src, rels = _cached_tier(tmp_path, 30)
    tier = tmp_path / "ssd"
    with mounted(src, tmp_path / "mnt", "-c", str(_config(tmp_path))) as mnt:
        for rel in rels:
            (mnt / rel).read_bytes()
        wait_for(lambda: len(tier_copies(tier)) == len(rels), 30, "the tier to take every file")
        path = Path(file_path(tier, os.stat(mnt / rels[0]).st_ino - 1))
        path.unlink()
        os.mkfifo(path)
        assert bounded_read(mnt / rels[0], path) == (src / rels[0]).read_bytes()
        assert status(mnt)["tiers"][0]["corrupt"] == 1


@pytest.mark.slow
def test_kill_9_at_random_moments_while_a_tier_fills_keeps_every_final_named_copy(tmp_path: Path) -> None:
    """>= 20 kills at random moments of a fill; after each, every copy that had its final name when the
    kill was sent is kept warm and equals the source byte for byte."""
    src = tmp_path / "src"
    digests, _ = make_source(src, 3000, 0, mean_size=12_000)
    rels = sorted(digests)
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        f"cache_dir: {tmp_path / 'cache'}\ndatasets: [{{root: train}}]\n"
        f"tiers: [{{kind: directory, path: {tmp_path / 'ssd'}, bytes: 256MiB, threads: 8}}]\n"
        "prefetch: {lookahead_bytes: 32KiB}\n"
    )
    mnt = tmp_path / "mnt"
    rng = random.Random(11)
    files: dict[int, bytes] = {}
    before_kill: set[int] = set()
    kills = 0
    for _round in range(30):
        with mounted(src, mnt, "-c", str(cfg)):
            if not files:
                files = manifest(mnt, src, rels)
            opened = status(mnt)["tiers"][0]["opened"]
            if kills:
                survivors = before_kill
                copies = tier_copies(tmp_path / "ssd")
                assert opened["warm"], opened
                missing = [e for e in survivors if e not in copies]
                assert not missing, f"kill {kills}: {len(missing)} final-named copies lost"
                for e in survivors:
                    assert copies[e].read_bytes() == files[e], f"kill {kills}: entry {e} differs from the source"
                assert opened["kept_files"] >= len(survivors)
            if len(tier_copies(tmp_path / "ssd")) >= len(rels) - 50:
                for p in tier_copies(tmp_path / "ssd").values():  # start the fill over (a later mount re-fills)
                    p.unlink()
            order = rels[:]
            rng.shuffle(order)
            stop = time.monotonic() + rng.uniform(0.05, 1.5)
            pid = int(status(mnt)["pid"])
            for rel in order:  # the reads fill the tier (reactive policy) while we go
                (mnt / rel).read_bytes()
                if time.monotonic() > stop:
                    break
            before_kill = set(tier_copies(tmp_path / "ssd"))
            kill_daemon(mnt, pid)
            kills += 1
        if kills >= 22:
            break
    assert kills >= 20
