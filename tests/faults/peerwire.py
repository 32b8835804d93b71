"""A raw peer-protocol client: speaks the real wire format with the real job token, byte by byte,
to send what a well-behaved daemon never would (oversized BLOCK frames, notes with odd seeds)."""

from __future__ import annotations

import json
import socket
from pathlib import Path

from .internals import (
    CHALLENGE_LEN,
    FRAME_HEADER,
    MAX_BLOCK_SIZE,
    VERDICT_LEN,
    VERSION,
    Challenge,
    Hello,
    Kind,
    Note,
    client_proof,
    decode_message,
    frame_header,
    new_nonce,
    parse_frame_header,
)


def recv_exactly(sock: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        if not chunk:
            raise ConnectionError(f"closed after {len(out)} of {n} bytes")
        out += chunk
    return out


def read_token(path: Path) -> bytes:
    """The job token as a daemon reads it from a token file (hex text)."""
    return bytes.fromhex(path.read_text().strip())


def connect(host: str, port: int, token: bytes, timeout: float = 10.0) -> socket.socket:
    """An authenticated connection (the handshake done, the verdict ACCEPTED)."""
    sock = socket.create_connection((host, port), timeout=timeout)
    try:
        nonce = new_nonce()
        sock.sendall(Hello(VERSION, nonce).encode())
        challenge = Challenge.decode(recv_exactly(sock, CHALLENGE_LEN))
        assert challenge.greeting == 0, f"server greeting {challenge.greeting!r}"
        sock.sendall(client_proof(token, nonce, challenge.nonce))
        verdict = recv_exactly(sock, VERDICT_LEN)
        assert verdict == b"\0", f"server refused the token (verdict {verdict!r})"
    except BaseException:
        sock.close()
        raise
    return sock


def largest_block_frame_header() -> bytes:
    """The header of the largest BLOCK frame the protocol lets through (digest + MAX_BLOCK_SIZE)."""
    return frame_header(Kind.BLOCK, 8 + MAX_BLOCK_SIZE)


def send_note(sock: socket.socket, note: dict[str, object], request_id: int = 1) -> dict[str, object] | None:
    """Send a NOTE (a peer's state: member index, node, plan, seed) and return the server's own note."""
    sock.sendall(Note(request_id, json.dumps(note).encode()).encode())
    kind, length = parse_frame_header(recv_exactly(sock, FRAME_HEADER.size))
    message = decode_message(kind, recv_exactly(sock, length))
    assert isinstance(message, Note), message
    return json.loads(message.body) if message.body else None
