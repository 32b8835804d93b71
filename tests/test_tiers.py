"""Local tiers: hard budgets (accounting and real disk usage), verified reads, warm restarts.

Every directory tier here lives on the real disk under tmp_path, and disk usage is measured with
the real ``du``; concurrency is real trio tasks and worker threads.
"""

from __future__ import annotations

import os
import random
import subprocess
import tempfile
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import trio
import trio.testing
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fusefs.config import ByteSize, TierConfig
from fusefs.errors import ConfigError
from fusefs.meta.identity import SourceColumns, SourceId
from fusefs.tiers import (
    BLOCK,
    NAME_BYTES,
    BlockDigests,
    Budget,
    DirectoryTier,
    MemoryTier,
    build_tiers,
    disk_usage,
    memory_budget,
)
from fusefs.tiers.index import INDEX_NAME
from fusefs.tiers.layout import file_path

FP = "fingerprint-a"


def payload(entry: int, size: int) -> bytes:
    """The bytes of 'source file' ``entry``: deterministic, so any copy can be checked."""
    return random.Random(entry * 1_000_003 + size).randbytes(size)


def du(path: Path) -> int:
    cmd = ["du", "-s", "--block-size=1", str(path)]
    out = subprocess.run(cmd, capture_output=True, text=True)
    # Status 1 with a total: a file vanished while du ran (an index write renaming its temporary).
    assert out.returncode == 0 or (out.returncode == 1 and "No such file" in out.stderr), out.stderr
    return int(out.stdout.split()[0])


def src(data: bytes, stamp: int) -> SourceId:
    """The identity of the source file ``data`` came from (times and inode from one stamp)."""
    return SourceId(len(data), stamp, stamp, stamp)


def run(fn: Callable[[], Awaitable[None]]) -> None:
    trio.run(fn)


def round_up(n: int, unit: int = 4096) -> int:
    return -(-n // unit) * unit


def accounted(tier: DirectoryTier) -> int:
    """What the budget must hold: base, name slots and every stored file's blocks."""
    files = sum(round_up(tier.size_of(e) or 0, tier.alloc) for e in tier.entries())
    return tier.base_bytes + int(tier.status()["name_slots"]) * NAME_BYTES + files


async def settle(tier: DirectoryTier) -> None:
    """Wait until background unlinks are done (and index writes, when they are due at once)."""

    def busy() -> bool:
        st = tier.status()
        return bool(st["unlinking"] or (tier.persist_interval == 0 and st["index_unsaved_changes"]))

    with trio.fail_after(10):
        while busy():
            await trio.sleep(0.001)


# --------------------------------------------------------------------------- digests and budget


def test_block_digests_verify_whole_and_block_ranges_and_reject_wrong_lengths() -> None:
    data = payload(1, 2 * BLOCK + 77)
    d = BlockDigests.of(data)
    assert d.blocks == 3 and d.verify(data)
    assert d.verify(data[BLOCK:], 1) and d.verify(data[2 * BLOCK :], 2)
    assert d.verify(data[BLOCK : 2 * BLOCK], 1)
    assert not d.verify(data[:-1]) and not d.verify(data[BLOCK + 1 :], 1) and not d.verify(data, 1)
    bad = bytearray(data)
    bad[BLOCK + 5] ^= 1
    assert not d.verify(bad) and d.verify(bytes(bad[:BLOCK])) and not d.verify(bytes(bad[BLOCK:]), 1)
    assert BlockDigests.of(b"").blocks == 1 and BlockDigests.of(b"").verify(b"")
    assert BlockDigests.of(payload(2, BLOCK)).blocks == 1


def test_budget_refuses_instead_of_exceeding() -> None:
    b = Budget(100, "t")
    assert b.try_reserve(60) and not b.try_reserve(41) and b.try_reserve(40)
    assert b.used == 100 and b.refused == 1
    b.release(100)
    with pytest.raises(ValueError):
        b.release(1)


# --------------------------------------------------------------------------- budgets under load

SIZES = st.lists(st.one_of(st.integers(0, 9000), st.integers(0, 2 * BLOCK + 100)), min_size=1, max_size=30)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sizes=SIZES, seed=st.integers(0, 2**16))
def test_directory_budget_and_du_hold_under_concurrent_puts_and_drops(sizes: list[int], seed: int) -> None:
    """Many concurrent puts and drops: the accountant never passes the limit, ``du`` of the tier
    sampled during the run never passes it either, and what was stored reads back exactly."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "tier"
        limit = 1_200_000 + sum(sizes) // 3  # base (~1.05 MiB) plus room for about a third
        tier = DirectoryTier(1, root, limit, 3, FP, persist_interval=0.0)
        rng = random.Random(seed)
        stored: dict[int, bool] = {}
        worst = [0]

        async def watch(stop: trio.Event) -> None:
            while not stop.is_set():
                worst[0] = max(worst[0], await trio.to_thread.run_sync(disk_usage, root))
                assert tier.budget.used <= limit
                await trio.sleep(0)

        async def put(entry: int, size: int) -> None:
            await trio.sleep(rng.random() * 0.002)
            stored[entry] = await tier.put(entry, payload(entry, size), src(payload(entry, size), 7))
            if rng.random() < 0.3:
                tier.drop(entry)
                stored[entry] = False

        async def main() -> None:
            stop = trio.Event()
            async with trio.open_nursery() as outer:
                outer.start_soon(watch, stop)
                async with trio.open_nursery() as nursery:
                    for entry, size in enumerate(sizes):
                        nursery.start_soon(put, entry, size)
                await settle(tier)
                stop.set()
            assert tier.budget.used == accounted(tier) <= limit
            for entry, ok in stored.items():
                assert tier.contains(entry) == ok
                if ok:
                    assert await tier.get(entry) == payload(entry, sizes[entry])
            await tier.close()

        run(main)
        assert worst[0] <= limit and du(root) <= limit
        assert not [p for p in root.rglob("*.tmp")]


@settings(max_examples=25, deadline=None)
@given(sizes=SIZES, staged=st.integers(0, 200_000))
def test_memory_budget_shared_with_staging_holds_under_concurrent_puts(sizes: list[int], staged: int) -> None:
    """The memory tier and a staging charge share one budget; concurrent puts never overfill it,
    and dropping everything gives back exactly the tier's share."""
    budget = Budget(300_000 + sum(sizes) // 2, "memory")
    assert budget.try_reserve(staged)
    tier = MemoryTier(0, budget, 2)
    results: dict[int, bool] = {}

    async def put(entry: int, size: int) -> None:
        results[entry] = await tier.put(entry, payload(entry, size), src(payload(entry, size), 1))
        assert budget.used <= budget.limit

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            for entry, size in enumerate(sizes):
                nursery.start_soon(put, entry, size)
        assert budget.used == staged + sum(tier.footprint(sizes[e]) for e, ok in results.items() if ok)
        for e, ok in results.items():
            assert (await tier.get(e) == payload(e, sizes[e])) if ok else not tier.contains(e)
        await tier.close()
        assert budget.used == staged

    run(main)


def test_directory_du_stays_under_budget_through_fill_churn_and_tiny_files(tmp_path: Path) -> None:
    """Fill until refused with tiny, empty and multi-block files, drop half, refill with other
    sizes: the real ``du`` of the tier never exceeds the budget, and refusals happen only when the
    accountant is really full."""
    root = tmp_path / "tier"
    limit = 4 << 20
    tier = DirectoryTier(1, root, limit, 4, FP)
    rng = random.Random(5)

    async def fill(first: int, sizes: list[int]) -> list[int]:
        kept = []
        for i, size in enumerate(sizes):
            free_before = limit - tier.budget.used
            if await tier.put(first + i, payload(first + i, size), src(payload(first + i, size), 1)):
                kept.append(first + i)
            else:
                assert tier.footprint(size) > free_before
        return kept

    async def main() -> None:
        kept = await fill(0, [rng.choice([0, 1, 100, 4095, 4097, 30_000]) for _ in range(400)])
        assert tier.counters.put_refused > 0
        assert du(root) <= limit and tier.budget.used == accounted(tier)
        for e in kept[::2]:
            tier.drop(e)
        await settle(tier)
        await fill(10_000, [rng.choice([BLOCK + 1, 200_000, 5]) for _ in range(40)])
        await settle(tier)
        assert du(root) <= limit and tier.budget.used == accounted(tier)
        audit = await tier.audit()
        assert audit["real_bytes"] == du(root)
        await tier.close()
        assert du(root) <= limit

    run(main)


def test_directory_du_holds_with_thousands_of_names_in_one_fanout_directory(tmp_path: Path) -> None:
    """The worst case for directory growth: only empty files, all in one fan-out directory, until
    the name slots fill the budget. ``du`` (directory blocks and index included) stays under it."""
    root = tmp_path / "tier"
    probe = DirectoryTier(1, root, 2 << 20, 1, FP)
    limit = probe.base_bytes + 1500 * NAME_BYTES
    probe.abandon()
    tier = DirectoryTier(1, root, limit, 4, FP)

    async def main() -> None:
        async def put(e: int) -> None:
            await tier.put(e * 256, b"", src(b"", 1))

        async with trio.open_nursery() as nursery:
            for e in range(1600):
                nursery.start_soon(put, e)
        assert 1400 <= len(tier.entries()) < 1600 and tier.counters.put_refused > 0
        assert du(root) <= limit
        await tier.close()

    run(main)
    assert du(root) <= limit


# --------------------------------------------------------------------------- verified reads


def flip_byte(path: str, offset: int) -> None:
    with open(path, "r+b") as fh:
        fh.seek(offset)
        b = fh.read(1)
        fh.seek(offset)
        fh.write(bytes([b[0] ^ 0xFF]))


def test_corrupted_directory_file_is_detected_counted_and_dropped(tmp_path: Path) -> None:
    """A byte flipped in the middle block of a 3-block tier file: ranges that avoid the block still
    verify; the first range or get touching it returns None, counts one corruption and drops the
    copy (file unlinked, budget returned) so the caller refetches."""
    tier = DirectoryTier(1, tmp_path / "tier", 64 << 20, 2, FP)
    data = payload(3, 2 * BLOCK + 1000)

    async def main() -> None:
        for entry in (3, 4):
            assert await tier.put(entry, data, src(data, 1))
        used_one = tier.budget.used
        for entry in (3, 4):
            flip_byte(file_path(tier.path, entry), BLOCK + BLOCK // 2)
        assert await tier.read_range(3, 10, 5000) == data[10:5010]
        assert await tier.read_range(3, 2 * BLOCK, 1000) == data[2 * BLOCK :]
        assert tier.counters.corrupt == 0
        assert await tier.read_range(3, BLOCK - 10, 20) is None
        assert tier.counters.corrupt == 1 and not tier.contains(3)
        assert await tier.get(4) is None
        assert tier.counters.corrupt == 2 and not tier.contains(4)
        await settle(tier)
        assert not os.path.exists(file_path(tier.path, 3)) and not os.path.exists(file_path(tier.path, 4))
        assert tier.budget.used == used_one - 2 * round_up(len(data))
        assert await tier.put(3, data, src(data, 1)) and await tier.get(3) == data  # the refetch is stored again
        await tier.close()

    run(main)


def test_truncated_or_missing_directory_file_counts_as_corrupt(tmp_path: Path) -> None:
    tier = DirectoryTier(1, tmp_path / "tier", 16 << 20, 2, FP)

    async def main() -> None:
        for e in (1, 2):
            assert await tier.put(e, payload(e, 5000), src(payload(e, 5000), 1))
        os.truncate(file_path(tier.path, 1), 4000)
        os.unlink(file_path(tier.path, 2))
        assert await tier.get(1) is None and await tier.read_range(2, 0, 10) is None
        assert tier.counters.corrupt == 2 and tier.entries() == []
        await tier.close()

    run(main)


RANGES = st.lists(st.tuples(st.integers(-5, 3 * BLOCK + 10), st.integers(-1, BLOCK + 5000)), max_size=12)


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ranges=RANGES)
def test_range_reads_of_a_three_block_file_are_exact(tmp_path: Path, ranges: list[tuple[int, int]]) -> None:
    """Any (offset, size), across block edges, past the end or empty, reads exactly what slicing the
    source gives, from both tiers."""
    data = payload(9, 3 * BLOCK - 12345)
    edges = [(0, 1), (BLOCK - 1, 2), (BLOCK, BLOCK), (2 * BLOCK - 3, BLOCK + 10), (0, 10 * BLOCK)]
    edges.append((len(data), 1))

    async def main() -> None:
        mem = MemoryTier(0, Budget(8 * BLOCK, "memory"), 2, verify_reads=True)
        with tempfile.TemporaryDirectory(dir=tmp_path) as tmp:
            disk = DirectoryTier(1, Path(tmp), 8 * BLOCK, 2, FP)
            for tier in (mem, disk):
                assert await tier.put(9, data, src(data, 1))
                for off, size in ranges + edges:
                    want = data[max(off, 0) : max(off, 0) + max(size, 0)]
                    assert await tier.read_range(9, off, size) == want, (tier.name, off, size)
                assert await tier.get(9) == data
                assert tier.counters.corrupt == 0
            await disk.close()

    run(main)


def test_directory_tier_leaves_no_pages_in_the_page_cache(tmp_path: Path) -> None:
    """After a put and a get, the tier file has no resident pages (fincore): the disk tier does not
    also fill RAM."""
    tier = DirectoryTier(1, tmp_path / "tier", 64 << 20, 2, FP)
    data = payload(1, 3 * BLOCK)

    def resident(path: str) -> int:
        out = subprocess.run(
            ["fincore", "--bytes", "--noheadings", "--output", "RES", path], capture_output=True, text=True, check=True
        )
        return int(out.stdout.strip())

    async def main() -> None:
        assert await tier.put(1, data, src(data, 1))
        assert resident(file_path(tier.path, 1)) == 0
        assert await tier.get(1) == data and await tier.read_range(1, BLOCK, 100) == data[BLOCK : BLOCK + 100]
        assert resident(file_path(tier.path, 1)) == 0
        await tier.close()

    run(main)


# --------------------------------------------------------------------------- warm restart


def test_warm_restart_keeps_valid_entries_and_removes_the_rest(tmp_path: Path) -> None:
    """Reopening with the same fingerprint keeps files whose size matches the index; a removed or
    resized file, a leftover temporary and an orphan are cleaned; files that are not ours stay."""
    root = tmp_path / "tier"
    sizes = {1: 100, 2: 5000, 3: BLOCK + 7, 4: 0, 5: 70_000}

    async def fill() -> None:
        tier = DirectoryTier(1, root, 32 << 20, 2, FP)
        for e, s in sizes.items():
            assert await tier.put(e, payload(e, s), src(payload(e, s), 1000 + e))
        await tier.close()

    run(fill)
    os.unlink(file_path(root, 2))
    with open(file_path(root, 3), "ab") as fh:
        fh.write(b"x")
    Path(file_path(root, 6) + ".tmp").write_bytes(b"half")
    Path(file_path(root, 7)).write_bytes(b"orphan")
    (root / "notes.txt").write_text("not ours")
    (root / "05" / "picture.jpg").write_bytes(b"not ours")

    tier = DirectoryTier(1, root, 32 << 20, 2, FP)
    assert tier.opened is not None  # the constructor opened the tier
    assert tier.opened["warm"] and tier.opened["kept_files"] == 3 and tier.foreign_bytes == 2 * 4096
    assert sorted(tier.entries()) == [1, 4, 5]
    assert tier.source_of(5) == src(payload(5, sizes[5]), 1005) and tier.budget.used == accounted(tier)
    for name in ("02/2", "03/3", "06/6.tmp", "07/7"):
        assert not (root / name).exists(), name
    assert (root / "notes.txt").exists() and (root / "05" / "picture.jpg").exists()

    async def check() -> None:
        for e in (1, 4, 5):
            assert await tier.get(e) == payload(e, sizes[e])
        await tier.close()

    run(check)

    cold = DirectoryTier(1, root, 32 << 20, 2, "fingerprint-b")
    assert cold.opened is not None  # the constructor opened the tier
    assert not cold.opened["warm"] and cold.entries() == [] and cold.opened["removed_files"] == 3
    assert cold.budget.used == cold.base_bytes
    assert not [p for p in root.glob("??/*") if p.name != "picture.jpg"]
    assert (root / "notes.txt").exists() and (root / "05" / "picture.jpg").exists()
    cold.abandon()


@pytest.mark.parametrize("damage", ["truncate", "flip digest"])
def test_unreadable_index_means_cold_start(tmp_path: Path, damage: str) -> None:
    """A torn index, or one whose recorded digest changed on disk, is not trusted: cold start."""
    root = tmp_path / "tier"
    data = payload(1, 10)

    async def fill() -> None:
        tier = DirectoryTier(1, root, 8 << 20, 2, FP)
        assert await tier.put(1, data, src(data, 1))
        await tier.close()

    run(fill)
    index = root / INDEX_NAME
    raw = bytearray(index.read_bytes())
    if damage == "truncate":
        del raw[len(raw) // 2 :]
    else:
        at = raw.find(BlockDigests.of(data).digests[0].to_bytes(8, "little"))
        assert at > 0
        raw[at] ^= 0xFF
    index.write_bytes(bytes(raw))
    tier = DirectoryTier(1, root, 8 << 20, 2, FP)
    assert tier.opened is not None  # the constructor opened the tier
    assert not tier.opened["warm"] and "index" in tier.opened["reason"] and tier.entries() == []
    assert not (root / "01" / "1").exists()
    tier.abandon()


def test_index_is_persisted_while_running_so_a_crash_resumes_warm(tmp_path: Path) -> None:
    """With persistence due, puts write the index in the background; a daemon that dies without
    close() still restarts warm with what the index recorded."""
    root = tmp_path / "tier"
    tier = DirectoryTier(1, root, 8 << 20, 2, FP, persist_interval=0.0)

    async def fill() -> None:
        for e in range(5):
            assert await tier.put(e, payload(e, 3000), src(payload(e, 3000), 1))
        await settle(tier)
        assert tier.status()["index_unsaved_changes"] == 0

    run(fill)
    tier.abandon()  # the crash: no close(), no final index write
    again = DirectoryTier(1, root, 8 << 20, 2, FP)
    assert again.opened is not None  # the constructor opened the tier
    assert again.opened["warm"] and sorted(again.entries()) == list(range(5))
    again.abandon()


def test_reopening_with_a_smaller_budget_drops_files_until_it_fits(tmp_path: Path) -> None:
    root = tmp_path / "tier"

    async def fill() -> None:
        tier = DirectoryTier(1, root, 4 << 20, 2, FP)
        for e in range(20):
            assert await tier.put(e, payload(e, 100_000), src(payload(e, 100_000), 1))
        await tier.close()

    run(fill)
    limit = 2 << 20
    tier = DirectoryTier(1, root, limit, 2, FP)
    assert tier.opened is not None  # the constructor opened the tier
    assert 0 < len(tier.entries()) < 20 and tier.opened["over_budget"] > 0
    assert tier.budget.used <= limit and du(root) <= limit
    tier.abandon()


def test_prune_stale_drops_copies_whose_source_changed(tmp_path: Path) -> None:
    async def main() -> None:
        mem = MemoryTier(0, Budget(1 << 20, "memory"), 1)
        disk = DirectoryTier(1, tmp_path / "tier", 8 << 20, 1, FP)
        for tier in (mem, disk):
            for e in range(6):
                assert await tier.put(e, payload(e, 10), src(payload(e, 10), 100 + e))
            # entry 1 resized, 2 rewritten (mtime), 3 rewritten with its mtime restored (ctime),
            # 4 replaced by another file (inode), 5 past the snapshot's end
            stamps = np.array([100, 101, 102, 103, 104])
            ids = SourceColumns(
                np.array([10, 11, 10, 10, 10]),
                np.where(np.arange(5) == 2, 999, stamps),
                np.where(np.arange(5) == 3, 999, stamps),
                np.where(np.arange(5) == 4, 999, stamps).astype(np.uint64),
            )
            assert tier.prune_stale(ids) == 5
            assert tier.entries() == [0] and tier.counters.stale == 5
        await disk.close()

    run(main)


# --------------------------------------------------------------------------- concurrency rules


def test_cancelled_put_gives_its_budget_back_and_leaves_no_file(tmp_path: Path) -> None:
    """A put cancelled while queued for a worker thread releases its data reservation (only its
    session-long name slot stays) and writes nothing; the same put later succeeds."""
    tier = DirectoryTier(1, tmp_path / "tier", 8 << 20, 1, FP)
    mem = MemoryTier(0, Budget(8 << 20, "memory"), 1)
    data = payload(5, 2 * BLOCK)  # large enough that the memory tier hashes in a thread

    async def main() -> None:
        for t in (tier, mem):
            before = t.budget.used
            holder = object()
            await t.limiter.acquire_on_behalf_of(holder)
            with trio.CancelScope() as scope:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(t.put, 5, data, src(data, 1))
                    await trio.testing.wait_all_tasks_blocked()
                    assert t.budget.used > before  # reserved while queued
                    scope.cancel()
            t.limiter.release_on_behalf_of(holder)
            slots = t.status()["name_slots"] if isinstance(t, DirectoryTier) else 0  # only directories charge names
            assert t.budget.used == before + slots * NAME_BYTES and not t.contains(5)
            assert await t.put(5, data, src(data, 1)) and await t.get(5) == data
        assert not os.path.exists(file_path(tier.path, 5) + ".tmp")
        await tier.close()

    run(main)


def test_failed_write_returns_false_counts_and_gives_back_its_budget(tmp_path: Path) -> None:
    """A write the disk refuses (here: its fan-out directory replaced by a file) is not an error for
    the caller: put returns False, counts it, keeps no data charge and leaves no temporary."""
    tier = DirectoryTier(1, tmp_path / "tier", 8 << 20, 1, FP)
    (tier.path / "05").rmdir()
    (tier.path / "05").write_bytes(b"")

    async def main() -> None:
        before = tier.budget.used
        assert not await tier.put(5, payload(5, 10_000), src(payload(5, 10_000), 1))
        assert tier.counters.put_errors == 1 and not tier.contains(5)
        assert tier.budget.used == before + NAME_BYTES * tier.status()["name_slots"]
        assert await tier.put(6, payload(6, 10_000), src(payload(6, 10_000), 1))  # other directories still work
        await tier.close()

    run(main)


def test_concurrent_puts_of_one_entry_charge_once(tmp_path: Path) -> None:
    tier = DirectoryTier(1, tmp_path / "tier", 8 << 20, 4, FP)
    mem = MemoryTier(0, Budget(8 << 20, "memory"), 4)
    data = payload(1, BLOCK + 1)

    async def main() -> None:
        for t in (tier, mem):
            before = t.budget.used
            results: list[bool] = []

            async def put(t: DirectoryTier | MemoryTier = t, results: list[bool] = results) -> None:
                results.append(await t.put(1, data, src(data, 1)))

            async with trio.open_nursery() as nursery:
                for _ in range(6):
                    nursery.start_soon(put)
            assert results == [True] * 6 and t.counters.puts == 1
            assert t.budget.used - before == t.footprint(len(data))
        await tier.close()

    run(main)


def test_drop_during_a_put_wins(tmp_path: Path) -> None:
    """drop() of an entry whose put is still writing: the put returns False, nothing stays."""
    tier = DirectoryTier(1, tmp_path / "tier", 8 << 20, 1, FP)

    async def main() -> None:
        before = tier.budget.used
        results: list[bool] = []

        async def put() -> None:
            results.append(await tier.put(2, payload(2, 50_000), src(payload(2, 50_000), 1)))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(put)
            await trio.testing.wait_all_tasks_blocked()
            tier.drop(2)
        await settle(tier)
        assert results == [False] and not tier.contains(2)
        assert tier.budget.used == before + NAME_BYTES * tier.status()["name_slots"]
        assert not os.path.exists(file_path(tier.path, 2))
        await tier.close()

    run(main)


def test_gets_racing_drops_and_puts_return_the_right_bytes_or_none(tmp_path: Path) -> None:
    """Random concurrent gets, range reads, drops and re-puts: every answer is the entry's own bytes
    or None, and no race is mistaken for corruption."""
    tier = DirectoryTier(1, tmp_path / "tier", 16 << 20, 3, FP, persist_interval=0.01)
    rng = random.Random(11)
    sizes = {e: rng.choice([10, 4096, 70_000, BLOCK + 3]) for e in range(12)}

    async def worker(seed: int) -> None:
        r = random.Random(seed)
        for _ in range(60):
            e = r.randrange(12)
            op = r.random()
            if op < 0.3:
                await tier.put(e, payload(e, sizes[e]), src(payload(e, sizes[e]), 1))
            elif op < 0.45:
                tier.drop(e)
            elif op < 0.75:
                got = await tier.get(e)
                assert got is None or got == payload(e, sizes[e])
            else:
                off = r.randrange(sizes[e])
                got = await tier.read_range(e, off, 5000)
                assert got is None or got == payload(e, sizes[e])[off : off + 5000]
            await trio.sleep(0)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            for s in range(6):
                nursery.start_soon(worker, s)
        await settle(tier)
        assert tier.counters.corrupt == 0 and tier.budget.used == accounted(tier)
        await tier.close()

    run(main)


# --------------------------------------------------------------------------- building from config


def test_build_tiers_from_config_and_clear_errors(tmp_path: Path) -> None:
    cfgs = [
        TierConfig(kind="memory", bytes=ByteSize(1 << 20), threads=2),
        TierConfig(kind="directory", path="ssd", bytes=ByteSize(8 << 20), threads=3),
    ]
    budget = memory_budget(cfgs)
    tiers = build_tiers(cfgs, budget, FP, tmp_path)
    assert [t.name for t in tiers] == ["memory", "directory:1"] and budget.limit == 1 << 20
    assert tiers[1].status()["path"] == str(tmp_path / "ssd") and tiers[1].limiter.total_tokens == 3
    with pytest.raises(ConfigError, match=r"tiers\.1\.path: .* in use by another seerfs daemon"):
        build_tiers(cfgs, budget, FP, tmp_path)
    run(tiers[1].close)
    inner = str(tmp_path / "ssd" / "sub")
    nested = [*cfgs, TierConfig(kind="directory", path=inner, bytes=ByteSize(1 << 20))]
    with pytest.raises(ConfigError, match=r"tiers\.2\.path: .* overlaps tiers\.1\.path"):
        build_tiers(nested, budget, FP, tmp_path)
    blocked = tmp_path / "file"
    blocked.write_text("x")
    bad = [TierConfig(kind="directory", path=str(blocked / "d"), bytes=ByteSize(1 << 20))]
    with pytest.raises(ConfigError, match=r"tiers\.0\.path .*/file is not a directory"):
        build_tiers(bad, budget, FP, tmp_path)


def test_a_put_overtaken_by_two_index_writes_survives_a_crash(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A put whose journal record is written while its task has not yet put the copy in the index,
    overtaken by two index writes: the next open replays only the last two generations, so the
    second write must wait for that put.  Before it did, the copy was removed at the next open."""
    root = tmp_path / "tier"
    tier = DirectoryTier(1, root, 8 << 20, 2, FP)
    written, release = threading.Event(), threading.Event()
    plain = tier._write

    def held_write(entry: int, *rest: Any) -> tuple[BlockDigests, int]:
        out = plain(entry, *rest)
        if entry == 7:
            written.set()  # the record is in the journal and the file has its final name
            release.wait(10)
        return out

    monkeypatch.setattr(tier, "_write", held_write)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(tier.put, 7, payload(7, 3000), src(payload(7, 3000), 1))
            assert await trio.to_thread.run_sync(written.wait, 10)
            assert await tier.persist(force=True)  # claims the next generation: 7's record is one before
            nursery.start_soon(tier.persist, True)  # and the one after: 7's record would be two before
            await trio.sleep(0.1)
            release.set()

    run(main)
    tier.abandon()  # the crash: no close()
    again = DirectoryTier(1, root, 8 << 20, 2, FP)
    assert again.opened is not None and again.opened["warm"]
    assert again.entries() == [7], again.opened
    again.abandon()
