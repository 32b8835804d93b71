"""Directory tiers keep every complete copy across kill -9 and full disks, and re-cache damaged ones.

Crashes are real (SIGKILL of a daemon serving a real mount, or a tier abandoned without its index
write, which is what a kill leaves on disk); full disks are real small tmpfs mounts.  Copies are
checked byte for byte against the source, never against the tier's own records.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import stat
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
from e2e import make_source
from mounting import force_unmount, is_mounted, mounted, status, wait_for

from fusefs.meta.identity import SourceId
from fusefs.tiers import BLOCK, DirectoryTier
from fusefs.tiers.index import INDEX_NAME, RESERVE_NAME
from fusefs.tiers.journal import JOURNAL_NAMES
from fusefs.tiers.layout import file_path

FP = "fingerprint-a"


def payload(entry: int, size: int) -> bytes:
    return random.Random(entry * 7919 + size).randbytes(size)


def src(data: bytes, entry: int) -> SourceId:
    return SourceId(len(data), 1000 + entry, 2000 + entry, 3000 + entry)


@contextlib.contextmanager
def small_tmpfs(path: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` at ``path`` (root only); always unmounted afterwards."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    path.mkdir(parents=True, exist_ok=True)
    res = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(path)], capture_output=True
    )
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {res.stderr.decode().strip()}")
    try:
        yield path
    finally:
        if subprocess.run(["umount", str(path)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(path)], capture_output=True)


def fill_disk(where: Path) -> Path:
    """Take every free byte of the filesystem holding ``where`` (a file the caller removes)."""
    filler = where / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        for chunk in (64 << 10, 4096, 512, 1):
            with contextlib.suppress(OSError):
                while True:
                    os.write(fd, b"\0" * chunk)
    finally:
        os.close(fd)
    assert os.statvfs(where).f_bavail == 0
    return filler


# --------------------------------------------------------------------------- the journal


def test_copies_made_after_the_last_index_write_survive_a_crash(tmp_path: Path) -> None:
    """The daemon dies (no index write, no close) right after 300 puts: a reopen keeps all of them."""
    root = tmp_path / "tier"
    sizes = {e: random.Random(e).choice([0, 1, 3000, 70_000, BLOCK + 5]) for e in range(300)}
    tier = DirectoryTier(1, root, 256 << 20, 4, FP, persist_interval=3600)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            for e, size in sizes.items():
                data = payload(e, size)
                nursery.start_soon(tier.put, e, data, src(data, e))
        tier.drop(17)  # a drop is journaled too

    trio.run(main)
    assert tier.status()["index_unsaved_changes"] > 0  # nothing but the journal knows these copies
    tier.abandon()  # what kill -9 leaves: no index write
    again = DirectoryTier(1, root, 256 << 20, 4, FP)
    kept = set(sizes) - {17}
    assert again.opened["warm"] and again.opened["kept_files"] == len(kept), again.opened
    assert again.opened["journal_records"] >= len(sizes) + 1

    async def check() -> None:
        for e in kept:
            assert await again.get(e) == payload(e, sizes[e]), e
            assert again.source_of(e) == src(payload(e, sizes[e]), e)
        assert not again.contains(17)
        await again.close()

    trio.run(check)


def test_a_torn_journal_record_ends_the_replay_without_harm(tmp_path: Path) -> None:
    root = tmp_path / "tier"
    tier = DirectoryTier(1, root, 64 << 20, 2, FP, persist_interval=3600)

    async def main() -> None:
        for e in range(10):
            data = payload(e, 500)
            assert await tier.put(e, data, src(data, e))

    trio.run(main)
    assert tier.journal is not None
    gen, tail = tier.journal.gen, tier.journal.tail
    tier.abandon()
    path = root / JOURNAL_NAMES[gen % 2]
    with open(path, "r+b") as fh:  # tear the last record, as a power loss mid-write would
        fh.seek(tail - 5)
        fh.write(b"\xff\xff\xff\xff\xff")
    again = DirectoryTier(1, root, 64 << 20, 2, FP)
    assert again.opened["warm"] and again.opened["kept_files"] == 9, again.opened
    assert not (root / "09" / "9").exists()  # its file had no trusted record: removed as an orphan
    again.abandon()


def test_index_journal_and_reserve_files_are_private(tmp_path: Path) -> None:
    root = tmp_path / "tier"
    tier = DirectoryTier(1, root, 64 << 20, 2, FP)

    async def main() -> None:
        data = payload(1, 100)
        assert await tier.put(1, data, src(data, 1))
        await tier.close()

    trio.run(main)
    for name in (INDEX_NAME, RESERVE_NAME, *JOURNAL_NAMES):
        mode = stat.S_IMODE(os.stat(root / name).st_mode)
        assert mode == 0o600, f"{name}: {oct(mode)}"


def test_on_a_full_tier_filesystem_the_index_is_still_written_and_every_copy_kept(tmp_path: Path) -> None:
    with small_tmpfs(tmp_path / "fs", "6m") as fs:
        root = fs / "tier"
        tier = DirectoryTier(1, root, 64 << 20, 2, FP, persist_interval=3600)  # a budget the disk cannot hold
        stored: list[int] = []

        async def main() -> None:
            e = 0
            while True:  # until the disk is full
                data = payload(e, 60_000)
                if not await tier.put(e, data, src(data, e)):
                    break
                stored.append(e)
                e += 1
            filler = fill_disk(fs)  # whatever the last put left
            assert await tier.persist(force=True), "the index could not be written on the full disk"
            assert tier.status()["index_write_errors"] == 0
            filler.unlink()

        trio.run(main)
        assert len(stored) > 20 and tier.counters.put_errors >= 1
        tier.abandon()  # crash
        again = DirectoryTier(1, root, 64 << 20, 2, FP)
        assert again.opened["warm"] and again.opened["kept_files"] == len(stored), again.opened

        async def check() -> None:
            for e in stored:
                assert await again.get(e) == payload(e, 60_000)
            await again.close()

        trio.run(check)


# --------------------------------------------------------------------------- through a real mount


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


def test_a_damaged_copy_and_a_fifo_in_its_place_are_dropped_and_cached_again(tmp_path: Path) -> None:
    src = tmp_path / "src"
    digests, _ = make_source(src, 60, 0, mean_size=5000)
    rels = sorted(digests)
    tier = tmp_path / "ssd"
    with mounted(src, tmp_path / "mnt", "-c", str(_config(tmp_path))) as mnt:
        files = manifest(mnt, src, rels)
        for rel in rels:
            (mnt / rel).read_bytes()
        wait_for(lambda: len(tier_copies(tier)) == len(rels), 30, "the tier to take every file")
        damaged, fifo = (os.stat(mnt / rels[i]).st_ino - 1 for i in (0, 1))
        copy = tier_copies(tier)[damaged]
        copy.write_bytes(b"X" + copy.read_bytes()[1:])
        path = Path(file_path(tier, fifo))
        path.unlink()
        os.mkfifo(path)
        try:
            for rel in rels[:2]:
                assert (mnt / rel).read_bytes() == (src / rel).read_bytes()
            doc = status(mnt)["tiers"][0]
            assert doc["corrupt"] == 2, doc  # both were looked up and refused, then fetched again
            # ... and cached again: a damaged copy must not leave its file uncached for the session
            wait_for(
                lambda: all(e in (c := tier_copies(tier)) and c[e].read_bytes() == files[e] for e in (damaged, fifo)),
                20,
                "both files to be cached again",
            )
        finally:
            with contextlib.suppress(OSError):
                os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))


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
