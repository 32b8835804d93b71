"""The peer wire format: fixed handshake messages, then length-prefixed frames (pure: no I/O).

Why this shape: every length read from the wire is checked against a fixed maximum before a byte
of payload is awaited, so a confused or hostile sender can cost a bounded read and a closed
connection, never an allocation it chose.  Requests name a file only by (dataset, index, plan
digest): no path ever crosses the wire, and the server maps the index through its own snapshot.

Connection (all integers big-endian)::

    client -> server  HELLO      magic "SRFS" | version u8 | client nonce 16             (21 bytes)
    server -> client  CHALLENGE  magic "SRFS" | version u8 | status u8 | server nonce 16
                                 | server proof 32                                         (54 bytes)
    client -> server  AUTH       client proof 32                                           (32 bytes)
    server -> client  VERDICT    u8: 0 accepted, 1 refused (then the server closes)        (1 byte)

then any number of requests, one at a time, each a frame ``kind u8 | payload length u32 | payload``::

    GET    0x10  request id u32 | dataset u32 | index u64 | FILE | digest length u8 | flags u8
                 | plan digest (<= 64)
    PING   0x11  request id u32
    NOTE   0x12  request id u32 | JSON state note (<= 1020 bytes)
    REPLY  0x20  request id u32 | status u8 | size u64 | block size u32 | FILE | reason length u16 | reason
    PONG   0x21  request id u32
    BLOCK  0x22  xxh3_64 of the data u64 | data (<= the reply's block size)
    NOTED  0x23  request id u32 | JSON state note (<= 1020 bytes)

    FILE = entry u64 | size u64 | mtime_ns i64   (a file's identity in a snapshot)

A client sends only GET, PING and NOTE; a server only REPLY, PONG, BLOCK and NOTED.  Each side
refuses any other kind from the frame header, before a byte of its payload is read.

A GET carries the identity of the file the requester means, from its own snapshot; the server
answers a file only when its own snapshot's identity for the index it maps that request to is the
same (else MISMATCH), and its REPLY repeats the identity of what it sends, which the requester
checks again.  A peer whose plan or snapshot disagrees can so refuse, but never hand out the bytes
of another file.  A REPLY with status OK is followed by ``block_count(size, block size)`` BLOCK
frames (at least one: an empty file is one empty block); every block but the last is exactly
``block size`` long.

GET flags: ``HELD_ONLY`` (0x01) asks for a copy the server holds now (a local tier, bytes in RAM,
pages in its page cache, or a PFS read it has under way) and never makes it read the PFS: the
requester is about to read the file from the PFS itself and asks first whether a member that may
have read it earlier still has it.  Any other bit set is a protocol error.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import IntEnum
from typing import ClassVar, Self

MAGIC = b"SRFS"
VERSION = 3
"""2: GET and REPLY carry the file's identity (entry, size, mtime_ns).  3: GET carries flags."""
NONCE_LEN = 16
PROOF_LEN = 32

MAX_DIGEST_LEN = 64
MAX_REASON_LEN = 512
MAX_CONTROL_PAYLOAD = 1024
"""Largest payload of any frame but BLOCK."""
MAX_BLOCK_SIZE = 16 << 20
"""Largest block a server may announce (and so the largest BLOCK payload, less its digest)."""
DEFAULT_MAX_FILE_SIZE = 4 << 30

FRAME_HEADER = struct.Struct("!BI")
BLOCK_DIGEST = struct.Struct("!Q")
BLOCK_HEADER_LEN = FRAME_HEADER.size + BLOCK_DIGEST.size

_HELLO = struct.Struct(f"!4sB{NONCE_LEN}s")
_CHALLENGE = struct.Struct(f"!4sBB{NONCE_LEN}s{PROOF_LEN}s")
_FILE = struct.Struct("!QQq")
_GET = struct.Struct("!IIQQQqBB")
_REQ_ID = struct.Struct("!I")
_REPLY = struct.Struct("!IBQIQqH")

HELLO_LEN = _HELLO.size
CHALLENGE_LEN = _CHALLENGE.size
VERDICT_LEN = 1
U32_MAX = 0xFFFFFFFF
U64_MAX = 0xFFFFFFFFFFFFFFFF


class ProtocolError(Exception):
    """Bytes that do not follow this format (the connection is closed after one)."""


class Kind(IntEnum):
    GET = 0x10
    PING = 0x11
    NOTE = 0x12  # a small state note (JSON): the server answers with its own (NOTED)
    REPLY = 0x20
    PONG = 0x21
    BLOCK = 0x22
    NOTED = 0x23


class Status(IntEnum):
    OK = 0
    NOT_YET = 1  # the owner has not fetched the file yet (NoPFS 5.2.2 heuristic missed)
    NOT_OWNED = 2  # the peer does not hold the file
    BAD_REQUEST = 3  # wrong plan digest, index outside the snapshot, malformed frame
    ERROR = 4  # the peer failed to read its own copy
    MISMATCH = 5  # the peer's file at that index is not the file the request names
    BUSY = 6  # the peer has no room (memory for replies) now; ask the PFS


class Greeting(IntEnum):
    """CHALLENGE status: whether the server goes on with the handshake."""

    GO = 0
    BAD_VERSION = 1
    BUSY = 2  # too many connections


class Verdict(IntEnum):
    ACCEPTED = 0
    REFUSED = 1


CLIENT_KINDS = frozenset({Kind.GET, Kind.PING, Kind.NOTE})
"""What a server accepts: everything else is refused from its header."""
SERVER_KINDS = frozenset({Kind.REPLY, Kind.PONG, Kind.NOTED})
"""What a client accepts as an answer (BLOCK frames only where a reply announced them)."""

I64_MIN, I64_MAX = -(1 << 63), (1 << 63) - 1


def block_count(size: int, block_size: int) -> int:
    return max(1, -(-size // block_size))


@dataclass(frozen=True, slots=True)
class FileId:
    """A file's identity in a snapshot: which entry, and the size and mtime it had when walked."""

    entry: int
    size: int
    mtime_ns: int

    def __post_init__(self) -> None:
        if not (0 <= self.entry <= U64_MAX and 0 <= self.size <= U64_MAX and I64_MIN <= self.mtime_ns <= I64_MAX):
            raise ValueError(f"file identity out of range: {self}")


NO_FILE = FileId(0, 0, 0)


# ---------------------------------------------------------------- handshake


@dataclass(frozen=True, slots=True)
class Hello:
    version: int
    nonce: bytes

    def encode(self) -> bytes:
        return _HELLO.pack(MAGIC, self.version, self.nonce)

    @classmethod
    def decode(cls, data: bytes) -> Hello:
        if len(data) != HELLO_LEN:
            raise ProtocolError(f"hello of {len(data)} bytes")
        magic, version, nonce = _HELLO.unpack(data)
        if magic != MAGIC:
            raise ProtocolError("not a seerfs peer (bad magic)")
        return cls(version, nonce)


@dataclass(frozen=True, slots=True)
class Challenge:
    version: int
    greeting: Greeting
    nonce: bytes = bytes(NONCE_LEN)
    proof: bytes = bytes(PROOF_LEN)

    def encode(self) -> bytes:
        return _CHALLENGE.pack(MAGIC, self.version, self.greeting, self.nonce, self.proof)

    @classmethod
    def decode(cls, data: bytes) -> Challenge:
        if len(data) != CHALLENGE_LEN:
            raise ProtocolError(f"challenge of {len(data)} bytes")
        magic, version, greeting, nonce, proof = _CHALLENGE.unpack(data)
        if magic != MAGIC:
            raise ProtocolError("not a seerfs peer (bad magic)")
        try:
            return cls(version, Greeting(greeting), nonce, proof)
        except ValueError:
            raise ProtocolError(f"unknown greeting {greeting}") from None


def decode_verdict(data: bytes) -> Verdict:
    if len(data) != VERDICT_LEN or data[0] not in (Verdict.ACCEPTED, Verdict.REFUSED):
        raise ProtocolError(f"bad verdict {data!r}")
    return Verdict(data[0])


# ---------------------------------------------------------------- frames


def frame_header(kind: Kind, length: int) -> bytes:
    return FRAME_HEADER.pack(kind, length)


def parse_frame_header(
    data: bytes, *, max_block: int = MAX_BLOCK_SIZE, accept: frozenset[Kind] | None = None
) -> tuple[Kind, int]:
    """The kind and payload length of a frame, refused before its payload is read when too long
    or (``accept``) of a kind this side must never receive."""
    if len(data) != FRAME_HEADER.size:
        raise ProtocolError(f"frame header of {len(data)} bytes")
    raw_kind, length = FRAME_HEADER.unpack(data)
    try:
        kind = Kind(raw_kind)
    except ValueError:
        raise ProtocolError(f"unknown frame kind 0x{raw_kind:02x}") from None
    if accept is not None and kind not in accept:
        raise ProtocolError(f"{kind.name} frame is not accepted here")
    limit = BLOCK_DIGEST.size + max_block if kind is Kind.BLOCK else MAX_CONTROL_PAYLOAD
    if length > limit:
        raise ProtocolError(f"{kind.name} frame of {length} bytes (limit {limit})")
    return kind, length


HELD_ONLY = 0x01
"""GET flag: answer only from what the server holds now; never read the PFS for this request."""
_GET_FLAGS = HELD_ONLY


@dataclass(frozen=True, slots=True)
class Get:
    request_id: int
    dataset: int
    index: int
    digest: bytes
    file: FileId = NO_FILE
    flags: int = 0

    @property
    def held_only(self) -> bool:
        return bool(self.flags & HELD_ONLY)

    def encode(self) -> bytes:
        if len(self.digest) > MAX_DIGEST_LEN:
            raise ValueError(f"plan digest of {len(self.digest)} bytes (limit {MAX_DIGEST_LEN})")
        if self.flags & ~_GET_FLAGS:
            raise ValueError(f"unknown GET flags 0x{self.flags:02x}")
        f = self.file
        head = _GET.pack(
            self.request_id, self.dataset, self.index, f.entry, f.size, f.mtime_ns, len(self.digest), self.flags
        )
        payload = head + self.digest
        return frame_header(Kind.GET, len(payload)) + payload

    @classmethod
    def decode(cls, payload: bytes) -> Get:
        if len(payload) < _GET.size:
            raise ProtocolError(f"GET of {len(payload)} bytes")
        request_id, dataset, index, entry, size, mtime_ns, n, flags = _GET.unpack_from(payload)
        if len(payload) != _GET.size + n or n > MAX_DIGEST_LEN:
            raise ProtocolError(f"GET of {len(payload)} bytes with a {n}-byte digest")
        if flags & ~_GET_FLAGS:
            raise ProtocolError(f"GET with unknown flags 0x{flags:02x}")
        return cls(request_id, dataset, index, payload[_GET.size :], FileId(entry, size, mtime_ns), flags)


@dataclass(frozen=True, slots=True)
class _Probe:
    """A frame that is only a request id: PING and its PONG differ in nothing but their kind."""

    KIND: ClassVar[Kind]
    request_id: int

    def encode(self) -> bytes:
        return frame_header(self.KIND, _REQ_ID.size) + _REQ_ID.pack(self.request_id)

    @classmethod
    def decode(cls, payload: bytes) -> Self:
        if len(payload) != _REQ_ID.size:
            raise ProtocolError(f"{cls.KIND.name} of {len(payload)} bytes")
        return cls(_REQ_ID.unpack(payload)[0])


@dataclass(frozen=True, slots=True)
class Ping(_Probe):
    KIND = Kind.PING


@dataclass(frozen=True, slots=True)
class Pong(_Probe):
    KIND = Kind.PONG


@dataclass(frozen=True, slots=True)
class Reply:
    """``size`` is the size of the data that follows an OK reply; ``file`` the identity the server
    holds for it (its entry, size and mtime), which the requester compares with its own."""

    request_id: int
    status: Status
    size: int = 0
    block_size: int = 0
    reason: str = ""
    entry: int = 0
    mtime_ns: int = 0

    @property
    def file(self) -> FileId:
        return FileId(self.entry, self.size, self.mtime_ns)

    def encode(self) -> bytes:
        reason = self.reason.encode("utf-8", "replace")[:MAX_REASON_LEN]
        head = _REPLY.pack(
            self.request_id, self.status, self.size, self.block_size, self.entry, self.mtime_ns, len(reason)
        )
        payload = head + reason
        return frame_header(Kind.REPLY, len(payload)) + payload

    @classmethod
    def decode(cls, payload: bytes) -> Reply:
        if len(payload) < _REPLY.size:
            raise ProtocolError(f"REPLY of {len(payload)} bytes")
        request_id, raw_status, size, block_size, entry, mtime_ns, n = _REPLY.unpack_from(payload)
        if len(payload) != _REPLY.size + n or n > MAX_REASON_LEN:
            raise ProtocolError(f"REPLY of {len(payload)} bytes with a {n}-byte reason")
        try:
            status = Status(raw_status)
        except ValueError:
            raise ProtocolError(f"unknown status {raw_status}") from None
        if status is Status.OK and not 0 < block_size <= MAX_BLOCK_SIZE:
            raise ProtocolError(f"block size {block_size} (limit {MAX_BLOCK_SIZE})")
        reason = payload[_REPLY.size :].decode("utf-8", "replace")
        return cls(request_id, status, size, block_size, reason, entry, mtime_ns)


MAX_NOTE_BODY = MAX_CONTROL_PAYLOAD - _REQ_ID.size


@dataclass(frozen=True, slots=True)
class Note:
    """State a daemon tells a peer (seed, plan digest, training node); NOTED is the answer in kind."""

    request_id: int
    body: bytes
    reply: bool = False

    def encode(self) -> bytes:
        if len(self.body) > MAX_NOTE_BODY:
            raise ProtocolError(f"note of {len(self.body)} bytes (limit {MAX_NOTE_BODY})")
        kind = Kind.NOTED if self.reply else Kind.NOTE
        return frame_header(kind, _REQ_ID.size + len(self.body)) + _REQ_ID.pack(self.request_id) + self.body

    @classmethod
    def decode(cls, payload: bytes, reply: bool = False) -> Note:
        if not _REQ_ID.size <= len(payload) <= MAX_CONTROL_PAYLOAD:
            raise ProtocolError(f"{'NOTED' if reply else 'NOTE'} of {len(payload)} bytes")
        return cls(_REQ_ID.unpack_from(payload)[0], payload[_REQ_ID.size :], reply)


Message = Get | Ping | Reply | Pong | Note

_DECODERS: dict[Kind, type[Get] | type[Ping] | type[Reply] | type[Pong]] = {
    Kind.GET: Get,
    Kind.PING: Ping,
    Kind.REPLY: Reply,
    Kind.PONG: Pong,
}


def decode_message(kind: Kind, payload: bytes) -> Message:
    """A control frame's message (BLOCK frames are read with :func:`parse_block_digest`)."""
    if kind in (Kind.NOTE, Kind.NOTED):
        return Note.decode(payload, reply=kind is Kind.NOTED)
    decoder = _DECODERS.get(kind)
    if decoder is None:
        raise ProtocolError(f"{kind.name} frame where a message was expected")
    return decoder.decode(payload)


def block_header(data_len: int, digest: int) -> bytes:
    """The frame header and digest that precede a block's data."""
    return FRAME_HEADER.pack(Kind.BLOCK, BLOCK_DIGEST.size + data_len) + BLOCK_DIGEST.pack(digest)


def parse_block_header(data: bytes, expect_len: int) -> int:
    """The digest of a BLOCK frame whose data must be ``expect_len`` bytes long."""
    if len(data) != BLOCK_HEADER_LEN:
        raise ProtocolError(f"block header of {len(data)} bytes")
    kind, length = parse_frame_header(data[: FRAME_HEADER.size])
    if kind is not Kind.BLOCK:
        raise ProtocolError(f"{kind.name} frame where a block was expected")
    if length != BLOCK_DIGEST.size + expect_len:
        raise ProtocolError(f"block of {length - BLOCK_DIGEST.size} bytes (want {expect_len})")
    digest: int = BLOCK_DIGEST.unpack_from(data, FRAME_HEADER.size)[0]
    return digest
