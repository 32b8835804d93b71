"""Background rechecks of cached copies in a group: which files a round covers, the bounds status
promises, and a node that holds only replicas still rechecking them.

The last test runs the real read path in one process (inprocess.assemble: real tiers, the real
revalidator over a real source directory): before rounds with nothing of the node's own were
counted, such a node never reached its next replica round and served a changed file's old bytes
for the rest of the mount.  The last ones stage a tier copy whose source changed before the mount:
staging must check it like an open does.
"""

from __future__ import annotations

import errno
import os
import time
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest
import trio
from inprocess import assemble, make_source, serve, until

from fusefs.errors import FsError
from fusefs.readpath.contract import Stage, StageNext
from fusefs.readpath.hooks import ReadPathHooks
from fusefs.readpath.openfiles import OpenFile
from placement import recheck


def _none_mine(entries: npt.NDArray[np.int64]) -> npt.NDArray[np.bool_]:
    """Another node owns every file: this one holds only replicas."""
    return np.zeros(entries.shape, np.bool_)


def test_rounds_cover_replicas_every_nth_and_may_be_empty() -> None:
    cached = np.array([3, 5, 8, 13], np.int64)
    mine = np.array([True, False, True, False])
    assert recheck.round_entries(cached, mine, 0, 3).tolist() == [3, 5, 8, 13]
    assert recheck.round_entries(cached, mine, 1, 3).tolist() == [3, 8]
    assert recheck.round_entries(cached, mine, 3, 3).tolist() == [3, 5, 8, 13]
    nothing = np.zeros(4, np.bool_)
    assert recheck.round_entries(cached, nothing, 2, 3).size == 0  # an empty round: counted all the same
    assert recheck.round_entries(cached, nothing, 2, 1).tolist() == [3, 5, 8, 13]  # alone: every round


class _Owners:
    """A plan's owners per global id, as :class:`placement.recheck.Owners` asks for them."""

    def __init__(self, owner: list[int]) -> None:
        self.owner = np.array(owner, np.int32)

    def owner_of(self, gids: npt.NDArray[np.int64]) -> npt.NDArray[np.int32]:
        owners: npt.NDArray[np.int32] = self.owner[gids]
        return owners


def test_a_node_rechecks_what_it_owns_what_nobody_owns_and_what_no_member_answers_for() -> None:
    # entries 0..4 are global ids -1, 0, 1, 2, 3; entry 7 lies past the plan's map
    entry_gid = np.array([-1, 0, 1, 2, 3], np.int32)
    plan = _Owners([0, 1, 2, -1])  # gid 3 is held by nobody
    entries = np.array([0, 1, 2, 3, 4, 7], np.int64)
    members = {0: "m0", 1: "m1"}  # nobody answers for node 2
    mine = recheck.rechecked_here(entries, entry_gid, plan, 1, members.get)
    # not in the plan, owned by node 0 (a member: it checks), mine, node 2's (no member), nobody's, past the map
    assert mine.tolist() == [True, False, True, True, True, True]
    members[2] = "m2"  # node 2's member joins: its file is its own again
    mine = recheck.rechecked_here(entries, entry_gid, plan, 1, members.get)
    assert mine.tolist() == [True, False, True, False, True, True]
    # without a plan, a node of its own or a group, a node checks everything it caches
    for args in ((None, 1, members.get), (plan, None, members.get), (plan, 1, None)):
        assert recheck.rechecked_here(entries, entry_gid, *args).all()
    assert recheck.rechecked_here(entries[:0], entry_gid, plan, 1, members.get).shape == (0,)


def test_a_replicas_bound_is_n_minus_one_owner_rounds_and_one_full_round() -> None:
    # 1.28M cached files on each of 4 nodes, each owning a quarter, at 1000 stats/s:
    owned, held = 320_000, 1_280_000
    assert recheck.round_seconds(owned, 1000, 1.0) == 320.0
    assert recheck.replica_bound_seconds(owned, held, 1000, 4, 1.0) == 3 * 320.0 + 1280.0
    assert recheck.replica_bound_seconds(held, held, 1000, 1, 1.0) == recheck.round_seconds(held, 1000, 1.0)
    assert recheck.replica_bound_seconds(0, 10, 1000, 3, 1.0) == 3.0  # only replicas: minimum rounds


def test_a_node_holding_only_replicas_sees_their_source_change_within_the_replica_bound(tmp_path: Path) -> None:
    root = tmp_path / "src"
    files = make_source(root)
    every = 3
    hooks = ReadPathHooks(mine=_none_mine, replicas_every=lambda: every)  # another node owns every file
    m = assemble(root, files, tmp_path, overrides={"snapshot.revalidate_round_min_s": "1"}, hooks=hooks)
    rel = "c1/f3.jpg"
    entry = m.entry(rel)
    rv = m.rp.revalidator
    bound = recheck.replica_bound_seconds(0, 1, rv.rate, every, rv.min_round)
    seen: dict[str, float] = {}

    async def body() -> None:
        assert await m.rp.tiers[0].put(entry, files[rel], m.rp.reader.ids.of(entry))
        assert (await m.read(rel))[0] == files[rel]  # served from the replica, its source checked once
        await until(lambda: rv.rounds >= 1)  # the first round (a replica round) checked it too
        assert rv.status()["replica_bound_seconds"] == bound
        (root / rel).write_bytes(os.urandom(len(files[rel]) + 10))  # the source changes
        changed_at = time.monotonic()
        with trio.move_on_after(bound + 2.0):  # the bound, and slack for a loaded machine
            await until(lambda: rv.is_changed(entry))
        seen["after"] = time.monotonic() - changed_at
        seen["rounds"] = rv.rounds
        assert rv.is_changed(entry), (
            f"a replica's changed source went unseen for {seen['after']:.1f}s (bound {bound}s): rounds stuck "
            f"at {rv.rounds}, stats {rv.stats}"
        )
        with pytest.raises(FsError) as failed:
            await m.read(rel)
        assert failed.value.errno == errno.EIO  # and never the old bytes again

    serve(m, body, timeout=30)
    print(f"replica of a changed file seen after {seen['after']:.2f}s (bound {bound}s, {seen['rounds']} rounds)")


def test_a_small_cache_is_rechecked_once_per_minimum_round_not_at_the_full_rate(tmp_path: Path) -> None:
    """snapshot.revalidate_round_min_s: two cached files at 1000 stats/s were stat'ed every second
    for the whole mount (the old one-second floor); a round now takes at least the configured floor,
    its stats spread over it (never a burst at the full rate), and status shows it as the staleness
    bound."""
    root = tmp_path / "src"
    files = make_source(root)
    m = assemble(root, files, tmp_path, overrides={"snapshot.revalidate_round_min_s": "4"})
    rv = m.rp.revalidator
    rels = ["c1/f3.jpg", "c1/f4.jpg"]

    async def body() -> None:
        for rel in rels:
            assert await m.rp.tiers[0].put(m.entry(rel), files[rel], m.rp.reader.ids.of(m.entry(rel)))
        await until(lambda: rv.rounds >= 1)
        assert (rv.last_round_seconds or 0.0) >= 3.0, rv.last_round_seconds  # spread over the floor, not a burst
        first = dict(rv.stats)
        await trio.sleep(3.0)  # three more rounds at the old floor; now part of one, at 2 stats per 4 s
        assert rv.rounds == 1 and first["background"] <= 2 * len(rels), rv.stats  # the next round may have begun
        assert rv.stats["background"] - first["background"] <= len(rels), rv.stats
        assert rv.status()["round_seconds"] == 4.0
        await until(lambda: rv.rounds >= 2)  # and the next round does come

    serve(m, body, timeout=20)


def test_the_ahead_checks_skip_fresh_files_and_let_requests_in_during_a_long_walk(tmp_path: Path) -> None:
    """A horizon is told several times an epoch; it used to be walked entry by entry on the trio
    thread, fresh ones included, without a checkpoint: every FUSE request waited for the walk."""
    root = tmp_path / "src"
    files = make_source(root)
    m = assemble(root, files, tmp_path, overrides={"snapshot.revalidate_round_min_s": "60"})
    rv = m.rp.revalidator
    fresh, unchecked = m.entry("c1/f3.jpg"), m.entry("c1/f4.jpg")
    rv.fresh(fresh)
    seen: list[int] = []

    async def body() -> None:
        rv.upcoming([fresh] * 50_000)
        assert rv._ahead == []  # nothing to walk
        rv.upcoming([fresh, unchecked] * 50_000)  # unchecked and not cached: looked at, never stat'ed
        assert len(rv._ahead) == 50_000
        while rv._ahead_pos == 0:  # the ahead loop starts its walk ...
            await trio.sleep(0)
        seen.append(rv._ahead_pos)  # ... and this task ran again before the walk ended
        await until(lambda: rv._ahead_pos == len(rv._ahead))

    serve(m, body)
    assert 0 < seen[0] < 50_000, seen
    assert rv.stats["ahead"] == 0


@pytest.mark.parametrize("lane", [False, True], ids=["window", "next-epoch lane"])
def test_a_tier_copy_is_checked_before_it_is_staged(tmp_path: Path, lane: bool) -> None:
    """A staged file is served without reaching the daemon again (pushed pages, or bytes held for the
    open) and its pages can be passed on to a peer, so staging a tier copy must go through the same
    check as an open.  Here a directory-tier copy made before this mount is staged after its source
    changed: it used to be read straight from the tier, unchecked, and served."""
    root = tmp_path / "src"
    files = make_source(root)
    m = assemble(root, files, tmp_path, ssd=True, overrides={"snapshot.revalidate_round_min_s": "600"})
    rel = "c1/f3.jpg"
    entry = m.entry(rel)
    rv = m.rp.revalidator
    path = root / rel
    path.write_bytes(os.urandom(len(files[rel])))  # changed since the snapshot, same size
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    ssd = m.rp.tiers[1]

    async def body() -> None:
        # The copy an earlier mount left, under the identity the snapshot recorded then.
        assert await ssd.put(entry, files[rel], m.rp.reader.ids.of(entry))
        if lane:
            await m.rp.prefetcher._stage_next_one(StageNext(entry, 1, None))
        else:
            await m.rp.prefetcher._stage_one(Stage(entry, 1, None))

    serve(m, body)
    assert rv.stats["background"] == 0, rv.stats  # no round got there first: the staging path checked
    assert rv.is_changed(entry) and not ssd.contains(entry)


def test_a_copy_whose_open_reads_kept_pages_is_not_stated_ahead_but_checked_before_it_is_read(
    tmp_path: Path,
) -> None:
    """Two nodes' tier copies of files a peer sent were stat'ed ahead one by one (a worker-thread hop
    and a PFS metadata request each) though the opens read the pages pushed with them.  A copy whose
    pages are kept is now left alone ahead; the copy next to it without pages is stat'ed ahead as
    before; and the skipped copy is still checked before anything reads it (here: its source changed,
    so the read that falls back to it after the kernel dropped the pages fails with EIO)."""
    root = tmp_path / "src"
    files = make_source(root)
    # No background round gets there first: both copies are replicas, and this is not their round.
    hooks = ReadPathHooks(mine=_none_mine, replicas_every=lambda: 2)
    m = assemble(root, files, tmp_path, overrides={"snapshot.revalidate_round_min_s": "600"}, hooks=hooks)
    rv, policy = m.rp.revalidator, m.rp.policy
    rv.rounds = 1
    paged, bare = "c1/f3.jpg", "c1/f4.jpg"
    memory = m.rp.tiers[0]

    async def body() -> None:
        for rel in (paged, bare):  # copies as a peer's bytes land: the snapshot's identity, not stat'ed here
            assert await memory.put(m.entry(rel), files[rel], m.rp.reader.ids.of(m.entry(rel)))
        # The pages a push of the same bytes left in the kernel, as the policy records them (kept).
        policy.kept[m.entry(paged)] = len(files[paged])
        rv.upcoming([m.entry(paged), m.entry(bare)])
        await until(lambda: rv.stats["ahead"] >= 1 and rv._ahead_pos == 2)
        await trio.sleep(0.05)  # room for a wrong second stat to land
        assert rv.stats == {"ahead": 1, "open": 0, "background": 0}, rv.stats  # the bare copy only
        assert int(rv.state[m.entry(paged)]) == 0  # unchecked: nothing read the copy yet
        del policy.kept[m.entry(paged)]  # the kernel dropped the pages: the copy is what a read gets
        (root / paged).write_bytes(os.urandom(len(files[paged]) + 3))
        with pytest.raises(FsError) as failed:
            await m.read(paged)
        assert failed.value.errno == errno.EIO

    serve(m, body)
    assert rv.stats["open"] == 1 and rv.is_changed(m.entry(paged)), rv.stats


def test_a_read_whose_pages_were_dropped_never_takes_a_peers_copy_of_a_file_seen_changed(tmp_path: Path) -> None:
    """An open served from pushed pages reads through the daemon again once the kernel dropped them.
    Its source was seen changed (here by that read's own check of the tier copy): the read fails
    with EIO, and never takes the old bytes a peer still serves."""
    root = tmp_path / "src"
    files = make_source(root)
    m = assemble(root, files, tmp_path, overrides={"snapshot.revalidate_round_min_s": "600"})
    rel = "c1/f3.jpg"
    entry = m.entry(rel)
    old = files[rel]
    m.peer.files[entry] = old  # the owner's copy, made before the change
    (root / rel).write_bytes(os.urandom(len(old) + 5))
    got: list[object] = []

    async def body() -> None:
        assert await m.rp.tiers[0].put(entry, old, m.rp.reader.ids.of(entry))
        handle = OpenFile(entry, len(old), pushed=True)  # opened on pages the kernel has since dropped
        try:
            got.append(bytes(await m.rp.open_files.read(handle, 0, len(old))))
        except FsError as exc:
            got.append(exc.errno)

    serve(m, body)
    assert got == [errno.EIO] and m.rp.revalidator.is_changed(entry)
