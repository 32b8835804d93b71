"""Polling with a deadline, for threads and processes that cannot await (the CLI, the daemon's startup
and shutdown, tools and tests).

Code on trio uses ``trio.move_on_after`` / ``trio.fail_after`` instead: a blocking sleep there would
stall the event loop.

The predicate is asked once more at the deadline itself (the last sleep is cut short), so a
condition that comes true just before the deadline is not reported as a timeout; exceptions the
predicate raises pass through unchanged (a dead mount is an answer, not a reason to keep polling).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

FIRST_DELAY_S = 0.01
MAX_DELAY_S = 0.2
"""The pause doubles from the first to the longest: quick answers come quickly, slow ones cost few polls."""


class WaitTimeout(TimeoutError):
    """A wait gave up; ``what`` says what was awaited, ``last`` is the predicate's last (falsy) answer."""

    def __init__(self, what: str, timeout: float, last: object) -> None:
        super().__init__(f"timed out after {timeout:g}s waiting for {what}")
        self.what = what
        self.timeout = timeout
        self.last = last


def wait_until(
    predicate: Callable[[], T | None],
    timeout: float,
    what: str | Callable[[], str],
    *,
    first_delay: float = FIRST_DELAY_S,
    max_delay: float = MAX_DELAY_S,
) -> T:
    """Call ``predicate`` until it returns something truthy and return that, for at most ``timeout`` s.

    Raises :class:`WaitTimeout`.  ``what`` may be a callable, asked only on timeout, when the
    description depends on the state the wait ended in (``"group still forming, 2 of 3 nodes"``).
    """
    deadline = time.monotonic() + timeout
    delay = first_delay
    while True:
        value = predicate()
        if value:
            return value
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise WaitTimeout(what if isinstance(what, str) else what(), timeout, value)
        time.sleep(min(delay, remaining))
        delay = min(delay * 2, max_delay)
