"""What each rank's sampler yields per epoch, exactly as PyTorch 2.13 computes it.

Each model answers ``rank_indices(epoch, rank)``: the list ``iter(sampler)`` produces on that rank
in that epoch (before the DataLoader batches it).  The facts modelled (torch's
``utils/data/distributed.py``, ``dataloader.py`` and ``sampler.py``; the tests compare with real torch):

* ``DistributedSampler``: each ``__iter__`` seeds a fresh generator with ``seed + epoch``, takes
  ``randperm(n)``, pads it cyclically (or truncates with ``drop_last``) to
  ``num_samples * world_size`` and gives rank r the entries ``r::world_size``.
* ``DataLoader(shuffle=True, generator=G)`` in one process per rank: every ``iter(loader)`` first
  draws the workers' base seed from G (an int64 ``random_``: 2 draws), even with num_workers=0,
  except for epochs after the first with persistent workers; then ``RandomSampler`` yields
  ``randperm(n)`` and, when it is exhausted, computes and discards a second ``randperm(n)``.
  Every rank runs the same code with the same seed, so all ranks read the same order.
* sequential: ``0..n-1``; list: an order given by the user.
* timm's ``RepeatAugSampler`` (:class:`RepeatAugSamplerModel`): seeded by the epoch alone.
* timm's ``OrderedDistributedSampler`` (timm 1.0's ``timm/data/distributed_sampler.py``, the sampler
  of its distributed *validation* loader): rank r reads ``[i % n for i in range(r, total_size, R)]``
  with ``total_size = ceil(n / R) * R``: strided like an unshuffled DistributedSampler, padded
  cyclically from the start of the dataset, never truncated (it has no drop_last).

Models answer for any epoch in any order: per-epoch arrays are kept in a small LRU and the
random sampler keeps generator checkpoints, so long jobs never hold every epoch at once.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar, runtime_checkable

import numpy as np
import numpy.typing as npt

from placement.randperm import (
    Backend,
    IndexArray,
    Mt19937Stream,
    TorchGeneratorStream,
    check_seed,
    open_stream,
    randperm,
    randperm_at,
    randperm_draws,
    resolve_backend,
)

SAMPLER_KINDS = ("distributed", "random", "sequential", "list", "ordered_distributed", "repeat_aug")
BASE_SEED_DRAWS = 2  # torch.empty((), dtype=torch.int64).random_(generator=G): one random64()

UNPREDICTABLE_RANDOM = (
    "sampler 'random' without a seeded generator: DataLoader(shuffle=True) with generator=None "
    "draws its order from torch's global RNG, which a seed cannot predict; pass "
    "generator=torch.Generator().manual_seed(S) to the DataLoader and write S to .control/seed"
)


@runtime_checkable
class SamplerModel(Protocol):
    """The per-rank index lists of one sampler setup, for every epoch."""

    n: int
    world_size: int

    def rank_indices(self, epoch: int, rank: int) -> IndexArray:
        """What ``iter(sampler)`` yields on ``rank`` in ``epoch``."""
        ...

    def num_samples(self) -> int:
        """Entries per rank and epoch, before the DataLoader's drop_last."""
        ...


@dataclass(frozen=True, eq=False)
class EpochLayout:
    """One epoch of a sampler in the compact form :mod:`placement.streams` builds on.

    ``shared``: every rank reads ``order[:num_samples]``.  Otherwise rank r reads
    ``order[r::world_size][:num_samples]`` (the DistributedSampler layout).  The first
    ``distinct`` entries of ``order`` are known to be pairwise different, which lets inverse
    lookups and counts skip duplicate handling there.
    """

    order: IndexArray
    shared: bool
    distinct: int


@runtime_checkable
class HasEpochLayout(Protocol):
    def epoch_layout(self, epoch: int) -> EpochLayout: ...


K = TypeVar("K")
V = TypeVar("V")


class LRU(Generic[K, V]):
    """A tiny least-recently-used memo: per-epoch arrays are large, keep only a couple."""

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError(f"cache size: expected >= 1, got {size}")
        self.size = size
        self._items: OrderedDict[K, V] = OrderedDict()

    def get(self, key: K, make: Callable[[], V]) -> V:
        if key in self._items:
            self._items.move_to_end(key)
            return self._items[key]
        value = make()
        self._items[key] = value
        while len(self._items) > self.size:
            self._items.popitem(last=False)
        return value

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: object) -> bool:
        return key in self._items


def frozen(a: npt.NDArray[np.int64]) -> IndexArray:
    """Cached arrays are handed out many times: make accidental writes fail loudly."""
    a.setflags(write=False)
    return a


def check_n(n: int) -> int:
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"n: expected a dataset of at least 1 file, got {n!r}")
    return int(n)


def check_world(world_size: int) -> int:
    if isinstance(world_size, bool) or not isinstance(world_size, (int, np.integer)) or world_size < 1:
        raise ValueError(f"world_size: expected a positive integer, got {world_size!r}")
    return int(world_size)


def check_epoch(epoch: int) -> int:
    if isinstance(epoch, bool) or not isinstance(epoch, (int, np.integer)) or epoch < 0:
        raise ValueError(f"epoch: expected a non-negative integer, got {epoch!r}")
    return int(epoch)


def check_rank(rank: int, world_size: int) -> int:
    if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)) or not 0 <= rank < world_size:
        raise ValueError(f"rank: expected 0..{world_size - 1}, got {rank!r}")
    return int(rank)


class DistributedSamplerModel:
    """``DistributedSampler(dataset, world_size, rank, shuffle, seed, drop_last)`` with set_epoch."""

    def __init__(
        self,
        n: int,
        world_size: int,
        seed: int,
        shuffle: bool = True,
        drop_last: bool = False,
        *,
        backend: Backend = "auto",
        cache_epochs: int = 2,
    ) -> None:
        self.n = check_n(n)
        self.world_size = check_world(world_size)
        self.seed = check_seed(seed)
        self.shuffle = bool(shuffle)
        self.drop_last = bool(drop_last)
        self.backend = resolve_backend(backend) if shuffle else "numpy"
        if self.drop_last and self.n % self.world_size:
            self._num_samples = math.ceil((self.n - self.world_size) / self.world_size)
        else:
            self._num_samples = math.ceil(self.n / self.world_size)
        self.total_size = self._num_samples * self.world_size
        self._cache: LRU[int, IndexArray] = LRU(cache_epochs)

    def num_samples(self) -> int:
        return self._num_samples

    def epoch_seed(self, epoch: int) -> int:
        """The seed ``__iter__`` gives its generator (torch refuses it past 2**64 - 1)."""
        return check_seed(self.seed + check_epoch(epoch))

    def epoch_order(self, epoch: int) -> IndexArray:
        """The padded or truncated global list (length total_size); rank r reads ``[r::R]``."""
        epoch = check_epoch(epoch)
        return self._cache.get(epoch, lambda: frozen(self._compute_order(epoch)))

    def _compute_order(self, epoch: int) -> IndexArray:
        # the permutation goes straight into the padded array when there is padding
        out = np.empty(max(self.total_size, self.n), dtype=np.int64)
        base = out[: self.n]
        if self.shuffle:
            randperm(self.n, self.epoch_seed(epoch), backend=self.backend, out=base)
        else:
            base[:] = np.arange(self.n, dtype=np.int64)
        if self.total_size <= self.n:
            return out[: self.total_size].copy() if self.total_size < self.n else out
        # padding repeats the list from its start, cyclically when the pad exceeds n
        for start in range(self.n, self.total_size, self.n):
            stop = min(start + self.n, self.total_size)
            out[start:stop] = base[: stop - start]
        return out

    def epoch_layout(self, epoch: int) -> EpochLayout:
        order = self.epoch_order(epoch)
        return EpochLayout(order=order, shared=False, distinct=min(self.n, self.total_size))

    def fresh_layout(self, epoch: int) -> EpochLayout:
        """:meth:`epoch_layout` without the cache: a pure function of the epoch, safe in threads."""
        order = frozen(self._compute_order(check_epoch(epoch)))
        return EpochLayout(order=order, shared=False, distinct=min(self.n, self.total_size))

    def entries_at(self, epoch: int, t: npt.ArrayLike) -> IndexArray:
        """``epoch_order(epoch)[t]`` without the rest of the order (:func:`randperm_at`): what one
        node of a large job needs, its ranks' entries ``[r::world_size]``; a pure function of the
        epoch, safe in threads."""
        at = np.asarray(t, dtype=np.int64)
        if at.size and (int(at.min()) < 0 or int(at.max()) >= self.total_size):
            raise ValueError(f"t: expected entries in 0..{self.total_size - 1}")
        at = at % self.n  # padding repeats the permutation from its start
        if not self.shuffle:
            return at
        return randperm_at(self.n, self.epoch_seed(check_epoch(epoch)), at, backend=self.backend)

    def rank_indices(self, epoch: int, rank: int) -> IndexArray:
        rank = check_rank(rank, self.world_size)
        return self.epoch_order(epoch)[rank :: self.world_size]


class OrderedDistributedSamplerModel(DistributedSamplerModel):
    """timm's ``OrderedDistributedSampler(dataset)``: its distributed validation loader's sampler.

    timm 1.0.31 gives rank r the entries ``r, r + R, ...`` of ``0..total_size-1`` taken modulo n,
    ``total_size = ceil(n / R) * R`` (not one contiguous chunk per rank): the order of
    ``DistributedSampler(shuffle=False, drop_last=False)``, whose padding also repeats the list from
    its start.  Its own class so that a config and status name timm's sampler, and so that nobody
    can give it a seed, a shuffle or a drop_last it does not have.
    """

    def __init__(self, n: int, world_size: int, *, cache_epochs: int = 2) -> None:
        super().__init__(n, world_size, 0, shuffle=False, drop_last=False, cache_epochs=cache_epochs)


class RepeatAugSamplerModel:
    """timm's ``RepeatAugSampler(dataset, num_repeats=R)`` (train.py ``--aug-repeats R`` under torchrun).

    timm 1.0.31 (``timm/data/distributed_sampler.py``): each ``__iter__`` seeds a fresh generator with
    the *epoch* alone (no seed argument), takes ``randperm(n)``, repeats every index R times in place
    (a non-integer R: index ``int(i // R)`` for i below ``ceil(R * n)``), and gives rank r the entries
    ``r, r + W, ...`` below ``total_size = ceil(n * R / W) * W``, wrapped around the repeated list,
    cut to ``num_selected_samples`` (``n // 256 * 256 // W``, or ``ceil(n / W)`` below 256 files; at
    most num_samples).  So the same order for every job with the same n, R and world size.
    """

    kind = "repeat_aug"
    shuffle = True

    def __init__(
        self, n: int, world_size: int, num_repeats: float = 3, *, backend: Backend = "auto", cache_epochs: int = 2
    ) -> None:
        self.n = check_n(n)
        self.world_size = check_world(world_size)
        if isinstance(num_repeats, bool) or not num_repeats > 0:
            raise ValueError(f"num_repeats: expected a positive number, got {num_repeats!r}")
        self.num_repeats = float(num_repeats)
        self.backend = resolve_backend(backend)
        self._num_samples_all = math.ceil(self.n * self.num_repeats / self.world_size)
        self.total_size = self._num_samples_all * self.world_size
        selected_round, ratio = 256, self.world_size  # timm's defaults (selected_ratio 0: the world size)
        if self.n >= selected_round:
            selected = math.floor(self.n // selected_round * selected_round / ratio)
        else:
            selected = math.ceil(self.n / ratio)
        self.num_selected = min(selected, self._num_samples_all)
        self.max_repeats = math.ceil(self.num_repeats) + 1  # a bound on one rank's reads of a file (wrap included)
        self._cache: LRU[int, IndexArray] = LRU(cache_epochs)

    def num_samples(self) -> int:
        return self.num_selected

    def epoch_order(self, epoch: int) -> IndexArray:
        """The repeated list wrapped to total_size: rank r reads ``[r::W][:num_samples()]``."""
        epoch = check_epoch(epoch)
        return self._cache.get(epoch, lambda: frozen(self._compute(epoch)))

    def _compute(self, epoch: int) -> npt.NDArray[np.int64]:
        perm = randperm(self.n, epoch, backend=self.backend)
        r = self.num_repeats
        if r.is_integer():
            repeated = np.repeat(perm, int(r))
        else:  # timm's own float arithmetic, index by index
            repeated = perm[np.asarray([int(i // r) for i in range(math.ceil(r * self.n))], dtype=np.int64)]
        return np.asarray(repeated[np.arange(self.total_size) % repeated.shape[0]], dtype=np.int64)

    def epoch_layout(self, epoch: int) -> EpochLayout:
        order = self.epoch_order(epoch)
        return EpochLayout(order=order, shared=False, distinct=1 if self.num_repeats > 1 else min(self.n, order.size))

    def rank_indices(self, epoch: int, rank: int) -> IndexArray:
        rank = check_rank(rank, self.world_size)
        return self.epoch_order(epoch)[rank :: self.world_size][: self.num_selected]


class EpochStreams:
    """One generator's stream at the start of chosen epochs, for samplers whose epochs draw in turn
    from a single generator.

    Any epoch is reached from the nearest earlier checkpoint by skipping ``epoch_draws(e)`` draws per
    epoch, never by recomputing permutations.  At most ``max_checkpoints`` (a few KiB each) are kept:
    past that, only epochs at multiples of a stride that doubles each time, and the newest, so that
    reading epochs in order never skips far.
    """

    def __init__(
        self, start: Mt19937Stream | TorchGeneratorStream, epoch_draws: Callable[[int], int], max_checkpoints: int
    ) -> None:
        if max_checkpoints < 2:
            raise ValueError(f"max_checkpoints: expected >= 2, got {max_checkpoints}")
        self._checkpoints: dict[int, Mt19937Stream | TorchGeneratorStream] = {0: start}
        self._epoch_draws = epoch_draws
        self._max = max_checkpoints
        self._stride = 1  # epochs between kept checkpoints (the newest one aside)

    def __contains__(self, epoch: int) -> bool:
        return epoch in self._checkpoints

    def __len__(self) -> int:
        """Checkpoints kept now."""
        return len(self._checkpoints)

    def at(self, epoch: int) -> Mt19937Stream | TorchGeneratorStream:
        """A fresh copy of the stream at the start of ``epoch`` (every earlier epoch drawn in full)."""
        start = max(e for e in self._checkpoints if e <= epoch)
        stream = self._checkpoints[start].copy()
        for e in range(start, epoch):
            stream.skip(self._epoch_draws(e))
            if (e + 1) % self._stride == 0:
                self.remember(e + 1, stream.copy())
        return stream

    def remember(self, epoch: int, stream: Mt19937Stream | TorchGeneratorStream) -> None:
        """Keep a checkpoint; past the limit, thin them out to a doubled stride (epoch 0 stays)."""
        self._checkpoints[epoch] = stream
        while len(self._checkpoints) > self._max:
            self._stride *= 2
            self._checkpoints = {e: s for e, s in self._checkpoints.items() if e % self._stride == 0 or e == epoch}


class RandomSamplerModel:
    """``DataLoader(ds, shuffle=True, generator=torch.Generator().manual_seed(seed))`` per rank.

    Every rank builds the same loader with the same seed, so every rank reads the same order.
    Epoch e's draws follow all of the earlier epochs' draws on the one generator, so the model
    keeps checkpoints of the stream at epoch starts (a few KiB each) and reaches any epoch from
    the nearest earlier one by skipping, never by recomputing permutations.  At most
    ``max_checkpoints`` are kept: past that, only epochs at multiples of a stride that doubles
    each time (and the newest, so that reading epochs in order never skips).
    """

    def __init__(
        self,
        n: int,
        seed: int,
        persistent_workers: bool = False,
        num_workers: int = 0,
        world_size: int = 1,
        *,
        backend: Backend = "auto",
        cache_epochs: int = 2,
        max_checkpoints: int = 64,
    ) -> None:
        self.n = check_n(n)
        self.world_size = check_world(world_size)
        self.seed = check_seed(seed)
        if num_workers < 0:
            raise ValueError(f"num_workers: expected >= 0, got {num_workers}")
        if persistent_workers and num_workers == 0:
            # DataLoader raises this itself: the job could never have started
            raise ValueError("persistent_workers=True needs num_workers > 0 (DataLoader refuses it)")
        self.persistent_workers = bool(persistent_workers)
        self.num_workers = int(num_workers)
        self.backend = resolve_backend(backend)
        self._streams = EpochStreams(open_stream(self.seed, self.backend), self.epoch_draws, max_checkpoints)
        self._cache: LRU[int, IndexArray] = LRU(cache_epochs)

    def num_samples(self) -> int:
        return self.n

    def base_seed_draws(self, epoch: int) -> int:
        """Draws ``iter(loader)`` takes for the workers' base seed in ``epoch``."""
        if self.persistent_workers and epoch > 0:
            return 0  # the persistent iterator is only _reset(): no new base seed
        return BASE_SEED_DRAWS

    def epoch_draws(self, epoch: int) -> int:
        """All draws of one full epoch: base seed, the permutation, the discarded permutation."""
        return self.base_seed_draws(epoch) + 2 * randperm_draws(self.n)

    def draws_before(self, epoch: int) -> int:
        """Draws taken before ``epoch``'s permutation starts."""
        epoch = check_epoch(epoch)
        return sum(self.epoch_draws(e) for e in range(epoch)) + self.base_seed_draws(epoch)

    def epoch_order(self, epoch: int) -> IndexArray:
        """The permutation every rank reads in ``epoch``."""
        epoch = check_epoch(epoch)

        def compute() -> IndexArray:
            stream = self._streams.at(epoch)
            stream.skip(self.base_seed_draws(epoch))
            perm = frozen(stream.randperm(self.n))
            if epoch + 1 not in self._streams:  # the next epoch starts after the discarded one
                stream.skip(randperm_draws(self.n))
                self._streams.remember(epoch + 1, stream)
            return perm

        return self._cache.get(epoch, compute)

    def epoch_layout(self, epoch: int) -> EpochLayout:
        return EpochLayout(order=self.epoch_order(epoch), shared=True, distinct=self.n)

    def rank_indices(self, epoch: int, rank: int) -> IndexArray:
        check_rank(rank, self.world_size)
        return self.epoch_order(epoch)


class ExplicitOrderModel:
    """A read order given as a list of dataset indices, the same for every rank and epoch."""

    def __init__(self, order: npt.ArrayLike, n: int, world_size: int = 1) -> None:
        self.n = check_n(n)
        self.world_size = check_world(world_size)
        arr = np.asarray(order)
        if arr.ndim != 1 or (arr.size and not np.issubdtype(arr.dtype, np.integer)):
            raise ValueError("order: expected a flat list of integer dataset indices")
        arr = arr.astype(np.int64)
        if arr.size and (int(arr.min()) < 0 or int(arr.max()) >= self.n):
            bad = int(arr[(arr < 0) | (arr >= self.n)][0])
            raise ValueError(f"order: index {bad} is outside the dataset's 0..{self.n - 1}")
        self._order = frozen(arr)
        counts = np.bincount(arr, minlength=self.n) if arr.size else np.zeros(self.n, np.int64)
        self.max_repeats = int(counts.max())
        self._distinct = arr.size if self.max_repeats <= 1 else 0

    def num_samples(self) -> int:
        return int(self._order.size)

    def epoch_layout(self, epoch: int) -> EpochLayout:
        check_epoch(epoch)
        return EpochLayout(order=self._order, shared=True, distinct=self._distinct)

    def rank_indices(self, epoch: int, rank: int) -> IndexArray:
        check_epoch(epoch)
        check_rank(rank, self.world_size)
        return self._order


class SequentialSamplerModel(ExplicitOrderModel):
    """``SequentialSampler`` (validation loaders): every rank reads ``0..n-1`` in order."""

    def __init__(self, n: int, world_size: int = 1) -> None:
        super().__init__(np.arange(check_n(n), dtype=np.int64), n, world_size)


def varies_by_epoch(model: SamplerModel) -> bool:
    """Whether ``model`` yields a different order in different epochs.

    An unshuffled DistributedSampler, a sequential sampler and a given list read the same order in
    every epoch: a cursor then needs one epoch's inverse, and "which epoch" is no question at all.
    Other models say so with a bool ``shuffle`` attribute (:mod:`placement.frameworks`); unknown
    ones are assumed to vary (the safe answer: every epoch is its own hypothesis).
    """
    shuffle = getattr(model, "shuffle", None)
    if isinstance(shuffle, bool):
        return shuffle
    return not isinstance(model, ExplicitOrderModel)


def sampler_name(model: SamplerModel) -> str:
    """The config's ``sampler.kind`` a model stands for (what status reports as detected)."""
    kind = getattr(model, "kind", None)
    if isinstance(kind, str):  # the framework models name their kind
        return kind if getattr(model, "shuffle", True) else f"{kind}(shuffle=False)"
    if isinstance(model, OrderedDistributedSamplerModel):
        return "ordered_distributed"
    if isinstance(model, DistributedSamplerModel):
        return "distributed" if model.shuffle else "distributed(shuffle=False)"
    if isinstance(model, RandomSamplerModel):
        return "random"
    if isinstance(model, SequentialSamplerModel):
        return "sequential"
    if isinstance(model, ExplicitOrderModel):
        return "list"
    return type(model).__name__


def unshuffled_alternatives(model: SamplerModel) -> list[SamplerModel]:
    """Other samplers an unshuffled loader commonly runs with, for the same files and ranks.

    A validation DataLoader reads in order either through ``DistributedSampler(shuffle=False)``
    (each rank a strided share; Lightning injects one by default) or with no sampler at all (every
    rank reads every file).  Configs rarely say which, and the opens tell them apart (shared files
    are opened once per local rank), so a cursor tries both.  Shuffled models have no alternative.
    """
    if isinstance(model, DistributedSamplerModel) and not model.shuffle:
        return [SequentialSamplerModel(model.n, model.world_size)]
    if type(model) is SequentialSamplerModel and model.world_size > 1:
        return [DistributedSamplerModel(model.n, model.world_size, 0, shuffle=False)]
    return []


def make_sampler(
    kind: str,
    n: int,
    *,
    seed: int,
    world_size: int,
    shuffle: bool = True,
    sampler_drop_last: bool = False,
    persistent_workers: bool = False,
    num_workers: int = 0,
    order: npt.ArrayLike | None = None,
    generator_seeded: bool = True,
    aug_repeats: float = 3,
    backend: Backend = "auto",
) -> SamplerModel:
    """The model for a config's ``datasets[].sampler`` (kind: distributed, random, sequential, list,
    ordered_distributed, repeat_aug).

    Raises ValueError with a one-line reason for setups whose order cannot be predicted or that
    PyTorch itself would refuse.
    """
    if kind == "distributed":
        return DistributedSamplerModel(
            n, world_size, seed, shuffle=shuffle, drop_last=sampler_drop_last, backend=backend
        )
    if kind == "random":
        if not generator_seeded:
            raise ValueError(UNPREDICTABLE_RANDOM)
        return RandomSamplerModel(
            n,
            seed,
            persistent_workers=persistent_workers,
            num_workers=num_workers,
            world_size=world_size,
            backend=backend,
        )
    if kind == "sequential":
        return SequentialSamplerModel(n, world_size)
    if kind == "ordered_distributed":
        return OrderedDistributedSamplerModel(n, world_size)
    if kind == "repeat_aug":
        return RepeatAugSamplerModel(n, world_size, aug_repeats, backend=backend)
    if kind == "list":
        if order is None:
            raise ValueError("sampler 'list' needs the order (sampler.order_file)")
        return ExplicitOrderModel(order, n, world_size)
    raise ValueError(f"sampler kind: expected one of {', '.join(SAMPLER_KINDS)}, got {kind!r}")
