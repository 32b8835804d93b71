"""placement.seedsearch finds the seed of real torch samplers from a node's first opens, and only then.

Every order comes from real torch 2.13: DistributedSampler with set_epoch, and DataLoaders with a
seeded generator (one of them with 2 real worker processes, whose opens are recorded as they
happen).  The vectorised mt19937 is checked against numpy's legacy seeding and torch's generator,
the permutation prefix against torch.randperm, the tail chance against exact binomial sums.  Where
the opens are simulated, it is only their order: DataLoader workers (batch i to worker i % W, each
opening its batches in turn, the workers racing) and local ranks interleaving.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from indices import Indices
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from placement import seedsearch as ss
from placement.mt19937 import mt19937_outputs, mt19937_state
from placement.prob import hypergeom_sf
from placement.randperm import THRESHOLD_64BIT
from placement.streams import JobShape

MASK = 0xFFFFFFFF
BATCH = 8
WRONG_SEED = 0x9E3779B97F4A7C15  # low 32 bits 0x7F4A7C15 = 2135587861: in no plan used here
SMALL_PLAN = ss.Candidates(first=ss.COMMON_SEEDS, ranges=[(0, 1 << 18)])


# ---- real torch orders and the way a node opens them ---------------------------------------------


def distributed_stream(n: int, world: int, rank: int, seed: int, epoch: int, drop_last: bool = False) -> list[int]:
    s: DistributedSampler[int] = DistributedSampler(
        Indices(n), num_replicas=world, rank=rank, shuffle=True, seed=seed, drop_last=drop_last
    )
    s.set_epoch(epoch)
    return [int(i) for i in s]


def loader_stream(n: int, seed: int, batches: int) -> list[int]:
    """The first batches of a real DataLoader(shuffle=True, generator seeded), no workers."""
    g = torch.Generator()
    g.manual_seed(seed)
    loader = DataLoader(Indices(n), batch_size=BATCH, shuffle=True, generator=g)
    out: list[int] = []
    for i, batch in enumerate(loader):
        if i == batches:
            break
        out += [int(x) for x in batch]
    return out


def race(queues: list[list[int]], rng: np.random.Generator) -> list[int]:
    """Concurrent consumers, each in its own order: at every open a random one moves on."""
    pos = [0] * len(queues)
    out: list[int] = []
    while True:
        live = [w for w in range(len(queues)) if pos[w] < len(queues[w])]
        if not live:
            return out
        w = live[int(rng.integers(len(live)))]
        out.append(queues[w][pos[w]])
        pos[w] += 1


def worker_order(stream: list[int], workers: int, rng: np.random.Generator) -> list[int]:
    """A rank's opens when DataLoader worker w fetches batches w, w + W, ... and the workers race."""
    batches = [stream[i : i + BATCH] for i in range(0, len(stream), BATCH)]
    return race([[f for b in batches[w::workers] for f in b] for w in range(workers)], rng)


def node_opens(rank_streams: list[list[int]], workers: int, seed: int, batches: int = 2) -> list[int]:
    """The node's first ``batches`` batches per local rank: each rank's workers race, ranks interleave."""
    rng = np.random.default_rng(seed)
    per_rank = [worker_order(s[: 8 * BATCH], workers, rng) for s in rank_streams]
    return race(per_rank, rng)[: batches * BATCH * len(rank_streams)]


# ---- the building blocks -----------------------------------------------------------------------


def torch_draws(seed: int, k: int) -> np.ndarray:
    """torch's first k 32-bit draws: a full-range int64 random_ takes two per value, high word first."""
    g = torch.Generator()
    g.manual_seed(seed)
    r64 = torch.empty((k + 1) // 2, dtype=torch.int64).random_(-(2**63), None, generator=g).numpy().view(np.uint64)
    pairs = np.stack([r64 >> np.uint64(32), r64 & np.uint64(MASK)], axis=1).reshape(-1)
    return pairs[:k].astype(np.uint32)


def test_mt19937_matches_numpy_legacy_seeding_and_torch() -> None:
    rng = np.random.default_rng(1)
    seeds = np.concatenate([[0, 1, 5, 42, 3407, MASK, 2**31], rng.integers(0, 2**32, 300)]).astype(np.uint32)
    state = mt19937_state(seeds)
    for j in (0, 3, 299):
        legacy = np.random.RandomState(int(seeds[j])).get_state(legacy=False)["state"]["key"]
        assert (state[:, j] == legacy).all()
    for k in (1, 16, 227, 228, 624, 625, 1500):
        out = mt19937_outputs(seeds, k)
        assert out.shape == (k, seeds.size)
        for j in range(0, seeds.size, 23):
            bits = np.random.MT19937()
            bits._legacy_seeding(int(seeds[j]))
            assert (out[:, j] == bits.random_raw(k).astype(np.uint32)).all(), (k, int(seeds[j]))
            assert (out[:, j] == torch_draws(int(seeds[j]), k)).all(), (k, int(seeds[j]))


@pytest.mark.parametrize("n", [2, 3, 10, 500, 4099, 100_003])
def test_randperm_prefix_matches_torch(n: int) -> None:
    for seed in (0, 7, 42, 2**32 + 5, 123456789):
        g = torch.Generator()
        g.manual_seed(seed)
        perm = torch.randperm(n, generator=g).numpy()
        draws = torch_draws(seed, n)
        for length in {0, 1, n // 3, n - 1, n}:
            assert (ss.randperm_prefix(draws, n, length) == perm[:length]).all(), (n, seed, length)


def test_hypergeom_tail_is_the_exact_sum() -> None:
    def exact(h: int, pop: int, k: int, d: int) -> float:
        return sum(math.comb(k, x) * math.comb(pop - k, d - x) for x in range(h, min(k, d) + 1)) / math.comb(pop, d)

    for h, pop, k, d in [
        (3, 500, 16, 16),
        (16, 500, 16, 64),
        (1, 10, 3, 3),
        (0, 10, 3, 3),
        (5, 1000, 50, 60),
        (40, 20_000, 500, 1000),
        (10, 100, 90, 20),
        (4, 10, 3, 3),
    ]:
        assert hypergeom_sf(h, pop, k, d) == pytest.approx(exact(h, pop, k, d), rel=1e-8, abs=1e-300)


def test_calendar_dates_and_the_default_plan() -> None:
    dates = ss.calendar_dates()
    assert dates.size == (np.datetime64("2100-01-01") - np.datetime64("1970-01-01")).astype(int)
    assert {19700101, 20240229, 20991231} <= set(dates.tolist()) and 20230229 not in set(dates.tolist())
    plan = ss.default_candidates()
    small = ss.default_candidates(limit=1 << 20)
    values = np.concatenate(list(small.chunks(1 << 16)))
    # likeliest first: the common seeds in their listed order, then 0..65535 (less those already tried)
    common = list(dict.fromkeys(ss.seed_value(s) for s in ss.COMMON_SEEDS))
    listed = set(common)
    rest = [v for v in range(1 << 16) if v not in listed]
    assert values[: len(common) + len(rest)].tolist() == common + rest
    # every date (and date + 999, a date seed 999 epochs on) lies in the plan, every value once
    ordered = np.sort(values)
    assert values.size == len(small) and (np.diff(ordered.astype(np.int64)) > 0).all()

    def inside(x: np.ndarray) -> bool:
        at = np.minimum(np.searchsorted(ordered, x), ordered.size - 1)
        return bool((ordered[at] == x).all())

    assert inside(dates) and inside(dates.astype(np.int64) + 999)
    assert len(plan) == (1 << 24) + int((values >= 1 << 24).sum())  # the same beyond 2**24


def test_candidates_are_tried_once_in_order() -> None:
    plan = ss.Candidates(first=[7, 2**32 + 3, -1, 7], ranges=[(0, 10), (5, 20), (MASK, MASK + 1)])
    assert plan.first.tolist() == [7, 3, MASK]
    values = np.concatenate(list(plan.chunks(4))).tolist()
    assert values == [7, 3, MASK, 0, 1, 2, 4, 5, 6, 8, 9, *range(10, 20)]
    assert len(plan) == len(values)
    with pytest.raises(ValueError, match="range"):
        ss.Candidates(ranges=[(5, 2**32 + 1)])


# ---- finding seeds -----------------------------------------------------------------------------

# (n, world, ranks per node, node, seed, epoch, sampler drop_last, rank order)
DISTRIBUTED = [
    (500, 1, 1, 0, 0, 0, False, "contiguous"),
    (1000, 1, 1, 0, 1, 0, False, "contiguous"),
    (500, 2, 1, 1, 42, 0, False, "contiguous"),
    (1000, 3, 1, 2, 3407, 0, True, "contiguous"),
    (2000, 4, 2, 1, 20240229, 0, False, "contiguous"),
    (500, 2, 2, 0, 2**32 + 5, 0, False, "contiguous"),
    (1000, 2, 1, 1, 42, 3, False, "contiguous"),  # resumed in epoch 3: seed + epoch = 45
    (3000, 4, 2, 1, 1234, 0, True, "round_robin"),  # node 1 hosts ranks 1 and 3
]


@pytest.mark.parametrize(("n", "world", "per_node", "node", "seed", "epoch", "drop_last", "order"), DISTRIBUTED)
def test_finds_distributed_sampler_seed_plus_epoch(
    n: int, world: int, per_node: int, node: int, seed: int, epoch: int, drop_last: bool, order: str
) -> None:
    shape = JobShape(world, per_node, BATCH, False, rank_order=order)
    streams = [distributed_stream(n, world, r, seed, epoch, drop_last) for r in shape.ranks_of_node(node)]
    opens = node_opens(streams, workers=2, seed=seed + epoch)
    result = ss.SeedSearch(n, opens, shape).run()
    assert result.status == "found", result.reason
    m = result.match
    assert m is not None
    assert (m.value, m.kind, m.identifies, m.node) == ((seed + epoch) & MASK, "distributed", "seed+epoch", node)
    assert m.false_match_chance < ss.FALSE_LOCK and result.candidates_tried <= result.candidates_planned


def test_finds_seed_with_eight_workers_racing_on_small_batches() -> None:
    """8 workers and batches of 8: a rank's first 16 opens are 2 files from each of 8 batches, so a
    check of its first entries alone would miss; the batch heads and the deep count do not."""
    n = 20_000
    shape = JobShape(4, 2, BATCH, False)
    plan = ss.Candidates(ranges=[(0, 1 << 16)])
    for seed in (11, 4242, 60_000):
        streams = [distributed_stream(n, 4, r, seed, 0) for r in shape.ranks_of_node(1)]
        result = ss.SeedSearch(n, node_opens(streams, workers=8, seed=seed), shape, candidates=plan).run()
        assert result.match is not None and (result.match.value, result.match.node) == (seed, 1), result.reason


def test_finds_the_top_of_a_range() -> None:
    """2**24 - 1, the last value of the default range, from a plan of that range's last 65536 values
    (the whole default plan runs in the slow tests)."""
    n, seed = 5000, 2**24 - 1
    shape = JobShape(2, 1, BATCH, False)
    opens = node_opens([distributed_stream(n, 2, 1, seed, 0)], workers=2, seed=1)
    plan = ss.Candidates(ranges=[((1 << 24) - (1 << 16), 1 << 24)])
    result = ss.SeedSearch(n, opens, shape, candidates=plan).run()
    assert result.match is not None and (result.match.value, result.match.node) == (seed, 1)
    assert result.candidates_tried == len(plan) == result.candidates_planned


class RecordingIndices(Dataset[int]):
    """Items are their indices; each fetch appends the index to a file, as a worker opens a file."""

    def __init__(self, n: int, log: Path) -> None:
        self.n, self.log = n, str(log)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        fd = os.open(self.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, f"{i}\n".encode())  # one small O_APPEND write: atomic across workers
        finally:
            os.close(fd)
        return i


@pytest.mark.parametrize("persistent", [False, True])
def test_finds_seeded_dataloader_with_two_real_workers(tmp_path: Path, persistent: bool) -> None:
    n, seed = 500, 3407 if persistent else 20240229
    log = tmp_path / "opens"
    g = torch.Generator()
    g.manual_seed(seed)
    loader = DataLoader(
        RecordingIndices(n, log),
        batch_size=BATCH,
        shuffle=True,
        generator=g,
        num_workers=2,
        persistent_workers=persistent,
    )
    for i, _ in enumerate(loader):
        if i == 1:
            break
    opens = [int(x) for x in log.read_text().split()][: 2 * BATCH]
    result = ss.SeedSearch(n, opens, JobShape(1, 1, BATCH, False)).run()
    assert result.match is not None, result.reason
    assert (result.match.value, result.match.kind, result.match.identifies) == (seed, "random", "seed")


def test_finds_seeded_dataloader_on_two_local_ranks() -> None:
    """Without a DistributedSampler every rank reads the same order: the node opens it twice."""
    n, seed = 2000, 42
    shape = JobShape(4, 2, BATCH, False)
    order = loader_stream(n, seed, batches=8)
    opens = node_opens([order, order], workers=2, seed=3)
    result = ss.SeedSearch(n, opens, shape).run()
    assert result.match is not None, result.reason
    assert (result.match.value, result.match.kind, result.match.node) == (seed, "random", None)


def test_large_dataset_finds_seed_from_the_first_opens() -> None:
    """ImageNet-sized: 8 ranks, 4 per node, node 1, 2 batches of 8 per rank already settle it."""
    n = 1_281_167
    shape = JobShape(8, 4, BATCH, False)
    streams = [distributed_stream(n, 8, r, 31337, 2)[: 8 * BATCH] for r in shape.ranks_of_node(1)]
    result = ss.SeedSearch(n, node_opens(streams, workers=2, seed=4), shape).run()
    assert result.match is not None and (result.match.value, result.match.node) == (31339, 1)


# ---- no false locks, and honest accounting -------------------------------------------------------


@pytest.mark.parametrize("kind", ["distributed", "random"])
def test_seed_outside_the_plan_is_not_found(kind: str) -> None:
    n = 500
    shape = JobShape(2, 1, BATCH, False)
    assert WRONG_SEED & MASK not in np.concatenate(list(SMALL_PLAN.chunks(1 << 16)))
    if kind == "distributed":
        stream = distributed_stream(n, 2, 1, WRONG_SEED, 0)
    else:
        stream = loader_stream(n, WRONG_SEED, batches=8)
    search = ss.SeedSearch(n, node_opens([stream], workers=2, seed=5), shape, candidates=SMALL_PLAN)
    result = search.run()
    assert result.status == "not_found" and result.match is None, result.reason
    assert result.candidates_tried == result.candidates_planned == len(SMALL_PLAN)
    assert result.comparisons == len(SMALL_PLAN) * len(search.hypotheses)
    assert result.best_chance >= ss.FALSE_LOCK
    # the true value itself would have been accepted: the test could fail
    true = search.evaluate(WRONG_SEED)
    assert true is not None and true.false_match_chance < ss.FALSE_LOCK and true.kind == kind


def test_false_match_chance_is_the_tail_times_the_comparisons() -> None:
    n, seed = 500, 42
    shape = JobShape(2, 1, BATCH, False)
    opens = node_opens([distributed_stream(n, 2, 0, seed, 0)], workers=2, seed=6)
    plan = ss.Candidates(ranges=[(0, 1000)])
    search = ss.SeedSearch(n, opens, shape, candidates=plan)
    m = search.evaluate(seed)
    assert m is not None
    tail = hypergeom_sf(m.hits, n, m.opens, m.predicted)
    assert m.false_match_chance == pytest.approx(tail * 1000 * len(search.hypotheses))
    wrong = search.evaluate(seed + 1)
    assert wrong is not None and wrong.false_match_chance >= ss.FALSE_LOCK


def test_too_few_opens_and_unsearchable_sizes() -> None:
    shape = JobShape(1, 1, BATCH, False)
    few = ss.SeedSearch(500, [3, 17], shape).run()
    assert few.status == "too_few_opens" and few.match is None and "feed more opens" in few.reason
    assert ss.SeedSearch(500, [], shape).run().status == "too_few_opens"
    big = ss.SeedSearch(THRESHOLD_64BIT, [0, 1, 2], shape).run()
    assert big.status == "not_searchable" and "64-bit" in big.reason
    assert ss.SeedSearch(1, [0], shape).run().status == "not_searchable"
    with pytest.raises(ValueError, match="outside the dataset"):
        ss.SeedSearch(500, [3, 500], shape)


def test_steps_report_progress_and_stop_when_dropped() -> None:
    n = 1000
    shape = JobShape(1, 1, BATCH, False)
    opens = node_opens([distributed_stream(n, 1, 0, 200_000, 0)], workers=2, seed=7)
    plan = ss.Candidates(ranges=[(0, 300_000)])
    search = ss.SeedSearch(n, opens, shape, candidates=plan, chunk=1 << 15)
    tried = [p.tried for p in search.steps()]
    assert tried == sorted(tried) and len(tried) > 3 and tried[-1] < 300_000
    steps = search.steps()
    first = next(steps)
    assert first.result is None and first.tried == 1 << 15 and first.planned == 300_000
    steps.close()  # cancelling is just dropping the generator


# ---- slow: many seeds, and the default plan in full -----------------------------------------------


@pytest.mark.slow
def test_no_false_lock_over_a_thousand_random_seeds() -> None:
    """1000 random 64-bit seeds (none in the plan) on n = 500 with mixed shapes and kinds: no match.

    The plan is 0..2**15 (for time); the accounting is for that plan, so each search may accept a
    wrong candidate with chance below 1e-6, all of them together below 1e-3.
    """
    n = 500
    plan = ss.Candidates(ranges=[(0, 1 << 15)])
    rng = np.random.default_rng(2026)
    found, best = [], 1.0
    for i in range(1000):
        seed = int(rng.integers(1 << 15, 2**64, dtype=np.uint64))
        if seed & MASK < 1 << 15:
            continue
        world, per_node = [(1, 1), (2, 1), (2, 2), (3, 1)][i % 4]
        shape = JobShape(world, per_node, BATCH, False)
        if i % 5 == 4:
            order = loader_stream(n, seed, batches=8)
            streams = [order] * per_node
        else:
            node = i % shape.nodes
            streams = [distributed_stream(n, world, r, seed, 0) for r in shape.ranks_of_node(node)]
        result = ss.SeedSearch(n, node_opens(streams, workers=2, seed=i), shape, candidates=plan).run()
        best = min(best, result.best_chance)
        if result.match is not None:
            found.append((seed, result.match))
    assert not found
    print(f"closest miss over 1000 searches: false-match chance {best:.2g}")


@pytest.mark.slow
def test_default_plan_accounting_and_its_last_value() -> None:
    """The default plan in full: a seed outside it is not found after all 17,067,160 candidates
    (the chance multiplied by all of them), and 2**24 - 1, its last value, is found."""
    n = 1_281_167
    shape = JobShape(8, 4, BATCH, False)
    plan = ss.default_candidates()
    for seed, expect in ((WRONG_SEED, None), (2**24 - 1, 2**24 - 1)):
        streams = [distributed_stream(n, 8, r, seed, 0)[: 8 * BATCH] for r in shape.ranks_of_node(0)]
        search = ss.SeedSearch(n, node_opens(streams, workers=2, seed=8), shape)
        result = search.run()
        assert result.candidates_planned == len(plan) == 17_067_160
        assert result.comparisons == len(plan) * len(search.hypotheses)
        if expect is None:
            assert result.status == "not_found" and result.candidates_tried == len(plan)
        else:
            assert result.match is not None and result.match.value == expect
            assert result.candidates_tried == len(plan)
