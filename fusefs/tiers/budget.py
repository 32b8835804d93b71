"""A hard byte budget shared by everything that holds bytes of one kind of storage.

The memory tier and the page-cache staging window charge the same Budget, so RAM held by the
daemon plus pages it pushed into the kernel never exceed the configured bytes.  Why one budget: a
file can sit in RAM three times (the mount's page cache, a memory tier, the PFS client's cache),
and a cache that grows past its limit gets a training rank OOM-killed under a job memory limit.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Annotated, TypedDict

from placement.statusfields import counter, gauge, text


class BudgetStatus(TypedDict):
    """Status section ``memory_budget``: the RAM budget shared by memory tiers, the staging window and the
    mount's page cache."""

    name: Annotated[str, text("the budget's name (memory)")]
    limit: Annotated[int, gauge("its bytes (the memory tiers' bytes)", unit="bytes")]
    used: Annotated[int, gauge("bytes charged now", unit="bytes")]
    free: Annotated[int, gauge("bytes left", unit="bytes")]
    peak: Annotated[int, gauge("most bytes ever charged at once", unit="bytes")]
    refused: Annotated[int, counter("charges refused (they did not fit, even after reclaiming)", metric="refusals")]
    reclaimed: Annotated[int, counter("bytes of kept pages given back to make room", unit="bytes")]


class Budget:
    """``used`` never exceeds ``limit``: a charge that does not fit is refused, never granted late.

    Callers live on the trio thread, but a lock makes the two counters safe from a worker thread
    too (a release from a thread that finished with a buffer costs nothing extra).
    """

    def __init__(self, limit: int, name: str, reclaim: Callable[[int], int] | None = None) -> None:
        """``reclaim``, when given, is called on the trio thread with the bytes missing when a
        reservation does not fit; it gives back what it can (pages kept only because there was
        room) and returns how much.  The read path's is the policy's port (``PolicyPort.reclaim``,
        fusefs/readpath/port.py): the budget exists before the policy that charges it (the tiers
        charge it too), and the port reaches that policy's executor once it is built."""
        if limit < 0:
            raise ValueError(f"budget {name}: negative limit {limit}")
        self.limit = limit
        self.name = name
        self.used = 0
        self.peak = 0
        self.refused = 0
        self.reclaimed = 0
        self.reclaim = reclaim
        self._lock = threading.Lock()

    @property
    def free(self) -> int:
        return self.limit - self.used

    def try_reserve(self, n: int) -> bool:
        if n < 0:
            raise ValueError(f"budget {self.name}: negative reservation {n}")
        if self._reserve(n):
            return True
        if self.reclaim is not None and n <= self.limit:
            self.reclaimed += self.reclaim(self.used + n - self.limit)
            if self._reserve(n):
                return True
        with self._lock:
            self.refused += 1
        return False

    def _reserve(self, n: int) -> bool:
        with self._lock:
            if self.used + n > self.limit:
                return False
            self.used += n
            self.peak = max(self.peak, self.used)
            return True

    def resize(self, limit: int) -> int:
        """Make ``limit`` the limit, or what is charged now when that is more (so ``used`` never
        exceeds it); returns the limit set.  The memory cgroup fit (``fusefs.daemon.memfit``) frees
        room first and shrinks the rest as charges are released, and grows the limit back."""
        with self._lock:
            self.limit = max(limit, self.used, 0)
            return self.limit

    def release(self, n: int) -> None:
        with self._lock:
            if n < 0 or n > self.used:
                raise ValueError(f"budget {self.name}: release of {n} with {self.used} used")
            self.used -= n

    def status(self) -> BudgetStatus:
        return {
            "name": self.name,
            "limit": self.limit,
            "used": self.used,
            "free": self.free,
            "peak": self.peak,
            "refused": self.refused,
            "reclaimed": self.reclaimed,
        }
