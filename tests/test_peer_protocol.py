"""The peer wire format and the token proofs, as pure functions (no sockets).

Round-trips prove every field survives encoding; the fuzz tests prove that any byte string a
sender can make is either a valid message or a ProtocolError, never another exception, and that
no length read from the wire is accepted beyond its fixed maximum.
"""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fusefs.cluster import auth
from fusefs.cluster.protocol import (
    BLOCK_HEADER_LEN,
    CHALLENGE_LEN,
    CLIENT_KINDS,
    FRAME_HEADER,
    HELD_ONLY,
    HELLO_LEN,
    MAX_BLOCK_SIZE,
    MAX_CONTROL_PAYLOAD,
    MAX_DIGEST_LEN,
    MAX_REASON_LEN,
    NONCE_LEN,
    PROOF_LEN,
    SERVER_KINDS,
    U32_MAX,
    U64_MAX,
    Challenge,
    FileId,
    Get,
    Greeting,
    Hello,
    Kind,
    Ping,
    Pong,
    ProtocolError,
    Reply,
    Status,
    Verdict,
    block_count,
    block_header,
    decode_message,
    decode_verdict,
    frame_header,
    parse_block_header,
    parse_frame_header,
)

u32 = st.integers(0, U32_MAX)
u64 = st.integers(0, U64_MAX)
nonces = st.binary(min_size=NONCE_LEN, max_size=NONCE_LEN)


def split(frame: bytes) -> tuple[Kind, bytes]:
    kind, length = parse_frame_header(frame[: FRAME_HEADER.size])
    payload = frame[FRAME_HEADER.size :]
    assert len(payload) == length
    return kind, payload


i64 = st.integers(-(2**63), 2**63 - 1)
files = st.builds(FileId, u64, u64, i64)


@given(u32, u32, u64, st.binary(max_size=MAX_DIGEST_LEN), files, st.sampled_from([0, HELD_ONLY]))
def test_get_round_trips(request_id: int, dataset: int, index: int, digest: bytes, file: FileId, flags: int) -> None:
    msg = Get(request_id, dataset, index, digest, file, flags)
    assert decode_message(*split(msg.encode())) == msg
    assert msg.held_only == (flags == HELD_ONLY)


@given(st.integers(0, 255).filter(lambda f: f & ~HELD_ONLY))
def test_a_get_with_an_unknown_flag_is_neither_sent_nor_accepted(flags: int) -> None:
    with pytest.raises(ValueError, match="unknown GET flags"):
        Get(1, 0, 0, b"", flags=flags).encode()
    frame = bytearray(Get(1, 0, 0, b"").encode())
    frame[-1] = flags  # the flags byte ends a GET without a digest
    with pytest.raises(ProtocolError, match="unknown flags"):
        decode_message(*split(bytes(frame)))


@given(u32, st.sampled_from(list(Status)), u64, st.integers(1, MAX_BLOCK_SIZE), st.text(max_size=100), u64, i64)
def test_reply_round_trips(
    request_id: int, status: Status, size: int, block_size: int, reason: str, entry: int, mtime_ns: int
) -> None:
    msg = Reply(request_id, status, size, block_size, reason, entry, mtime_ns)
    assert msg.file == FileId(entry, size, mtime_ns)
    assert decode_message(*split(msg.encode())) == msg


@given(u32)
def test_ping_and_pong_round_trip(request_id: int) -> None:
    assert decode_message(*split(Ping(request_id).encode())) == Ping(request_id)
    assert decode_message(*split(Pong(request_id).encode())) == Pong(request_id)


@given(st.integers(0, 255), nonces, st.sampled_from(list(Greeting)), nonces, st.binary(min_size=32, max_size=32))
def test_handshake_messages_round_trip(
    version: int, cnonce: bytes, greeting: Greeting, snonce: bytes, proof: bytes
) -> None:
    hello = Hello(version, cnonce)
    assert len(hello.encode()) == HELLO_LEN
    assert Hello.decode(hello.encode()) == hello
    challenge = Challenge(version, greeting, snonce, proof)
    assert len(challenge.encode()) == CHALLENGE_LEN
    assert Challenge.decode(challenge.encode()) == challenge


def test_long_reasons_are_cut_to_the_limit() -> None:
    msg = Reply(1, Status.BAD_REQUEST, reason="x" * (MAX_REASON_LEN * 2))
    decoded = decode_message(*split(msg.encode()))
    assert isinstance(decoded, Reply) and decoded.reason == "x" * MAX_REASON_LEN


def test_a_digest_longer_than_the_limit_is_not_encoded() -> None:
    with pytest.raises(ValueError):
        Get(1, 0, 0, b"d" * (MAX_DIGEST_LEN + 1)).encode()


@given(st.binary(max_size=120))
def test_any_bytes_decode_to_a_message_or_a_protocol_error(data: bytes) -> None:
    for kind in Kind:
        with contextlib.suppress(ProtocolError):
            decode_message(kind, data)
    for decode in (Hello.decode, Challenge.decode, decode_verdict):
        with contextlib.suppress(ProtocolError):
            decode(data)


@given(st.binary(min_size=FRAME_HEADER.size, max_size=FRAME_HEADER.size))
def test_frame_headers_never_announce_more_than_the_maxima(data: bytes) -> None:
    try:
        kind, length = parse_frame_header(data)
    except ProtocolError:
        return
    assert length <= (8 + MAX_BLOCK_SIZE if kind is Kind.BLOCK else MAX_CONTROL_PAYLOAD)


def test_oversized_and_unknown_frames_are_refused_from_the_header() -> None:
    with pytest.raises(ProtocolError, match="limit"):
        parse_frame_header(frame_header(Kind.GET, MAX_CONTROL_PAYLOAD + 1))
    with pytest.raises(ProtocolError, match="limit"):
        parse_frame_header(frame_header(Kind.BLOCK, 8 + MAX_BLOCK_SIZE + 1))
    with pytest.raises(ProtocolError, match="limit"):
        parse_frame_header(frame_header(Kind.BLOCK, 8 + 1001), max_block=1000)
    with pytest.raises(ProtocolError, match="unknown frame kind"):
        parse_frame_header(bytes([0x7F, 0, 0, 0, 0]))


def test_each_side_refuses_the_kinds_only_the_other_side_sends_from_the_header() -> None:
    for kind in Kind:
        length = 8 + MAX_BLOCK_SIZE if kind is Kind.BLOCK else 10
        for accept in (CLIENT_KINDS, SERVER_KINDS):
            if kind in accept:
                assert parse_frame_header(frame_header(kind, length), accept=accept) == (kind, length)
            else:
                with pytest.raises(ProtocolError, match="not accepted"):
                    parse_frame_header(frame_header(kind, length), accept=accept)
    assert Kind.BLOCK not in CLIENT_KINDS | SERVER_KINDS  # blocks come only where a reply announced them


def test_file_identities_out_of_the_wire_range_are_not_made() -> None:
    with pytest.raises(ValueError):
        FileId(-1, 0, 0)
    with pytest.raises(ValueError):
        FileId(0, 0, 2**63)


def test_a_get_whose_digest_length_disagrees_with_the_frame_is_refused() -> None:
    kind, payload = split(Get(1, 2, 3, b"abcd").encode())
    with pytest.raises(ProtocolError):
        decode_message(kind, payload[:-1])
    with pytest.raises(ProtocolError):
        decode_message(kind, payload + b"e")


def test_an_ok_reply_with_an_unusable_block_size_is_refused() -> None:
    for block_size in (0, MAX_BLOCK_SIZE + 1):
        kind, payload = split(Reply(1, Status.OK, 10, block_size).encode())
        with pytest.raises(ProtocolError, match="block size"):
            decode_message(kind, payload)


def test_an_unknown_status_or_bad_magic_is_refused() -> None:
    kind, payload = split(Reply(1, Status.OK, 10, 10).encode())
    with pytest.raises(ProtocolError, match="status"):
        decode_message(kind, payload[:4] + b"\x09" + payload[5:])
    with pytest.raises(ProtocolError, match="magic"):
        Hello.decode(b"HTTP" + bytes(HELLO_LEN - 4))
    with pytest.raises(ProtocolError, match="magic"):
        Challenge.decode(b"GET " + bytes(CHALLENGE_LEN - 4))


def test_block_headers_carry_the_digest_and_must_have_the_announced_length() -> None:
    header = block_header(1000, 0xDEADBEEF12345678)
    assert len(header) == BLOCK_HEADER_LEN
    assert parse_block_header(header, 1000) == 0xDEADBEEF12345678
    with pytest.raises(ProtocolError, match="want 999"):
        parse_block_header(header, 999)
    with pytest.raises(ProtocolError, match="block was expected"):
        parse_block_header(Ping(1).encode() + bytes(4), 0)
    with pytest.raises(ProtocolError):
        parse_block_header(header[:-1], 1000)


def test_verdicts() -> None:
    assert decode_verdict(bytes([Verdict.ACCEPTED])) is Verdict.ACCEPTED
    assert decode_verdict(bytes([Verdict.REFUSED])) is Verdict.REFUSED
    with pytest.raises(ProtocolError):
        decode_verdict(b"\x02")


def test_block_count_has_one_block_for_an_empty_file() -> None:
    assert [block_count(n, 4) for n in (0, 1, 4, 5, 8, 9)] == [1, 1, 1, 2, 2, 3]


# ---------------------------------------------------------------- proofs

TOKEN = b"t" * 32


def test_proofs_depend_on_token_nonces_and_direction() -> None:
    cn, sn = auth.new_nonce(), auth.new_nonce()
    assert cn != sn and len(cn) == NONCE_LEN
    proof = auth.client_proof(TOKEN, cn, sn)
    assert len(proof) == PROOF_LEN
    assert auth.proof_ok(proof, auth.client_proof(TOKEN, cn, sn))
    assert not auth.proof_ok(proof, auth.client_proof(b"u" * 32, cn, sn))
    assert not auth.proof_ok(proof, auth.client_proof(TOKEN, sn, cn))
    assert not auth.proof_ok(proof, auth.server_proof(TOKEN, cn, sn))  # a server's proof is no client proof


def test_short_tokens_are_refused() -> None:
    auth.check_token(b"x" * auth.MIN_TOKEN_LEN)
    with pytest.raises(ValueError, match="at least"):
        auth.check_token(b"x" * (auth.MIN_TOKEN_LEN - 1))
