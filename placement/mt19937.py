"""mt19937 vectorised across seeds: the first outputs of many generators at once, numpy only.

torch's CPU generator and numpy's legacy ``RandomState`` are both mt19937 seeded by ``init_genrand``
(:mod:`placement.randperm` drives one generator through numpy's ``MT19937`` to replay
``torch.randperm``).  The seed search needs the opposite shape: the first few hundred outputs of
tens of thousands of seeds, one numpy pass per output over all seeds.  Output i is
``temper(mt[i+397] ^ twist(mt[i], mt[i+1]))``, so the first 227 outputs need only the first
397 + k words of the seeded state: ~400 steps of the seeding recurrence per seed, not a full
state and twist.

Pure: numpy only, deterministic by construction (the seeds are the input).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

U32 = npt.NDArray[np.uint32]

MT_N = 624
MT_M = 397
LOW_OUTPUTS = MT_N - MT_M  # outputs 0..226 need only the seeded state, not the rest of the twist
_MULT = np.uint32(1812433253)
_UPPER = np.uint32(0x80000000)
_LOWER = np.uint32(0x7FFFFFFF)
_MATRIX = np.uint32(0x9908B0DF)
_TEMPER_B = np.uint32(0x9D2C5680)
_TEMPER_C = np.uint32(0xEFC60000)


def _init_step(prev: U32, i: int, out: U32, tmp: U32) -> None:
    """``out = 1812433253 * (prev ^ (prev >> 30)) + i`` (init_genrand), mod 2**32, in place."""
    np.right_shift(prev, 30, out=tmp)
    np.bitwise_xor(prev, tmp, out=out)
    np.multiply(out, _MULT, out=out)
    np.add(out, np.uint32(i), out=out)


def _temper(y: U32) -> U32:
    """mt19937's output tempering, in place on ``y`` (returned)."""
    y ^= y >> 11
    y ^= (y << 7) & _TEMPER_B
    y ^= (y << 15) & _TEMPER_C
    y ^= y >> 18
    return y


def _twisted(cur: U32, nxt: U32, far: U32) -> U32:
    """The twist of words ``cur`` (with the next word ``nxt`` and the one 397 on, ``far``)."""
    y: U32 = np.bitwise_and(cur, _UPPER)
    y |= np.bitwise_and(nxt, _LOWER)
    out: U32 = np.bitwise_xor(far, np.right_shift(y, 1))
    y &= np.uint32(1)
    y *= _MATRIX
    out ^= y
    return out


def mt19937_state(seeds: npt.ArrayLike) -> U32:
    """The seeded 624-word state (``init_genrand``) of each seed: shape (624, len(seeds))."""
    s = np.ascontiguousarray(seeds, dtype=np.uint32).reshape(-1)
    state = np.empty((MT_N, s.shape[0]), dtype=np.uint32)
    state[0] = s
    tmp = np.empty(s.shape[0], dtype=np.uint32)
    for i in range(1, MT_N):
        _init_step(state[i - 1], i, state[i], tmp)
    return state


def _twist_rows(state: U32, rows: int) -> None:
    """Regenerate words 0..rows-1 of ``state`` in place, as the sequential twist loop would.

    Word i reads words i + 1 and (i + 397) % 624; blocks of at most 227 words only read words that
    are already final for this round (before the block) or not yet touched (after it).
    """
    start = 0
    while start < rows:
        stop = min(rows, (start // LOW_OUTPUTS + 1) * LOW_OUTPUTS, MT_N)
        # word 623 reads word 0, already regenerated
        nxt = state[start + 1 : stop + 1] if stop < MT_N else np.concatenate([state[start + 1 : MT_N], state[0:1]])
        lo = (start + MT_M) % MT_N
        far = state[lo : lo + stop - start]
        state[start:stop] = _twisted(state[start:stop], nxt, far)
        start = stop


def mt19937_outputs(seeds: npt.ArrayLike, k: int) -> U32:
    """The first ``k`` 32-bit outputs of mt19937 seeded with each of ``seeds``: shape (k, len(seeds)).

    Row j holds output j for every seed (``np.random.RandomState(seed)``'s and
    ``torch.Generator().manual_seed(seed)``'s j-th 32-bit draw).  Up to 227 outputs need only state
    words 0..k+396, which are computed once and never stored whole; beyond that the full state is
    built and twisted as often as needed.
    """
    s = np.ascontiguousarray(seeds, dtype=np.uint32).reshape(-1)
    if k < 0:
        raise ValueError(f"k: expected >= 0 outputs, got {k}")
    c = s.shape[0]
    if k == 0:
        return np.empty((0, c), dtype=np.uint32)
    if k <= LOW_OUTPUTS:
        low = np.empty((k + 1, c), dtype=np.uint32)  # words 0..k
        high = np.empty((k, c), dtype=np.uint32)  # words 397..396+k
        scratch = np.empty(c, dtype=np.uint32)
        tmp = np.empty(c, dtype=np.uint32)
        low[0] = s
        prev = low[0]
        for i in range(1, MT_M + k):
            out = low[i] if i <= k else (high[i - MT_M] if i >= MT_M else scratch)
            _init_step(prev, i, out, tmp)
            prev = out
        return _temper(_twisted(low[:k], low[1:], high))
    state = mt19937_state(s)
    result = np.empty((k, c), dtype=np.uint32)
    for first in range(0, k, MT_N):
        rows = min(MT_N, k - first)
        _twist_rows(state, rows)
        result[first : first + rows] = _temper(state[:rows].copy())
    return result
