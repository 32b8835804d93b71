"""The read policy's contract is closed: every event has its handler, every instruction is carried
out or answered, nothing reaches the policy but through ``handle``, and its debug keys work: the
log tells one file's story, ``debug.validate`` checks the books after every step.

mypy proves the first two statically (``assert_never`` in ``ReadPolicy.handle`` and
``Prefetcher._execute``); the tests here prove the same at run time for every class of the unions
(a class added without a sample below fails the first two tests) and that the samples reach the
code the ``match`` routes them to.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, get_args

import numpy as np
import numpy.typing as npt
import pytest
from inprocess import assemble, make_source
from test_policy import Setup, build, make_tree, staged

from fusefs.daemon import schema
from fusefs.readpath.contract import (
    Answer,
    Bypass,
    CancelStage,
    CopyLost,
    CursorView,
    DropCopy,
    DropPages,
    Event,
    FetchForPeer,
    Fill,
    FillDone,
    FillRetry,
    FollowPlan,
    GroupChanged,
    Instruction,
    KeepIn,
    Missed,
    NextEpoch,
    NextFetched,
    NextPushed,
    NodePresumed,
    Opened,
    PeerAsked,
    PeerDown,
    PeerUp,
    Place,
    PlanChanged,
    Presume,
    Push,
    Pushed,
    PushNext,
    ReadFromPfs,
    ReadThrough,
    Reclaimed,
    Released,
    RetryFillLater,
    SeedInDoubt,
    SeedTrusted,
    SourceChanged,
    Stage,
    StageFetched,
    StageNext,
    StageSlots,
    Step,
    Tick,
    UseHeld,
    UsePages,
    ViewPublished,
)
from fusefs.readpath.policy import PolicyLogStatus, entries_due
from fusefs.readpath.prefetch import Prefetcher
from placement.plan import Plan

Built = tuple[Plan, npt.NDArray[np.int64]]

EVENTS: dict[type[Any], Callable[[Setup], Event]] = {
    PlanChanged: lambda s: PlanChanged(s.plan),
    SeedTrusted: lambda s: SeedTrusted(0),
    NodePresumed: lambda s: NodePresumed(0),
    Opened: lambda s: Opened(s.files[0]),
    ReadThrough: lambda s: ReadThrough(s.files[1], s.size(s.files[1])),
    Missed: lambda s: Missed(s.files[2], s.size(s.files[2])),
    Released: lambda s: Released(s.files[0]),
    ViewPublished: lambda s: ViewPublished(
        CursorView("tracking", 0, 0, entries_due(s.files[:3]), s.policy.stage_list(s.files[:3])),
        [],
        s.policy.generation,
    ),
    StageFetched: lambda s: StageFetched(s.files[3], b"x" * s.size(s.files[3])),
    Pushed: lambda s: Pushed(s.files[3], True),
    FillDone: lambda s: FillDone(s.files[4], 0, "stored", s.policy.generation),
    FillRetry: lambda s: FillRetry(s.policy.generation),
    CopyLost: lambda s: CopyLost(s.files[4], 0),
    ReadFromPfs: lambda s: ReadFromPfs(s.files[5]),
    SourceChanged: lambda s: SourceChanged(s.files[5]),
    PeerDown: lambda s: PeerDown(1),
    PeerUp: lambda s: PeerUp(1),
    Tick: lambda s: Tick(),
    GroupChanged: lambda s: GroupChanged((11, 22), 0),
    PeerAsked: lambda s: PeerAsked(s.files[6], s.size(s.files[6]), False),
    NextEpoch: lambda s: NextEpoch(
        s.policy.generation, 0, 1, np.asarray(s.files[6:8], np.int64), np.asarray([-1, -1], np.int64)
    ),
    NextFetched: lambda s: NextFetched(s.files[6], None),
    NextPushed: lambda s: NextPushed(s.files[6], False),
}
"""One sample per event class: a class added to ``Event`` without one fails the tests below."""

INSTRUCTIONS: dict[type[Any], Instruction] = {
    FollowPlan: FollowPlan(None, None, 1),
    Presume: Presume(0, 1),
    SeedInDoubt: SeedInDoubt(0, True, "test", 1),
    StageSlots: StageSlots(64),
    Place: Place(3),
    UsePages: UsePages(1),
    UseHeld: UseHeld(1, b"x"),
    Bypass: Bypass(1),
    KeepIn: KeepIn(1, 0),
    Stage: Stage(1, None, None),
    CancelStage: CancelStage(1),
    Push: Push(1, b"x"),
    DropPages: DropPages(1, 1),
    Fill: Fill(1, 0, True, 1),
    DropCopy: DropCopy(1, 0),
    RetryFillLater: RetryFillLater(1.0, 1),
    StageNext: StageNext(1, None, None),
    PushNext: PushNext(1, b"x"),
    FetchForPeer: FetchForPeer(1, None),
}
"""One sample per instruction class: a class added to ``Instruction`` without one fails below."""

# The executor's methods for the instructions it carries out (the match routes each to one of these).
EXECUTED = {
    FollowPlan: "_follow_plan",
    Presume: "_presume",
    SeedInDoubt: "_seed_in_doubt",
    StageSlots: "_stage_slots",
    Place: "_place",
    Stage: "_stage",
    CancelStage: "_cancel_stage",
    Push: "_push",
    DropPages: "_drop_pages",
    Fill: "_fill",
    DropCopy: "_drop_copy",
    RetryFillLater: "_retry_fill_later",
    StageNext: "_stage_next",
    PushNext: "_push_next",
}


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory: pytest.TempPathFactory) -> Built:
    return build(make_tree(tmp_path_factory.mktemp("contract") / "src"), 2)


def test_every_event_class_has_a_sample_and_a_handler(two_nodes: Built) -> None:
    """Each event, fed after a plan and a view, is handled (an unhandled one reaches assert_never and
    raises), logged as one step, and leaves the books valid (``validate`` after every step)."""
    assert set(EVENTS) == set(get_args(Event))
    s = Setup(*two_nodes, log_steps=100, validate=True)
    s.follow()
    s.do(EVENTS[ViewPublished](s))
    for cls, sample in EVENTS.items():
        event = sample(s)
        assert type(event) is cls
        before = s.policy.steps
        s.do(event)
        assert s.policy.steps == before + 1 and s.policy.log()[-1].event is event


def test_every_instruction_class_is_carried_out_or_answered() -> None:
    """The executor's ``match``: each instruction reaches exactly its method, or comes back as the
    answer; nothing falls through (an instruction the executor forgot used to become an answer)."""
    assert set(INSTRUCTIONS) == set(get_args(Instruction))
    executor = Prefetcher.__new__(Prefetcher)  # the dispatch only: no I/O behind it
    ran: list[tuple[str, Instruction]] = []
    for name in EXECUTED.values():
        setattr(executor, name, lambda ins, name=name: ran.append((name, ins)))
    for cls, ins in INSTRUCTIONS.items():
        ran.clear()
        answer = executor._execute(ins)
        if cls in get_args(Answer):
            assert answer is ins and ran == []
        else:
            assert answer is None and ran == [(EXECUTED[cls], ins)]
    assert set(EXECUTED) | set(get_args(Answer)) == set(get_args(Instruction))


def test_a_files_story_tells_why_it_was_read_again(two_nodes: Built) -> None:
    """Staged, pushed, read, kept, reclaimed for a reader's room, then read from the PFS again: every
    step naming the file, in order, and no step that does not; the log keeps the last N steps."""
    plan, sizes = two_nodes
    s = Setup(plan, sizes, budget=8_000, log_steps=64)
    s.follow()
    a, b, c = s.by_size()[:3]
    data = b"x" * s.size(a)
    assert staged(s.view([a])) == [a]
    s.do(StageFetched(a, data))
    s.do(Pushed(a, True))
    s.do(Opened(a))
    s.do(Released(a))
    s.view([b])  # a leaves the horizon: its kept pages may go first
    s.do(Opened(c))
    room = s.budget.limit - s.budget.used + 1  # a reader (of a file not staged) that needs a's room
    assert DropPages(a, s.size(a)) in s.do(ReadThrough(c, room))
    s.do(Opened(a))
    s.do(Missed(a, s.size(a)))
    s.do(ReadFromPfs(a))
    story = s.policy.story(a)
    told = [type(st.event).__name__ for st in story]
    assert told == [
        "ViewPublished",
        "StageFetched",
        "Pushed",
        "Opened",
        "Released",
        "ReadThrough",
        "Opened",
        "Missed",
        "ReadFromPfs",
    ], told
    assert all(a in st.entries() for st in story)
    assert [st.seq for st in story] == sorted(st.seq for st in story)
    assert "DropPages(entry=" in story[5].describe() and "<" in story[1].describe()  # bytes summarised
    assert all(a not in st.entries() for st in s.policy.log() if st not in story)
    assert schema.check(s.policy.log_status(), PolicyLogStatus) == []  # as status section policy_log shows it
    # Bounded: the oldest steps go.
    short = Setup(plan, sizes, log_steps=3)
    short.follow()
    for e in s.files[:5]:
        short.do(Opened(e))
    assert [st.seq for st in short.policy.log()] == [4, 5, 6] and short.policy.steps == 6
    assert short.policy.log_status()["capacity"] == 3 and len(short.policy.log_status()["log"]) == 3
    assert Setup(plan, sizes).policy.log() == []  # no log by default


def test_a_reclaim_outside_a_step_is_logged_as_the_one_re_entrant_path(two_nodes: Built) -> None:
    """A memory-tier put's reclaim is no event: its drops wait for drain(), and the log records it."""
    s = Setup(*two_nodes, log_steps=16)
    a = s.files[0]
    s.do(Opened(a))
    s.do(ReadThrough(a, s.size(a)))
    s.do(Released(a))
    assert s.budget.try_reserve(s.budget.limit - s.size(a) + 1)  # a put needing a's room
    step = s.policy.log()[-1]
    assert step.event == Reclaimed(1, s.size(a)) and step.out == (DropPages(a, s.size(a)),)
    assert s.policy.drain() == [DropPages(a, s.size(a))]
    assert s.policy.story(a)[-1] is step


def test_validate_runs_after_every_step_when_the_key_is_on(two_nodes: Built) -> None:
    """A broken invariant (a byte counter out of step with the pages) raises in the next step with
    ``validate``, and passes unnoticed without it."""
    for on in (True, False):
        s = Setup(*two_nodes, validate=on)
        s.follow()
        s.policy.kept_bytes += 1  # no kept page has it
        if on:
            with pytest.raises(AssertionError):
                s.policy.handle(Tick())
        else:
            s.policy.handle(Tick())


def test_the_presumed_node_arrives_as_an_event(two_nodes: Built) -> None:
    """A trusted plan presumes the node ``NodePresumed`` named; None presumes none (two nodes)."""
    for node, presume in ((1, 1), (None, None)):
        s = Setup(*two_nodes)
        s.do(NodePresumed(node))
        (follow,) = [i for i in s.follow() if isinstance(i, FollowPlan)]
        assert follow.presume == presume


def test_a_step_names_what_a_view_placed_and_staged_not_its_whole_horizon() -> None:
    view = CursorView("tracking", 0, 0, {1: 0, 2: 1, 9: 2}, (2, 9))
    step = Step(1, ViewPublished(view, [5], 1), (Stage(2, None, None),))
    assert step.entries() == [2, 5]  # 1 and 9, only due or to stage later, are not named


def test_the_harness_and_the_daemon_take_the_debug_keys(tmp_path: Path) -> None:
    """The in-process harness runs every test with both keys on (so every in-process test validates
    after each step), and staging reports a changed source to the executor, which logs the step."""
    root = tmp_path / "src"
    files = make_source(root)
    m = assemble(root, files, tmp_path)
    policy = m.rp.policy
    assert policy.settings.validate and policy.settings.log_steps > 0
    m.rp.staging.forget(3)
    assert policy.log()[-1].event == SourceChanged(3) and policy.story(3)[-1].out == (DropPages(3, 0),)
