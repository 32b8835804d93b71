"""Mount lifecycle: check what a user can get wrong, daemonise, build the filesystem, serve, clean up.

Why this order: every check a user can fail (source, mountpoint, /dev/fuse, allow_other) runs in the
calling process before anything forks, so the error is one line on their terminal.  The daemon
then forks *before* any thread exists (numpy, trio and the walker all start threads), and reports
readiness or its own failure through a pipe so ``seerfs mount`` returns only once the mount answers.

The pipe carries one line per message: ``PROGRESS {json}`` while the daemon starts (the walk of a
large source takes minutes), then exactly one ``READY`` or ``ERR CODE TEXT``.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from io import TextIOWrapper
from typing import TYPE_CHECKING, Any

from fusefs import mountinfo
from fusefs.daemon.checks import MountRequest
from fusefs.daemon.runtime import StartRecord
from fusefs.errors import DeadMount, ExitCode, SeerfsError, TimeoutExpired
from fusefs.progress import LOG_INTERVAL_S, ProgressDoc, ProgressPrinter, current_line
from fusefs.trust import trusted_dir
from fusefs.waiting import WaitTimeout, wait_until

if TYPE_CHECKING:
    from fusefs.daemon.assembly import Daemon
    from fusefs.daemon.status import StartupTask

log = logging.getLogger("seerfs")


def setup_logging(req: MountRequest, foreground: bool) -> None:
    root = logging.getLogger()
    root.handlers.clear()
    root.setLevel(req.config.log_level.upper())
    fmt = logging.Formatter("%(asctime)s %(levelname)s %(name)s[%(process)d]: %(message)s")
    trusted_dir(req.log_file.parent, "log_file" if req.config.log_file else "cache_dir")
    fh = NoFollowFileHandler(req.log_file)
    fh.setFormatter(fmt)
    root.addHandler(fh)
    if foreground:
        sh = logging.StreamHandler(sys.stderr)
        sh.setFormatter(fmt)
        root.addHandler(sh)


class NoFollowFileHandler(logging.FileHandler):
    """The log, opened with O_NOFOLLOW and born 0600: a symlink at its name is refused (ELOOP), never
    written through, although its directory is trusted already (:mod:`fusefs.trust`)."""

    def _open(self) -> TextIOWrapper:
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC | os.O_NOFOLLOW
        fd = os.open(self.baseFilename, flags, 0o600)
        return open(fd, "a", encoding=self.encoding, errors=self.errors)


# --------------------------------------------------------------------------- daemonising


def mount_background(req: MountRequest, timeout: float = 600.0) -> None:
    """Fork a daemon and return once its mount answers; a daemon failure is raised here."""
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:  # first child: new session, then fork again so the daemon can never regain a tty
        os.close(rfd)
        os.setsid()
        if os.fork() != 0:
            os._exit(0)
        _detach_stdio()
        code = run_daemon(req, foreground=False, ready_fd=wfd)
        os._exit(code)
    os.close(wfd)
    os.waitpid(pid, 0)
    printer = ProgressPrinter(sys.stderr)
    try:
        message = _read_ready(rfd, timeout, lambda doc: printer.show(current_line(doc)))
    except TimeoutExpired as exc:
        if printer.latest:
            raise TimeoutExpired(f"{exc}; it goes on ({printer.latest}): see 'seerfs status'") from None
        raise
    finally:
        printer.close()
    if message.startswith("READY"):
        wait_answering(req.mountpoint, timeout)
        return
    if message.startswith("ERR "):
        _, code_text, text = message.split(" ", 2)
        raise SeerfsError(text.strip(), ExitCode(int(code_text)))
    raise SeerfsError(f"daemon exited during startup; see {req.log_file}", ExitCode.INTERNAL)


def _read_ready(fd: int, timeout: float, on_progress: Callable[[dict[str, Any]], None] | None = None) -> str:
    """The daemon's final READY/ERR line; PROGRESS lines before it go to ``on_progress``."""
    import select

    data = b""
    deadline = time.monotonic() + timeout
    try:
        while True:
            while b"\n" in data:
                raw, data = data.split(b"\n", 1)
                line = raw.decode(errors="replace")
                if not line.startswith("PROGRESS "):
                    return line
                if on_progress is not None:
                    with contextlib.suppress(ValueError):
                        on_progress(json.loads(line.removeprefix("PROGRESS ")))
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutExpired(f"daemon not ready after {timeout:g}s")
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                continue
            chunk = os.read(fd, 4096)
            if not chunk:
                return data.decode(errors="replace")
            data += chunk
    finally:
        os.close(fd)


def _detach_stdio() -> None:
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    os.close(devnull)


def wait_answering(mountpoint: str, timeout: float, poll: Callable[[], None] | None = None) -> None:
    """Poll until the mount is a seerfs mount whose control files answer; ``poll`` runs each round."""
    probe = os.path.join(mountpoint, ".control", "status")

    def answering() -> bool:
        if poll is not None:
            poll()
        if not mountinfo.is_seerfs(mountpoint):
            return False
        try:
            os.stat(probe)
        except OSError as exc:
            if exc.errno in DEAD_ERRNOS:
                raise dead_mount(mountpoint) from None
            return False
        return True

    try:
        wait_until(answering, timeout, "the mount to answer", first_delay=0.005, max_delay=0.1)
    except WaitTimeout:
        raise TimeoutExpired(f"{mountpoint}: mount not answering after {timeout:g}s") from None


DEAD_ERRNOS = (errno.ENOTCONN, errno.ECONNABORTED)
"""What the kernel answers on a FUSE mount whose daemon is gone (ECONNABORTED: to a request in flight
when it died)."""


def dead_mount(mountpoint: str) -> DeadMount:
    return DeadMount(f"{mountpoint}: daemon is gone (transport endpoint is not connected); run 'seerfs umount'")


class ReadyPipe:
    """The write end of the readiness pipe, shared by the startup reporter thread and the main thread.

    One lock serialises writes (a PROGRESS line must never interleave with READY); once the final
    line is written the pipe is closed and later progress writes are dropped.  A reader that went
    away (the user interrupted ``seerfs mount``) only stops the messages, never the daemon.
    """

    def __init__(self, fd: int | None) -> None:
        self.fd = fd
        self.lock = threading.Lock()

    def write(self, line: str, final: bool = False) -> None:
        with self.lock:
            if self.fd is None:
                return
            try:
                os.write(self.fd, line.encode() + b"\n")
            except OSError:
                final = True
            if final:
                with contextlib.suppress(OSError):
                    os.close(self.fd)
                self.fd = None


def _notify(pipe: ReadyPipe, line: str) -> None:
    pipe.write(line, final=True)


class StartupReporter:
    """While the daemon starts: progress to the readiness pipe (twice a second), to the start record
    ``seerfs wait``/``status`` read (each second), and to the log (every 10 s, the --fg output)."""

    PIPE_INTERVAL_S = 0.5
    RECORD_INTERVAL_S = 1.0

    def __init__(self, req: MountRequest, server: Daemon, pipe: ReadyPipe) -> None:
        self.req = req
        self.server = server
        self.pipe = pipe
        self.record = StartRecord(os.getpid(), req.mountpoint, req.source, str(req.log_file), time.time())
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="startup-progress", daemon=True)

    def __enter__(self) -> StartupReporter:
        self._publish(record=True)
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()
        self.record.remove()

    def _publish(self, record: bool) -> dict[StartupTask, ProgressDoc]:
        doc = self.server.startup_progress()
        self.pipe.write("PROGRESS " + json.dumps(doc))
        if record:
            self.record.progress = doc
            try:
                self.record.write()
            except OSError as exc:  # status/wait then show nothing until the mount answers: no reason to fail
                log.debug("start record not written: %s", exc)
        return doc

    def _run(self) -> None:
        last_record = last_log = time.monotonic()
        while not self.stop.wait(self.PIPE_INTERVAL_S):
            now = time.monotonic()
            doc = self._publish(record=now - last_record >= self.RECORD_INTERVAL_S)
            if now - last_record >= self.RECORD_INTERVAL_S:
                last_record = now
            if now - last_log >= LOG_INTERVAL_S:
                last_log = now
                log.info("%s", current_line(doc))


# --------------------------------------------------------------------------- serving


PRIVATE_UMASK = 0o077
"""Everything the daemon creates (snapshots, plans, tier copies, logs, rendezvous files) is its
user's alone: other local users must not read cached dataset bytes or the job token."""

FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
"""A startup write that fails with these is the user's full cache (or tier) filesystem, not a bug."""


def full_message(req: MountRequest, exc: OSError) -> str:
    """Name the directory that is full: cache_dir, or the tier directory the failed write was in."""
    cache = req.config.cache_path
    name = str(exc.filename or "")
    if name and not os.path.abspath(name).startswith(str(cache.absolute()) + os.sep):
        return f"{os.path.dirname(name)}: {exc.strerror} (writing {name})"
    return f"cache_dir {cache}: {exc.strerror}" + (f" (writing {name})" if name else "")


def _startup_failed(req: MountRequest, exc: BaseException, pipe: ReadyPipe) -> int:
    log.error("startup failed: %s\n%s", exc, traceback.format_exc())
    _notify(pipe, f"ERR {int(ExitCode.INTERNAL)} startup failed: {exc} (see {req.log_file})")
    return int(ExitCode.INTERNAL)


def run_daemon(req: MountRequest, foreground: bool, ready_fd: int | None = None) -> int:
    """Serve until unmounted; returns the process exit code. Never raises."""
    os.umask(PRIVATE_UMASK)
    pipe = ReadyPipe(ready_fd)
    try:
        setup_logging(req, foreground)
    except SeerfsError as exc:  # its directory is not trusted (fusefs.trust)
        _notify(pipe, f"ERR {int(exc.code)} {exc}")
        return int(exc.code)
    except OSError as exc:
        why = "is a symlink; seerfs does not write through one" if exc.errno == errno.ELOOP else exc.strerror
        _notify(pipe, f"ERR {int(ExitCode.CONFIG)} log file {req.log_file}: {why}")
        return int(ExitCode.CONFIG)
    try:
        from fusefs.daemon.assembly import Daemon

        server = Daemon(req)
        with StartupReporter(req, server, pipe):
            server.start()
    except SeerfsError as exc:
        log.error("%s", exc)
        _notify(pipe, f"ERR {int(exc.code)} {exc}")
        return int(exc.code)
    except OSError as exc:
        if exc.errno not in FULL_ERRNOS:
            return _startup_failed(req, exc, pipe)
        text = full_message(req, exc)
        log.error("%s", text)
        _notify(pipe, f"ERR {int(ExitCode.CONFIG)} {text}")
        return int(ExitCode.CONFIG)
    except Exception as exc:
        return _startup_failed(req, exc, pipe)
    _notify(pipe, "READY")
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    try:
        server.serve()
    except Exception:
        log.error("daemon failed:\n%s", traceback.format_exc())
        return int(ExitCode.INTERNAL)
    finally:
        server.close()
    return 0
