"""Probability helpers the cursor, the seed search, the shape probe and the frequency analysis share.

Every false-match bound in placement is a ratio of binomial coefficients or a binomial or
hypergeometric tail, computed in log space so that a million files never overflow a float.  One
copy here, so that the bounds the cursor locks on and the ones the seed search accepts with stay the
same arithmetic.

Pure: math and numpy only.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]


def log_comb(n: int, k: int) -> float:
    """ln C(n, k); -inf where the coefficient is 0 (k < 0 or k > n)."""
    if k < 0 or k > n:
        return -math.inf
    return math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)


def log_factorials(n: int) -> F64:
    """ln(i!) for i in 0..n: the table :func:`log_comb_v` reads."""
    out = np.zeros(n + 1, dtype=np.float64)
    np.cumsum(np.log(np.arange(1, n + 1, dtype=np.float64)), out=out[1:])
    return out


def log_comb_v(lf: F64, a: I64, b: I64) -> F64:
    """ln C(a, b) elementwise from ``lf = log_factorials(max(a))`` (-inf where b > a): many
    coefficients at once, by table look-ups instead of three lgamma calls each."""
    ok = b <= a
    safe_b = np.where(ok, b, 0)
    out: F64 = np.where(ok, lf[a] - lf[safe_b] - lf[np.where(ok, a - b, 0)], -np.inf)
    return out


def binomial_tail(trials: int, p: float, k_min: int) -> float:
    """P(X >= k_min) for X ~ Binomial(trials, p), summed in log space (no overflow at any E)."""
    if k_min <= 0:
        return 1.0
    if k_min > trials:
        return 0.0
    if p <= 0.0:
        return 0.0
    if p >= 1.0:
        return 1.0
    lp, lq = math.log(p), math.log1p(-p)
    lg = math.lgamma
    total = 0.0
    for k in range(k_min, trials + 1):
        total += math.exp(lg(trials + 1) - lg(k + 1) - lg(trials - k + 1) + k * lp + (trials - k) * lq)
    return min(1.0, total)


def binom_sf(hits: int, trials: int, p: float) -> float:
    """P(X >= hits), X ~ Binomial(trials, p), summed exactly in linear space: for the few dozen
    trials of the seed search's stage 1 (:func:`binomial_tail` is the same quantity for any size;
    the two round differently in the last bits, and stage 1's thresholds are compared against this one)."""
    if hits <= 0:
        return 1.0
    if hits > trials:
        return 0.0
    return min(1.0, sum(math.comb(trials, x) * p**x * (1 - p) ** (trials - x) for x in range(hits, trials + 1)))


def hypergeom_sf(hits: int, population: int, successes: int, draws: int) -> float:
    """P(X >= hits) for X the opened files among ``draws`` files picked at random without replacement.

    ``population`` files, ``successes`` of them opened.  The first term in log space, the next ones
    by the pmf's ratio; past the mode the terms only shrink, so the sum stops once they are
    negligible.
    """
    lo = max(hits, 0, draws - (population - successes))
    hi = min(successes, draws)
    if lo > hi:
        return 0.0
    if hits <= 0:
        return 1.0
    log_first = log_comb(successes, lo) + log_comb(population - successes, draws - lo) - log_comb(population, draws)
    mode = (draws + 1) * (successes + 1) // (population + 2)
    term, total = 1.0, 1.0  # relative to the first term
    for x in range(lo, hi):
        term *= (successes - x) * (draws - x) / ((x + 1) * (population - successes - draws + x + 1))
        total += term
        if x >= mode and term < total * 1e-17:
            break
        if total > 1e300:  # the first term was tiny next to the mode: rescale
            log_first += math.log(total)
            term /= total
            total = 1.0
    return min(1.0, math.exp(log_first + math.log(total)))
