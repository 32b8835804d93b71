"""Tier assignment and ownership: hard budgets, the frequency rule, spread coverage, owners, fill order."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from placement.assign import (
    assign,
    earliest_reader,
    fill,
    place_in_tiers,
    primary_owners,
    priority_order,
    spread_covers,
)

NEVER = np.iinfo(np.int32).max


def random_job(rng: np.random.Generator, nodes: int, m: int, epochs: int) -> tuple[np.ndarray, np.ndarray]:
    """Counts and first uses as a real job makes them: each epoch every object goes to one node."""
    owner_per_epoch = rng.integers(0, nodes, (epochs, m))
    counts = np.zeros((nodes, m), np.uint8)
    first = np.full((nodes, m), NEVER, np.int32)
    for e in range(epochs):
        pos = e * m + rng.permutation(m)
        for k in range(nodes):
            sel = owner_per_epoch[e] == k
            counts[k, sel] += 1
            first[k, sel] = np.minimum(first[k, sel], pos[sel])
    return counts, first


jobs = st.builds(
    lambda seed, nodes, m, epochs, tiers, fraction, spread: (seed, nodes, m, epochs, tiers, fraction, spread),
    st.integers(0, 2**32 - 1),
    st.integers(1, 6),
    st.integers(1, 300),
    st.integers(1, 8),
    st.integers(0, 3),
    st.floats(0.0, 1.5),
    st.booleans(),
)


Job = tuple[int, int, int, int, int, float, bool]
Arrays = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]


def make(seed: int, nodes: int, m: int, epochs: int, tiers: int, fraction: float) -> Arrays:
    rng = np.random.default_rng(seed)
    counts, first = random_job(rng, nodes, m, epochs)
    sizes = rng.integers(0, 5000, m).astype(np.int64)
    cacheable = rng.random(m) > 0.05
    total = int(sizes.sum())
    budgets = rng.integers(0, max(1, int(total * fraction / max(tiers, 1) / max(nodes, 1) * 2) + 1), tiers)
    return counts, first, sizes, cacheable, budgets.astype(np.int64)


@settings(max_examples=30, deadline=None)
@given(jobs)
def test_threads_give_the_same_assignment(job: Job) -> None:
    """Per-node rows and per-object column ranges in threads change nothing (m may be < threads)."""
    seed, nodes, m, epochs, tiers, fraction, spread = job
    arrays = make(seed, nodes, m, epochs, tiers, fraction)
    one = assign(*arrays, spread=spread)
    with ThreadPoolExecutor(max_workers=3) as pool:
        three = assign(*arrays, spread=spread, pool=pool, width=3)
    for name in ("tier_of", "owner", "fill_obj", "fill_due", "fill_off", "tier_bytes", "tier_files"):
        np.testing.assert_array_equal(getattr(three, name), getattr(one, name), err_msg=name)


@settings(max_examples=150, deadline=None)
@given(jobs)
def test_budgets_are_never_exceeded_and_only_read_cacheable_objects_are_held(job: Job) -> None:
    seed, nodes, m, epochs, tiers, fraction, spread = job
    counts, first, sizes, cacheable, budgets = make(seed, nodes, m, epochs, tiers, fraction)
    a = assign(counts, first, sizes, cacheable, budgets, spread=spread)
    for k in range(nodes):
        for j in range(tiers):
            on_j = a.tier_of[k] == j
            assert int(sizes[on_j].sum()) <= int(budgets[j])
            assert int(a.tier_bytes[k, j]) == int(sizes[on_j].sum())
            assert int(a.tier_files[k, j]) == int(on_j.sum())
    held = (a.tier_of >= 0).any(axis=0)
    assert not (held & ~cacheable).any()
    assert not (held & (counts.max(axis=0) == 0)).any()
    if not spread:  # frequency fill: a node keeps only what it reads itself
        assert not ((a.tier_of >= 0) & (counts == 0)).any()


@settings(max_examples=150, deadline=None)
@given(jobs)
def test_spread_gives_every_read_file_a_holder_when_capacity_allows(job: Job) -> None:
    seed, nodes, m, epochs, tiers, fraction, _ = job
    counts, first, sizes, cacheable, budgets = make(seed, nodes, m, epochs, max(tiers, 1), fraction * 3)
    read = cacheable & (counts.max(axis=0) > 0)
    a = assign(counts, first, sizes, cacheable, budgets, spread=True)
    if spread_covers(sizes, read, budgets):
        assert (a.owner[read] >= 0).all()
        assert ((a.tier_of >= 0).any(axis=0) == read).all()


def test_spread_covers_what_frequency_fill_leaves_on_the_pfs() -> None:
    """Room for 1/N of the data per node: frequency fill duplicates, spread distributes (NoPFS 5.1)."""
    rng = np.random.default_rng(7)
    nodes, m = 8, 4000
    counts, first = random_job(rng, nodes, m, 40)
    sizes = np.full(m, 1000, np.int64)
    cacheable = np.ones(m, np.bool_)
    budget = [m * 1000 // nodes + 4000]  # one node's share plus the fragmentation reserve
    plain = assign(counts, first, sizes, cacheable, budget, spread=False)
    spread = assign(counts, first, sizes, cacheable, budget, spread=True)
    assert spread_covers(sizes, cacheable, [budget] * nodes)
    assert (spread.owner >= 0).all()
    plain_cover = (plain.owner >= 0).mean()
    assert plain_cover < 0.8  # about 1 - (1 - 1/N)^N of the files, the rest read from the PFS every epoch


@settings(max_examples=100, deadline=None)
@given(jobs)
def test_owner_is_the_holder_that_reads_first(job: Job) -> None:
    seed, nodes, m, epochs, tiers, fraction, spread = job
    counts, first, sizes, cacheable, budgets = make(seed, nodes, m, epochs, tiers, fraction)
    a = assign(counts, first, sizes, cacheable, budgets, spread=spread)
    held = a.tier_of >= 0
    for f in range(m):
        holders = np.flatnonzero(held[:, f])
        if not holders.size:
            assert a.owner[f] == -1
            continue
        key = [(int(first[k, f]), int(k)) for k in holders]
        assert a.owner[f] == min(key)[1]
    assert np.array_equal(primary_owners(a.tier_of, first), a.owner)


@settings(max_examples=100, deadline=None)
@given(jobs)
def test_fill_order_lists_each_nodes_files_by_due_position(job: Job) -> None:
    seed, nodes, m, epochs, tiers, fraction, spread = job
    counts, first, sizes, cacheable, budgets = make(seed, nodes, m, epochs, tiers, fraction)
    a = assign(counts, first, sizes, cacheable, budgets, spread=spread)
    earliest = first.min(axis=0)
    for k in range(nodes):
        objs, due = a.fill_order(k)
        assert sorted(objs.tolist()) == np.flatnonzero(a.tier_of[k] >= 0).tolist()
        assert (np.diff(due) >= 0).all()
        for f, d in zip(objs.tolist(), due.tolist(), strict=True):
            mine = int(first[k, f])
            expect = int(earliest[f]) if a.owner[f] == k or mine == NEVER else mine
            assert d == expect


def test_frequency_fill_puts_the_most_read_files_in_the_fastest_tier() -> None:
    rng = np.random.default_rng(3)
    counts, first = random_job(rng, 4, 2000, 60)
    sizes = np.full(2000, 100, np.int64)
    a = assign(counts, first, sizes, np.ones(2000, np.bool_), [20_000, 30_000], spread=False)
    for k in range(4):
        c = counts[k].astype(int)
        t0, t1, rest = c[a.tier_of[k] == 0], c[a.tier_of[k] == 1], c[(a.tier_of[k] < 0) & (c > 0)]
        assert len(t0) == 200 and len(t1) == 300
        assert t0.min() >= t1.max() and t1.min() >= rest.max()
        # ties at the boundary go to the earliest first use
        boundary = int(t0.min())
        tied_in = first[k][(a.tier_of[k] == 0) & (c == boundary)]
        tied_out = first[k][(a.tier_of[k] == 1) & (c == boundary)]
        if tied_in.size and tied_out.size:
            assert tied_in.max() < tied_out.min()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 50), max_size=60), st.integers(0, 400))
def test_fill_is_greedy_in_order_and_exhaustive(sizes_list: list[int], budget: int) -> None:
    sizes = np.array(sizes_list, np.int64)
    taken = fill(sizes, budget)
    room = budget
    for s, t in zip(sizes.tolist(), taken.tolist(), strict=True):  # the reference loop
        assert t == (s <= room)
        if t:
            room -= s
    assert int(sizes[taken].sum()) <= budget


def test_place_in_tiers_tries_a_file_in_the_next_tier_when_it_does_not_fit() -> None:
    tier = place_in_tiers(np.array([60, 50, 30, 10], np.int64), [70, 100])
    assert tier.tolist() == [0, 1, 1, 0]
    assert place_in_tiers(np.array([500], np.int64), [70, 100]).tolist() == [-1]


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(1, 500))
def test_priority_order_is_count_desc_then_first_use_then_index(seed: int, m: int) -> None:
    rng = np.random.default_rng(seed)
    count = rng.integers(0, 4, m).astype(np.uint8)
    first = rng.integers(0, 50, m).astype(np.int32)
    first[rng.random(m) < 0.1] = NEVER
    cand = np.flatnonzero(rng.random(m) < 0.7)
    expected = sorted(cand.tolist(), key=lambda f: (-int(count[f]), int(first[f]), f))
    assert priority_order(count, first, cand).tolist() == expected


def test_earliest_reader_and_bad_inputs() -> None:
    first = np.array([[5, NEVER, 3], [2, NEVER, 3]], np.int32)
    earliest, reader = earliest_reader(first)
    assert earliest.tolist() == [2, NEVER, 3] and reader.tolist() == [1, -1, 0]
    with pytest.raises(ValueError, match="disagree"):
        assign(np.zeros((2, 3), np.uint8), first[:, :2], np.zeros(3, np.int64), np.ones(3, bool), [1], spread=True)
    with pytest.raises(ValueError, match="non-negative"):
        assign(np.zeros((2, 3), np.uint8), first, np.zeros(3, np.int64), np.ones(3, bool), [-1], spread=True)
