"""The simulated machine (NoPFS 6.1's Lassen setup), the four scenarios, and how they are scaled.

Scaling.  The paper's datasets have up to 14.2 million samples; a per-sample simulation in Python
of several epochs and seven policies would take hours.  A scenario is therefore run on ``files``
samples (default 16,384; fewer if the dataset has fewer) drawn from the *same* size distribution,
and every capacity (staging buffer, RAM, SSD) is multiplied by ``scale = S_sim / S_paper`` with
``S_paper = F_paper x mean size``.  That keeps the ratios S/d_1, S/D and S/(N D) that define the
scenarios exactly, and sample sizes (so every per-sample time and every rate) unchanged.  All
times of the model are linear in bytes, so the job's time scales by the same factor: a simulated
``T`` seconds stands for about ``T / scale`` at full size (the report shows both).

The staging buffer is the exception: it is a look-ahead window, not a capacity that defines a
scenario, and scaled down with the rest it would hold a handful of samples (6 for ImageNet-22k
at 2,048 files), too few to keep p_0 threads busy: a stall that does not exist at full size.  So
it is scaled too, but never below ``min(d_0, 2 x p_0 x batch samples)`` (every staging thread
two batches ahead), a floor that the full-size 5 GB exceeds in every scenario.  Each epoch also
has fewer steps than at full size, so start-up and epoch boundaries weigh a little more.

Sizes: the paper draws them from a normal distribution N(mu, sigma); a normal with sigma close to
mu has a large negative tail, so here they are lognormal with that mean and standard deviation
(sigma = 0: all equal).  1 MB = 10**6 bytes, as in :mod:`placement.model`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from placement.model import MB, Curve, PerfModel, TierPerf
from placement.samplers import DistributedSamplerModel
from placement.streams import JobShape, Streams

GB = 1000 * MB
LASSEN_PFS = ((1, 330.0), (2, 730.0), (4, 1540.0), (8, 2870.0))


@dataclass(frozen=True)
class System:
    """One worker per node, as NoPFS 6.1 (throughputs in MB/s, capacities in GB).

    ``preprocess_mbps`` is beta, per staging thread: a staging read takes
    fetch + max(s / beta, s / (w_0(p_0) / p_0)) (NoPFS 4).  The staging buffer's write rate w_0 is
    taken equal to its read rate r_0 (the paper gives one number).  Tier write rates are not
    modelled: tiers are filled by their own threads, off the staging threads' path.
    """

    nodes: int = 4
    compute_mbps: float = 64.0
    preprocess_mbps: float = 200.0
    network_mbps: float = 24000.0
    staging_gb: float = 5.0
    ram_gb: float = 120.0
    ssd_gb: float = 900.0
    staging_threads: int = 8
    ram_threads: int = 4
    ssd_threads: int = 2
    staging_mbps: float = 111000.0
    ram_mbps: float = 85000.0
    ssd_mbps: float = 4000.0
    pfs_mbps: tuple[tuple[int, float], ...] = LASSEN_PFS

    def __post_init__(self) -> None:
        for name in ("nodes", "staging_threads", "ram_threads", "ssd_threads"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: expected at least 1, got {getattr(self, name)}")
        for name in ("compute_mbps", "preprocess_mbps", "network_mbps", "staging_mbps", "ram_mbps", "ssd_mbps"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name}: expected a positive rate, got {getattr(self, name)}")
        for name in ("staging_gb", "ram_gb", "ssd_gb"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}: expected a non-negative capacity, got {getattr(self, name)}")
        if not self.pfs_mbps or any(g < 1 or t <= 0 for g, t in self.pfs_mbps):
            raise ValueError(f"pfs_mbps: expected readers:MB/s pairs with readers >= 1, got {self.pfs_mbps!r}")

    def model(self) -> PerfModel:
        """placement's model of this machine: tier 0 is RAM, tier 1 the SSD (the staging buffer is apart).

        No per-file open latency: NoPFS's model has none, and the Lassen figures are throughputs.
        """
        tiers = [
            TierPerf("ram", Curve.of({self.ram_threads: self.ram_mbps}), Curve.of(self.ram_mbps), self.ram_threads),
            TierPerf("ssd", Curve.of({self.ssd_threads: self.ssd_mbps}), Curve.of(self.ssd_mbps), self.ssd_threads),
        ]
        return PerfModel(
            pfs_mbps=dict(self.pfs_mbps),
            network_mbps=self.network_mbps,
            tiers=tiers,
            staging_threads=self.staging_threads,
            staging_write={self.staging_threads: self.staging_mbps},
            open_latency_s=0.0,
        )


@dataclass(frozen=True)
class Scenario:
    """One of NoPFS 6.1's cases, with the dataset the paper uses for it (sizes in MB)."""

    number: int
    regime: str
    dataset: str
    files: int
    mean_mb: float
    sd_mb: float
    batch: int  # per worker

    @property
    def bytes(self) -> float:
        return self.files * self.mean_mb * MB


SCENARIOS = {
    1: Scenario(1, "S < d1", "MNIST", 50_000, 0.00076, 0.0, 32),
    2: Scenario(2, "d1 < S < D", "ImageNet-1k", 1_281_167, 0.1077, 0.1, 32),
    3: Scenario(3, "D < S < ND", "ImageNet-22k", 14_197_122, 0.1077, 0.2, 32),
    4: Scenario(4, "ND < S", "CosmoFlow", 262_144, 17.0, 0.0, 16),
}


def sample_sizes(files: int, mean_mb: float, sd_mb: float, seed: int) -> npt.NDArray[np.int64]:
    """``files`` sizes in bytes, lognormal with the given mean and standard deviation (at least 1 B)."""
    mean = mean_mb * MB
    if sd_mb <= 0:
        return np.full(files, max(1, round(mean)), np.int64)
    sigma2 = math.log1p((sd_mb / mean_mb) ** 2)
    rng = np.random.default_rng([seed, files, 0x5153])
    drawn = rng.lognormal(math.log(mean) - sigma2 / 2, math.sqrt(sigma2), files)
    return np.maximum(1, np.rint(drawn)).astype(np.int64)


@dataclass(frozen=True, eq=False)
class Setup:
    """A scenario scaled to ``files`` samples: sizes, capacities in bytes, the model, the streams.

    ``streams[k]`` is node k's whole job in read order (E epochs of the exact DistributedSampler
    stream); a read's index in it is its job position, the same on every node.
    """

    scenario: Scenario
    system: System
    epochs: int
    seed: int
    sizes: npt.NDArray[np.int64]
    scale: float
    staging_bytes: int
    tier_bytes: tuple[int, int]  # RAM, SSD per node
    model: PerfModel
    shape: JobShape
    sampler_streams: Streams
    streams: npt.NDArray[np.int64] = field(repr=False)  # (nodes, epochs * per_epoch)

    @property
    def files(self) -> int:
        return int(self.sizes.shape[0])

    @property
    def dataset_bytes(self) -> int:
        return int(self.sizes.sum())

    @property
    def per_epoch(self) -> int:
        """Reads per node and epoch."""
        return int(self.streams.shape[1]) // self.epochs

    def steps(self) -> list[tuple[int, int]]:
        """(start, stop) job positions of every training step: a batch per worker, then an allreduce."""
        b, n = self.shape.batch_size, self.per_epoch
        return [(e * n + lo, e * n + min(lo + b, n)) for e in range(self.epochs) for lo in range(0, n, b)]


def staging_bytes(system: System, scenario: Scenario, scale: float) -> int:
    """The scaled staging buffer, with its floor (see the module docstring)."""
    full = system.staging_gb * GB
    floor = 2 * system.staging_threads * scenario.batch * scenario.mean_mb * MB
    return int(max(full * scale, min(full, floor)))


def make_setup(scenario: Scenario, system: System, files: int, epochs: int, seed: int) -> Setup:
    """Scale ``scenario`` to ``min(files, F_paper)`` samples (see the module docstring)."""
    if files < system.nodes or epochs < 1:
        raise ValueError(f"need at least {system.nodes} files (one per node) and one epoch")
    n = min(files, scenario.files)
    sizes = sample_sizes(n, scenario.mean_mb, scenario.sd_mb, seed)
    scale = float(sizes.sum()) / scenario.bytes
    shape = JobShape(world_size=system.nodes, ranks_per_node=1, batch_size=scenario.batch, drop_last=False)
    sampler = DistributedSamplerModel(n, system.nodes, seed, backend="numpy")
    st = Streams(sampler, shape)
    streams = np.stack(
        [np.concatenate([st.node_stream(e, k) for e in range(epochs)]) for k in range(system.nodes)]
    ).astype(np.int64)
    return Setup(
        scenario=scenario,
        system=system,
        epochs=epochs,
        seed=seed,
        sizes=sizes,
        scale=scale,
        staging_bytes=staging_bytes(system, scenario, scale),
        tier_bytes=(int(system.ram_gb * GB * scale), int(system.ssd_gb * GB * scale)),
        model=system.model(),
        shape=shape,
        sampler_streams=st,
        streams=streams,
    )
