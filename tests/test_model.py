"""The NoPFS performance model: interpolation, fetch-time formulas, source choice, epoch prediction."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fusefs.config import load
from placement.model import (
    MB,
    SOURCE_LOCAL,
    SOURCE_PEER,
    SOURCE_PFS,
    Curve,
    PerfModel,
    TierPerf,
)


def two_tier_model(pfs: dict[int, float] | None = None, network: float = 24000.0) -> PerfModel:
    ram = TierPerf("ram", Curve.of({1: 10000, 4: 40000}), Curve.of({1: 5000}), threads=4)
    ssd = TierPerf("ssd", Curve.of({1: 1000, 2: 2000, 4: 4000}), Curve.of({1: 800}), threads=2)
    return PerfModel(pfs or {1: 330, 8: 2870}, network, [ram, ssd], staging_threads=4, open_latency_s=0.003)


def test_curve_is_linear_between_points_and_flat_outside() -> None:
    c = Curve.of({1: 330.0, 2: 730.0, 4: 1540.0, 8: 2870.0})
    assert c(1) == 330.0 and c(8) == 2870.0
    assert c(3) == pytest.approx((730.0 + 1540.0) / 2)
    assert c(6) == pytest.approx(1540.0 + (2870.0 - 1540.0) / 2)
    assert c(0.5) == 330.0 and c(64) == 2870.0
    with pytest.raises(ValueError, match="positive"):
        Curve.of({1: 0.0})


def test_fetch_times_follow_the_paper() -> None:
    m = two_tier_model()
    s = 2 * MB
    assert m.fetch_seconds(s, SOURCE_LOCAL, tier=0) == pytest.approx(2 / (40000 / 4))
    assert m.fetch_seconds(s, SOURCE_LOCAL, tier=1) == pytest.approx(2 / (2000 / 2))
    assert m.fetch_seconds(s, SOURCE_PEER, tier=0) == pytest.approx(2 / min(24000, 40000 / 4))
    slow_net = two_tier_model(network=500.0)
    assert slow_net.fetch_seconds(s, SOURCE_PEER, tier=0) == pytest.approx(2 / 500)
    gamma = 6  # between the table's 1 and 8 readers: t = 330 + 5/7 * (2870 - 330)
    t = 330 + 5 / 7 * (2870 - 330)
    assert m.fetch_seconds(s, SOURCE_PFS, readers=gamma) == pytest.approx(2 / (t / gamma) + 0.003)
    assert m.write_seconds(s) == pytest.approx(2 / (20000 / 4))  # default staging w_0: memory writes


def test_from_config_takes_kind_defaults_and_per_tier_overrides() -> None:
    cfg = load(
        None,
        {
            "tiers": "[{kind: memory, bytes: 1G, threads: 8}, {kind: directory, path: /x, bytes: 1G,"
            " threads: 2, read_mbps: {1: 300, 2: 500}}]",
            "model.network_mbps": "1000",
            "model.pfs_mbps": "{1: 100, 4: 200}",
            "prefetch.threads": "2",
        },
    ).to_dict()
    m = PerfModel.from_config(cfg)
    assert m.local_rate(0) == pytest.approx(85000 / 8)  # memory defaults, 8 threads
    assert m.local_rate(1) == pytest.approx(500 / 2)  # the tier's own table
    assert m.peer_rate(0) == 1000  # capped by the network
    assert m.pfs_rate(4) == pytest.approx(50)
    assert m.staging_threads == 2


def test_choose_picks_the_fastest_source_and_prefers_nearer_on_ties() -> None:
    m = two_tier_model()
    sizes = np.full(5, MB)
    local = np.array([0, 1, -1, -1, 1])
    remote = np.array([-1, 0, 1, -1, 1])
    source, secs = m.choose(sizes, local, remote, readers=8)
    assert source.tolist() == [SOURCE_LOCAL, SOURCE_PEER, SOURCE_PEER, SOURCE_PFS, SOURCE_LOCAL]
    assert secs[3] == pytest.approx(1 / (2870 / 8) + 0.003)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(1, 16), st.floats(50, 50000))
def test_source_table_agrees_with_choose(seed: int, readers: int, pfs_mbps: float) -> None:
    """The summary's lookup table must classify every read as choose() does (incl. size thresholds)."""
    m = two_tier_model(
        pfs={1: pfs_mbps, 8: pfs_mbps * 8}, network=float(np.random.default_rng(seed).integers(100, 5000))
    )
    rng = np.random.default_rng(seed)
    n = 400
    sizes = rng.integers(0, 20 * MB, n).astype(np.float64)
    local = rng.integers(-1, 2, n)
    remote = rng.integers(-1, 2, n)
    source, _ = m.choose(sizes, local, remote, readers)
    table, above = m.source_table(readers)
    combo = (local + 1) * 3 + (remote + 1)
    cat = table[combo].copy()
    cat[sizes > above[combo]] = 4
    expected = np.where(source == SOURCE_LOCAL, local, np.where(source == SOURCE_PEER, 2 + remote, 4))
    assert cat.tolist() == expected.tolist()


def test_epoch_seconds_sums_fetch_and_staging_write_over_p0_threads() -> None:
    m = two_tier_model()
    sizes = np.array([MB, 3 * MB])
    local, remote = np.array([0, -1]), np.array([-1, -1])
    fetch = 1 / (40000 / 4) + 3 / (2870 / 8) + 0.003
    write = 4 / (20000 / 4)
    assert m.epoch_seconds(sizes, local, remote, readers=8) == pytest.approx((fetch + write) / 4)
    twice = m.epoch_seconds(sizes, local, remote, readers=8, reads=[2, 2])
    assert twice == pytest.approx(2 * (fetch + write) / 4)
