"""The sampler models yield exactly what real torch 2.13 samplers and DataLoaders yield.

Every expectation comes from running torch: DistributedSampler with set_epoch, and full epochs of
DataLoader(shuffle=True, generator=...) over a dataset whose items are their own indices, with 0
and 2 worker processes, persistent or not.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from indices import Indices
from torch.utils.data import DataLoader, DistributedSampler, SequentialSampler

from placement.randperm import Backend
from placement.samplers import (
    UNPREDICTABLE_RANDOM,
    DistributedSamplerModel,
    ExplicitOrderModel,
    RandomSamplerModel,
    SamplerModel,
    SequentialSamplerModel,
    make_sampler,
)

SEEDS = [0, 42, 2**32 + 5, 2**63 - 1]
REPO = Path(__file__).resolve().parents[1]


def torch_distributed(
    n: int, world: int, rank: int, seed: int, epoch: int, shuffle: bool, drop_last: bool
) -> list[int]:
    s: DistributedSampler[int] = DistributedSampler(
        Indices(n), num_replicas=world, rank=rank, shuffle=shuffle, seed=seed, drop_last=drop_last
    )
    s.set_epoch(epoch)
    return list(s)


def loader_epochs(
    n: int,
    seed: int,
    epochs: int,
    *,
    num_workers: int = 0,
    persistent: bool = False,
    batch: int = 3,
    drop_last: bool = False,
) -> list[list[int]]:
    """What each full epoch of a real seeded shuffling DataLoader yields, flattened."""
    g = torch.Generator()
    g.manual_seed(seed)
    loader = DataLoader(
        Indices(n),
        batch_size=batch,
        shuffle=True,
        generator=g,
        num_workers=num_workers,
        persistent_workers=persistent,
        drop_last=drop_last,
    )
    return [[int(i) for b in loader for i in b] for _ in range(epochs)]


@pytest.mark.parametrize("n", [1, 2, 3, 10, 1000])
@pytest.mark.parametrize("world", [1, 2, 3, 4, 7])
def test_distributed_sampler_matches_torch(n: int, world: int) -> None:
    for seed in SEEDS:
        for shuffle in (True, False):
            for drop_last in (False, True):
                model = DistributedSamplerModel(n, world, seed, shuffle=shuffle, drop_last=drop_last, backend="numpy")
                for epoch in (0, 1, 5):
                    for rank in range(world):
                        want = torch_distributed(n, world, rank, seed, epoch, shuffle, drop_last)
                        assert model.rank_indices(epoch, rank).tolist() == want, (seed, shuffle, drop_last, epoch, rank)


@pytest.mark.parametrize(
    ("n", "world", "drop_last"), [(10, 4, False), (10, 4, True), (3, 8, False), (1, 5, False), (2, 5, True)]
)
def test_distributed_sizes_and_global_order_match_torch(n: int, world: int, drop_last: bool) -> None:
    """num_samples/total_size as torch computes them; padding cyclic when it exceeds n."""
    model = DistributedSamplerModel(n, world, 7, drop_last=drop_last)
    ref: DistributedSampler[int] = DistributedSampler(
        Indices(n), num_replicas=world, rank=0, seed=7, drop_last=drop_last
    )
    assert model.num_samples() == ref.num_samples
    assert model.total_size == ref.total_size
    order = model.epoch_order(2)
    assert order.shape == (ref.total_size,)
    for rank in range(world):
        assert order[rank::world].tolist() == torch_distributed(n, world, rank, 7, 2, True, drop_last)


@pytest.mark.parametrize(
    ("n", "world", "drop_last", "shuffle"),
    [(1000, 64, False, True), (1000, 7, True, True), (3, 8, False, True), (1000, 64, False, False)],
)
def test_distributed_entries_without_the_rest_of_the_order(n: int, world: int, drop_last: bool, shuffle: bool) -> None:
    """entries_at gives the epoch order at any entries (padding and truncation included), as the
    order itself does."""
    model = DistributedSamplerModel(n, world, 7, shuffle=shuffle, drop_last=drop_last)
    t = np.concatenate([np.arange(5, model.total_size, world), np.arange(model.total_size - 1, n - 1, -1)])
    for epoch in (0, 3):
        np.testing.assert_array_equal(model.entries_at(epoch, t), model.epoch_order(epoch)[t])
    with pytest.raises(ValueError, match="entries"):
        model.entries_at(0, [model.total_size])


def test_distributed_both_backends_agree() -> None:
    a = DistributedSamplerModel(5000, 3, 11, backend="numpy")
    b = DistributedSamplerModel(5000, 3, 11, backend="torch")
    for epoch in (0, 3):
        np.testing.assert_array_equal(a.epoch_order(epoch), b.epoch_order(epoch))


def test_distributed_seed_plus_epoch_past_torchs_range_is_refused() -> None:
    model = DistributedSamplerModel(10, 2, 2**64 - 1)
    model.rank_indices(0, 0)
    with pytest.raises(ValueError, match="seed"):
        model.rank_indices(1, 0)


@pytest.mark.slow
def test_distributed_imagenet_scale_matches_torch() -> None:
    n, world = 1_281_167, 64
    for seed in (0, 2**63 - 1):
        model = DistributedSamplerModel(n, world, seed, backend="numpy")
        for epoch in (0, 89):
            for rank in (0, 1, 37, 63):
                assert model.rank_indices(epoch, rank).tolist() == torch_distributed(
                    n, world, rank, seed, epoch, True, False
                )


@pytest.mark.parametrize(("num_workers", "persistent"), [(0, False), (2, False), (2, True)])
@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_random_sampler_matches_real_dataloader_epochs(num_workers: int, persistent: bool, backend: Backend) -> None:
    """Base-seed draws, the permutation and the discarded one, epoch after epoch."""
    for n, seed, batch, drop_last in [
        (13, 0, 3, False),
        (13, 2**32 + 5, 4, True),
        (1, 42, 1, False),
        (40, 2**63 - 1, 40, False),
    ]:
        want = loader_epochs(
            n, seed, 3, num_workers=num_workers, persistent=persistent, batch=batch, drop_last=drop_last
        )
        model = RandomSamplerModel(n, seed, persistent_workers=persistent, num_workers=num_workers, backend=backend)
        for epoch in (2, 0, 1):  # any order: checkpoints, not replays
            got = model.rank_indices(epoch, 0).tolist()
            usable = len(got) - len(got) % batch if drop_last else len(got)
            assert got[:usable] == want[epoch], (n, seed, epoch)


def test_random_sampler_draw_accounting() -> None:
    """A seeded shuffling DataLoader: epoch e's permutation starts after e * 2n + 2 draws (2 + e * 2(n-1)
    with persistent workers)."""
    n = 1000
    plain = RandomSamplerModel(n, 1)
    persistent = RandomSamplerModel(n, 1, persistent_workers=True, num_workers=2)
    for e in range(5):
        assert plain.draws_before(e) == e * 2 * n + 2
        assert persistent.draws_before(e) == 2 + e * 2 * (n - 1)


def test_random_sampler_every_rank_reads_the_same_order() -> None:
    model = RandomSamplerModel(50, 3, world_size=4)
    first = model.rank_indices(1, 0)
    for rank in range(1, 4):
        np.testing.assert_array_equal(model.rank_indices(1, rank), first)
    np.testing.assert_array_equal(first, loader_epochs(50, 3, 2)[1])


def test_random_sampler_later_epoch_first() -> None:
    a = RandomSamplerModel(500, 9, backend="numpy")
    b = RandomSamplerModel(500, 9, backend="numpy")
    late = a.rank_indices(7, 0)
    for e in range(8):
        b.rank_indices(e, 0)
    np.testing.assert_array_equal(late, b.rank_indices(7, 0))


def test_random_sampler_checkpoints_stay_bounded_and_exact() -> None:
    """A long job keeps at most max_checkpoints generator states, and any epoch is still exact."""
    bounded = RandomSamplerModel(50, 4, backend="numpy", max_checkpoints=4)
    reference = RandomSamplerModel(50, 4, backend="numpy")
    for e in range(40):
        np.testing.assert_array_equal(bounded.rank_indices(e, 0), reference.rank_indices(e, 0))
        assert len(bounded._streams) <= 4
    assert len(reference._streams) == 41  # unthinned below the default limit of 64
    for e in (3, 39, 0, 17, 38, 60):  # back and forth, and past what was seen
        np.testing.assert_array_equal(bounded.rank_indices(e, 0), reference.rank_indices(e, 0))
        assert len(bounded._streams) <= 4
    with pytest.raises(ValueError, match="max_checkpoints"):
        RandomSamplerModel(5, 0, max_checkpoints=1)


def test_unseeded_random_sampler_is_refused_with_a_reason() -> None:
    with pytest.raises(ValueError) as err:
        make_sampler("random", 10, seed=0, world_size=1, generator_seeded=False)
    assert str(err.value) == UNPREDICTABLE_RANDOM
    assert "generator=None" in UNPREDICTABLE_RANDOM and "\n" not in UNPREDICTABLE_RANDOM


def test_persistent_workers_without_workers_is_refused_like_torch() -> None:
    with pytest.raises(ValueError, match="persistent_workers"):
        DataLoader(Indices(3), shuffle=True, persistent_workers=True, num_workers=0)
    with pytest.raises(ValueError, match="persistent_workers"):
        make_sampler("random", 3, seed=0, world_size=1, persistent_workers=True, num_workers=0)


def test_sequential_matches_torch() -> None:
    model = SequentialSamplerModel(17, world_size=2)
    for rank in (0, 1):
        assert model.rank_indices(3, rank).tolist() == list(SequentialSampler(Indices(17)))
    assert model.num_samples() == 17


def test_explicit_order() -> None:
    order = np.array([4, 0, 4, 2])
    model = ExplicitOrderModel(order, 5, world_size=3)
    assert model.rank_indices(9, 2).tolist() == [4, 0, 4, 2]
    assert model.num_samples() == 4
    for bad in ([0, 5], [-1], [[1, 2]], [0.5]):
        with pytest.raises(ValueError):
            ExplicitOrderModel(np.array(bad), 5)


def test_make_sampler_builds_each_kind() -> None:
    kinds: dict[str, type] = {
        "distributed": DistributedSamplerModel,
        "random": RandomSamplerModel,
        "sequential": SequentialSamplerModel,
        "list": ExplicitOrderModel,
    }
    for kind, cls in kinds.items():
        model = make_sampler(kind, 20, seed=1, world_size=2, order=np.arange(20)[::-1])
        assert isinstance(model, cls)
        assert isinstance(model, SamplerModel)
        assert model.world_size == 2
    dist = make_sampler("distributed", 20, seed=1, world_size=3, shuffle=False, sampler_drop_last=True)
    assert dist.rank_indices(0, 1).tolist() == torch_distributed(20, 3, 1, 1, 0, False, True)
    with pytest.raises(ValueError, match="order"):
        make_sampler("list", 20, seed=1, world_size=1)
    with pytest.raises(ValueError, match="kind"):
        make_sampler("weighted", 20, seed=1, world_size=1)


@pytest.mark.parametrize(
    "bad",
    [
        lambda: DistributedSamplerModel(0, 1, 0),
        lambda: DistributedSamplerModel(5, 0, 0),
        lambda: DistributedSamplerModel(5, 2, 0).rank_indices(0, 2),
        lambda: DistributedSamplerModel(5, 2, 0).rank_indices(-1, 0),
        lambda: RandomSamplerModel(5, 2**64),
    ],
)
def test_bad_arguments_raise_valueerror(bad: Callable[[], object]) -> None:
    with pytest.raises(ValueError):
        bad()


def test_epochs_are_cached_lazily_not_all_held() -> None:
    model = DistributedSamplerModel(100, 2, 0, cache_epochs=2)
    for epoch in range(10):
        model.rank_indices(epoch, 1)
    assert len(model._cache) == 2
    with pytest.raises(ValueError):
        model.epoch_order(0)[0] = 5  # cached arrays are read-only


def test_models_without_torch_match_torch(tmp_path: Path) -> None:
    """The default backend falls back to numpy in a torch-less process and stays exact."""
    want = {
        "dist": torch_distributed(1001, 3, 2, 2**32 + 5, 4, True, False),
        "random": loader_epochs(31, 8, 3, batch=4)[2],
        "persistent": loader_epochs(31, 8, 3, num_workers=2, persistent=True, batch=4)[2],
    }
    script = textwrap.dedent(
        """
        import json, sys
        sys.modules["torch"] = None
        from placement.randperm import torch_available
        from placement.samplers import make_sampler
        assert not torch_available()
        dist = make_sampler("distributed", 1001, seed=2**32 + 5, world_size=3)
        rnd = make_sampler("random", 31, seed=8, world_size=1)
        per = make_sampler("random", 31, seed=8, world_size=1, persistent_workers=True, num_workers=2)
        json.dump({"dist": dist.rank_indices(4, 2).tolist(), "random": rnd.rank_indices(2, 0).tolist(),
                   "persistent": per.rank_indices(2, 0).tolist()}, sys.stdout)
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == want
