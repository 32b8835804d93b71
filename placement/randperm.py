"""``torch.randperm(n, generator)`` on CPU, bit for bit, with or without torch installed.

The planner must know the exact order a training job reads its files, and that order comes from
torch's CPU generator (mt19937 seeded with ``seed & 0xFFFFFFFF``) driving one of two loops in
``aten/src/ATen/native/TensorFactories.cpp`` (``randperm_cpu``, torch 2.13):

* ``n < THRESHOLD_64BIT``: forward Fisher-Yates with a biased modulo,
  ``for i in 0..n-2: z = next32() % (n - i); swap(a[i], a[i + z])`` (n - 1 draws);
* ``n >= THRESHOLD_64BIT``: the "inside-out" variant with 64-bit draws ``(d1 << 32) | d2``,
  ``for i in 0..n-1: z = next64() % (i + 1); a[i] = a[z]; a[z] = i`` (2n draws).

With torch importable we call it (it is the reference and ~2-3x faster).  Without torch, numpy
replays the same loops vectorised: the draws come from ``np.random.MT19937`` with the legacy
(``init_genrand``) seeding, which is the very generator torch uses; the sequential swaps are
resolved with one sort of (target, step) keys plus short pointer chains (see
:func:`_forward_fisher_yates`), so no Python-level loop runs per element.

:func:`randperm_at` gives a few entries of a permutation without the rest: a node of a large job
reads ``[rank::world]`` of it, 1/1,024 of the entries on 1,024 nodes.  The 32-bit loop's entries
then come from one filtered scan down the steps (:func:`_forward_fisher_yates_at`): with the
draws, about a tenth of the whole replay's cost at 14 million files and faster than torch's loop.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal, Protocol

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    from types import ModuleType

THRESHOLD_64BIT = 214_748_364  # 0xFFFFFFFF // 20: from here on torch uses the 64-bit algorithm
SEED_MIN = -(2**63)  # torch.Generator.manual_seed accepts [-2**63, 2**64 - 1]
SEED_MAX = 2**64 - 1
_DRAW_CHUNK = 1 << 22  # draws generated at once where only a bounded buffer is wanted
_SMALL_WORK = 1 << 25  # below this many files, int64 work arrays (fastest); above, int32 (leanest)
# randperm_at replays only the asked entries when at most 1 in this many is asked (more: no faster);
# up to _CACHED_N files the whole replay reuses its per-size arrays and is faster, so fewer then
_SPARSE_AT, _SPARSE_AT_CACHED = 16, 32
_SCAN_CHUNK = 1 << 17  # steps per slice of randperm_at's scan (the slice stays in cache)
_SCAN_MIN, _SCAN_SHIFT = 1024, 4  # near the top a slice is (n - its top) >> shift, at least min
_FILTER_BITS = 20  # randperm_at's cache-sized prefilter: one byte per value of the target's low bits

Backend = Literal["auto", "torch", "numpy"]
IndexArray = npt.NDArray[np.int64]
Int32Array = npt.NDArray[np.int32]


# --------------------------------------------------------------------------------------------
# torch, when present
# --------------------------------------------------------------------------------------------


@functools.cache
def _torch_module() -> ModuleType | None:
    try:
        return importlib.import_module("torch")
    except ImportError:
        return None


def torch_available() -> bool:
    """Whether ``import torch`` works here (imported once, on first use, then cached)."""
    return _torch_module() is not None


def _torch() -> Any:
    torch = _torch_module()
    if torch is None:
        raise RuntimeError("backend='torch' asked for, but torch cannot be imported here")
    return torch


def resolve_backend(backend: Backend) -> Literal["torch", "numpy"]:
    """The backend ``auto`` stands for here; ``torch`` fails early when torch is missing."""
    if backend == "auto":
        return "torch" if torch_available() else "numpy"
    if backend == "torch":
        _torch()
        return "torch"
    if backend == "numpy":
        return "numpy"
    raise ValueError(f"backend: expected 'auto', 'torch' or 'numpy', got {backend!r}")


def check_seed(seed: int) -> int:
    """Validate a generator seed like ``torch.Generator.manual_seed`` does and return it.

    torch refuses seeds outside [-2**63, 2**64 - 1]; a job with such a seed cannot run, so a plan
    for it would be fiction.
    """
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise ValueError(f"seed: expected an integer, got {seed!r}")
    seed = int(seed)
    if not SEED_MIN <= seed <= SEED_MAX:
        raise ValueError(f"seed: {seed} is outside torch's range [-2**63, 2**64 - 1]")
    return seed


def randperm_draws(n: int) -> int:
    """How many 32-bit draws ``torch.randperm(n)`` takes from its generator."""
    if n < 0:
        raise ValueError(f"n: expected a non-negative size, got {n}")
    if n < THRESHOLD_64BIT:
        return max(n - 1, 0)
    return 2 * n


# --------------------------------------------------------------------------------------------
# Draw streams
# --------------------------------------------------------------------------------------------


class DrawStream(Protocol):
    """A torch CPU generator's output consumed in order (what sampler models need)."""

    @property
    def consumed(self) -> int: ...
    def skip(self, k: int) -> None: ...
    def randperm(self, n: int) -> IndexArray: ...
    def copy(self) -> DrawStream: ...


class _CountedDraws:
    """What both streams share: how many draws were taken, and skipping with that count kept."""

    _consumed: int

    @property
    def consumed(self) -> int:
        """Draws taken so far (skipped or returned)."""
        return self._consumed

    def skip(self, k: int) -> None:
        """Discard ``k`` draws."""
        if k < 0:
            raise ValueError(f"skip: expected k >= 0, got {k}")
        if k:
            self._discard(k)
            self._consumed += k

    def _discard(self, k: int) -> None:
        raise NotImplementedError


class Mt19937Stream(_CountedDraws):
    """32-bit draws of a torch-seeded CPU generator, consumable in order, numpy only.

    torch seeds mt19937 with ``init_genrand(seed & 0xFFFFFFFF)``; numpy's ``RandomState`` uses the
    same legacy seeding, so its key and position are copied into a bare ``MT19937`` whose
    ``random_raw`` then yields torch's ``random()`` values.
    """

    def __init__(self, seed: int) -> None:
        seed32 = check_seed(seed) & 0xFFFFFFFF
        legacy = np.random.RandomState(seed32).get_state(legacy=False)
        self._bits = np.random.MT19937(0)  # seeded only to be deterministic: the state is replaced next
        self._bits.state = {"bit_generator": "MT19937", "state": legacy["state"]}
        self._gen = np.random.Generator(self._bits)
        self._consumed = 0

    def _discard(self, k: int) -> None:
        self._bits.random_raw(k, output=False)  # no buffer is allocated

    def draws(self, k: int) -> npt.NDArray[np.uint32]:
        """The next ``k`` draws as uint32.

        A Generator's full-range uint32 ``integers`` on these bits returns each raw 32-bit output
        unchanged (numpy skips the bounding for that range), without ``random_raw``'s uint64
        buffer; tests compare the values with torch's generator.
        """
        if k < 0:
            raise ValueError(f"draws: expected k >= 0, got {k}")
        out: npt.NDArray[np.uint32] = self._gen.integers(0, 1 << 32, size=k, dtype=np.uint32)
        self._consumed += k
        return out

    def fill(self, out: npt.NDArray[np.uint32]) -> None:
        """Write the next ``out.size`` draws into ``out``."""
        out[...] = self.draws(out.size)

    def randperm(self, n: int) -> IndexArray:
        return randperm_from_stream(n, self)

    def copy(self) -> Mt19937Stream:
        """An independent stream at the same position (a checkpoint)."""
        other = Mt19937Stream.__new__(Mt19937Stream)
        other._bits = np.random.MT19937(0)  # state replaced next
        other._bits.state = self._bits.state
        other._gen = np.random.Generator(other._bits)
        other._consumed = self._consumed
        return other


class TorchGeneratorStream(_CountedDraws):
    """The same stream driven by a real ``torch.Generator`` (exact by construction, faster)."""

    def __init__(self, seed: int) -> None:
        torch = _torch()
        self._gen = torch.Generator()
        self._gen.manual_seed(check_seed(seed) & 0xFFFFFFFF)
        self._consumed = 0

    def _discard(self, k: int) -> None:
        """int32 ``random_()`` takes exactly one ``random()`` per element."""
        torch = _torch()
        left = k
        while left:
            step = min(left, _DRAW_CHUNK)
            torch.empty(step, dtype=torch.int32).random_(generator=self._gen)
            left -= step

    def randperm(self, n: int) -> IndexArray:
        torch = _torch()
        perm = torch.randperm(n, generator=self._gen).numpy()
        self._consumed += randperm_draws(n)
        return np.asarray(perm, dtype=np.int64)

    def copy(self) -> TorchGeneratorStream:
        torch = _torch()
        other = TorchGeneratorStream.__new__(TorchGeneratorStream)
        other._gen = torch.Generator()
        other._gen.set_state(self._gen.get_state())
        other._consumed = self._consumed
        return other


def open_stream(seed: int, backend: Backend = "auto") -> Mt19937Stream | TorchGeneratorStream:
    """A draw stream for ``torch.Generator().manual_seed(seed)`` on the chosen backend."""
    if resolve_backend(backend) == "torch":
        return TorchGeneratorStream(seed)
    return Mt19937Stream(seed)


# --------------------------------------------------------------------------------------------
# randperm
# --------------------------------------------------------------------------------------------


def randperm(n: int, seed: int, *, backend: Backend = "auto", out: IndexArray | None = None) -> IndexArray:
    """``torch.randperm(n, generator=torch.Generator().manual_seed(seed))`` as int64.

    ``out``: an int64 array of n entries to write it into and return (a caller that pads the
    permutation spares a copy of it).
    """
    _check_n(n)
    seed = check_seed(seed)
    if out is not None and (out.shape != (n,) or out.dtype != np.int64):
        raise ValueError(f"out: expected an int64 array of shape ({n},), got {out.dtype} {out.shape}")
    if resolve_backend(backend) == "torch":
        perm = TorchGeneratorStream(seed).randperm(n)
        if out is None:
            return perm
        np.copyto(out, perm)
        return out
    return _numpy_randperm(n, Mt19937Stream(seed), sixty_four_bit=n >= THRESHOLD_64BIT, out=out)


def randperm_at(n: int, seed: int, entries: npt.ArrayLike, *, backend: Backend = "auto") -> IndexArray:
    """``randperm(n, seed)[entries]`` (int64, in the order given), computing only those entries where
    few are asked.

    Up to 1 in :data:`_SPARSE_AT` entries of the 32-bit loop (1 in :data:`_SPARSE_AT_CACHED` up to
    :data:`_CACHED_N` files) are replayed by numpy on any backend (at 14 million files, faster than
    torch's whole loop); otherwise the whole permutation is computed on ``backend`` and indexed.
    """
    _check_n(n)
    seed = check_seed(seed)
    at = np.asarray(entries, dtype=np.int64)
    if at.size and (int(at.min()) < 0 or int(at.max()) >= n):
        raise ValueError(f"entries: expected indices in 0..{n - 1}")
    wanted, back = np.unique(at, return_inverse=True)
    if n >= THRESHOLD_64BIT or wanted.size * (_SPARSE_AT_CACHED if n <= _CACHED_N else _SPARSE_AT) > n:
        return randperm(n, seed, backend=backend).take(at)
    if n <= 1:
        return np.zeros(at.shape, dtype=np.int64)
    values = _forward_fisher_yates_at(_offsets_32(n, Mt19937Stream(seed)), n, wanted)
    return values.take(back.reshape(at.shape))


def randperm_from_stream(n: int, stream: Mt19937Stream) -> IndexArray:
    """The permutation torch computes from ``stream``'s next draws, consuming exactly those."""
    _check_n(n)
    return _numpy_randperm(n, stream, sixty_four_bit=n >= THRESHOLD_64BIT)


def _numpy_randperm(
    n: int, stream: Mt19937Stream, *, sixty_four_bit: bool, out: IndexArray | None = None
) -> IndexArray:
    """Either of torch's two loops at any n (tests force the 64-bit one at small n)."""
    if sixty_four_bit:
        perm = _inside_out(_offsets_64(n, stream), n)
        if out is None:
            return perm
        np.copyto(out, perm)
        return out
    return _forward_fisher_yates(_offsets_32(n, stream), n, out=out)


def _check_n(n: int) -> None:
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
        raise ValueError(f"n: expected a non-negative integer, got {n!r}")


# Arrays that depend on n alone are kept for the next epoch of the same dataset (a training
# set and a validation set, so a few): computing them again costs a pass each time.  Only up
# to _CACHED_N entries (16 bytes each in all), so that a huge dataset does not pin gigabytes.
_CACHED_N = 1 << 23


class _PerSize:
    """``make(n, arg)``, read-only, cached for sizes up to _CACHED_N (computed afresh above)."""

    def __init__(self, make: Callable[[int, int], npt.NDArray[Any]]) -> None:
        self._make = make
        self._cached = functools.lru_cache(maxsize=4)(self._fresh)

    def _fresh(self, n: int, arg: int) -> npt.NDArray[Any]:
        return _readonly(self._make(n, arg))

    def __call__(self, n: int, arg: int = 0) -> npt.NDArray[Any]:
        return self._cached(n, arg) if n <= _CACHED_N else self._make(n, arg)


def _readonly(a: npt.NDArray[Any]) -> npt.NDArray[Any]:
    a.setflags(write=False)
    return a


# n, n - 1, ..., 2: what step i's draw is reduced modulo
_divisors = _PerSize(lambda n, _: np.arange(n, 1, -1, dtype=np.uint32))
_arange32 = _PerSize(lambda n, _: np.arange(n, dtype=np.int32))
# i * mult for the m steps: the step part of the packed (target, step) sort keys
_step_keys = _PerSize(lambda m, mult: np.arange(0, m * mult, mult, dtype=np.int64))


def _offsets_32(n: int, stream: Mt19937Stream) -> npt.NDArray[np.uint32]:
    """``z[i] = next32() % (n - i)`` for the n - 1 steps of the 32-bit loop."""
    if n <= 1:
        return np.zeros(0, dtype=np.uint32)
    if n - 1 <= _DRAW_CHUNK:
        z = stream.draws(n - 1)
        np.remainder(z, _divisors(n), out=z)
        return z
    z = np.empty(n - 1, dtype=np.uint32)
    for lo in range(0, n - 1, _DRAW_CHUNK):  # the divisors a chunk at a time: no n-sized array of them
        hi = min(n - 1, lo + _DRAW_CHUNK)
        part = z[lo:hi]
        stream.fill(part)
        np.remainder(part, np.arange(n - lo, n - hi, -1, dtype=np.uint32), out=part)
    return z


def _offsets_64(n: int, stream: Mt19937Stream) -> npt.NDArray[Any]:
    """``z[i] = next64() % (i + 1)`` for the n steps of the 64-bit loop, in bounded chunks."""
    z = np.empty(n, dtype=_index_dtype(n))
    for lo in range(0, n, _DRAW_CHUNK):
        hi = min(n, lo + _DRAW_CHUNK)
        d = stream.draws(2 * (hi - lo)).astype(np.uint64)
        r = (d[0::2] << np.uint64(32)) | d[1::2]
        z[lo:hi] = r % np.arange(lo + 1, hi + 1, dtype=np.uint64)
    return z


def _index_dtype(n: int) -> type[np.signedinteger[Any]]:
    """int32 where it holds every index: half the memory of int64 at the sizes where that counts."""
    return np.int32 if n <= np.iinfo(np.int32).max else np.int64


def _work_dtype(n: int) -> type[np.signedinteger[Any]]:
    """Index type of the sorted (target, step) columns.

    numpy fancy indexing converts other index types to int64 first, so int64 is fastest; past a
    few million entries the arrays' size matters more and int32 halves it.
    """
    return np.int64 if n <= _SMALL_WORK else _index_dtype(n)


def _group_by_target(
    offsets: npt.NDArray[Any], *, target_is_step_plus_offset: bool, dtype: type[np.signedinteger[Any]]
) -> tuple[npt.NDArray[Any], npt.NDArray[Any]]:
    """Steps 0..m-1 sorted by (target, step); returns (targets, steps) as ``dtype`` arrays.

    The target of step i is ``offsets[i]`` or ``i + offsets[i]``.  Both go in one int64 key,
    ``target << shift | step``, built as ``(offset << shift) + i * mult`` (the second term
    cached per size), and one numpy sort (vectorised) does the grouping.  Past 2**31 steps the
    key does not fit and a stable argsort does the same job, slower.
    """
    m = int(offsets.shape[0])
    shift = max(1, (m - 1).bit_length())
    if 2 * shift > 62:  # pragma: no cover - needs more than 2**31 files
        target = np.asarray(offsets, dtype=np.int64)
        if target_is_step_plus_offset:
            target = target + np.arange(m, dtype=np.int64)
        order = np.argsort(target, kind="stable").astype(np.int64)
        return target[order], order
    mult = (1 << shift) + 1 if target_is_step_plus_offset else 1
    key = np.left_shift(offsets, shift, dtype=np.int64)
    key += _step_keys(m, mult)
    key.sort()
    targets = np.empty(m, dtype=dtype)
    np.right_shift(key, shift, out=targets, casting="unsafe")
    if dtype is np.int64:
        key &= (1 << shift) - 1
        return targets, key
    steps = np.empty(m, dtype=dtype)
    np.bitwise_and(key, (1 << shift) - 1, out=steps, casting="unsafe")
    return targets, steps


def _resolve_chains(
    start: npt.NDArray[Any], parent: npt.NDArray[Any], is_root: npt.NDArray[np.bool_], *, blind: int = 0
) -> npt.NDArray[Any]:
    """The root reached from each ``start`` by following ``parent`` until ``is_root``.

    Chains here are short (about half of them stop at each hop), so walking all of them one hop
    per round beats pointer doubling over the whole array.  Where roots are their own parents,
    ``blind`` first hops for every start cost less than finding which starts still move.
    ``is_root`` is a byte array, cheap to probe at random; ``parent`` should be int32 to halve
    the random reads.
    """
    if blind:
        out = parent.take(start)
        for _ in range(blind - 1):
            out = parent.take(out)
    else:
        out = np.asarray(start).astype(parent.dtype)
    active = np.flatnonzero(~is_root.take(out))
    while active.size:
        nxt = parent.take(out.take(active))
        out[active] = nxt
        active = active.take(np.flatnonzero(~is_root.take(nxt)))
    return out


def _forward_fisher_yates(z: npt.NDArray[np.uint32], n: int, out: IndexArray | None = None) -> IndexArray:
    """Apply ``swap(a[i], a[i + z[i]])`` for i = 0..n-2 to ``a = arange(n)`` without a loop.

    Step i fixes a[i] for good, to the value that target j = i + z[i] holds just before step i.
    Let W(p) be the value position p holds just before step p.  Group the steps by target (by
    step inside a group): the first step of a group finds the target's own index there; every
    later one finds what the previous step of the group put there, W(previous step).  W(p) is p
    unless an earlier step targeted p; then it is W(last such step): a chain through earlier
    steps ending at a position no earlier step targeted.  One sort and short chain walks give
    every a[i].
    """
    m = n - 1
    if m <= 0:
        if out is None:
            return np.zeros(n, dtype=np.int64)
        out[:] = 0
        return out
    idt = _index_dtype(n)
    tgt, step = _group_by_target(z, target_is_step_plus_offset=True, dtype=_work_dtype(n))
    same = tgt[1:] == tgt[:-1]  # entry s + 1 continues the group of entry s
    ends = np.flatnonzero(~same)  # last entries of every group but the final one
    # parent[p]: the last step before p that targeted p (p itself when none: a root)
    ar = _arange32(n) if idt is np.int32 else np.arange(n, dtype=idt)
    parent = ar.copy()
    parent[tgt.take(ends)] = step.take(ends)
    del ends
    parent[tgt[m - 1]] = step[m - 1]
    # A step targeting itself (z == 0) is the last of its group but comes *at* p, not before it.
    selfish = np.flatnonzero(z == 0)
    if selfish.size:
        at = np.searchsorted(tgt, selfish, side="right") - 1
        prev = np.maximum(at - 1, 0)
        has_prev = (at > 0) & (tgt.take(prev) == selfish)
        parent[selfish] = np.where(has_prev, step.take(prev), selfish)
    is_root = parent == ar
    del tgt
    later = np.flatnonzero(same)
    del same
    # W(previous step of the group) for every later entry, then W(m): what position m ends with
    starts = np.empty(later.shape[0] + 1, dtype=step.dtype)
    step.take(later, out=starts[:-1])
    starts[-1] = m
    found = _resolve_chains(starts, parent, is_root, blind=2)  # roots are their own parents here
    del parent, is_root, starts
    later += 1
    receivers = step.take(later)
    del step, later
    a = np.empty(n, dtype=idt)
    if idt is np.int32:  # z < n < 2**31: same bits as int32, and an int32 add (not int64)
        np.add(z.view(np.int32), ar[:m], out=a[:m])
    else:
        np.add(z, ar[:m], out=a[:m], casting="unsafe")
    a[receivers] = found[:-1]
    a[m] = found[-1]
    if out is None:
        return a.astype(np.int64, copy=False)
    np.copyto(out, a)
    return out


def _forward_fisher_yates_at(z: npt.NDArray[np.uint32], n: int, at: IndexArray) -> IndexArray:
    """``_forward_fisher_yates(z, n)[at]`` for sorted, distinct ``at`` (n >= 2), without the rest.

    With t_j = j + z[j] the target of step j: entry i < n - 1 is what its target t_i held just
    before step i, entry n - 1 what n - 1 holds at the end.  Position T holds, before step b, what
    the last step j < b that targeted T put there, W(j), the value j held just before step j
    (the swap moves it to T); if no step did, T itself.  W(j) asks the same question again, of
    (T, b) = (j, j): a chain of queries, each answered by a step below the last (about half stop
    at every hop).  So every entry is a query (T, b) = (t_i, i), or (n - 1, n - 1), followed down
    the steps: one scan from the top step down, in slices that stay in cache, keeps the targets
    still asked about in a byte table (with a cache-sized prefilter on the low bits), and answers
    each query from the largest matching step below its bound in the slice.  A query answered in
    a slice asks next about a position inside the slice; the slice's steps aimed inside it are
    kept for that.  Slices are short near the top, where most steps aim inside the slice, so that
    those stay few.  With the draws, about a tenth of the whole replay's cost at 14 million entries
    and 1/1,024 of them asked (0.17 against 1.2-2.2 CPU-s).
    """
    m = n - 1
    k = int(np.searchsorted(at, m))
    value = np.empty(at.shape[0], dtype=np.int64)  # each query's target: its answer once none is below
    np.add(z.take(at[:k]), at[:k], out=value[:k], casting="unsafe")
    value[k:] = m
    bound = at.astype(np.int64)
    asked = np.zeros(n, dtype=np.bool_)
    mask = (1 << _FILTER_BITS) - 1
    rough = np.zeros(1 << _FILTER_BITS, dtype=np.bool_)
    live_t = np.zeros(0, dtype=np.int64)  # the queries being followed, by target
    live_q = np.zeros(0, dtype=np.int64)
    waiting = at.shape[0]  # queries 0..waiting-1: their bound is still below the scan
    buf = np.empty(_SCAN_CHUNK, dtype=np.int32)
    hi = int(bound[-1]) if at.size else 0
    while hi > 0:
        if not live_t.size:  # nothing to follow: skip to the next bound
            hi = min(hi, int(bound[waiting - 1])) if waiting else 0
            if hi <= 0:
                break
        lo = max(0, hi - min(_SCAN_CHUNK, max(_SCAN_MIN, (n - hi) >> _SCAN_SHIFT)))
        start = int(np.searchsorted(bound[:waiting], lo, side="right"))
        if start < waiting:
            new = np.arange(start, waiting, dtype=np.int64)
            waiting = start
            live_t, live_q = _ask(live_t, live_q, value.take(new), new, asked, rough)
        targets = buf[: hi - lo]
        np.add(z[lo:hi].view(np.int32), np.arange(lo, hi, dtype=np.int32), out=targets)  # i + z < n < 2**31
        maybe = np.flatnonzero(rough.take(np.bitwise_and(targets, mask)))
        steps = np.concatenate(
            [maybe.take(np.flatnonzero(asked.take(targets.take(maybe)))), np.flatnonzero(targets < hi)]
        )  # a step in both is a duplicate key, which changes no answer
        if not steps.size:
            hi = lo
            continue
        keys = targets.take(steps).astype(np.int64)
        keys *= n
        keys += steps
        keys += lo
        keys.sort()
        aimed = keys // n
        first = np.searchsorted(live_t, aimed, side="left")
        span = np.searchsorted(live_t, aimed, side="right") - first
        span[1:][aimed[1:] == aimed[:-1]] = 0  # each target's queries once
        if span.any():
            ends = np.cumsum(span)
            touched = np.arange(int(ends[-1]), dtype=np.int64) + np.repeat(first - (ends - span), span)
            follow = live_q.take(touched)
            keep = np.ones(live_t.shape[0], dtype=np.bool_)
            keep[touched] = False
            live_t, live_q = live_t[keep], live_q[keep]
            stay = []
            while follow.size:
                t = value.take(follow)
                below = np.searchsorted(keys, t * n + bound.take(follow)) - 1
                key = keys.take(np.maximum(below, 0))
                found = (below >= 0) & (key // n == t)
                stay.append(follow[~found])
                follow = follow[found]
                value[follow] = bound[follow] = key[found] % n
            rest = np.concatenate(stay)
            live_t, live_q = _ask(live_t, live_q, value.take(rest), rest, asked, rough)
        hi = lo
    return value


def _ask(
    live_t: IndexArray,
    live_q: IndexArray,
    t: IndexArray,
    q: IndexArray,
    asked: npt.NDArray[np.bool_],
    rough: npt.NDArray[np.bool_],
) -> tuple[IndexArray, IndexArray]:
    """Queries ``q`` about targets ``t`` added to the followed ones (kept sorted by target) and
    their targets marked (marks stay: a stale one only brings a step no query takes)."""
    asked[t] = True
    rough[t & ((1 << _FILTER_BITS) - 1)] = True
    order = np.argsort(t, kind="stable")
    t, q = t.take(order), q.take(order)
    at = np.searchsorted(live_t, t)
    return np.insert(live_t, at, t), np.insert(live_q, at, q)


def _inside_out(z: npt.NDArray[Any], n: int) -> IndexArray:
    """Apply ``a[i] = a[z[i]]; a[z[i]] = i`` for i = 0..n-1 (z[i] <= i) without a loop.

    Let X(p) be what step p writes into a[p].  Group the steps by target (by step inside a
    group).  If p is not the first of its group, a[z[p]] last held the previous step of the
    group (it wrote its own number there): X(p) is that step.  If p is first and z[p] == p, X(p)
    is p.  Otherwise a[z[p]] still holds what step z[p] wrote: X(p) = X(z[p]), a chain.  At the
    end a[q] is the last step of group q, or X(q) when no step targeted q.
    """
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    tgt, step = _group_by_target(z, target_is_step_plus_offset=False, dtype=_work_dtype(n))
    first = np.ones(n, dtype=np.bool_)
    np.not_equal(tgt[1:], tgt[:-1], out=first[1:])
    later = np.flatnonzero(~first)
    base = np.empty(n, dtype=_index_dtype(n))  # X(p) where a chain ends
    base[step.take(later)] = step.take(later - 1)
    is_root = np.zeros(n, dtype=np.bool_)
    is_root[step.take(later)] = True
    del later
    selfish = np.flatnonzero(z == np.arange(n, dtype=z.dtype))
    is_root[selfish] = True
    base[selfish] = selfish
    last = np.ones(n, dtype=np.bool_)
    last[:-1] = first[1:]
    del first
    out = np.empty(n, dtype=np.int64)
    targeted = np.zeros(n, dtype=np.bool_)
    targeted[tgt] = True
    ends = np.flatnonzero(last)
    del last
    out[tgt.take(ends)] = step.take(ends)
    del tgt, step, ends
    untargeted = np.flatnonzero(~targeted)
    del targeted
    out[untargeted] = base.take(_resolve_chains(untargeted, z, is_root))
    return out
