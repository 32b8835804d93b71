"""The performance model of NoPFS section 4: how long a read takes from each source.

Parameters (all throughputs in MB/s, 1 MB = 10**6 bytes):

* ``t(gamma)``: the PFS's aggregate random-read throughput with gamma nodes reading at once;
  one reader gets t(gamma)/gamma.  Default {1: 330, 2: 730, 4: 1540, 8: 2870} (config
  ``model.pfs_mbps``), plus ``open_latency_s`` (default 0.003 s) per file opened on the PFS.
* ``b_c``: node-to-node bandwidth, default 24000 (``model.network_mbps``).
* ``r_j(p)``, ``w_j(p)``: read/write throughput of local tier j with p threads; defaults by tier
  kind (``model.memory_read_mbps`` ..., overridden per tier by ``tiers[].read_mbps`` /
  ``write_mbps``), with ``p_j = tiers[].threads``.
* ``p_0``: threads filling the staging buffer (``prefetch.threads``, default 32), whose writes
  go at ``w_0(p_0)`` (the memory write table).

Tables are sampled at a few thread/reader counts; between points the model interpolates
linearly and outside them it stays flat (NoPFS fits a regression; flat ends never extrapolate
a device past what was measured).

Fetch times for s bytes (NoPFS 4): local tier j: s / (r_j(p_j)/p_j); a peer's tier j:
s / min(b_c, r_j(p_j)/p_j); the PFS with gamma readers: s / (t(gamma)/gamma) + open latency.
A read takes the fastest source available plus the staging write s / (w_0(p_0)/p_0); a node's
epoch of reads takes their sum over p_0 threads (the paper's worst case, where training always
waits for I/O).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Final

import numpy as np
import numpy.typing as npt

MB = 1_000_000

SOURCE_LOCAL = 0
SOURCE_PEER = 1
SOURCE_PFS = 2
SOURCE_NAMES = ("local", "peer", "pfs")

# The model's defaults, in one place: fusefs.config's ``model`` section and ``tiers[].threads`` /
# ``prefetch.threads`` take their defaults from here (and so do the generated man pages), and
# from_config falls back to the same numbers for a dict that leaves a key out.
DEFAULT_PFS: Final[Mapping[int, float]] = MappingProxyType({1: 330.0, 2: 730.0, 4: 1540.0, 8: 2870.0})
DEFAULT_NETWORK: Final = 24000.0
DEFAULT_OPEN_LATENCY: Final = 0.003
DEFAULT_READ: Final[Mapping[str, Mapping[int, float]]] = MappingProxyType(
    {
        "memory": MappingProxyType({1: 10000.0, 4: 40000.0, 8: 85000.0}),
        "directory": MappingProxyType({1: 1000.0, 2: 2000.0, 4: 4000.0}),
    }
)
DEFAULT_WRITE: Final[Mapping[str, Mapping[int, float]]] = MappingProxyType(
    {
        "memory": MappingProxyType({1: 5000.0, 4: 20000.0, 8: 40000.0}),
        "directory": MappingProxyType({1: 800.0, 2: 1500.0, 4: 2500.0}),
    }
)
DEFAULT_TIER_THREADS: Final = 4
"""p_j: threads filling a tier."""
DEFAULT_STAGING_THREADS: Final = 32
"""p_0: threads filling the staging buffer: stages in flight at once.  A PFS's per-file open latency,
not its bandwidth, bounds a small-file window: at 20 ms per open, 4 stages deliver 200 files/s, and a
job that wrote its seed as it started (accelerate's set_seed) outran its window in epoch 0 (55% of
its opens waited for the PFS although every one was predicted); 32 kept it ahead (100%).  The window's
bytes, not this number, bound the memory staging holds; a DataLoader with 8 workers per GPU has as
many reads in flight on an 8-GPU node."""


@dataclass(frozen=True)
class Curve:
    """A throughput table: linear between points, flat outside them."""

    xs: tuple[float, ...]
    ys: tuple[float, ...]

    @classmethod
    def of(cls, table: Mapping[Any, float] | Curve | float) -> Curve:
        if isinstance(table, Curve):
            return table
        if isinstance(table, int | float):
            return cls((1.0,), (float(table),))
        points = sorted((float(k), float(v)) for k, v in table.items())
        if not points or any(x <= 0 or y <= 0 for x, y in points):
            raise ValueError(f"throughput table: expected positive counts and MB/s, got {dict(table)!r}")
        return cls(tuple(x for x, _ in points), tuple(y for _, y in points))

    def __call__(self, x: float) -> float:
        return float(np.interp(float(x), self.xs, self.ys))


@dataclass(frozen=True)
class TierPerf:
    """One local tier as the model sees it."""

    name: str
    read: Curve
    write: Curve
    threads: int

    @property
    def per_thread_read(self) -> float:
        """r_j(p_j) / p_j in MB/s."""
        return self.read(self.threads) / self.threads


class PerfModel:
    """Source selection and read-time prediction; plain numbers in, plain numbers out."""

    def __init__(
        self,
        pfs_mbps: Mapping[Any, float] | Curve = DEFAULT_PFS,
        network_mbps: float = DEFAULT_NETWORK,
        tiers: Sequence[TierPerf] = (),
        staging_threads: int = DEFAULT_STAGING_THREADS,
        staging_write: Mapping[Any, float] | Curve = DEFAULT_WRITE["memory"],
        open_latency_s: float = DEFAULT_OPEN_LATENCY,
    ) -> None:
        if network_mbps <= 0 or staging_threads < 1 or open_latency_s < 0:
            raise ValueError("PerfModel: network_mbps > 0, staging_threads >= 1, open_latency_s >= 0")
        self.pfs = Curve.of(pfs_mbps)
        self.network_mbps = float(network_mbps)
        self.tiers = tuple(tiers)
        self.staging_threads = int(staging_threads)
        self.staging_write = Curve.of(staging_write)
        self.open_latency_s = float(open_latency_s)

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> PerfModel:
        """From ``Config.to_dict()``: the ``model`` section, ``tiers`` and ``prefetch.threads``."""
        model = config.get("model", {})
        tiers = []
        for i, t in enumerate(config.get("tiers", [])):
            kind = t.get("kind", "memory")
            read = t.get("read_mbps") or model.get(f"{kind}_read_mbps") or DEFAULT_READ[kind]
            write = t.get("write_mbps") or model.get(f"{kind}_write_mbps") or DEFAULT_WRITE[kind]
            threads = int(t.get("threads", DEFAULT_TIER_THREADS))
            tiers.append(TierPerf(f"{i}:{kind}", Curve.of(read), Curve.of(write), threads))
        return cls(
            pfs_mbps=model.get("pfs_mbps") or DEFAULT_PFS,
            network_mbps=float(model.get("network_mbps", DEFAULT_NETWORK)),
            tiers=tiers,
            staging_threads=int(config.get("prefetch", {}).get("threads", DEFAULT_STAGING_THREADS)),
            staging_write=model.get("memory_write_mbps") or DEFAULT_WRITE["memory"],
            open_latency_s=float(model.get("open_latency_s", DEFAULT_OPEN_LATENCY)),
        )

    # ------------------------------------------------------------------ rates (MB/s per stream)

    def local_rate(self, tier: int) -> float:
        return self.tiers[tier].per_thread_read

    def peer_rate(self, tier: int) -> float:
        return min(self.network_mbps, self.tiers[tier].per_thread_read)

    def pfs_rate(self, readers: int) -> float:
        gamma = max(1, int(readers))
        return self.pfs(gamma) / gamma

    # ------------------------------------------------------------------ single reads

    def fetch_seconds(self, size: float, source: int, tier: int = -1, readers: int = 1) -> float:
        """Time to fetch ``size`` bytes from one source (tier: the local or remote tier)."""
        mb = size / MB
        if source == SOURCE_LOCAL:
            return mb / self.local_rate(tier)
        if source == SOURCE_PEER:
            return mb / self.peer_rate(tier)
        if source == SOURCE_PFS:
            return mb / self.pfs_rate(readers) + self.open_latency_s
        raise ValueError(f"source: expected 0 (local), 1 (peer) or 2 (pfs), got {source}")

    def write_seconds(self, size: float) -> float:
        """Writing into the staging buffer: s / (w_0(p_0) / p_0)."""
        p0 = self.staging_threads
        return size / MB / (self.staging_write(p0) / p0)

    # ------------------------------------------------------------------ many reads at once

    def choose(
        self, sizes: npt.ArrayLike, local_tier: npt.ArrayLike, remote_tier: npt.ArrayLike, readers: int
    ) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.float64]]:
        """Fastest source and its fetch seconds per read.

        ``local_tier``: the tier holding the file on this node, -1 none; ``remote_tier``: the
        fastest tier of another node holding it, -1 none; ``readers``: gamma for PFS reads.
        """
        s = np.asarray(sizes, dtype=np.float64) / MB
        lt = np.asarray(local_tier, dtype=np.int64)
        rt = np.asarray(remote_tier, dtype=np.int64)
        tiers = len(self.tiers)
        # seconds per MB by tier, with a last slot (index -1) for "not held": infinitely slow
        local = np.array([1.0 / self.local_rate(j) for j in range(tiers)] + [np.inf])
        peer = np.array([1.0 / self.peer_rate(j) for j in range(tiers)] + [np.inf])
        best = s / self.pfs_rate(readers) + self.open_latency_s
        source = np.full(best.shape, SOURCE_PFS, np.uint8)
        for src, per_mb in ((SOURCE_PEER, peer.take(rt)), (SOURCE_LOCAL, local.take(lt))):
            t = s * per_mb
            better = t <= best  # ties go to the nearer source; 0 B x inf is nan: never better
            source[better] = src
            np.fmin(best, t, out=best)
        return source, best

    def source_table(self, readers: int) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]]:
        """:meth:`choose` as a lookup table, for classifying millions of reads cheaply.

        Index ``(local_tier + 1) * (tiers + 1) + (remote_tier + 1)``; the table gives the category
        (local tier j: j, peer tier j: tiers + j, PFS: 2 * tiers) and the size in bytes above
        which the PFS is faster after all (inf: never).  Only the PFS's open latency makes the
        choice depend on the size: both other fetch times are proportional to it.
        """
        tiers = len(self.tiers)
        pfs = self.pfs_rate(readers)
        cats = np.full((tiers + 1) * (tiers + 1), 2 * tiers, np.int64)
        above = np.full(cats.shape, np.inf)
        for lt in range(-1, tiers):
            for rt in range(-1, tiers):
                i = (lt + 1) * (tiers + 1) + (rt + 1)
                options = []  # (rate, category); local listed first wins ties, like choose()
                if lt >= 0:
                    options.append((self.local_rate(lt), lt))
                if rt >= 0:
                    options.append((self.peer_rate(rt), tiers + rt))
                if not options:
                    above[i] = -1.0  # nothing held: the PFS for every size
                    continue
                rate, cat = max(options, key=lambda o: o[0])
                cats[i] = cat
                if pfs > rate:  # s/pfs + L < s/rate  <=>  s > L / (1/rate - 1/pfs)
                    above[i] = self.open_latency_s / (1.0 / rate - 1.0 / pfs) * MB
        return cats, above

    def best_remote_tier(self, tiers_held: npt.ArrayLike) -> int:
        """The fastest tier to read from among a peer's tiers (index; -1 for none)."""
        held = [int(j) for j in np.asarray(tiers_held).ravel() if j >= 0]
        return max(held, key=self.peer_rate, default=-1)

    def epoch_seconds(
        self,
        sizes: npt.ArrayLike,
        local_tier: npt.ArrayLike,
        remote_tier: npt.ArrayLike,
        readers: int,
        reads: npt.ArrayLike | None = None,
    ) -> float:
        """Predicted I/O time of a node's stream: sum of (fetch + staging write) over p_0 threads.

        One entry per read, or per file with ``reads`` giving how many times it is read.
        """
        s = np.asarray(sizes, dtype=np.float64)
        _, fetch = self.choose(s, local_tier, remote_tier, readers)
        per_read = fetch + s / MB / (self.staging_write(self.staging_threads) / self.staging_threads)
        weight = np.ones_like(s) if reads is None else np.asarray(reads, dtype=np.float64)
        return float((per_read * weight).sum()) / self.staging_threads

    def tier_order(self) -> list[int]:
        """Tier indices from the fastest local read to the slowest (config order is a promise)."""
        return sorted(range(len(self.tiers)), key=lambda j: -self.local_rate(j))
