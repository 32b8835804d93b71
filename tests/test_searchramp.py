"""The seed search's ramped chunks: the same candidates in the same order, a common seed answered
after its first small chunk instead of a whole 65,536-value one (counted, not timed)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from torch.utils.data import DistributedSampler

from placement import discovery as dv
from placement import seedsearch as ss
from placement.searchramp import FIRST, Ramped
from placement.streams import JobShape


def test_the_same_values_in_the_same_order_in_growing_chunks() -> None:
    plan = ss.Candidates(first=[42, 7, 3], ranges=[(0, 5000), (100_000, 100_300)])
    ramped = Ramped(plan, first=100)
    assert len(ramped) == len(plan)
    sizes = [c.shape[0] for c in ramped.chunks(1024)]
    assert sizes[:3] == [100, 200, 400] and max(sizes) == 1024 and sizes.count(1024) >= 3
    assert np.array_equal(np.concatenate(list(ramped.chunks(1024))), np.concatenate(list(plan.chunks(1024))))


def test_a_first_chunk_larger_than_the_search_asks_is_cut_to_it() -> None:
    plan = ss.Candidates(ranges=[(0, 10)])
    assert [c.shape[0] for c in Ramped(plan, first=64).chunks(4)] == [4, 4, 2]
    with pytest.raises(ValueError, match="first chunk"):
        Ramped(plan, first=0)


def test_seed_42_is_found_after_the_first_small_chunk_with_the_same_answer() -> None:
    """Two batches per local rank of a 503-file job, seed 42: found after FIRST candidates, not 65,536."""
    n, shape = 503, JobShape(2, 2, 8, False)
    data: Any = range(n)  # DistributedSampler needs only len()
    perms: list[list[int]] = [list(DistributedSampler(data, num_replicas=2, rank=r, seed=42)) for r in (0, 1)]
    opens = [i for b in range(2) for p in perms for i in p[8 * b : 8 * (b + 1)]]
    plan, _likely = dv.candidates(1 << 24, 1000)
    answers = []
    for candidates in (plan, Ramped(plan)):
        search = ss.SeedSearch(n, opens, shape, kinds=("distributed",), candidates=candidates)
        result = search.run()
        assert result.match is not None
        answers.append((result.match.value, result.match.false_match_chance, result.candidates_planned))
        tried = result.candidates_tried
    assert answers[0] == answers[1] and answers[0][0] == 42
    assert tried == FIRST
