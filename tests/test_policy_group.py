"""The read policy in a daemon group, by events (no I/O): the group rule's owners while no plan is
trusted, and the lane that stages the next epoch's files from peers before that epoch starts.

The plans are real (the planner over the small tree of ``tests/test_policy.py``); the owner rule
and the next epoch's reads are the pure functions the daemon uses (:mod:`placement.owners`,
:mod:`placement.nextepoch`), checked here against the plan's own streams.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest
from test_policy import Held, Setup, build, make_tree, staged, tracking

from fusefs.readpath.contract import (
    CursorView,
    DropCopy,
    FetchForPeer,
    Fill,
    FillDone,
    GroupChanged,
    Instruction,
    KeepIn,
    Missed,
    NextEpoch,
    NextFetched,
    NextPushed,
    Opened,
    PeerAsked,
    PushNext,
    ReadFromPfs,
    StageNext,
    UsePages,
    ViewPublished,
)
from fusefs.readpath.policy import PlanHolder, RuleHolder
from placement.nextepoch import SPREAD, first_read, next_epoch_reads, reads_first
from placement.owners import member_seed, owner, owners
from placement.plan import Plan

SEEDS = (member_seed("node-a@127.0.0.1:4000"), member_seed("node-b@127.0.0.2:4000"))


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory: pytest.TempPathFactory) -> tuple[Plan, npt.NDArray[np.int64]]:
    return build(make_tree(tmp_path_factory.mktemp("group") / "src"), 2)


# ---------------------------------------------------------------------------- the owner rule


def test_every_entry_has_one_owner_that_every_member_computes_alike() -> None:
    entries = np.arange(20_000)
    seeds = [member_seed(f"host{k}-{k * 7}@10.0.0.{k}:700{k}") for k in range(4)]
    got = owners(entries, seeds)
    shuffled = owners(entries, seeds[::-1])  # another node may list the members in another order
    assert (np.asarray(seeds)[got] == np.asarray(seeds[::-1])[shuffled]).all()
    counts = np.bincount(got, minlength=4)
    assert counts.min() > 0.9 * 5_000 and counts.max() < 1.1 * 5_000, counts  # an even spread
    assert owner(123, seeds) == got[123]
    assert (owners(entries, seeds[:1]) == 0).all() and (owners(entries, []) == -1).all()


def test_a_member_joining_or_leaving_moves_only_its_share() -> None:
    entries = np.arange(20_000)
    seeds = [member_seed(f"m{k}") for k in range(4)]
    before = np.asarray(seeds)[owners(entries, seeds)]
    joined = [*seeds, member_seed("m4")]
    after = np.asarray(joined)[owners(entries, joined)]
    moved = before != after
    assert (after[moved] == joined[4]).all()  # files move only to the newcomer ...
    assert 0.15 < moved.mean() < 0.25, moved.mean()  # ... about a fifth of them
    left = [s for s in seeds if s != seeds[1]]
    without = np.asarray(left)[owners(entries, left)]
    assert (without[before != seeds[1]] == before[before != seeds[1]]).all()  # only its own files move


def mode_of(s: Setup) -> str:
    """The policy's mode now (a call, so a type checker does not carry one assertion's narrowing past an event)."""
    return s.policy.mode


def group_of(two_nodes: tuple[Plan, npt.NDArray[np.int64]], me: int, reactive: int) -> Setup:
    s = Setup(*two_nodes, reactive=reactive)
    s.do(GroupChanged(SEEDS, me))
    return s


def test_members_split_the_files_and_each_keeps_its_own_first(
    two_nodes: tuple[Plan, npt.NDArray[np.int64]],
) -> None:
    """No plan: each file is owned by one of the two members, each member asks the other for the other's
    files, and a member's reactive tiers keep every file it owns before any copy of another's."""
    files = Setup(*two_nodes).files
    owned = {me: [e for e in files if group_of(two_nodes, me, 0).policy.owns(e)] for me in (0, 1)}
    assert sorted(owned[0] + owned[1]) == sorted(files) and owned[0] and owned[1]
    mine_bytes = sum(int(two_nodes[1][e]) for e in owned[0])
    s = group_of(two_nodes, 0, reactive=mine_bytes + 3_000)
    assert all(s.policy.reactive_owner(e) is None for e in owned[0])
    assert all(s.policy.reactive_owner(e) == 1 for e in owned[1])
    kept: list[int] = []
    for e in owned[1] + owned[0]:  # the other's files first: they must not crowd out this node's own
        out = s.do(Missed(e, s.size(e)))
        kept += [i.entry for i in out if isinstance(i, KeepIn)]
        assert not any(isinstance(i, DropCopy) for i in out)
    assert set(owned[0]) <= set(kept)
    assert sum(s.size(e) for e in kept if e in owned[1]) <= 3_000


def test_alone_the_reactive_policy_is_unchanged(two_nodes: tuple[Plan, npt.NDArray[np.int64]]) -> None:
    s = Setup(*two_nodes, reactive=3_000)
    s.do(GroupChanged(SEEDS[:1], 0))
    assert all(s.policy.owns(e) and s.policy.reactive_owner(e) is None for e in s.files)
    a, b, c = s.by_size()[:3]
    assert s.do(Missed(a, s.size(a))) == [KeepIn(a, 0)]
    assert s.do(Missed(b, s.size(b))) == [KeepIn(b, 0)]
    assert s.do(Missed(c, s.size(c))) == []  # as in test_policy: full, and c leads nobody by two reads


def test_a_copy_read_from_the_pfs_never_makes_way_for_a_peers_copy(
    two_nodes: tuple[Plan, npt.NDArray[np.int64]],
) -> None:
    """In a group, the reactive set of files this node does not own lets a resident make way for a
    clearly more frequent file, except one this node read from the PFS: that copy (read under an
    earlier regime, say a wrong seed's presumed plan) may be the group's only one until its owner
    asks for it, and dropping it cost a second PFS read of that file."""

    def run(read_here: bool) -> list[Instruction]:
        probe = group_of(two_nodes, 0, 0)
        resident, newcomer = [e for e in probe.files if not probe.policy.owns(e)][:2]
        owned = int(two_nodes[1][[probe.policy.owns(e) for e in range(len(two_nodes[1]))]].sum())
        room = max(probe.size(resident), probe.size(newcomer))  # the other members' files get room for one
        s = group_of(two_nodes, 0, reactive=owned + room)
        if read_here:
            s.do(ReadFromPfs(resident))
        assert s.do(Missed(resident, s.size(resident))) == [KeepIn(resident, 0)]
        out: list[Instruction] = []
        for _ in range(3):  # three reads lead the resident's one by two: it would make way
            out += s.do(Missed(newcomer, s.size(newcomer)))
        return out

    control = run(read_here=False)
    assert any(isinstance(i, DropCopy) for i in control), control  # a peer's copy makes way, as before
    assert not any(isinstance(i, (DropCopy, KeepIn)) for i in run(read_here=True))  # kept; the newcomer is not


def test_a_peer_is_served_a_pfs_read_only_by_the_files_one_owner(
    two_nodes: tuple[Plan, npt.NDArray[np.int64]],
) -> None:
    s = group_of(two_nodes, 0, reactive=100_000)
    mine = next(e for e in s.files if s.policy.owns(e))
    theirs = next(e for e in s.files if not s.policy.owns(e))
    assert s.do(PeerAsked(mine, s.size(mine), by_plan=False)) == [FetchForPeer(mine, 0)]  # read and kept
    assert s.do(PeerAsked(theirs, s.size(theirs), by_plan=False)) == []  # not this node's to read
    assert s.do(PeerAsked(mine, s.size(mine), by_plan=True)) == []  # asked as the plan's owner: no plan
    s.follow()
    view = CursorView("tracking", 0, 0, {}, ())
    s.do(ViewPublished(view, [], s.policy.generation))
    planned = next(e for e in s.files if s.policy.planned_tier(e) is not None)
    assert s.do(PeerAsked(planned, s.size(planned), by_plan=True)) == [FetchForPeer(planned, 0)]


def plan_owner(s: Setup, entry: int) -> PlanHolder:
    """The current plan's owner of ``entry``, as a holder."""
    assert s.policy.plan is not None
    return PlanHolder(s.policy.plan.digest, int(s.policy.plan.owner()[int(s.policy.entry_gid[entry])]))


def test_a_plan_trusted_after_the_rule_names_the_rules_owner_as_a_holder(
    two_nodes: tuple[Plan, npt.NDArray[np.int64]],
) -> None:
    """A group that always had its plan reads by the plan alone: nobody to ask before the PFS but the
    plan's owner (whom the owner request asks already, or this node).  One that ran by the rule first
    (a wrong seed, then the right one found) names a file's rule owner as a holder to ask before
    reading it from the PFS as its new plan owner: the rule owner may hold the copy read then, and a
    second PFS read is waste."""
    planned = group_of(two_nodes, 0, reactive=100_000)
    planned.follow()
    planned.do(ViewPublished(CursorView("tracking", 0, 0, {}, ()), [], planned.policy.generation))
    assert all(planned.policy.holders(e) == [plan_owner(planned, e)] for e in planned.files)

    s = group_of(two_nodes, 0, reactive=100_000)
    theirs = next(e for e in s.files if not s.policy.owns(e))
    mine = next(e for e in s.files if s.policy.owns(e))
    assert s.policy.holders(theirs) == []  # nothing read yet
    s.do(Opened(theirs))  # no plan: the rule picks the reader
    s.follow()
    s.do(ViewPublished(CursorView("tracking", 0, 0, {}, ()), [], s.policy.generation))
    assert s.policy.mode == "predicting"
    assert s.policy.holders(theirs) == [plan_owner(s, theirs), RuleHolder(1)]
    assert s.policy.holders(mine) == [plan_owner(s, mine), RuleHolder(0)]


def test_after_a_wrong_plan_its_owners_are_holders_under_the_rule_and_the_next_plan(
    two_nodes: tuple[Plan, npt.NDArray[np.int64]],
) -> None:
    """A plan followed until the opens refuted it had its owners fill (and stage) files from the PFS,
    and the mismatch keeps those copies: by the rule, and under the plan followed next, the refuted
    plan's owner of each file is named as a holder before the PFS.  A group that never followed a plan
    names none."""
    never = group_of(two_nodes, 0, reactive=100_000)
    never.do(Opened(next(iter(never.files))))
    rule = never.policy.group_owner
    assert rule is not None and all(never.policy.holders(e) == [RuleHolder(int(rule[e]))] for e in never.files)
    s = group_of(two_nodes, 0, reactive=100_000)
    plan = s.plan
    s.follow()
    gen = s.policy.generation
    fills = [i for i in s.do(ViewPublished(CursorView("tracking", 0, 0, {}, ()), [], gen)) if isinstance(i, Fill)]
    assert fills and all(s.policy.holders(e) == [plan_owner(s, e)] for e in s.files)  # one regime so far
    s.do(ViewPublished(CursorView("mismatch", 0, 0, {}, ()), [], gen))
    assert mode_of(s) == "reactive"
    owner = plan.owner()
    for e in s.files:
        gid = int(s.policy.entry_gid[e])
        assert s.policy.holders(e)[0] == PlanHolder(plan.digest, int(owner[gid])), e
    s.follow()  # the next plan (the same inputs here): the refuted one's owners stay holders
    s.do(ViewPublished(CursorView("tracking", 1, 0, {}, ()), [], s.policy.generation))
    assert mode_of(s) == "predicting"
    for e in s.files:
        gid = int(s.policy.entry_gid[e])
        assert PlanHolder(plan.digest, int(owner[gid])) in s.policy.holders(e), e


def test_a_wrong_plans_fill_reads_the_pfs_only_for_what_this_node_owns_by_the_rule(
    two_nodes: tuple[Plan, npt.NDArray[np.int64]],
) -> None:
    """A trusted plan whose opens do not follow (a wrong seed) keeps filling its tiers, but once the
    readers are found not to follow it, only files this node owns under the group rule come from the
    PFS: the others are asked of their owner, who every node asks too."""
    s = group_of(two_nodes, 0, reactive=100_000)
    s.follow()
    gen = s.policy.generation
    first = [i for i in s.do(ViewPublished(CursorView("tracking", 0, 0, {}, ()), [], gen)) if isinstance(i, Fill)]
    assert first
    out = s.do(ViewPublished(CursorView("mismatch", None, 0, {}, ()), [], gen))
    assert s.policy.mode == "reactive"
    pending = first + [i for i in out if isinstance(i, Fill)]
    later: list[Fill] = []
    while pending:
        f = pending.pop(0)
        out = s.do(FillDone(f.entry, f.tier, "stored", gen))
        new = [i for i in out if isinstance(i, Fill)]
        later += new
        pending += new
    assert later
    assert all(f.from_pfs == s.policy.owns(f.entry) for f in later)
    assert any(f.from_pfs for f in later) and any(not f.from_pfs for f in later)


# ---------------------------------------------------------------------------- the next epoch's lane


def test_next_epoch_reads_are_what_the_node_reads_then_and_not_now(
    two_nodes: tuple[Plan, npt.NDArray[np.int64]],
) -> None:
    """From the first epoch the lane carries the next two epochs' files the node has not read yet
    (the readers wait on the PFS then, so transfers cost nobody's time), from later ones the next
    epoch's only (each transfer then takes CPU the readers' opens wait on)."""
    plan = two_nodes[0]
    js = plan.job_streams()
    now = js.epoch_map(0)
    mine = set(js.shape.ranks_of_node(0))
    read = {g for g in range(plan.files) if int(now.rank_of[g]) in mine}  # by this node in epoch 0
    expected: list[int] = []
    for e in (1, 2):
        for g in js.node_stream(e, 0).tolist():
            if g not in read:
                expected.append(g)
            read.add(g)
    next_only = [g for g in dict.fromkeys(js.node_stream(1, 0).tolist()) if int(now.rank_of[g]) not in mine]
    assert len(expected) > len(next_only)  # epoch 2's files follow epoch 1's
    entries, ready = next_epoch_reads(plan, 0, 0)
    assert entries.tolist() == plan.entry_of(np.asarray(expected, dtype=np.int64)).tolist()
    assert ready.tolist() == [int(now.pos_of[g]) for g in expected]  # where the other node reads it now
    assert all(int(now.rank_of[g]) >= 0 and int(now.rank_of[g]) not in mine for g in expected)
    later_entries, later = next_epoch_reads(plan, 0, 1)
    in_epoch_1 = set(js.node_stream(1, 0).tolist())
    only_next = [g for g in dict.fromkeys(js.node_stream(2, 0).tolist()) if g not in in_epoch_1]
    assert later_entries.tolist() == plan.entry_of(np.asarray(only_next, dtype=np.int64)).tolist()
    # From the second epoch on the holders have every file already: released over the first
    # SPREAD of the epoch in the order of use, the first at once.
    span = int(SPREAD * min(js.epoch_map(1).length(r) for r in mine))
    assert later[0] == -1 and (np.diff(later) >= 0).all() and later[-1] < span - 1
    assert later[len(later) // 2] == len(later) // 2 * span // len(later) - 1


def test_the_lane_holds_off_while_the_loaders_start(two_nodes: tuple[Plan, npt.NDArray[np.int64]]) -> None:
    """A later epoch's held files are released only once the ranks are ``hold_off`` positions in
    (past their DataLoaders' first batches), in the same order and within the same share of the
    epoch; a hold-off longer than half that share is cut to half, so the lane keeps room."""
    plan = two_nodes[0]
    js = plan.job_streams()
    mine = js.shape.ranks_of_node(0)
    span = int(SPREAD * min(js.epoch_map(1).length(r) for r in mine))
    entries, at_once = next_epoch_reads(plan, 0, 1)
    held_entries, held = next_epoch_reads(plan, 0, 1, hold_off=span // 4)
    assert held_entries.tolist() == entries.tolist()
    assert held[0] == span // 4 - 1 and (np.diff(held) >= 0).all() and held[-1] < span - 1
    assert (held >= at_once).all() and (held > at_once).any()
    _entries, capped = next_epoch_reads(plan, 0, 1, hold_off=10 * span)
    assert capped[0] == span // 2 - 1 and capped[-1] < span - 1
    # The first epoch's files are released where their holders read them: no hold-off there.
    _entries, first = next_epoch_reads(plan, 0, 0)
    assert next_epoch_reads(plan, 0, 0, hold_off=span // 4)[1].tolist() == first.tolist()


def lane(s: Setup, first_read: bool = False) -> tuple[list[int], list[int]]:
    entries, ready = next_epoch_reads(s.plan, 0, 0)
    s.do(NextEpoch(s.policy.generation, 0, 1, entries, ready, first_read))
    return entries.tolist(), ready.tolist()


def next_stages(out: list[Instruction]) -> list[StageNext]:
    return [i for i in out if isinstance(i, StageNext)]


def test_the_next_epochs_files_are_staged_as_their_holders_get_them_in_the_order_of_use(
    two_nodes: tuple[Plan, npt.NDArray[np.int64]],
) -> None:
    s = Setup(*two_nodes, budget=40_000)
    s.follow()
    tracking(s, 0)
    entries, ready = lane(s)
    assert len(entries) >= 4
    assert next_stages(tracking(s, 0)) == []  # nothing is on the other node yet
    cut = sorted(ready)[3] + 1  # the first four are on the other node by then
    released = [e for e, r in zip(entries, ready, strict=True) if r < cut]
    out = tracking(s, cut)
    assert [i.entry for i in next_stages(out)] == released  # in the order of use, four slots
    assert all(i.from_tier is None for i in next_stages(out))  # from the peer: no local copy
    a = released[0]
    data = b"a" * s.size(a)
    assert s.do(NextFetched(a, data)) == [PushNext(a, data)]
    s.do(NextPushed(a, ok=True))
    assert s.policy.kept[a] == s.size(a) and s.policy.next_pushed == 1  # a kept page now
    assert UsePages(a) in s.do(Opened(a))  # next epoch's open finds it in the page cache
    b = released[1]
    s.do(NextFetched(b, None))  # no peer held it: the window will stage it in order
    assert b not in s.policy.next_pages and s.policy.next_later == 1
    assert s.budget.used == s.policy.held_bytes()


@pytest.mark.parametrize("first_read", [False, True])
def test_a_file_in_a_memory_tier_is_left_to_its_open_unless_the_readers_wait_on_the_pfs(
    two_nodes: tuple[Plan, npt.NDArray[np.int64]], first_read: bool
) -> None:
    """An open serves a memory tier's copy from RAM: the lane does not push it ahead (as the window does
    not stage it), and takes the next file instead.  From an epoch that reads its dataset for the
    first time (the readers wait on the PFS) it pushes that copy too, from the tier, in its turn."""
    entries, ready = next_epoch_reads(two_nodes[0], 0, 0)
    local = entries[0]
    tier = Held("memory", {local: int(two_nodes[1][local])})
    s = Setup(*two_nodes, budget=40_000, tiers=[tier])
    s.follow()
    tracking(s, 0)
    lane(s, first_read)
    stages = next_stages(tracking(s, max(ready) + 1))
    if first_read:
        assert stages[0].entry == local and stages[0].from_tier == 0
    else:
        assert stages and local not in [i.entry for i in stages]


def test_a_file_in_a_local_disk_tier_is_staged_from_it_and_the_lane_never_takes_the_windows_room(
    two_nodes: tuple[Plan, npt.NDArray[np.int64]],
) -> None:
    entries, ready = next_epoch_reads(two_nodes[0], 0, 0)
    local = entries[0]  # the first the node reads next epoch
    tier = Held("directory", {local: int(two_nodes[1][local])})
    window = 6_000
    s = Setup(*two_nodes, budget=window + int(two_nodes[1][local]), window=window, tiers=[tier])
    s.follow()
    tracking(s, 0)
    lane(s)
    out = tracking(s, max(ready) + 1)
    stages = next_stages(out)
    assert [i.entry for i in stages] == [local] and stages[0].from_tier == 0  # room for one file past the window
    assert s.budget.limit - s.budget.used >= window  # the window's whole allowance is still free
    order = [e for e in s.files if e != local][:3]
    assert staged(tracking(s, max(ready) + 1, order=order)) == order[:2]  # the window stages as it would alone


def test_the_lane_ends_when_its_epoch_begins_or_the_plan_is_not_followed(
    two_nodes: tuple[Plan, npt.NDArray[np.int64]],
) -> None:
    s = Setup(*two_nodes, budget=40_000)
    s.follow()
    tracking(s, 0)
    lane(s)
    assert s.policy._lane is not None
    assert next_stages(tracking(s, 0, epoch=1)) == [] and s.policy._lane is None
    lane(s)  # a NextEpoch for epoch 1 while epoch 1 is under way: ignored at once
    assert s.policy._lane is None
    s.do(ViewPublished(CursorView("tracking", 0, 0, {}, ()), [], s.policy.generation))
    lane(s)
    s.do(ViewPublished(CursorView("mismatch", None, 0, {}, ()), [], s.policy.generation))
    assert s.policy._lane is None
    old = s.policy.generation
    s.follow()
    entries, ready = next_epoch_reads(s.plan, 0, 0)
    s.do(NextEpoch(old, 0, 1, entries, ready))  # computed for the plan just replaced
    assert s.policy._lane is None


def test_the_window_leaves_the_next_epochs_files_to_the_lane_until_it_releases_them(
    two_nodes: tuple[Plan, npt.NDArray[np.int64]],
) -> None:
    """The lane spreads the next epoch's files over this one; staged by the window as soon as they
    entered its horizon, they were a burst of peer fetches at the epoch's start.  Once released the
    window may stage them too: a lane with no room of its own (no memory tier: the budget is the
    window's) never leaves a file unstaged."""
    s = Setup(*two_nodes, budget=6_000, window=6_000)  # no room beyond the window: the lane fetches nothing
    s.follow()
    tracking(s, 0)
    entries, ready = lane(s)
    by_ready = sorted(zip(ready, entries, strict=True))
    (first, a), (last, b) = by_ready[0], by_ready[-1]
    assert first < last
    assert staged(tracking(s, first, order=[a, b])) == []  # neither released yet: the lane's
    out = tracking(s, first + 1, order=[a, b])
    assert staged(out) == [a] and next_stages(out) == []  # a released: the window stages it, b waits
    assert staged(tracking(s, last + 1, order=[a, b])) == [b]


def test_a_lane_ends_when_the_readers_move_back_an_epoch(two_nodes: tuple[Plan, npt.NDArray[np.int64]]) -> None:
    """A job resumed from an earlier epoch: the lane for the epoch after the one left is stale, and
    its files are the window's again."""
    s = Setup(*two_nodes, budget=40_000)
    s.follow()
    tracking(s, 0, epoch=1)
    later, ready = next_epoch_reads(s.plan, 0, 1)
    s.do(NextEpoch(s.policy.generation, 0, 2, later, ready))
    held_back = int(later[-1])  # released last: not yet at position 0
    assert staged(tracking(s, 0, epoch=1, order=[held_back])) == []
    assert staged(tracking(s, 0, epoch=0, order=[held_back])) == [held_back] and s.policy._lane is None


def test_only_a_training_datasets_first_epoch_carries_the_epoch_after_next(tmp_path: Path) -> None:
    """A validation set first read after some epochs is read from the PFS, but that epoch's training
    reads come from caches: only the training set's first epoch counts (``reads_first``, which
    decides whether a lane carries the epoch after next and pushes memory-tier copies)."""
    for part in ("train", "val"):
        make_tree(tmp_path / "src" / part)
    datasets = "[{root: train}, {root: val, follows: train, every: 2}]"
    plan, _sizes = build(tmp_path / "src", 2, epochs=4, overrides={"datasets": datasets})
    fresh = [[d.follows is None for d in first_read(plan, e)] for e in range(4)]
    later = next(e for e in range(1, 4) if fresh[e])  # the validation set's first epoch
    assert fresh[0] == [True] and fresh[later] == [False], fresh
    assert reads_first(plan, 0) and not any(reads_first(plan, e) for e in range(1, 4))
