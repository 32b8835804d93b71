"""The policy's port (fusefs/readpath/port.py): the one late-bound link of the daemon."""

from __future__ import annotations

import pytest
import trio

from fusefs.readpath.contract import Event, SourceChanged
from fusefs.readpath.port import PolicyPort


class Executor:
    """Records what the port forwards."""

    def __init__(self) -> None:
        self.reported: list[Event] = []
        self.read: list[int] = []
        self.asked: list[tuple[int, bool, bool]] = []
        self.lost: list[tuple[int, int]] = []

    def report(self, event: Event) -> None:
        self.reported.append(event)

    def reclaim(self, need: int) -> int:
        return need // 2

    def pfs_read(self, entry: int) -> None:
        self.read.append(entry)

    def copy_lost(self, entry: int, tier: int) -> None:
        self.lost.append((entry, tier))

    async def peer_fetch(self, entry: int, *, owner: bool, holders: bool) -> bytes | None:
        self.asked.append((entry, owner, holders))
        return b"from a peer"


def test_the_port_forwards_to_its_executor_once_bound() -> None:
    port, executor = PolicyPort(), Executor()
    port.bind_executor(executor)
    port.report(SourceChanged(3))
    port.pfs_read(5)
    port.copy_lost(4, 1)
    fetched = trio.run(lambda: port.peer_fetch(7, owner=True, holders=False))
    assert (executor.reported, executor.read, port.reclaim(10)) == ([SourceChanged(3)], [5], 5)
    assert (fetched, executor.asked, executor.lost) == (b"from a peer", [(7, True, False)], [(4, 1)])


def test_before_an_executor_reclaim_frees_nothing_reads_and_peer_fetches_are_dropped_and_a_report_fails() -> None:
    """As before the port: the budget reclaimed nothing and the fetcher told nobody until the
    executor existed (nor asked any peer: the fetcher reads the PFS), a tier pruning stale copies
    when opened told nobody (the policy starts from what the tiers hold), and staging had nowhere
    to report a changed source (a wiring bug, said aloud)."""
    port = PolicyPort()
    assert port.reclaim(10) == 0
    port.pfs_read(5)
    port.copy_lost(4, 1)
    assert trio.run(lambda: port.peer_fetch(7, owner=True, holders=True)) is None
    with pytest.raises(RuntimeError, match="no executor"):
        port.report(SourceChanged(3))


def test_the_executor_is_bound_once() -> None:
    port = PolicyPort()
    port.bind_executor(Executor())
    with pytest.raises(AssertionError, match="bound twice"):
        port.bind_executor(Executor())
