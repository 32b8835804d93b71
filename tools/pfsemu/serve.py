"""Serving: mount and run the emulator in this process, or fork a daemon that reports once mounted."""

from __future__ import annotations

import logging
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path

import pyfuse3
import trio

from tools.pfsemu.control import ControlServer, default_control_path
from tools.pfsemu.model import EXIT_BACKING, EXIT_INTERNAL, EXIT_MOUNTPOINT, EXIT_OK, EmulatorConfig, PfsemuError
from tools.pfsemu.ops import PfsemuOperations
from tools.pfsemu.running import is_mounted
from tools.pfsemu.timer import PreciseTimer

log = logging.getLogger("pfsemu")


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
