"""The policy's port (fusefs/readpath/port.py): the one late-bound link of the read path."""

from __future__ import annotations

import pytest

from fusefs.readpath.contract import Event, SourceChanged
from fusefs.readpath.port import PolicyPort


class Executor:
    """Records what the port forwards."""

    def __init__(self) -> None:
        self.reported: list[Event] = []
        self.read: list[int] = []

    def report(self, event: Event) -> None:
        self.reported.append(event)

    def reclaim(self, need: int) -> int:
        return need // 2

    def pfs_read(self, entry: int) -> None:
        self.read.append(entry)


def test_the_port_forwards_to_its_executor_once_bound() -> None:
    port, executor = PolicyPort(), Executor()
    port.bind_executor(executor)
    port.report(SourceChanged(3))
    port.pfs_read(5)
    assert (executor.reported, executor.read, port.reclaim(10)) == ([SourceChanged(3)], [5], 5)


def test_before_an_executor_reclaim_frees_nothing_a_read_is_dropped_and_a_report_fails() -> None:
    """As before the port: the budget reclaimed nothing and the fetcher told nobody until the
    executor existed, and staging had nowhere to report a changed source (a wiring bug, said aloud)."""
    port = PolicyPort()
    assert port.reclaim(10) == 0
    port.pfs_read(5)
    with pytest.raises(RuntimeError, match="no executor"):
        port.report(SourceChanged(3))


def test_the_executor_is_bound_once() -> None:
    port = PolicyPort()
    port.bind_executor(Executor())
    with pytest.raises(AssertionError, match="bound twice"):
        port.bind_executor(Executor())
