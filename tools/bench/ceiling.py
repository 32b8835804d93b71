"""FUSE ceiling: how fast files already cached can be read through seerfs, next to the same reads without it.

A dataset of small files (default 10,000 of ~125 KB, lognormal) is made on a tmpfs, so the baseline
really is memory.  The same reader then reads every file through each configuration:

  direct     the tmpfs itself (the ceiling; every ratio is to its warm rate)
  seerfs     seerfs mounted over the tmpfs (no seed written; see below), through its default front
             (fuse.front: native where the extension was built: opens of cached files answered in C)
  seerfs-py  the same seerfs mount through the pyfuse3 front (fuse.front: pyfuse3), side by side
  seerfs-noopen  the same seerfs mount with fuse.no_open: on (root): the kernel sends no OPEN or
             RELEASE at all, the daemon sees opens through fanotify; a warm open costs no request
             (one IOCTL, answered in C, where the reader's Python asks isatty; none with
             --reader loader-3.14)
  pyfuse3    the least a pyfuse3 filesystem can do (tools/bench/floorfs.py: open replies
             keep_cache at once, no bookkeeping, the same pyfuse3 + trio loop as seerfs): the
             floor of what seerfs's per-open work costs on top of the FUSE machinery it uses
  mergerfs   mergerfs over the tmpfs, a C passthrough with its page cache kept across opens
             (options printed with the results)
  rclone     rclone mount --vfs-cache-mode full over the tmpfs

The reader is --threads threads in this process, each taking the next file of a random permutation
of all files.  --reader loader (the default) reads each file the way torchvision's default loader
does before decoding (``with open(path, "rb") as f: f.read()``): the per-file cost a DataLoader
worker really pays, and what the figures in tools/RESULTS.md were taken with.  On CPython up to
3.13 that open() asks isatty() of every file (``_io_open_impl`` in Modules/_io/_iomodule.c calls
``raw.isatty()`` whenever buffering is the default), an ioctl the kernel turns into a FUSE IOCTL
request on every open; CPython 3.14 asks ``raw._isatty_open_only()`` instead, which answers False
without a system call when the stat taken at open shows no character device
(``_io_FileIO_isatty_open_only`` in Modules/_io/fileio.c).  --reader loader-3.14 reads each file
the way 3.14's open().read() does, on any interpreter: ``open(path, "rb", buffering=0).read()``
(an explicit buffering skips the isatty() call on 3.11-3.13 too, and the buffered reader reads a
whole file through the same raw readall()), so it shows what a warm open costs a DataLoader worker
on 3.14 (with fuse.no_open: no request at all).  --reader readv is
the leanest reader Python has (os.open, os.readv into one reused --read-size buffer, os.close): it
makes the per-open cost of any FUSE filesystem weigh more than it does in training.  Every configuration gets the
same permutations (a new one per pass, drawn from --seed).  Per configuration the first pass is the
*cold* pass (a fresh mount: it fills whatever the filesystem caches) and the warm-up; then *warm*
passes follow until at least --passes of them ran and they took at least --seconds together.  The
headline is the median warm pass, as a ratio to direct's median warm pass.  Each pass must read
exactly the dataset's bytes, or the benchmark fails.

CPU columns say who is CPU-bound, in cores (1.00 = one core busy all the time), over all warm
passes (the cold pass's are listed below the table): "rdr CPU" is this process (the readers; the
kernel's FUSE work on their side is their system time), "fs CPU" the filesystem daemon (all its
threads, /proc/PID/stat), "top thr" its busiest thread (near 1.00: the daemon is serialised on
it), "busy" the whole machine (/proc/stat): when it exceeds rdr + fs by more than 0.25 cores,
something else was using the cores and a warning after the table says to rerun.  "RA KB" is the
mount's read_ahead_kb (the largest READ the kernel sends).

seerfs is mounted without a seed: the reader's order is a plain random permutation, not a sampler
order a seed could predict, so seerfs assumes the default seed, sees the mismatch and serves by its
reactive policy.  Its memory tier is sized for the dataset twice over (the reactive set's RAM copies
plus the pages readers leave in the page cache, which the budget also counts), so nothing is evicted
and warm passes are served from the kernel page cache (keep_cache): they measure the cost of the
FUSE round trips the daemon still answers per file: OPEN, RELEASE and, with the loader reader, the
IOCTL that Python's open() sends when it asks isatty() (answered ENOSYS by libfuse, never cached).
The table's notes count where seerfs served each warm open from, and for the native front how
many requests per warm open it answered in C and how many reached Python.  "us/open" is the
daemon's CPU (all threads, utime + stime from /proc) per warm open, in microseconds: with
--passes 8 over 4,000 files that is 32,000 opens; a note splits it by thread name (``main``: the
daemon's first thread, where seerfs runs trio and books the opens).

--seerfs-o passes config overrides to the seerfs mount (e.g. fuse.max_tasks=8); --profile records
the seerfs and pyfuse3-floor daemons with py-spy during their warm passes (DIR/CONFIG-warm.txt,
collapsed stacks per thread; the profiler slows the daemons, so that run's rates do not count).

--cold-runs N measures what a *cold* open costs the seerfs daemon, apart from the table above
(--cold-only: nothing else): N fresh seerfs mounts (configured as the seerfs row), each read once in
a new random order by the same readers, so every open fetches its file from the source (the tmpfs, a
plain directory: no PFS emulator, so the figure is the daemon's own work), keeps it in the memory
tier and serves it.  Per run: files/s, the daemon's CPU (all threads, /proc/PID/stat) during the pass
and in the tail after it until the daemon is idle (work it left for later), and that total in us per
cold open; the headline is the median run.  The pyfuse3 floor is mounted as many times beside it,
each run read in the same order: the same FUSE requests answered with a plain read of the source on
the trio thread, what any pyfuse3 daemon pays for a cold open.

Mounting a tmpfs needs root; --tmpfs DIR uses an existing tmpfs instead.  Exit status: 0 done (the
targets are reported, not enforced), 1 a pass read the wrong number of bytes or a mount failed, 2 a
usage error.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tools.bench import floorfs
from tools.bench.options import pick_configs
from tools.bench.procstat import CLK_TCK, cpu_seconds_of
from tools.bench.train import rclone_mount
from tools.harness.jobs import Job, seerfs_config
from tools.harness.mounts import force_unmount, seerfs, status, wait_for
from tools.mkdataset import Spec, make_dataset, parse_size

CONFIGS = ("direct", "seerfs", "seerfs-py", "seerfs-noopen", "pyfuse3", "mergerfs", "rclone")
SEERFS = ("seerfs", "seerfs-py", "seerfs-noopen")
LABELS = {
    "direct": "direct tmpfs",
    "seerfs": "seerfs",
    "seerfs-py": "seerfs pyfuse3",
    "seerfs-noopen": "seerfs no_open",
    "pyfuse3": "pyfuse3 floor",
    "mergerfs": "mergerfs",
    "rclone": "rclone",
}
RCLONE_OPTIONS = "--vfs-cache-mode full --dir-cache-time 1h --attr-timeout 1h (cache dir on local disk)"
# The parameters the targets are set for; output options do not count.
SIZING = ("files", "mean_size", "sigma", "classes", "threads", "read_size", "reader")
TARGET, STRETCH = 0.5, 0.8
OTHERS_WARN = 0.25  # cores used by other processes during warm passes that make a run suspect


class BenchError(Exception):
    """The benchmark cannot go on (wrong bytes read, a mount that failed): one line for the user."""


@dataclass
class PassResult:
    files: int
    bytes: int
    seconds: float
    reader_cpu_s: float  # this process, user + system
    fs_cpu_s: float | None  # the filesystem daemon, all threads (None: no daemon)
    busy_cores: float  # the whole machine's non-idle time over the pass, in cores
    fs_top_thread_s: float | None = None  # the daemon's busiest thread (near 1 core: serialised there)
    fs_threads_s: dict[str, float] = field(default_factory=dict)  # the daemon's CPU by thread name ("main": trio's)

    @property
    def files_per_s(self) -> float:
        return self.files / max(self.seconds, 1e-9)

    @property
    def mb_per_s(self) -> float:
        return self.bytes / 1e6 / max(self.seconds, 1e-9)

    @property
    def reader_cores(self) -> float:
        return self.reader_cpu_s / max(self.seconds, 1e-9)

    @property
    def fs_cores(self) -> float | None:
        return None if self.fs_cpu_s is None else self.fs_cpu_s / max(self.seconds, 1e-9)

    @property
    def others_cores(self) -> float:
        """Machine CPU used by neither the readers nor the daemon (someone else, or the kernel's own threads)."""
        return self.busy_cores - self.reader_cores - (self.fs_cores or 0.0)

    @property
    def fs_us_per_open(self) -> float | None:
        """The daemon's CPU per file opened, in microseconds."""
        return None if self.fs_cpu_s is None else self.fs_cpu_s / max(self.files, 1) * 1e6

    @property
    def fs_top_thread_cores(self) -> float | None:
        return None if self.fs_top_thread_s is None else self.fs_top_thread_s / max(self.seconds, 1e-9)

    def to_json(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "files_per_s": self.files_per_s,
            "mb_per_s": self.mb_per_s,
            "reader_cores": self.reader_cores,
            "fs_cores": self.fs_cores,
            "fs_top_thread_cores": self.fs_top_thread_cores,
            "fs_us_per_open": self.fs_us_per_open,
            "others_cores": self.others_cores,
        }


@dataclass
class ConfigResult:
    config: str
    cold: PassResult
    warm: list[PassResult]
    bytes_verified: bool = True  # every pass read exactly the dataset's bytes (else BenchError)
    read_ahead_kb: int | None = None  # of the mount's bdi (None: not a FUSE mount)
    notes: list[str] = field(default_factory=list)

    @property
    def median(self) -> PassResult:
        """The warm pass of median files/s (the headline rate)."""
        ranked = sorted(self.warm, key=lambda p: p.files_per_s)
        return ranked[(len(ranked) - 1) // 2]

    @property
    def warm_total(self) -> PassResult:
        """All warm passes as one: CPU shares of short passes are too coarse (clock ticks) on their own."""
        fs = [p.fs_cpu_s for p in self.warm]
        top = [p.fs_top_thread_s for p in self.warm]
        seconds = sum(p.seconds for p in self.warm)
        return PassResult(
            sum(p.files for p in self.warm),
            sum(p.bytes for p in self.warm),
            seconds,
            sum(p.reader_cpu_s for p in self.warm),
            None if None in fs else sum(x or 0.0 for x in fs),
            sum(p.busy_cores * p.seconds for p in self.warm) / max(seconds, 1e-9),
            None if None in top else sum(x or 0.0 for x in top),
            {name: sum(p.fs_threads_s.get(name, 0.0) for p in self.warm) for name in self.thread_names},
        )

    @property
    def thread_names(self) -> list[str]:
        return sorted({name for p in self.warm for name in p.fs_threads_s})


@dataclass
class Dataset:
    root: Path  # the source directory the configurations mirror
    rel: list[bytes]  # files relative to root, sorted
    sizes: list[int]

    @property
    def total(self) -> int:
        return sum(self.sizes)


# --------------------------------------------------------------------------- machine


def thread_seconds(pid: int) -> dict[int, float]:
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):  # a thread that just exited
            out[int(task.name)] = cpu_seconds_of(str(task / "stat"))
    return out


def by_thread_name(pid: int, spent: dict[int, float]) -> dict[str, float]:
    """CPU seconds per thread, summed by thread name (``main``: the process's first thread, where
    seerfs runs trio); a thread that exited meanwhile counts as ``gone``."""
    out: dict[str, float] = {}
    for tid, seconds in spent.items():
        name = "main"
        if tid != pid:
            try:
                name = Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
            except OSError:
                name = "gone"
        out[name] = out.get(name, 0.0) + seconds
    return out


def machine_busy_s() -> float:
    """Non-idle CPU seconds of the whole machine so far (all cores), from /proc/stat."""
    parts = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = parts[3] + parts[4]  # idle + iowait
    return (sum(parts[:8]) - idle) / CLK_TCK


def read_ahead_kb(mountpoint: Path) -> int | None:
    target = os.path.abspath(mountpoint)
    with open("/proc/self/mountinfo") as fh:
        for line in fh:
            parts = line.split()
            if parts[4] == target:
                with contextlib.suppress(OSError, ValueError):
                    return int(Path(f"/sys/class/bdi/{parts[2]}/read_ahead_kb").read_text())
    return None


def is_tmpfs(path: Path) -> bool:
    """Whether ``path`` lies on a tmpfs (the longest mount point that contains it)."""
    target, best, fstype = os.path.realpath(path), "", ""
    with open("/proc/self/mountinfo") as fh:
        for line in fh:
            parts = line.split()
            mnt = parts[4]
            if (target == mnt or target.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best):
                best, fstype = mnt, parts[parts.index("-") + 1]
    return fstype == "tmpfs"


# --------------------------------------------------------------------------- reading


def read_pass(
    root: Path, data: Dataset, order: np.ndarray, threads: int, read_size: int, daemon: int | None, kind: str = "loader"
) -> PassResult:
    """Read every file once in ``order`` with ``threads`` threads; fail unless the bytes add up."""
    base = os.fsencode(root) + b"/"
    paths = [base + data.rel[i] for i in order.tolist()]
    counter = itertools.count()  # next() on it is atomic: the threads share one queue position
    got = [0] * threads
    done = [0] * threads
    errors: list[BaseException] = []

    def reader(slot: int) -> None:
        buf = [bytearray(read_size)]
        n = nbytes = 0
        try:
            while (k := next(counter)) < len(paths):
                if kind == "loader":
                    with open(paths[k], "rb") as fh:
                        nbytes += len(fh.read())
                elif kind == "loader-3.14":  # as CPython 3.14's open().read(): no isatty() ioctl
                    with open(paths[k], "rb", buffering=0) as raw:
                        nbytes += len(raw.read())
                else:
                    fd = os.open(paths[k], os.O_RDONLY)
                    try:
                        while chunk := os.readv(fd, buf):
                            nbytes += chunk
                    finally:
                        os.close(fd)
                n += 1
        except BaseException as exc:
            errors.append(exc)
        got[slot], done[slot] = nbytes, n

    workers = [threading.Thread(target=reader, args=(i,), daemon=True) for i in range(threads)]
    fs0 = cpu_seconds_of(f"/proc/{daemon}/stat") if daemon else None
    threads0 = thread_seconds(daemon) if daemon else {}
    cpu0, busy0, t0 = os.times(), machine_busy_s(), time.monotonic()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    wall = time.monotonic() - t0
    cpu1, busy1 = os.times(), machine_busy_s()
    fs_cpu = top = None
    by_name: dict[str, float] = {}
    if daemon and fs0 is not None:
        fs_cpu = cpu_seconds_of(f"/proc/{daemon}/stat") - fs0
        spent = {tid: t - threads0.get(tid, 0.0) for tid, t in thread_seconds(daemon).items()}
        top = max(spent.values(), default=0.0)
        by_name = by_thread_name(daemon, spent)
    if errors:
        raise BenchError(f"reading {root}: {errors[0]!r}")
    result = PassResult(
        sum(done),
        sum(got),
        wall,
        cpu1.user + cpu1.system - cpu0.user - cpu0.system,
        fs_cpu,
        (busy1 - busy0) / max(wall, 1e-9),
        top,
        by_name,
    )
    if result.files != len(paths) or result.bytes != data.total:
        raise BenchError(
            f"reading {root}: {result.files} files and {result.bytes} bytes read, expected "
            f"{len(paths)} files and {data.total} bytes"
        )
    return result


def orders(n: int, seed: int) -> Iterator[np.ndarray]:
    """Pass k's permutation: the same k-th permutation for every configuration."""
    rng = np.random.default_rng(seed)
    while True:
        yield rng.permutation(n)


# --------------------------------------------------------------------------- mounts


@dataclass
class Mounted:
    root: Path  # where the readers find the dataset
    daemon: int | None  # the filesystem daemon's pid
    notes: list[str] = field(default_factory=list)
    seerfs_mnt: Path | None = None  # seerfs: the mountpoint, for its status


@contextlib.contextmanager
def tmpfs(path: Path, size: int) -> Iterator[Path]:
    path.mkdir(parents=True)
    res = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(path)], capture_output=True, text=True
    )
    if res.returncode != 0:
        raise BenchError(f"mount -t tmpfs {path}: {res.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


@contextlib.contextmanager
def direct(data: Dataset, work: Path, a: argparse.Namespace) -> Iterator[Mounted]:
    yield Mounted(data.root, None)


@contextlib.contextmanager
def seerfs_mounted(
    data: Dataset, work: Path, a: argparse.Namespace, front: str | None = None, no_open: bool = False
) -> Iterator[Mounted]:
    """seerfs over the tmpfs, through ``front`` (None: the default, native where it was built);
    ``no_open``: with fuse.no_open on, timed only once the front armed it."""
    d = work / ("seerfs-noopen" if no_open else "seerfs" if front is None else f"seerfs-{front}")
    d.mkdir()
    lookahead = 64 << 20
    job = Job(world_size=1, epochs=1 + a.passes, batch_size=32, num_workers=0, val=False)
    tier = int(data.total * 2.1) + lookahead
    cfg = seerfs_config(
        d / "seerfs.yaml",
        job,
        cache_dir=d / "cache",
        lookahead=str(lookahead),
        tiers=[{"kind": "memory", "bytes": tier, "threads": 8}],
    )
    mnt = d / "mnt"
    mnt.mkdir()
    extra = ["-o", a.seerfs_o] if a.seerfs_o else []
    if front is not None:
        extra += ["-o", f"fuse.front={front}"]
    if no_open:
        extra += ["-o", "fuse.no_open=on"]
    res = seerfs("mount", str(data.root.parent), str(mnt), "-c", str(cfg), *extra)
    if res.returncode != 0:
        raise BenchError(f"seerfs mount failed ({res.returncode}): {res.stderr.strip()}")
    try:
        # Planning for the assumed seed runs in a subprocess at mount: let it finish before timing.
        wait_for(lambda: status(mnt)["plan"]["state"] != "planning", timeout=120, what="seerfs planning")
        if no_open:
            wait_for(lambda: status(mnt)["front"]["open_mode"] == "no_open", timeout=30, what="fuse.no_open armed")
        yield Mounted(mnt / data.root.name, int(status(mnt)["pid"]), [f"memory tier {tier / 1e6:.0f} MB"], mnt)
    finally:
        seerfs("umount", str(mnt), timeout=120)
        force_unmount(mnt)


@contextlib.contextmanager
def foreground_mounted(cmd: list[str], mnt: Path, what: str, data: Dataset) -> Iterator[Mounted]:
    """A filesystem process serving in the foreground at ``mnt``; unmounted and stopped in all cases."""
    try:
        with floorfs.foreground(cmd, mnt, what) as proc:
            yield Mounted(mnt / data.root.name, proc.pid)
    except floorfs.MountError as exc:
        raise BenchError(str(exc)) from None


def floor_mounted(data: Dataset, work: Path, a: argparse.Namespace) -> contextlib.AbstractContextManager[Mounted]:
    mnt = work / "pyfuse3-mnt"
    return foreground_mounted(floorfs.command(data.root.parent, mnt), mnt, "pyfuse3 floor", data)


def mergerfs_mounted(data: Dataset, work: Path, a: argparse.Namespace) -> contextlib.AbstractContextManager[Mounted]:
    mnt = work / "mergerfs-mnt"
    cmd = floorfs.mergerfs_command(data.root.parent, mnt)
    assert cmd is not None  # main() skips mergerfs when it is not installed
    return foreground_mounted(cmd, mnt, "mergerfs", data)


@contextlib.contextmanager
def rclone_mounted(data: Dataset, work: Path, a: argparse.Namespace) -> Iterator[Mounted]:
    mnt, cache = work / "rclone-mnt", work / "rclone-cache"
    mnt.mkdir()
    try:
        proc = rclone_mount(data.root.parent, mnt, cache)
    except (RuntimeError, AssertionError) as exc:
        force_unmount(mnt)
        raise BenchError(f"rclone mount: {exc}") from None
    try:
        yield Mounted(mnt / data.root.name, proc.pid)
    finally:
        force_unmount(mnt)
        floorfs.stop(proc)


def seerfs_py_mounted(data: Dataset, work: Path, a: argparse.Namespace) -> contextlib.AbstractContextManager[Mounted]:
    return seerfs_mounted(data, work, a, front="pyfuse3")


def seerfs_noopen_mounted(
    data: Dataset, work: Path, a: argparse.Namespace
) -> contextlib.AbstractContextManager[Mounted]:
    return seerfs_mounted(data, work, a, no_open=True)


MOUNTS = {
    "direct": direct,
    "seerfs": seerfs_mounted,
    "seerfs-py": seerfs_py_mounted,
    "seerfs-noopen": seerfs_noopen_mounted,
    "pyfuse3": floor_mounted,
    "mergerfs": mergerfs_mounted,
    "rclone": rclone_mounted,
}


@contextlib.contextmanager
def profiled(pid: int | None, out: Path | None, name: str) -> Iterator[None]:
    """py-spy record of a Python daemon (seerfs, the pyfuse3 floor) for the block."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if out is None or pid is None or not Path(spy).exists():
        yield
        return
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}-warm.txt"
    proc = subprocess.Popen(
        [
            spy,
            "record",
            "--pid",
            str(pid),
            "--rate",
            "250",
            "--format",
            "raw",
            "--threads",
            "--nonblocking",
            "--output",
            str(path),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    time.sleep(1.0)  # py-spy attaches within a fraction of a second; the warm passes are several seconds
    try:
        yield
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        print(f"bench_ceiling: py-spy profile of {name} (warm passes) in {path}", file=sys.stderr)


# --------------------------------------------------------------------------- running


def seerfs_sources(mnt: Path) -> dict[str, int]:
    """Opens served per source, (as "READ requests") the reads that reached the daemon, and the
    front's counts of what it answered in C and forwarded to Python."""
    doc = status(mnt)
    reads, front = doc["reads"], doc["front"]
    counts = {f"front {k}": int(v) for k, v in front.items() if isinstance(v, int)}
    return {
        **{k: int(v["files"]) for k, v in reads["by_source"].items()},
        "READ requests": int(reads["reads"]),
        **counts,
    }


def measure(config: str, data: Dataset, work: Path, a: argparse.Namespace) -> ConfigResult:
    with MOUNTS[config](data, work, a) as m:
        perms = orders(len(data.rel), a.seed)
        cold = read_pass(m.root, data, next(perms), a.threads, a.read_size, m.daemon, a.reader)
        before = seerfs_sources(m.seerfs_mnt) if m.seerfs_mnt else {}
        warm: list[PassResult] = []
        python_daemon = m.daemon if config in (*SEERFS, "pyfuse3") else None
        with profiled(python_daemon, Path(a.profile) if a.profile else None, config):
            while len(warm) < a.passes or sum(p.seconds for p in warm) < a.seconds:
                warm.append(read_pass(m.root, data, next(perms), a.threads, a.read_size, m.daemon, a.reader))
        result = ConfigResult(config, cold, warm, read_ahead_kb=read_ahead_kb(m.root.parent), notes=m.notes)
        if m.seerfs_mnt:
            opened = len(warm) * len(data.rel)
            mnt = m.seerfs_mnt
            if config == "seerfs-noopen":  # opens are booked from fanotify's queue, a few ms late
                with contextlib.suppress(AssertionError):
                    wait_for(
                        lambda: seerfs_sources(mnt)["front observed_opens"] >= before["front observed_opens"] + opened,
                        timeout=10,
                        what="the warm opens booked",
                    )
            after = seerfs_sources(m.seerfs_mnt)
            reads = after.pop("READ requests") - before.pop("READ requests")
            front = {k[6:]: after.pop(k) - before.pop(k, 0) for k in list(after) if k.startswith("front ")}
            by = {k: after[k] - before.get(k, 0) for k in after if after[k] > before.get(k, 0)}
            doc = status(m.seerfs_mnt)
            st = doc["prefetch"]["staging"]
            native = (
                front["native_opens"] + front["native_releases"] + front["native_ioctls"] + front["native_getattrs"]
            )
            records = front["forwarded"] + front["native_opens"] + front["native_releases"]
            records += front["observed_opens"] + front["observed_releases"]
            # Each status read in between forwards a few requests itself (lookup, open, read, release).
            result.notes += [
                f"front {doc['front']['name']} ({doc['front']['open_mode']}, "
                f"fanotify {doc['front']['fanotify']}): per warm open "
                f"{(native + front['forwarded']) / opened:.2f} requests: {native / opened:.2f} answered in C "
                f"({front['native_getattrs'] / opened:.2f} of them GETATTR), "
                f"{front['forwarded'] / opened:.2f} forwarded to Python; "
                f"{records / max(front['batches'], 1):.1f} ring records per batch drained, "
                f"{front['visits'] / opened:.2f} of the opens booked with their release as one visit",
                f"opens seen through fanotify {front['observed_opens']} of {opened}, "
                f"the daemon's own dropped {front['own_opens_dropped']}",
                f"mode {doc['prefetch']['mode']}, cursor "
                + (f"{cur['state']} ({cur['plans']} plans)" if (cur := doc["prefetch"]["cursor"]) else "none"),
                "warm opens from " + " ".join(f"{k}:{v}" for k, v in by.items()) + f" of {opened}",
                f"warm READ requests {reads}",
                f"uncached opens {st['uncached_opens']}, invalidations {st['invalidations']}",
            ]
        total = result.warm_total
        if total.fs_threads_s:
            per = [f"{k} {v / max(total.files, 1) * 1e6:.1f}" for k, v in total.fs_threads_s.items() if v > 0]
            result.notes.append("daemon us per warm open by thread: " + ", ".join(per))
    return result


def make_data(root: Path, a: argparse.Namespace) -> Dataset:
    spec = Spec(classes=a.classes, files=a.files, mean_size=a.mean_size, sigma=a.sigma, seed=a.seed)
    written = make_dataset(root, spec)
    rel = sorted(os.fsencode(p.relative_to(root)) for p in written)
    return Dataset(root, rel, [os.stat(os.fsencode(root) + b"/" + r).st_size for r in rel])


def run_all(
    a: argparse.Namespace, work: Path, configs: list[str], cold: list[ColdRun] | None = None
) -> tuple[Dataset, list[ConfigResult]]:
    """Every configuration's passes; then, into ``cold``, the --cold-runs measurement."""
    size = max(256 << 20, 3 * a.files * a.mean_size)
    with contextlib.ExitStack() as stack:
        if a.tmpfs:
            base = Path(tempfile.mkdtemp(prefix="seerfs-ceiling-src-", dir=a.tmpfs))
            stack.callback(shutil.rmtree, base, True)
        else:
            base = stack.enter_context(tmpfs(work / "tmpfs", size))
        t0 = time.monotonic()
        data = make_data(base / "train", a)
        print(
            f"bench_ceiling: {len(data.rel)} files, {data.total / 1e6:.0f} MB made on tmpfs {base} in "
            f"{time.monotonic() - t0:.1f}s",
            file=sys.stderr,
        )
        results = []
        for config in configs:
            print(f"bench_ceiling: running {config}", file=sys.stderr)
            results.append(measure(config, data, work, a))
        if cold is not None:
            cold += measure_cold(data, work, a)
        return data, results


# --------------------------------------------------------------------------- cold opens


COLD_CONFIGS = ("seerfs", "pyfuse3")


@dataclass
class ColdRun:
    """One fresh seerfs mount read once: every open a cold one (the file fetched from the source)."""

    config: str  # seerfs, or the pyfuse3 floor beside it
    passed: PassResult  # the cold pass; fs_cpu_s is the daemon's CPU during it
    tail_cpu_s: float  # the daemon's CPU after the pass until it went idle (work it left for later)
    fetched: int | None  # seerfs: opens its status counts as fetched from the source (all of them)

    @property
    def us_per_open(self) -> float:
        return ((self.passed.fs_cpu_s or 0.0) + self.tail_cpu_s) / max(self.passed.files, 1) * 1e6

    def to_json(self) -> dict[str, Any]:
        return {
            "config": self.config,
            "pass": self.passed.to_json(),
            "tail_cpu_s": self.tail_cpu_s,
            "fetched": self.fetched,
            "us_per_open": self.us_per_open,
        }


def idle_tail(pid: int, quiet_s: float = 0.5, limit_s: float = 30.0) -> float:
    """CPU seconds ``pid`` uses from now until a ``quiet_s`` window in which it used none."""
    start = last = cpu_seconds_of(f"/proc/{pid}/stat")
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        time.sleep(quiet_s)
        now = cpu_seconds_of(f"/proc/{pid}/stat")
        if now - last < 1.5 / CLK_TCK:  # a tick of bookkeeping is not work left over
            break
        last = now
    return last - start


def measure_cold(data: Dataset, work: Path, a: argparse.Namespace) -> list[ColdRun]:
    """--cold-runs fresh mounts of seerfs, each read once: the daemon's CPU per cold open.  The
    pyfuse3 floor, mounted as many times beside it, is the reference: the same requests answered
    with nothing but a read of the source on the trio thread (what no pyfuse3 daemon avoids)."""
    runs = []
    for k in range(a.cold_runs):
        for config in COLD_CONFIGS:
            print(f"bench_ceiling: cold run {k + 1} of {a.cold_runs}: {config}", file=sys.stderr)
            d = work / f"cold-{k}-{config}"
            d.mkdir()
            order = next(orders(len(data.rel), a.seed + 1 + k))  # run k's order, the same for both
            with MOUNTS[config](data, d, a) as m:
                assert m.daemon is not None
                idle_tail(m.daemon)  # the mount's own start-up is not a cold open's
                before = seerfs_sources(m.seerfs_mnt) if m.seerfs_mnt else {}
                passed = read_pass(m.root, data, order, a.threads, a.read_size, m.daemon, a.reader)
                tail = idle_tail(m.daemon)
                after = seerfs_sources(m.seerfs_mnt) if m.seerfs_mnt else {}
            fetched = sum(after.get(s, 0) - before.get(s, 0) for s in ("pfs", "inflight"))
            runs.append(ColdRun(config, passed, tail, fetched if m.seerfs_mnt else None))
    return runs


def median_cold(runs: list[ColdRun], config: str = "seerfs") -> ColdRun:
    ranked = sorted((r for r in runs if r.config == config), key=lambda r: r.us_per_open)
    return ranked[(len(ranked) - 1) // 2]


def print_cold(data: Dataset, runs: list[ColdRun], a: argparse.Namespace) -> None:
    print(
        f"\ncold opens: {a.cold_runs} fresh mounts each over the tmpfs (a plain directory source, no PFS emulator), "
        f"each read once ({len(data.rel)} files, {a.threads} reader threads, reader {a.reader}); "
        f"machine {os.cpu_count()} cores"
    )
    print(
        f"{'configuration':<13}  {'run':>3}  {'files/s':>8}  {'pass fs CPU s':>13}  {'tail CPU s':>10}  "
        f"{'top thr':>7}  {'us/cold open':>12}  {'fetched':>7}"
    )
    for config in COLD_CONFIGS:
        mine = [r for r in runs if r.config == config]
        for k, r in enumerate(mine, 1):
            p, top = r.passed, r.passed.fs_top_thread_cores
            print(
                f"{LABELS[config]:<13}  {k:3d}  {p.files_per_s:8.0f}  {p.fs_cpu_s or 0.0:13.2f}  {r.tail_cpu_s:10.2f}  "
                f"{top or 0.0:7.2f}  {r.us_per_open:12.0f}  {'-' if r.fetched is None else r.fetched:>7}"
            )
    print("median us of daemon CPU per cold open (all threads, pass + tail, from /proc):")
    for config in COLD_CONFIGS:
        m = median_cold(runs, config)
        print(f"  {LABELS[config]:<13} {m.us_per_open:6.0f} us ({m.passed.files_per_s:.0f} files/s)")


# --------------------------------------------------------------------------- reporting


def ratios(results: list[ConfigResult]) -> dict[str, dict[str, float | None]]:
    """Each configuration's cold and median-warm files/s as a ratio to direct's median warm pass."""
    base = next((r.median.files_per_s for r in results if r.config == "direct"), None)
    return {
        r.config: {
            "cold_ratio": r.cold.files_per_s / base if base else None,
            "warm_ratio": r.median.files_per_s / base if base else None,
        }
        for r in results
    }


def targets(results: list[ConfigResult]) -> list[tuple[str, bool, str]]:
    warm = ratios(results).get("seerfs", {}).get("warm_ratio")
    if warm is None:
        return []
    return [
        (f"seerfs warm >= {TARGET}x direct tmpfs", warm >= TARGET, f"{warm:.2f}x"),
        (f"stretch: seerfs warm >= {STRETCH}x direct tmpfs", warm >= STRETCH, f"{warm:.2f}x"),
    ]


def is_default(a: argparse.Namespace) -> bool:
    defaults = vars(build_parser().parse_args([]))
    return all(getattr(a, k) == defaults[k] for k in SIZING)


def print_table(data: Dataset, results: list[ConfigResult], a: argparse.Namespace, load: list[float]) -> None:
    print(f"parameters: {json.dumps(vars(a))}")
    print(
        f"dataset: {len(data.rel)} files, {data.total / 1e6:.1f} MB (mean {data.total / len(data.rel) / 1e3:.1f} KB) "
        f"on tmpfs; {a.threads} reader threads, reader {a.reader}, random order"
    )
    print(f"mergerfs -o {floorfs.MERGERFS_OPTIONS}")
    print(f"rclone mount {RCLONE_OPTIONS}")
    print(f"machine: {os.cpu_count()} cores; load average {load[0]:.2f} before, {load[1]:.2f} after\n")
    rat = ratios(results)

    def x(v: float | None) -> str:
        return f"{v:5.2f}x" if v is not None else "    - "

    def cores(v: float | None) -> str:
        return f"{v:5.2f}" if v is not None else "    -"

    def us(v: float | None) -> str:
        return f"{v:.1f}" if v is not None else "-"

    print(
        f"{'configuration':<13}  {'cold files/s':>12}  {'MB/s':>6}  {'ratio':>6}  {'warm files/s':>12}  "
        f"{'MB/s':>6}  {'ratio':>6}  {'warm range':>13}  {'n':>2}  {'rdr CPU':>7}  {'fs CPU':>6}  {'top thr':>7}  "
        f"{'busy':>5}  {'us/open':>7}  {'RA KB':>5}"
    )
    for r in results:
        m, t = r.median, r.warm_total
        lo, hi = min(p.files_per_s for p in r.warm), max(p.files_per_s for p in r.warm)
        ra = str(r.read_ahead_kb) if r.read_ahead_kb is not None else "-"
        cold_x, warm_x = x(rat[r.config]["cold_ratio"]), x(rat[r.config]["warm_ratio"])
        print(
            f"{LABELS[r.config]:<13}  {r.cold.files_per_s:12.0f}  {r.cold.mb_per_s:6.0f}  {cold_x}  "
            f"{m.files_per_s:12.0f}  {m.mb_per_s:6.0f}  {warm_x}  "
            f"{lo:6.0f}-{hi:<6.0f}  {len(r.warm):2d}  {cores(t.reader_cores):>7}  {cores(t.fs_cores):>6}  "
            f"{cores(t.fs_top_thread_cores):>7}  {t.busy_cores:5.2f}  {us(t.fs_us_per_open):>7}  {ra:>5}"
        )
    print(
        "\nratios are to direct tmpfs's median warm pass; CPU columns (cores) and us/open (the daemon's CPU per"
        " warm open, microseconds) are over all warm passes; cold CPU:"
    )
    for r in results:
        print(
            f"  {LABELS[r.config]:<13} cold: rdr {r.cold.reader_cores:.2f}, fs {cores(r.cold.fs_cores).strip()} "
            f"(top thread {cores(r.cold.fs_top_thread_cores).strip()}), "
            f"busy {r.cold.busy_cores:.2f}" + (f"; {'; '.join(r.notes)}" if r.notes else "")
        )
    print(f"bytes verified: every pass read exactly {data.total} bytes in {len(data.rel)} files")
    busy = {LABELS[r.config]: r.warm_total.others_cores for r in results if r.warm_total.others_cores > OTHERS_WARN}
    if busy:
        print(
            "WARNING: other processes used the cores during the warm passes of "
            + ", ".join(f"{k} ({v:.2f} cores)" for k, v in busy.items())
            + ": rerun on a quieter machine"
        )
    checks = targets(results)
    if checks:
        sized = ")" if is_default(a) else "; set for the default sizes, which this run does not use)"
        print(f"\ntargets of seerfs's median warm pass against direct tmpfs's (files/s{sized}")
        for name, ok, detail in checks:
            print(f"  [{'ok' if ok else 'MISSED'}] {name}: {detail}")


def to_json(data: Dataset, results: list[ConfigResult], a: argparse.Namespace, load: list[float]) -> dict[str, Any]:
    rat = ratios(results)
    return {
        "parameters": vars(a),
        "dataset": {"files": len(data.rel), "bytes": data.total},
        "mergerfs_options": floorfs.MERGERFS_OPTIONS,
        "rclone_options": RCLONE_OPTIONS,
        "load_average": {"before": load[0], "after": load[1]},
        "results": [
            {
                "config": r.config,
                "cold": r.cold.to_json(),
                "warm": [p.to_json() for p in r.warm],
                "warm_median": r.median.to_json(),
                "warm_total": r.warm_total.to_json(),
                **rat[r.config],
                "bytes_verified": r.bytes_verified,
                "read_ahead_kb": r.read_ahead_kb,
                "notes": r.notes,
            }
            for r in results
        ],
        "targets": targets(results),
    }


# --------------------------------------------------------------------------- entry point


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="bench/ceiling", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--files", type=int, default=10_000, help="files in the dataset (default 10000)")
    p.add_argument(
        "--mean-size",
        type=parse_size,
        default=125_000,
        help="mean file size, lognormal (default 125KB; units as mkdataset: 125KB, 1MiB)",
    )
    p.add_argument("--sigma", type=float, default=0.5, help="lognormal sigma of file sizes (default 0.5)")
    p.add_argument("--classes", type=int, default=10, help="class directories the files are spread over (default 10)")
    p.add_argument("--threads", type=int, default=8, help="reader threads (default 8)")
    p.add_argument(
        "--reader",
        choices=("loader", "loader-3.14", "readv"),
        default="loader",
        help="how each file is read: loader (open().read(), as torchvision's loader), loader-3.14 "
        "(the same as CPython 3.14 makes it: no isatty() ioctl) or readv (os.readv into a reused "
        "buffer); default loader",
    )
    p.add_argument("--read-size", type=parse_size, default=1 << 20, help="bytes per readv() (default 1MiB)")
    p.add_argument("--passes", type=int, default=3, help="warm passes at least, after the cold one (default 3)")
    p.add_argument(
        "--seconds", type=float, default=5.0, help="warm passes continue until they took this long together (default 5)"
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the dataset and of the read orders (default 0)")
    p.add_argument("--seerfs-o", metavar="KEY=VAL[,...]", help="config overrides for the seerfs mount (its -o)")
    p.add_argument("--configs", help=f"comma-separated subset of: {', '.join(CONFIGS)} (default all)")
    p.add_argument("--tmpfs", metavar="DIR", help="make the dataset in DIR, an existing tmpfs (default: mount one)")
    p.add_argument("--profile", metavar="DIR", help="py-spy record the Python daemons' warm passes into DIR")
    p.add_argument(
        "--cold-runs",
        type=int,
        default=0,
        metavar="N",
        help="also measure the seerfs daemon's CPU per cold open over N fresh mounts (default 0: not measured)",
    )
    p.add_argument("--cold-only", action="store_true", help="with --cold-runs: measure nothing else")
    p.add_argument("--json", action="store_true", help="print the results as JSON instead of the table")
    p.add_argument("--workdir", help="scratch directory for mountpoints and caches (default: a temp dir, removed)")
    return p


def no_open_possible() -> bool:
    """Whether a seerfs mount here can arm fuse.no_open (the native front built, CAP_SYS_ADMIN)."""
    try:
        from fusefs.fuse.native_front import may_watch
    except ImportError:
        return False
    return may_watch()


def usage_error(a: argparse.Namespace) -> str | None:
    try:
        pick_configs(a.configs, CONFIGS)
    except ValueError as exc:
        return str(exc)
    if min(a.files, a.threads, a.passes, a.classes, a.mean_size, a.read_size) < 1 or a.seconds < 0:
        return "--files, --threads, --passes, --classes, --mean-size and --read-size must be positive"
    if a.cold_runs < 0 or (a.cold_only and a.cold_runs < 1):
        return "--cold-runs must be positive (and given with --cold-only)"
    if a.tmpfs and not is_tmpfs(Path(a.tmpfs)):
        return f"--tmpfs {a.tmpfs}: not a directory on a tmpfs"
    if not a.tmpfs and os.geteuid() != 0:
        return "mounting a tmpfs needs root: run as root or pass --tmpfs DIR (an existing tmpfs such as /dev/shm)"
    return None


def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    problem = usage_error(a)
    if problem:
        print(f"bench_ceiling: {problem}", file=sys.stderr)
        return 2
    configs = pick_configs(a.configs, CONFIGS)
    for tool in ("mergerfs", "rclone"):
        if tool in configs and shutil.which(tool) is None:
            print(f"bench_ceiling: {tool} not installed: skipped", file=sys.stderr)
            configs.remove(tool)
    if "seerfs-noopen" in configs and not no_open_possible():
        print("bench_ceiling: seerfs-noopen needs the native front and CAP_SYS_ADMIN: skipped", file=sys.stderr)
        configs.remove("seerfs-noopen")
    work = Path(a.workdir or tempfile.mkdtemp(prefix="seerfs-bench-ceiling-"))
    load0 = os.getloadavg()[0]
    cold: list[ColdRun] = []
    try:
        data, results = run_all(a, work, [] if a.cold_only else configs, cold)
    except BenchError as exc:
        print(f"bench_ceiling: {exc}", file=sys.stderr)
        return 1
    finally:
        for mnt in work.glob("*mnt"):
            force_unmount(mnt)
        for mnt in work.glob("*/mnt"):
            force_unmount(mnt)
        for mnt in [*work.glob("cold-*/seerfs/mnt"), *work.glob("cold-*/*-mnt")]:
            force_unmount(mnt)
        if not a.workdir:
            shutil.rmtree(work, ignore_errors=True)
    load = [load0, os.getloadavg()[0]]
    if a.json:
        doc = to_json(data, results, a, load)
        if cold:
            doc["cold_opens"] = {
                "runs": [r.to_json() for r in cold],
                "median_us": {c: median_cold(cold, c).us_per_open for c in COLD_CONFIGS},
            }
        print(json.dumps(doc, indent=1))
        return 0
    if results:
        print_table(data, results, a, load)
    if cold:
        print_cold(data, cold, a)
    return 0


if __name__ == "__main__":
    sys.exit(main())
