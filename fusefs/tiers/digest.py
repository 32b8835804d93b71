"""Per-block xxh3 digests of tier data.

Why per block: a large file served in ranges can be checked block by block, so the first byte does
not wait for a hash of the whole file, and a damaged block costs one refetch, not a wrong answer.
"""

from __future__ import annotations

from dataclasses import dataclass

import xxhash

BLOCK = 1 << 20
"""Digest block size; a file of up to BLOCK bytes (the empty file included) has one digest."""


def block_count(size: int) -> int:
    return max(1, -(-size // BLOCK))


@dataclass(frozen=True, slots=True)
class BlockDigests:
    """xxh3_64 of each BLOCK of a file of ``size`` bytes (the last block may be short)."""

    size: int
    digests: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.digests) != block_count(self.size):
            want = block_count(self.size)
            raise ValueError(f"{len(self.digests)} digests for {self.size} bytes (want {want})")

    @classmethod
    def of(cls, data: bytes | bytearray | memoryview) -> BlockDigests:
        view = memoryview(data).cast("B")
        size = len(view)
        if size <= BLOCK:
            return cls(size, (xxhash.xxh3_64_intdigest(view),))
        return cls(size, tuple(xxhash.xxh3_64_intdigest(view[o : o + BLOCK]) for o in range(0, size, BLOCK)))

    @property
    def blocks(self) -> int:
        return len(self.digests)

    def span(self, off: int, size: int) -> tuple[int, int]:
        """The block-aligned byte range [start, end) covering ``size`` bytes at ``off`` (clamped)."""
        off = min(max(off, 0), self.size)
        end = min(off + max(size, 0), self.size)
        first = min(off // BLOCK, self.blocks - 1)
        last = max(first, (end - 1) // BLOCK) if end > off else first
        return first * BLOCK, min((last + 1) * BLOCK, self.size)

    def verify(self, data: bytes | bytearray | memoryview, first_block: int = 0) -> bool:
        """True when ``data`` is the file's bytes from ``first_block`` on, whole blocks (the last may
        be the file's short tail); a range of the wrong length never verifies."""
        view = memoryview(data).cast("B")
        if not 0 <= first_block < self.blocks:
            return False
        start = first_block * BLOCK
        n = block_count(len(view)) if view else 1
        if first_block + n > self.blocks or len(view) != min(self.size, start + n * BLOCK) - start:
            return False
        for i in range(n):
            if xxhash.xxh3_64_intdigest(view[i * BLOCK : (i + 1) * BLOCK]) != self.digests[first_block + i]:
                return False
        return True
