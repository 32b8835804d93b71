"""The policy's port: where the components its executor drives report into it.

The budget, staging and the fetcher are built before the executor (``Prefetcher``), which takes
them as constructor arguments and drives them; each also tells the policy something back (the
budget: bytes to reclaim now; staging: a source seen changed; the fetcher: an entry read from the
PFS; the peers' clients: a member down or up again; a tier: a copy it forgot).  They get this port at construction
instead, and the executor attaches itself to it once, when it is built:
:meth:`PolicyPort.bind_executor` is the daemon's one late-bound link (ARCHITECTURE.md, "Wiring").

The fetcher also asks peers through it: the peer group's fetch needs the executor's answers to
who owns a file now (its plan, its view, the policy's group rule), so the executor, which holds
the group's fetch, makes that call (:meth:`PolicyPort.peer_fetch`).
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Protocol

from fusefs.readpath.contract import Event


class PolicyExecutor(Protocol):
    """What the port forwards to: the executor, which feeds the policy one step at a time."""

    def report(self, event: Event) -> None: ...
    def reclaim(self, need: int) -> int: ...
    def pfs_read(self, entry: int) -> None: ...
    def peer_fetch(self, entry: int, *, owner: bool, holders: bool) -> Awaitable[bytes | None]: ...
    def copy_lost(self, entry: int, tier: int) -> None: ...


class PolicyPort:
    def __init__(self) -> None:
        self._executor: PolicyExecutor | None = None  # bound once: bind_executor

    def bind_executor(self, executor: PolicyExecutor) -> None:
        """Late-bound (ARCHITECTURE.md, "Wiring"): the executor drives the components that report
        through this port, so it exists after them; ``build_readpath`` binds it once, right after
        building it, before anything runs."""
        assert self._executor is None, "the policy's executor bound twice"
        self._executor = executor

    def report(self, event: Event) -> None:
        """An event for the policy (staging: a source seen changed), handled as one executor step."""
        if self._executor is None:
            raise RuntimeError(f"{event} reported with no executor to feed the policy (build_readpath binds one)")
        self._executor.report(event)

    def reclaim(self, need: int) -> int:
        """The budget's reclaim, on the trio thread: bytes given back towards ``need`` (THE re-entrant
        path into the policy, CONCURRENCY.md); nothing before an executor exists."""
        return 0 if self._executor is None else self._executor.reclaim(need)

    def pfs_read(self, entry: int) -> None:
        """The fetcher read ``entry`` from the PFS (the policy's ``ReadFromPfs``); on the trio thread,
        between awaits, so never inside another policy step."""
        if self._executor is not None:
            self._executor.pfs_read(entry)

    def copy_lost(self, entry: int, tier: int) -> None:
        """A tier forgot its copy of ``entry`` (stale, damaged, evicted, pruned): it may be cached
        again.  Nothing before an executor exists: tiers prune stale copies when opened, and the
        policy, built after that, starts from what they hold."""
        if self._executor is not None:
            self._executor.copy_lost(entry, tier)

    async def peer_fetch(self, entry: int, *, owner: bool, holders: bool) -> bytes | None:
        """The fetcher asks peers for ``entry`` (:class:`~fusefs.readpath.fetcher.PeerFetch`): the
        executor's peer fetch, told who owns it now; None (read it here) with no executor."""
        if self._executor is None:
            return None
        return await self._executor.peer_fetch(entry, owner=owner, holders=holders)
