"""Rank and node access streams, inverse lookups and read counts.

Rank streams are checked against what real torch DataLoaders yield on each rank; node streams,
inverse lookups and counts against plain-loop definitions (a node's ranks take turns batch by batch)
and, with hypothesis, over many random job shapes.
"""

from __future__ import annotations

import functools
import itertools
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from indices import Indices
from torch.utils.data import DataLoader, DistributedSampler

from placement.parallel import run_ahead
from placement.randperm import randperm
from placement.samplers import DistributedSamplerModel, SamplerModel, make_sampler
from placement.streams import EpochInverse, JobShape, Streams

A = TypeVar("A")
T = TypeVar("T")


class OnlyTheProtocol:
    """A SamplerModel offering just the protocol (no epoch_layout): the generic path."""

    def __init__(self, inner: SamplerModel) -> None:
        self._inner = inner
        self.n = inner.n
        self.world_size = inner.world_size

    def rank_indices(self, epoch: int, rank: int) -> np.ndarray:
        return self._inner.rank_indices(epoch, rank)

    def num_samples(self) -> int:
        return self._inner.num_samples()


# ---- plain-loop definitions -----------------------------------------------------------------


def ref_node_stream(streams: Streams, epoch: int, node: int) -> list[int]:
    """Step s: the node's first rank's batch s, then the next rank's batch s, ..."""
    b = streams.shape.batch_size
    rank_lists = [streams.rank_stream(epoch, r).tolist() for r in streams.shape.ranks_of_node(node)]
    out: list[int] = []
    for s in range(0, streams.length, b):
        for lst in rank_lists:
            out += lst[s : s + b]
    return out


def all_reads(streams: Streams, epoch: int) -> dict[int, list[tuple[int, int]]]:
    """file -> every (rank, position) reading it, earliest (position, then rank) first."""
    reads: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for r in range(streams.shape.world_size):
        for p, f in enumerate(streams.rank_stream(epoch, r).tolist()):
            reads[f].append((r, p))
    for lst in reads.values():
        lst.sort(key=lambda rp: (rp[1], rp[0]))
    return reads


def check_inverse(streams: Streams, epoch: int) -> None:
    inv: EpochInverse = streams.epoch_inverse(epoch)
    reads = all_reads(streams, epoch)
    shape = streams.shape
    node_lists = [streams.node_stream(epoch, k).tolist() for k in range(shape.nodes)]
    for f in range(streams.n):
        if f not in reads:
            assert inv.rank_of[f] == -1 and inv.node_of(f) == -1 and inv.node_pos(f) == -1
            assert not inv.duplicated[f]
            assert inv.occurrences(f) == []
            continue
        rank, pos = reads[f][0]
        assert (int(inv.rank_of[f]), int(inv.pos_of[f])) == (rank, pos)
        assert bool(inv.duplicated[f]) == (len(reads[f]) > 1)
        assert inv.occurrences(f) == reads[f]
        node = shape.node_of_rank(rank)
        assert inv.node_of(f) == node
        assert node_lists[node][inv.node_pos(f)] == f
    files = np.arange(streams.n)
    assert inv.nodes_of(files).tolist() == [inv.node_of(f) for f in range(streams.n)]
    assert inv.node_positions(files).tolist() == [inv.node_pos(f) for f in range(streams.n)]


def ref_node_counts(streams: Streams, epochs: range) -> np.ndarray:
    out = np.zeros((streams.shape.nodes, streams.n), dtype=np.int64)
    for e in epochs:
        for k in range(streams.shape.nodes):
            out[k] += np.bincount(streams.node_stream(e, k), minlength=streams.n)
    return out


# ---- against real torch DataLoaders ---------------------------------------------------------------


@pytest.mark.parametrize(("n", "world", "batch"), [(23, 4, 3), (8, 3, 5), (100, 2, 7), (5, 8, 2)])
@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("sampler_drop_last", [False, True])
def test_rank_stream_is_what_each_ranks_dataloader_yields(
    n: int, world: int, batch: int, drop_last: bool, sampler_drop_last: bool
) -> None:
    model = DistributedSamplerModel(n, world, 3, drop_last=sampler_drop_last)
    streams = Streams(model, JobShape(world, 1, batch, drop_last))
    for epoch in (0, 2):
        for rank in range(world):
            sampler: DistributedSampler[int] = DistributedSampler(
                Indices(n), num_replicas=world, rank=rank, seed=3, drop_last=sampler_drop_last
            )
            sampler.set_epoch(epoch)
            loader = DataLoader(Indices(n), batch_size=batch, sampler=sampler, drop_last=drop_last)
            want = [int(i) for b in loader for i in b]
            assert streams.rank_stream(epoch, rank).tolist() == want


def test_random_sampler_rank_stream_drops_the_partial_batch_like_dataloader() -> None:
    g = torch.Generator()
    g.manual_seed(21)
    loader = DataLoader(Indices(30), batch_size=4, shuffle=True, generator=g, drop_last=True)
    want = [[int(i) for b in loader for i in b] for _ in range(3)]
    streams = Streams(make_sampler("random", 30, seed=21, world_size=2), JobShape(2, 2, 4, True))
    for epoch in (1, 0, 2):
        assert streams.rank_stream(epoch, 1).tolist() == want[epoch]
        assert len(streams.node_stream(epoch, 0)) == 2 * 28


# ---- shapes, streams, inverse, counts -----------------------------------------------------------------


def test_job_shape_maps_ranks_to_nodes() -> None:
    contiguous = JobShape(8, 4, 1, False)
    assert contiguous.nodes == 2
    assert [contiguous.node_of_rank(r) for r in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert contiguous.ranks_of_node(1) == (4, 5, 6, 7)
    rr = JobShape(8, 4, 1, False, rank_order="round_robin")
    assert [rr.node_of_rank(r) for r in range(8)] == [0, 1, 0, 1, 0, 1, 0, 1]
    assert rr.ranks_of_node(1) == (1, 3, 5, 7)
    assert [rr.slot_of_rank(r) for r in rr.ranks_of_node(1)] == [0, 1, 2, 3]
    assert JobShape(4, 2, 1, False, rank_order="round-robin").rank_order == "round_robin"
    assert rr.rank_nodes().tolist() == [rr.node_of_rank(r) for r in range(8)]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"world_size": 6, "ranks_per_node": 4, "batch_size": 1, "drop_last": False},
        {"world_size": 0, "ranks_per_node": 1, "batch_size": 1, "drop_last": False},
        {"world_size": 2, "ranks_per_node": 1, "batch_size": 0, "drop_last": False},
        {"world_size": 2, "ranks_per_node": 1, "batch_size": 1, "drop_last": False, "rank_order": "random"},
    ],
)
def test_bad_job_shapes_raise_valueerror(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        JobShape(**kwargs)  # type: ignore[arg-type]


def test_sampler_and_shape_must_agree_on_world_size() -> None:
    with pytest.raises(ValueError, match="ranks"):
        Streams(DistributedSamplerModel(10, 4, 0), JobShape(2, 1, 1, False))


def test_node_stream_interleaves_batches_in_step() -> None:
    model = make_sampler("sequential", 10, seed=0, world_size=2)
    streams = Streams(model, JobShape(2, 2, 4, False))
    # both ranks read 0..9; batches [0..3] [4..7] [8, 9]
    assert streams.node_stream(0, 0).tolist() == [0, 1, 2, 3, 0, 1, 2, 3, 4, 5, 6, 7, 4, 5, 6, 7, 8, 9, 8, 9]


def test_padding_duplicates_are_flagged_and_counted_twice() -> None:
    # n=5 over 4 ranks: total 8, so 3 files are read twice
    model = DistributedSamplerModel(5, 4, 0)
    streams = Streams(model, JobShape(4, 2, 1, False))
    inv = streams.epoch_inverse(0)
    order = model.epoch_order(0)
    padded = set(order[5:].tolist())
    assert set(np.flatnonzero(inv.duplicated).tolist()) == padded
    counts = streams.node_counts(range(1))
    assert counts.sum(axis=0).tolist() == [2 if f in padded else 1 for f in range(5)]
    assert counts.sum() == 8


def test_node_counts_match_node_streams_over_epochs() -> None:
    for sampler_drop_last, drop_last in [(False, False), (True, True), (False, True)]:
        model = DistributedSamplerModel(203, 12, 5, drop_last=sampler_drop_last)
        for order in ("contiguous", "round_robin"):
            streams = Streams(model, JobShape(12, 3, 4, drop_last, order))
            want = ref_node_counts(streams, range(2, 6))
            np.testing.assert_array_equal(streams.node_counts(range(2, 6)), want)
            with ThreadPoolExecutor(max_workers=2) as pool:
                np.testing.assert_array_equal(streams.node_counts(range(2, 6), pool=pool, width=2), want)
            np.testing.assert_array_equal(streams.node_counts(range(2, 6), node=3), want[3])


def test_node_counts_with_many_nodes_and_padding() -> None:
    """More nodes than the per-node compare path handles: the scatter path, plus padding."""
    model = DistributedSamplerModel(150, 100, 1)
    streams = Streams(model, JobShape(100, 1, 2, True))
    np.testing.assert_array_equal(streams.node_counts(range(3)), ref_node_counts(streams, range(3)))


def test_node_counts_shared_order() -> None:
    model = make_sampler("list", 6, seed=0, world_size=4, order=np.array([5, 1, 5, 0]))
    streams = Streams(model, JobShape(4, 2, 3, True))  # opens [5, 1, 5] per rank
    counts = streams.node_counts(range(3))
    assert counts.tolist() == [[0, 6, 0, 0, 0, 12]] * 2
    np.testing.assert_array_equal(counts, ref_node_counts(streams, range(3)))
    np.testing.assert_array_equal(streams.node_counts(range(3), node=1), counts[1])


def test_node_counts_refuse_to_overflow_uint16() -> None:
    streams = Streams(make_sampler("sequential", 4, seed=0, world_size=2), JobShape(2, 2, 1, False))
    assert streams.node_counts(range(32767)).max() == 2 * 32767
    with pytest.raises(ValueError, match="65535"):
        streams.node_counts(range(32768))


def _square(i: int) -> int:
    return i * i


class KeepingPool:
    """A real ThreadPoolExecutor that keeps every task placement submits to it."""

    def __init__(self, pool: ThreadPoolExecutor) -> None:
        self.pool = pool
        self.tasks: list[Future[Any]] = []

    def map(self, fn: Callable[[A], T], iterable: Iterable[A], /) -> Iterator[T]:
        return self.pool.map(fn, iterable)

    def submit(self, fn: Callable[[], T], /) -> Future[T]:
        task = self.pool.submit(fn)
        self.tasks.append(task)
        return task


def test_run_ahead_yields_in_order_and_leaves_nothing_running_when_left_early() -> None:
    """The calls computed ahead come back in their turn, the same with a pool as without; a loop
    left early (node_counts refusing to overflow) cancels what has not started and waits for the
    rest, so that nothing placement submitted outlives the call that submitted it."""
    inline = [functools.partial(_square, i) for i in range(12)]
    ahead = [functools.partial(_square, i) if i % 3 else None for i in range(12)]
    want = [i * i for i in range(12)]
    assert list(run_ahead(inline, ahead, None, 4)) == want
    with ThreadPoolExecutor(max_workers=1) as pool:
        keeping = KeepingPool(pool)
        assert list(run_ahead(inline, ahead, keeping, 4)) == want
        assert len(keeping.tasks) == 8  # every i % 3 != 0
        keeping.tasks.clear()
        early = run_ahead(inline, ahead, keeping, 4)
        assert next(early) == 0
        early.close()
        assert len(keeping.tasks) == 4 and all(t.done() for t in keeping.tasks)


def test_generic_sampler_models_work_through_the_protocol() -> None:
    inner = DistributedSamplerModel(31, 4, 9)
    shape = JobShape(4, 2, 3, True)
    fast, generic = Streams(inner, shape), Streams(OnlyTheProtocol(inner), shape)
    for epoch in (0, 1):
        for r in range(4):
            np.testing.assert_array_equal(generic.rank_stream(epoch, r), fast.rank_stream(epoch, r))
        for k in range(2):
            np.testing.assert_array_equal(generic.node_stream(epoch, k), fast.node_stream(epoch, k))
        check_inverse(generic, epoch)
    np.testing.assert_array_equal(generic.node_counts(range(3)), fast.node_counts(range(3)))


def test_only_a_couple_of_epochs_are_held() -> None:
    model = DistributedSamplerModel(1000, 4, 0, cache_epochs=2)
    streams = Streams(model, JobShape(4, 2, 8, False), cache_epochs=2)
    for epoch in range(6):
        streams.epoch_inverse(epoch)
        streams.node_stream(epoch, 1)
    assert len(streams._inverses) <= 2
    assert len(model._cache) <= 2


# ---- properties over random jobs ---------------------------------------------------------------------


@st.composite
def jobs(draw: st.DrawFn) -> tuple[Streams, int]:
    nodes = draw(st.integers(1, 4))
    rpn = draw(st.integers(1, 4))
    world = nodes * rpn
    n = draw(st.integers(1, 120))
    kind = draw(st.sampled_from(["distributed", "distributed", "random", "sequential", "list"]))
    order = None
    if kind == "list":
        order = np.array(draw(st.lists(st.integers(0, n - 1), max_size=40)), dtype=np.int64)
    model = make_sampler(
        kind,
        n,
        seed=draw(st.integers(-(2**63), 2**64 - 8)),  # seed + epoch stays in torch's range
        world_size=world,
        shuffle=draw(st.booleans()),
        sampler_drop_last=draw(st.booleans()),
        order=order,
        backend="numpy",
    )
    shape = JobShape(
        world,
        rpn,
        draw(st.integers(1, 6)),
        draw(st.booleans()),
        draw(st.sampled_from(["contiguous", "round_robin"])),
    )
    return Streams(model, shape), draw(st.integers(0, 3))


@settings(max_examples=60, deadline=None)
@given(job=jobs())
def test_every_file_is_read_once_per_epoch_plus_padding(job: tuple[Streams, int]) -> None:
    streams, epoch = job
    model = streams.sampler
    world = streams.shape.world_size
    reads = np.zeros(streams.n, dtype=np.int64)
    for r in range(world):
        stream = streams.rank_stream(epoch, r)
        assert stream.shape == (streams.length,)
        reads += np.bincount(stream, minlength=streams.n)
    if isinstance(model, DistributedSamplerModel):
        # file f sits at position i of the permutation; padding repeats the permutation cyclically
        perm = randperm(model.n, model.epoch_seed(epoch)) if model.shuffle else np.arange(model.n)
        perm_pos = np.empty(streams.n, dtype=np.int64)
        perm_pos[perm] = np.arange(model.n)
        opened = streams.length * world
        if opened == model.total_size:
            total = model.total_size
            expected = total // streams.n + (perm_pos < total % streams.n)
            if total < streams.n:  # sampler drop_last truncated: the tail is never read
                expected = (perm_pos < total).astype(np.int64)
            np.testing.assert_array_equal(reads, expected)
        else:  # the DataLoader dropped each rank's partial batch: fewer reads, never more
            assert reads.sum() == opened
            assert (reads <= model.total_size // streams.n + 1).all()
    else:  # every rank reads the whole shared order
        order = np.asarray(model.rank_indices(epoch, 0))[: streams.length]
        np.testing.assert_array_equal(reads, world * np.bincount(order, minlength=streams.n))


@settings(max_examples=60, deadline=None)
@given(job=jobs())
def test_inverse_lookup_agrees_with_the_streams(job: tuple[Streams, int]) -> None:
    check_inverse(*job)


@settings(max_examples=60, deadline=None)
@given(job=jobs())
def test_node_stream_merges_its_ranks_streams_batch_by_batch(job: tuple[Streams, int]) -> None:
    streams, epoch = job
    for k in range(streams.shape.nodes):
        got = streams.node_stream(epoch, k).tolist()
        assert got == ref_node_stream(streams, epoch, k)
        ranks = streams.shape.ranks_of_node(k)
        assert sorted(got) == sorted(
            itertools.chain.from_iterable(streams.rank_stream(epoch, r).tolist() for r in ranks)
        )


@settings(max_examples=40, deadline=None)
@given(job=jobs())
def test_node_counts_are_the_node_streams_counted(job: tuple[Streams, int]) -> None:
    streams, epoch = job
    epochs = range(epoch, epoch + 2)
    want = ref_node_counts(streams, epochs)
    np.testing.assert_array_equal(streams.node_counts(epochs), want)
    np.testing.assert_array_equal(streams.node_counts(epochs, node=streams.shape.nodes - 1), want[-1])


@pytest.mark.slow
def test_imagenet_scale_counts_are_consistent() -> None:
    """1.28M files, 16 nodes x 4 ranks: each epoch every file is read once, pads aside."""
    n = 1_281_167
    model = DistributedSamplerModel(n, 64, 0)
    streams = Streams(model, JobShape(64, 4, 256, True))
    counts = streams.node_counts(range(3))
    per_epoch = streams.length * 64
    assert int(counts.sum()) == 3 * per_epoch
    assert int(counts.sum(axis=0).max()) <= 3
    node = streams.node_counts(range(3), node=5)
    np.testing.assert_array_equal(node, counts[5])
    inv = streams.epoch_inverse(1)
    stream = streams.node_stream(1, 5)
    np.testing.assert_array_equal(inv.nodes_of(stream), 5)
    np.testing.assert_array_equal(inv.node_positions(stream), np.arange(stream.size))
