"""The PFS model: its configuration (the curve t(gamma), latencies), the active readers that make
gamma, the one shared channel, and the server-side counters; pure bookkeeping, no I/O."""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass, field
from typing import Any

PROTOCOL_VERSION = 1
MB = 1_000_000
DEFAULT_CURVE = "1:20,2:35,4:50,8:60"
DEFAULT_OPEN_LATENCY_MS = 3.0
DEFAULT_READ_LATENCY_MS = 0.5
DEFAULT_META_LATENCY_MS = 0.0
DEFAULT_ACTIVE_WINDOW_MS = 20.0
DEFAULT_THREADS = 16
DEFAULT_ATTR_TIMEOUT_S = 1.0
DEFAULT_NICE = -5
LASSEN_CURVE = "1:330,2:730,4:1540,8:2870"

# Exit codes of the CLI (also in --help).
EXIT_OK = 0
EXIT_INTERNAL = 1
EXIT_USAGE = 2
EXIT_OPTION = 3
EXIT_BACKING = 4
EXIT_MOUNTPOINT = 5
EXIT_CONTROL = 6
EXIT_UNREACHABLE = 7


class PfsemuError(Exception):
    """A problem the user can cause: reported as one line with :attr:`code` as the exit status."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


# ----------------------------------------------------------------------------------------------------
# Configuration
# ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Curve:
    """Aggregate PFS throughput t(gamma) in bytes/s, from (gamma, MB/s) points."""

    points: tuple[tuple[int, float], ...]

    @classmethod
    def parse(cls, text: str) -> Curve:
        """Parse ``"1:20,2:35,4:50,8:60"`` (gamma:MB/s, gamma strictly increasing, rates > 0)."""
        points: list[tuple[int, float]] = []
        for item in text.split(","):
            gamma_s, sep, rate_s = item.strip().partition(":")
            try:
                gamma, rate = int(gamma_s), float(rate_s)
            except ValueError:
                gamma, rate = 0, 0.0
            if not sep or gamma < 1 or not (rate > 0 and math.isfinite(rate)):
                raise PfsemuError(
                    f"bad curve point {item.strip()!r} in {text!r}: want GAMMA:MBPS, GAMMA >= 1, MBPS > 0",
                    EXIT_OPTION,
                )
            if points and gamma <= points[-1][0]:
                raise PfsemuError(f"curve {text!r}: gamma values must increase strictly", EXIT_OPTION)
            points.append((gamma, rate))
        return cls(tuple(points))

    def mbps(self, gamma: int) -> float:
        """t(gamma) in MB/s: linear between points, flat outside them."""
        pts = self.points
        if gamma <= pts[0][0]:
            return pts[0][1]
        for (g0, r0), (g1, r1) in itertools.pairwise(pts):
            if gamma <= g1:
                return r0 + (r1 - r0) * (gamma - g0) / (g1 - g0)
        return pts[-1][1]

    def bytes_per_s(self, gamma: int) -> float:
        return self.mbps(gamma) * MB

    def __str__(self) -> str:
        return ",".join(f"{g}:{r:g}" for g, r in self.points)


@dataclass(frozen=True)
class EmulatorConfig:
    """The emulated PFS's parameters; every benchmark result prints :meth:`describe`."""

    curve: Curve = field(default_factory=lambda: Curve.parse(DEFAULT_CURVE))
    open_latency_s: float = DEFAULT_OPEN_LATENCY_MS / 1e3
    read_latency_s: float = DEFAULT_READ_LATENCY_MS / 1e3
    meta_latency_s: float = DEFAULT_META_LATENCY_MS / 1e3
    active_window_s: float = DEFAULT_ACTIVE_WINDOW_MS / 1e3
    threads: int = DEFAULT_THREADS
    attr_timeout_s: float = DEFAULT_ATTR_TIMEOUT_S
    nice: int = DEFAULT_NICE

    def to_json(self) -> dict[str, Any]:
        return {
            "curve": [[g, r] for g, r in self.curve.points],
            "open_latency_ms": self.open_latency_s * 1e3,
            "read_latency_ms": self.read_latency_s * 1e3,
            "meta_latency_ms": self.meta_latency_s * 1e3,
            "active_window_ms": self.active_window_s * 1e3,
            "threads": self.threads,
            "attr_timeout_s": self.attr_timeout_s,
            "nice": self.nice,
        }

    def describe(self) -> str:
        return describe_config(self.to_json())


def describe_config(cfg: dict[str, Any]) -> str:
    """One line naming the emulator parameters of a :meth:`EmulatorConfig.to_json` dict."""
    curve = ",".join(f"{g}:{r:g}" for g, r in cfg["curve"])
    return (
        f"pfsemu t(gamma)={curve} MB/s, open {cfg['open_latency_ms']:g} ms, "
        f"read {cfg['read_latency_ms']:g} ms, meta {cfg['meta_latency_ms']:g} ms, "
        f"active window {cfg['active_window_ms']:g} ms"
    )


# ----------------------------------------------------------------------------------------------------
# Active readers, the shared channel
# ----------------------------------------------------------------------------------------------------


class ActiveReaders:
    """gamma: handles with a read in flight, or whose last read ended less than ``window`` ago."""

    def __init__(self, window_s: float) -> None:
        self._window = window_s
        self._inflight: dict[int, int] = {}
        self._idle_since: dict[int, float] = {}

    def begin(self, fh: int) -> None:
        self._idle_since.pop(fh, None)
        self._inflight[fh] = self._inflight.get(fh, 0) + 1

    def end(self, fh: int, now: float) -> None:
        left = self._inflight.get(fh, 0) - 1
        if left > 0:
            self._inflight[fh] = left
            return
        self._inflight.pop(fh, None)
        self._idle_since[fh] = now

    def drop(self, fh: int) -> None:
        self._inflight.pop(fh, None)
        self._idle_since.pop(fh, None)

    def count(self, now: float) -> int:
        horizon = now - self._window
        stale = [fh for fh, t in self._idle_since.items() if t < horizon]
        for fh in stale:
            del self._idle_since[fh]
        return len(self._inflight) + len(self._idle_since)


class SharedChannel:
    """The PFS data path as a virtual clock: each read books ``n / t(gamma)`` seconds of it, FIFO."""

    def __init__(self, curve: Curve) -> None:
        self._curve = curve
        self._free_at = -math.inf
        self.busy_s = 0.0

    def reserve(self, arrival: float, nbytes: int, gamma: int) -> float:
        """Book the channel for a read that arrived at ``arrival``; return when its transfer ends."""
        duration = nbytes / self._curve.bytes_per_s(gamma)
        end = max(arrival, self._free_at) + duration
        self._free_at = end
        self.busy_s += duration
        return end


# ----------------------------------------------------------------------------------------------------
# Counters (server side)
# ----------------------------------------------------------------------------------------------------


class Tally:
    __slots__ = ("bytes", "first_open", "opens", "reads")

    def __init__(self) -> None:
        self.opens = 0
        self.reads = 0
        self.bytes = 0
        self.first_open: float | None = None  # files only: time.monotonic() when its first open completed

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"opens": self.opens, "reads": self.reads, "bytes": self.bytes}
        if self.first_open is not None:
            out["first_open"] = self.first_open
        return out


class ServerCounters:
    """Everything pfsemu counts; only touched on the trio thread, so a snapshot is consistent."""

    def __init__(self) -> None:
        self.reset_at = time.monotonic()
        self.total = Tally()
        self.open_errors = 0
        self.meta_ops = 0
        self.thread_reads = 0
        self.files: dict[str, Tally] = {}
        self.clients: dict[int, Tally] = {}
        self.client_comm: dict[int, str] = {}
        self.comms: dict[str, Tally] = {}
        self.reads_by_gamma: dict[int, int] = {}
        self.channel_busy_s = 0.0
        self.lag_max_s = 0.0
        self.lag_sum_s = 0.0
        self.lag_samples = 0

    @staticmethod
    def _tally(table: dict[Any, Tally], key: Any) -> Tally:
        tally = table.get(key)
        if tally is None:
            tally = table[key] = Tally()
        return tally

    def count_open(self, path: str, tgid: int, comm: str) -> None:
        self.total.opens += 1
        file = self._tally(self.files, path)
        if file.first_open is None:
            # CLOCK_MONOTONIC is one clock for every process of the machine: a client that notes when
            # it opened a file can tell whether the PFS had served that file before (tests' outside
            # measure of what a cache above predicted).
            file.first_open = time.monotonic()
        file.opens += 1
        self._tally(self.clients, tgid).opens += 1
        self.client_comm[tgid] = comm
        self._tally(self.comms, comm).opens += 1

    def count_read(self, path: str, tgid: int, comm: str, nbytes: int, gamma: int) -> None:
        for tally in (
            self.total,
            self._tally(self.files, path),
            self._tally(self.clients, tgid),
            self._tally(self.comms, comm),
        ):
            tally.reads += 1
            tally.bytes += nbytes
        self.client_comm.setdefault(tgid, comm)
        self.reads_by_gamma[gamma] = self.reads_by_gamma.get(gamma, 0) + 1
