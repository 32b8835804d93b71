"""Job-token proofs for the peer handshake: HMAC-SHA256 over both sides' nonces.

Why challenge-response: the token never crosses the wire, a recorded handshake cannot be replayed
(each side picks a fresh nonce), and both sides prove themselves, so a client also refuses a
daemon of another job that happens to listen on a recycled address.  The two directions use
different labels, so a proof one side hands out can never be replayed as the other side's.

This authenticates connections; it does not encrypt or MAC the data that follows (the per-block
xxh3 digests catch accidents, not an attacker on the path).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

from fusefs.cluster.protocol import NONCE_LEN, VERSION

MIN_TOKEN_LEN = 16

_SERVER_LABEL = b"seerfs-peer-server\0"
_CLIENT_LABEL = b"seerfs-peer-client\0"


def check_token(token: bytes) -> None:
    """Refuse a token too short to be a secret (the job token is generated, never typed)."""
    if len(token) < MIN_TOKEN_LEN:
        raise ValueError(f"job token of {len(token)} bytes (at least {MIN_TOKEN_LEN} needed)")


def new_nonce() -> bytes:
    return secrets.token_bytes(NONCE_LEN)


def _proof(label: bytes, token: bytes, client_nonce: bytes, server_nonce: bytes) -> bytes:
    return hmac.new(token, label + bytes([VERSION]) + client_nonce + server_nonce, hashlib.sha256).digest()


def server_proof(token: bytes, client_nonce: bytes, server_nonce: bytes) -> bytes:
    return _proof(_SERVER_LABEL, token, client_nonce, server_nonce)


def client_proof(token: bytes, client_nonce: bytes, server_nonce: bytes) -> bytes:
    return _proof(_CLIENT_LABEL, token, client_nonce, server_nonce)


def proof_ok(expected: bytes, received: bytes) -> bool:
    """Constant-time comparison, so timing does not reveal how much of a guess was right."""
    return hmac.compare_digest(expected, received)
