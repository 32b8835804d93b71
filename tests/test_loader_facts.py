"""timm's OrderedDistributedSampler and per-dataset DataLoader facts, checked against the real classes.

timm validates with ``OrderedDistributedSampler`` and ``DataLoader(drop_last=False)`` while it trains
with ``DistributedSampler`` and ``drop_last=True`` (``timm/data/loader.py``, ``create_loader``): one
``job.drop_last`` cannot say both, so each dataset may carry its own ``loader.batch_size`` and
``loader.drop_last``.  Every test iterates the real sampler or DataLoader and compares indices.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from indices import Indices
from torch.utils.data import DataLoader, DistributedSampler, Sampler

from fusefs.config import load
from fusefs.errors import ConfigError
from fusefs.meta.snapshot import Snapshot
from placement import plan as P
from placement.plan import Plan
from placement.samplers import OrderedDistributedSamplerModel, make_sampler, sampler_name, varies_by_epoch
from tools.harness import torchvision_cpu


def timm_ordered(n: int, world: int, rank: int) -> Any:
    torchvision_cpu.load()  # timm imports torchvision
    mod = pytest.importorskip("timm.data.distributed_sampler", reason="timm is not installed")
    return mod.OrderedDistributedSampler(Indices(n), num_replicas=world, rank=rank)


@pytest.mark.parametrize("n", [1, 2, 3, 10, 1001])
@pytest.mark.parametrize("world", [1, 2, 3, 4, 7])
def test_ordered_distributed_matches_timm(n: int, world: int) -> None:
    """Strided, padded from the dataset's start (timm 1.0.31: not one contiguous chunk per rank)."""
    model = make_sampler("ordered_distributed", n, seed=99, world_size=world)
    assert isinstance(model, OrderedDistributedSamplerModel)
    for rank in range(world):
        ref = timm_ordered(n, world, rank)
        want = list(iter(ref))
        assert model.num_samples() == len(ref)
        for epoch in (0, 3):  # no set_epoch, no seed: the same every epoch
            assert model.rank_indices(epoch, rank).tolist() == want, (n, world, rank, epoch)
    assert sampler_name(model) == "ordered_distributed" and not varies_by_epoch(model)


def config(**overrides: str) -> dict[str, Any]:
    cfg: dict[str, Any] = load(None, dict(overrides)).to_dict()
    return cfg


def loader_indices(n: int, sampler: Sampler[int], batch: int, drop_last: bool) -> list[int]:
    loader = DataLoader(Indices(n), batch_size=batch, sampler=sampler, drop_last=drop_last)
    return [int(i) for b in loader for i in b]


@pytest.mark.parametrize(("n_train", "n_val", "world"), [(101, 37, 2), (64, 10, 4), (50, 3, 4)])
def test_timm_train_and_validation_loaders_per_rank(n_train: int, n_val: int, world: int) -> None:
    """timm's create_loader: training DistributedSampler + drop_last, validation Ordered + no drop_last;
    the validation set's own batch size (``--validation-batch-size``) differs from the job's."""
    seed, batch, val_batch = 5, 8, 3
    cfg = config(
        **{
            "datasets": "[{root: train}, {root: val, follows: train, sampler: {kind: ordered_distributed}, "
            f"loader: {{drop_last: false, batch_size: {val_batch}}}}}]",
            "job.world_size": str(world),
            "job.ranks_per_node": str(world),
            "job.batch_size": str(batch),
            "job.drop_last": "true",
            "job.epochs": "3",
        }
    )
    inputs = P.plan_inputs(cfg, seed)
    train, val = P._streams(inputs, [n_train, n_val], {}, "numpy")
    assert (train.shape.batch_size, train.shape.drop_last) == (batch, True)
    assert (val.shape.batch_size, val.shape.drop_last) == (val_batch, False)
    torch.manual_seed(0)
    for epoch in range(3):
        for rank in range(world):
            ds: DistributedSampler[int] = DistributedSampler(Indices(n_train), num_replicas=world, rank=rank, seed=seed)
            ds.set_epoch(epoch)
            assert train.rank_stream(epoch, rank).tolist() == loader_indices(n_train, ds, batch, True)
            ref = timm_ordered(n_val, world, rank)
            assert val.rank_stream(epoch, rank).tolist() == loader_indices(n_val, ref, val_batch, False)


def test_a_dataset_loader_overrides_the_job_and_changes_the_plan_inputs_only_when_set() -> None:
    base = {"job.batch_size": "8", "job.drop_last": "true"}
    plain = P.plan_inputs(config(**base), 1)
    assert "loader" not in plain["datasets"][0]  # digests of configs without it are unchanged
    same_as_job = config(**base, datasets="[{root: ., loader: {drop_last: true}}]")
    assert P.plan_inputs(same_as_job, 1)["datasets"][0]["loader"] == {"drop_last": True}
    own = P.plan_inputs(config(**base, datasets="[{root: ., loader: {batch_size: 2, drop_last: false}}]"), 1)
    (streams,) = P._streams(own, [21], {}, "numpy")
    assert streams.length == 21  # 21 files, batches of 2, the last partial one read: not 16 (8s, dropped)


def test_a_loader_batch_size_below_one_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"datasets\.0\.loader\.batch_size"):
        config(datasets="[{root: ., loader: {batch_size: 0}}]")


def test_a_plan_builds_with_datasets_that_batch_differently(tmp_path: Path) -> None:
    """timm's job as configured: training drops its partial batch, validation (ordered) does not."""
    for split, n in (("train", 21), ("val", 7)):
        for k in range(n):
            (tmp_path / split / f"c{k % 3}").mkdir(parents=True, exist_ok=True)
            (tmp_path / split / f"c{k % 3}" / f"img_{k}.jpg").write_bytes(b"x" * (10 + k))
    cfg = config(
        **{
            "datasets": "[{root: train}, {root: val, follows: train, sampler: {kind: ordered_distributed}, "
            "loader: {drop_last: false}}]",
            "job.world_size": "2",
            "job.ranks_per_node": "2",
            "job.batch_size": "4",
            "job.drop_last": "true",
        }
    )
    plan = Plan.build(Snapshot.scan(str(tmp_path)).tree, cfg, seed=3)
    js = plan.job_streams()
    assert js.datasets[1].streams.length == 4 and js.datasets[0].streams.length == 8  # 7 -> 4 per rank; 11 -> 8


def timm_repeat_aug(n: int, world: int, rank: int, repeats: float) -> Any:
    torchvision_cpu.load()
    mod = pytest.importorskip("timm.data.distributed_sampler", reason="timm is not installed")
    return mod.RepeatAugSampler(Indices(n), num_replicas=world, rank=rank, num_repeats=repeats)


@pytest.mark.parametrize(("n", "world", "repeats"), [(10, 2, 3), (300, 4, 3), (257, 3, 2), (50, 2, 1.5), (7, 4, 3)])
def test_repeat_aug_matches_timm(n: int, world: int, repeats: float) -> None:
    """timm's RepeatAugSampler (--aug-repeats): the epoch alone seeds it, so any seed gives this order."""
    cfg = config(
        **{
            "datasets": f"[{{root: ., sampler: {{kind: repeat_aug, aug_repeats: {repeats}}}}}]",
            "job.world_size": str(world),
            "job.ranks_per_node": str(world),
        }
    )
    (streams,) = P._streams(P.plan_inputs(cfg, 12345), [n], {}, "numpy")
    assert sampler_name(streams.sampler) == "repeat_aug" and varies_by_epoch(streams.sampler)
    for epoch in (0, 1, 4):
        for rank in range(world):
            ref = timm_repeat_aug(n, world, rank, repeats)
            ref.set_epoch(epoch)
            want = list(iter(ref))
            assert streams.sampler.num_samples() == len(ref)
            assert streams.rank_stream(epoch, rank).tolist() == want, (epoch, rank)


def test_repeat_aug_repeats_are_in_its_plan_inputs_only() -> None:
    assert "aug_repeats" not in P.plan_inputs(config(), 0)["datasets"][0]["sampler"]  # digests unchanged
    cfg = config(datasets="[{root: ., sampler: {kind: repeat_aug, aug_repeats: 2}}]")
    assert P.plan_inputs(cfg, 0)["datasets"][0]["sampler"]["aug_repeats"] == 2.0


def test_a_plan_builds_over_repeat_aug(tmp_path: Path) -> None:
    for k in range(300):
        (tmp_path / "train" / f"c{k % 3}").mkdir(parents=True, exist_ok=True)
        (tmp_path / "train" / f"c{k % 3}" / f"img_{k}.jpg").write_bytes(b"x" * (10 + k))
    cfg = config(
        **{
            "datasets": "[{root: train, sampler: {kind: repeat_aug}}]",
            "job.world_size": "4",
            "job.ranks_per_node": "2",
            "job.epochs": "3",
            "job.batch_size": "4",
        }
    )
    plan = Plan.build(Snapshot.scan(str(tmp_path)).tree, cfg, seed=0)
    js = plan.job_streams()
    assert js.datasets[0].streams.length == 256 // 4  # timm reads n // 256 * 256 / world samples per rank
    assert plan.files == 300
