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
benchmark (tools/bench/pfsemu) prints both.

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

The modules
-----------
``model`` (configuration, active readers, the shared channel, counters: no I/O), ``timer`` (precise
sleeps), ``ops`` (the FUSE operations), ``control`` (the control socket's server and client),
``serve`` (mounting, the daemon), ``running`` (an emulator in a subprocess, for tests and
benchmarks), ``cli`` (the command line; ``python3 tools/pfsemu`` or ``python -m tools.pfsemu`` runs
it).  This package re-exports what tests and benchmarks use.
"""

from __future__ import annotations

from tools.pfsemu.cli import build_parser, format_stats, main
from tools.pfsemu.control import ControlServer, Counts, PfsemuClient, PfsStats, default_control_path
from tools.pfsemu.model import (
    DEFAULT_ACTIVE_WINDOW_MS,
    DEFAULT_ATTR_TIMEOUT_S,
    DEFAULT_CURVE,
    DEFAULT_META_LATENCY_MS,
    DEFAULT_NICE,
    DEFAULT_OPEN_LATENCY_MS,
    DEFAULT_READ_LATENCY_MS,
    DEFAULT_THREADS,
    EXIT_BACKING,
    EXIT_CONTROL,
    EXIT_INTERNAL,
    EXIT_MOUNTPOINT,
    EXIT_OK,
    EXIT_OPTION,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
    LASSEN_CURVE,
    MB,
    PROTOCOL_VERSION,
    ActiveReaders,
    Curve,
    EmulatorConfig,
    PfsemuError,
    ServerCounters,
    SharedChannel,
    describe_config,
)
from tools.pfsemu.ops import PfsemuOperations
from tools.pfsemu.running import LAUNCHER, RunningEmulator, fuse_unavailable_reason, is_mounted, running, unmount
from tools.pfsemu.serve import serve
from tools.pfsemu.timer import PreciseTimer

__all__ = [
    "DEFAULT_ACTIVE_WINDOW_MS",
    "DEFAULT_ATTR_TIMEOUT_S",
    "DEFAULT_CURVE",
    "DEFAULT_META_LATENCY_MS",
    "DEFAULT_NICE",
    "DEFAULT_OPEN_LATENCY_MS",
    "DEFAULT_READ_LATENCY_MS",
    "DEFAULT_THREADS",
    "EXIT_BACKING",
    "EXIT_CONTROL",
    "EXIT_INTERNAL",
    "EXIT_MOUNTPOINT",
    "EXIT_OK",
    "EXIT_OPTION",
    "EXIT_UNREACHABLE",
    "EXIT_USAGE",
    "LASSEN_CURVE",
    "LAUNCHER",
    "MB",
    "PROTOCOL_VERSION",
    "ActiveReaders",
    "ControlServer",
    "Counts",
    "Curve",
    "EmulatorConfig",
    "PfsStats",
    "PfsemuClient",
    "PfsemuError",
    "PfsemuOperations",
    "PreciseTimer",
    "RunningEmulator",
    "ServerCounters",
    "SharedChannel",
    "build_parser",
    "default_control_path",
    "describe_config",
    "format_stats",
    "fuse_unavailable_reason",
    "is_mounted",
    "main",
    "running",
    "serve",
    "unmount",
]
