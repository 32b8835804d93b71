"""Fetching files from one remote daemon, with a bounded wait and a health verdict.

Why the shape (detect and shrink: the group goes on without a failed member instead of stopping): a
peer that crashed or hung must never stop this node.  Every fetch is bounded by one deadline,
``timeout`` seconds from its call, covering the wait for a request slot, connecting, the handshake
and the transfer; anything short of a verified answer by then is "fall back to the PFS now".  After
``down_after`` consecutive failures the peer is down: fetches raise :class:`PeerDown` at once,
without touching the network, until ``retry_down_after`` seconds have passed; then one fetch is let
through as a probe and its outcome decides.  State notes still go to a down peer
(:meth:`PeerClient.note`), and an answered one marks it up; a note heard from it lets the next
fetch probe at once.

Every time here is trio's clock (``trio.current_time()``), never the wall or monotonic clock
directly, so health runs on a test's MockClock exactly as in the daemon.

Every file asked for is named by its identity in this node's snapshot (entry, size, mtime_ns); an
answer for any other file is refused, counted and logged, and the caller reads the PFS.

Concurrency rules:
* At most ``max_requests`` fetches talk to the peer at once (a ``CapacityLimiter``); each uses a
  pooled connection alone and returns it only after a complete, verified exchange.  A fetch that
  fails, times out or is cancelled closes its connection (its stream state is unknown).
* State and counters change only on the trio thread, between awaits.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Annotated, Literal, TypedDict, cast

import trio
import xxhash

from fusefs.cluster import auth
from fusefs.cluster.protocol import (
    BLOCK_HEADER_LEN,
    CHALLENGE_LEN,
    DEFAULT_MAX_FILE_SIZE,
    FRAME_HEADER,
    HELD_ONLY,
    SERVER_KINDS,
    VERDICT_LEN,
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
    block_count,
    decode_message,
    decode_verdict,
    parse_block_header,
    parse_frame_header,
)
from fusefs.cluster.streams import Closed, Receiver
from fusefs.tiers.digest import BLOCK, BlockDigests
from placement.statusfields import counter, gauge, state, text

log = logging.getLogger(__name__)

_U32 = 0xFFFFFFFF
_RECEIVE_CHUNK = 256 << 10


class PeerDown(Exception):
    """The peer is marked down; no request was tried."""


class _Failed(Exception):
    """This exchange failed in a way that counts against the peer's health."""


@contextmanager
def _lost_midway() -> Iterator[None]:
    """An answer cut off after its first byte is a failure, never a stale pooled connection to retry."""
    try:
        yield
    except Closed as exc:
        raise _Failed(str(exc)) from None
    except trio.ClosedResourceError:
        raise _Failed("connection closed by this daemon") from None
    except (trio.BrokenResourceError, OSError) as exc:
        raise _Failed(f"connection error: {exc}") from None


class _Mismatch(_Failed):
    """The bytes did not match their digests or the expected size."""


class _WrongFile(_Mismatch):
    """An OK answer for another file than the one asked for (its identity differs)."""


class _Busy(Exception):
    """The peer refused the connection for lack of room (alive, so not a health failure)."""


class _Stale(Exception):
    """A pooled connection turned out closed before the request got any answer."""


@dataclass(frozen=True, slots=True)
class Received:
    """A verified file; ``digests`` when the peer's blocks are tier digest blocks (reusable by a put)."""

    data: bytes
    digests: BlockDigests | None


@dataclass
class PeerCounters:
    requests: int = 0
    ok: int = 0
    not_yet: int = 0
    not_owned: int = 0
    bad_request: int = 0
    errors: int = 0  # the peer answered that it could not read its copy
    busy: int = 0  # refused for lack of connections, or no request slot before the deadline
    failures: int = 0  # timeouts, connection errors, protocol errors, mismatches
    timeouts: int = 0
    mismatches: int = 0
    identity_mismatches: int = 0  # answers (or refusals) naming another file than the one asked for
    refused_down: int = 0  # fetches answered PeerDown without a request
    times_down: int = 0
    bytes: int = 0
    ok_seconds: float = 0.0
    max_seconds: float = 0.0
    connects: int = 0


PeerState = Literal["up", "down"]


class _PeerState(TypedDict):
    state: Annotated[PeerState, state("up or down (down after peers.down_after consecutive failures)")]


class PeerCountersStatus(TypedDict):
    """The requests to one peer (the fields of :class:`PeerCounters`)."""

    requests: Annotated[int, counter("requests sent")]
    ok: Annotated[int, counter("answered with the file")]
    not_yet: Annotated[int, counter("answered: the owner does not hold it yet")]
    not_owned: Annotated[int, counter("answered: the peer does not own it")]
    bad_request: Annotated[int, counter("answered: the request was bad")]
    errors: Annotated[int, counter("answered: the peer could not read its copy")]
    busy: Annotated[int, counter("refused for lack of connections, or no request slot before the deadline")]
    failures: Annotated[int, counter("timeouts, connection errors, protocol errors and mismatches")]
    timeouts: Annotated[int, counter("requests unanswered within peers.timeout")]
    mismatches: Annotated[int, counter("answers whose bytes failed their digest")]
    identity_mismatches: Annotated[
        int,
        counter(
            "answers or refusals naming another file than the one asked for: its plan or snapshot "
            "disagrees; those files are read from the PFS"
        ),
    ]
    refused_down: Annotated[int, counter("fetches answered at once because the peer is down (no request sent)")]
    times_down: Annotated[int, counter("times it was marked down")]
    bytes: Annotated[int, counter("file bytes received")]
    ok_seconds: Annotated[float, counter("total time of the answered requests")]
    max_seconds: Annotated[float, gauge("longest answered request")]
    connects: Annotated[int, counter("connections opened")]


class PeerLinkStatus(_PeerState, PeerCountersStatus):
    """What this node's client knows of one peer."""

    mean_seconds: Annotated[float | None, gauge("mean time of an answered request (null before one)")]
    consecutive_failures: Annotated[int, gauge("failures since the last success")]
    last_error: Annotated[str, text("the last failure, or empty")]
    down_for_seconds: Annotated[float | None, gauge("seconds since it was marked down (null while up)")]
    connections: Annotated[int, gauge("connections open")]
    idle_connections: Annotated[int, gauge("of those, idle in the pool")]


@dataclass
class _Conn:
    stream: trio.SocketStream
    rx: Receiver
    last_used: float


class PeerClient:
    """One remote daemon: pooled authenticated connections, bounded requests, up/down state."""

    def __init__(
        self,
        node: int,
        host: str,
        port: int,
        token: bytes,
        *,
        timeout: float,
        max_requests: int,
        down_after: int,
        retry_down_after: float = 10.0,
        max_file_size: int = DEFAULT_MAX_FILE_SIZE,
        pool_idle: float = 60.0,
        on_state: Callable[[PeerState], None] | None = None,
    ) -> None:
        """``on_state``: told when this client marks its peer down, or finds it up again."""
        auth.check_token(token)
        if timeout <= 0 or max_requests < 1 or down_after < 1:
            raise ValueError("timeout must be > 0, max_requests and down_after >= 1")
        self.node = node
        self.host = host
        self.port = port
        self._token = token
        self.timeout = timeout
        self.max_requests = max_requests
        self.down_after = down_after
        self.retry_down_after = retry_down_after
        self.max_file_size = max_file_size
        self.pool_idle = pool_idle
        self.counters = PeerCounters()
        self.consecutive_failures = 0
        self.last_error = ""
        self._down_since: float | None = None  # trio.current_time() when marked down (or last probe failed)
        self._probing = False
        self._closed = False
        self._limiter = trio.CapacityLimiter(max_requests)
        self._idle: list[_Conn] = []
        self._open: set[trio.SocketStream] = set()
        self._next_id = 0
        # Told "down" when this client marks the peer down and "up" when a request succeeds again
        # (on the trio thread, inside the request that decided it; it must not await).
        self.on_state = on_state

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def state(self) -> PeerState:
        return "down" if self._down_since is not None or self._closed else "up"

    # ------------------------------------------------------------------ public API

    async def fetch(
        self, dataset: int, index: int, digest: bytes, file: FileId, *, held_only: bool = False
    ) -> bytes | None:
        """The file's bytes (every block verified, the answer for ``file`` and no other), or None:
        fall back to the PFS now.  ``held_only``: only a copy the peer holds now, never one it
        would read from the PFS for this request (protocol.HELD_ONLY)."""
        received = await self.fetch_verified(dataset, index, digest, file, held_only=held_only)
        return None if received is None else received.data

    async def fetch_verified(
        self, dataset: int, index: int, digest: bytes, file: FileId, *, held_only: bool = False
    ) -> Received | None:
        """Like :meth:`fetch`, with the block digests when they can be handed to a tier put."""
        flags = HELD_ONLY if held_only else 0
        outcome = await self._exchange(lambda rid: Get(rid, dataset, index, digest, file, flags))
        if isinstance(outcome, Received | None):
            return outcome
        return None

    async def note(self, body: bytes) -> bytes | None:
        """Tell the peer a state note; its own note back, or None when the exchange failed.

        Sent while the peer is down too, unlike every other request: notes are how two members learn
        the other is alive again.  After a stall that each side saw as the other's (both timed out
        the other's requests), neither would send the other a note until ``retry_down_after``, so
        neither's :meth:`heard_from` would fire, and both would read the PFS for everything the
        other holds until then.  An answered note is an exchange with the peer's data port like any
        other (same connection, handshake and deadline): it marks the peer up.  A failed one while
        down only counts (no log line, no new wait: a dead peer is told every state round)."""
        outcome = await self._exchange(lambda rid: Note(rid, body), liveness=True)
        return outcome.body if isinstance(outcome, Note) else None

    async def ping(self) -> float | None:
        """Round-trip seconds of a PING, or None when it failed (counted like a fetch)."""
        t0 = trio.current_time()
        outcome = await self._exchange(Ping)
        return trio.current_time() - t0 if isinstance(outcome, Pong) else None

    def heard_from(self) -> None:
        """The peer just talked to us (a state note over its own connection): it is alive, so a
        down verdict is stale; let the next request probe it now instead of after retry_down_after."""
        if self._down_since is not None and not self._probing:
            self._down_since = min(self._down_since, trio.current_time() - self.retry_down_after)

    def status(self) -> PeerLinkStatus:
        c = self.counters
        counts = cast(PeerCountersStatus, asdict(c))  # PeerCountersStatus documents PeerCounters one to one
        now, since = _now(), self._down_since
        return {
            "state": self.state,
            **counts,
            "ok_seconds": round(c.ok_seconds, 6),
            "max_seconds": round(c.max_seconds, 6),
            "mean_seconds": round(c.ok_seconds / c.ok, 6) if c.ok else None,
            "consecutive_failures": self.consecutive_failures,
            "last_error": self.last_error,
            "down_for_seconds": round(now - since, 3) if now is not None and since is not None else None,
            "connections": len(self._open),
            "idle_connections": len(self._idle),
        }

    def close_now(self) -> None:
        """Like :meth:`aclose` without a checkpoint (its member left the group)."""
        self._closed = True
        for conn in self._idle:
            self._discard_now(conn)
        self._idle.clear()
        for stream in list(self._open):
            stream.socket.close()
        self._open.clear()

    async def aclose(self) -> None:
        """Close every connection; later fetches raise PeerDown."""
        self._closed = True
        self._idle.clear()
        for stream in list(self._open):
            await trio.aclose_forcefully(stream)
        self._open.clear()

    # ------------------------------------------------------------------ health

    def _admit(self) -> bool:
        """Whether this call may talk to the peer; True when it is the probe of a down peer."""
        if self._closed:
            raise PeerDown(f"peer {self.node} ({self.address}): client closed")
        if self._down_since is None:
            return False
        if self._probing or trio.current_time() - self._down_since < self.retry_down_after:
            self.counters.refused_down += 1
            raise PeerDown(f"peer {self.node} ({self.address}) is down: {self.last_error}")
        self._probing = True
        return True

    def _succeeded(self) -> None:
        self.consecutive_failures = 0
        if self._down_since is not None:
            log.warning("peer %d (%s) is up again", self.node, self.address)
            self._down_since = None
            if self.on_state is not None:
                self.on_state("up")

    def _failed(self, why: str, probe: bool) -> None:
        self.counters.failures += 1
        self.consecutive_failures += 1
        self.last_error = why
        if self._down_since is not None:
            if probe:  # wait retry_down_after again (a fetch from before the verdict changes nothing)
                self._down_since = trio.current_time()
                log.info("peer %d (%s) still down: %s", self.node, self.address, why)
        elif self.consecutive_failures >= self.down_after:
            self._down_since = trio.current_time()
            self.counters.times_down += 1
            log.warning(
                "peer %d (%s) marked down after %d consecutive failures: %s",
                self.node,
                self.address,
                self.consecutive_failures,
                why,
            )
            for conn in self._idle:
                self._discard_now(conn)
            self._idle.clear()
            if self.on_state is not None:
                self.on_state("down")
        else:
            log.info("peer %d (%s) request failed: %s", self.node, self.address, why)

    # ------------------------------------------------------------------ one exchange

    async def _exchange(
        self, make: Callable[[int], Get | Ping | Note], *, liveness: bool = False
    ) -> Received | Pong | Note | None:
        """One request under the deadline; ``liveness``: a note, let through while the peer is down
        (see :meth:`note`); its failure then changes nothing but the counters."""
        past_down = liveness and self._down_since is not None and not self._closed
        probe = False if past_down else self._admit()
        t0 = trio.current_time()
        deadline = t0 + self.timeout
        slot = False
        try:
            with trio.move_on_at(deadline) as scope:
                async with self._limiter:
                    slot = True
                    if not probe and not past_down and self._down_since is not None:
                        self.counters.refused_down += 1
                        raise PeerDown(f"peer {self.node} ({self.address}) went down: {self.last_error}")
                    self.counters.requests += 1
                    self._next_id = (self._next_id + 1) & _U32
                    reply, received = await self._request(make(self._next_id))
            if scope.cancelled_caught:
                if not slot:
                    self.counters.busy += 1
                    return None
                self.counters.timeouts += 1
                self._failed(f"no answer within {self.timeout:g}s", probe)
                return None
        except _Mismatch as exc:
            self.counters.mismatches += 1
            if isinstance(exc, _WrongFile):
                self._wrong_file(str(exc))
            self._failed(str(exc), probe)
            return None
        except _Failed as exc:
            self._failed(str(exc), probe)
            return None
        except _Busy:
            self.counters.busy += 1
            return None
        finally:
            if probe:
                self._probing = False
        self._succeeded()
        if isinstance(reply, Pong | Note):
            return reply
        return self._count_reply(reply, received, trio.current_time() - t0)

    def _count_reply(self, reply: Reply, received: Received | None, seconds: float) -> Received | None:
        c = self.counters
        if reply.status is Status.OK and received is not None:
            c.ok += 1
            c.bytes += len(received.data)
            c.ok_seconds += seconds
            c.max_seconds = max(c.max_seconds, seconds)
            return received
        if reply.status is Status.NOT_YET:
            c.not_yet += 1
        elif reply.status is Status.NOT_OWNED:
            c.not_owned += 1
        elif reply.status is Status.MISMATCH:
            self._wrong_file(f"the peer holds another file at that index: {reply.reason}")
        elif reply.status is Status.BUSY:
            c.busy += 1
        elif reply.status is Status.BAD_REQUEST:
            c.bad_request += 1
            if c.bad_request <= 10:
                log.warning("peer %d (%s) refused a request: %s", self.node, self.address, reply.reason)
        else:
            c.errors += 1
            if c.errors <= 10:
                log.warning("peer %d (%s) could not serve a file: %s", self.node, self.address, reply.reason)
        return None

    def _wrong_file(self, why: str) -> None:
        c = self.counters
        c.identity_mismatches += 1
        if c.identity_mismatches <= 10 or c.identity_mismatches % 1000 == 0:
            log.warning(
                "peer %d (%s): %s (%d identity mismatches so far; read from the PFS)",
                self.node,
                self.address,
                why,
                c.identity_mismatches,
            )

    async def _request(self, message: Get | Ping | Note) -> tuple[Reply | Pong | Note, Received | None]:
        conn, reused = await self._checkout()
        try:
            try:
                answer = await self._ask(conn, message)
            except _Stale:
                if not reused:
                    raise _Failed("connection closed by the peer") from None
                self._discard_now(conn)
                conn = await self._connect()
                answer = await self._ask(conn, message)
            received = None
            if isinstance(answer, Reply) and answer.status is Status.OK:
                assert isinstance(message, Get)
                received = await self._receive_body(conn.rx, answer, message.file)
            self._checkin(conn)
            return answer, received
        except BaseException:
            await self._discard(conn)
            raise

    async def _ask(self, conn: _Conn, message: Get | Ping | Note) -> Reply | Pong | Note:
        """Send a request and read its answer's frame (a closed pooled connection raises _Stale)."""
        try:
            await conn.stream.send_all(message.encode())
            header = await conn.rx.exactly(FRAME_HEADER.size)
        except Closed as exc:
            if exc.clean:
                raise _Stale() from None
            raise _Failed(str(exc)) from None
        except (trio.BrokenResourceError, ConnectionError) as exc:
            raise _Stale() from exc
        except trio.ClosedResourceError:
            raise _Failed("connection closed by this daemon") from None
        except OSError as exc:
            raise _Failed(f"connection error: {exc}") from None
        try:
            kind, length = parse_frame_header(header, accept=SERVER_KINDS)
            answer = decode_message(kind, await self._receive(conn.rx, length))
        except ProtocolError as exc:
            raise _Failed(f"protocol error: {exc}") from None
        assert isinstance(answer, Reply | Pong | Note)
        if answer.request_id != message.request_id:
            raise _Failed(f"answer to request {answer.request_id}, expected {message.request_id}")
        expected = {Ping: Pong, Note: Note, Get: Reply}[type(message)]
        if not isinstance(answer, expected):
            raise _Failed(f"{type(answer).__name__} to a {type(message).__name__}")
        return answer

    async def _receive(self, rx: Receiver, n: int) -> bytes:
        with _lost_midway():
            return await rx.exactly(n)

    async def _receive_body(self, rx: Receiver, reply: Reply, file: FileId) -> Received:
        size, bs = reply.size, reply.block_size
        if reply.file != file:  # before a byte of data: another file's bytes are never taken
            raise _WrongFile(f"answer for {reply.file}, asked for {file}")
        if size > self.max_file_size:
            raise _Failed(f"protocol error: file of {size} bytes (limit {self.max_file_size})")
        pieces: list[bytes] = []
        digests: list[int] = []
        left = size
        for i in range(block_count(size, bs)):
            n = min(bs, left)
            try:
                with _lost_midway():
                    want = parse_block_header(await rx.exactly(BLOCK_HEADER_LEN), n)
                    block = await rx.pieces(n)
            except ProtocolError as exc:
                raise _Failed(f"protocol error: {exc}") from None
            if len(block) == 1:
                got = xxhash.xxh3_64_intdigest(block[0])
            else:
                h = xxhash.xxh3_64()
                for piece in block:
                    h.update(piece)
                got = h.intdigest()
            if got != want:
                raise _Mismatch(f"block {i} of a {size}-byte file failed its xxh3 digest")
            pieces += block
            digests.append(got)
            left -= n
        data = pieces[0] if len(pieces) == 1 else b"".join(pieces)
        return Received(data, BlockDigests(size, tuple(digests)) if bs == BLOCK else None)

    # ------------------------------------------------------------------ connections

    async def _checkout(self) -> tuple[_Conn, bool]:
        now = trio.current_time()
        while self._idle:
            conn = self._idle.pop()
            if now - conn.last_used < self.pool_idle and conn.stream in self._open:
                return conn, True
            self._discard_now(conn)
        return await self._connect(), False

    def _checkin(self, conn: _Conn) -> None:
        if (
            self._closed
            or self._down_since is not None
            or len(self._idle) >= self.max_requests
            or conn.rx.buffered  # bytes past the answer: the stream is not where the next request expects it
        ):
            self._discard_now(conn)
            return
        conn.last_used = trio.current_time()
        self._idle.append(conn)

    def _discard_now(self, conn: _Conn) -> None:
        """Close without a checkpoint (SocketStream closes its socket synchronously)."""
        self._open.discard(conn.stream)
        conn.stream.socket.close()

    async def _discard(self, conn: _Conn) -> None:
        self._open.discard(conn.stream)
        await trio.aclose_forcefully(conn.stream)

    async def _connect(self) -> _Conn:
        self.counters.connects += 1
        try:
            stream = await trio.open_tcp_stream(self.host, self.port)
        except OSError as exc:
            raise _Failed(f"cannot connect: {exc.strerror or exc}") from None
        self._open.add(stream)
        conn = _Conn(stream, Receiver(stream, _RECEIVE_CHUNK), trio.current_time())
        try:
            await self._handshake(conn)
        except BaseException:
            await self._discard(conn)
            raise
        return conn

    async def _handshake(self, conn: _Conn) -> None:
        stream = conn.stream
        nonce = auth.new_nonce()
        try:
            await stream.send_all(Hello(VERSION, nonce).encode())
            challenge = Challenge.decode(await conn.rx.exactly(CHALLENGE_LEN))
            if challenge.greeting is Greeting.BUSY:
                raise _Busy()
            if challenge.greeting is Greeting.BAD_VERSION:
                raise _Failed(f"peer speaks protocol version {challenge.version}, this daemon {VERSION}")
            if not auth.proof_ok(auth.server_proof(self._token, nonce, challenge.nonce), challenge.proof):
                raise _Failed("peer does not hold this job's token (another job's daemon?)")
            await stream.send_all(auth.client_proof(self._token, nonce, challenge.nonce))
            verdict = decode_verdict(await conn.rx.exactly(VERDICT_LEN))
        except Closed as exc:
            raise _Failed(f"handshake: {exc}") from None
        except ProtocolError as exc:
            raise _Failed(f"handshake: {exc}") from None
        except trio.ClosedResourceError:
            raise _Failed("handshake: connection closed by this daemon") from None
        except (trio.BrokenResourceError, OSError) as exc:
            raise _Failed(f"handshake: connection error: {exc}") from None
        if verdict is not Verdict.ACCEPTED:
            raise _Failed("peer refused this daemon's job token")


def _now() -> float | None:
    """trio's clock, or None when called outside a trio run (status read after the loop ended)."""
    try:
        return trio.current_time()
    except RuntimeError:
        return None
