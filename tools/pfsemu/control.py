"""The control socket: the server inside the emulator, and the client tests and benchmarks use."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

from tools.pfsemu.model import EXIT_CONTROL, PROTOCOL_VERSION, PfsemuError, describe_config
from tools.pfsemu.ops import PfsemuOperations

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
    first_open: float | None = None  # a file's: time.monotonic() (machine-wide) when its first open completed

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Counts:
        first = d.get("first_open")
        return cls(int(d["opens"]), int(d["reads"]), int(d["bytes"]), None if first is None else float(first))


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
