"""One convention for the latency percentiles every benchmark prints, so their tables compare."""

from __future__ import annotations

from collections.abc import Sequence


def quantile(ordered: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0 to 1) of samples sorted ascending: the sample at index int(q * (n - 1)),
    never interpolated (the median the benchmarks print is :func:`statistics.median`'s)."""
    return ordered[int(q * (len(ordered) - 1))]
