"""Precise sleeps for the emulated delays: a ``timerfd`` for the earliest deadline, corrected for the
VM's wake-up lateness (trio's own sleeps round up to whole milliseconds; the package docstring says why)."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import heapq
import itertools
import math
import os

import trio

# ----------------------------------------------------------------------------------------------------
# Scheduling: precise sleeps, active readers, the shared channel
# ----------------------------------------------------------------------------------------------------

_CLOCK_MONOTONIC = 1


class _Timespec(ctypes.Structure):
    _fields_ = (("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long))


class _Itimerspec(ctypes.Structure):
    _fields_ = (("it_interval", _Timespec), ("it_value", _Timespec))


class PreciseTimer:
    """Sleeps on the trio loop that end within tens of microseconds of their deadline.

    trio waits in ``epoll_wait`` with a millisecond timeout rounded up, which would add 0-1 ms to
    every emulated latency.  One ``timerfd`` (CLOCK_MONOTONIC, which trio's clock also reads) is armed
    for the earliest pending deadline; :meth:`run` waits for it to become readable and wakes every
    sleeper that is due.  Sleepers that are cancelled leave a stale entry that fires harmlessly.

    Even so, a wake-up lands 0.1-0.3 ms late on a VM (kernel wake-up latency plus trio's scheduling
    of the woken task).  The timer therefore fires ``bias`` early, and every sleeper feeds its own
    error back into ``bias`` (an integral controller), so sleeps end on their deadline on average
    instead of always late.  ``bias`` is clamped to [0, 0.5 ms]: a busy machine must not make it
    run away.
    """

    _EARLY_S = 20e-6  # wake a sleeper this early rather than re-arming for a few microseconds
    _GAIN = 0.1
    _MAX_BIAS_S = 0.5e-3

    def __init__(self) -> None:
        self._libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        fd = self._libc.timerfd_create(_CLOCK_MONOTONIC, os.O_NONBLOCK | os.O_CLOEXEC)
        if fd < 0:
            err = ctypes.get_errno()
            raise OSError(err, f"timerfd_create: {os.strerror(err)}")
        self._fd: int = fd
        self._heap: list[tuple[float, int, trio.Event]] = []
        self._seq = itertools.count()
        self._armed_for = math.inf
        self.bias_s = 0.0

    def close(self) -> None:
        os.close(self._fd)

    async def sleep_until(self, deadline: float) -> None:
        if deadline - self.bias_s - trio.current_time() <= self._EARLY_S:
            await trio.lowlevel.checkpoint()
            return
        event = trio.Event()
        heapq.heappush(self._heap, (deadline, next(self._seq), event))
        if deadline < self._armed_for:
            self._arm(deadline)
        await event.wait()
        error = trio.current_time() - deadline
        self.bias_s = min(max(self.bias_s + self._GAIN * error, 0.0), self._MAX_BIAS_S)

    def _arm(self, deadline: float) -> None:
        delay = max(deadline - self.bias_s - trio.current_time(), 1e-6)
        spec = _Itimerspec()
        spec.it_value.tv_sec = int(delay)
        spec.it_value.tv_nsec = max(1, int((delay - int(delay)) * 1e9))
        if self._libc.timerfd_settime(self._fd, 0, ctypes.byref(spec), None) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"timerfd_settime: {os.strerror(err)}")
        self._armed_for = deadline

    async def run(self) -> None:
        while True:
            await trio.lowlevel.wait_readable(self._fd)
            with contextlib.suppress(BlockingIOError):
                os.read(self._fd, 8)
            self._armed_for = math.inf
            now = trio.current_time()
            while self._heap and self._heap[0][0] <= now + self.bias_s + self._EARLY_S:
                heapq.heappop(self._heap)[2].set()
            if self._heap:
                self._arm(self._heap[0][0])
