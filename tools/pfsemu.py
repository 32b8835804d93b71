"""pfsemu: an emulated, contended parallel filesystem (PFS) for one machine.

On a laptop or a 2-core CI box there is no Lustre to contend for, so every claim that seerfs is faster
than reading the PFS, or that it read the PFS about once per file, needs a shared *slow* filesystem
underneath whose own counters say how much was read.  pfsemu is that filesystem: a read-only FUSE
passthrough of a directory that

* delays every open by ``open_latency`` and every read request by at least ``read_latency``
  (concurrent sleeps on the event loop: many clients wait at once, as on a real PFS);
* shares one aggregate bandwidth among all active readers: with gamma active readers the channel
  moves ``t(gamma)`` bytes per second in total (NoPFS section 4: a PFS reader gets ``t(gamma)/gamma``);
* counts what it served -- opens, read requests and bytes, in total, per file and per client process
  -- and answers those counters on a Unix socket, outside the served tree, where they can be read and
  reset at any time.  Benchmarks and tests take PFS traffic from here, never from seerfs.

The model, precisely
--------------------
*Reader.*  A reader is an open file handle (one ``open()`` in some process).  It is *active* from the
arrival of a read request on it until ``active_window`` after its last read request completed, or
until it is released, whichever comes first.  gamma is the number of active readers when a read is
scheduled (the reading handle included).  Handles that are open but idle do not count, so a
DataLoader worker that opens, reads and closes one file after another counts once, and a seerfs
daemon reading with eight threads counts eight times, like eight Lustre RPC streams.

*Channel.*  One virtual clock ``free_at`` stands for the PFS's shared data path.  A read of ``n``
bytes that arrived at ``a`` is granted the interval ``[max(a, free_at), max(a, free_at) + n /
t(gamma)]`` and ``free_at`` moves to its end; the reply is sent at ``max(a + read_latency, end)``.
This is a token bucket whose depth is one request: no credit accrues while the channel idles, so a
burst after a pause is not faster than the curve.  With gamma readers reading back to back the
channel is always booked ahead, the aggregate throughput is exactly ``t(gamma)`` and each reader gets
``t(gamma)/gamma`` on average (grants are first come, first served).  The per-read latency overlaps
the transfer rather than adding to it, so ``t(gamma)`` is the throughput a benchmark measures, as
NoPFS's Lassen figures were (a small read still waits at least ``read_latency``).  A read at or past
the end of the file returns at once: a PFS client answers it from the file size it already knows.

*Curve.*  ``t(gamma)`` is a table of points, linearly interpolated between points and flat beyond
the first and the last.  MB means 10**6 bytes.

*Exact counting.*  Files are opened with ``direct_io``: the kernel keeps no page cache for them,
does no readahead, and turns every read() of a client into read requests that reach pfsemu.  So
every byte a reader gets passed through pfsemu exactly once and the byte counter equals the bytes
summed by the readers, opening the same file again re-reads the PFS (a PFS whose client cache holds
nothing useful: the dataset is larger than RAM, NoPFS's setting).  Opens are counted once per
successful open.  Bytes are attributed to the process that opened the handle (the kernel does not
say which process issued a read), identified by its thread-group id and ``/proc/PID/comm``.  mmap
of served files is not supported (direct_io).

*Timing.*  trio's event loop sleeps in ``epoll_wait``, whose timeout Python rounds *up* to whole
milliseconds, so ``trio.sleep(0.0005)`` lasts 1-2 ms.  Latencies here are sub-millisecond and a 15 %
budget is tight, so all emulated delays go through :class:`PreciseTimer`, which arms a ``timerfd``
(nanosecond resolution) for the earliest deadline and corrects for the VM's wake-up lateness, so
sleeps end on their deadline on average (about +-0.1 ms).  What a client observes adds the FUSE
round trip outside the model: about 0.1 ms per open, and 0.3-1 ms per read request of 128 KiB-1 MiB
(copies through /dev/fuse), which only shows while the channel idles between requests: a single
sequential reader gets about 2 % less than t(1); two or more keep the channel booked and get t(gamma).

*CPU.*  pfsemu must not be the bottleneck it emulates, nor eat the CPU of the readers it serves on a
2-core box; measured here, every wake-up of the trio loop costs 0.1-0.2 ms of CPU, more than the
system calls it would offload.  So:

* a read first tries ``preadv(RWF_NOWAIT)`` inline, which copies what the page cache holds and
  never waits for a disk; if data is missing (or the filesystem lacks RWF_NOWAIT) the read goes to a
  worker thread under a ``trio.CapacityLimiter`` (``thread_reads`` counts these).  A backing
  directory on tmpfs/ramfs is read inline with plain ``pread``: memory never waits for a disk;
* ``open``/``fstat`` of a backing file, ``lstat`` (lookup, getattr) and the ``/proc`` lookup of the
  client stay on the loop: microseconds on a local backing directory, less than a thread hop;
  directory scans, which grow with the directory, run in a thread;
* FLUSH is answered ENOSYS once, so the kernel stops sending one per close();
* the process runs at nice -5 (``--nice``) where permitted: a real PFS does not share the clients'
  cores, so readers that keep both cores busy must not stretch its delays.

A watchdog task measures how late the loop wakes (``loop_lag_ms`` in the counters: blocking work
on the loop shows up there) and the counters carry the process's CPU seconds; the calibration
benchmark (tools/bench_pfsemu) prints both.

Defaults and how they relate to NoPFS
-------------------------------------
NoPFS's simulator uses Lassen's measured PFS curve t(1, 2, 4, 8) = 330, 730, 1540, 2870 MB/s (about
linear in gamma: each Lassen client has its own share of thousands of OST threads).  Scaled to a
2-core box the defaults are t(1, 2, 4, 8) = 20, 35, 50, 60 MB/s: t(1) is Lassen's / 16.5, and the
growth with gamma is compressed from 8.7x to 3x because here every reader, every seerfs daemon and
the emulator share two cores -- an emulated PFS that kept scaling would end up bounded by the CPU,
not by the model.  The per-reader share t(gamma)/gamma = 20, 17.5, 12.5, 7.5 MB/s falls with gamma,
the regime in which NoPFS says PFS contention must be avoided.  Latency: 3 ms per open (a metadata
RPC to a loaded MDS) and 0.5 ms per read request (an OST RPC); metadata lookups are free by default.

Limits
------
One channel for the whole PFS (no striping over OSTs, no per-client NIC limit); no client cache
(every open re-reads); no mmap of served files; writes fail with EROFS; the inode table never
forgets a path (datasets, not churning trees).

Control protocol
----------------
A Unix stream socket (``--control``; default :func:`default_control_path` of the mountpoint).  The
client sends one line, the server answers one JSON line and closes: ``ping``, ``stats`` (totals,
gauges, per-client counters), ``stats files`` (also per-file counters), ``reset`` (answers the
counters as they were, then zeroes them).  :class:`PfsemuClient` speaks it; ``pfsemu stats`` and
``pfsemu reset`` are the command-line form.  The JSON layout is documented at :class:`PfsStats`.
From Python, :func:`running` starts an emulator in a subprocess and always stops it (tests use it
through tests/pfsemu_fixture.py, benchmarks directly).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import ctypes.util
import errno
import hashlib
import heapq
import itertools
import json
import logging
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar, cast

import pyfuse3
import trio

log = logging.getLogger("pfsemu")

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

T = TypeVar("T")


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
    __slots__ = ("bytes", "opens", "reads")

    def __init__(self) -> None:
        self.opens = 0
        self.reads = 0
        self.bytes = 0

    def to_json(self) -> dict[str, int]:
        return {"opens": self.opens, "reads": self.reads, "bytes": self.bytes}


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
        self._tally(self.files, path).opens += 1
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


# ----------------------------------------------------------------------------------------------------
# Inodes and handles
# ----------------------------------------------------------------------------------------------------


class InodeTable:
    """Inode number <-> path relative to the backing root (bytes; b"" is the root).

    Entries are never forgotten: the emulator serves datasets, not churning trees, and a stable
    number per path keeps the table trivially correct against kernel lookup counts.
    """

    def __init__(self) -> None:
        self._paths: dict[int, bytes] = {pyfuse3.ROOT_INODE: b""}
        self._inodes: dict[bytes, int] = {b"": pyfuse3.ROOT_INODE}
        self._next = pyfuse3.ROOT_INODE + 1

    def path(self, inode: int) -> bytes:
        try:
            return self._paths[inode]
        except KeyError:
            raise pyfuse3.FUSEError(errno.ESTALE) from None

    def inode(self, path: bytes) -> int:
        ino = self._inodes.get(path)
        if ino is None:
            ino = self._inodes[path] = self._next
            self._paths[ino] = path
            self._next += 1
        return ino

    def child(self, parent: int, name: bytes) -> bytes:
        base = self.path(parent)
        if name == b".":
            return base
        if name == b"..":
            return base.rpartition(b"/")[0]
        return base + b"/" + name if base else name


@dataclass
class OpenFile:
    fd: int
    size: int  # at open: tells a short non-blocking read from the end of the file
    path: str
    tgid: int
    comm: str


def _client_of(pid: int) -> tuple[int, str]:
    """(thread-group id, process name) of the task that sent a request; (pid, "?") once it is gone.

    The kernel reports the calling *thread*; counters are per process, so map it to its tgid.
    """
    tgid = pid
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"Tgid:"):
                    tgid = int(line.split()[1])
                    break
        with open(f"/proc/{tgid}/comm", "rb") as f:
            comm = f.read().strip().decode("utf-8", "replace")
    except (OSError, ValueError):
        return tgid, "?"
    return tgid, comm


def _open_backing(path: bytes) -> tuple[int, int]:
    """Open for the loop's inline reads: O_NOATIME, since the first read of a freshly written file
    would otherwise update atime through the filesystem journal and can wait behind writeback."""
    flags = os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW
    try:
        fd = os.open(path, flags | os.O_NOATIME)
    except PermissionError:  # O_NOATIME needs ownership or CAP_FOWNER
        fd = os.open(path, flags)
    try:
        return fd, os.fstat(fd).st_size
    except OSError:
        os.close(fd)
        raise


def _pread_nowait(fd: int, size: int, off: int) -> memoryview | None:
    """Read what the page cache holds without ever waiting for a disk: None if that is nothing.

    Raises :class:`_NoWaitUnsupported` where the backing filesystem lacks RWF_NOWAIT (tmpfs).
    """
    buf = bytearray(size)
    try:
        n = os.preadv(fd, [buf], off, os.RWF_NOWAIT)
    except BlockingIOError:
        return None
    except OSError as exc:
        if exc.errno in (errno.EOPNOTSUPP, errno.EINVAL):
            raise _NoWaitUnsupported from None
        raise
    return memoryview(buf)[:n]


class _NoWaitUnsupported(Exception):
    pass


_MEMORY_FS_MAGIC = (0x01021994, 0x858458F6)  # tmpfs, ramfs


def _is_memory_fs(path: bytes) -> bool:
    """True when ``path`` lives on tmpfs/ramfs, whose reads never wait for a disk (swap aside)."""
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    buf = ctypes.create_string_buffer(256)  # struct statfs is 120 bytes on x86_64; f_type comes first
    if libc.statfs(path, buf) != 0:
        return False
    return ctypes.c_long.from_buffer(buf).value in _MEMORY_FS_MAGIC


def _scan_dir(path: bytes) -> list[tuple[bytes, os.stat_result]]:
    out: list[tuple[bytes, os.stat_result]] = []
    with os.scandir(path) as it:
        for entry in it:
            with contextlib.suppress(FileNotFoundError):
                out.append((entry.name, entry.stat(follow_symlinks=False)))
    out.sort(key=lambda item: item[0])
    return out


def _fuse_error(exc: Exception) -> pyfuse3.FUSEError:
    if isinstance(exc, pyfuse3.FUSEError):
        return exc
    if isinstance(exc, OSError) and exc.errno:
        return pyfuse3.FUSEError(exc.errno)
    log.exception("unexpected error in a request handler")
    return pyfuse3.FUSEError(errno.EIO)


# ----------------------------------------------------------------------------------------------------
# The filesystem
# ----------------------------------------------------------------------------------------------------


class PfsemuOperations(pyfuse3.Operations):
    """Read-only passthrough of ``backing`` with the latency, bandwidth and counting model above."""

    def __init__(self, backing: Path, config: EmulatorConfig, timer: PreciseTimer) -> None:
        super().__init__()
        self._root = os.fsencode(os.path.realpath(backing))
        self.config = config
        self._timer = timer
        self._limiter = trio.CapacityLimiter(config.threads)
        self._nowait = hasattr(os, "RWF_NOWAIT")
        self._memory_fs = _is_memory_fs(self._root)
        self._inodes = InodeTable()
        self._files: dict[int, OpenFile] = {}
        self._dirs: dict[int, list[tuple[bytes, int, os.stat_result]]] = {}
        self._fh = itertools.count(1)
        self._active = ActiveReaders(config.active_window_s)
        self._channel = SharedChannel(config.curve)
        self.counters = ServerCounters()

    # -- helpers -------------------------------------------------------------------------------------

    def _backing(self, rel: bytes) -> bytes:
        return self._root + b"/" + rel if rel else self._root

    def _entry(self, inode: int, st: os.stat_result) -> pyfuse3.EntryAttributes:
        attr = pyfuse3.EntryAttributes()
        attr.st_ino = inode
        attr.generation = 0
        attr.entry_timeout = self.config.attr_timeout_s
        attr.attr_timeout = self.config.attr_timeout_s
        attr.st_mode = st.st_mode
        attr.st_nlink = st.st_nlink
        attr.st_uid = st.st_uid
        attr.st_gid = st.st_gid
        attr.st_rdev = st.st_rdev
        attr.st_size = st.st_size
        attr.st_blksize = st.st_blksize
        attr.st_blocks = st.st_blocks
        attr.st_atime_ns = st.st_atime_ns
        attr.st_mtime_ns = st.st_mtime_ns
        attr.st_ctime_ns = st.st_ctime_ns
        return attr

    async def _thread(self, fn: Callable[..., T], *args: Any) -> T:
        return await trio.to_thread.run_sync(fn, *args, limiter=self._limiter)

    async def _meta_delay(self, arrival: float) -> None:
        self.counters.meta_ops += 1
        if self.config.meta_latency_s > 0:
            await self._timer.sleep_until(arrival + self.config.meta_latency_s)

    # -- metadata ------------------------------------------------------------------------------------

    async def lookup(
        self, parent_inode: pyfuse3.InodeT, name: pyfuse3.FileNameT, ctx: pyfuse3.RequestContext
    ) -> pyfuse3.EntryAttributes:
        arrival = trio.current_time()
        try:
            rel = self._inodes.child(parent_inode, name)
            st = os.lstat(self._backing(rel))
        except Exception as exc:
            raise _fuse_error(exc) from None
        await self._meta_delay(arrival)
        return self._entry(self._inodes.inode(rel), st)

    async def getattr(self, inode: pyfuse3.InodeT, ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        arrival = trio.current_time()
        try:
            st = os.lstat(self._backing(self._inodes.path(inode)))
        except Exception as exc:
            raise _fuse_error(exc) from None
        await self._meta_delay(arrival)
        return self._entry(inode, st)

    async def readlink(self, inode: pyfuse3.InodeT, ctx: pyfuse3.RequestContext) -> pyfuse3.FileNameT:
        arrival = trio.current_time()
        try:
            target = os.readlink(self._backing(self._inodes.path(inode)))
        except Exception as exc:
            raise _fuse_error(exc) from None
        await self._meta_delay(arrival)
        return target

    async def opendir(self, inode: pyfuse3.InodeT, ctx: pyfuse3.RequestContext) -> pyfuse3.FileHandleT:
        arrival = trio.current_time()
        try:
            rel = self._inodes.path(inode)
            entries = await self._thread(_scan_dir, self._backing(rel))
        except Exception as exc:
            raise _fuse_error(exc) from None
        await self._meta_delay(arrival)
        fh = next(self._fh)
        self._dirs[fh] = [(name, self._inodes.inode(rel + b"/" + name if rel else name), st) for name, st in entries]
        return fh

    async def readdir(self, fh: pyfuse3.FileHandleT, start_id: int, token: pyfuse3.ReaddirToken) -> None:
        entries = self._dirs.get(fh)
        if entries is None:
            raise pyfuse3.FUSEError(errno.EBADF)
        for index in range(start_id, len(entries)):
            name, inode, st = entries[index]
            if not pyfuse3.readdir_reply(token, name, self._entry(inode, st), index + 1):
                break

    async def releasedir(self, fh: pyfuse3.FileHandleT) -> None:
        self._dirs.pop(fh, None)

    async def statfs(self, ctx: pyfuse3.RequestContext) -> pyfuse3.StatvfsData:
        try:
            sv = os.statvfs(self._root)
        except Exception as exc:
            raise _fuse_error(exc) from None
        data = pyfuse3.StatvfsData()
        for name in ("f_bsize", "f_frsize", "f_blocks", "f_bfree", "f_bavail"):
            setattr(data, name, getattr(sv, name))
        for name in ("f_files", "f_ffree", "f_favail", "f_namemax"):
            setattr(data, name, getattr(sv, name))
        return data

    async def forget(self, inode_list: Sequence[tuple[pyfuse3.InodeT, int]]) -> None:
        return None

    # -- data ----------------------------------------------------------------------------------------

    async def open(self, inode: pyfuse3.InodeT, flags: pyfuse3.FlagT, ctx: pyfuse3.RequestContext) -> pyfuse3.FileInfo:
        arrival = trio.current_time()
        if flags & os.O_ACCMODE != os.O_RDONLY or flags & os.O_TRUNC:
            raise pyfuse3.FUSEError(errno.EROFS)
        try:
            rel = self._inodes.path(inode)
            fd, size = _open_backing(self._backing(rel))
            tgid, comm = _client_of(ctx.pid)
        except Exception as exc:
            self.counters.open_errors += 1
            await self._timer.sleep_until(arrival + self.config.open_latency_s)
            raise _fuse_error(exc) from None
        try:
            await self._timer.sleep_until(arrival + self.config.open_latency_s)
        except BaseException:
            os.close(fd)
            raise
        fh = next(self._fh)
        path = os.fsdecode(rel)
        self._files[fh] = OpenFile(fd, size, path, tgid, comm)
        self.counters.count_open(path, tgid, comm)
        return pyfuse3.FileInfo(fh=fh, direct_io=True, keep_cache=False)

    async def read(self, fh: pyfuse3.FileHandleT, off: int, size: int) -> bytes:
        arrival = trio.current_time()
        handle = self._files.get(fh)
        if handle is None:
            raise pyfuse3.FUSEError(errno.EBADF)
        self._active.begin(fh)
        try:
            try:
                data = await self._pread(handle, size, off)
            except Exception as exc:
                raise _fuse_error(exc) from None
            gamma = self._active.count(trio.current_time())
            if data:  # at EOF a PFS client answers from the size it knows: no RPC, no delay
                end = self._channel.reserve(arrival, len(data), gamma)
                await self._timer.sleep_until(max(arrival + self.config.read_latency_s, end))
        finally:
            self._active.end(fh, trio.current_time())
        self.counters.count_read(handle.path, handle.tgid, handle.comm, len(data), gamma)
        return data

    async def _pread(self, handle: OpenFile, size: int, off: int) -> bytes:
        """Cached data inline (a copy costs less CPU than a thread hop), anything else in a thread."""
        if self._memory_fs:
            return os.pread(handle.fd, size, off)
        if self._nowait:
            try:
                view = _pread_nowait(handle.fd, size, off)
            except _NoWaitUnsupported:
                self._nowait = False
                view = None
            if view is not None and (len(view) == size or off + len(view) >= handle.size):
                # pyfuse3 replies from any contiguous buffer (PyObject_GetBuffer): no copy to bytes.
                return cast(bytes, view)
        self.counters.thread_reads += 1
        return await self._thread(os.pread, handle.fd, size, off)

    async def flush(self, fh: pyfuse3.FileHandleT) -> None:
        # ENOSYS makes the kernel stop sending FLUSH on every close (fuse_flush sets no_flush):
        # a read-only passthrough has nothing to flush and each request costs event-loop CPU.
        raise pyfuse3.FUSEError(errno.ENOSYS)

    async def release(self, fh: pyfuse3.FileHandleT) -> None:
        handle = self._files.pop(fh, None)
        self._active.drop(fh)
        if handle is not None:
            os.close(handle.fd)

    # -- observation ---------------------------------------------------------------------------------

    def close_all(self) -> None:
        for handle in self._files.values():
            with contextlib.suppress(OSError):
                os.close(handle.fd)
        self._files.clear()

    def snapshot(self, *, files: bool, started_at: float, backing: str, mountpoint: str) -> dict[str, Any]:
        """The counters as JSON-able data (layout: :class:`PfsStats`)."""
        c = self.counters
        now = time.monotonic()
        cpu = os.times()
        snap: dict[str, Any] = {
            "version": PROTOCOL_VERSION,
            "emulator": {
                "pid": os.getpid(),
                "backing": backing,
                "mountpoint": mountpoint,
                "uptime_s": now - started_at,
                "cpu_s": cpu.user + cpu.system,
                "nice": os.getpriority(os.PRIO_PROCESS, 0),
            },
            "config": self.config.to_json(),
            "since_reset_s": now - c.reset_at,
            "totals": {
                **c.total.to_json(),
                "open_errors": c.open_errors,
                "meta_ops": c.meta_ops,
                "thread_reads": c.thread_reads,
                "channel_busy_s": self._channel.busy_s - c.channel_busy_s,
            },
            "gauges": {
                "open_handles": len(self._files),
                "active_readers": self._active.count(trio.current_time()),
            },
            "reads_by_gamma": {str(g): n for g, n in sorted(c.reads_by_gamma.items())},
            "loop_lag_ms": {
                "max": c.lag_max_s * 1e3,
                "mean": (c.lag_sum_s / c.lag_samples * 1e3) if c.lag_samples else 0.0,
            },
            "clients": [
                {"pid": pid, "comm": c.client_comm.get(pid, "?"), **t.to_json()} for pid, t in sorted(c.clients.items())
            ],
            "comms": {name: t.to_json() for name, t in sorted(c.comms.items())},
        }
        if files:
            snap["files"] = {path: t.to_json() for path, t in sorted(c.files.items())}
        return snap

    def reset_counters(self) -> None:
        busy = self._channel.busy_s
        self.counters = ServerCounters()
        self.counters.channel_busy_s = busy

    async def watch_loop_lag(self, period_s: float = 0.05) -> None:
        """Measure how late the event loop wakes: blocking work on it would show up here."""
        while True:
            deadline = trio.current_time() + period_s
            await self._timer.sleep_until(deadline)
            lag = max(0.0, trio.current_time() - deadline)
            c = self.counters
            c.lag_max_s = max(c.lag_max_s, lag)
            c.lag_sum_s += lag
            c.lag_samples += 1


# ----------------------------------------------------------------------------------------------------
# Control socket (server)
# ----------------------------------------------------------------------------------------------------


def default_control_path(mountpoint: str | os.PathLike[str]) -> Path:
    """Where ``serve`` puts the control socket when ``--control`` is not given (short: sun_path)."""
    digest = hashlib.sha1(os.fsencode(os.path.realpath(mountpoint))).hexdigest()[:12]
    return Path(f"/tmp/pfsemu-{os.getuid()}-{digest}.sock")


class ControlServer:
    def __init__(self, ops: PfsemuOperations, path: Path, backing: str, mountpoint: str) -> None:
        self._ops = ops
        self._path = path
        self._backing = backing
        self._mountpoint = mountpoint
        self._started = time.monotonic()
        self._sock = self._bind(path)

    @staticmethod
    def _bind(path: Path) -> socket.socket:
        if len(os.fsencode(path)) >= 108:
            raise PfsemuError(f"control socket path too long for a Unix socket: {path}", EXIT_CONTROL)
        if path.exists() or path.is_symlink():
            if PfsemuClient(path, timeout=1.0).ping():
                raise PfsemuError(f"another pfsemu already answers on {path}", EXIT_CONTROL)
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(os.fspath(path))  # before mounting: a bad socket path fails the start cleanly
            sock.listen(64)
        except OSError as exc:
            sock.close()
            raise PfsemuError(f"cannot listen on control socket {path}: {exc.strerror}", EXIT_CONTROL) from None
        return sock

    def close(self) -> None:
        self._sock.close()
        with contextlib.suppress(OSError):
            self._path.unlink()

    async def serve(self) -> None:
        listener = trio.SocketListener(trio.socket.from_stdlib_socket(self._sock))
        await trio.serve_listeners(self._handle, [listener])

    async def _handle(self, stream: trio.SocketStream) -> None:
        async with stream:
            try:
                with trio.fail_after(5):
                    request = await self._read_line(stream)
                    reply = self._dispatch(request)
                    payload = await trio.to_thread.run_sync(_dumps, reply)
                    await stream.send_all(payload)
            except (trio.TooSlowError, trio.BrokenResourceError, trio.ClosedResourceError):
                return

    @staticmethod
    async def _read_line(stream: trio.SocketStream) -> str:
        buf = b""
        while b"\n" not in buf and len(buf) < 4096:
            chunk = await stream.receive_some(4096)
            if not chunk:
                break
            buf += chunk
        return buf.split(b"\n", 1)[0].decode("ascii", "replace").strip()

    def _snapshot(self, files: bool) -> dict[str, Any]:
        return self._ops.snapshot(
            files=files, started_at=self._started, backing=self._backing, mountpoint=self._mountpoint
        )

    def _dispatch(self, request: str) -> dict[str, Any]:
        words = request.split()
        if words == ["ping"]:
            return {"version": PROTOCOL_VERSION, "ok": True, "pid": os.getpid()}
        if words == ["stats"]:
            return self._snapshot(files=False)
        if words == ["stats", "files"]:
            return self._snapshot(files=True)
        if words == ["reset"]:
            before = self._snapshot(files=True)
            self._ops.reset_counters()
            return before
        return {"version": PROTOCOL_VERSION, "error": f"unknown request {request!r}"}


def _dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode() + b"\n"


# ----------------------------------------------------------------------------------------------------
# Control socket (client)
# ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Counts:
    """Opens, read requests and bytes of one file, one process, one process name, or in total."""

    opens: int
    reads: int
    bytes: int

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Counts:
        return cls(int(d["opens"]), int(d["reads"]), int(d["bytes"]))


@dataclass(frozen=True)
class PfsStats:
    """A snapshot of the emulator's counters (since the last reset).

    ``files`` maps the path relative to the backing root (str, surrogateescape for undecodable
    names) to its :class:`Counts` and is empty unless requested (``stats(files=True)``).  ``pids``
    maps a client's thread-group id to (process name, counts); ``comms`` aggregates by process name.
    ``raw`` is the whole JSON reply: ``emulator`` (pid, backing, mountpoint, uptime_s, cpu_s),
    ``config`` (:meth:`EmulatorConfig.to_json`), ``since_reset_s``, ``totals`` (opens, reads, bytes,
    open_errors, meta_ops, channel_busy_s), ``gauges`` (open_handles, active_readers),
    ``reads_by_gamma`` (gamma as str -> read requests), ``loop_lag_ms`` (max, mean), ``clients``,
    ``comms`` and optionally ``files``.
    """

    opens: int
    reads: int
    bytes: int
    open_errors: int
    meta_ops: int
    files: dict[str, Counts]
    pids: dict[int, tuple[str, Counts]]
    comms: dict[str, Counts]
    reads_by_gamma: dict[int, int]
    active_readers: int
    open_handles: int
    cpu_s: float
    since_reset_s: float
    config: dict[str, Any]
    raw: dict[str, Any]

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> PfsStats:
        totals = d["totals"]
        return cls(
            opens=int(totals["opens"]),
            reads=int(totals["reads"]),
            bytes=int(totals["bytes"]),
            open_errors=int(totals["open_errors"]),
            meta_ops=int(totals["meta_ops"]),
            files={p: Counts.from_json(c) for p, c in d.get("files", {}).items()},
            pids={int(c["pid"]): (str(c["comm"]), Counts.from_json(c)) for c in d["clients"]},
            comms={name: Counts.from_json(c) for name, c in d["comms"].items()},
            reads_by_gamma={int(g): int(n) for g, n in d["reads_by_gamma"].items()},
            active_readers=int(d["gauges"]["active_readers"]),
            open_handles=int(d["gauges"]["open_handles"]),
            cpu_s=float(d["emulator"]["cpu_s"]),
            since_reset_s=float(d["since_reset_s"]),
            config=dict(d["config"]),
            raw=d,
        )

    def describe_config(self) -> str:
        return describe_config(self.config)


class PfsemuClient:
    """Reads and resets a running emulator's counters over its control socket (blocking, no trio)."""

    def __init__(self, control: str | os.PathLike[str], timeout: float = 10.0) -> None:
        self.control = Path(control)
        self.timeout = timeout

    def request(self, line: str) -> dict[str, Any]:
        """Send one request line, return the decoded JSON reply; OSError if nobody answers."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(self.timeout)
            sock.connect(os.fspath(self.control))
            sock.sendall(line.encode("ascii") + b"\n")
            chunks: list[bytes] = []
            while True:
                chunk = sock.recv(1 << 16)
                if not chunk:
                    break
                chunks.append(chunk)
        reply: dict[str, Any] = json.loads(b"".join(chunks))
        if "error" in reply:
            raise ValueError(f"pfsemu: {reply['error']}")
        return reply

    def ping(self) -> bool:
        try:
            return bool(self.request("ping").get("ok"))
        except (OSError, ValueError):
            return False

    def stats(self, files: bool = True) -> PfsStats:
        return PfsStats.from_json(self.request("stats files" if files else "stats"))

    def reset(self) -> PfsStats:
        """Zero the counters; returns them as they were just before (with per-file counts)."""
        return PfsStats.from_json(self.request("reset"))


# ----------------------------------------------------------------------------------------------------
# Serving
# ----------------------------------------------------------------------------------------------------


def _check_paths(backing: Path, mountpoint: Path) -> tuple[Path, Path]:
    if not backing.is_dir():
        raise PfsemuError(f"BACKING {backing} is not a directory", EXIT_BACKING)
    if not os.access(backing, os.R_OK | os.X_OK):
        raise PfsemuError(f"BACKING {backing} is not readable", EXIT_BACKING)
    if is_mounted(mountpoint):
        raise PfsemuError(f"MOUNTPOINT {mountpoint} is already a mount point", EXIT_MOUNTPOINT)
    if not mountpoint.is_dir():
        raise PfsemuError(f"MOUNTPOINT {mountpoint} is not a directory", EXIT_MOUNTPOINT)
    real_b, real_m = Path(os.path.realpath(backing)), Path(os.path.realpath(mountpoint))
    if real_m == real_b or real_b in real_m.parents:
        raise PfsemuError("MOUNTPOINT must not be inside BACKING (pfsemu would serve itself)", EXIT_MOUNTPOINT)
    if not os.path.exists("/dev/fuse"):
        raise PfsemuError("/dev/fuse is missing: FUSE is not available here", EXIT_MOUNTPOINT)
    return real_b, real_m


def _set_nice(nice: int) -> None:
    """Run at ``nice``: a PFS's servers are not on the client's CPUs, so readers that load both
    cores must not stretch the emulated latencies.  Called before any thread exists (Linux threads
    inherit it); without the privilege to raise priority the emulator says so and carries on."""
    try:
        os.setpriority(os.PRIO_PROCESS, 0, nice)
    except PermissionError:
        log.warning("pfsemu: cannot set nice %d (needs CAP_SYS_NICE); running at nice %d", nice, os.nice(0))


async def _serve_async(ops: PfsemuOperations, timer: PreciseTimer, control: ControlServer) -> None:
    async with trio.open_nursery() as nursery:
        nursery.start_soon(timer.run)
        nursery.start_soon(control.serve)
        nursery.start_soon(ops.watch_loop_lag)
        nursery.start_soon(_terminate_on_signal)
        await pyfuse3.main(min_tasks=4, max_tasks=128)
        nursery.cancel_scope.cancel()


async def _terminate_on_signal() -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
        async for signum in signals:
            log.info("pfsemu: %s, unmounting", signal.Signals(signum).name)
            pyfuse3.terminate()
            return


def serve(
    backing: Path,
    mountpoint: Path,
    config: EmulatorConfig,
    control_path: Path | None = None,
    on_ready: Callable[[str], None] | None = None,
) -> None:
    """Mount and serve until unmounted or sent SIGTERM/SIGINT/SIGHUP; raises :class:`PfsemuError`."""
    real_b, real_m = _check_paths(backing, mountpoint)
    _set_nice(config.nice)
    control_path = control_path or default_control_path(real_m)
    timer = PreciseTimer()
    ops = PfsemuOperations(real_b, config, timer)
    control = ControlServer(ops, control_path, os.fspath(real_b), os.fspath(real_m))
    options = set(pyfuse3.default_options) | {"ro", f"fsname=pfsemu:{real_b}", "subtype=pfsemu"}
    try:
        try:
            pyfuse3.init(ops, os.fspath(real_m), options)
        except RuntimeError as exc:
            raise PfsemuError(f"cannot mount {real_m}: {exc}", EXIT_MOUNTPOINT) from None
        ready = f"pfsemu: serving {real_b} at {real_m}, control {control_path}; {config.describe()}"
        log.info("%s", ready)
        if on_ready is not None:
            on_ready(ready)
        try:
            trio.run(_serve_async, ops, timer, control)
        finally:
            pyfuse3.close(unmount=True)
    finally:
        ops.close_all()
        control.close()
        timer.close()


def _serve_daemon(
    backing: Path, mountpoint: Path, config: EmulatorConfig, control: Path | None, log_path: Path | None
) -> int:
    """Fork; the parent returns once the child has mounted (or reports why it could not)."""
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid > 0:
        os.close(wfd)
        with os.fdopen(rfd, "rb") as r:
            message = r.read().decode("utf-8", "replace").strip()
        status, _, text = message.partition(" ")
        if status == "0":
            print(text)
            return EXIT_OK
        print(text or "pfsemu: the daemon exited before mounting", file=sys.stderr)
        return int(status) if status.isdigit() else EXIT_INTERNAL
    os.close(rfd)
    os.setsid()
    out = os.open(log_path or os.devnull, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(out, 1)
    os.dup2(out, 2)
    reported = False

    def ready(line: str) -> None:
        nonlocal reported
        os.write(wfd, f"0 {line}\n".encode())
        os.close(wfd)
        reported = True

    code = EXIT_OK
    try:
        serve(backing, mountpoint, config, control, on_ready=ready)
    except PfsemuError as exc:
        code = exc.code
        if not reported:
            os.write(wfd, f"{exc.code} pfsemu: {exc}\n".encode())
        log.error("pfsemu: %s", exc)
    except BaseException:
        code = EXIT_INTERNAL
        log.exception("pfsemu: internal error")
        if not reported:
            os.write(wfd, f"{EXIT_INTERNAL} pfsemu: internal error (see --log)\n".encode())
    os._exit(code)


# ----------------------------------------------------------------------------------------------------
# Running an emulator from Python (tests, benchmarks)
# ----------------------------------------------------------------------------------------------------

LAUNCHER = Path(__file__).resolve().with_name("pfsemu")


def fuse_unavailable_reason() -> str | None:
    """Why a FUSE mount cannot work here (for pytest skips), or None when it can."""
    if not os.path.exists("/dev/fuse"):
        return "/dev/fuse is missing"
    if shutil.which("fusermount3") is None:
        return "fusermount3 is not installed"
    return None


def is_mounted(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a mount point, per /proc/self/mountinfo.

    Not ``os.path.ismount``: that lstat()s the path, which fails on a FUSE mount whose daemon died
    ("Transport endpoint is not connected"), exactly the mount a teardown must still remove.
    """
    target = os.fsencode(os.path.abspath(path))
    with open("/proc/self/mountinfo", "rb") as f:
        for line in f:
            field = line.split(b" ")[4]
            if re.sub(rb"\\([0-7]{3})", lambda m: bytes([int(m.group(1), 8)]), field) == target:
                return True
    return False


def unmount(mountpoint: str | os.PathLike[str]) -> None:
    """Lazy unmount if ``mountpoint`` is a mount point; never raises (teardown helper)."""
    if is_mounted(mountpoint):
        subprocess.run(
            ["fusermount3", "-u", "-z", os.fspath(mountpoint)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            check=False,
        )


@dataclass
class RunningEmulator:
    """A pfsemu process serving :attr:`backing` at :attr:`mountpoint`; made by :func:`running`."""

    backing: Path
    mountpoint: Path
    control: Path
    log_path: Path
    process: subprocess.Popen[bytes]
    client: PfsemuClient

    def counters(self, files: bool = True) -> PfsStats:
        """The emulator's counters now (per-file counts too unless ``files=False``)."""
        return self.client.stats(files=files)

    def reset(self) -> PfsStats:
        """Zero the counters; returns them as they were."""
        return self.client.reset()

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""


@contextlib.contextmanager
def running(
    backing: str | os.PathLike[str],
    mountpoint: str | os.PathLike[str] | None = None,
    *,
    curve: str | None = None,
    open_latency_ms: float | None = None,
    read_latency_ms: float | None = None,
    meta_latency_ms: float | None = None,
    active_window_ms: float | None = None,
    extra_args: Sequence[str] = (),
    ready_timeout_s: float = 20.0,
) -> Iterator[RunningEmulator]:
    """Start ``pfsemu serve --fg`` over ``backing``; yield once it is mounted and answers; always stop it.

    The mountpoint (unless given), control socket and log live in a fresh short directory under
    /tmp (a Unix socket path must stay under 108 bytes, pytest's tmp_path often does not).  Options
    left at None take the emulator's defaults.  Teardown sends SIGTERM, lazily unmounts whatever is
    still mounted, kills the process if it did not exit, and removes what it created.
    """
    reason = fuse_unavailable_reason()
    if reason is not None:
        raise RuntimeError(f"pfsemu: FUSE unusable: {reason}")
    workdir = Path(tempfile.mkdtemp(prefix="pfsemu-", dir="/tmp"))
    mnt = Path(mountpoint) if mountpoint is not None else workdir / "mnt"
    made_mnt = not mnt.exists()
    mnt.mkdir(parents=True, exist_ok=True)
    control = workdir / "control.sock"
    log_path = workdir / "pfsemu.log"
    cmd = [sys.executable, os.fspath(LAUNCHER), "serve", os.fspath(backing), os.fspath(mnt), "--fg"]
    cmd += ["--control", os.fspath(control)]
    for flag, value in (
        ("--curve", curve),
        ("--open-latency-ms", open_latency_ms),
        ("--read-latency-ms", read_latency_ms),
        ("--meta-latency-ms", meta_latency_ms),
        ("--active-window-ms", active_window_ms),
    ):
        if value is not None:
            cmd += [flag, str(value)]
    cmd += list(extra_args)
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT)
    emu = RunningEmulator(Path(backing), mnt, control, log_path, proc, PfsemuClient(control))
    try:
        deadline = time.monotonic() + ready_timeout_s
        while not (is_mounted(mnt) and emu.client.ping()):
            if proc.poll() is not None:
                raise RuntimeError(f"pfsemu exited with status {proc.returncode}: {emu.log_text().strip()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"pfsemu not ready after {ready_timeout_s} s: {emu.log_text().strip()}")
            time.sleep(0.02)
        yield emu
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
        unmount(mnt)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for leftover in (control, log_path):
            with contextlib.suppress(OSError):
                leftover.unlink()
        if made_mnt and not is_mounted(mnt):
            with contextlib.suppress(OSError):
                mnt.rmdir()
        with contextlib.suppress(OSError):
            workdir.rmdir()


# ----------------------------------------------------------------------------------------------------
# Command line
# ----------------------------------------------------------------------------------------------------

_EPILOG = f"""\
model:
  A reader is an open file handle with a read in flight, or whose last read ended less than the
  active window ago; gamma counts them.  All reads share one channel moving t(gamma) bytes/s in
  total, first come first served (each reader gets t(gamma)/gamma on average); a read replies no
  earlier than the read latency after it arrived (latency overlaps the transfer); a read at end
  of file replies at once.  Every open waits the open latency.  Files are served with direct_io,
  so the counters see every byte readers get (no page cache, no readahead); bytes count for the
  process that opened the file.

defaults (printed with every result):
  --curve {DEFAULT_CURVE} (MB/s, MB = 10^6 B) is NoPFS's Lassen curve
  t(1,2,4,8) = 330, 730, 1540, 2870 MB/s scaled to a 2-core box: t(1) divided by 16.5, growth
  with gamma compressed from 8.7x to 3x because readers, seerfs daemons and the emulator share two
  cores; the per-reader share t(gamma)/gamma falls from 20 to 7.5 MB/s as on a contended PFS.
  t is linear in gamma between points and flat beyond them.
  --open-latency-ms {DEFAULT_OPEN_LATENCY_MS:g} (an MDS open RPC),
  --read-latency-ms {DEFAULT_READ_LATENCY_MS:g} (an OST RPC), --meta-latency-ms {DEFAULT_META_LATENCY_MS:g}.

control socket (one request line, one JSON reply line):
  ping | stats | stats files | reset   (reset replies with the counters before zeroing them)
  default path: /tmp/pfsemu-UID-HASH.sock, HASH from the mountpoint's real path; stats and reset
  accept the mountpoint instead of the socket and derive it the same way.

exit status:
  0 ok, 1 internal error, 2 usage, 3 bad option value, 4 BACKING unusable, 5 MOUNTPOINT unusable
  or mount failed, 6 control socket unusable, 7 no emulator answers on the control socket.

stop a server: fusermount3 -u MOUNTPOINT (or SIGTERM/SIGINT to its process).
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pfsemu",
        description="Emulated contended parallel filesystem: a read-only FUSE passthrough with per-open "
        "and per-read latency, an aggregate bandwidth t(gamma) shared by all active readers, and "
        "exact traffic counters on a control socket.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="{serve,stats,reset}")
    s = sub.add_parser(
        "serve",
        help="mount BACKING at MOUNTPOINT as an emulated PFS",
        description="Mount BACKING read-only at MOUNTPOINT with the PFS model (see pfsemu --help).",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    s.add_argument("backing", type=Path, metavar="BACKING", help="directory to serve")
    s.add_argument("mountpoint", type=Path, metavar="MOUNTPOINT", help="empty directory to mount on")
    s.add_argument("--control", type=Path, metavar="SOCKET", help="control socket path (default: derived)")
    s.add_argument(
        "--curve",
        default=DEFAULT_CURVE,
        metavar="G:MBPS,...",
        help=f"aggregate throughput t(gamma) in MB/s at given gamma (default {DEFAULT_CURVE}; "
        f"NoPFS Lassen: {LASSEN_CURVE})",
    )
    s.add_argument(
        "--open-latency-ms",
        type=float,
        default=DEFAULT_OPEN_LATENCY_MS,
        metavar="MS",
        help=f"delay of every open (default {DEFAULT_OPEN_LATENCY_MS:g})",
    )
    s.add_argument(
        "--read-latency-ms",
        type=float,
        default=DEFAULT_READ_LATENCY_MS,
        metavar="MS",
        help=f"minimum time of every read request (default {DEFAULT_READ_LATENCY_MS:g})",
    )
    s.add_argument(
        "--meta-latency-ms",
        type=float,
        default=DEFAULT_META_LATENCY_MS,
        metavar="MS",
        help=f"delay of lookup/getattr/opendir/readlink (default {DEFAULT_META_LATENCY_MS:g})",
    )
    s.add_argument(
        "--active-window-ms",
        type=float,
        default=DEFAULT_ACTIVE_WINDOW_MS,
        metavar="MS",
        help=f"a handle stays an active reader this long after its last read (default {DEFAULT_ACTIVE_WINDOW_MS:g})",
    )
    s.add_argument(
        "--threads",
        type=int,
        default=DEFAULT_THREADS,
        metavar="N",
        help=f"threads for reads not in the page cache and for directory scans (default {DEFAULT_THREADS})",
    )
    s.add_argument(
        "--attr-timeout-s",
        type=float,
        default=DEFAULT_ATTR_TIMEOUT_S,
        metavar="S",
        help=f"kernel entry/attribute cache time (default {DEFAULT_ATTR_TIMEOUT_S:g})",
    )
    s.add_argument(
        "--nice",
        type=int,
        default=DEFAULT_NICE,
        metavar="N",
        help=f"scheduling priority, so busy readers do not stretch emulated delays (default {DEFAULT_NICE}, "
        "kept as is without the privilege)",
    )
    s.add_argument("--fg", action="store_true", help="stay in the foreground (default: daemonise once mounted)")
    s.add_argument("--log", type=Path, metavar="FILE", help="daemon log file (default: discard)")
    for name, text in (("stats", "print the counters"), ("reset", "zero the counters")):
        p = sub.add_parser(name, help=text, description=f"{text.capitalize()} of a running pfsemu.")
        p.add_argument("control", metavar="SOCKET", help="control socket, or the emulator's mountpoint")
        if name == "stats":
            p.add_argument("--json", action="store_true", help="print the raw JSON reply (with per-file counts)")
            p.add_argument("--top", type=int, default=10, metavar="N", help="files listed (default 10)")
    return parser


def _config_from_args(args: argparse.Namespace) -> EmulatorConfig:
    for name in (
        "open_latency_ms",
        "read_latency_ms",
        "meta_latency_ms",
        "active_window_ms",
        "attr_timeout_s",
    ):
        value = getattr(args, name)
        if not (value >= 0 and math.isfinite(value)):
            raise PfsemuError(f"--{name.replace('_', '-')} must be a number >= 0, not {value}", EXIT_OPTION)
    if args.threads < 1:
        raise PfsemuError("--threads must be >= 1", EXIT_OPTION)
    if not -20 <= args.nice <= 19:
        raise PfsemuError("--nice must be between -20 and 19", EXIT_OPTION)
    return EmulatorConfig(
        curve=Curve.parse(args.curve),
        open_latency_s=args.open_latency_ms / 1e3,
        read_latency_s=args.read_latency_ms / 1e3,
        meta_latency_s=args.meta_latency_ms / 1e3,
        active_window_s=args.active_window_ms / 1e3,
        threads=args.threads,
        attr_timeout_s=args.attr_timeout_s,
        nice=args.nice,
    )


def _control_of(arg: str) -> Path:
    path = Path(arg)
    return default_control_path(path) if path.is_dir() else path


def _printable(path: str) -> str:
    """A name as text any terminal takes: undecodable bytes (surrogateescape) shown as \\xNN."""
    return path.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def format_stats(stats: PfsStats, top: int = 10) -> str:
    """Human-readable rendering of a snapshot (``pfsemu stats``)."""
    emu = stats.raw["emulator"]
    lag = stats.raw["loop_lag_ms"]
    lines = [
        stats.describe_config(),
        f"emulator pid {emu['pid']}: {emu['backing']} at {emu['mountpoint']}, up {emu['uptime_s']:.1f} s, "
        f"cpu {emu['cpu_s']:.2f} s, loop lag max {lag['max']:.2f} ms mean {lag['mean']:.3f} ms",
        f"since reset {stats.since_reset_s:.1f} s: opens {stats.opens} (errors {stats.open_errors}), "
        f"reads {stats.reads}, bytes {stats.bytes}, meta ops {stats.meta_ops}, "
        f"channel busy {stats.raw['totals']['channel_busy_s']:.2f} s",
        f"now: open handles {stats.open_handles}, active readers {stats.active_readers}",
        "reads by gamma: " + (" ".join(f"{g}:{n}" for g, n in sorted(stats.reads_by_gamma.items())) or "-"),
        f"{'pid':>8} {'process':<16} {'opens':>8} {'reads':>10} {'bytes':>14}",
    ]
    for pid, (comm, c) in sorted(stats.pids.items(), key=lambda kv: -kv[1][1].bytes):
        lines.append(f"{pid:>8} {comm:<16} {c.opens:>8} {c.reads:>10} {c.bytes:>14}")
    if stats.files and top > 0:
        lines.append(f"{'opens':>8} {'bytes':>14}  file (top {top} by bytes of {len(stats.files)})")
        ranked = sorted(stats.files.items(), key=lambda kv: -kv[1].bytes)[:top]
        lines.extend(f"{c.opens:>8} {c.bytes:>14}  {_printable(path)}" for path, c in ranked)
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    try:
        if args.command == "serve":
            config = _config_from_args(args)
            if args.fg:
                serve(args.backing, args.mountpoint, config, args.control)
                return EXIT_OK
            _check_paths(args.backing, args.mountpoint)
            return _serve_daemon(args.backing, args.mountpoint, config, args.control, args.log)
        client = PfsemuClient(_control_of(args.control))
        try:
            if args.command == "reset":
                before = client.reset()
                text = f"pfsemu: counters reset (were opens {before.opens}, bytes {before.bytes})"
            elif args.json:
                text = json.dumps(client.request("stats files"), indent=1)
            else:
                text = format_stats(client.stats(files=args.top > 0), args.top)
        except (OSError, ValueError) as exc:
            raise PfsemuError(f"no pfsemu answers on {client.control}: {exc}", EXIT_UNREACHABLE) from None
        with contextlib.suppress(BrokenPipeError):
            print(text, flush=True)
        return EXIT_OK
    except PfsemuError as exc:
        print(f"pfsemu: {exc}", file=sys.stderr)
        return exc.code
    except KeyboardInterrupt:
        return EXIT_INTERNAL


if __name__ == "__main__":
    sys.exit(main())
