"""The seed search's first chunks small: a likely seed found in milliseconds, not after a whole chunk.

:class:`placement.seedsearch.SeedSearch` tries candidates a chunk at a time (65,536 by default, a
size that keeps numpy's per-call overhead small over millions of candidates) and answers only at a
chunk's end.  The likeliest seeds (42, 0, 1234, ...) come first in the plan, but the first chunk
still costs 0.1-0.3 s on a busy node: 20-60 opens a node makes while the search runs, each left
unpredicted.  :class:`Ramped` hands the same values in the same order in chunks that start at
:data:`FIRST` and double up to the search's size: the common seeds are answered within a few
milliseconds and the range keeps its large chunks.  Which values are tried, in which order, and so
every false-match bound, are unchanged.

Pure: numpy only.
"""

from __future__ import annotations

from collections.abc import Iterator

from placement.seedsearch import U32, Candidates

FIRST = 1024
"""Values in the first chunk: the common seeds and the first few hundred small integers."""


class Ramped(Candidates):
    """``inner``'s plan, its chunks growing from :data:`FIRST` to the size asked for."""

    def __init__(self, inner: Candidates, first: int = FIRST) -> None:
        if first < 1:
            raise ValueError(f"first chunk: expected >= 1, got {first}")
        self.__dict__.update(inner.__dict__)  # the same plan: listed values, ranges, length
        self.first_chunk = first

    def chunks(self, size: int) -> Iterator[U32]:
        step = min(self.first_chunk, size)
        for values in super().chunks(size):
            lo, n = 0, int(values.shape[0])
            while lo < n:
                hi = min(n, lo + step)
                yield values[lo:hi]
                lo, step = hi, min(size, 2 * step)
