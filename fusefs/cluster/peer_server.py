"""Serving this daemon's cached files to its peers.

Concurrency rules:
* One trio task per connection, one request at a time on it; counters change only on the trio
  thread, between awaits.
* Nothing a connection sends can end the server: every connection task catches its own errors,
  logs at most one line, and closes only its own stream.  Bounds: ``max_connections`` open at
  once (more are told BUSY and closed), of which at most ``max_handshakes`` not yet authenticated
  (a new connection past that closes the oldest one still in its handshake, see below), deadlines
  on the handshake, on the rest of a request
  once its header arrived (the provider's answer included), on the idle wait between requests and
  on each block's send (one cancel scope per connection whose deadline moves), frame sizes capped
  by the protocol.
* Memory: a connection is accepted only the frames a client may send (GET, PING, NOTE: at most
  1 KiB each), refused by kind from the header before any payload is read, so its receive side
  holds a few KiB.  The file data of replies is reserved in a byte budget before the provider is
  asked (by the size the request names): at most ``connection_memory`` for one reply and
  ``memory`` for all of them together; a request that finds no room within ``memory_wait`` is
  answered BUSY and its asker reads the PFS.
* Strangers: anyone who can reach the port can open connections without the token.  Refusing
  newcomers once the handshake slots are full would let a stranger who keeps ``max_handshakes``
  silent connections open lock every real peer out (they would be told BUSY and read the PFS);
  closing the *oldest* pending handshake instead means a stranger must open more than
  ``max_handshakes`` connections within one honest handshake (two round trips, about a millisecond
  on a cluster network) to keep a peer out.  Authenticated connections never count against it.
* The server never reads a path from the wire: the provider maps (dataset, index, plan digest) to
  a snapshot entry and answers from local tiers only, and only when that entry's identity is the
  one the request names; the server checks the identity and length of what it sends once more.
"""

from __future__ import annotations

import logging
import socket
from collections import Counter, OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated, Literal, TypedDict

import trio
import xxhash

from fusefs.cluster import auth
from fusefs.cluster.protocol import (
    CLIENT_KINDS,
    FRAME_HEADER,
    HELLO_LEN,
    MAX_BLOCK_SIZE,
    PROOF_LEN,
    VERSION,
    Challenge,
    FileId,
    Get,
    Greeting,
    Hello,
    Note,
    Ping,
    Pong,
    ProtocolError,
    Reply,
    Status,
    Verdict,
    block_header,
    decode_message,
    parse_frame_header,
)
from fusefs.cluster.streams import Closed, Receiver
from placement.statusfields import counter, gauge, text

log = logging.getLogger(__name__)

ProvisionStatus = Literal["ok", "not_yet", "not_owned", "bad_request", "mismatch"]

_STATUS = {
    "ok": Status.OK,
    "not_yet": Status.NOT_YET,
    "not_owned": Status.NOT_OWNED,
    "bad_request": Status.BAD_REQUEST,
    "mismatch": Status.MISMATCH,
}

_SMALL_BLOCK = 256 << 10
"""Blocks up to this size go out in one send with their headers (one segment, one syscall)."""

_RECEIVE_CHUNK = 4096
"""Requests are small; a connection's buffer never needs more."""

_LOG_FIRST_REFUSALS = 10
_LOG_REFUSAL_EVERY = 1000


@dataclass
class Provision:
    """The daemon's answer to one GET: the file's bytes and its identity here, or why not."""

    status: ProvisionStatus
    data: bytes | None = None
    reason: str = ""
    file: FileId | None = None


Provider = Callable[[Get], Awaitable[Provision]]
"""GET -> Provision, from local tiers only (never the PFS); "mismatch" when the entry the request's
(dataset, index, plan digest) maps to here is not the file ``get.file`` names.  It runs under the
server's ``frame_timeout`` (cancelled past it, and the connection closed); an exception becomes an
ERROR reply and a logged traceback, never a dead server."""


class ReplyMemoryStatus(TypedDict):
    used: Annotated[int, gauge("bytes of file data held for replies now", unit="bytes")]
    peak: Annotated[int, gauge("most held at once", unit="bytes")]
    limit: Annotated[int, gauge("peers.server_memory", unit="bytes")]


class ServerStatus(TypedDict):
    """The data port this node serves its peers on."""

    port: Annotated[int | None, text("the port (null before it listens)")]
    connections: Annotated[int, gauge("connections open now")]
    connections_total: Annotated[int, counter("connections accepted", metric="accepted_connections")]
    authenticated_total: Annotated[
        int, counter("connections that proved the job token", metric="authenticated_connections")
    ]
    refused: Annotated[
        dict[str, int],
        counter(
            "connections refused, by reason: busy, handshake_timeout, crowded (the oldest of more than "
            "peers.server_connections / 4 handshakes in progress), malformed, bad_version, no_token, bad_token",
            label="reason",
            metric="refused_connections",
        ),
    ]
    requests: Annotated[
        dict[str, int],
        counter(
            "requests answered, by outcome: ok, not_yet, not_owned, bad_request, error, mismatch, busy, "
            "too_large, malformed, ping, note (an outcome appears once it happened)",
            label="outcome",
        ),
    ]
    protocol_errors: Annotated[int, counter("frames a client may not send, refused from their header")]
    provider_errors: Annotated[int, counter("requests this node failed to read its own copy for")]
    identity_mismatches: Annotated[int, counter("requests naming another file than this node has at that index")]
    reply_memory: Annotated[ReplyMemoryStatus, text("file data held for replies")]
    bytes_sent: Annotated[int, counter("file bytes sent", unit="bytes", metric="sent_bytes")]
    blocks_sent: Annotated[int, counter("blocks of file data sent")]


class ByteBudget:
    """Bytes of reply data held at once, shared by every connection (trio thread only)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self.peak = 0
        self._freed = trio.Event()

    async def acquire(self, n: int, wait: float) -> bool:
        """Reserve ``n`` bytes, waiting up to ``wait`` seconds for others to release; False if none came."""
        with trio.move_on_after(wait):
            while self.used + n > self.limit:
                await self._freed.wait()
            self.used += n
            self.peak = max(self.peak, self.used)
            return True
        return False

    def release(self, n: int) -> None:
        self.used -= n
        self._freed.set()  # wake every waiter; each re-checks, and later waiters wait on a fresh event
        self._freed = trio.Event()


class PeerServer:
    def __init__(
        self,
        token: bytes,
        provider: Provider,
        *,
        max_connections: int = 256,
        memory: int = 512 << 20,
        connection_memory: int = 256 << 20,
        memory_wait: float = 0.5,
        block_size: int = 1 << 20,
        handshake_timeout: float = 10.0,
        max_handshakes: int | None = None,
        frame_timeout: float = 10.0,
        idle_timeout: float = 120.0,
        send_timeout: float = 30.0,
        notes: Callable[[bytes], bytes] | None = None,
    ) -> None:
        auth.check_token(token)
        if not 0 < block_size <= MAX_BLOCK_SIZE:
            raise ValueError(f"block size {block_size} (1..{MAX_BLOCK_SIZE})")
        self._token = token
        self._provider = provider
        self.notes = notes  # answers a peer's state note with ours (runs on the trio thread)
        self.max_connections = max_connections
        self.budget = ByteBudget(memory)
        self.connection_memory = min(connection_memory, memory)
        self.memory_wait = memory_wait
        self.block_size = block_size
        self.handshake_timeout = handshake_timeout
        self.max_handshakes = max(1, max_connections // 4) if max_handshakes is None else max(1, max_handshakes)
        self._handshaking: OrderedDict[int, _Deadline] = OrderedDict()  # oldest first (trio thread only)
        self.frame_timeout = frame_timeout
        self.idle_timeout = idle_timeout
        self.send_timeout = send_timeout
        self.port: int | None = None
        self.connections = 0
        self.connections_total = 0
        self.authenticated_total = 0
        self.refused: Counter[str] = Counter()
        self.requests: Counter[str] = Counter()
        self.protocol_errors = 0
        self.provider_errors = 0
        self.identity_mismatches = 0
        self.bytes_sent = 0
        self.blocks_sent = 0
        self._warnings = 0

    async def serve(
        self,
        host: str,
        port: int,
        *,
        sock: socket.socket | None = None,
        task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Listen on ``host:port`` (0: any free port), or on ``sock`` already bound and listening
        (group formation needs the port before the event loop runs); ``started`` gets the port."""
        if sock is not None:
            listeners = [trio.SocketListener(trio.socket.from_stdlib_socket(sock))]
        else:
            listeners = await trio.open_tcp_listeners(port, host=host)
        self.port = int(listeners[0].socket.getsockname()[1])
        log.info("peer data port listening on %s:%d", host, self.port)
        task_status.started(self.port)
        await trio.serve_listeners(self._connection, listeners)

    def status(self) -> ServerStatus:
        return {
            "port": self.port,
            "connections": self.connections,
            "connections_total": self.connections_total,
            "authenticated_total": self.authenticated_total,
            "refused": dict(self.refused),
            "requests": dict(self.requests),
            "protocol_errors": self.protocol_errors,
            "provider_errors": self.provider_errors,
            "identity_mismatches": self.identity_mismatches,
            "reply_memory": {"used": self.budget.used, "peak": self.budget.peak, "limit": self.budget.limit},
            "bytes_sent": self.bytes_sent,
            "blocks_sent": self.blocks_sent,
        }

    # ------------------------------------------------------------------ one connection

    async def _connection(self, stream: trio.SocketStream) -> None:
        self.connections += 1
        self.connections_total += 1
        who = _address(stream)
        clock = _Deadline()
        try:
            if self.connections > self.max_connections:
                self._refuse(who, "busy", f"over {self.max_connections} connections")
                with trio.move_on_after(1.0):
                    await stream.send_all(Challenge(VERSION, Greeting.BUSY).encode())
                return
            rx = Receiver(stream, _RECEIVE_CHUNK)
            with clock.scope:
                clock.set("handshake", self.handshake_timeout)
                self._pending(clock)
                try:
                    accepted = await self._handshake(stream, rx, who)
                finally:
                    self._handshaking.pop(id(clock), None)
                if accepted:
                    self.authenticated_total += 1
                    await self._requests(stream, rx, who, clock)
            if clock.scope.cancelled_caught:
                if clock.phase == "crowded":
                    self._refuse(who, "crowded", f"over {self.max_handshakes} handshakes in progress, the oldest")
                elif clock.phase == "handshake":
                    self._refuse(who, "handshake_timeout", f"no handshake within {self.handshake_timeout:g}s")
                else:
                    log.debug("peer connection from %s closed: %s timed out", who, clock.phase)
        except (Closed, trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            log.debug("peer connection from %s ended: %s", who, exc)
        except Exception:  # a bug here must cost one connection, never the server
            log.exception("peer connection from %s failed", who)
        finally:
            self.connections -= 1
            await trio.aclose_forcefully(stream)

    def _pending(self, clock: _Deadline) -> None:
        """Count a connection in its handshake; past ``max_handshakes`` the oldest one is closed."""
        self._handshaking[id(clock)] = clock
        while len(self._handshaking) > self.max_handshakes:
            _key, oldest = self._handshaking.popitem(last=False)
            oldest.phase = "crowded"
            oldest.scope.cancel()

    def _refuse(self, who: str, why: str, detail: str) -> None:
        self.refused[why] += 1
        n = sum(self.refused.values())
        if n <= _LOG_FIRST_REFUSALS or n % _LOG_REFUSAL_EVERY == 0:
            log.warning("peer connection from %s refused: %s (%d refused so far)", who, detail, n)

    def _warn(self, fmt: str, *args: object) -> None:
        """Log what a peer got wrong, rate-limited: a hostile or broken peer must not flood the log."""
        self._warnings += 1
        n = self._warnings
        if n <= _LOG_FIRST_REFUSALS or n % _LOG_REFUSAL_EVERY == 0:
            log.warning(fmt + " (%d such so far)", *args, n)

    async def _handshake(self, stream: trio.SocketStream, rx: Receiver, who: str) -> bool:
        try:
            hello = Hello.decode(await rx.exactly(HELLO_LEN))
        except Closed as exc:
            self._refuse(who, "malformed", f"closed during handshake ({exc})")
            return False
        except ProtocolError as exc:
            self._refuse(who, "malformed", str(exc))
            return False
        if hello.version != VERSION:
            self._refuse(who, "bad_version", f"protocol version {hello.version} (this daemon speaks {VERSION})")
            await stream.send_all(Challenge(VERSION, Greeting.BAD_VERSION).encode())
            return False
        nonce = auth.new_nonce()
        proof = auth.server_proof(self._token, hello.nonce, nonce)
        await stream.send_all(Challenge(VERSION, Greeting.GO, nonce, proof).encode())
        try:
            answer = await rx.exactly(PROOF_LEN)
        except Closed:
            self._refuse(who, "no_token", "closed before proving the job token")
            return False
        if not auth.proof_ok(auth.client_proof(self._token, hello.nonce, nonce), answer):
            self._refuse(who, "bad_token", "wrong job token")
            await stream.send_all(bytes([Verdict.REFUSED]))
            return False
        await stream.send_all(bytes([Verdict.ACCEPTED]))
        return True

    async def _requests(self, stream: trio.SocketStream, rx: Receiver, who: str, clock: _Deadline) -> None:
        while True:
            clock.set("idle", self.idle_timeout)
            try:
                header = await rx.exactly(FRAME_HEADER.size)
            except Closed as exc:
                if not exc.clean:
                    raise
                return
            clock.set("request", self.frame_timeout)
            try:
                # The kind decides before the payload is read: a client never sends BLOCK (up to
                # 16 MiB), so that length is never awaited, let alone buffered.
                kind, length = parse_frame_header(header, accept=CLIENT_KINDS)
                message = decode_message(kind, await rx.exactly(length))
                if not isinstance(message, Get | Ping | Note) or (isinstance(message, Note) and message.reply):
                    raise ProtocolError(f"{kind.name} frame sent to a server")
            except ProtocolError as exc:
                self.protocol_errors += 1
                self.requests["malformed"] += 1
                self._warn("peer connection from %s: %s; closed", who, exc)
                clock.set("error reply", 1.0)
                await stream.send_all(Reply(0, Status.BAD_REQUEST, reason=str(exc)).encode())
                return
            if isinstance(message, Ping):
                self.requests["ping"] += 1
                clock.set("send", self.send_timeout)
                await stream.send_all(Pong(message.request_id).encode())
                continue
            if isinstance(message, Note):
                self.requests["note"] += 1
                answer = b""
                if self.notes is not None:
                    try:
                        answer = self.notes(message.body)
                    except Exception:
                        self.provider_errors += 1
                        log.exception("peer note from %s could not be handled", who)
                clock.set("send", self.send_timeout)
                await stream.send_all(Note(message.request_id, answer, reply=True).encode())
                continue
            await self._answer(stream, message, clock)

    async def _answer(self, stream: trio.SocketStream, get: Get, clock: _Deadline) -> None:
        want = get.file.size
        if want > self.connection_memory:
            self.requests["too_large"] += 1
            clock.set("send", self.send_timeout)
            reason = f"file of {want} bytes is over this server's {self.connection_memory}-byte reply limit"
            await stream.send_all(Reply(get.request_id, Status.BUSY, reason=reason).encode())
            return
        if not await self.budget.acquire(want, self.memory_wait):
            self.requests["busy"] += 1
            clock.set("send", self.send_timeout)
            reason = f"no room for a {want}-byte reply ({self.budget.used} of {self.budget.limit} bytes in use)"
            await stream.send_all(Reply(get.request_id, Status.BUSY, reason=reason).encode())
            return
        try:
            await self._answer_within(stream, get, clock)
        finally:
            self.budget.release(want)

    async def _answer_within(self, stream: trio.SocketStream, get: Get, clock: _Deadline) -> None:
        data: bytes | None = None
        try:
            provision = await self._provider(get)
            status, data, reason = _STATUS[provision.status], provision.data, provision.reason
            if status is Status.OK:
                if data is None:
                    raise ValueError("provider said ok without data")
                nbytes = memoryview(data).nbytes
                if provision.file != get.file or nbytes != get.file.size:  # never another file's bytes
                    status, data = Status.MISMATCH, None
                    reason = f"this node holds {provision.file} with {nbytes} bytes there"
        except Exception as exc:
            self.provider_errors += 1
            log.exception("peer request for dataset %d index %d failed", get.dataset, get.index)
            status, data, reason = Status.ERROR, None, f"server error: {exc}"
        self.requests[status.name.lower()] += 1
        if status is Status.MISMATCH:
            self.identity_mismatches += 1
            self._warn(
                "peer asked for dataset %d index %d as %s: %s; refused", get.dataset, get.index, get.file, reason
            )
        if data is None or status is not Status.OK:
            clock.set("send", self.send_timeout)
            await stream.send_all(Reply(get.request_id, status, reason=reason).encode())
            return
        await self._send_file(stream, get, data, clock)

    async def _send_file(self, stream: trio.SocketStream, get: Get, data: bytes, clock: _Deadline) -> None:
        view = memoryview(data).cast("B")
        size = len(view)
        bs = self.block_size
        prefix = Reply(get.request_id, Status.OK, size, bs, entry=get.file.entry, mtime_ns=get.file.mtime_ns).encode()
        for first in range(0, max(size, 1), bs):
            block = view[first : first + bs]
            head = prefix + block_header(len(block), xxhash.xxh3_64_intdigest(block))
            prefix = b""
            clock.set("send", self.send_timeout)
            if len(block) <= _SMALL_BLOCK:
                await stream.send_all(head + block)
            else:
                await stream.send_all(head)
                await stream.send_all(block)
            self.blocks_sent += 1
            self.bytes_sent += len(block)


DeadlinePhase = Literal["handshake", "idle", "request", "error reply", "send", "crowded"]
"""What a connection is doing while its deadline runs (named in the log when it times out)."""


class _Deadline:
    """One cancel scope per connection whose deadline moves with the phase it is in (cheaper than a
    scope per step), and the phase, so a timeout can say what was too slow."""

    __slots__ = ("phase", "scope")

    def __init__(self) -> None:
        self.scope = trio.CancelScope()
        self.phase: DeadlinePhase | Literal[""] = ""

    def set(self, phase: DeadlinePhase, seconds: float) -> None:
        self.phase = phase
        self.scope.deadline = trio.current_time() + seconds


def _address(stream: trio.SocketStream) -> str:
    try:
        host, port = stream.socket.getpeername()[:2]
    except OSError:
        return "?"
    return f"{host}:{port}"
