"""Exact-length reads from a trio stream, for the fixed-size parts of the peer protocol.

Each read asks for no more than it needs, so nothing is ever buffered past a frame and a
connection can be handed from one request to the next without a reader object.
"""

from __future__ import annotations

import trio


class Closed(Exception):
    """The other side closed the stream; ``clean`` when it did so before any byte of this read."""

    def __init__(self, clean: bool, wanted: int, got: int) -> None:
        super().__init__(f"connection closed after {got} of {wanted} bytes")
        self.clean = clean


async def receive_exactly(stream: trio.abc.ReceiveStream, n: int) -> bytes:
    if n == 0:
        return b""
    first = await stream.receive_some(n)
    if not first:
        raise Closed(True, n, 0)
    if len(first) == n:
        return bytes(first)
    parts = [first]
    got = len(first)
    while got < n:
        chunk = await stream.receive_some(n - got)
        if not chunk:
            raise Closed(False, n, got)
        parts.append(chunk)
        got += len(chunk)
    return b"".join(parts)
