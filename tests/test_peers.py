"""The peer data plane over real loopback sockets: serving, refusing, verifying, failing over.

Servers are real :class:`PeerServer` instances (in this trio run, or a separate process when the
test kills or stops it); clients are real :class:`PeerClient` objects or raw sockets that speak
bytes by hand.  "Hung" peers are listening sockets nobody accepts or answers on (what a SIGSTOPped
daemon looks like: the kernel completes the TCP handshake, nothing replies) and a real server
process sent SIGSTOP.  Corruption and stalls are made by a byte-level TCP proxy in the path.
"""

from __future__ import annotations

import logging
import os
import random
import signal
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager, suppress

import pytest
import trio

from fusefs.cluster.auth import client_proof, new_nonce
from fusefs.cluster.peer_client import PeerClient, PeerDown
from fusefs.cluster.peer_server import PeerServer, Provision
from fusefs.cluster.protocol import (
    BLOCK_HEADER_LEN,
    CHALLENGE_LEN,
    FRAME_HEADER,
    MAX_CONTROL_PAYLOAD,
    VERDICT_LEN,
    VERSION,
    Challenge,
    Get,
    Greeting,
    Hello,
    Kind,
    Reply,
    Status,
    Verdict,
    decode_message,
    frame_header,
    parse_frame_header,
)
from fusefs.tiers.digest import BlockDigests
from tools.bench.peers import PLAN_DIGEST, file_bytes, file_id, server_process

TOKEN = b"job-token-for-the-peer-tests-0123"
DIGEST = b"plan-digest-1"
HOST = "127.0.0.1"
SLACK = 0.5  # scheduling slack on a shared 2-core machine


def payload(index: int, size: int = 110_000) -> bytes:
    return random.Random(index * 7919 + size).randbytes(size)


class Files:
    """A daemon's view for one dataset: the snapshot's size, what it holds, what it has not yet."""

    def __init__(self, files: dict[int, bytes], n: int = 100, not_yet: tuple[int, ...] = ()) -> None:
        self.files = files
        self.n = n
        self.not_yet = set(not_yet)
        self.calls = 0

    async def __call__(self, get: Get) -> Provision:
        self.calls += 1
        dataset, index = get.dataset, get.index
        if get.digest != DIGEST:
            return Provision("bad_request", reason="plan digest differs")
        if dataset != 0 or not 0 <= index < self.n:
            return Provision("bad_request", reason=f"no file {index} in dataset {dataset}")
        if index in self.not_yet:
            return Provision("not_yet")
        if index not in self.files:
            return Provision("not_owned")
        mine = file_id(index, len(self.files[index]))
        if get.file != mine:
            return Provision("mismatch", reason=f"index {index} is {mine} here", file=mine)
        return Provision("ok", self.files[index], file=mine)


def run(fn: Callable[[], Awaitable[None]]) -> None:
    trio.run(fn)


def client(port: int, *, token: bytes = TOKEN, timeout: float = 5.0, **kw: object) -> PeerClient:
    opts: dict[str, object] = {"max_requests": 4, "down_after": 2, "retry_down_after": 10.0} | kw
    return PeerClient(1, HOST, port, token, timeout=timeout, **opts)  # type: ignore[arg-type]


@asynccontextmanager
async def serving(provider: Files, **kw: object) -> AsyncIterator[tuple[PeerServer, int]]:
    server = PeerServer(TOKEN, provider, **kw)  # type: ignore[arg-type]
    async with trio.open_nursery() as nursery:
        port = await nursery.start(server.serve, HOST, 0)
        yield server, port
        nursery.cancel_scope.cancel()


@contextmanager
def hung_listener() -> Iterator[int]:
    """A port where the kernel accepts connections and nothing ever answers (a stopped daemon)."""
    sock = socket.socket()
    sock.bind((HOST, 0))
    sock.listen(64)
    try:
        yield sock.getsockname()[1]
    finally:
        sock.close()


async def raw_connect(port: int) -> trio.SocketStream:
    return await trio.open_tcp_stream(HOST, port)


async def read_exactly(stream: trio.SocketStream, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = await stream.receive_some(n - len(out))
        if not chunk:
            break
        out += chunk
    return out


async def read_to_eof(stream: trio.SocketStream, limit: float = 5.0) -> bytes:
    """Everything the server sends until it closes (fails if it neither closes nor stops in time)."""
    out = b""
    with trio.fail_after(limit):
        try:
            while chunk := await stream.receive_some(65536):
                out += chunk
        except trio.BrokenResourceError:  # closed with our bytes unread: the kernel resets
            pass
    await stream.aclose()
    return out


async def authenticate(stream: trio.SocketStream, token: bytes = TOKEN) -> bytes:
    """The raw handshake; returns the verdict byte."""
    nonce = new_nonce()
    await stream.send_all(Hello(VERSION, nonce).encode())
    challenge = Challenge.decode(await read_exactly(stream, CHALLENGE_LEN))
    await stream.send_all(client_proof(token, nonce, challenge.nonce))
    return await read_exactly(stream, VERDICT_LEN)


def reply_of(data: bytes) -> Reply:
    kind, length = parse_frame_header(data[: FRAME_HEADER.size])
    msg = decode_message(kind, data[FRAME_HEADER.size : FRAME_HEADER.size + length])
    assert isinstance(msg, Reply)
    return msg


# ---------------------------------------------------------------- serving


def test_fetch_returns_the_files_bytes_over_one_reused_connection() -> None:
    files = {i: payload(i) for i in range(10)}

    async def main() -> None:
        async with serving(Files(files)) as (server, port):
            peer = client(port)
            for i in range(10):
                assert await peer.fetch(0, i, DIGEST, file_id(i, 110_000)) == files[i]
            st = peer.status()
            assert (st["ok"], st["connects"], st["bytes"], st["state"]) == (10, 1, 1_100_000, "up")
            mean = st["mean_seconds"]
            assert mean is not None  # null only before the first answered request
            assert mean > 0 and st["max_seconds"] >= mean
            assert server.status()["connections_total"] == 1
            assert server.status()["requests"] == {"ok": 10}
            await peer.aclose()

    run(main)


def test_concurrent_fetches_use_at_most_max_requests_connections() -> None:
    files = {i: payload(i, 300_000) for i in range(32)}

    async def main() -> None:
        async with serving(Files(files)) as (server, port):
            peer = client(port, max_requests=3)
            got: dict[int, bytes | None] = {}

            async def one(i: int) -> None:
                got[i] = await peer.fetch(0, i, DIGEST, file_id(i, 300_000))

            async with trio.open_nursery() as nursery:
                for i in range(32):
                    nursery.start_soon(one, i)
            assert got == files
            assert peer.counters.connects <= 3 and server.status()["connections_total"] <= 3
            await peer.aclose()

    run(main)


@pytest.mark.parametrize("block_size", [1 << 20, 256 << 10])
def test_multi_block_file_arrives_whole_with_tier_digests_for_tier_sized_blocks(block_size: int) -> None:
    big = payload(1, 5 * (1 << 20) + 123)

    async def main() -> None:
        async with serving(Files({1: big}), block_size=block_size) as (server, port):
            peer = client(port)
            received = await peer.fetch_verified(0, 1, DIGEST, file_id(1, len(big)))
            assert received is not None and received.data == big
            if block_size == 1 << 20:
                assert received.digests == BlockDigests.of(big)  # reusable by a tier put, no rehash
            else:
                assert received.digests is None
            with trio.fail_after(5):  # the server counts a block once its send returns, maybe after our read
                while server.status()["blocks_sent"] != -(-len(big) // block_size):
                    await trio.sleep(0.01)
            await peer.aclose()

    run(main)


def test_empty_file_is_served() -> None:
    async def main() -> None:
        async with serving(Files({3: b""})) as (_, port):
            peer = client(port)
            received = await peer.fetch_verified(0, 3, DIGEST, file_id(3, 0))
            assert received is not None and received.data == b""
            assert received.digests == BlockDigests.of(b"")
            await peer.aclose()

    run(main)


def test_not_yet_not_owned_and_bad_requests_return_none_and_keep_the_peer_up() -> None:
    async def main() -> None:
        async with serving(Files({1: b"one"}, n=10, not_yet=(2,))) as (server, port):
            peer = client(port, down_after=1)
            assert await peer.fetch(0, 2, DIGEST, file_id(2, 3)) is None  # not yet
            assert await peer.fetch(0, 3, DIGEST, file_id(3, 3)) is None  # not owned
            assert await peer.fetch(0, 10, DIGEST, file_id(10, 3)) is None  # outside the snapshot
            assert await peer.fetch(0, 1, b"other-plan", file_id(1, 3)) is None  # wrong plan digest
            assert await peer.fetch(0, 1, DIGEST, file_id(1, 3)) == b"one"
            st = peer.status()
            assert (st["not_yet"], st["not_owned"], st["bad_request"], st["ok"]) == (1, 1, 2, 1)
            assert (st["failures"], st["state"], st["connects"]) == (0, "up", 1)
            assert server.status()["requests"] == {"not_yet": 1, "not_owned": 1, "bad_request": 2, "ok": 1}
            await peer.aclose()

    run(main)


def test_a_provider_that_raises_is_an_error_reply_and_the_server_keeps_serving() -> None:
    async def broken(get: Get) -> Provision:
        if get.index == 13:
            raise RuntimeError("tier read exploded")
        return Provision("ok", b"fine", file=get.file)

    async def main() -> None:
        server = PeerServer(TOKEN, broken)
        async with trio.open_nursery() as nursery:
            port = await nursery.start(server.serve, HOST, 0)
            peer = client(port, down_after=1)
            assert await peer.fetch(0, 13, DIGEST, file_id(13, 4)) is None
            assert await peer.fetch(0, 1, DIGEST, file_id(1, 4)) == b"fine"
            assert (peer.counters.errors, peer.state) == (1, "up")
            assert server.status()["provider_errors"] == 1
            await peer.aclose()
            nursery.cancel_scope.cancel()

    run(main)


def test_ping_measures_a_round_trip() -> None:
    async def main() -> None:
        async with serving(Files({})) as (server, port):
            peer = client(port)
            rtt = await peer.ping()
            assert rtt is not None and 0 < rtt < 5
            assert server.status()["requests"] == {"ping": 1}
            await peer.aclose()

    run(main)


# ---------------------------------------------------------------- authentication and hostile input


def test_a_client_with_another_token_gets_nothing_and_both_sides_refuse() -> None:
    async def main() -> None:
        async with serving(Files({1: b"secret"})) as (server, port):
            peer = client(port, token=b"another-jobs-token-abcdefghijklmn", down_after=5)
            assert await peer.fetch(0, 1, DIGEST, file_id(1, 6)) is None
            assert "does not hold this job's token" in peer.last_error
            assert peer.counters.failures == 1
            with trio.fail_after(5):  # the server sees the client give up before proving a token
                while server.status()["refused"].get("no_token") != 1:
                    await trio.sleep(0.01)
            assert server.status()["authenticated_total"] == 0
            await peer.aclose()

    run(main)


def test_raw_clients_without_the_token_or_with_bad_frames_are_refused_and_good_clients_still_served(
    caplog: pytest.LogCaptureFixture,
) -> None:
    files = Files({i: payload(i, 1000) for i in range(5)}, n=5)

    async def main() -> None:
        async with serving(files) as (server, port):
            good = client(port)
            assert await good.fetch(0, 0, DIGEST, file_id(0, 1000)) == files.files[0]

            # garbage instead of a hello: closed without a word
            s = await raw_connect(port)
            await s.send_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            assert await read_to_eof(s) == b""
            # a hello and then silence: closed after the challenge, before any request is read
            s = await raw_connect(port)
            await s.send_all(Hello(VERSION, new_nonce()).encode())
            await read_exactly(s, CHALLENGE_LEN)
            await s.aclose()
            # another protocol version: told which one this server speaks, then closed
            s = await raw_connect(port)
            await s.send_all(Hello(VERSION + 1, new_nonce()).encode())
            answer = await read_to_eof(s)
            assert Challenge.decode(answer).greeting is Greeting.BAD_VERSION
            # a wrong token: refused verdict, then closed; a GET sent anyway gets no data
            s = await raw_connect(port)
            assert await authenticate(s, token=b"x" * 32) == bytes([Verdict.REFUSED])
            with trio.move_on_after(1):
                await s.send_all(Get(1, 0, 0, DIGEST).encode())
            assert await read_to_eof(s) == b""

            # authenticated raw client: wrong digest and out-of-range index are refused on the same connection
            s = await raw_connect(port)
            assert await authenticate(s) == bytes([Verdict.ACCEPTED])
            for get, why in ((Get(7, 0, 1, b"wrong-digest"), "digest"), (Get(8, 0, 5, DIGEST), "no file 5")):
                await s.send_all(get.encode())
                head = await read_exactly(s, FRAME_HEADER.size)
                _, length = parse_frame_header(head)
                reply = reply_of(head + await read_exactly(s, length))
                assert (reply.request_id, reply.status) == (get.request_id, Status.BAD_REQUEST)
                assert why in reply.reason
            # an unknown frame kind: a BAD_REQUEST reply, then closed
            await s.send_all(bytes([0x7E]) + bytes(4))
            reply = reply_of(await read_to_eof(s))
            assert reply.status is Status.BAD_REQUEST and "unknown frame kind" in reply.reason
            # an oversized frame: refused from its header, before its payload is awaited
            s = await raw_connect(port)
            assert await authenticate(s) == bytes([Verdict.ACCEPTED])
            await s.send_all(frame_header(Kind.GET, MAX_CONTROL_PAYLOAD + 1))
            assert "limit" in reply_of(await read_to_eof(s)).reason
            # a frame the server never accepts from a client
            s = await raw_connect(port)
            assert await authenticate(s) == bytes([Verdict.ACCEPTED])
            await s.send_all(Reply(1, Status.OK, 1, 1).encode())
            assert reply_of(await read_to_eof(s)).status is Status.BAD_REQUEST

            for i in range(5):  # the good client, on its old connection, is still served
                assert await good.fetch(0, i, DIGEST, file_id(i, 1000)) == files.files[i]
            st = server.status()
            assert st["refused"] == {"malformed": 1, "no_token": 1, "bad_version": 1, "bad_token": 1}
            assert st["requests"]["bad_request"] == 2 and st["requests"]["malformed"] == 3
            assert good.counters.connects == 1
            await good.aclose()
        refusals = [r for r in caplog.records if "refused" in r.getMessage() and r.levelno == logging.WARNING]
        assert len(refusals) == 4  # one line per refused handshake

    caplog.set_level(logging.WARNING, logger="fusefs.cluster")
    run(main)


def test_silent_connections_are_closed_after_the_handshake_timeout(wall_clock: bool) -> None:
    async def main() -> None:
        async with serving(Files({}), handshake_timeout=0.3) as (server, port):
            s = await raw_connect(port)
            t0 = time.monotonic()
            assert await read_to_eof(s) == b""
            assert not wall_clock or time.monotonic() - t0 < 0.3 + SLACK
            assert server.status()["refused"] == {"handshake_timeout": 1}

    run(main)


def test_connections_over_the_limit_are_told_busy_which_is_not_a_peer_failure() -> None:
    async def main() -> None:
        async with serving(Files({1: b"x"}), max_connections=1) as (server, port):
            first = client(port)
            assert await first.fetch(0, 1, DIGEST, file_id(1, 1)) == b"x"  # holds the one connection (pooled)
            second = client(port, down_after=1)
            assert await second.fetch(0, 1, DIGEST, file_id(1, 1)) is None
            assert (second.counters.busy, second.counters.failures, second.state) == (1, 0, "up")
            assert server.status()["refused"] == {"busy": 1}
            await first.aclose()
            with trio.fail_after(5):
                while server.status()["connections"]:
                    await trio.sleep(0.01)
            assert await second.fetch(0, 1, DIGEST, file_id(1, 1)) == b"x"
            await second.aclose()

    run(main)


def test_a_pooled_connection_the_server_closed_is_replaced_transparently() -> None:
    async def main() -> None:
        async with serving(Files({1: b"x"}), idle_timeout=0.2) as (server, port):
            peer = client(port, down_after=1)
            assert await peer.fetch(0, 1, DIGEST, file_id(1, 1)) == b"x"
            with trio.fail_after(5):
                while server.status()["connections"]:
                    await trio.sleep(0.01)
            assert await peer.fetch(0, 1, DIGEST, file_id(1, 1)) == b"x"
            assert (peer.counters.connects, peer.counters.failures) == (2, 0)
            await peer.aclose()

    run(main)


# ---------------------------------------------------------------- corruption and stalls (a proxy in the path)


@asynccontextmanager
async def proxy(target: int, *, flip_at: int | None = None, stall_after: int | None = None) -> AsyncIterator[int]:
    """A TCP proxy to ``target``; on its first connection only, the server's stream gets its byte
    ``flip_at`` inverted, or stops flowing after ``stall_after`` bytes."""
    connections = 0

    async def pump(src: trio.SocketStream, dst: trio.SocketStream, alter: bool, done: trio.CancelScope) -> None:
        seen = 0
        try:
            while chunk := await src.receive_some(65536):
                data = bytearray(chunk)
                if alter and flip_at is not None and seen <= flip_at < seen + len(data):
                    data[flip_at - seen] ^= 0xFF
                if alter and stall_after is not None and seen + len(data) > stall_after:
                    await dst.send_all(data[: max(0, stall_after - seen)])
                    await trio.sleep_forever()
                seen += len(data)
                await dst.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        done.cancel()  # either side gone: close both

    async def handle(down: trio.SocketStream) -> None:
        nonlocal connections
        connections += 1
        alter = connections == 1
        try:
            up = await trio.open_tcp_stream(HOST, target)
            async with up, trio.open_nursery() as nursery:
                nursery.start_soon(pump, down, up, False, nursery.cancel_scope)
                nursery.start_soon(pump, up, down, alter, nursery.cancel_scope)
        finally:
            await trio.aclose_forcefully(down)

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(trio.serve_tcp, handle, 0)
        yield int(listeners[0].socket.getsockname()[1])
        nursery.cancel_scope.cancel()


DATA_START = CHALLENGE_LEN + VERDICT_LEN + len(Reply(0, Status.OK, 1, 1).encode()) + BLOCK_HEADER_LEN
"""Where the first request's data starts in the server's stream."""


def test_a_block_corrupted_in_flight_fails_its_digest_and_the_file_comes_back_none(wall_clock: bool) -> None:
    files = {1: payload(1, 3 << 20)}

    async def main() -> None:
        async with serving(Files(files)) as (_, port), proxy(port, flip_at=DATA_START + (1 << 20) + 5000) as via:
            peer = client(via, down_after=2)
            t0 = time.monotonic()
            assert await peer.fetch(0, 1, DIGEST, file_id(1, len(files[1]))) is None
            assert not wall_clock or time.monotonic() - t0 < 1.0  # detected on arrival, not by a timeout
            assert peer.counters.timeouts == 0
            st = peer.status()
            assert (st["mismatches"], st["failures"], st["ok"], st["state"]) == (1, 1, 0, "up")
            assert "block 1 " in st["last_error"]
            assert st["connections"] == 0  # the connection with unread blocks was closed
            assert await peer.fetch(0, 1, DIGEST, file_id(1, len(files[1]))) == files[1]  # a clean second connection
            await peer.aclose()

    run(main)


def test_a_size_other_than_the_snapshot_is_refused_by_the_holder_and_never_served() -> None:
    async def main() -> None:
        async with serving(Files({1: b"12345"})) as (server, port):
            peer = client(port, down_after=1)
            assert await peer.fetch(0, 1, DIGEST, file_id(1, 6)) is None
            assert peer.counters.identity_mismatches == 1 and peer.state == "up"  # a refusal, not a fault
            assert server.status()["identity_mismatches"] == 1
            assert await peer.fetch(0, 1, DIGEST, file_id(1, 5)) == b"12345"
            await peer.aclose()

    run(main)


def test_a_transfer_that_stalls_midway_costs_at_most_the_timeout(wall_clock: bool) -> None:
    files = {1: payload(1, 2 << 20)}

    async def main() -> None:
        async with serving(Files(files)) as (_, port), proxy(port, stall_after=DATA_START + 500_000) as via:
            peer = client(via, timeout=0.5)
            t0 = time.monotonic()
            assert await peer.fetch(0, 1, DIGEST, file_id(1, len(files[1]))) is None
            took = time.monotonic() - t0
            assert took >= 0.5 and (not wall_clock or took < 0.5 + SLACK)  # a lower bound holds under any load
            assert (peer.counters.timeouts, peer.status()["connections"]) == (1, 0)
            assert await peer.fetch(0, 1, DIGEST, file_id(1, len(files[1]))) == files[1]
            await peer.aclose()

    run(main)


def test_a_cancelled_fetch_closes_its_connection() -> None:
    async def main() -> None:
        with hung_listener() as port:
            peer = client(port, timeout=5.0)
            with trio.move_on_after(0.2):
                await peer.fetch(0, 1, DIGEST, file_id(1, 1))
            assert peer.status()["connections"] == 0
            assert peer.counters.failures == 0  # the caller gave up; the peer is not blamed

    run(main)


# ---------------------------------------------------------------- hung and dead peers


def test_a_hung_peer_costs_at_most_the_timeout_per_fetch_then_is_down(wall_clock: bool) -> None:
    async def main() -> None:
        with hung_listener() as port:
            peer = client(port, timeout=0.4, max_requests=4, down_after=2)
            elapsed: list[float] = []

            async def one(i: int) -> None:
                t0 = time.monotonic()
                with suppress(PeerDown):
                    assert await peer.fetch(0, i, DIGEST, file_id(i, 1)) is None
                elapsed.append(time.monotonic() - t0)

            async with trio.open_nursery() as nursery:  # 8 reads at once: 4 wait for a slot
                for i in range(8):
                    nursery.start_soon(one, i)
            assert len(elapsed) == 8 and (not wall_clock or max(elapsed) < 0.4 + SLACK)
            assert peer.state == "down" and peer.counters.times_down == 1
            assert peer.counters.timeouts >= 2  # the rest waited for a slot until their deadline or the verdict
            t0 = time.monotonic()
            with pytest.raises(PeerDown):
                await peer.fetch(0, 1, DIGEST, file_id(1, 1))
            assert not wall_clock or time.monotonic() - t0 < 0.05  # no network while down
            assert peer.counters.refused_down >= 1
            assert peer.status()["connections"] == 0

    run(main)


def test_a_down_peer_is_probed_by_one_fetch_after_the_retry_delay_and_comes_back_up() -> None:
    async def main() -> None:
        with hung_listener() as port:
            peer = client(port, timeout=0.2, down_after=1, retry_down_after=0.3)
            assert await peer.fetch(0, 1, DIGEST, file_id(1, 4)) is None
            assert peer.state == "down"
            with trio.fail_after(5):  # the probe after retry_down_after fails: down again
                while True:
                    try:
                        assert await peer.fetch(0, 1, DIGEST, file_id(1, 4)) is None
                        break
                    except PeerDown:
                        await trio.sleep(0.02)
            assert peer.state == "down" and peer.counters.failures == 2 and peer.counters.times_down == 1
        async with serving(Files({1: b"back"})) as (_, new_port):
            peer.port = new_port  # the peer answers again (same client, now reaching a live server)
            results: list[object] = []

            async def one() -> None:
                try:
                    results.append(await peer.fetch(0, 1, DIGEST, file_id(1, 4)))
                except PeerDown:
                    results.append("down")

            with trio.fail_after(5):
                while peer.state == "down":
                    async with trio.open_nursery() as nursery:
                        for _ in range(3):
                            nursery.start_soon(one)
                    await trio.sleep(0.02)
            assert results[-3:].count(b"back") == 1 and results[-3:].count("down") == 2  # one probe at a time
            assert await peer.fetch(0, 1, DIGEST, file_id(1, 4)) == b"back"
            await peer.aclose()

    run(main)


def test_closing_the_client_ends_an_in_flight_fetch_with_none(wall_clock: bool) -> None:
    async def main() -> None:
        with hung_listener() as port:
            peer = client(port, timeout=5.0)
            result: list[bytes | None] = []

            async def fetch() -> None:
                result.append(await peer.fetch(0, 1, DIGEST, file_id(1, 1)))

            t0 = time.monotonic()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(fetch)
                with trio.fail_after(5):
                    while not peer.status()["connections"]:
                        await trio.sleep(0.01)
                await peer.aclose()
            assert result == [None] and (not wall_clock or time.monotonic() - t0 < 1.0)
            assert peer.counters.timeouts == 0  # ended by the close, not by its 5 s timeout
            assert peer.state == "down"

    run(main)


def test_closed_client_raises_peer_down() -> None:
    async def main() -> None:
        async with serving(Files({1: b"x"})) as (_, port):
            peer = client(port)
            assert await peer.fetch(0, 1, DIGEST, file_id(1, 1)) == b"x"
            await peer.aclose()
            with pytest.raises(PeerDown):
                await peer.fetch(0, 1, DIGEST, file_id(1, 1))

    run(main)


def fetch_all(peer: PeerClient, indices: range, size: int) -> Callable[[], Awaitable[list[float]]]:
    async def go() -> list[float]:
        times = []
        for i in indices:
            t0 = time.monotonic()
            try:
                data = await peer.fetch(0, i, PLAN_DIGEST, file_id(i, size))
            except PeerDown:
                data = None
            times.append(time.monotonic() - t0)
            assert data is None or data == file_bytes(i, size)
        return times

    return go


def test_a_killed_peer_process_fails_fast_and_is_marked_down(wall_clock: bool) -> None:
    async def main() -> None:
        with server_process(TOKEN, 8, 50_000) as (proc, port):
            peer = client(port, timeout=5.0, down_after=2)
            for i in range(8):
                assert await peer.fetch(0, i, PLAN_DIGEST, file_id(i, 50_000)) == file_bytes(i, 50_000)
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(10)
            t0 = time.monotonic()
            assert (
                await peer.fetch(0, 1, PLAN_DIGEST, file_id(1, 50_000)) is None
            )  # pooled connection reset, reconnect refused
            assert await peer.fetch(0, 2, PLAN_DIGEST, file_id(2, 50_000)) is None
            assert not wall_clock or time.monotonic() - t0 < 1.0  # refused connections cost no timeout
            assert peer.counters.timeouts == 0
            assert peer.state == "down" and "cannot connect" in peer.last_error
            with pytest.raises(PeerDown):
                await peer.fetch(0, 3, PLAN_DIGEST, file_id(3, 50_000))
            await peer.aclose()

    run(main)


def test_a_stopped_peer_process_costs_at_most_the_timeout_is_marked_down_and_recovers_on_sigcont(
    wall_clock: bool,
) -> None:
    async def main() -> None:
        with server_process(TOKEN, 8, 50_000) as (proc, port):
            peer = client(port, timeout=0.4, down_after=2, retry_down_after=0.3)
            assert await fetch_all(peer, range(8), 50_000)()
            assert peer.counters.ok == 8
            os.kill(proc.pid, signal.SIGSTOP)
            try:
                times = await fetch_all(peer, range(4), 50_000)()
                assert len(times) == 4 and (not wall_clock or max(times) < 0.4 + SLACK)
                assert peer.counters.timeouts == 2 and peer.state == "down"
                assert peer.counters.refused_down == 2  # the last two were answered at once
            finally:
                os.kill(proc.pid, signal.SIGCONT)
            with trio.fail_after(5):
                while await fetch_all(peer, range(1), 50_000)() and peer.state == "down":
                    await trio.sleep(0.05)
            assert await peer.fetch(0, 5, PLAN_DIGEST, file_id(5, 50_000)) == file_bytes(5, 50_000)
            assert peer.status()["state"] == "up"
            await peer.aclose()

    run(main)
