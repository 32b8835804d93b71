"""The samplers of the frameworks people train with, against the installed packages, and the cursor on them.

Models (:mod:`placement.frameworks`) are compared index by index with what the real accelerate
1.15, torchdata 0.11 and Lightning 2.6 objects yield in this process: ``BatchSamplerShard`` and
``SeedableRandomSampler`` directly, whole loaders through accelerate's own ``prepare_data_loader``
(one call per process index: the sharding is decided there, no process group is needed),
torchdata's ``StatefulDataLoader`` with and without workers, Lightning's injected
``DistributedSampler``.

The cursor is then fed the opens those real loaders produce, shaped the way a node sees them
(DataLoader workers reordering within their batches in flight, two local ranks a step apart: the
helpers of tests/test_cursor.py), and must lock within two batches per local rank, predict every
epoch, and name what it cannot predict (an accelerate default or torchdata RandomSampler order, a
job shape other than the config's) without ever locking on it.
"""

from __future__ import annotations

import itertools
import os
import random
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch
from indices import Indices
from test_cursor import PREFETCH, WORKERS, Loop, check_breaks, check_epochs, replay, settings
from torch.utils.data import BatchSampler, DataLoader, DistributedSampler, SequentialSampler

from placement.cursor import NodeCursor
from placement.frameworks import (
    AccelerateSeedableModel,
    accelerate_default,
    batch_shard,
    build_sampler,
    torchdata_random,
)
from placement.jobstreams import DatasetStreams, JobStreams
from placement.randperm import randperm
from placement.samplers import DistributedSamplerModel
from placement.streams import JobShape, Streams
from tools.harness import torchvision_cpu

accelerate_data_loader = pytest.importorskip("accelerate.data_loader")
stateful = pytest.importorskip("torchdata.stateful_dataloader")

INFLIGHT = WORKERS * PREFETCH + 1  # batches a loader has opened past the one the loop holds


# ----------------------------------------------------------------------------------- real loaders


def prepared(n: int, batch: int, world: int, rank: int, **kw: Any) -> Any:
    """accelerate's prepared DataLoader for one process of ``world`` (shuffle=True unless told)."""
    shuffle = kw.pop("shuffle", True)
    split = kw.get("split_batches", False)
    loader = DataLoader(
        Indices(n),
        batch_size=batch * world if split else batch,
        shuffle=shuffle,
        drop_last=kw.pop("drop_last", False),
        generator=kw.pop("generator", None),
    )
    return accelerate_data_loader.prepare_data_loader(
        loader, num_processes=world, process_index=rank, put_on_device=False, **kw
    )


def take(loader: Any, stop: int | None) -> list[int]:
    """One epoch of ``loader``: all of it, or ``stop`` batches and then a break (the loop leaves early)."""
    out: list[int] = []
    for i, b in enumerate(loader):
        if stop is not None and i == stop:
            break
        out += [int(x) for x in b]
    return out


def accelerate_epochs(loaders: dict[int, Any], stops: list[int | None]) -> Iterator[dict[int, list[int]]]:
    """Per epoch, what each rank's real loader *opens*: a broken-off epoch opens its in-flight batches too."""
    for stop in stops:
        yield {r: take(ld, None if stop is None else stop + INFLIGHT) for r, ld in loaders.items()}


# ----------------------------------------------------------------------------------- the models


def test_batch_shard_is_batch_sampler_shard() -> None:
    """Every tail rule of accelerate's BatchSamplerShard (no split, split, even_batches, drop_last),
    on datasets smaller than a round, a round plus one, one short of a round, and so on."""
    cases = 0
    flags = [False, True]  # typed apart from the int lists, or product() would widen the flags to int
    for n, b, world, drop_last, even, split in itertools.product(
        [1, 2, 3, 5, 7, 8, 15, 16, 17, 31, 33, 64, 100, 503], [1, 2, 3, 4, 8], [1, 2, 3, 4], flags, flags, flags
    ):
        sampler = BatchSampler(SequentialSampler(range(n)), b * world if split else b, drop_last)
        rows, real = batch_shard(n, b, world, drop_last=drop_last, even_batches=even, split_batches=split)
        for r in range(world):
            shard = accelerate_data_loader.BatchSamplerShard(
                sampler, num_processes=world, process_index=r, split_batches=split, even_batches=even
            )
            want = [i for batch in shard for i in batch]
            assert rows[r].tolist() == want, (n, b, world, drop_last, even, split, r)
            cases += 1
        # what comes before the padding is read once; the padding repeats it
        first = np.concatenate([row[:c] for row, c in zip(rows, real, strict=True)])
        pads = np.concatenate([row[c:] for row, c in zip(rows, real, strict=True)])
        assert np.unique(first).shape[0] == first.shape[0] and np.isin(pads, first).all()
    assert cases == 5600


@pytest.mark.parametrize("seed", [0, 7, 2**40 + 3])
def test_seedable_random_sampler_is_randperm_of_seed_plus_epoch(seed: int) -> None:
    sampler = accelerate_data_loader.SeedableRandomSampler(data_source=range(101), data_seed=seed)
    for epoch in (0, 1, 5):
        sampler.set_epoch(epoch)
        assert list(sampler) == randperm(101, seed + epoch).tolist()


SEEDABLE_CASES = [
    # n, batch, world, even_batches, drop_last, split_batches, seed
    (503, 8, 2, True, False, False, 7),
    (503, 8, 2, False, False, False, 7),
    (503, 8, 2, True, True, False, 3),
    (100, 4, 3, True, False, False, 11),
    (100, 4, 3, False, True, False, 11),
    (37, 4, 2, True, False, True, 5),
    (37, 4, 2, False, False, True, 5),
    (10, 4, 4, True, False, False, 0),  # fewer samples than one round: padding wraps around
    (64, 8, 4, True, False, False, 123),  # no tail at all
    (250, 16, 3, False, False, True, 42),
]


@pytest.mark.parametrize(("n", "batch", "world", "even", "drop_last", "split", "seed"), SEEDABLE_CASES)
def test_accelerate_seedable_model_is_prepare_data_loader(
    n: int, batch: int, world: int, even: bool, drop_last: bool, split: bool, seed: int
) -> None:
    """use_seedable_sampler=True: every rank's indices, epoch by epoch, as the prepared loader yields
    them; an epoch broken off early is followed by the same order again (the loader counts full passes)."""
    model = AccelerateSeedableModel(n, world, seed, batch, drop_last=drop_last, even_batches=even, split_batches=split)
    for r in range(world):
        loader = prepared(
            n,
            batch,
            world,
            r,
            use_seedable_sampler=True,
            data_seed=seed,
            even_batches=even,
            split_batches=split,
            drop_last=drop_last,
        )
        assert take(loader, None) == model.rank_indices(0, r).tolist()
        assert take(loader, None) == model.rank_indices(1, r).tolist()
        if len(loader) > 1:
            broken = take(loader, 1)  # epoch 2 left after one batch
            assert broken == model.rank_indices(2, r).tolist()[: len(broken)]
        assert take(loader, None) == model.rank_indices(2, r).tolist(), "after a break: not the same order"
        assert take(loader, None) == model.rank_indices(3, r).tolist()
    assert model.num_samples() == min(model.rank_lengths())
    layout = model.epoch_layout(1)
    for r in range(world):  # the strided layout holds every rank's common part
        assert layout.order[r::world].tolist() == model.rank_indices(1, r).tolist()[: model.num_samples()]


def test_accelerate_seedable_takes_set_seeds_value(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without data_seed the seed is torch.random.initial_seed(): set_seed's value."""
    from accelerate.utils import set_seed

    set_seed(1234)
    model = AccelerateSeedableModel(203, 2, 1234, 8)
    loaders = {r: prepared(203, 8, 2, r, use_seedable_sampler=True) for r in range(2)}
    for e in range(2):
        for r, ld in loaders.items():
            assert take(ld, None) == model.rank_indices(e, r).tolist()


@pytest.mark.parametrize("loader_generator", [False, True])
def test_accelerate_default_is_one_generator_stream(loader_generator: bool) -> None:
    """Default prepare(): the generator prepare() seeds runs on over the epochs (two randperms per
    full pass, one for a pass broken off, which the phase-1 model follows); its initial seed, not
    set_seed's value, decides the order."""
    n, b, world = 203, 8, 2
    torch.manual_seed(7)
    for r in range(world):
        gen = torch.Generator().manual_seed(99) if loader_generator else None  # each process its own
        loader = prepared(n, b, world, r, generator=gen)
        g0 = loader.synchronized_generator.initial_seed()
        assert loader_generator or g0 != 7
        model = accelerate_default(n, world, g0, b, loader_generator=loader_generator)
        shifted = accelerate_default(n, world, g0, b, loader_generator=loader_generator, phase=1)
        for e in range(3):
            assert take(loader, None) == model.rank_indices(e, r).tolist()
        take(loader, 2)  # epoch 3 broken off after two batches
        assert take(loader, None) == shifted.rank_indices(3, r).tolist()
        assert take(loader, None) == shifted.rank_indices(4, r).tolist()
        # without a generator of its own the loader reads in epoch 0 what the seedable sampler seeded g0 does
        same = model.rank_indices(0, r).tolist() == AccelerateSeedableModel(n, world, g0, b).rank_indices(0, r).tolist()
        assert same != loader_generator


@pytest.mark.parametrize(("workers", "persistent"), [(0, False), (2, False), (2, True)])
@pytest.mark.parametrize("loader_generator", [False, True])
def test_torchdata_random_sampler_is_one_generator_stream(
    workers: int, persistent: bool, loader_generator: bool
) -> None:
    """torchdata's RandomSampler: its generator seeded once at construction, an eager randperm per
    sampler iterator (a multi-process iterator makes two per epoch), the base seed from the loader's
    generator; a pass broken off still used its one permutation."""
    n = 150
    gen = torch.Generator().manual_seed(5) if loader_generator else None
    loader = stateful.StatefulDataLoader(
        Indices(n), batch_size=8, shuffle=True, generator=gen, num_workers=workers, persistent_workers=persistent
    )
    g0 = loader.sampler.generator.initial_seed()
    model = torchdata_random(
        n, 2, g0, num_workers=workers, loader_generator=loader_generator, persistent_workers=persistent
    )
    for e in range(3):
        assert take(loader, None) == model.rank_indices(e, 1).tolist(), f"epoch {e}"
    if not persistent:
        take(loader, 1)
        assert take(loader, None) == model.rank_indices(4, 0).tolist()


@pytest.mark.parametrize("seed", [None, 0, 31])
def test_lightning_injects_distributed_sampler_seeded_by_seed_everything(
    seed: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Lightning's DDP sampler: DistributedSampler(seed=PL_GLOBAL_SEED), which seed_everything(S) sets
    (0 without it): write seed_everything's value."""
    torchvision_cpu.load()  # lightning imports torchvision
    from lightning.fabric.utilities.seed import seed_everything
    from lightning.pytorch.trainer.connectors.data_connector import _get_distributed_sampler
    from lightning.pytorch.trainer.states import RunningStage

    monkeypatch.delenv("PL_GLOBAL_SEED", raising=False)
    if seed is not None:
        seed_everything(seed)
    loader = DataLoader(Indices(97), batch_size=4, shuffle=True)
    model = DistributedSamplerModel(97, 3, seed or 0)
    for r in range(3):
        injected = _get_distributed_sampler(
            loader, shuffle=True, overfit_batches=0, mode=RunningStage.TRAINING, num_replicas=3, rank=r
        )
        for e in (0, 2):
            injected.set_epoch(e)
            assert list(injected) == model.rank_indices(e, r).tolist()
    monkeypatch.delenv("PL_GLOBAL_SEED", raising=False)
    os.environ.pop("PL_GLOBAL_SEED", None)


def test_build_sampler_knows_every_kind() -> None:
    for kind in ("distributed", "random", "sequential", "accelerate", "accelerate_default", "torchdata_random"):
        model = build_sampler(kind, 40, seed=3, world_size=2, batch_size=4)
        assert model.n == 40 and model.world_size == 2
    with pytest.raises(ValueError, match="expected one of"):
        build_sampler("horovod", 40, seed=3, world_size=2)
    with pytest.raises(ValueError, match="accelerate_default"):
        build_sampler("accelerate_default", 40, seed=3, world_size=2, shuffle=False)


# ----------------------------------------------------------------------------------- the cursor


def job(model: Any, shape: JobShape, epochs: int = 3) -> JobStreams:
    return JobStreams([DatasetStreams(Streams(model, shape), 0)], shape, epochs)


@pytest.mark.parametrize(
    ("declared", "world", "node"),
    [("accelerate", 2, 0), ("distributed", 2, 0), ("accelerate", 4, 1), ("distributed", 4, 1)],
)
def test_cursor_follows_accelerate_seedable_with_a_broken_epoch(declared: str, world: int, node: int) -> None:
    """accelerate with use_seedable_sampler=True, two processes on this node, two workers each:
    epoch 1 is broken off after a third of its batches and read again from its start (accelerate counts only full
    passes), then epochs 2 and 3.  Declared as the accelerate kind, or as a plain DistributedSampler
    with set_seed's value (the cursor tries accelerate's batch sharding of the same permutation); on
    one node (every rank here) and on the second of two."""
    n, b, seed = 503, 8, 7
    shape = JobShape(world, 2, b, drop_last=False)
    loop = Loop(world=world, per_node=2, node=node, batch=b, rng=random.Random(3 + world))
    loaders = {r: prepared(n, b, world, r, use_seedable_sampler=True, data_seed=seed) for r in loop.ranks}
    stop = len(loaders[loop.ranks[0]]) // 3  # 10 of 32 batches per rank on one node, 5 of 16 on two
    assert stop + INFLIGHT < len(loaders[loop.ranks[0]])  # a real break: the loader never reaches the end
    stops: list[int | None] = [None, stop, None, None, None]
    for job_epoch, rows in enumerate(accelerate_epochs(loaders, stops)):
        loop.stretch(f"epoch {job_epoch}" + (" (broken off)" if stops[job_epoch] else ""), job_epoch, 0, rows)
    model = build_sampler(declared, n, seed=seed, world_size=world, batch_size=b)
    cur = NodeCursor(job(model, shape), settings(b))
    hits = replay(cur, loop.opens)
    check_breaks(loop, hits)
    check_epochs(cur)
    lead = cur.status()["datasets"][0]
    assert lead["sampler"] == "accelerate" and lead["mode"] == "advance" and cur.node == node
    assert cur.datasets[0].locks == 1, "the repeated epoch needed a relock"
    assert cur.epoch == 4 and lead["sampler_epoch"] == 3  # five passes, the broken one read twice


def replay_presumed_accelerate(rank: int, batch: int, interleaving: int, epochs: int) -> tuple[NodeCursor, list[bool]]:
    """accelerate's seedable sampler, two processes on this node, the seed written before the job
    (the daemon presumes the start of epoch 0), and 7 opens of local rank ``rank``'s batch ``batch``
    (not the first) before any other: the cursor after ``epochs`` epochs, and which opens it predicted."""
    n, b, seed, world = 503, 8, 7, 2
    loop = Loop(world=world, per_node=2, node=0, batch=b, rng=random.Random(interleaving))
    loaders = {r: prepared(n, b, world, r, use_seedable_sampler=True, data_seed=seed) for r in loop.ranks}
    passes = list(accelerate_epochs(loaders, [None] * epochs))
    for job_epoch, rows in enumerate(passes):
        loop.stretch(f"epoch {job_epoch}", job_epoch, 0, rows)
    first = list(passes[0][rank][batch * b : batch * b + 7])  # dataset indices are the plan's gids here
    epoch0 = loop.opens[: len(loop.opens) // epochs]
    opens = first + [g for g in epoch0 if g not in first] + loop.opens[len(epoch0) :]
    model = build_sampler("accelerate", n, seed=seed, world_size=world, batch_size=b)
    cur = NodeCursor(job(model, JobShape(world, 2, b, drop_last=False), epochs=epochs), settings(b))
    cur.presume(0, 0)
    return cur, replay(cur, opens)


@pytest.mark.parametrize(("rank", "batch"), [(0, 1), (1, 1), (0, 3), (1, 2)])
def test_a_presumption_confirmed_by_accelerates_other_variant_keeps_its_hits(rank: int, batch: int) -> None:
    """accelerate's seedable sampler, two processes on this node, seed written before the job: the
    daemon presumes the start of epoch 0, and one worker's batch (not the first) comes first.  Its 7
    opens fit the same permutation shared out sample-wise (the DistributedSampler variant) at the
    pass's start more tightly than batch-wise, and the cursor locks on that; it must not withdraw
    the presumption's hits for it, since those opens were predicted and staged (they were: 505 of
    512 opens of epoch 0 credited in a real-client run, 100% predicted at open time)."""
    cur, hits = replay_presumed_accelerate(rank, batch, interleaving=2, epochs=2)
    status = cur.status()
    assert all(hits), [i for i, h in enumerate(hits) if not h][:10]
    assert status["hits"] == status["opens"] == len(hits), (status["hits"], status["opens"])


@pytest.mark.parametrize("interleaving", [5, 6, 7])
def test_a_lock_on_the_shorter_variant_still_takes_accelerates_end_padding(interleaving: int) -> None:
    """The presumption confirmed by the DistributedSampler variant, as above, has the cursor follow
    252 positions per rank where accelerate reads 256: when the other local rank's padding batch
    (the epoch's first samples again) is opened after this rank's last real batch, both tracks have
    ended before it comes.  Those re-reads are accelerate's padding, not a new pass: every later
    epoch is predicted in full and counted once, with set_epoch's ``advance`` mode (taken for a new
    pass of the same order, they set ``repeat`` and left 15-22 of 512 opens per epoch unpredicted
    in a real two-process run)."""
    cur, hits = replay_presumed_accelerate(0, 1, interleaving, epochs=3)  # rank 0's second batch first
    assert all(hits), [i for i, h in enumerate(hits) if not h][:10]
    assert [row["epoch"] for row in cur.status()["history"]] == [0, 1, 2]
    assert cur.datasets[0].mode == "advance"


def test_cursor_predicts_accelerate_default_from_the_generator_seed() -> None:
    """A job that writes rank 0's synchronized_generator.initial_seed(): predicted in every epoch."""
    n, b, world = 503, 8, 2
    loaders = {}
    for r in range(world):
        torch.manual_seed(7)  # set_seed(7) on every process: the same draw at prepare()
        loaders[r] = prepared(n, b, world, r)
    g0 = loaders[0].synchronized_generator.initial_seed()
    assert g0 == loaders[1].synchronized_generator.initial_seed()
    loop = Loop(world=world, per_node=2, node=0, batch=b, rng=random.Random(4))
    for e, rows in enumerate(accelerate_epochs(loaders, [None] * 3)):
        loop.stretch(f"epoch {e}", e, 0, rows)
    model = build_sampler("accelerate_default", n, seed=g0, world_size=world, batch_size=b)
    cur = NodeCursor(job(model, JobShape(world, 2, b, False)), settings(b))
    hits = replay(cur, loop.opens)
    check_breaks(loop, hits)
    check_epochs(cur)


def unpredictable_opens(kind: str, n: int, b: int, seed: int) -> Loop:
    """Opens of a job whose order no stated seed decides: set_seed/seed_everything(seed) ran, then the
    framework drew its generator's seed from the global RNG (after a model's initialisation)."""
    loop = Loop(world=2, per_node=2, node=0, batch=b, rng=random.Random(seed))
    if kind == "accelerate_default":
        loaders = {}
        for r in range(2):
            torch.manual_seed(seed)
            torch.nn.Linear(4, 4)  # the model: it consumes the global RNG before prepare()
            loaders[r] = prepared(n, b, 2, r)
        for e, rows in enumerate(accelerate_epochs(loaders, [None] * 2)):
            loop.stretch(f"epoch {e}", e, 0, rows)
        return loop
    torch.manual_seed(seed)
    loader = stateful.StatefulDataLoader(Indices(n), batch_size=b, shuffle=True)
    for e in range(2):
        order = take(loader, None)
        loop.stretch(f"epoch {e}", e, 0, {0: order, 1: order})
    return loop


@pytest.mark.parametrize("kind", ["accelerate_default", "torchdata_random"])
@pytest.mark.parametrize("declared", ["own", "distributed"])
def test_unpredictable_samplers_are_named_and_never_locked(kind: str, declared: str) -> None:
    """set_seed's (or seed_everything's) value written for accelerate's default sampler or torchdata's
    RandomSampler: refuted within two batches per local rank, named as that sampler when it is the
    declared kind, and never a lock (no open predicted)."""
    n, b, seed = 600, 8, 21
    loop = unpredictable_opens(kind, n, b, seed)
    model = build_sampler(kind if declared == "own" else declared, n, seed=seed, world_size=2, batch_size=b)
    cur = NodeCursor(job(model, JobShape(2, 2, b, False)), settings(b))
    hits = replay(cur, loop.opens)
    assert cur.first_mismatch_open is not None and cur.first_mismatch_open <= 2 * b * 2
    assert not any(hits), "an order no seed decides was predicted"
    assert cur.state == "mismatch" and cur.datasets[0].locks == 0
    if declared == "own":
        assert cur.mismatch_kind == "unpredictable"
        assert (cur.mismatch_reason or "").startswith(
            "unpredictable: " + ("accelerate" if "acc" in kind else "torchdata")
        )
    else:
        assert cur.mismatch_kind == "wrong_seed"


def test_stateful_dataloader_resumed_mid_epoch_is_followed() -> None:
    """torchdata StatefulDataLoader over a seeded DistributedSampler, stopped after 19 batches of epoch 1
    and resumed from its state_dict: the same permutation, the consumed positions skipped.  The cursor
    locks within two batches per local rank and predicts the rest and the next epoch."""
    n, b, world, seed = 503, 8, 2, 7
    loop = Loop(world=world, per_node=2, node=0, batch=b, rng=random.Random(5))
    resumed: dict[int, list[int]] = {}
    following: dict[int, list[int]] = {}
    for r in range(world):
        sampler: DistributedSampler[int] = DistributedSampler(
            Indices(n), num_replicas=world, rank=r, shuffle=True, seed=seed
        )
        first = stateful.StatefulDataLoader(Indices(n), batch_size=b, sampler=sampler)
        sampler.set_epoch(1)
        it = iter(first)
        for _ in range(19):
            next(it)
        state = first.state_dict()
        again = stateful.StatefulDataLoader(Indices(n), batch_size=b, sampler=sampler)
        again.load_state_dict(state)
        resumed[r] = take(again, None)
        sampler.set_epoch(2)
        following[r] = take(again, None)
        assert resumed[r] == DistributedSamplerModel(n, world, seed).rank_indices(1, r)[19 * b :].tolist()
    loop.stretch("epoch 1 from sample 152", 1, 0, resumed)
    loop.stretch("epoch 2", 2, 0, following)
    model = build_sampler("distributed", n, seed=seed, world_size=world, batch_size=b)
    cur = NodeCursor(job(model, JobShape(world, 2, b, False)), settings(b))
    hits = replay(cur, loop.opens)
    check_breaks(loop, hits)
    check_epochs(cur, skip=lambda e: e == 1)  # 100 positions per rank left: 2 batches are 16%
    assert cur.epoch == 2 and cur.state == "tracking"


@pytest.mark.parametrize(
    ("config", "job_shape", "expect"),
    [
        # DistributedSampler: the job runs 3 nodes of 2 ranks, the config says 2 nodes of 2
        (("distributed", 4, 2, 8), ("distributed", 6, 2, 8), "world_size 6, this node's ranks 0-1"),
        # accelerate: the job's batch is 8, the config says 16
        (
            ("accelerate", 4, 2, 16),
            ("accelerate", 4, 2, 8),
            "batches of 8 dealt to ranks round-robin (accelerate), world_size 4",
        ),
        # both ranks on this node, the config says one rank per node
        (("distributed", 2, 1, 8), ("distributed", 2, 2, 8), "every rank of the job on this node"),
    ],
)
def test_a_wrong_job_shape_is_named(
    config: tuple[str, int, int, int], job_shape: tuple[str, int, int, int], expect: str
) -> None:
    """The seed is right, the shape is not: the opens fit the plan's permutation under the job's real
    shape, which the mismatch names within two batches per local rank, apart from a wrong seed."""
    n, seed = 1000, 9
    kind, world, per_node, b = job_shape
    real = build_sampler(kind, n, seed=seed, world_size=world, batch_size=b)
    loop = Loop(world=world, per_node=per_node, node=0, batch=b, rng=random.Random(6))
    for e in range(2):
        loop.stretch(f"epoch {e}", e, 0, {r: real.rank_indices(e, r).tolist() for r in loop.ranks})
    ckind, cworld, cper, cb = config
    model = build_sampler(ckind, n, seed=seed, world_size=cworld, batch_size=cb)
    cur = NodeCursor(job(model, JobShape(cworld, cper, cb, False)), settings(cb))
    budget = 2 * b * per_node
    hits = replay(cur, loop.opens[:budget])
    assert cur.first_mismatch_open is not None and cur.first_mismatch_open <= budget, cur.status()
    assert cur.mismatch_kind == "wrong_shape", cur.mismatch_reason
    assert expect in (cur.mismatch_reason or ""), cur.mismatch_reason
    hits += replay(cur, loop.opens[budget:])
    # a shape the config does not describe is never followed as if it did (a layout sharing some of
    # the node's files may relock on them: at most those are predicted)
    assert sum(hits) <= 0.6 * len(hits), f"{sum(hits)} of {len(hits)} opens predicted under the wrong shape"


def test_a_wrong_seed_is_not_called_a_wrong_shape() -> None:
    """The same shapes with a seed far from the job's: the opens fit no shape of the plan's orders."""
    n, b = 1000, 8
    real = build_sampler("distributed", n, seed=9, world_size=6, batch_size=b)
    loop = Loop(world=6, per_node=2, node=0, batch=b, rng=random.Random(7))
    loop.stretch("epoch 0", 0, 0, {r: real.rank_indices(0, r).tolist() for r in loop.ranks})
    cur = NodeCursor(
        job(build_sampler("distributed", n, seed=9 + 5000, world_size=4), JobShape(4, 2, b, False)), settings(b)
    )
    replay(cur, loop.opens)
    assert cur.mismatch_kind == "wrong_seed" and "seed, catalog order or sampler" in (cur.mismatch_reason or "")


def test_batch_sharded_layout_streams_every_rank_like_the_model() -> None:
    """Streams over an accelerate model: each rank's stream is the model's rank list (drop_last
    applies nothing more), node streams interleave the ranks batch by batch."""
    model = AccelerateSeedableModel(101, 4, 3, 4, even_batches=False)
    shape = JobShape(4, 2, 4, drop_last=False)
    st = Streams(model, shape)
    for r in range(4):
        assert st.rank_stream(2, r).tolist() == model.rank_indices(2, r).tolist()[: model.num_samples()]
    inv = st.epoch_inverse(2)
    for r in range(4):
        for p, i in enumerate(st.rank_stream(2, r).tolist()):
            assert (r, p) in inv.occurrences(i)
    assert np.array_equal(
        np.sort(st.node_stream(2, 0)), np.sort(np.concatenate([st.rank_stream(2, 0), st.rank_stream(2, 1)]))
    )


@pytest.mark.parametrize("interleaving", [0, 9, 30, 41, 58])
def test_accelerate_end_padding_is_not_a_new_pass(interleaving: int) -> None:
    """accelerate (use_seedable_sampler) run under a config that declares a DistributedSampler with set_seed's
    value: the two variants differ on a node only where accelerate's even_batches re-reads the epoch's first
    samples in the last round of batches.  Read while the node's last batches are still being opened, those
    re-reads must not start a new pass (a wrong ``repeat`` mode and an epoch counted too many, as seen under
    some worker interleavings): the cursor follows accelerate's order from there, and every epoch is counted
    once and predicted."""
    n, b, world, seed = 503, 8, 2, 7
    loaders = {r: prepared(n, b, world, r, use_seedable_sampler=True, data_seed=seed) for r in range(world)}
    loop = Loop(world=world, per_node=2, node=0, batch=b, rng=random.Random(interleaving))
    for e, rows in enumerate(accelerate_epochs(loaders, [None] * 3)):
        loop.stretch(f"epoch {e}", e, 0, rows)
    model = build_sampler("distributed", n, seed=seed, world_size=world, batch_size=b)
    cur = NodeCursor(job(model, JobShape(world, 2, b, False)), settings(b))
    cur.presume(0, 0)
    hits = replay(cur, loop.opens)
    check_breaks(loop, hits)
    check_epochs(cur)
    lead = cur.status()["datasets"][0]
    assert [row["epoch"] for row in cur.status()["history"]] == [0, 1, 2]
    assert lead["mode"] == "advance" and lead["sampler"] == "accelerate" and cur.epoch == 2
