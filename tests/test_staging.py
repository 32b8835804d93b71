"""Staging against the kernel when a reader's open races the push of the same file.

In process (see ``inprocess``): the read path is served under trio with the real executor, policy
and handlers; the kernel's notify_store / invalidate_inode are recorded, and a push can be held in
its worker thread to open the race.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import trio
import trio.testing
from inprocess import CTX, Mount, assemble, drained, make_source, serve, settled, until

from fusefs.fuse.front import FileInfo
from fusefs.meta.ids import ROOT_INODE, entry_of, inode_of
from fusefs.readpath.openfiles import OWN_OPEN, VISIT_OPEN


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, bytes]]:
    root = tmp_path_factory.mktemp("staging") / "src"
    return root, make_source(root)


def held_push(m: Mount) -> int:
    """An entry whose push the kernel holds (the others of the window wait behind it)."""
    pushing = [e for e, p in m.rp.policy.pages.items() if p.state == "pushing"]
    assert pushing
    return pushing[0]


def test_a_file_opened_and_released_during_its_push_keeps_its_pages(
    tmp_path: Path, source: tuple[Path, dict[str, bytes]]
) -> None:
    """The reader is served the bytes being pushed and its pages are cached; the push that ends after
    the release must not invalidate them, and their charge moves to kept pages."""
    m = assemble(source[0], source[1], tmp_path)
    m.kernel.hold.clear()
    seen: list[tuple[int, bytes]] = []

    async def body() -> None:
        m.rp.prefetcher.on_plan(m.plan())
        await trio.to_thread.run_sync(m.kernel.entered.wait, 10)
        entry = held_push(m)
        seen.append((entry, (await m.read_inode(inode_of(entry)))[0]))
        m.kernel.hold.set()
        await until(lambda: inode_of(entry) in m.kernel.pushed)
        await drained(m)

    serve(m, body)
    entry, data = seen[0]
    assert data == m.bytes_of(entry)
    assert inode_of(entry) not in m.kernel.invalidated and m.kernel.pages[inode_of(entry)] == data
    assert m.rp.policy.kept[entry] == len(data)
    assert m.rp.counters.sources["memory"].files == 1 and m.rp.policy.unused == 0


def test_a_file_whose_plan_went_during_its_push_keeps_the_pushed_pages(
    tmp_path: Path, source: tuple[Path, dict[str, bytes]]
) -> None:
    """Nobody opened it and the plan went while its push was in flight: the pushed pages stay, charged
    as kept pages, never invalidated (a lost or wrong plan must not throw away what was fetched: the
    file may still be read, and fetching it again would read the PFS twice)."""
    m = assemble(source[0], source[1], tmp_path)
    m.kernel.hold.clear()
    held: list[int] = []

    async def body() -> None:
        m.rp.prefetcher.on_plan(m.plan())
        await trio.to_thread.run_sync(m.kernel.entered.wait, 10)
        held.append(held_push(m))
        m.rp.prefetcher.on_plan(None)  # the plan failed: the window is no longer predicted
        m.kernel.hold.set()
        await until(lambda: inode_of(held[0]) in m.kernel.pushed)
        await settled(m)  # the window's other stages, in flight too, end the same way

    serve(m, body)
    entry = held[0]
    assert inode_of(entry) not in m.kernel.invalidated
    assert m.kernel.pages[inode_of(entry)] == m.bytes_of(entry)
    assert m.rp.policy.kept[entry] == len(m.bytes_of(entry)) and m.rp.policy.staged_bytes == 0


def test_a_file_opened_before_its_bytes_came_is_not_pushed(
    tmp_path: Path, source: tuple[Path, dict[str, bytes]]
) -> None:
    """The open awaits the stage's fetch and reads the file through the mount itself, so the fetched
    bytes are not pushed a second time; the release keeps the pages it read."""
    m = assemble(source[0], source[1], tmp_path)
    gate = trio.Event()
    for e in range(len(m.rp.snapshot)):
        m.peer.gates[e] = gate  # every fetch is held at the peer (which has nothing, then the PFS)
    seen: list[tuple[int, bytes, FileInfo]] = []

    async def body() -> None:
        policy = m.rp.policy
        m.rp.prefetcher.on_plan(m.plan())
        await until(lambda: bool(policy.view.stage) and policy.view.stage[0] in m.peer.asked)
        entry = policy.view.stage[0]

        async def reader() -> None:
            fi = await m.ops.open(inode_of(entry), os.O_RDONLY, CTX)  # waits for the fetch
            data = bytes(await m.ops.read(fi.fh, 0, 1 << 20))
            await m.ops.release(fi.fh)
            seen.append((entry, data, fi))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(reader)
            await trio.testing.wait_all_tasks_blocked()
            gate.set()
        await until(lambda: not policy.pages or all(p.state != "fetching" for p in policy.pages.values()))

    serve(m, body)
    entry, data, fi = seen[0]
    assert data == m.bytes_of(entry) and fi.keep_cache
    assert inode_of(entry) not in m.kernel.pushed
    assert entry in m.rp.policy.kept
    assert m.rp.counters.sources["inflight"].files >= 1


def test_an_inode_the_kernel_does_not_know_is_looked_up_and_then_pushed(
    tmp_path: Path, source: tuple[Path, dict[str, bytes]]
) -> None:
    """Before any lookup the kernel knows no inode (ENOENT): the daemon looks the file up through the
    mount (as a loader listing its directory would) and stores its pages then."""
    m = assemble(source[0], source[1], tmp_path)
    m.kernel.unknown = {inode_of(e) for e in range(len(m.rp.snapshot))}

    async def body() -> None:
        m.rp.prefetcher.on_plan(m.plan())
        await until(lambda: bool(m.rp.policy.view.stage))
        await until(lambda: m.rp.staging.pushes >= 1)

    serve(m, body)
    assert m.rp.staging.push_failures == 0 and m.rp.staging.introduced == m.rp.staging.pushes
    assert all(m.kernel.pages[i] == m.bytes_of(entry_of(i)) for i in m.kernel.pushed)


def test_a_push_the_kernel_refuses_is_served_from_ram(tmp_path: Path, source: tuple[Path, dict[str, bytes]]) -> None:
    """An inode the kernel does not know even after a lookup (ENOENT): the staged bytes stay in RAM and
    serve the open."""
    m = assemble(source[0], source[1], tmp_path)
    m.kernel.unknown = {inode_of(e) for e in range(len(m.rp.snapshot))}
    m.kernel.lookups_work = False
    seen: list[tuple[int, bytes]] = []

    async def body() -> None:
        policy = m.rp.policy
        m.rp.prefetcher.on_plan(m.plan())
        await until(lambda: bool(policy.view.stage))
        first = policy.view.stage[0]
        await until(lambda: first in policy.pages and policy.pages[first].state == "held")
        seen.append((first, (await m.read_inode(inode_of(first)))[0]))

    serve(m, body)
    entry, data = seen[0]
    assert data == m.bytes_of(entry) and m.kernel.pages == {}
    assert m.rp.staging.push_failures >= 1 and m.rp.counters.sources["memory"].files == 1


def test_pushed_pages_are_marked_for_the_front_and_a_native_open_keeps_the_same_books(
    tmp_path: Path, source: tuple[Path, dict[str, bytes]]
) -> None:
    """A successful push marks the inode (Kernel.set_pages: a native front may answer its opens
    itself); an open the front answered is booked as a Python open of a pushed file is (opens,
    page-cache source, the policy's take), a READ on its handle after the pages went is served the
    file's bytes, its release keeps the pages marked, and queuing their drop unmarks them first."""
    m = assemble(source[0], source[1], tmp_path)
    books: list[tuple[int, int]] = []
    out: list[bytes] = []

    def booked() -> tuple[int, int]:
        c = m.rp.counters
        return c.opens, c.sources["page_cache"].files

    async def body() -> None:
        policy = m.rp.policy
        m.rp.prefetcher.on_plan(m.plan())
        await until(lambda: sum(p.state == "pushed" for p in policy.pages.values()) >= 2)
        a, b = [e for e, p in policy.pages.items() if p.state == "pushed"][:2]
        assert {inode_of(a), inode_of(b)} <= m.kernel.marked
        books.append(booked())
        await m.read_inode(inode_of(a))  # through the daemon, as pyfuse3 serves it
        books.append(booked())
        fh = (1 << 62) + 7  # a native handle
        m.ops.opened_natively(inode_of(b), fh, CTX.pid)
        books.append(booked())
        assert policy.pages[b].taken
        out.append(bytes(await m.ops.read(fh, 0, 1 << 20)))  # the pages were dropped: fetched again
        m.ops.released_natively(fh)
        assert fh not in m.ops.handles and b in policy.kept and inode_of(b) in m.kernel.marked
        m.rp.staging.drop_pages(b)
        assert inode_of(b) not in m.kernel.marked
        out.append(m.bytes_of(b))

    serve(m, body)
    (o0, p0), (o1, p1), (o2, p2) = books
    assert (o1 - o0, p1 - p0) == (1, 1) == (o2 - o1, p2 - p1)
    assert out[0] == out[1]


@pytest.mark.parametrize("lean", [False, True], ids=["logged", "lean"])
def test_a_run_of_native_events_booked_in_one_call_books_what_one_by_one_would(
    tmp_path: Path, source: tuple[Path, dict[str, bytes]], lean: bool
) -> None:
    """The native front hands a run of open/release events over as one flat list
    (``SeerOperations.book_native``), pairing an open with its release in the same run without a
    handle, and in ``no_open`` mode (fh 0) pairing them by inode.  Two identical mounts, one
    booking the same events one by one (``opened_natively``/``released_natively``, and
    ``OpenFiles.seen_natively`` for fh 0), one in runs (a pair in one run, an open left open across
    runs, a read-back open, by its thread id and as the front marked it, an inode outside the tree,
    the same file open twice at once, a close of an open never seen; visits, an open and its release
    the front folded into one event, also of a file open across runs): the policy's steps, its books,
    the cursor's batch of opens, the counters, the handle table, the ``no_open`` handles and the
    marked pages come out the same.  ``lean``: no step is logged or validated, so the runs take the
    policy's one-call path (``ReadPolicy.readers``) and are compared with the one-by-one steps by
    their effects (no plan here, so that no cursor turn or stage interleaves; the planned opens'
    Place decisions are compared in test_policy)."""
    rels = sorted(source[1])[:5]
    ends: list[object] = []
    base = 1 << 62
    overrides = {"debug.validate": "false", "debug.policy_log": "0"} if lean else None

    def books(m: Mount) -> object:
        c = m.rp.counters
        policy = m.rp.policy
        steps = [st.describe() for st in policy.log()]
        pc, mem = c.sources["page_cache"], c.sources["memory"]
        seen = {e: (s.count, s.handle.pushed, s.handle.data is not None) for e, s in m.ops.open_files.seen.items()}
        pages = {e: (p.nbytes, p.state, p.taken) for e, p in policy.pages.items()}
        books = (
            policy.steps,
            list(policy.kept.items()),
            (policy.kept_bytes, policy.cached_bytes, policy.reused, policy.unplanned_opens, policy.unused),
            pages,
            sorted(policy._kept_unused),
            (policy._opens_since_tick, policy._fill_credit, dict(policy._unplaced), sorted(policy._opened_since_view)),
            list(m.rp.prefetcher._opens),
        )
        return (
            steps,
            c.opens,
            pc.files,
            pc.bytes,
            mem.files,
            sorted(m.ops.handles),
            sorted(m.kernel.marked),
            seen,
            books,
        )

    for batched in (False, True):
        m = assemble(source[0], source[1], tmp_path / str(batched), overrides=overrides)
        m.kernel.readers.add(4242)  # a read-back thread of the daemon's own

        async def body(m: Mount = m, batched: bool = batched) -> None:
            inodes = [await m.lookup(rel) for rel in rels]
            for inode in inodes:
                await m.read_inode(inode)  # pages kept after a read: its next opens may be native
            await drained(m)
            a, b, c, d, e = inodes
            unread = await m.lookup(sorted(source[1])[5])  # nothing kept: its open is answered None
            outside = inode_of(len(m.rp.snapshot.tree)) + 5
            runs = [
                [(1, a, base + 1, CTX.pid), (1, b, base + 2, CTX.pid), (0, a, base + 1, 0), (1, c, base + 3, 4242)],
                [(1, outside, base + 4, CTX.pid), (0, b, base + 2, 0), (0, c, base + 3, 0), (1, d, base + 5, CTX.pid)],
                # visits (VISIT_OPEN: an open and its release folded by the front): kept pages, a file
                # open elsewhere (d), a read back, an inode outside the tree
                [
                    (3, a, base + 8, CTX.pid),
                    (3, d, base + 9, CTX.pid),
                    (3, b, base + 10, 4242),
                    (3, outside, base + 11, 1),
                ],
                # an open the front saw come from a thread of the daemon's own (opened 2, OWN_OPEN):
                # a read back whose thread left ThroughMount.readers before trio booked it
                [(0, outside, base + 4, 0), (1, a, base + 6, CTX.pid), (0, a, base + 6, 0), (2, e, base + 7, 777)],
                [(0, e, base + 7, 0)],
                # no_open: fh 0, paired by inode; e open twice at once, across runs; c closed unseen
                [(1, e, 0, CTX.pid), (1, a, 0, CTX.pid), (1, e, 0, CTX.pid), (0, a, 0, 0), (0, c, 0, 0)],
                [(0, e, 0, 0), (1, outside, 0, CTX.pid), (1, b, 0, CTX.pid), (0, b, 0, 0), (1, b, 0, CTX.pid)],
                # no_open visits: of e and b, each also open across runs (their handles answer), of a
                # (none open), of c twice, of an inode outside the tree, of a file never read
                [
                    (3, e, 0, CTX.pid),
                    (3, b, 0, CTX.pid),
                    (3, a, 0, CTX.pid),
                    (3, c, 0, 1),
                    (3, c, 0, 1),
                    (3, outside, 0, 1),
                    (3, unread, 0, 1),
                ],
                [(0, e, 0, 0), (0, b, 0, 0), (0, outside, 0, 0), (1, d, 0, CTX.pid)],
            ]
            for run in runs:
                if batched:
                    m.ops.book_native([x for ev in run for x in ev])
                    continue
                for opened, inode, fh, pid in run:
                    entry = inode - ROOT_INODE
                    if opened == VISIT_OPEN:  # its open, then its release
                        if fh == 0:
                            if 0 <= entry < len(m.rp.snapshot.tree):
                                m.ops.open_files.seen_natively(True, entry)
                                m.ops.open_files.seen_natively(False, entry)
                        else:
                            m.ops.opened_natively(inode, fh, pid)
                            m.ops.released_natively(fh)
                        continue
                    if fh == 0:
                        if 0 <= entry < len(m.rp.snapshot.tree):
                            m.ops.open_files.seen_natively(bool(opened), entry)
                    elif opened:
                        m.ops.opened_natively(inode, fh, 4242 if opened == OWN_OPEN else pid)
                    else:
                        m.ops.released_natively(fh)
            ends.append(books(m))

        serve(m, body)
    one_by_one, in_runs = ends
    assert one_by_one == in_runs
    steps, opens = one_by_one[0], one_by_one[1]  # type: ignore[index]
    # 5 reads, then a, b, d, a again (not the read backs), visits of a and d; then 6 seen (e twice,
    # a, b twice, d) and 6 visits (e, b, a, c twice, the unread file)
    assert opens == 5 + 4 + 2 + 6 + 6
    assert lean == (len(steps) == 0)
