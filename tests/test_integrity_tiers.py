"""Directory tiers keep every complete copy across crashes and full disks (the tier alone).

A crash here is a tier abandoned without its index write or close, which is what kill -9 leaves on
disk (test_integrity_crash.py kills real daemons); full disks are real small tmpfs mounts.  Copies
are checked against payloads computed independently of the tier.
"""

from __future__ import annotations

import os
import random
import stat
from pathlib import Path

import trio
from tmpfs import fill_disk, small_tmpfs

from fusefs.meta.identity import SourceId
from fusefs.tiers import BLOCK, DirectoryTier
from fusefs.tiers.index import INDEX_NAME, RESERVE_NAME
from fusefs.tiers.journal import JOURNAL_NAMES

FP = "fingerprint-a"


def payload(entry: int, size: int) -> bytes:
    return random.Random(entry * 7919 + size).randbytes(size)


def src(data: bytes, entry: int) -> SourceId:
    return SourceId(len(data), 1000 + entry, 2000 + entry, 3000 + entry)


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
    assert again.opened is not None  # the constructor opened the tier
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
    assert again.opened is not None  # the constructor opened the tier
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
        assert again.opened is not None  # the constructor opened the tier
        assert again.opened["warm"] and again.opened["kept_files"] == len(stored), again.opened

        async def check() -> None:
            for e in stored:
                assert await again.get(e) == payload(e, 60_000)
            await again.close()

        trio.run(check)
