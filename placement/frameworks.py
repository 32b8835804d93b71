"""What the data loaders of training frameworks read, rank by rank and epoch by epoch.

Models of the samplers ``accelerate`` 1.15 and ``torchdata`` 0.11 build, bit for bit (the tests
compare them with the installed packages), next to :mod:`placement.samplers`'s plain PyTorch ones:

* accelerate, ``use_seedable_sampler=True`` (:class:`AccelerateSeedableModel`): the DataLoader's
  RandomSampler becomes ``SeedableRandomSampler``, which reseeds a generator with
  ``initial_seed + epoch`` at every ``iter()`` (``initial_seed``: ``data_seed`` if given, else
  ``torch.random.initial_seed()``, i.e. set_seed's value) and yields ``randperm(n)`` from it: the
  permutation ``DistributedSampler(seed=S)`` draws for that epoch.  ``BatchSamplerShard`` shards it
  by *batches*, not samples: the global BatchSampler cuts the permutation into batches and batch k
  goes to process ``k % P`` (``split_batches=True``: every global batch is cut into P slices
  instead), with accelerate's tail rules (``even_batches`` completes the last round from the
  epoch's first P batches; see :func:`batch_shard`).  The prepared loader sets the sampler's epoch
  to its count of *completed* iterations, so an epoch broken off early is followed by the same
  order again (``repeats_unfinished``).
* accelerate's default ``prepare()`` and torchdata's ``RandomSampler`` (:class:`GeneratorStreamModel`):
  one ``torch.Generator``, seeded once (accelerate: at prepare(), from rank 0's global RNG, state
  broadcast from rank 0 at every ``iter()``; torchdata: at the sampler's construction), runs on
  across epochs.  torch's RandomSampler draws ``randperm(n)`` per epoch and, when iterated to the
  end, a second, discarded one; torchdata's draws one per ``iter()``, eagerly.  A DataLoader given
  that generator also draws its workers' base seed (one int64: two draws) from it at every
  ``iter()``: before the (lazy) permutation in torch, after the (eager) one in torchdata.
  Predictable from the generator's *initial seed* only, which a user must print and write
  (accelerate: rank 0's ``loader.synchronized_generator.initial_seed()`` after prepare();
  torchdata: ``loader.sampler.generator.initial_seed()``): set_seed's value does not decide it.

Every model answers ``rank_indices(epoch, rank)`` exactly and ``epoch_layout(epoch)`` in the
compact form :mod:`placement.streams` builds on: a batch-sharded epoch is written as the strided
order whose entry ``t * P + r`` is rank r's t-th index (the DistributedSampler form), over the
entries every rank reads (``even_batches=False`` can leave some ranks a batch more: those are left
out of the layout, a partial batch per epoch at most).  ``positions`` (a template) maps each rank
entry to its place in the epoch's permutation, the same every epoch: a layout is one gather.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Literal

import numpy as np
import numpy.typing as npt

from placement.randperm import (
    Backend,
    IndexArray,
    check_seed,
    open_stream,
    randperm,
    randperm_draws,
    resolve_backend,
)
from placement.samplers import (
    LRU,
    SAMPLER_KINDS,
    DistributedSamplerModel,
    EpochLayout,
    EpochStreams,
    SamplerModel,
    SequentialSamplerModel,
    check_epoch,
    check_n,
    check_rank,
    check_world,
    frozen,
    make_sampler,
)

Sharding = Literal["batch", "shared"]

FRAMEWORK_KINDS = ("accelerate", "accelerate_default", "torchdata_random")
"""The config's ``datasets[].sampler.kind`` values modelled here (the others: :mod:`placement.samplers`)."""

UNPREDICTABLE = {
    "accelerate_default": (
        "unpredictable: accelerate default sampler; use use_seedable_sampler=True and write set_seed's value "
        "(or write rank 0's loader.synchronized_generator.initial_seed() after prepare())"
    ),
    "torchdata_random": (
        "unpredictable: torchdata RandomSampler (StatefulDataLoader(shuffle=True)) seeds its generator from the "
        "global RNG; give the loader generator=torch.Generator().manual_seed(S) and write S, or write "
        "loader.sampler.generator.initial_seed()"
    ),
}
"""What to tell a user whose opens refute the seed written for a sampler of these kinds: they are
predictable only from a generator seed that no script states, so a refuted seed is the expected case."""

BASE_SEED_DRAWS = 2  # the workers' base seed: one int64 random_() on the loader's generator


# --------------------------------------------------------------------------------------------
# BatchSamplerShard
# --------------------------------------------------------------------------------------------


def batch_shard(
    total: int,
    batch_size: int,
    world_size: int,
    *,
    drop_last: bool = False,
    even_batches: bool = True,
    split_batches: bool = False,
) -> tuple[list[IndexArray], list[int]]:
    """Where each process's entries sit in the global order: accelerate 1.15's ``BatchSamplerShard``.

    ``total`` entries of one global order (the sampler's), a DataLoader ``BatchSampler`` over it
    with ``drop_last``, sharded over ``world_size`` processes.  ``batch_size`` is what each process
    yields per batch: the DataLoader's batch size, or with ``split_batches`` that batch size divided
    by the number of processes.  Returns, per process, the positions in the global order of what it
    yields, in order, and how many of them come before any padding (``even_batches`` repeats the
    start of the epoch to complete the last round).  Mirrors ``_iter_with_no_split`` and
    ``_iter_with_split`` (accelerate/data_loader.py) case by case.
    """
    for name, value in (("total", total), ("batch_size", batch_size), ("world_size", world_size)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"{name}: expected a positive integer, got {value!r}")
    n, b, p = int(total), int(batch_size), int(world_size)
    order = np.arange(n, dtype=np.int64)
    big = b * p  # split: the DataLoader's (global) batch; no split: one round of batches
    full = n // big  # split: full global batches; no split: full rounds (see below)
    if not split_batches:
        full = (n // b) // p  # rounds whose P batches are all full: yielded inside the loop
    head = order[: full * big].reshape(full, p, b)
    rows: list[list[IndexArray]] = [[head[:, r, :].reshape(-1)] for r in range(p)]
    real = [full * b] * p
    tails = (
        _split_tail(n, b, p, drop_last, even_batches)
        if split_batches
        else _round_tail(n, b, p, full, drop_last, even_batches)
    )
    for r, (tail, count) in enumerate(tails):
        if tail.shape[0]:
            rows[r].append(tail)
            real[r] += count
    return [np.concatenate(parts) for parts in rows], real


def _round_tail(
    n: int, b: int, p: int, rounds: int, drop_last: bool, even_batches: bool
) -> list[tuple[IndexArray, int]]:
    """``_iter_with_no_split`` after its loop: the batches of the last, incomplete round."""
    none = np.zeros(0, dtype=np.int64)
    out = [(none, 0) for _ in range(p)]
    if drop_last:
        return out  # the partial batch and an incomplete round are dropped
    full_batches, rem = divmod(n, b)
    batches = full_batches + (rem > 0)

    def batch(k: int) -> IndexArray:
        return np.arange(k * b, min((k + 1) * b, n), dtype=np.int64)

    first = rounds * p  # batch index of the incomplete round's first batch
    for k in range(first, batches):
        if not even_batches or k < full_batches:  # even_batches yields only full ones here
            got = batch(k)
            out[k % p] = (got, int(got.shape[0]))
    if not even_batches:
        return out
    initial = np.arange(min(n, p * b), dtype=np.int64)  # the first P batches' indices
    while initial.shape[0] < p * b:  # fewer samples than one round: doubled, as accelerate does
        initial = np.concatenate([initial, initial])
    if rem == 0:
        idx, pending = batches, none  # the last batch was full and has been yielded
    else:
        idx, pending = batches - 1, batch(batches - 1)
    cycle = 0
    while idx % p or pending.shape[0]:
        need = b - pending.shape[0]
        done = np.concatenate([pending, initial[cycle : cycle + need]])
        out[idx % p] = (done, int(pending.shape[0]))
        cycle += need
        pending = none
        idx += 1
    return out


def _split_tail(n: int, b: int, p: int, drop_last: bool, even_batches: bool) -> list[tuple[IndexArray, int]]:
    """``_iter_with_split`` after its loop: the slices of the last, partial global batch."""
    big = b * p
    none = np.zeros(0, dtype=np.int64)
    out = [(none, 0) for _ in range(p)]
    rem = n % big
    if drop_last or rem == 0:
        return out
    last = np.arange(n - rem, n, dtype=np.int64)
    if not even_batches:
        for r in range(p):
            if rem > b * r:
                piece = last[b * r : b * (r + 1)]
                out[r] = (piece, int(piece.shape[0]))
        return out
    initial = np.arange(min(n, big), dtype=np.int64)  # the first global batch
    while initial.shape[0] < big:
        initial = np.concatenate([initial, initial])
    padded = np.concatenate([last, initial])
    for r in range(p):
        out[r] = (padded[b * r : b * (r + 1)], max(0, min(b, rem - b * r)))
    return out


class Sharding2D:
    """A sharding of an epoch's global order, the same every epoch: rank r's entry t reads
    ``order[rows[r][t]]``.  ``length``: entries every rank reads (the layout's); ``distinct``: how
    many leading entries of the strided layout are free of padding (pairwise distinct files)."""

    def __init__(self, rows: list[IndexArray], real: list[int]) -> None:
        self.rows = [frozen(r.copy()) for r in rows]
        self.lengths = tuple(int(r.shape[0]) for r in rows)
        self.length = min(self.lengths)
        world = len(rows)
        strided = np.empty(self.length * world, dtype=np.int64)
        for r, row in enumerate(rows):
            strided[r::world] = row[: self.length]
        self.strided = frozen(strided)
        firsts = [c * world + r for r, c in enumerate(real) if c < self.length]
        self.distinct = min(firsts, default=self.length * world)

    def layout(self, order: IndexArray) -> EpochLayout:
        return EpochLayout(order=frozen(order[self.strided]), shared=False, distinct=self.distinct)

    def rank(self, order: IndexArray, rank: int) -> IndexArray:
        return frozen(order[self.rows[rank]])


# --------------------------------------------------------------------------------------------
# Models
# --------------------------------------------------------------------------------------------


class AccelerateSeedableModel:
    """accelerate ``prepare()`` with ``DataLoaderConfiguration(use_seedable_sampler=True)``.

    ``seed``: set_seed's value (``torch.random.initial_seed()`` when prepare() ran), or ``data_seed``.
    ``batch_size``: what each process yields per batch (with ``split_batches`` the DataLoader was
    built with ``batch_size * world_size``).  ``drop_last``: the DataLoader's.  ``shuffle=False``:
    a DataLoader without shuffle (evaluation loaders), whose SequentialSampler accelerate keeps and
    shards by batches the same way.
    """

    kind = "accelerate"
    shared = False

    def __init__(
        self,
        n: int,
        world_size: int,
        seed: int,
        batch_size: int,
        *,
        shuffle: bool = True,
        drop_last: bool = False,
        even_batches: bool = True,
        split_batches: bool = False,
        backend: Backend = "auto",
        cache_epochs: int = 2,
    ) -> None:
        self.n = check_n(n)
        self.world_size = check_world(world_size)
        self.seed = check_seed(seed)
        self.batch_size = int(batch_size)
        self.shuffle = bool(shuffle)
        # The loader's epoch counts completed iterations only: a pass broken off early is followed by
        # the same order again (an unshuffled order is the same every pass anyway).
        self.repeats_unfinished = self.shuffle
        self.drop_last, self.even_batches, self.split_batches = bool(drop_last), bool(even_batches), bool(split_batches)
        self.backend = resolve_backend(backend) if self.shuffle else "numpy"
        rows, real = batch_shard(
            self.n,
            self.batch_size,
            self.world_size,
            drop_last=self.drop_last,
            even_batches=self.even_batches,
            split_batches=self.split_batches,
        )
        self.sharding = Sharding2D(rows, real)
        self._perms: LRU[int, IndexArray] = LRU(cache_epochs)

    def num_samples(self) -> int:
        """Entries every rank reads per epoch (``rank_lengths`` has each rank's own)."""
        return self.sharding.length

    def rank_lengths(self) -> tuple[int, ...]:
        return self.sharding.lengths

    def epoch_seed(self, epoch: int) -> int:
        return check_seed(self.seed + check_epoch(epoch))

    def epoch_permutation(self, epoch: int) -> IndexArray:
        """The epoch's global order before sharding: ``randperm(n)`` seeded ``seed + epoch``."""
        key = check_epoch(epoch) if self.shuffle else 0
        return self._perms.get(key, lambda: self._permutation(key))

    def _permutation(self, epoch: int) -> IndexArray:
        if not self.shuffle:
            return frozen(np.arange(self.n, dtype=np.int64))
        return frozen(randperm(self.n, self.epoch_seed(epoch), backend=self.backend))

    def epoch_layout(self, epoch: int) -> EpochLayout:
        return self.sharding.layout(self.epoch_permutation(epoch))

    def fresh_layout(self, epoch: int) -> EpochLayout:
        """:meth:`epoch_layout` without the cache: a pure function of the epoch, safe in threads."""
        return self.sharding.layout(self._permutation(check_epoch(epoch)))

    def rank_indices(self, epoch: int, rank: int) -> IndexArray:
        return self.sharding.rank(self.epoch_permutation(epoch), check_rank(rank, self.world_size))


class GeneratorStreamModel:
    """A sampler drawing every epoch's permutation from one generator that is never reseeded.

    ``seed``: the generator's initial seed.  ``before``/``after``: draws taken from the same
    generator at each ``iter()`` before and after the permutation the epoch reads, as (first
    epoch, later epochs): the workers' base seed when the loader was given this generator, a
    permutation drawn and thrown away (torch's RandomSampler when iterated to its end; torchdata's
    eager sampler iterator made twice by a multi-process iterator), nothing for the later epochs of
    persistent workers.  ``skip``: draws before epoch 0 (an epoch broken off early leaves torch's
    discarded permutation undrawn: every later epoch moves one permutation back).  ``sharding``:
    ``batch`` (accelerate's BatchSamplerShard, with its tail rules) or ``shared`` (every rank reads
    the whole order: a loader with no DistributedSampler).

    Epochs are reached from checkpoints of the stream (a few KiB each) by skipping draws, as
    :class:`placement.samplers.RandomSamplerModel` does.
    """

    shuffle = True
    repeats_unfinished = False
    phase = 0
    shifted: Callable[[], GeneratorStreamModel] | None = None
    """The same loader one broken-off epoch later (where that is a model of its own: accelerate's)."""

    def __init__(
        self,
        n: int,
        world_size: int,
        seed: int,
        *,
        kind: str,
        before: tuple[int, int] = (0, 0),
        after: tuple[int, int] = (0, 0),
        skip: int = 0,
        sharding: Sharding = "batch",
        batch_size: int = 1,
        drop_last: bool = False,
        even_batches: bool = True,
        split_batches: bool = False,
        backend: Backend = "auto",
        cache_epochs: int = 2,
        max_checkpoints: int = 64,
    ) -> None:
        self.n = check_n(n)
        self.world_size = check_world(world_size)
        self.seed = check_seed(seed)
        self.kind = kind
        if min(*before, *after, skip) < 0:
            raise ValueError("generator stream: draws before, after and skipped are >= 0")
        self.before, self.after, self.skip = before, after, skip
        self.backend = resolve_backend(backend)
        self.shared = sharding == "shared"
        self.sharding: Sharding2D | None = None
        if sharding == "batch":
            rows, real = batch_shard(
                self.n,
                int(batch_size),
                self.world_size,
                drop_last=drop_last,
                even_batches=even_batches,
                split_batches=split_batches,
            )
            self.sharding = Sharding2D(rows, real)
        elif sharding != "shared":
            raise ValueError(f"sharding: expected 'batch' or 'shared', got {sharding!r}")
        self.perm_draws = randperm_draws(self.n)
        start = open_stream(self.seed, self.backend)
        start.skip(skip)
        self._streams = EpochStreams(start, self.epoch_draws, max_checkpoints)
        self._perms: LRU[int, IndexArray] = LRU(cache_epochs)

    def num_samples(self) -> int:
        return self.n if self.sharding is None else self.sharding.length

    def rank_lengths(self) -> tuple[int, ...]:
        return (self.n,) * self.world_size if self.sharding is None else self.sharding.lengths

    def epoch_draws(self, epoch: int) -> int:
        """All draws of one full epoch's ``iter()``."""
        later = 1 if epoch else 0
        return self.before[later] + self.perm_draws + self.after[later]

    def epoch_permutation(self, epoch: int) -> IndexArray:
        """The order the sampler yields in ``epoch`` (every earlier epoch iterated to its end)."""
        epoch = check_epoch(epoch)

        def compute() -> IndexArray:
            later = 1 if epoch else 0
            stream = self._streams.at(epoch)
            stream.skip(self.before[later])
            perm = frozen(stream.randperm(self.n))
            if epoch + 1 not in self._streams:
                stream.skip(self.after[later])
                self._streams.remember(epoch + 1, stream)
            return perm

        return self._perms.get(epoch, compute)

    def epoch_layout(self, epoch: int) -> EpochLayout:
        perm = self.epoch_permutation(epoch)
        if self.sharding is None:
            return EpochLayout(order=perm, shared=True, distinct=self.n)
        return self.sharding.layout(perm)

    def rank_indices(self, epoch: int, rank: int) -> IndexArray:
        rank = check_rank(rank, self.world_size)
        perm = self.epoch_permutation(epoch)
        return perm if self.sharding is None else self.sharding.rank(perm, rank)


def accelerate_default(
    n: int,
    world_size: int,
    seed: int,
    batch_size: int,
    *,
    drop_last: bool = False,
    even_batches: bool = True,
    split_batches: bool = False,
    loader_generator: bool = False,
    persistent_workers: bool = False,
    phase: int = 0,
    backend: Backend = "auto",
) -> GeneratorStreamModel:
    """accelerate's default ``prepare()``: the RandomSampler's generator seeded ``seed`` (rank 0's
    ``loader.synchronized_generator.initial_seed()``), batch-sharded.

    torch's RandomSampler is lazy: ``randperm(n)`` when the first index is asked for, a second one
    when the pass ends.  ``loader_generator``: the DataLoader was built with ``generator=`` that same
    generator, so its base seed comes from it too (first, at ``iter()``).  ``phase``: how many epochs
    were broken off early, mod 2 (each leaves the second permutation undrawn; without base seed
    draws two such shifts add up to one full epoch)."""
    if phase not in (0, 1):
        raise ValueError(f"phase: expected 0 or 1, got {phase!r}")
    n = check_n(n)
    base = BASE_SEED_DRAWS if loader_generator else 0
    perm = randperm_draws(n)
    model = GeneratorStreamModel(
        n,
        world_size,
        seed,
        kind="accelerate_default",
        before=(base, 0 if persistent_workers else base),
        after=(perm, perm),
        skip=phase * (perm + (0 if persistent_workers else base)),
        sharding="batch",
        batch_size=batch_size,
        drop_last=drop_last,
        even_batches=even_batches,
        split_batches=split_batches,
        backend=backend,
    )
    model.phase = phase
    model.shifted = functools.partial(
        accelerate_default,
        n,
        world_size,
        seed,
        batch_size,
        drop_last=drop_last,
        even_batches=even_batches,
        split_batches=split_batches,
        loader_generator=loader_generator,
        persistent_workers=persistent_workers,
        phase=1 - phase,
        backend=backend,
    )
    return model


def torchdata_random(
    n: int,
    world_size: int,
    seed: int,
    *,
    num_workers: int = 0,
    loader_generator: bool = False,
    persistent_workers: bool = False,
    backend: Backend = "auto",
) -> GeneratorStreamModel:
    """torchdata ``StatefulDataLoader(shuffle=True)`` without a sampler: its RandomSampler's generator
    seeded ``seed`` (``loader.sampler.generator.initial_seed()``), every rank reading the whole order.

    Its sampler iterator draws ``randperm(n)`` when it is made.  A single-process loader makes one
    per ``iter()``, then draws the base seed (``loader_generator``: from this generator); a
    multi-process one makes one, draws the base seed, and makes the one it reads from (the first is
    thrown away); with persistent workers, later epochs make only the one they read."""
    n = check_n(n)
    if num_workers < 0:
        raise ValueError(f"num_workers: expected >= 0, got {num_workers}")
    if persistent_workers and num_workers == 0:
        raise ValueError("persistent_workers=True needs num_workers > 0 (DataLoader refuses it)")
    base = BASE_SEED_DRAWS if loader_generator else 0
    perm = randperm_draws(n)
    if num_workers == 0:
        before, after = (0, 0), (base, base)
    else:
        before = (perm + base, 0 if persistent_workers else perm + base)
        after = (0, 0)
    return GeneratorStreamModel(
        n, world_size, seed, kind="torchdata_random", before=before, after=after, sharding="shared", backend=backend
    )


FrameworkModel = AccelerateSeedableModel | GeneratorStreamModel


def epoch_permutation(model: SamplerModel, epoch: int) -> IndexArray | None:
    """The global order an epoch's ranks share out, before sharding (None: the model has none)."""
    if isinstance(model, (AccelerateSeedableModel, GeneratorStreamModel)):
        return model.epoch_permutation(epoch)
    if isinstance(model, DistributedSamplerModel) and model.shuffle:
        return randperm(model.n, model.epoch_seed(epoch), backend=model.backend)
    return None


# --------------------------------------------------------------------------------------------
# The config's sampler kinds
# --------------------------------------------------------------------------------------------


def build_sampler(
    kind: str,
    n: int,
    *,
    seed: int,
    world_size: int,
    batch_size: int = 1,
    drop_last: bool = False,
    shuffle: bool = True,
    sampler_drop_last: bool = False,
    even_batches: bool = True,
    split_batches: bool = False,
    loader_generator: bool = False,
    persistent_workers: bool = False,
    num_workers: int = 0,
    order: npt.ArrayLike | None = None,
    aug_repeats: float = 3,
    backend: Backend = "auto",
) -> SamplerModel:
    """The model for a config's ``datasets[].sampler``: every kind, the plain PyTorch ones through
    :func:`placement.samplers.make_sampler`.  ``batch_size``/``drop_last``: the job's DataLoader
    (batch-sharded kinds shard by it).  Raises ValueError with a one-line reason."""
    if kind == "accelerate":
        return AccelerateSeedableModel(
            n,
            world_size,
            seed,
            batch_size,
            shuffle=shuffle,
            drop_last=drop_last,
            even_batches=even_batches,
            split_batches=split_batches,
            backend=backend,
        )
    if kind == "accelerate_default":
        if not shuffle:
            raise ValueError("accelerate_default: a loader without shuffle has no generator: use kind 'accelerate'")
        return accelerate_default(
            n,
            world_size,
            seed,
            batch_size,
            drop_last=drop_last,
            even_batches=even_batches,
            split_batches=split_batches,
            loader_generator=loader_generator,
            persistent_workers=persistent_workers,
            backend=backend,
        )
    if kind == "torchdata_random":
        return torchdata_random(
            n,
            world_size,
            seed,
            num_workers=num_workers,
            loader_generator=loader_generator,
            persistent_workers=persistent_workers,
            backend=backend,
        )
    if kind not in SAMPLER_KINDS:
        raise ValueError(f"sampler kind: expected one of {', '.join(ALL_KINDS)}, got {kind!r}")
    return make_sampler(
        kind,
        n,
        seed=seed,
        world_size=world_size,
        shuffle=shuffle,
        sampler_drop_last=sampler_drop_last,
        persistent_workers=persistent_workers,
        num_workers=num_workers,
        order=order,
        aug_repeats=aug_repeats,
        backend=backend,
    )


def framework_alternatives(model: SamplerModel, batch_size: int, drop_last: bool) -> list[SamplerModel]:
    """Other samplers the same job may really run, cheap to try (a cursor's automatic variants).

    A shuffled DistributedSampler seeded S and accelerate's seedable sampler seeded S draw the same
    permutation every epoch and differ only in how they share it out (samples or batches), so a
    user who declared one while running the other is still followed; so are an unshuffled
    DistributedSampler and accelerate's unshuffled, batch-sharded evaluation loader.  accelerate's
    default sampler seeded G reads the seedable sampler's order in epoch 0 (G written as if it were
    set_seed's value), and after an epoch broken off early its stream shifts by one permutation
    (phase 1).  ``batch_size``/``drop_last``: the job's DataLoader.
    """
    if isinstance(model, DistributedSamplerModel) and model.world_size > 1:
        return [
            AccelerateSeedableModel(
                model.n,
                model.world_size,
                model.seed,
                batch_size,
                shuffle=model.shuffle,
                drop_last=drop_last,
                backend=model.backend,  # the daemon's plans use numpy: never import torch there for a variant
            )
        ]
    if isinstance(model, SequentialSamplerModel) and model.world_size > 1:
        return [AccelerateSeedableModel(model.n, model.world_size, 0, batch_size, shuffle=False, drop_last=drop_last)]
    if isinstance(model, AccelerateSeedableModel) and model.world_size > 1:
        if model.shuffle:
            return [DistributedSamplerModel(model.n, model.world_size, model.seed, backend=model.backend)]
        return [DistributedSamplerModel(model.n, model.world_size, 0, shuffle=False)]
    if isinstance(model, GeneratorStreamModel) and model.shifted is not None:
        seedable = AccelerateSeedableModel(
            model.n, model.world_size, model.seed, batch_size, drop_last=drop_last, backend=model.backend
        )
        return [model.shifted(), seedable] if model.world_size > 1 else [model.shifted()]
    return []


def unpredictable_reason(model: SamplerModel) -> str | None:
    """What to tell the user when opens refute the seed written for ``model``'s kind (None: a wrong
    seed is the likely cause, not the kind)."""
    kind = getattr(model, "kind", None)
    return UNPREDICTABLE.get(kind) if isinstance(kind, str) else None


ALL_KINDS = (*SAMPLER_KINDS, *FRAMEWORK_KINDS)
