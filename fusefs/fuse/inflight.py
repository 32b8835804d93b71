"""The requests the daemon is serving right now, by the process that made each: who holds a busy mount.

``seerfs umount`` names a busy mount's holders from /proc (open files, cwd, root, mappings), but a
reader blocked inside open (the PFS hung) has no descriptor yet: only the request's context knows
its pid.  So the handlers that can wait (open, statfs: each awaits a worker thread or a fetch)
register here for as long as they wait, and the status section ``requests`` lists them.  A handler
that never awaits (lookup, getattr, readdir, ...) finishes within one step of the trio loop, where
no status render can see it, so it does not register.

What it cannot show: a request the kernel still queues because every pyfuse3 task is busy
(``fuse.max_tasks``), and a read (pyfuse3 gives reads no context; its reader has the file open, so
/proc names it anyway).

Concurrency rule: touched only on the trio thread (the handlers and the status render).
"""

from __future__ import annotations

import itertools
import time
from typing import Annotated, TypedDict

from placement.statusfields import gauge, text

_LISTED = 100
"""Requests listed in status at most (``in_flight`` counts them all)."""


class RequestStatus(TypedDict):
    pid: Annotated[
        int, text("the requesting thread's id as the kernel gives it (its process's pid for a single thread)")
    ]
    op: Annotated[str, text("open, statfs, or read (a read by inode in fuse.no_open mode, which has no open)")]
    seconds: Annotated[float, text("how long the daemon has been serving it")]


class RequestsStatus(TypedDict):
    """Status section ``requests``: readers' requests the daemon is serving now, which hold the mount busy."""

    in_flight: Annotated[int, gauge("requests being served now that wait on something (open, statfs)")]
    oldest_seconds: Annotated[float, gauge("how long the oldest of them has waited (0 with none): a hung source shows")]
    waiting: Annotated[
        list[RequestStatus],
        text("up to 100 of them, oldest first (what seerfs umount names for a busy mount)", export=False),
    ]


class InFlight:
    def __init__(self) -> None:
        self._keys = itertools.count()
        self._requests: dict[int, tuple[int, str, float]] = {}  # key -> (pid, op, since); insertion = age order

    def begin(self, pid: int, op: str) -> int:
        key = next(self._keys)
        self._requests[key] = (pid, op, time.monotonic())
        return key

    def end(self, key: int) -> None:
        del self._requests[key]

    def status(self) -> RequestsStatus:
        now = time.monotonic()
        listed: list[RequestStatus] = [
            {"pid": pid, "op": op, "seconds": round(now - since, 3)}
            for pid, op, since in itertools.islice(self._requests.values(), _LISTED)
        ]
        return {
            "in_flight": len(self._requests),
            "oldest_seconds": listed[0]["seconds"] if listed else 0.0,
            "waiting": listed,
        }
