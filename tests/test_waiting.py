"""fusefs.waiting.wait_until, the one deadline-polling helper the CLI, the daemon, tools and tests share."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from fusefs.waiting import WaitTimeout, wait_until
from tools.harness.mounts import wait_for


def test_returns_the_first_truthy_answer() -> None:
    answers: Iterator[object] = iter([None, 0, "", [], {"state": "ready"}, "never asked"])
    assert wait_until(lambda: next(answers), 5, "a ready answer", first_delay=0.001) == {"state": "ready"}
    assert next(answers) == "never asked"


def test_a_timeout_names_what_was_awaited_and_keeps_the_last_answer() -> None:
    t0 = time.monotonic()
    with pytest.raises(WaitTimeout) as info:
        wait_until(lambda: [], 0.2, "the plan for seed 7")
    waited = time.monotonic() - t0
    assert 0.2 <= waited < 1.0, waited
    assert str(info.value) == "timed out after 0.2s waiting for the plan for seed 7"
    assert info.value.what == "the plan for seed 7" and info.value.last == []
    assert isinstance(info.value, TimeoutError)


def test_the_description_may_depend_on_how_the_wait_ended() -> None:
    state = {"nodes": 1}

    def grows() -> bool:
        state["nodes"] += 1
        return False

    with pytest.raises(WaitTimeout, match=r"group forming, \d+ of 99 nodes"):
        wait_until(grows, 0.05, lambda: f"group forming, {state['nodes']} of 99 nodes")
    assert state["nodes"] > 2  # asked more than once


def test_the_predicate_is_asked_once_more_at_the_deadline(wall_clock: bool) -> None:
    """A long pause is cut at the deadline and the condition asked again, not reported as timed out."""
    start = time.monotonic()
    value = wait_until(lambda: time.monotonic() - start >= 0.3, 0.3, "0.3 s", first_delay=10, max_delay=10)
    assert value is True
    assert not wall_clock or time.monotonic() - start < 1.0  # not after the 10 s pause


def test_an_exception_from_the_predicate_ends_the_wait_at_once(wall_clock: bool) -> None:
    def dead() -> bool:
        raise ConnectionAbortedError("daemon is gone")

    t0 = time.monotonic()
    with pytest.raises(ConnectionAbortedError):
        wait_until(dead, 30, "a dead mount")
    assert not wall_clock or time.monotonic() - t0 < 1.0


def test_the_test_helper_reports_a_timeout_as_a_failed_assertion() -> None:
    with pytest.raises(AssertionError, match="waiting for nothing"):
        wait_for(lambda: False, 0.05, "nothing")
