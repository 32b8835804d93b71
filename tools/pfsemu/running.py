"""Running an emulator from Python (tests, benchmarks): start it in a subprocess, always stop it."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from tools.pfsemu.control import PfsemuClient, PfsStats

# ----------------------------------------------------------------------------------------------------
# Running an emulator from Python (tests, benchmarks)
# ----------------------------------------------------------------------------------------------------

LAUNCHER = Path(__file__).resolve().parent
"""The package directory: ``python3 LAUNCHER serve ...`` runs its ``__main__.py`` as the launcher scripts do."""


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
