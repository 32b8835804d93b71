"""Real daemons under a hostile member: state notes checked like local input, memory bounded under
500 authenticated connections sending the largest frames they can.

The hostile side holds the job token (read from the rendezvous directory, as any member can) and
speaks the wire format by hand.  Memory is the daemon's own peak resident set from
``/proc/PID/status`` (VmHWM, reset through ``/proc/PID/clear_refs`` before the traffic).
"""

from __future__ import annotations

import contextlib
import json
import random
import resource
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
from e2e import Job, make_source, wait_plan, write_seed
from mounting import mounted, status

from fusefs.cluster import auth
from fusefs.cluster.protocol import (
    BLOCK_DIGEST,
    CHALLENGE_LEN,
    FRAME_HEADER,
    MAX_BLOCK_SIZE,
    MAX_DIGEST_LEN,
    VERSION,
    Challenge,
    Get,
    Greeting,
    Hello,
    Kind,
    Note,
    Verdict,
    decode_message,
    frame_header,
    parse_frame_header,
)
from fusefs.planning.seed import SEED_MAX, SEED_MIN
from tools.harness.nodes import node_config

pytestmark = [pytest.mark.mount]

MiB = 1 << 20


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str], int]:
    root = tmp_path_factory.mktemp("pfs-hardening") / "data"
    digests, total = make_source(root, 120, 0, mean_size=20_000)
    return root, digests, total


class Member:
    """A hostile member: the daemon's data address and the job token."""

    def __init__(self, mnt: Path, work: Path) -> None:
        doc = status(mnt)
        self.host = doc["group"]["members"][0]["address"].rpartition(":")[0]
        self.port = int(doc["group"]["server"]["port"])
        self.token = bytes.fromhex((work / "rendezvous" / "token").read_text().strip())

    async def connect(self) -> trio.SocketStream | None:
        """An authenticated stream, or None when the server said BUSY."""
        s = await trio.open_tcp_stream(self.host, self.port)
        nonce = auth.new_nonce()
        await s.send_all(Hello(VERSION, nonce).encode())
        challenge = Challenge.decode(await exactly(s, CHALLENGE_LEN))
        if challenge.greeting is Greeting.BUSY:
            await s.aclose()
            return None
        assert challenge.greeting is Greeting.GO
        await s.send_all(auth.client_proof(self.token, nonce, challenge.nonce))
        assert await exactly(s, 1) == bytes([Verdict.ACCEPTED])
        return s


async def exactly(s: trio.SocketStream, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = await s.receive_some(n - len(out))
        if not chunk:
            raise EOFError(f"closed after {len(out)} of {n} bytes")
        out += chunk
    return out


async def answer(s: trio.SocketStream) -> object:
    kind, length = parse_frame_header(await exactly(s, FRAME_HEADER.size))
    return decode_message(kind, await exactly(s, length))


@contextlib.contextmanager
def one_node(root: Path, work: Path, **peers: object) -> Iterator[Path]:
    """One daemon in a rendezvous group of one (so it has a data port and a token on disk)."""
    cfg = node_config(
        work,
        0,
        Job(world_size=3, val=False),
        tier_bytes=4 * MiB,
        peers={"discovery": "rendezvous", "rendezvous_dir": str(work / "rendezvous"), "expect": 1, **peers},
    )
    with mounted(root, work / "node0" / "mnt", "-c", str(cfg)) as mnt:
        write_seed(mnt, 3)
        wait_plan(mnt, 3)
        yield mnt


def note(seed: object = None, **fields: object) -> bytes:
    body: dict[str, object] = {
        "l": "vm-1-abcd",
        "a": "127.0.0.9:4000",
        "node": None,
        "plan": None,
        "plan_seed": None,
        "seed": seed,
    }
    body.update(fields)
    return json.dumps(body).encode()


def test_a_peer_note_is_checked_like_local_input_and_a_bad_one_is_ignored(
    tmp_path: Path, source: tuple[Path, dict[str, str], int]
) -> None:
    """Before: a NOTE's seed was adopted by every node without the checks .control/seed applies
    (a seed of 2**70 became the job's seed).  Now each bad field is refused, counted and named in
    status, nothing of the note is adopted, and the daemon keeps serving."""
    root, _digests, _total = source
    bad = [
        (note([2**70, 5, 0], m=0), "fields"),  # the format of before, with an out-of-range seed
        (note([SEED_MAX + 1, 5, 0]), "outside torch's range"),
        (note([SEED_MIN - 1, 5, 0]), "outside torch's range"),
        (note(["42", 5, 0]), "outside torch's range"),
        (note([True, 5, 0]), "outside torch's range"),
        (note([42, -1, 0]), "generation"),
        (note([42, 2**70, 0]), "generation"),
        (note([42, 5, -7]), "writer"),
        (note([42, 5]), "[value, generation, writer]"),
        (note(None, node=7), "node 7"),
        (note(None, node=1.0), "node 1.0"),
        (note(None, plan="../../etc"), "hex"),
        (note(None, plan_seed=2**64), "plan seed"),
        (note(None, l="has space"), "label"),
        (note(None, a="no-port"), "host:port"),
        (b"[" * 1000 + b"]" * 20, "not JSON"),
        (b"\xff\xfe", "not JSON"),
        (b"[1, 2]", "not a JSON object"),
        (b'{"l": 1}', "fields"),
    ]
    with one_node(root, tmp_path) as mnt:
        member = Member(mnt, tmp_path)

        async def send() -> list[object]:
            s = await member.connect()
            assert s is not None
            out = []
            for i, (body, _why) in enumerate(bad):
                await s.send_all(Note(i, body).encode())
                out.append(await answer(s))
            # well-formed, in range, from no member of this group: not adopted either
            await s.send_all(Note(99, note([42, 50, 1])).encode())
            out.append(await answer(s))
            await s.aclose()
            return out

        replies = trio.run(send)
        assert all(isinstance(r, Note) and r.reply for r in replies)  # answered, connection kept
        doc = status(mnt)
        assert doc["seed"]["value"] == 3 and doc["seed"]["origin"] == "written", doc["seed"]
        group = doc["group"]
        assert group["notes_refused"] == len(bad), group
        assert group["notes_unknown"] == 1
        assert "fields" in group["last_bad_note"]
        for body, why in bad[1:]:  # each reason on its own, through the same checks
            from fusefs.cluster.peergroup import BadNote, parse_note

            with pytest.raises(BadNote, match=why.replace("[", r"\[").replace("]", r"\]")):
                parse_note(body, nodes=3)
        first = sorted(source[1])[0]
        assert (mnt / first).read_bytes() == (root / first).read_bytes()  # still serving correct bytes
        assert status(mnt)["pid"] == doc["pid"]


def _peak_reset(pid: int) -> int:
    """Reset the daemon's VmHWM to its current RSS (clear_refs 5); returns that RSS in bytes."""
    with open(f"/proc/{pid}/clear_refs", "w") as fh:
        fh.write("5")
    return _vm(pid, "VmHWM")


def _vm(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise AssertionError(field)


def test_500_authenticated_connections_sending_maximal_frames_cost_at_most_64_mib(
    tmp_path: Path, source: tuple[Path, dict[str, str], int]
) -> None:
    """Before: a BLOCK frame (16 MiB announced) was read into memory before being refused; 40
    connections took a daemon from 62 to 909 MiB.  Here a third of 500 connections send a BLOCK
    header and 2 MiB of it, a third 20 GETs with the largest digest, a third 20 NOTEs of the largest
    size, all at once; the daemon's peak RSS grows by at most 64 MiB and it keeps serving."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 2048:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4096), hard))
    root, _digests, _total = source
    rng = random.Random(5)
    with one_node(root, tmp_path, server_connections=512) as mnt:  # all 500 served, none told busy
        first = sorted(source[1])[0]
        assert (mnt / first).read_bytes() == (root / first).read_bytes()
        pid = status(mnt)["pid"]
        member = Member(mnt, tmp_path)
        before = _peak_reset(pid)
        counts = {"block": 0, "get": 0, "note": 0, "busy": 0}
        chunk = rng.randbytes(256 << 10)

        async def hostile(i: int, ready: trio.Event, go: trio.Event) -> None:
            try:
                s = await member.connect()
            except (OSError, EOFError, trio.BrokenResourceError):
                s = None
            ready.set()
            if s is None:
                counts["busy"] += 1
                return
            await go.wait()
            try:
                if i % 3 == 0:
                    await s.send_all(frame_header(Kind.BLOCK, BLOCK_DIGEST.size + MAX_BLOCK_SIZE))
                    for _ in range(8):
                        await s.send_all(chunk)
                    counts["block"] += 1
                elif i % 3 == 1:
                    for k in range(20):
                        digest = rng.randbytes(MAX_DIGEST_LEN)
                        await s.send_all(Get(k, 2**32 - 1, 2**64 - 1, digest).encode())
                        await answer(s)
                    counts["get"] += 1
                else:
                    body = json.dumps({"x": "y" * 1000}).encode()[:1020]
                    for k in range(20):
                        await s.send_all(Note(k, body).encode())
                        await answer(s)
                    counts["note"] += 1
            except (trio.BrokenResourceError, trio.ClosedResourceError, EOFError, OSError):
                if i % 3 == 0:
                    counts["block"] += 1  # refused before the payload was all sent: what should happen
            finally:
                await trio.aclose_forcefully(s)

        async def main() -> None:
            go = trio.Event()
            with trio.fail_after(240):
                async with trio.open_nursery() as nursery:
                    for i in range(500):
                        ready = trio.Event()
                        nursery.start_soon(hostile, i, ready, go)
                        await ready.wait()
                    go.set()

        trio.run(main)
        grew = _vm(pid, "VmHWM") - before
        doc = status(mnt)
        server = doc["group"]["server"]
        print(f"peak RSS grew {grew / MiB:.1f} MiB over {before / MiB:.0f} MiB; {counts}; server {server}")
        assert doc["pid"] == pid and (mnt / first).read_bytes() == (root / first).read_bytes()
        assert server["authenticated_total"] == 500 and counts["busy"] == 0 and sum(counts.values()) == 500
        assert server["protocol_errors"] >= counts["block"] >= 80  # the BLOCK frames were really refused
        assert doc["group"]["notes_refused"] >= 20 * counts["note"] > 0
        assert server["requests"].get("bad_request", 0) >= 20 * counts["get"] > 0
        assert grew <= 64 * MiB, f"daemon peak RSS grew {grew / MiB:.0f} MiB"
