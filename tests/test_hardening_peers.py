"""The peer data plane under hostile or broken peers: bounded memory, refused frames, refused files.

Servers are real :class:`PeerServer` instances on loopback; hostile clients speak bytes by hand
after a real handshake (they hold the job token: the threat is a broken or compromised member).
A lying server is a raw trio listener that answers a GET with another file.  The health test runs
the real client on trio's MockClock and moves time by hand.
"""

from __future__ import annotations

import random
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
import trio
import trio.testing
import xxhash

from fusefs.cluster import auth
from fusefs.cluster.peer_client import PeerClient, PeerDown
from fusefs.cluster.peer_server import PeerServer, Provision
from fusefs.cluster.protocol import (
    BLOCK_DIGEST,
    CHALLENGE_LEN,
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
    Kind,
    Note,
    Reply,
    Status,
    Verdict,
    block_header,
    decode_message,
    frame_header,
    parse_frame_header,
)
from tools.bench.peers import file_id

TOKEN = b"job-token-for-the-hardening-tests"
DIGEST = b"plan-digest-1"
HOST = "127.0.0.1"


class Files:
    """A holder whose index -> entry mapping can be damaged (``shift``): what a peer with a
    corrupted plan does.  Every file has the same size, so sizes alone cannot tell them apart."""

    def __init__(self, n: int = 20, size: int = 10_000, shift: int = 0, delay: float = 0.0) -> None:
        self.data = [random.Random(i).randbytes(size) for i in range(n)]
        self.shift = shift
        self.delay = delay

    async def __call__(self, get: Get) -> Provision:
        if get.digest != DIGEST or not 0 <= get.index < len(self.data):
            return Provision("bad_request", reason="no such file")
        if self.delay:
            await trio.sleep(self.delay)
        entry = (get.index + self.shift) % len(self.data)  # the (possibly damaged) plan's mapping
        mine = file_id(entry, len(self.data[entry]))
        if mine != get.file:
            return Provision("mismatch", reason=f"index {get.index} is {mine} here", file=mine)
        return Provision("ok", self.data[entry], file=mine)


@asynccontextmanager
async def serving(provider: Files, **kw: object) -> AsyncIterator[tuple[PeerServer, int]]:
    server = PeerServer(TOKEN, provider, **kw)  # type: ignore[arg-type]
    async with trio.open_nursery() as nursery:
        port = await nursery.start(server.serve, HOST, 0)
        yield server, port
        nursery.cancel_scope.cancel()


def client(port: int, **kw: object) -> PeerClient:
    opts: dict[str, object] = {"timeout": 5.0, "max_requests": 4, "down_after": 2, "retry_down_after": 10.0} | kw
    return PeerClient(1, HOST, port, TOKEN, **opts)  # type: ignore[arg-type]


async def authenticated(port: int) -> trio.SocketStream:
    s = await trio.open_tcp_stream(HOST, port)
    nonce = auth.new_nonce()
    await s.send_all(Hello(VERSION, nonce).encode())
    challenge = Challenge.decode(await read_exactly(s, CHALLENGE_LEN))
    assert challenge.greeting is Greeting.GO
    await s.send_all(auth.client_proof(TOKEN, nonce, challenge.nonce))
    assert await read_exactly(s, 1) == bytes([Verdict.ACCEPTED])
    return s


async def read_exactly(s: trio.SocketStream, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = await s.receive_some(n - len(out))
        if not chunk:
            break
        out += chunk
    return out


async def read_to_eof(s: trio.SocketStream, limit: float = 5.0) -> bytes:
    out = b""
    with trio.move_on_after(limit):
        try:
            while chunk := await s.receive_some(65536):
                out += chunk
        except trio.BrokenResourceError:
            pass
    await s.aclose()
    return out


async def settled(server: PeerServer) -> None:
    """Every connection closed and every reply's memory given back (within a deadline)."""
    with trio.fail_after(10):
        while server.connections or server.budget.used:
            await trio.sleep(0.01)


# ---------------------------------------------------------------- frames a server must refuse


def test_a_block_frame_from_a_client_is_refused_from_its_header_before_any_payload() -> None:
    """Before: the server awaited (and buffered) a BLOCK's whole announced payload, up to 16 MiB per
    connection, before finding it was no request.  Now the header alone gets the refusal: this
    client sends no byte of payload and still gets its BAD_REQUEST and a closed connection."""

    async def main() -> None:
        async with serving(Files()) as (server, port):
            s = await authenticated(port)
            await s.send_all(frame_header(Kind.BLOCK, BLOCK_DIGEST.size + MAX_BLOCK_SIZE))
            with trio.fail_after(3):
                answer = await read_to_eof(s)
            kind, length = parse_frame_header(answer[: FRAME_HEADER.size])
            reply = decode_message(kind, answer[FRAME_HEADER.size : FRAME_HEADER.size + length])
            assert isinstance(reply, Reply) and reply.status is Status.BAD_REQUEST
            assert "BLOCK frame is not accepted" in reply.reason
            for kind_ in (Kind.REPLY, Kind.PONG, Kind.NOTED):  # every other server-only frame too
                s = await authenticated(port)
                await s.send_all(frame_header(kind_, 900))
                assert b"not accepted" in await read_to_eof(s)
            assert server.protocol_errors == 4
            await settled(server)

    trio.run(main)


def test_fuzzed_frames_and_500_connections_never_end_the_server() -> None:
    """Garbage before and after the handshake, every frame kind, lengths up to 2**32-1, frames cut
    short, and 500 connections at once: each costs its own connection at most, and the server still
    serves a good client, with every connection and every reserved byte given back."""
    rng = random.Random(20240601)
    files = Files()

    async def hostile(port: int, case: int) -> None:
        try:
            if case % 5 == 0:  # no token: random bytes from the first byte
                s = await trio.open_tcp_stream(HOST, port)
                await s.send_all(rng.randbytes(rng.choice([1, HELLO_LEN, 200])))
            else:
                s = await authenticated(port)
                kind = rng.randrange(256) if case % 5 == 1 else rng.choice(list(Kind))
                length = rng.choice([0, 1, 4, 29, 1024, 1025, MAX_BLOCK_SIZE + 8, 2**32 - 1])
                body = rng.randbytes(min(length, rng.choice([0, 3, 40, 1024])))  # often cut short
                await s.send_all(bytes([kind]) + length.to_bytes(4, "big") + body)
            await read_to_eof(s, limit=2.0)
        except (trio.BrokenResourceError, OSError):
            pass

    async def main() -> None:
        async with serving(files, max_connections=600, handshake_timeout=2.0, frame_timeout=1.0) as (server, port):
            async with trio.open_nursery() as nursery:
                for case in range(500):
                    nursery.start_soon(hostile, port, case)
            peer = client(port)
            for i in range(5):
                assert await peer.fetch(0, i, DIGEST, file_id(i, 10_000)) == files.data[i]
            await peer.aclose()
            await settled(server)
            st = server.status()
            assert st["connections_total"] >= 501 and st["authenticated_total"] >= 400
            assert st["protocol_errors"] + sum(st["refused"].values()) >= 300  # the fuzz was refused, not served
            assert st["reply_memory"]["used"] == 0

    trio.run(main)


# ---------------------------------------------------------------- memory for replies


def test_reply_memory_is_capped_per_connection_and_in_total() -> None:
    """A file over the per-connection cap is answered BUSY at once (the asker reads the PFS); the
    replies in flight together never hold more than the total cap; the rest wait, then get BUSY."""

    async def main() -> None:
        files = Files(n=12, size=100_000, delay=0.3)
        async with serving(files, memory=250_000, connection_memory=150_000, memory_wait=0.1) as (server, port):
            peer = client(port, max_requests=12, down_after=1)
            got: dict[int, bytes | None] = {}

            async def one(i: int) -> None:
                got[i] = await peer.fetch(0, i, DIGEST, file_id(i, 100_000))

            async with trio.open_nursery() as nursery:
                for i in range(12):
                    nursery.start_soon(one, i)
            served = [i for i, data in got.items() if data is not None]
            assert all(got[i] == files.data[i] for i in served)
            assert 1 <= len(served) < 12  # some were told to go elsewhere
            st = server.status()
            assert st["reply_memory"]["peak"] <= 250_000 and st["reply_memory"]["used"] == 0
            assert st["requests"]["busy"] == 12 - len(served)
            assert peer.counters.busy == 12 - len(served) and peer.state == "up"  # busy is no failure
            big = Files(n=1, size=200_000)
            async with serving(big, connection_memory=150_000) as (server2, port2):
                other = client(port2)
                assert await other.fetch(0, 0, DIGEST, file_id(0, 200_000)) is None
                assert server2.status()["requests"] == {"too_large": 1}
                assert server2.status()["reply_memory"]["peak"] == 0  # refused before reading a byte
                await other.aclose()
            await peer.aclose()

    trio.run(main)


# ---------------------------------------------------------------- another file's bytes


def test_a_holder_whose_index_mapping_is_damaged_refuses_instead_of_serving_a_neighbour() -> None:
    """The holder maps index i to file i+1 (a shifted plan column); all files have the same size,
    so the size check of before passed and the neighbour's bytes were served with valid digests.
    The request names the file it means; the holder sees its own file differs and refuses."""

    async def main() -> None:
        files = Files(shift=1)
        async with serving(files) as (server, port):
            peer = client(port, down_after=1)
            for i in range(5):
                assert await peer.fetch(0, i, DIGEST, file_id(i, 10_000)) is None
            assert peer.counters.identity_mismatches == 5 and peer.counters.ok == 0
            assert peer.state == "up"  # it said no honestly: not a failure
            assert server.status()["identity_mismatches"] == 5
            assert server.status()["requests"] == {"mismatch": 5}
            await peer.aclose()

    trio.run(main)


def test_a_reply_for_another_file_is_refused_by_the_requester() -> None:
    """A server that does not check (or lies) answers OK with another file's identity and valid
    block digests: the requester refuses it before taking a byte, counts and logs it."""
    other = FileId(8, 5, 123)

    async def liar(stream: trio.SocketStream) -> None:
        try:
            hello = Hello.decode(await read_exactly(stream, HELLO_LEN))
            nonce = auth.new_nonce()
            proof = auth.server_proof(TOKEN, hello.nonce, nonce)
            await stream.send_all(Challenge(VERSION, Greeting.GO, nonce, proof).encode())
            await read_exactly(stream, PROOF_LEN)
            await stream.send_all(bytes([Verdict.ACCEPTED]))
            while True:
                head = await read_exactly(stream, FRAME_HEADER.size)
                if len(head) < FRAME_HEADER.size:
                    return
                kind, length = parse_frame_header(head)
                get = decode_message(kind, await read_exactly(stream, length))
                assert isinstance(get, Get)
                data = b"other"
                reply = Reply(get.request_id, Status.OK, len(data), 1 << 20, entry=other.entry, mtime_ns=other.mtime_ns)
                await stream.send_all(reply.encode() + block_header(len(data), xxhash.xxh3_64_intdigest(data)) + data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            listeners = await nursery.start(trio.serve_tcp, liar, 0)
            port = int(listeners[0].socket.getsockname()[1])
            peer = client(port, down_after=3)
            assert await peer.fetch(0, 3, DIGEST, FileId(3, 5, 77)) is None
            assert peer.counters.identity_mismatches == 1 and peer.counters.ok == 0
            assert "answer for FileId(entry=8" in peer.last_error
            await peer.aclose()
            nursery.cancel_scope.cancel()

    trio.run(main)


# ---------------------------------------------------------------- health on trio's clock


def unused_port() -> int:
    """A port nothing listens on (yet): bound once, then released."""
    with socket.socket() as probe:
        probe.bind((HOST, 0))
        return int(probe.getsockname()[1])


def listening_on(port: int) -> socket.socket:
    """A listening socket on ``port`` (a server coming back where a client marked it down)."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((HOST, port))
    sock.listen(16)
    return sock


def test_down_probe_and_up_follow_trios_clock() -> None:
    """Run on a MockClock that only moves when the test says: a peer whose port refuses is down
    after down_after failures, refused without network until retry_down_after has passed on that
    clock, probed once then, and up again after a probe that reaches a live server.  A note heard
    from a down peer lets the next request probe at once."""
    clock = trio.testing.MockClock()
    files = Files()
    port = unused_port()

    async def main() -> None:
        peer = client(port, down_after=2, retry_down_after=30.0)
        ident = file_id(1, 10_000)
        for _ in range(2):
            assert await peer.fetch(0, 1, DIGEST, ident) is None
        assert peer.state == "down" and "cannot connect" in peer.last_error
        with pytest.raises(PeerDown):
            await peer.fetch(0, 1, DIGEST, ident)
        clock.jump(29.0)
        with pytest.raises(PeerDown):  # 29 s of trio time: still waiting
            await peer.fetch(0, 1, DIGEST, ident)
        clock.jump(1.5)
        assert await peer.fetch(0, 1, DIGEST, ident) is None  # the probe: still refused, down again
        assert peer.counters.failures == 3 and peer.counters.times_down == 1
        with pytest.raises(PeerDown):
            await peer.fetch(0, 1, DIGEST, ident)
        sock = listening_on(port)
        server = PeerServer(TOKEN, files)
        async with trio.open_nursery() as nursery:
            await nursery.start(lambda task_status: server.serve(HOST, port, sock=sock, task_status=task_status))
            with pytest.raises(PeerDown):  # the server is back, but the verdict waits for the clock
                await peer.fetch(0, 1, DIGEST, ident)
            clock.jump(30.5)
            assert await peer.fetch(0, 1, DIGEST, ident) == files.data[1]
            assert peer.status()["state"] == "up"
            status = peer.status()
            assert status["down_for_seconds"] is None and status["consecutive_failures"] == 0
            nursery.cancel_scope.cancel()
        await peer.aclose()

        peer2 = client(port, down_after=1, retry_down_after=30.0)
        assert await peer2.fetch(0, 1, DIGEST, ident) is None  # nothing listens now
        assert peer2.state == "down"
        peer2.heard_from()  # it told us its state over its own connection: probe now, not in 30 s
        assert await peer2.fetch(0, 1, DIGEST, ident) is None  # a probe (not PeerDown), refused again
        assert peer2.counters.failures == 2
        await peer2.aclose()

    trio.run(main, clock=clock)


def test_a_down_peer_still_gets_state_notes_and_an_answered_one_marks_it_up() -> None:
    """Notes are the group's liveness: after a stall both members saw as the other's, each has the
    other down, and if a down verdict stopped notes too, neither would hear from the other until
    retry_down_after (both reading the PFS for what the other holds).  On a MockClock that never
    moves: a note to a down peer that refuses fails and leaves the verdict's wait as it was; once
    a server listens, a note reaches it (counted by the server), is answered and marks the peer up,
    and the next fetch goes to it at once."""
    clock = trio.testing.MockClock()
    files = Files()
    port = unused_port()

    async def main() -> None:
        peer = client(port, down_after=1, retry_down_after=30.0)
        ident = file_id(1, 10_000)
        assert await peer.fetch(0, 1, DIGEST, ident) is None
        assert peer.state == "down"
        assert await peer.note(b"state") is None  # still refused: no answer, and no probe earned
        assert peer.state == "down" and peer.counters.failures == 2
        with pytest.raises(PeerDown):
            await peer.fetch(0, 1, DIGEST, ident)
        sock = listening_on(port)
        server = PeerServer(TOKEN, files, notes=lambda body: b"mine:" + body)
        async with trio.open_nursery() as nursery:
            await nursery.start(lambda task_status: server.serve(HOST, port, sock=sock, task_status=task_status))
            assert await peer.note(b"state") == b"mine:state"
            assert server.requests["note"] == 1
            assert peer.status()["state"] == "up"
            requests = peer.counters.requests
            assert await peer.fetch(0, 1, DIGEST, ident) == files.data[1]  # with no clock moved
            assert peer.counters.requests == requests + 1
            nursery.cancel_scope.cancel()
        await peer.aclose()

    trio.run(main, clock=clock)


def test_the_peer_client_reads_no_clock_but_trios() -> None:
    """Health must follow the clock trio runs on: no time.monotonic/time.time in the client."""
    from pathlib import Path

    import fusefs.cluster.peer_client as module

    text = Path(module.__file__).read_text()
    assert "import time" not in text and "time.monotonic" not in text and "time.time" not in text


def test_note_frames_round_trip_unchanged() -> None:
    assert decode_message(Kind.NOTE, Note(5, b"{}").encode()[FRAME_HEADER.size :]) == Note(5, b"{}")


# ---------------------------------------------------------------- strangers holding handshake slots


@pytest.mark.parametrize("strangers", [40, 200])
def test_strangers_holding_silent_connections_never_keep_a_peer_out(strangers: int) -> None:
    """Connections that never send a byte (no token needed to open them) held open for the whole
    handshake deadline: a real peer must still be served at once, the strangers may hold at most
    ``max_handshakes`` slots, and the ones pushed out are counted as crowded.  Before the cap the
    40 silent connections filled ``max_connections`` and the peer was told BUSY until they timed out."""

    async def main() -> None:
        files = Files(n=3)
        async with serving(files, max_connections=40, max_handshakes=8, handshake_timeout=30.0) as (server, port):
            silent: list[trio.SocketStream] = []
            for _ in range(strangers):
                silent.append(await trio.open_tcp_stream(HOST, port))
            with trio.fail_after(5):  # every stranger accepted and counted (or already pushed out)
                while server.connections_total < strangers:
                    await trio.sleep(0.01)
            peer = client(port, timeout=2.0)
            with trio.fail_after(3):
                got = await peer.fetch(0, 1, DIGEST, file_id(1, 10_000))
            assert got == files.data[1], "a real peer was kept out by strangers that never sent a byte"
            st = server.status()
            held = st["connections"] - 1  # the peer's own connection stays open
            assert held <= 8, f"{held} unauthenticated connections held (cap 8)"
            assert st["refused"].get("crowded", 0) >= strangers - 8, st["refused"]
            assert "busy" not in st["refused"], st["refused"]
            await peer.aclose()
            for s in silent:
                await s.aclose()
            await settled(server)

    trio.run(main)
