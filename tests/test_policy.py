"""The read policy's rules, by feeding it events and reading the instructions it returns (no I/O).

The plans are real (built by the planner over a small generated tree); the views the cursor would
publish are written by each test, which is what lets a test put any file anywhere in the horizon.
The budget is the daemon's own :class:`fusefs.tiers.Budget`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from fusefs.config import load
from fusefs.meta.snapshot import Snapshot
from fusefs.planning.inputs import planning_config
from fusefs.readpath.contract import (
    Bypass,
    CancelStage,
    CursorView,
    DropCopy,
    DropPages,
    Event,
    Fill,
    FillDone,
    FillOutcome,
    FillRetry,
    FollowPlan,
    Instruction,
    KeepIn,
    Missed,
    Opened,
    PeerDown,
    PeerUp,
    Place,
    PlanChanged,
    Presume,
    Push,
    Pushed,
    ReadThrough,
    Released,
    RetryFillLater,
    SeedInDoubt,
    SeedTrusted,
    SourceChanged,
    Stage,
    StageFetched,
    StageSlots,
    Tick,
    UseHeld,
    UsePages,
    ViewPublished,
)
from fusefs.readpath.policy import VISIT, PolicySettings, ReaderAnswer, ReadPolicy, StagingMode, entries_due
from fusefs.tiers import Budget
from placement.cursor import CursorStatus
from placement.plan import Plan

FILES = 16


class Held:
    """What a tier holds, as the policy asks it (membership and sizes)."""

    def __init__(self, kind: str = "memory", held: dict[int, int] | None = None) -> None:
        self.kind = kind
        self.held = dict(held or {})

    def contains(self, entry: int) -> bool:
        return entry in self.held

    def size_of(self, entry: int) -> int | None:
        return self.held.get(entry)

    def entries(self) -> list[int]:
        return list(self.held)


def make_tree(root: Path) -> Path:
    """Two classes of 8 files, 1000 to 2750 bytes (file i of a class: 1000 + 250 i)."""
    for c in range(2):
        (root / f"c{c}").mkdir(parents=True)
        for i in range(FILES // 2):
            (root / f"c{c}" / f"i{i}.jpg").write_bytes(b"x" * (1000 + 250 * i))
    return root


def build(
    root: Path, nodes: int, epochs: int = 2, overrides: dict[str, str] | None = None
) -> tuple[Plan, npt.NDArray[np.int64]]:
    """The plan of a ``nodes``-rank job over ``root`` (``overrides``: more config keys, e.g. datasets)."""
    snap = Snapshot.scan(str(root), threads=1)
    cfg = load(
        None,
        {
            "job.world_size": str(nodes),
            "job.epochs": str(epochs),
            "job.batch_size": "2",
            "tiers": "[{kind: memory, bytes: 60000}]",
            "prefetch.lookahead_bytes": "6000",
            **(overrides or {}),
        },
    )
    plan = Plan.build(snap.tree, planning_config(cfg), seed=0, backend="numpy")
    return plan, snap.tree.size


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tree(tmp_path_factory.mktemp("policy") / "src")


@pytest.fixture(scope="module")
def one_node(tree: Path) -> tuple[Plan, npt.NDArray[np.int64]]:
    return build(tree, 1)


@pytest.fixture(scope="module")
def two_nodes(tree: Path) -> tuple[Plan, npt.NDArray[np.int64]]:
    return build(tree, 2)


class Setup:
    """One policy over a real plan, with a budget of ``budget`` bytes and a window of ``window``."""

    def __init__(
        self,
        plan: Plan,
        sizes: npt.NDArray[np.int64],
        *,
        budget: int = 20_000,
        window: int = 6_000,
        mode: StagingMode = "page_cache",
        threads: int = 2,
        stage_max: int = 0,
        tiers: Sequence[Held] | None = None,
        reactive: int = 4_000,
        loader_start: int = 0,
        log_steps: int = 0,
        validate: bool = False,
    ) -> None:
        self.plan = plan
        self.sizes = sizes
        # The budget reclaims through the policy built just below (the daemon's goes through its port).
        self.budget = Budget(budget, "memory", lambda need: self.policy.reclaim(need))
        self.tiers = list(tiers) if tiers is not None else [Held()]
        settings = PolicySettings(
            window,
            mode,
            threads,
            tuple(2 for _ in self.tiers),
            tuple(reactive for _ in self.tiers),
            loader_start=loader_start,
            log_steps=log_steps,
            validate=validate,
            stage_max=stage_max,
        )
        self.policy = ReadPolicy(sizes, self.budget, self.tiers, settings)
        self.files = [int(e) for e in dict.fromkeys(plan.entry_of(np.arange(plan.files)).tolist())]

    def size(self, entry: int) -> int:
        return int(self.sizes[entry])

    def do(self, event: Event) -> list[Instruction]:
        out = self.policy.handle(event)
        self.policy.validate()
        return out

    def follow(self, plan: Plan | None = None, trusted: bool = True) -> list[Instruction]:
        return self.do(PlanChanged(plan if plan is not None else self.plan, trusted))

    def view(self, order: Sequence[int], state: Any = "tracking", node: int = 0) -> list[Instruction]:
        v = CursorView(state, node, 0, entries_due(order), self.policy.stage_list(list(order)))
        return self.do(ViewPublished(v, [], self.policy.generation))

    def by_size(self) -> list[int]:
        """The plan's files, smallest first."""
        return sorted(self.files, key=self.size)


def tracking(s: Setup, position: int, epoch: int = 0, order: Sequence[int] = ()) -> list[Instruction]:
    """Publish a view of rank 0 at ``position`` of job epoch ``epoch``, ``order`` due next."""
    # A partial cursor section on purpose: the lane and the fills' hold read only rank_positions.
    status = cast(CursorStatus, {"rank_positions": {"0": [epoch, position]}})
    view = CursorView("tracking", 0, epoch, entries_due(order), s.policy.stage_list(list(order)), status)
    return s.do(ViewPublished(view, [], s.policy.generation))


def staged(out: list[Instruction]) -> list[int]:
    return [i.entry for i in out if isinstance(i, Stage)]


def dropped(out: list[Instruction]) -> list[int]:
    return [i.entry for i in out if isinstance(i, DropPages)]


# ---------------------------------------------------------------------------- staging and pushes


def test_an_open_racing_its_files_push_keeps_the_pages(one_node: tuple[Plan, npt.NDArray[np.int64]]) -> None:
    """An open arriving while its staged file is being pushed takes it; its release keeps the pages and
    the push that ends afterwards must not drop them (they are the bytes the reader just read)."""
    s = Setup(*one_node)
    s.follow()
    a = s.files[0]
    data = b"x" * s.size(a)
    assert staged(s.view([a])) == [a]
    assert s.do(StageFetched(a, data)) == [Push(a, data)]
    s.do(Opened(a))  # the push is in flight
    assert Bypass(a) not in s.do(ReadThrough(a, s.size(a)))  # charged by the staged reservation
    s.do(Released(a))
    assert dropped(s.do(Pushed(a, ok=True))) == []
    assert s.policy.kept == {a: s.size(a)} and s.budget.used == s.size(a)
    assert s.policy.unused == 0


def test_a_reader_whose_file_another_released_meanwhile_takes_the_kept_pages_not_a_second_charge(
    one_node: tuple[Plan, npt.NDArray[np.int64]],
) -> None:
    """Two readers open a file kept from an earlier read; the one served the kept pages releases it
    before the other pulls its pages: those are the kept pages, charged once (validate() after each
    step of the in-process tests found them charged twice, as kept and as read)."""
    s = Setup(*one_node)
    a = s.files[0]
    n = s.size(a)
    s.do(Opened(a))
    s.do(ReadThrough(a, n))
    s.do(Released(a))
    assert s.policy.kept == {a: n}
    assert UsePages(a) in s.do(Opened(a))  # reader 1: the kept pages
    assert s.do(Opened(a)) == []  # reader 2, open meanwhile: it pulls them through the mount ...
    s.do(Released(a))  # ... after reader 1 released them
    assert s.do(ReadThrough(a, n)) == [] and s.budget.used == n and a not in s.policy.kept
    s.do(Released(a))
    assert s.policy.kept == {a: n} and s.budget.used == n


def test_an_open_during_the_push_is_served_the_bytes_on_their_way(
    one_node: tuple[Plan, npt.NDArray[np.int64]],
) -> None:
    """Not fetched a second time: the open reads the bytes being pushed."""
    s = Setup(*one_node)
    s.follow()
    a = s.files[0]
    data = b"x" * s.size(a)
    s.view([a])
    s.do(StageFetched(a, data))
    assert UseHeld(a, data) in s.do(Opened(a))


def test_a_staged_file_retired_during_its_push_loses_the_pushed_pages(
    one_node: tuple[Plan, npt.NDArray[np.int64]],
) -> None:
    """Control for the rule above: nobody opened it, it left the horizon while pushed, so the pages the
    push stored are dropped when it ends and the charge is gone."""
    s = Setup(*one_node)
    s.follow()
    a, b = s.files[:2]
    s.view([a])
    s.do(StageFetched(a, b"x" * s.size(a)))
    s.view([b])  # a left the horizon while its push was in flight
    assert a not in s.policy.pages and s.policy.unused == 1
    assert dropped(s.do(Pushed(a, ok=True))) == [a]
    assert a not in s.policy.kept and s.budget.used == s.policy.staged_bytes == s.size(b)


def test_a_file_opened_before_its_bytes_came_is_not_pushed(one_node: tuple[Plan, npt.NDArray[np.int64]]) -> None:
    """The open awaits the stage's fetch and reads through the mount: the bytes are not pushed again, and
    the pages the reader pulled are kept at its release."""
    s = Setup(*one_node)
    s.follow()
    a = s.files[0]
    s.view([a])
    assert not any(isinstance(i, UsePages | UseHeld) for i in s.do(Opened(a)))
    out = s.do(StageFetched(a, b"x" * s.size(a)))
    assert not any(isinstance(i, Push) for i in out)
    s.do(ReadThrough(a, s.size(a)))
    s.do(Released(a))
    assert s.policy.kept == {a: s.size(a)} and s.budget.used == s.size(a)


def test_a_plan_change_while_a_stage_is_in_flight(one_node: tuple[Plan, npt.NDArray[np.int64]]) -> None:
    """A new plan leaves stages in flight to finish; a view the old plan's cursor computed meanwhile
    only counts the opens it predicted; the new plan's first view retires what left the horizon
    (pushed pages are kept, reclaimable) and stages the new window.  A failed plan stages nothing
    more but keeps what was fetched: stages in flight end in kept pages an open is served from."""
    s = Setup(*one_node)
    s.follow()
    a, b, c = s.files[:3]
    assert staged(s.view([a, b])) == [a, b]
    out = s.follow()  # a new plan (a re-seed): no cancellation, the window waits for its view
    assert isinstance(out[0], FollowPlan) and not any(isinstance(i, CancelStage) for i in out)
    assert s.do(StageFetched(a, b"a" * s.size(a))) == [Push(a, b"a" * s.size(a))]
    s.do(Pushed(a, ok=True))
    stale = CursorView("tracking", 0, 0, entries_due([c]), (c,), predicted=3)
    before = s.policy.predicted_opens
    assert s.do(ViewPublished(stale, [], s.policy.generation - 1)) == []  # computed for the old plan
    # ... which predicted its turn's opens as they came: counted, and nothing else of it followed
    assert s.policy.predicted_opens == before + 3 and s.policy.view is not stale
    assert a in s.policy.pages
    out = s.view([b, c])
    assert a not in s.policy.pages and s.policy.kept == {a: s.size(a)}  # left the horizon: pages kept
    assert b in s.policy.pages and staged(out) == [c]
    out = s.do(PlanChanged(None))  # no plan at all: nothing more is staged, nothing fetched is lost
    assert not any(isinstance(i, (CancelStage, DropPages, Stage)) for i in out)
    assert s.do(StageFetched(c, b"c" * s.size(c))) == [Push(c, b"c" * s.size(c))]  # completes, kept
    s.do(Pushed(c, ok=True))
    assert c in s.policy.kept and b in s.policy.pages and s.policy.unused == 0
    assert s.do(Opened(c))[-1:] == [UsePages(c)]  # a reader is served the pages fetched for the old plan


def test_readers_catching_the_window_raise_its_stages_in_flight_and_a_window_ahead_lowers_them(
    one_node: tuple[Plan, npt.NDArray[np.int64]],
) -> None:
    """The window stages at most (stages in flight) / (time per stage) files a second, so a fixed limit
    caps it below a fast reader over a slow-opening PFS.  An open of a file whose stage is in flight, or
    due and not started, counts as caught; while the limit held stages back it grows by the start value
    (``prefetch.threads``), again only after half a step's stages ended (the raise begins to show), up
    to the ceiling (``prefetch.max_in_flight``); each change tells the executor (StageSlots: the PFS
    threads).  A tick with no open caught and the top step unused gives a step back, never below the
    start.  The bytes stay within the window's limit throughout (validate() after each step)."""
    s = Setup(*one_node, mode="memory", threads=4, stage_max=10, window=10**6, budget=10**7)
    s.follow()
    files = s.files[:16]
    assert len(files) == 16
    assert staged(s.view(files)) == files[:4]  # held back at 4

    def fetched(i: int) -> list[int]:
        return staged(s.do(StageFetched(files[i], b"x" * s.size(files[i]))))

    s.do(Opened(files[0]))  # caught (its stage in flight) before any stage ended: no raise yet
    assert fetched(1) == [files[4]]
    s.do(Opened(files[4]))  # caught again, one stage ended: not yet
    assert (s.policy.caught_opens, s.policy.stage_limit) == (2, 4)
    assert fetched(2) == [files[5]]
    assert StageSlots(8) in s.do(Opened(files[5]))  # two ended (half a step): raised by a step
    assert fetched(3) == files[6:11]  # 8 in flight now
    s.do(Opened(files[12]))  # due, not started: caught, but one stage ended since the raise
    assert (s.policy.caught_opens, s.policy.stage_limit) == (4, 8)
    assert fetched(6) == [files[11]]  # 8 in flight again (files[12] was opened: skipped)
    assert StageSlots(10) in s.do(Opened(files[7])) and s.policy.stage_limit == 10  # the ceiling, not 12
    status = s.policy.staging_status()
    assert (status["in_flight_limit"], status["in_flight_limit_max"], status["caught_opens"]) == (10, 10, 5)
    assert not any(isinstance(i, StageSlots) for i in s.do(Tick()))  # an open caught it this tick
    while s.policy._staging_now:  # the rest of the window is staged, 10 at a time
        e = min(s.policy._staging_now)
        s.do(StageFetched(e, b"x" * s.size(e)))
    assert not any(isinstance(i, StageSlots) for i in s.do(Tick()))  # stages used the top step this tick
    assert StageSlots(6) in s.do(Tick()) and StageSlots(4) in s.do(Tick())  # ahead: a step a tick
    assert not any(isinstance(i, StageSlots) for i in s.do(Tick())) and s.policy.stage_limit == 4
    assert s.policy.staging_status()["in_flight_limit_max"] == 10


def test_memory_staging_holds_the_bytes_and_serves_them(one_node: tuple[Plan, npt.NDArray[np.int64]]) -> None:
    s = Setup(*one_node, mode="memory")
    s.follow()
    a = s.files[0]
    s.view([a])
    data = b"m" * s.size(a)
    assert not any(isinstance(i, Push) for i in s.do(StageFetched(a, data)))
    assert UseHeld(a, data) in s.do(Opened(a))
    s.do(Released(a))
    assert s.policy.kept == {a: s.size(a)}  # the reader's reads through the mount left the pages


def test_a_refused_push_serves_from_ram(one_node: tuple[Plan, npt.NDArray[np.int64]]) -> None:
    s = Setup(*one_node)
    s.follow()
    a = s.files[0]
    data = b"r" * s.size(a)
    s.view([a])
    s.do(StageFetched(a, data))
    s.do(Pushed(a, ok=False))
    assert UseHeld(a, data) in s.do(Opened(a))


def test_a_file_a_local_tier_holds_is_staged_from_it(one_node: tuple[Plan, npt.NDArray[np.int64]]) -> None:
    """From the directory tier that holds it; a file no tier holds is fetched and kept in its planned tier."""
    s = Setup(*one_node, tiers=[Held("memory"), Held("directory")])
    s.follow()
    a, b = s.files[:2]
    s.tiers[1].held[a] = s.size(a)
    assert [i for i in s.view([a, b]) if isinstance(i, Stage)] == [Stage(a, 1, None), Stage(b, None, 0)]


# ---------------------------------------------------------------------------- the horizon and the budget


def test_staged_files_leave_only_outside_the_horizon_or_once_consumed(
    one_node: tuple[Plan, npt.NDArray[np.int64]],
) -> None:
    s = Setup(*one_node)
    s.follow()
    a, b, c, d = s.by_size()[:4]
    s.view([a, b])
    for e in (a, b):
        s.do(StageFetched(e, b"x" * s.size(e)))
        s.do(Pushed(e, ok=True))
    s.view([b, c, a])  # the window moved but a is still due: it stays
    assert {a, b} <= set(s.policy.pages)
    s.view([c, d, b])  # a left the whole horizon: retired (its pages kept while there is room)
    assert a not in s.policy.pages and b in s.policy.pages and a in s.policy.kept
    s.do(Released(b))  # consumed
    assert b not in s.policy.pages


def test_a_release_only_retires_and_the_next_view_stages_into_its_room(
    one_node: tuple[Plan, npt.NDArray[np.int64]],
) -> None:
    """Every open ends in a release, and pumping on each cost the trio thread about 25 us an open:
    a release retires its file at once (the books stay exact), and the view the cursor publishes
    next (the cursor loop's next turn), stages what the freed room allows."""
    s = Setup(*one_node, budget=2_000, window=2_000)
    s.follow()
    a, b, c = s.by_size()[:3]  # 1000, 1000 and 1250 bytes
    s.do(Opened(c))
    s.do(ReadThrough(c, s.size(c)))  # a reader pulls c's pages in: not reclaimable while it reads
    assert staged(s.view([a, b])) == []  # a does not fit beside them
    assert s.do(Released(c)) == []
    assert c in s.policy.kept  # retired at once: kept pages, which staging may reclaim now
    again = replace(s.policy.view, fresh=False)
    out = s.do(ViewPublished(again, [], s.policy.generation))
    assert dropped(out) == [c] and staged(out) == [a, b]


def test_a_file_that_finds_no_room_stops_the_walk(one_node: tuple[Plan, npt.NDArray[np.int64]]) -> None:
    """The window is staged in order: when the next file does not fit, a later smaller one waits too."""
    s = Setup(*one_node, budget=4_000, window=4_000, threads=4)
    s.follow()
    small, big = s.by_size()[0], s.by_size()[-1]  # 1000 and 2750 bytes
    assert s.budget.try_reserve(2_000)  # a memory tier's copies: not the policy's to reclaim
    assert staged(s.view([big, small])) == []  # 2750 does not fit in 2000: 1000 waits behind it
    s.budget.release(2_000)
    assert staged(s.do(Tick())) == [big, small]


def test_staging_never_reclaims_a_page_due_before_the_file_it_stages(
    one_node: tuple[Plan, npt.NDArray[np.int64]],
) -> None:
    s = Setup(*one_node, budget=5_000, window=5_000)
    s.follow()
    k0, k1, k2, f = s.by_size()[:4]  # 1000, 1000, 1250, 1250 bytes
    for k in (k0, k1, k2):  # read through the mount and released: their pages are kept
        s.do(Opened(k))
        s.do(ReadThrough(k, s.size(k)))
        s.do(Released(k))
    assert list(s.policy.kept) == [k0, k1, k2] and s.budget.used == 3_250
    assert s.budget.try_reserve(1_500)  # a memory tier's copies: 250 bytes left
    # f is due second, after k1 and before k2; k0 is not due at all: only k0 may make room.
    out = s.view([k1, f, k2])
    assert dropped(out) == [k0] and staged(out) == [f]
    s.do(Released(f))  # f consumed (never fetched): its charge is given back
    assert s.budget.try_reserve(s.budget.limit - s.budget.used)  # full again
    g = s.by_size()[4]  # 1500 bytes, due between k1 and k2
    out = s.view([k1, g, k2])
    assert dropped(out) == [] and staged(out) == []  # k2 (1250) is not enough, k1 is due sooner
    assert list(s.policy.kept) == [k1, k2]


def test_a_reader_with_no_room_bypasses_the_page_cache(one_node: tuple[Plan, npt.NDArray[np.int64]]) -> None:
    s = Setup(*one_node, budget=3_000, window=2_000)
    s.follow()
    a = s.files[0]
    assert s.budget.try_reserve(3_000)
    assert Bypass(a) in s.do(ReadThrough(a, s.size(a)))
    assert s.policy.uncached_opens == 1 and a not in s.policy.pages


def test_a_reader_may_take_pages_due_later(one_node: tuple[Plan, npt.NDArray[np.int64]]) -> None:
    """A reader's file is due now, before anything in the horizon: kept pages make way, furthest first."""
    s = Setup(*one_node, budget=3_000, window=1_000)
    s.follow()
    k0, k1, r = s.by_size()[:3]
    for k in (k0, k1):
        s.do(ReadThrough(k, s.size(k)))
        s.do(Released(k))
    s.view([k0, k1])
    assert dropped(s.do(ReadThrough(r, s.size(r)))) == [k1]


def test_a_tier_put_reclaims_unprotected_pages_first(one_node: tuple[Plan, npt.NDArray[np.int64]]) -> None:
    s = Setup(*one_node, budget=3_000, window=1_000)
    s.follow()
    k0, k1 = s.by_size()[:2]
    for k in (k0, k1):
        s.do(ReadThrough(k, s.size(k)))
        s.do(Released(k))
    s.view([k0])
    assert s.budget.try_reserve(2_000)  # the memory tier's put: the budget asks the policy
    assert [i.entry for i in s.policy.drain() if isinstance(i, DropPages)] == [k1]


def test_a_changed_source_leaves_no_copy_here(one_node: tuple[Plan, npt.NDArray[np.int64]]) -> None:
    """Staged, being fetched, kept: every record of a file whose source changed goes, with its charge,
    and its pages are invalidated even when nothing recorded them."""
    s = Setup(*one_node)
    s.follow()
    a, b, k, n = s.files[:4]
    s.view([a, b])
    s.do(StageFetched(a, b"a" * s.size(a)))
    s.do(Pushed(a, ok=True))
    s.do(ReadThrough(k, s.size(k)))
    s.do(Released(k))
    assert s.budget.used == s.size(a) + s.size(b) + s.size(k)

    def forget(e: int) -> list[Instruction]:
        return [i for i in s.do(SourceChanged(e)) if not isinstance(i, Fill)]  # the room freed starts fills

    assert forget(a) == [DropPages(a, 0)]
    assert forget(b) == [CancelStage(b), DropPages(b, 0)]  # still being fetched
    assert forget(k) == [DropPages(k, s.size(k))]
    assert forget(n) == [DropPages(n, 0)]  # nothing recorded: invalidated all the same
    assert s.policy.pages == {} and not s.policy.kept and s.budget.used == 0


# ---------------------------------------------------------------------------- trust in the plan


def test_a_mismatch_keeps_the_window_usable_and_tier_copies_count_against_reactive(
    one_node: tuple[Plan, npt.NDArray[np.int64]],
) -> None:
    """A mismatch costs no PFS read: staged pages become kept pages an open is served from, a stage in
    flight completes into kept pages, and the tier copies count against the reactive policy as far as
    its capacity goes, none being dropped, not even those beyond it (in a group one may be the only copy)."""
    s = Setup(*one_node, tiers=[Held("memory")], reactive=3_000, threads=3)
    s.follow()
    a, b, c = s.by_size()[:3]
    for e in s.by_size()[5:8]:  # files the plan filled into the memory tier: 7000+ bytes
        s.tiers[0].held[e] = s.size(e)
    s.view([a, b, c])
    s.do(StageFetched(a, b"a" * s.size(a)))
    s.do(Pushed(a, ok=True))
    s.do(StageFetched(b, b"b" * s.size(b)))
    s.do(Opened(b))  # b is taken while pushed: its reader keeps it
    out = s.view([], state="mismatch")
    assert s.policy.mode == "reactive"
    assert not dropped(out) and not any(isinstance(i, CancelStage) for i in out)
    assert a in s.policy.kept and c in s.policy.pages  # a: kept pages; c: still being fetched
    doubt = [i for i in out if isinstance(i, SeedInDoubt)]
    assert doubt == [SeedInDoubt(s.plan.seed, True, doubt[0].reason, s.policy.generation)]
    assert not [i for i in out if isinstance(i, DropCopy)]
    held = sum(s.tiers[0].held.values())
    counted = s.policy.reactive.tiers[0].used
    assert held > 3_000 >= counted > 0  # counted as far as they fit, the rest kept outside the accounting
    assert set(s.policy.reactive.where) <= set(s.tiers[0].held)
    assert s.do(StageFetched(c, b"c" * s.size(c))) == [Push(c, b"c" * s.size(c))]
    s.do(Pushed(c, ok=True))
    assert c in s.policy.kept and s.policy.staged_bytes == s.size(b)  # only b, which its reader holds
    assert s.do(Opened(a))[-1:] == [UsePages(a)]  # served from the pages staged under the wrong plan
    assert s.policy.unused == 0 and s.policy.reused == 1
    d = s.by_size()[3]
    assert staged(s.view([c, d], state="tracking")) == [d]  # relocked: c is held already, d is staged


def test_kept_pages_never_used_count_as_unused_only_once_dropped(
    one_node: tuple[Plan, npt.NDArray[np.int64]],
) -> None:
    """``unused`` counts staged files whose fetch was wasted: kept pages a reader may still open are not."""
    s = Setup(*one_node, budget=6_000, window=6_000)
    s.follow()
    a, b = s.by_size()[:2]
    s.view([a, b])
    for e in (a, b):
        s.do(StageFetched(e, b"x" * s.size(e)))
        s.do(Pushed(e, ok=True))
    s.view([], state="mismatch")
    assert set(s.policy.kept) == {a, b} and s.policy.unused == 0
    assert s.policy.reclaim(s.budget.limit) == 0  # all or nothing: cannot free more than it holds
    freed = s.policy.reclaim(s.size(a))
    assert freed >= s.size(a) and s.policy.unused == 1 and dropped(s.policy.drain()) == [a]


def test_memory_staging_held_bytes_of_a_wrong_plan_are_served_then_reclaimable(
    one_node: tuple[Plan, npt.NDArray[np.int64]],
) -> None:
    s = Setup(*one_node, mode="memory")
    s.follow()
    a, b = s.by_size()[:2]
    s.view([a, b])
    s.do(StageFetched(a, b"a" * s.size(a)))
    s.do(StageFetched(b, b"b" * s.size(b)))
    s.view([], state="mismatch")
    assert s.do(Opened(a))[-1:] == [UseHeld(a, b"a" * s.size(a))]  # still served
    assert s.policy.reclaim(s.size(b)) >= s.size(b)  # b, held for no horizon, makes room first
    assert b not in s.policy.pages and s.policy.unused == 1 and s.policy.drain() == []


def test_an_assumed_seed_waits_for_opens_a_written_one_presumes(
    one_node: tuple[Plan, npt.NDArray[np.int64]],
) -> None:
    s = Setup(*one_node)
    assert s.follow(trusted=False) == [FollowPlan(s.plan, None, 1)]
    assert s.follow(trusted=True) == [FollowPlan(s.plan, 0, 2)]


def test_writing_the_seed_the_plan_assumed_presumes_without_a_new_plan(
    one_node: tuple[Plan, npt.NDArray[np.int64]],
) -> None:
    """README's ``echo 0 > .control/seed`` after the daemon planned for the assumed 0: the same plan, so no
    PlanChanged comes; the seed written must still make the cursor predict before any open."""
    s = Setup(*one_node)
    assert s.plan.seed == 0
    s.follow(trusted=False)
    assert s.do(SeedTrusted(7)) == []  # another value: that one comes with its own plan
    assert s.do(SeedTrusted(0)) == [Presume(0, s.policy.generation)]
    assert s.do(SeedTrusted(0)) == []  # once
    s.follow(trusted=False)
    s.view([s.files[0]])  # the cursor locked on opens already: nothing to presume
    assert s.do(SeedTrusted(0)) == [] and s.policy.trusted


def test_a_missed_file_is_kept_where_the_plan_or_the_reactive_policy_says(
    one_node: tuple[Plan, npt.NDArray[np.int64]],
) -> None:
    s = Setup(*one_node, reactive=3_000)
    a, b, c = s.by_size()[:3]
    assert s.do(Missed(a, s.size(a))) == [KeepIn(a, 0)]  # no plan: the reactive set admits while room
    assert s.do(Missed(b, s.size(b))) == [KeepIn(b, 0)]
    assert s.do(Missed(c, s.size(c))) == []  # full, and c leads nobody by two reads
    s.follow()
    s.view([c])
    planned = s.policy.planned_tier(c)
    assert planned == 0  # the plan keeps every file in the memory tier on this one node
    assert s.do(Missed(c, s.size(c))) == [KeepIn(c, 0)]


# ---------------------------------------------------------------------------- tier fills


def test_fills_wait_for_staging_and_go_in_order_of_first_use(
    one_node: tuple[Plan, npt.NDArray[np.int64]],
) -> None:
    s = Setup(*one_node)
    s.follow()
    a = s.files[0]
    out = s.view([a])
    assert staged(out) == [a] and not any(isinstance(i, Fill) for i in out)  # staging first
    out = s.do(StageFetched(a, b"a" * s.size(a)))
    assert not any(isinstance(i, Fill) for i in out)  # the push is still staging
    out = s.do(Pushed(a, ok=True))
    fills = [i for i in out if isinstance(i, Fill)]
    objs, _due = s.plan.fill_order(0)
    order = [int(e) for e in s.plan.objects.obj_entry[objs]]
    assert [f.entry for f in fills] == order[:2]  # two threads for the tier, in order
    assert all(f.from_pfs for f in fills)  # one node owns everything
    out = s.do(FillDone(fills[0].entry, 0, "stored", s.policy.generation))
    assert [i.entry for i in out if isinstance(i, Fill)] == order[2:3]


def test_fills_keep_pace_with_the_readers_opens_and_run_at_full_speed_once_they_stop(
    one_node: tuple[Plan, npt.NDArray[np.int64]],
) -> None:
    """A fill is for a later epoch and costs CPU the readers' opens wait on: while they read, one
    starts per two opens at most; a tick that saw no open lets fills take every slot again."""
    s = Setup(*one_node)  # two fill slots
    s.follow()
    objs, _due = s.plan.fill_order(0)
    order = [int(e) for e in s.plan.objects.obj_entry[objs]]
    gen = s.policy.generation

    def fills(out: list[Instruction]) -> list[int]:
        return [i.entry for i in out if isinstance(i, Fill)]

    assert fills(s.view([])) == order[:2]  # no reader yet: every slot
    s.do(Opened(order[-1]))  # a reader reads: half a fill earned
    assert fills(s.do(FillDone(order[0], 0, "stored", gen))) == []  # a free slot, not yet earned
    s.do(Opened(order[-2]))
    assert fills(s.do(FillDone(order[1], 0, "stored", gen))) == order[2:3]  # two opens: one fill
    assert fills(s.do(Tick())) == []  # the tick saw opens: still paced
    assert fills(s.do(Tick())) == order[3:4]  # no open for a tick: the free slot is taken at once


def test_fills_leave_the_start_of_each_epoch_to_the_readers_loaders(
    one_node: tuple[Plan, npt.NDArray[np.int64]],
) -> None:
    """Every epoch starts with fresh DataLoader workers reading their first batches one file after
    another while the ranks wait: no fill starts while this node's ranks are in the first
    ``loader_start`` positions of their epoch, and the credit their opens earned is spent after.
    Never more than a quarter of a rank's epoch, so that a short epoch still fills while read."""
    plan = one_node[0]
    quarter = max(seg.length for seg in plan.segments(0)) // plan.shape.ranks_per_node // 4
    assert quarter >= 2
    s = Setup(*one_node, loader_start=10 * quarter)  # two fill slots; the hold is cut to the quarter
    s.follow()
    objs, _due = s.plan.fill_order(0)
    order = [int(e) for e in s.plan.objects.obj_entry[objs]]
    gen = s.policy.generation

    def fills(out: list[Instruction]) -> list[int]:
        return [i.entry for i in out if isinstance(i, Fill)]

    def at(position: int, epoch: int = 0) -> list[int]:
        return fills(tracking(s, position, epoch))

    assert at(0) == order[:2]  # no reader yet: every slot, wherever the view says they are
    for _ in range(4):
        s.do(Opened(order[-1]))  # the loaders start: a full credit earned
    for entry in order[:2]:
        assert fills(s.do(FillDone(entry, 0, "stored", gen))) == []
    assert at(quarter - 1) == []  # still in the loaders' first batches
    assert at(quarter) == order[2:4]  # past them: the credit is spent
    for entry in order[2:4]:
        s.do(FillDone(entry, 0, "stored", gen))
    s.do(Opened(order[-1]))
    s.do(Opened(order[-1]))
    assert at(1, epoch=1) == []  # the next epoch's loaders start: fills wait again
    assert at(quarter + 1, epoch=1) == order[4:5]
    assert at(0, epoch=2) == []
    s.do(Opened(order[-1]))
    assert fills(s.do(Opened(order[-1]))) == []  # earned, a slot free: held
    # A view that places no rank in its epoch (none has opened a file of it yet) holds nothing back:
    # a hold nothing could end would stop the fills for good.
    unplaced = CursorView("tracking", 0, 3, {}, (), cast(CursorStatus, {"rank_positions": {"0": [2, 0]}}))
    assert fills(s.do(ViewPublished(unplaced, [], gen))) == order[5:6]


def reading_while_filling(
    s: Setup, out: list[Instruction], rounds: int, outcome: Callable[[int], FillOutcome]
) -> tuple[list[int], list[Instruction]]:
    """``rounds`` times: a reader opens and closes a file, the cursor's next turn publishes the view
    again (the pump runs), and every fill started ends with ``outcome(entry)``.  The fills started,
    in order, and every instruction the policy gave."""
    gen = s.policy.generation
    started: list[int] = []
    seen = list(out)
    for _ in range(rounds):
        fills = [i for i in out if isinstance(i, Fill)]
        started += [f.entry for f in fills]
        s.do(Opened(s.files[0]))
        out = s.do(Released(s.files[0])) + s.do(ViewPublished(replace(s.policy.view, fresh=False), [], gen))
        for f in fills:
            out += s.do(FillDone(f.entry, f.tier, outcome(f.entry), gen))
        seen += out
    return started, seen


def test_while_readers_read_a_fill_due_after_the_next_epoch_waits_for_it(tree: Path) -> None:
    """Each epoch carries only the transfers the next one needs: while readers read epoch e, fills
    due from epoch e + 2 on wait until e + 1 is read, and all run once the readers stop."""
    s = Setup(*build(tree, 2, epochs=4), budget=60_000)  # node 0's tier takes every file it is given
    s.follow()
    gen = s.policy.generation
    objs, due = s.plan.fill_order(0)
    due_of = {int(e): int(d) for e, d in zip(s.plan.objects.obj_entry[objs], due, strict=True)}
    start = [s.plan.segments(e)[0].start for e in range(4)]
    assert any(d >= start[2] for d in due_of.values()), "node 0 has files first due in epoch 2 or later"

    def reading(epoch: int) -> list[int]:
        """Publish ``epoch``, then open files and finish every fill until none starts: what started."""
        out = s.do(ViewPublished(CursorView("tracking", 0, epoch, {}, ()), [], gen))
        started, _ = reading_while_filling(s, out, 4 * len(due_of), lambda entry: "stored")
        return started

    s.do(Opened(s.files[0]))  # readers read from here on: fills keep pace
    first = reading(0)
    assert first and all(due_of[e] < start[2] for e in first)
    assert set(first) == {e for e, d in due_of.items() if d < start[2]}
    second = reading(1)
    assert second and all(start[2] <= due_of[e] < start[3] for e in second)
    s.do(Tick())  # the tick saw opens
    rest = [i.entry for i in s.do(Tick()) if isinstance(i, Fill)]  # readers stopped: no wait
    assert rest and all(due_of[e] >= start[3] for e in rest)


def test_a_replica_its_owner_could_not_serve_is_retried_while_the_gate_holds_later_fills(tree: Path) -> None:
    """The gate above stops the pass before its end, where the retry of replicas used to start: a
    replica due next epoch whose owner answered "later" waited for the readers to stop, and was then
    read on the read path instead.  The retry pass keeps the gated files after it, in due order."""
    s = Setup(*build(tree, 2, epochs=6), budget=60_000)
    s.follow()
    gen = s.policy.generation
    objs, _due = s.plan.fill_order(0)
    owners = s.plan.owner_obj[objs]
    entries = [int(e) for e in s.plan.objects.obj_entry[objs]]
    replicas = {e for e, o in zip(entries, owners, strict=True) if o != 0}
    s.do(Opened(s.files[0]))  # readers read: the gate applies
    out = s.do(ViewPublished(CursorView("tracking", 0, 0, {}, ()), [], gen))
    failed: list[int] = []

    def outcome(entry: int) -> FillOutcome:
        if failed or entry not in replicas:
            return "stored"
        failed.append(entry)
        return "later"  # the first replica: its owner cannot serve it yet

    _, seen = reading_while_filling(s, out, 100, outcome)
    retries = [i for i in seen if isinstance(i, RetryFillLater)]
    assert failed and retries == [RetryFillLater(1.0, gen)]
    assert s.policy._fill is not None and s.policy._fill.pos < len(entries)  # the gate still holds some
    again = [i.entry for i in s.do(FillRetry(gen)) if isinstance(i, Fill)]
    assert again[:1] == failed  # the replica first, then (in order) what is due before the gate
    held = s.policy._fill.due
    assert (held[:-1] <= held[1:]).all()


def test_replicas_whose_owner_cannot_serve_are_retried_after_the_pass(
    two_nodes: tuple[Plan, npt.NDArray[np.int64]],
) -> None:
    s = Setup(*two_nodes)
    s.follow()
    gen = s.policy.generation
    out = s.view([], node=0)
    objs, _ = s.plan.fill_order(0)
    owners = s.plan.owner_obj[objs]
    replicas = [int(e) for e, o in zip(s.plan.objects.obj_entry[objs], owners, strict=True) if o != 0]
    assert replicas, "the plan gives node 0 copies of files node 1 owns"
    pending = [i for i in out if isinstance(i, Fill)]
    later: list[int] = []
    while pending:
        f = pending.pop(0)
        assert f.from_pfs == (f.entry not in replicas)
        outcome = "later" if f.entry in replicas else "stored"
        if outcome == "later":
            later.append(f.entry)
        out = s.do(FillDone(f.entry, f.tier, outcome, gen))  # type: ignore[arg-type]
        pending += [i for i in out if isinstance(i, Fill)]
    assert sorted(later) == sorted(replicas)
    assert RetryFillLater(1.0, gen) in out
    assert [i.entry for i in s.do(FillRetry(gen)) if isinstance(i, Fill)] == later[:2]


def test_replicas_of_a_down_owner_wait_without_a_request(
    two_nodes: tuple[Plan, npt.NDArray[np.int64]],
) -> None:
    s = Setup(*two_nodes)
    s.follow()
    s.do(PeerDown(1))
    gen = s.policy.generation
    pending = [i for i in s.view([], node=0) if isinstance(i, Fill)]
    seen = []
    while pending:
        f = pending.pop(0)
        seen.append(f)
        pending += [i for i in s.do(FillDone(f.entry, f.tier, "stored", gen)) if isinstance(i, Fill)]
    assert seen and all(f.from_pfs for f in seen)  # only what node 0 owns was asked for
    out = s.do(PeerUp(1))
    assert not any(isinstance(i, Fill) for i in out)  # they wait for the pause to end
    assert any(isinstance(i, Fill) and not i.from_pfs for i in s.do(FillRetry(gen)))


# ---------------------------------------------------------------------------- properties


class PolicyMachine(RuleBasedStateMachine):
    """Random interleavings of opens, releases, views, fetches, pushes, plan changes and tier charges.

    After every step: the bookkeeping adds up, no budget is exceeded, a trusted plan's staged file
    left only by being consumed or by leaving the horizon, staging took no page due before the file
    it staged, and the window was staged in order.
    """

    plan: Plan
    sizes: npt.NDArray[np.int64]

    def __init__(self) -> None:
        super().__init__()
        self.s = Setup(self.plan, self.sizes, budget=6_000, window=4_000, threads=3)
        self.s.follow()
        self.stages: list[int] = []
        self.pushes: list[tuple[int, bytes]] = []
        self.handles: list[int] = []
        self.external: list[int] = []  # a memory tier's charges
        self.accounted: set[int] = set()  # stage-list files staged, opened or held since the view
        self.opened: set[int] = set()  # opened under this plan (the views here place no opens)

    # ---- the checks run around every event

    def step(self, event: Event, external: bool = False) -> list[Instruction]:
        p = self.s.policy
        before = {e for e, f in p.pages.items() if f.staged}
        orphans = (
            {e for e, f in p.pages.items() if f.state == "held" and not f.taken} if p.mode == "reactive" else set()
        )
        out = self.s.do(event)
        after = {e for e, f in p.pages.items() if f.staged}
        gone = before - after
        if isinstance(event, Released | StageFetched):
            gone.discard(event.entry)
        if isinstance(event, ViewPublished) and event.view.state != "mismatch":
            assert not {e for e in gone if e in event.view.due}, (gone, event.view.due)
            gone = set()
        elif isinstance(event, PlanChanged | ViewPublished):
            gone = set()  # no plan, or a mismatch: the window becomes kept pages
        gone -= orphans  # bytes held for no plan: the first a reclaim takes
        if isinstance(event, Pushed) and p.mode == "reactive":
            gone -= set(p.kept)  # staged for no plan: its pushed pages are kept
        assert not gone, (event, gone)
        self.check_reclaims(out, reader=isinstance(event, ReadThrough) or external)
        self.carry_out(out)
        return out

    def check_reclaims(self, out: list[Instruction], reader: bool) -> None:
        due = self.s.policy.view.due
        waiting: list[int] = []
        for ins in out:
            if isinstance(ins, DropPages) and ins.entry in due and ins.nbytes:
                waiting.append(ins.entry)
            elif isinstance(ins, Stage):
                mine = due.get(ins.entry, -1)
                assert all(due[k] > mine for k in waiting), (ins, waiting, due)
                stage = self.s.policy.view.stage
                earlier = stage[: stage.index(ins.entry)] if ins.entry in stage else ()
                p = self.s.policy
                missing = [e for e in earlier if e not in self.accounted and e not in p.pages and e not in p.kept]
                assert not missing, (ins, missing)
                self.accounted.add(ins.entry)
                waiting = []
        assert not waiting or reader, waiting

    def carry_out(self, out: list[Instruction]) -> None:
        for ins in out:
            if isinstance(ins, Stage):
                self.stages.append(ins.entry)
            elif isinstance(ins, CancelStage) and ins.entry in self.stages:
                self.stages.remove(ins.entry)
            elif isinstance(ins, Push):
                self.pushes.append((ins.entry, ins.data))

    # ---- rules

    @rule(data=st.data(), n=st.integers(0, FILES))
    def publish(self, data: st.DataObject, n: int) -> None:
        order = data.draw(st.permutations(self.s.files))[:n]
        p = self.s.policy
        self.accounted = {e for e in order if e in p.pages or e in p.kept or e in self.opened}
        view = CursorView("tracking", 0, 0, entries_due(order), p.stage_list(order))
        self.step(ViewPublished(view, [], p.generation))

    @rule(data=st.data())
    def open_file(self, data: st.DataObject) -> None:
        e = data.draw(st.sampled_from(self.s.files))
        self.accounted.add(e)
        self.opened.add(e)
        out = self.step(Opened(e))
        if not any(isinstance(i, UsePages) for i in out):
            self.step(ReadThrough(e, self.s.size(e)))
        self.handles.append(e)

    @rule(data=st.data())
    def read_whole(self, data: st.DataObject) -> None:
        """A file opened, read through and released at once: its pages are kept while there is room."""
        self.open_file(data)
        self.step(Released(self.handles.pop()))

    @precondition(lambda self: self.handles)
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        i = data.draw(st.integers(0, len(self.handles) - 1))
        self.step(Released(self.handles.pop(i)))

    @precondition(lambda self: self.stages)
    @rule(data=st.data(), ok=st.booleans())
    def stage_done(self, data: st.DataObject, ok: bool) -> None:
        e = self.stages.pop(data.draw(st.integers(0, len(self.stages) - 1)))
        self.step(StageFetched(e, b"d" * self.s.size(e) if ok else None))

    @precondition(lambda self: self.pushes)
    @rule(data=st.data(), ok=st.booleans())
    def push_done(self, data: st.DataObject, ok: bool) -> None:
        e, _data = self.pushes.pop(data.draw(st.integers(0, len(self.pushes) - 1)))
        self.step(Pushed(e, ok))

    @rule(n=st.integers(500, 4_000))
    def tier_put(self, n: int) -> None:
        if self.s.budget.try_reserve(n):
            self.external.append(n)
        out = self.s.policy.drain()
        self.check_reclaims(out, reader=True)

    @precondition(lambda self: self.external)
    @rule()
    def tier_drop(self) -> None:
        self.s.budget.release(self.external.pop())

    @rule()
    def mismatch(self) -> None:
        p = self.s.policy
        self.step(ViewPublished(CursorView("mismatch", 0, 0), [], p.generation))

    @rule(failed=st.booleans())
    def new_plan(self, failed: bool) -> None:
        self.opened = set()
        self.step(PlanChanged(None if failed else self.plan))

    @rule()
    def tick(self) -> None:
        self.step(Tick())

    @invariant()
    def budgets_hold(self) -> None:
        p, b = self.s.policy, self.s.budget
        assert b.used == p.held_bytes() + sum(self.external) <= b.limit
        assert p.staged_bytes <= p.staging_limit


def test_random_event_sequences_keep_every_invariant(one_node: tuple[Plan, npt.NDArray[np.int64]]) -> None:
    PolicyMachine.plan, PolicyMachine.sizes = one_node
    run = PolicyMachine.TestCase
    run.settings = settings(
        max_examples=25,
        stateful_step_count=25,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    run().runTest()


def test_a_run_of_readers_steps_in_one_call_decides_what_one_step_each_would(
    one_node: tuple[Plan, npt.NDArray[np.int64]],
) -> None:
    """``ReadPolicy.readers`` (the native front's booking of a run of opens and releases, when no
    step is logged or validated) against ``handle`` of the same ``Opened``/``Released`` events one
    by one, from the same state: a pushed file (UsePages), one whose push the kernel refused
    (UseHeld), one still being fetched (its release cancels the stage), kept pages (reused), the
    same file open twice at once, an unplanned entry; then visits (an open and its release as one
    op, ``VISIT``): of a file open elsewhere, of kept pages (twice: the direct path), of a
    cancelled stage, of an unplanned entry, each against its Opened and Released one by one.  The
    Place gids, the answers, the pages kept after each release, the other instructions, the step
    count and the policy's books (the order of kept pages included) agree."""
    a, b, c, d, e = one_node[0].entry_of(np.arange(5)).tolist()
    ops = [a, b, c, e, e, 0, ~e, ~a, ~c, ~0, ~e, b, ~b, ~b, d, e, ~e]
    ops += [d + VISIT, d + VISIT, a + VISIT, e + VISIT, c + VISIT, 0 + VISIT]

    def prepared() -> Setup:
        s = Setup(*one_node, threads=3)
        s.follow()
        assert set(staged(s.view([a, b, c]))) == {a, b, c}
        s.do(StageFetched(a, b"x" * s.size(a)))
        s.do(Pushed(a, ok=True))
        s.do(StageFetched(b, b"x" * s.size(b)))
        s.do(Pushed(b, ok=False))  # held in RAM
        for entry in (d, e):  # read through the mount, released: kept pages
            s.do(Opened(entry))
            s.do(ReadThrough(entry, s.size(entry)))
            s.do(Released(entry))
        return s

    def books(s: Setup) -> object:
        p = s.policy
        pages = {k: (v.nbytes, v.state, v.taken, v.data is not None) for k, v in p.pages.items()}
        return (
            p.steps,
            list(p.kept.items()),
            pages,
            (p.kept_bytes, p.cached_bytes, p.staged_bytes, p.reused, p.unused, p.unplanned_opens, s.budget.used),
            (p._opens_since_tick, p._fill_credit, dict(p._unplaced), sorted(p._opened_since_view)),
            sorted(p._kept_unused),
        )

    one = prepared()
    places: list[int] = []
    answers: list[object] = []
    other: list[Instruction] = []
    for op in ops:
        answer: object = None
        entry = op - VISIT if op >= VISIT else op
        for ins in one.do(Opened(entry) if op >= 0 else Released(~op)):
            if isinstance(ins, Place):
                places.append(ins.gid)
            elif isinstance(ins, UsePages | UseHeld):
                answer = ins
            else:
                other.append(ins)
        if op >= VISIT:
            other.extend(one.do(Released(entry)))
            answers.append((answer, one.policy.in_page_cache(entry)))
        else:
            answers.append(answer if op >= 0 else one.policy.in_page_cache(~op))

    run = prepared()
    assert run.policy.lean()
    run_places: list[int] = []
    run_answers: list[ReaderAnswer] = []
    run.policy.readers(ops, run_places, run_answers)
    run.policy.validate()
    assert (run_places, run_answers, run.policy.drain()) == (places, answers, other)
    assert books(run) == books(one)
    assert any(isinstance(x, UseHeld) for x in answers) and any(isinstance(x, UsePages) for x in answers)
    assert CancelStage(c) in other and places
