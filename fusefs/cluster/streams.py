"""Exact-length reads from a trio stream, buffered, for the fixed-size parts of the peer protocol.

Why buffered: a reply's frame header, its fields, the first block's header and data usually
arrive together; reading each part with its own receive would cost a trip through the trio
scheduler (and often a syscall that finds nothing) per part.  The buffer only ever holds bytes
the other side already sent, so it never reads ahead into a request not yet made.
"""

from __future__ import annotations

import trio


class Closed(Exception):
    """The other side closed the stream; ``clean`` when it did so between two reads (no byte of
    this read had arrived)."""

    def __init__(self, clean: bool, wanted: int, got: int) -> None:
        super().__init__(f"connection closed after {got} of {wanted} bytes")
        self.clean = clean


class Receiver:
    __slots__ = ("_buf", "chunk", "stream")

    def __init__(self, stream: trio.SocketStream, chunk: int = 64 << 10) -> None:
        self.stream = stream
        self.chunk = chunk
        self._buf = bytearray()

    @property
    def buffered(self) -> int:
        return len(self._buf)

    async def exactly(self, n: int) -> bytes:
        buf = self._buf
        if not buf:
            if n == 0:
                return b""
            first = await self.stream.receive_some(max(n, self.chunk))
            if not first:
                raise Closed(True, n, 0)
            if len(first) == n:
                return bytes(first)  # the common whole-message case: no copy
            buf += first
        while len(buf) < n:
            more = await self.stream.receive_some(max(n - len(buf), self.chunk))
            if not more:
                raise Closed(False, n, len(buf))
            buf += more
        out = bytes(memoryview(buf)[:n])
        del buf[:n]
        return out

    async def pieces(self, n: int) -> list[bytes]:
        """Exactly ``n`` bytes as the pieces they arrived in (what was buffered, then each receive),
        so a large block can be hashed piece by piece and joined once, without an intermediate copy."""
        buf = self._buf
        got = min(len(buf), n)
        out = [bytes(memoryview(buf)[:got])] if got else []
        del buf[:got]
        while got < n:
            more = await self.stream.receive_some(n - got)
            if not more:
                raise Closed(False, n, got)
            out.append(bytes(more))
            got += len(more)
        return out
