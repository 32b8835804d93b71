"""The cursor places opens in the predicted streams despite DataLoader reordering and rank drift.

Open orders come from the exact sampler models (verified against torch in test_samplers) and a
simulator of what a DataLoader with W workers and prefetch_factor pf does to them: batch k goes to
worker k % W, at most W*pf batches are in flight, workers interleave arbitrarily, and ranks of a
node drift up to one step apart.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from placement.cursor import CursorSettings, NodeCursor
from placement.jobstreams import DatasetStreams, JobStreams
from placement.samplers import make_sampler
from placement.streams import JobShape, Streams


def job(n_train: int, n_val: int, seed: int, world: int, per_node: int, batch: int, epochs: int) -> JobStreams:
    shape = JobShape(world, per_node, batch, drop_last=False)
    train = Streams(make_sampler("distributed", n_train, seed=seed, world_size=world), shape)
    parts = [DatasetStreams(train, 0)]
    if n_val:
        val = Streams(make_sampler("distributed", n_val, seed=0, world_size=world, shuffle=False), shape)
        parts.append(DatasetStreams(val, n_train, follows=0))
    return JobStreams(parts, shape, epochs)


def loader_opens(stream: list[int], batch: int, workers: int, prefetch: int, rng: random.Random) -> list[int]:
    """The order a DataLoader's workers open ``stream``'s files in."""
    batches = [stream[i : i + batch] for i in range(0, len(stream), batch)]
    if workers == 0:
        return list(stream)
    queues: list[list[tuple[int, int]]] = [[] for _ in range(workers)]  # (batch, file) issued, per worker
    remaining = [len(b) for b in batches]
    issued = consumed = 0
    out: list[int] = []
    while consumed < len(batches):
        while issued < len(batches) and issued < consumed + workers * prefetch:
            queues[issued % workers].extend((issued, f) for f in batches[issued])
            issued += 1
        busy = [w for w in range(workers) if queues[w]]
        w = rng.choice(busy)
        k, f = queues[w].pop(0)
        out.append(f)
        remaining[k] -= 1
        while consumed < len(batches) and remaining[consumed] == 0:
            consumed += 1
    return out


def node_opens(js: JobStreams, node: int, epochs: range, workers: int, rng: random.Random) -> list[int]:
    """All opens of a node's ranks over ``epochs``, ranks drifting up to one step apart."""
    b = js.shape.batch_size
    out: list[int] = []
    for e in epochs:
        emap = js.epoch_map(e)
        per_rank = {r: loader_opens(emap.streams[r].tolist(), b, workers, 2, rng) for r in js.shape.ranks_of_node(node)}
        done = dict.fromkeys(per_rank, 0)
        while any(done[r] < len(per_rank[r]) for r in per_rank):
            live = [r for r in per_rank if done[r] < len(per_rank[r])]
            lead = min(done[r] for r in live) // b
            r = rng.choice([r for r in live if done[r] // b <= lead + 1])
            out.append(per_rank[r][done[r]])
            done[r] += 1
    return out


def settings(batch: int, workers: int) -> CursorSettings:
    return CursorSettings.for_job(batch_size=batch, num_workers=workers, prefetch_factor=2)


@pytest.mark.parametrize(("world", "per_node", "node"), [(2, 2, 0), (4, 2, 1), (6, 3, 1)])
def test_every_open_is_predicted_with_reordering_and_drift(world: int, per_node: int, node: int) -> None:
    js = job(1200, 120, seed=42, world=world, per_node=per_node, batch=16, epochs=3)
    cur = NodeCursor(js, settings(16, 2))
    opens = node_opens(js, node, range(3), workers=2, rng=random.Random(1))
    hits = [cur.observe(g) for g in opens]
    assert cur.state == "tracking" and cur.node == node and cur.epoch == 2
    assert cur.hit_rate == 1.0, hits.index(False)
    assert sorted(cur.tracks) == list(js.shape.ranks_of_node(node))


def test_opens_before_the_plan_do_not_stall_a_short_epoch() -> None:
    """The seed's plan arrives after the job's first opens (the seed is written as training starts): those
    positions are never consumed.  In an epoch shorter than two windows nothing else releases the watermark
    they hold back, and the cursor must still follow each rank into the next epoch instead of declaring a
    mismatch at every epoch's end (the demo's size: 440 positions per rank, window 336)."""
    js = job(800, 80, seed=7, world=2, per_node=2, batch=32, epochs=3)
    cur = NodeCursor(js, settings(32, 2))
    assert js.epoch_map(0).length(0) < 2 * cur.settings.window
    cur.presume(0, 0)
    opens = node_opens(js, 0, range(3), workers=2, rng=random.Random(0))
    for g in opens[40:]:
        cur.observe(g)
    assert cur.first_mismatch_open is None, cur.mismatch_reason
    assert cur.hit_rate == 1.0  # the opens that confirmed the presumed position are credited
    assert cur.state == "tracking" and cur.epoch == 2


def test_wrong_seed_is_flagged_within_workers_times_batch_opens() -> None:
    truth = job(2000, 0, seed=7, world=2, per_node=2, batch=32, epochs=3)
    planned = job(2000, 0, seed=8, world=2, per_node=2, batch=32, epochs=3)
    cur = NodeCursor(planned, settings(32, 2))
    opens = node_opens(truth, 0, range(1), workers=2, rng=random.Random(2))
    for g in opens[: 2 * 32]:  # num_workers x batch_size opens
        cur.observe(g)
    assert cur.state == "mismatch", "not flagged within num_workers x batch_size opens"
    assert cur.first_mismatch_open is not None and cur.first_mismatch_open <= 2 * 32
    assert "wrong seed" in (cur.mismatch_reason or "")
    assert cur.hit_rate < 0.5


def test_resumed_job_is_detected_at_its_epoch() -> None:
    js = job(1500, 0, seed=3, world=2, per_node=2, batch=16, epochs=5)
    cur = NodeCursor(js, settings(16, 2))
    opens = node_opens(js, 0, range(2, 4), workers=2, rng=random.Random(3))
    for g in opens:
        cur.observe(g)
    assert cur.state == "tracking" and cur.epoch == 3
    assert cur.hit_rate >= 0.999


def test_rewritten_seed_mid_run_recovers_by_redetection() -> None:
    """Opens that stop matching are flagged, and re-detected once they match another epoch."""
    js = job(1000, 0, seed=5, world=1, per_node=1, batch=8, epochs=6)
    cur = NodeCursor(js, settings(8, 0))
    for g in js.epoch_map(0).streams[0][:300]:
        cur.observe(int(g))
    assert cur.epoch == 0 and cur.state == "tracking"
    for g in js.epoch_map(4).streams[0]:  # the job restarted from a checkpoint at epoch 4
        cur.observe(int(g))
    assert cur.state == "tracking" and cur.epoch == 4


def test_upcoming_lists_what_is_opened_next() -> None:
    js = job(900, 90, seed=11, world=2, per_node=2, batch=8, epochs=2)
    cur = NodeCursor(js, settings(8, 2))
    opens = node_opens(js, 0, range(2), workers=2, rng=random.Random(4))
    for i, g in enumerate(opens[:-64]):
        cur.observe(g)
        if i > 16 and i % 97 == 0:
            ahead = {gid for _e, gid in cur.upcoming(200)}
            assert set(opens[i + 1 : i + 40]) <= ahead
    tail = [gid for _e, gid in cur.upcoming(10_000)]
    assert set(opens[-64:]) <= set(tail)


def test_val_after_train_is_part_of_the_epoch() -> None:
    js = job(300, 50, seed=1, world=1, per_node=1, batch=10, epochs=2)
    emap = js.epoch_map(0)
    assert emap.length(0) == 350
    assert set(emap.streams[0][300:].tolist()) == set(range(300, 350))
    assert (np.sort(emap.streams[0][:300]) == np.arange(300)).all()


def cached_epochs(js: JobStreams) -> set[int]:
    return {e for e in range(js.epochs) if js.has_epoch_map(e)}


def test_quick_observation_builds_no_epoch_map_and_places_like_observe() -> None:
    """What the daemon places on its FUSE thread never builds a permutation, and places as observe() does.

    Five epochs through a three-epoch map cache, so maps are evicted and rebuilt along the way: those
    builds must all fall to the caller's slow path.  Most opens must still be quick, or the daemon
    would hop to a thread for every batch again.
    """
    opens = node_opens(job(1200, 0, 9, 2, 2, 16, 5), 0, range(5), workers=2, rng=random.Random(5))
    plain = NodeCursor(job(1200, 0, 9, 2, 2, 16, 5), settings(16, 2))
    for g in opens:
        plain.observe(g)
    js = job(1200, 0, 9, 2, 2, 16, 5)
    cur = NodeCursor(js, settings(16, 2))
    quick = 0
    for start in range(0, len(opens), 10):
        batch = opens[start : start + 10]
        before = cached_epochs(js)
        observed, _predicted = cur.observe_while_quick(batch)
        assert cached_epochs(js) <= before, f"an epoch map was built inline at open {start + observed}"
        quick += observed
        for g in batch[observed:]:  # the daemon's worker thread
            cur.observe(g)
    assert (cur.state, cur.epoch, cur.opens, cur.hits) == (plain.state, plain.epoch, plain.opens, plain.hits)
    assert plain.hit_rate == 1.0
    assert quick > 0.9 * len(opens), f"only {quick} of {len(opens)} opens were placed inline"


def test_quick_observation_leaves_a_detection_retry_to_the_caller() -> None:
    """In a mismatch, opens are quick up to the one that retries detection (which scans every epoch)."""
    truth = job(2000, 0, seed=7, world=2, per_node=2, batch=32, epochs=3)
    cur = NodeCursor(job(2000, 0, seed=8, world=2, per_node=2, batch=32, epochs=3), settings(32, 2))
    opens = node_opens(truth, 0, range(3), workers=2, rng=random.Random(6))
    observed, _ = cur.observe_while_quick(opens)
    assert observed == 0 and cur.state == "detecting"  # detection itself is never inline
    for g in opens[:64]:
        cur.observe(g)
    assert cur.state == "mismatch"
    observed, predicted = cur.observe_while_quick(opens[64:])
    assert 0 < observed < len(opens) - 64 and predicted == 0
    assert cur.opens + 1 == cur.retry_after, "stopped anywhere but right before the retry"
