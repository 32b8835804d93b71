"""The read path in one process: the real Operations handlers under trio, without /dev/fuse.

The mount is assembled as the daemon assembles it (:func:`build_readpath`, :func:`build_operations`)
over a real source directory, real tiers and the real PFS reader; only the kernel's page-cache
calls and the owning peer are stand-ins (``readpath_fakes``).  Each test opens a file through one
source of the read order (staged page cache, staged memory, memory tier, directory tier, a fetch in
flight, the peer, the PFS whole and in ranges) and checks the bytes against the source file read
directly, and the per-source counters.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import trio
import trio.testing
from inprocess import BIG, CTX, Mount, assemble, make_source, serve, until

from fusefs.fuse.front import FileInfo
from fusefs.meta.ids import entry_of, inode_of
from fusefs.readpath import fetcher as fetcher_module
from fusefs.readpath.contract import Stage
from fusefs.readpath.fetcher import Sources
from fusefs.tiers.layout import file_path
from placement.cursor import NodeCursor
from placement.plan import Plan


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, bytes]]:
    root = tmp_path_factory.mktemp("inproc") / "src"
    return root, make_source(root)


def mount(
    tmp_path: Path, source: tuple[Path, dict[str, bytes]], ssd: bool = False, overrides: dict[str, str] | None = None
) -> Mount:
    return assemble(source[0], source[1], tmp_path, ssd, overrides)


# ---------------------------------------------------------------------------- sources without a plan


def test_pfs_whole(tmp_path: Path, source: tuple[Path, dict[str, bytes]]) -> None:
    m = mount(tmp_path, source)
    rel = "c0/f2.jpg"

    async def body() -> None:
        data, fi = await m.read(rel)
        assert data == m.files[rel] and fi.keep_cache and not fi.direct_io

    serve(m, body)
    assert m.served() == {"pfs": (1, len(m.files[rel]))}
    assert m.peer.asked == [m.entry(rel)]  # the owner was asked first and had nothing


def test_pfs_ranged(tmp_path: Path, source: tuple[Path, dict[str, bytes]]) -> None:
    m = mount(tmp_path, source)

    async def body() -> None:
        data, _fi = await m.read(BIG, chunk=30_000)
        assert data == m.files[BIG]

    serve(m, body)
    assert m.served() == {"pfs": (1, len(m.files[BIG]))}
    assert m.peer.asked == []  # a big file is never fetched whole


def test_peer(tmp_path: Path, source: tuple[Path, dict[str, bytes]]) -> None:
    m = mount(tmp_path, source)
    rel = "c1/f4.jpg"
    m.peer.files[m.entry(rel)] = m.files[rel]

    async def body() -> None:
        assert (await m.read(rel))[0] == m.files[rel]

    serve(m, body)
    assert m.served() == {"peer": (1, len(m.files[rel]))}


def test_inflight(tmp_path: Path, source: tuple[Path, dict[str, bytes]]) -> None:
    """An open of a file being fetched (here a prefetch held at the peer) waits for that fetch."""
    m = mount(tmp_path, source)
    rel = "c0/f5.jpg"
    entry = m.entry(rel)
    m.peer.files[entry] = m.files[rel]
    gate = m.peer.gates[entry] = trio.Event()
    got: list[bytes] = []

    async def body() -> None:
        m.rp.fetcher.start(entry, Sources.ALL, why="test")
        # Held at the peer, past its read-back step: an open during a read back runs apart from it
        # by design (fetcher.py), and starting the reader at once raced that step.
        await until(lambda: m.rp.fetcher.joinable(entry) is not None and m.peer.asked == [entry])
        async with trio.open_nursery() as nursery:
            nursery.start_soon(lambda: reader())
            await trio.testing.wait_all_tasks_blocked()
            gate.set()

    async def reader() -> None:
        got.append((await m.read(rel))[0])

    serve(m, body)
    assert got == [m.files[rel]]
    assert m.served() == {"inflight": (1, len(m.files[rel])), "peer": (1, len(m.files[rel]))}
    assert m.peer.asked == [entry]  # one fetch for both


@pytest.mark.parametrize("tier", [0, 1], ids=["memory", "directory"])
def test_tiers(tmp_path: Path, source: tuple[Path, dict[str, bytes]], tier: int) -> None:
    m = mount(tmp_path, source, ssd=True)
    rel = "c1/f3.jpg"
    entry = m.entry(rel)
    kind = m.rp.tiers[tier].kind

    async def body() -> None:
        assert await m.rp.tiers[tier].put(entry, m.files[rel], m.rp.reader.ids.of(entry))
        assert (await m.read(rel))[0] == m.files[rel]

    serve(m, body)
    assert m.served() == {kind: (1, len(m.files[rel]))}
    assert m.tier_counters(tier).hits == 1 and m.peer.asked == []


def test_a_damaged_tier_copy_is_refetched_and_leaves_the_reactive_set(
    tmp_path: Path, source: tuple[Path, dict[str, bytes]]
) -> None:
    """The directory tier finds its copy damaged and drops it; the open fetches the file again, and the
    reactive policy's record of what each tier holds follows (it counted the lost copy before)."""
    m = mount(tmp_path, source, ssd=True)
    rel = "c0/f3.jpg"
    entry = m.entry(rel)
    ssd = m.rp.tiers[1]

    async def body() -> None:
        assert await ssd.put(entry, m.files[rel], m.rp.reader.ids.of(entry))
        m.rp.prefetcher.on_plan(None)  # no plan: the reactive policy adopts what the tiers hold
        assert m.rp.policy.reactive.where == {entry: 1}
        path = file_path(ssd.path, entry)  # type: ignore[attr-defined]
        with open(path, "r+b") as fh:
            fh.seek(100)
            byte = fh.read(1)
            fh.seek(100)
            fh.write(bytes([byte[0] ^ 0xFF]))
        assert (await m.read(rel))[0] == m.files[rel]
        await until(lambda: not m.rp.fetcher.inflight)
        reactive = m.rp.policy.reactive
        for t, tier in enumerate(m.rp.tiers):
            assert set(reactive.tiers[t].members) == set(tier.entries()), t
        assert reactive.where == {entry: 0}  # the refetched copy was kept in memory

    serve(m, body)
    assert m.tier_counters(1).corrupt == 1 and m.served() == {"pfs": (1, len(m.files[rel]))}


def test_a_file_the_budget_cannot_hold_bypasses_the_page_cache(
    tmp_path: Path, source: tuple[Path, dict[str, bytes]]
) -> None:
    m = mount(
        tmp_path, source, overrides={"tiers": "[{kind: memory, bytes: 12KiB}]", "prefetch.lookahead_bytes": "4KiB"}
    )
    rel = "c0/f5.jpg"  # 18 KB

    async def body() -> None:
        data, fi = await m.read(rel)
        assert data == m.files[rel] and fi.direct_io and not fi.keep_cache

    serve(m, body)
    assert m.rp.policy.uncached_opens == 1 and m.rp.budget.used <= m.rp.budget.limit


# ---------------------------------------------------------------------------- staged sources


def staged_then_opened(m: Mount, state: str) -> tuple[int, FileInfo, bytes]:
    """Give the mount a plan; once the first file of the window is staged (``state``), open it."""
    plan = m.plan()
    out: list[tuple[int, FileInfo, bytes]] = []

    async def body() -> None:
        policy = m.rp.policy
        m.rp.prefetcher.on_plan(plan)  # a written seed on one node: the cursor presumes node 0, epoch 0
        await until(lambda: bool(policy.view.stage))
        first = policy.view.stage[0]
        await until(lambda: first in policy.pages and policy.pages[first].state == state)
        fi = await m.ops.open(inode_of(first), os.O_RDONLY, CTX)
        data = b""
        if not fi.keep_cache or state == "held":
            data = bytes(await m.ops.read(fi.fh, 0, 1 << 20))
        await m.ops.release(fi.fh)
        out.append((first, fi, data))

    serve(m, body)
    return out[0]


def test_staged_page_cache(tmp_path: Path, source: tuple[Path, dict[str, bytes]]) -> None:
    """The file was pushed into the page cache before the open: the kernel serves it, not the daemon."""
    m = mount(tmp_path, source)
    entry, fi, _data = staged_then_opened(m, "pushed")
    rel = os.fsdecode(m.rp.snapshot.tree.path(entry))
    assert m.kernel.pages[inode_of(entry)] == m.files[rel]
    assert fi.keep_cache and not fi.direct_io
    served = m.served()
    assert served.pop("page_cache") == (1, len(m.files[rel]))
    assert set(served) == {"pfs"}  # the window's and the tier fill's fetches: the open fetched nothing
    assert m.rp.policy.kept == {entry: len(m.files[rel])}  # consumed: its pages stay while there is room


def test_staged_memory(tmp_path: Path, source: tuple[Path, dict[str, bytes]]) -> None:
    m = mount(tmp_path, source, overrides={"prefetch.staging": "memory"})
    entry, fi, data = staged_then_opened(m, "held")
    rel = os.fsdecode(m.rp.snapshot.tree.path(entry))
    assert data == m.files[rel] and fi.keep_cache
    assert m.kernel.pushed == []
    served = m.served()
    assert served.pop("memory") == (1, len(m.files[rel]))
    assert m.tier_counters(0).hits == 0  # from the window's bytes, not the memory tier's copy
    assert set(served) == {"pfs"}


def test_entry_and_inode_numbers_agree(tmp_path: Path, source: tuple[Path, dict[str, bytes]]) -> None:
    """The lookups the tests above rely on resolve to the snapshot's entries."""
    m = mount(tmp_path, source)
    found: list[int] = []

    async def body() -> None:
        found.append(entry_of(await m.lookup(BIG)))

    serve(m, body)
    assert found == [m.entry(BIG)]


def test_a_request_handler_never_waits_on_a_read_back_of_its_file(
    tmp_path: Path, source: tuple[Path, dict[str, bytes]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reader's pages were dropped, so its READ refetches the file while another fetch of it is
    stuck reading it back through the mount (as the kernel holds that READ's page locked, such a
    read back waits for the READ: the mount hung in a three-node soak).  The READ is served from
    elsewhere at once, not by joining that fetch, and so is a new open of the file; the read back
    ends when released, harmlessly."""
    monkeypatch.setattr(fetcher_module, "RECENT_SECONDS", 0.0)  # no fetch takes the read through's bytes
    m = mount(tmp_path, source)
    rel = "c1/f3.jpg"
    entry = m.entry(rel)

    async def body() -> None:
        assert (await m.read(rel))[0] == m.files[rel]  # read through: its pages are kept
        for tier in m.rp.tiers:
            tier.drop(entry)  # and its pages are all there is of it here
        assert m.rp.policy.in_page_cache(entry) and m.rp.fetcher.local_tier(entry) is None
        m.kernel.read_gate.clear()
        stuck = m.rp.fetcher.start(entry, Sources.ALL, why="test")  # e.g. a tier fill: reads the file back first
        await until(m.kernel.read_waiting.is_set)
        inode = await m.lookup(rel)
        fi = await m.ops.open(inode, os.O_RDONLY, CTX)  # served by the kept pages ...
        with trio.fail_after(2):
            data = await m.ops.read(fi.fh, 0, 1 << 20)  # ... which the kernel dropped: a READ arrives
        assert bytes(data) == m.files[rel]
        await m.ops.release(fi.fh)
        # Every kept page given up, as when the budget needs room outside a policy step (its callback
        # carries the drops out at once): the next open fetches.
        reclaim = m.rp.budget.reclaim
        assert reclaim is not None and reclaim(m.rp.policy.kept_bytes) > 0
        assert not m.rp.policy.in_page_cache(entry)
        with trio.fail_after(2):
            assert (await m.read(rel))[0] == m.files[rel]
        assert not stuck.done.is_set()  # the read back is still waiting: neither request waited on it
        m.kernel.read_gate.set()
        assert await stuck.wait() == m.files[rel]

    serve(m, body)


def test_a_fetch_whose_read_back_found_nothing_takes_the_bytes_a_request_is_fetching_apart(
    tmp_path: Path, source: tuple[Path, dict[str, bytes]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stage or fill reading a file back through the mount while two readers open it: their
    requests may not join the read back, so one fetch runs apart from it and the other request
    joins that one; when the read back finds no pages, the stage takes that fetch's bytes.  One
    fetch reaches the owner and the PFS, not three (seen: a stage and an open of the same file
    both reading the PFS in the same millisecond, the file read twice by the group)."""
    monkeypatch.setattr(fetcher_module, "RECENT_SECONDS", 0.0)  # no fetch takes the read through's bytes
    m = mount(tmp_path, source)
    rel = "c1/f3.jpg"
    entry = m.entry(rel)
    got: list[bytes] = []

    async def body() -> None:
        assert (await m.read(rel))[0] == m.files[rel]  # read through: its pages are kept (the kernel
        for tier in m.rp.tiers:  # stand-in has none: a read back finds nothing)
            tier.drop(entry)
        asked, pfs = len(m.peer.asked), m.rp.counters.sources["pfs"].files
        m.kernel.read_gate.clear()
        stuck = m.rp.fetcher.start(entry, Sources.ALL, why="test")  # reads the file back first
        await until(m.kernel.read_waiting.is_set)
        gate = m.peer.gates[entry] = trio.Event()  # the fetch apart waits at the owner

        async def read() -> None:
            got.append((await m.read(rel))[0])

        with trio.fail_after(5):
            async with trio.open_nursery() as nursery:
                for _ in range(2):
                    nursery.start_soon(read)
                await until(lambda: len(m.peer.asked) > asked)
                await trio.testing.wait_all_tasks_blocked()
                m.kernel.read_gate.set()  # the read back finds no pages ...
                await until(lambda: not stuck.reading_pages)
                await trio.testing.wait_all_tasks_blocked()
                gate.set()  # ... and waits for the fetch apart rather than fetching again
            assert await stuck.wait() == m.files[rel]
        assert m.peer.asked[asked:] == [entry]
        assert m.rp.counters.sources["pfs"].files == pfs + 1

    serve(m, body)
    assert got == [m.files[rel]] * 2


def test_a_file_read_for_a_peer_serves_this_nodes_next_fetch_of_it_within_a_bound(
    tmp_path: Path, source: tuple[Path, dict[str, bytes]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A node reads a file from the PFS for a peer and keeps no copy; its own stage of that file,
    decided meanwhile, starts once that read ended: it takes those bytes rather than reading the
    PFS again (seen: one file read twice on one node, 13-45 ms apart).  Bounded: past
    ``RECENT_SECONDS`` or ``RECENT_BYTES`` (the oldest going first), a fetch reads again; and a
    fetch that is not for a peer is not remembered (its bytes are kept where it was asked to)."""
    m = mount(tmp_path, source)
    small = ["c0/f0.jpg", "c0/f1.jpg", "c0/f2.jpg"]
    x, y, z = (m.entry(rel) for rel in small)

    async def for_peer(entry: int) -> bytes:
        return await m.rp.fetcher.start(entry, Sources.PFS, why="peer", remember=True).wait()

    async def fetch(entry: int) -> bytes:
        return await m.rp.fetcher.start(entry, Sources.REQUEST, why="staging").wait()

    def pfs_files() -> int:
        return m.rp.counters.sources["pfs"].files

    async def body() -> None:
        assert await for_peer(x) == m.bytes_of(x) and pfs_files() == 1
        assert await fetch(x) == m.bytes_of(x)  # the bytes read for the peer
        assert m.peer.asked == [] and pfs_files() == 1 and m.rp.fetcher.recent_hits == 1
        assert await fetch(y) == m.bytes_of(y) and await fetch(y) == m.bytes_of(y)  # not for a peer
        assert m.peer.asked == [y, y] and pfs_files() == 3
        # Room for two of these files: reading two more for peers pushes the first out.
        monkeypatch.setattr(fetcher_module, "RECENT_BYTES", len(m.files[small[1]]) + len(m.files[small[2]]))
        await for_peer(y)
        await for_peer(z)
        assert await fetch(x) == m.bytes_of(x) and m.peer.asked[-1] == x
        monkeypatch.setattr(fetcher_module, "RECENT_SECONDS", 0.0)  # past the time bound: read again
        assert await fetch(z) == m.bytes_of(z) and m.peer.asked[-1] == z
        assert m.rp.fetcher.recent_hits == 1 and pfs_files() == 7

    serve(m, body)


def test_a_stage_decided_before_a_fill_stored_its_file_reads_that_copy(
    tmp_path: Path, source: tuple[Path, dict[str, bytes]]
) -> None:
    """The window decides a stage with no tier holding the file while a fill of it is in flight;
    the stage runs after the fill stored its copy: it reads that copy, not the owner or the PFS
    again (seen: a fill and then the stage of the same file, both from the PFS, 20 ms apart)."""
    m = mount(tmp_path, source)
    entry = m.entry("c0/f3.jpg")

    async def body() -> None:
        tier = m.rp.tiers[0]
        await m.rp.fetcher.start(entry, Sources.REQUEST, tier, why="fill").wait()
        assert tier.contains(entry)
        asked, pfs = len(m.peer.asked), m.rp.counters.sources["pfs"].files
        await m.rp.prefetcher._stage_one(Stage(entry, None, None))  # as decided before the fill ended
        assert len(m.peer.asked) == asked and m.rp.counters.sources["pfs"].files == pfs
        assert m.rp.prefetcher.staging_fetches == 0  # no fetch: the tier's copy

    serve(m, body)


# ---------------------------------------------------------------------------- a plan replaced mid-stream


def node_order(m: Mount, plan: Plan, n: int) -> tuple[list[int], dict[str, list[int]]]:
    """The first ``n`` entries node 0 opens under ``plan`` (a reference cursor's prediction), and
    each rank's first unconsumed position once a cursor observed them all."""
    ref = NodeCursor(plan.job_streams(), m.rp.prefetcher.settings)
    ref.presume(0, 0)
    gids = [gid for _epoch, gid in ref.upcoming(n)]
    for gid in gids:
        assert ref.observe(gid)
    return [int(e) for e in plan.entry_of(np.asarray(gids, dtype=np.int64))], ref.status()["rank_positions"]


def opens_seen(m: Mount) -> int | None:
    """Opens the cursor followed now has observed, with those of the cursors it replaced."""
    cursor = m.rp.prefetcher.cursor
    return None if cursor is None else cursor.status()["opens"]


def positions(m: Mount) -> dict[str, list[int]] | None:
    cursor = m.rp.prefetcher.cursor
    return None if cursor is None else cursor.status()["rank_positions"]


@pytest.mark.parametrize("when", ["between turns", "during a worker turn"])
def test_a_plan_replaced_mid_stream_loses_none_of_the_opens_before_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, when: str
) -> None:
    """Seed discovery's plan replaces the followed one while readers open files.  Every open made
    before the switch reaches the new cursor: queued for the old one (between two turns of the
    cursor loop), or being observed on the old one in its worker thread.  A lost open is a hole in
    its rank's track: the first unconsumed position stays on it until the readers are two windows
    past, and the staging window, computed from there, runs dry meanwhile (a mount stopped staging
    for a fifth of an epoch so)."""
    root = tmp_path / "src"
    files: dict[str, bytes] = {}
    for c in range(4):  # enough files that the new cursor's relock on 40 carried opens is certain
        (root / f"c{c}").mkdir(parents=True)
        for i in range(100):
            files[f"c{c}/f{i:03}.jpg"] = data = os.urandom(200 + i)
            (root / f"c{c}/f{i:03}.jpg").write_bytes(data)
    m = assemble(root, files, tmp_path)
    prefetcher = m.rp.prefetcher
    plan = m.plan()
    order, expected = node_order(m, plan, 60)
    gate = threading.Event()
    advance = prefetcher._advance

    def gated(*args: Any) -> Any:
        assert gate.wait(10)
        return advance(*args)

    async def body() -> None:
        try:
            await replaced()
        finally:
            gate.set()  # a failure above must not leave the worker thread at the gate

    async def replaced() -> None:
        prefetcher.on_plan(plan)
        await until(lambda: m.rp.policy.view.state in ("presumed", "tracking"))
        if when == "between turns":
            for entry in order[:40]:
                prefetcher.opened(entry)  # queued: no await since, so the cursor loop has not run
        else:
            gate.clear()
            monkeypatch.setattr(prefetcher, "_advance", gated)
            prefetcher.on_plan(plan)  # a fresh cursor: its first turn prepares it in the worker thread
            for entry in order[:40]:
                prefetcher.opened(entry)
            await until(lambda: not prefetcher._opens)  # the turn took them; its worker waits at the gate
        prefetcher.on_plan(m.plan())  # the same plan, made again: a new cursor
        gate.set()
        for entry in order[40:]:
            prefetcher.opened(entry)
        with trio.move_on_after(3):  # the turns that observe them
            await until(lambda: opens_seen(m) == len(order))
        assert opens_seen(m) == len(order)  # every open reached the cursor that follows now
        if when == "between turns":  # placed as if no plan had been replaced: no hole
            assert positions(m) == expected

    gate.set()
    serve(m, body)
