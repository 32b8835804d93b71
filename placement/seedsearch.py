"""Find a training job's sampler seed from the files one node opens first.

A job whose seed is unknown (not written to ``.control/seed``, or mistyped) still gives it away:

* torch seeds its mt19937 generator with ``seed & 0xFFFFFFFF``, so there are only 2**32 orders,
  and people pick small seeds (0, 1, 42, 1234, 3407, dates);
* a DistributedSampler's order in epoch e depends on ``seed + epoch`` alone
  (``g.manual_seed(seed + epoch); randperm(n, g)``): a search finds ``v = (seed + epoch) & 0xFFFFFFFF``
  whatever the epoch, which is all the planner needs (that job reads epoch e + k like seed v reads
  epoch k);
* ``randperm(n)`` (forward Fisher-Yates, ``z = next32() % (n - i); swap(a[i], a[i + z])``) fixes its
  first entries from its first draws, and mt19937's first 227 outputs need only the first
  397 + k words of the seeded state: output i is ``temper(mt[i+397] ^ twist(mt[i], mt[i+1]))``.
  So each candidate seed costs ~400 steps of the seeding recurrence, vectorised over 64k seeds at
  once (:mod:`placement.mt19937`), instead of a permutation of n.

Samplers searched: ``DistributedSampler(shuffle=True, seed=s)`` on any world size, either
``drop_last``, on whichever node hosts the opens (its node is found too); and
``DataLoader(shuffle=True, generator=torch.Generator().manual_seed(s))`` without one, in epoch 0
(two draws for the workers' base seed come first; epoch 0 is the same with persistent_workers;
later epochs start 2n draws on, out of reach of a vectorised search).  Every rank of such a
loader reads the same order.

Stages.  Stage 1a runs over every candidate: the first entries of each local rank's first two
batches (what DataLoader workers open first, whatever their number; taken without the rare swap
collisions, so approximately) are looked up in the set of opened files, with a threshold a true
seed meets even when three in four are not opened yet and that lets a few per cent of wrong ones
through.  Stage 1b counts, for those, the opened files among the first few hundred entries per
rank, at the depths stage 2 uses, and keeps the ones whose count would be that unlikely by chance
(a few per million).  Stage 2 computes each survivor's exact streams and counts how many distinct
opened files its node would open within the first D entries per rank.  Sets, not order: workers
and interleaved local ranks shuffle the order, never the set.

Acceptance: under a wrong seed the predicted files are a uniform random subset of the dataset, so
the count of opened files among them is hypergeometric.  The false-match chance is that tail
probability times every comparison the search plan makes (each candidate of the plan, each node,
each sampler variant, each depth D): a Bonferroni bound, valid however the candidates are ordered
or where the search stops.  A match is accepted when it is below ``threshold`` (by default the
cursor's false-lock chance).  Comparisons that could never be accepted, even if every open fit, are
left out of the plan beforehand (they cannot produce a false match).

Pure: numpy only, no I/O, no clocks; a caller drives :meth:`SeedSearch.steps` (one step per chunk)
from a background process to report progress and to cancel.
"""

from __future__ import annotations

import math
from collections.abc import Generator, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

from placement.cursor import NodeCursor
from placement.mt19937 import LOW_OUTPUTS, MT_N, mt19937_outputs
from placement.prob import binom_sf, hypergeom_sf
from placement.randperm import THRESHOLD_64BIT, Mt19937Stream
from placement.streams import JobShape

U32 = npt.NDArray[np.uint32]
I64 = npt.NDArray[np.int64]


FALSE_LOCK = NodeCursor.FALSE_LOCK
SEED_SPACE = 1 << 32
DEFAULT_LIMIT = 1 << 24  # the default range 0..2**24 - 1
LIKELY_RANGE = 1 << 16  # 0..65535, tried first
DEFAULT_EPOCH_SPAN = 1000  # seed + epoch for epochs 0..999 of the common seeds and of dates
BASE_SEED_DRAWS = 2  # a seeded DataLoader draws its workers' base seed (one random64) first
SURVIVORS_PER_MILLION = 4.0  # stage-1 budget: expected wrong candidates reaching stage 2
DEPTH_STEPS = 4  # stage-2 depths a, 2a, 4a, 8a entries per rank (a: opens per local rank)
_WORK_BYTES = 48 << 20  # bound on a chunk's mt19937 arrays

Kind = Literal["distributed", "random"]
KINDS: tuple[Kind, ...] = ("distributed", "random")

COMMON_SEEDS: tuple[int, ...] = (
    # the usual suspects, tried before anything else (negative seeds as torch masks them)
    0,
    1,
    42,
    1234,
    3407,
    123,
    2024,
    12345,
    31337,
    65536,
    2,
    3,
    4,
    5,
    7,
    8,
    10,
    11,
    13,
    17,
    21,
    23,
    24,
    32,
    64,
    69,
    77,
    88,
    99,
    100,
    101,
    111,
    128,
    222,
    233,
    256,
    314,
    321,
    333,
    420,
    512,
    666,
    777,
    888,
    999,
    1000,
    1024,
    1111,
    1337,
    1995,
    1996,
    1997,
    1998,
    1999,
    2000,
    2001,
    2002,
    2003,
    2004,
    2005,
    2006,
    2007,
    2008,
    2009,
    2010,
    2011,
    2012,
    2013,
    2014,
    2015,
    2016,
    2017,
    2018,
    2019,
    2020,
    2021,
    2022,
    2023,
    2025,
    2026,
    2027,
    2028,
    2029,
    2030,
    2048,
    2333,
    4096,
    4321,
    5555,
    6666,
    7777,
    8888,
    9999,
    10000,
    11111,
    22222,
    33333,
    42069,
    54321,
    55555,
    65535,
    77777,
    88888,
    99999,
    100000,
    111111,
    123123,
    123456,
    271828,
    314159,
    424242,
    654321,
    666666,
    777777,
    999999,
    1000000,
    1234567,
    3141592,
    7654321,
    9999999,
    10000000,
    12345678,
    31415926,
    87654321,
    99999999,
    100000000,
    123456789,
    314159265,
    987654321,
    1000000000,
    1234567890,
    2147483647,
    2147483648,
    3141592653,
    0xDEADBEEF,
    0xCAFEBABE,
    0xC0FFEE,
    0xBADC0DE,
    0x5EED,
    -1,
    -42,
)


# --------------------------------------------------------------------------------------------
# randperm's first entries
# --------------------------------------------------------------------------------------------


def randperm_prefix(draws: npt.ArrayLike, n: int, length: int) -> I64:
    """The first ``length`` entries of ``torch.randperm(n)`` (n < 214,748,364) from its draws.

    ``draws``: the generator's 32-bit outputs from the permutation's first draw on (at least
    ``min(length, n - 1)`` of them).  Step t swaps a[t] with a[t + z_t], z_t = draw % (n - t), and
    fixes a[t] to what position g = t + z_t holds just then: g itself unless an earlier step j
    targeted g, in which case j left there W(j), what position j held just before step j.  W(j) is
    j unless an earlier step targeted j, and so on: short chains.  One sort of (target, step)
    finds every "last earlier step with the same target", so no Python loop runs per step.
    """
    if n >= THRESHOLD_64BIT:
        raise ValueError(f"n: {n} uses torch's 64-bit randperm, which this replay does not cover")
    if not 0 <= length <= n:
        raise ValueError(f"length: expected 0..{n}, got {length}")
    steps = min(length, n - 1)
    d = np.asarray(draws, dtype=np.uint32)[:steps]
    if d.shape[0] < steps:
        raise ValueError(f"draws: expected at least {steps}, got {d.shape[0]}")
    target = np.arange(length, dtype=np.int64)
    # the last position takes no draw: it behaves as a step with z = 0
    target[:steps] += np.remainder(d, np.arange(n, n - steps, -1, dtype=np.uint32))
    if length == 0:
        return target
    key = target * length + np.arange(length, dtype=np.int64)
    key.sort()
    tgt, step = np.divmod(key, length)
    same = tgt[1:] == tgt[:-1]
    prev = np.full(length, -1, dtype=np.int64)  # the last earlier step with the same target
    prev[step[1:][same]] = step[:-1][same]
    # parent[p]: the last step before p that targeted position p (-1: none, p held p)
    positions = np.arange(length, dtype=np.int64)
    at = np.searchsorted(key, positions * length + positions) - 1
    found = (at >= 0) & (tgt[np.maximum(at, 0)] == positions)
    parent = np.where(found, step[np.maximum(at, 0)], -1)
    has_prev = prev >= 0
    w = prev[has_prev]
    active = np.flatnonzero(parent[w] >= 0)
    while active.size:
        w[active] = parent[w[active]]
        active = active[parent[w[active]] >= 0]
    out = target
    out[has_prev] = w
    return out


# --------------------------------------------------------------------------------------------
# Distinct values
# --------------------------------------------------------------------------------------------


def _distinct(a: I64) -> I64:
    """Sorted distinct values (numpy 2.4's hashing ``np.unique`` is ~50x slower on these arrays)."""
    s = np.sort(a)
    if s.shape[0] < 2:
        return s
    keep = np.empty(s.shape[0], dtype=np.bool_)
    keep[0] = True
    np.not_equal(s[1:], s[:-1], out=keep[1:])
    out: I64 = s[keep]
    return out


# --------------------------------------------------------------------------------------------
# Candidate plans
# --------------------------------------------------------------------------------------------


def seed_value(seed: int) -> int:
    """The 32-bit value torch seeds mt19937 with for ``seed`` (``seed & 0xFFFFFFFF``)."""
    return int(seed) & (SEED_SPACE - 1)


def calendar_dates(first_year: int = 1970, last_year: int = 2099) -> U32:
    """Every valid calendar date of those years as YYYYMMDD, in order (20240229 yes, 20230229 no)."""
    days = np.arange(f"{first_year:04d}-01-01", f"{last_year + 1:04d}-01-01", dtype="datetime64[D]")
    months = days.astype("datetime64[M]")
    year = months.astype(np.int64) // 12 + 1970
    month = months.astype(np.int64) % 12 + 1
    day = (days - months.astype("datetime64[D]")).astype(np.int64) + 1
    out: U32 = (year * 10000 + month * 100 + day).astype(np.uint32)
    return out


class Candidates:
    """An ordered plan of 32-bit seed values, each tried once: listed values first, then ranges.

    Ranges are half-open ``(start, stop)`` within [0, 2**32); parts already covered by a listed
    value or an earlier range are skipped, so ``len()`` is the number of distinct values tried.
    """

    def __init__(
        self, first: Iterable[int] | npt.NDArray[np.integer] = (), ranges: Sequence[tuple[int, int]] = ()
    ) -> None:
        if isinstance(first, np.ndarray):
            if first.size and not np.issubdtype(first.dtype, np.integer):
                raise ValueError("candidates: expected integer seeds")
            listed = first.reshape(-1).astype(np.int64) & (SEED_SPACE - 1)  # wraps like seed & 0xFFFFFFFF
        else:
            listed = np.fromiter((seed_value(v) for v in first), dtype=np.int64)
        _, keep = np.unique(listed, return_index=True)
        self.first: U32 = listed[np.sort(keep)].astype(np.uint32)
        self._first_sorted: U32 = np.sort(self.first)
        covered: list[tuple[int, int]] = []
        pieces: list[tuple[int, int]] = []
        for start, stop in ranges:
            if not 0 <= start <= stop <= SEED_SPACE:
                raise ValueError(f"range: expected 0 <= start <= stop <= 2**32, got ({start}, {stop})")
            for lo, hi in _subtract(start, stop, covered):
                pieces.append((lo, hi))
            covered = _merge([*covered, (start, stop)])
        self.ranges: tuple[tuple[int, int], ...] = tuple(pieces)
        inside = sum(
            int(np.searchsorted(self._first_sorted, hi) - np.searchsorted(self._first_sorted, lo)) for lo, hi in pieces
        )
        self._len = int(self.first.shape[0]) + sum(hi - lo for lo, hi in pieces) - inside

    def __len__(self) -> int:
        return self._len

    def chunks(self, size: int) -> Iterator[U32]:
        """The values in plan order, ``size`` at a time (the last chunk may be shorter)."""
        if size < 1:
            raise ValueError(f"chunk size: expected >= 1, got {size}")
        pending: list[U32] = []
        held = 0
        for piece in self._pieces(size):
            pending.append(piece)
            held += piece.shape[0]
            while held >= size:
                joined = np.concatenate(pending)
                yield joined[:size]
                pending, held = [joined[size:]], held - size
        if held:
            yield np.concatenate(pending)

    def _pieces(self, size: int) -> Iterator[U32]:
        for lo in range(0, self.first.shape[0], size):
            yield self.first[lo : lo + size]
        for start, stop in self.ranges:
            for lo in range(start, stop, size):
                hi = min(stop, lo + size)
                block = np.arange(lo, hi, dtype=np.int64)
                a, b = np.searchsorted(self._first_sorted, [lo, hi])
                if b > a:
                    block = block[~np.isin(block, self._first_sorted[a:b].astype(np.int64), assume_unique=True)]
                yield block.astype(np.uint32)


def _merge(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for lo, hi in sorted(spans):
        if out and lo <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def _subtract(start: int, stop: int, covered: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """[start, stop) minus the sorted disjoint ``covered`` spans."""
    out: list[tuple[int, int]] = []
    pos = start
    for lo, hi in covered:
        if hi <= pos or lo >= stop:
            continue
        if lo > pos:
            out.append((pos, lo))
        pos = max(pos, hi)
    if pos < stop:
        out.append((pos, stop))
    return out


def default_candidates(limit: int = DEFAULT_LIMIT, epoch_span: int = DEFAULT_EPOCH_SPAN) -> Candidates:
    """The default plan, likeliest first.

    1. :data:`COMMON_SEEDS`; 2. 0..65535; 3. the common seeds plus 1..epoch_span-1 (a
    DistributedSampler job in a later epoch shows ``seed + epoch``); 4. every date 19700101..20991231
    (YYYYMMDD), each year as one span from its January 1st to December 31st + epoch_span - 1 (so a
    date seed in any epoch below epoch_span; invalid dates ride along, it is cheaper than listing);
    5. the rest of 0..limit-1.
    """
    if not 0 <= limit <= SEED_SPACE:
        raise ValueError(f"limit: expected 0..2**32, got {limit}")
    if epoch_span < 1:
        raise ValueError(f"epoch_span: expected >= 1, got {epoch_span}")
    common = np.asarray([seed_value(s) for s in COMMON_SEEDS], dtype=np.int64)
    shifted = (np.arange(1, epoch_span, dtype=np.int64)[:, None] + common[None, :]).reshape(-1)
    likely = np.arange(min(LIKELY_RANGE, limit), dtype=np.int64)
    first = np.concatenate([common, likely, shifted[shifted < SEED_SPACE]])
    years = [(y * 10000 + 101, y * 10000 + 1231 + epoch_span) for y in range(1970, 2100)]
    return Candidates(first=first, ranges=[*years, (min(LIKELY_RANGE, limit), limit)])


# --------------------------------------------------------------------------------------------
# Results
# --------------------------------------------------------------------------------------------

Status = Literal["found", "not_found", "not_searchable", "too_few_opens"]


@dataclass(frozen=True)
class SeedMatch:
    """A seed value that explains the opens, and how sure that is.

    ``value``: the 32-bit generator seed.  kind ``distributed``: ``value == (seed + epoch) &
    0xFFFFFFFF`` (``identifies == "seed+epoch"``): planning with seed ``value`` from epoch 0 predicts
    this epoch and the next ones.  kind ``random`` (a DataLoader with a seeded generator and no
    DistributedSampler, epoch 0): ``value == seed & 0xFFFFFFFF``.
    """

    value: int
    kind: Kind
    identifies: Literal["seed", "seed+epoch"]
    node: int | None  # the node hosting the opens (distributed); None when every rank reads the same order
    sampler_drop_last: bool | None  # DistributedSampler(drop_last=...) when the opens told them apart
    depth: int  # entries per local rank (or of the shared order) compared with the opens
    hits: int  # distinct opened files among the predicted ones
    opens: int  # distinct opened files compared
    predicted: int  # distinct predicted files
    false_match_chance: float  # chance that any wrong candidate of the plan fits this well

    def describe(self) -> str:
        if self.kind == "distributed":
            where = f" on node {self.node}" if self.node is not None else ""
            return (
                f"DistributedSampler: seed + epoch = {self.value}{where}; {self.hits} of {self.opens} opens fit "
                f"(false-match chance {self.false_match_chance:.1e})"
            )
        return (
            f"DataLoader(shuffle=True, generator seeded {self.value}), epoch 0; {self.hits} of {self.opens} "
            f"opens fit (false-match chance {self.false_match_chance:.1e})"
        )


@dataclass(frozen=True)
class SearchResult:
    """How a search ended.  ``status``: ``found`` (``match`` set), ``not_found`` (the whole plan
    tried), ``not_searchable`` (a dataset torch permutes with 64-bit draws, or of one file) or
    ``too_few_opens`` (not even a perfect fit could be told from chance yet: search again later)."""

    status: Status
    match: SeedMatch | None
    candidates_tried: int
    candidates_planned: int
    comparisons: int  # hypotheses the plan tests in all (what false_match_chance is multiplied by)
    checked: int  # (candidate, hypothesis) pairs that reached the exact check
    best_chance: float  # smallest false-match chance seen (the match's, or the closest miss's)
    reason: str

    @property
    def found(self) -> bool:
        return self.match is not None


@dataclass(frozen=True)
class SearchProgress:
    """Where a search stands after one chunk; ``result`` is set on the last step."""

    tried: int
    planned: int
    checked: int
    result: SearchResult | None = None


# --------------------------------------------------------------------------------------------
# The search
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Filter:
    """Stage 1 for one sampler kind: a cheap look-up over every candidate (1a), then a count over the
    first outputs of mt19937 for the few that pass it (1b)."""

    rank_positions: I64  # 1a: entries of each local rank's stream looked up
    need: int  # 1a: of the ranks_per_node * len(rank_positions) look-ups, at least this many opened
    outputs: int  # 1b: mt19937 outputs computed per candidate
    depths: tuple[int, ...]  # 1b: entries per local rank counted
    need_at: tuple[int, ...]  # 1b: opened files needed at each depth (tail chance within the budget)


@dataclass(frozen=True)
class _Hypothesis:
    """One way the opens could have come about: a sampler kind, a node, a variant, a depth."""

    kind: Kind
    node: int | None
    drop_last: bool | None
    depth: int  # entries per local rank (distributed) or of the shared order (random) predicted
    predicted: int  # distinct files among them


class SeedSearch:
    """Search one node's first opens for the seed of the sampler that produced them.

    ``opens``: dataset indices (0..n-1) in open order, the node's first ones.  ``shape``: the job's
    world size, ranks per node and rank order (batch size and drop_last are not used).  ``kinds``:
    which samplers to consider.  ``candidates``: the plan (default :func:`default_candidates`).
    ``max_opens``: only the first this many opens are used (evidence saturates long before).
    """

    def __init__(
        self,
        n: int,
        opens: npt.ArrayLike,
        shape: JobShape,
        *,
        kinds: Sequence[Kind] = KINDS,
        candidates: Candidates | None = None,
        threshold: float = FALSE_LOCK,
        chunk: int = 1 << 16,
        max_opens: int = 4096,
    ) -> None:
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
            raise ValueError(f"n: expected a dataset of at least 1 file, got {n!r}")
        if not 0 < threshold < 1:
            raise ValueError(f"threshold: expected a probability in (0, 1), got {threshold}")
        for kind in kinds:
            if kind not in KINDS:
                raise ValueError(f"kind: expected one of {', '.join(KINDS)}, got {kind!r}")
        if chunk < 1 or max_opens < 1:
            raise ValueError("chunk and max_opens: expected positive integers")
        arr = np.asarray(opens)
        if arr.ndim != 1 or (arr.size and not np.issubdtype(arr.dtype, np.integer)):
            raise ValueError("opens: expected a flat list of integer dataset indices")
        arr = arr[:max_opens].astype(np.int64)
        if arr.size and (int(arr.min()) < 0 or int(arr.max()) >= n):
            bad = int(arr[(arr < 0) | (arr >= n)][0])
            raise ValueError(f"opens: index {bad} is outside the dataset's 0..{n - 1}")
        self.n = int(n)
        self.shape = shape
        self.threshold = float(threshold)
        self.candidates = candidates if candidates is not None else default_candidates()
        self.planned = len(self.candidates)
        self.opened = _distinct(arr)
        self.member = np.zeros(0, dtype=np.uint8)  # per file: 1 if opened (stage 1 looks entries up here)
        self._chunk = chunk
        self._node_ranks = np.asarray([shape.ranks_of_node(k) for k in range(shape.nodes)], dtype=np.int64)
        self.reason = ""
        self.kinds: tuple[Kind, ...] = ()
        self.hypotheses: list[_Hypothesis] = []
        self.filters: dict[Kind, _Filter] = {}
        self.outputs = 0  # mt19937 outputs computed per candidate in stage 1a
        self.status: Status | None = None
        if self.n >= THRESHOLD_64BIT:
            self.status = "not_searchable"
            self.reason = f"{self.n} files: torch's randperm uses 64-bit draws from 214,748,364 files on"
        elif self.n < 2:
            self.status = "not_searchable"
            self.reason = "a dataset of one file has a single order"
        elif not kinds:
            self.status = "not_searchable"
            self.reason = "no sampler kind to search"
        else:
            self._plan(tuple(dict.fromkeys(kinds)))

    # ---- planning ----------------------------------------------------------------------------

    @property
    def comparisons(self) -> int:
        """Every (candidate, hypothesis) the plan tests: what a tail chance is multiplied by."""
        return self.planned * len(self.hypotheses)

    def _per_rank_opens(self, kind: Kind) -> int:
        """Opens per local rank: every rank reads its own entries (distributed) or the same ones."""
        local = self.shape.ranks_per_node if kind == "distributed" else 1
        return max(1, math.ceil(int(self.opened.shape[0]) / local))

    def _num_samples(self, drop_last: bool | None) -> int:
        """DistributedSampler's entries per rank: it truncates (drop_last) or pads to a multiple of the world."""
        n, world = self.n, self.shape.world_size
        return math.ceil((n - world) / world) if drop_last and n % world else math.ceil(n / world)

    def _positions(self, h: _Hypothesis) -> I64:
        """Where in the permutation the hypothesis' predicted files sit (padding wraps around)."""
        if h.kind == "random":
            return np.arange(h.depth, dtype=np.int64)
        assert h.node is not None
        world = self.shape.world_size
        t: I64 = self._node_ranks[h.node][None, :] + world * np.arange(h.depth, dtype=np.int64)[:, None]
        return np.remainder(t.reshape(-1), self.n)

    def _hypotheses(self, kind: Kind) -> list[_Hypothesis]:
        n, a = self.n, self._per_rank_opens(kind)
        if kind == "random":
            return [
                _Hypothesis("random", None, None, d, d) for d in sorted({min(n, a << i) for i in range(DEPTH_STEPS)})
            ]
        world = self.shape.world_size
        variants: list[bool | None] = [None]
        if n % world and world * (a << (DEPTH_STEPS - 1)) > (n // world) * world:
            variants = [False, True]  # the padding or the truncation is within reach
        out: list[_Hypothesis] = []
        for node in range(self.shape.nodes):
            for drop_last in variants:
                for d in sorted({min(self._num_samples(drop_last), a << i) for i in range(DEPTH_STEPS)}):
                    h = _Hypothesis("distributed", node, drop_last, d, 0)
                    t = self._positions(h)
                    predicted = int(_distinct(t).shape[0]) if world * d > n else int(t.shape[0])
                    out.append(_Hypothesis("distributed", node, drop_last, d, predicted))
        return out

    def _best_chance(self, h: _Hypothesis) -> float:
        """The tail chance this hypothesis would reach if every open fitted (its best case)."""
        k = int(self.opened.shape[0])
        return hypergeom_sf(min(k, h.predicted), self.n, k, h.predicted)

    def _plan(self, kinds: tuple[Kind, ...]) -> None:
        if self.opened.shape[0] == 0:
            self.status, self.reason = "too_few_opens", "no opens yet"
            return
        self.member = np.zeros(self.n, dtype=np.uint8)
        self.member[self.opened] = 1
        if "distributed" in kinds and self.n <= self.shape.world_size:
            kinds = tuple(k for k in kinds if k != "distributed")
        hyps = [h for k in kinds for h in self._hypotheses(k)]
        best = {h: self._best_chance(h) for h in hyps}
        # keep only hypotheses that could pass; dropping some lowers the factor for the others
        while True:
            factor = self.planned * len(hyps)
            keep = [h for h in hyps if best[h] * factor < self.threshold]
            if len(keep) == len(hyps):
                break
            hyps = keep
        if not hyps:
            self.status = "too_few_opens"
            self.reason = (
                f"{self.opened.shape[0]} distinct opens of {self.n} files cannot single out one of "
                f"{self.planned} candidates with a false-match chance below {self.threshold:g}; feed more opens"
            )
            return
        self.hypotheses = hyps
        self.kinds = tuple(k for k in KINDS if any(h.kind == k for h in hyps))
        for kind in self.kinds:
            self.filters[kind] = f = self._filter(kind)
            stride, offset = self._layout(kind)
            self.outputs = max(self.outputs, offset + (int(f.rank_positions.max()) + 1) * stride)

    def _filter(self, kind: Kind) -> _Filter:
        """Stage 1's look-ups and thresholds for one kind (see :func:`_lookups`)."""
        k = int(self.opened.shape[0])
        q = k / self.n
        stride, offset = self._layout(kind)
        unit = self.shape.ranks_per_node if kind == "distributed" else 1
        pairs = self.shape.nodes if kind == "distributed" else 1
        rank_positions, need = _lookups(
            self._per_rank_opens(kind), self.shape.batch_size, unit, stride, offset, self.n, q, pairs
        )
        # 1b: the statistic of the exact check, on the entries ignoring swap collisions, as deep as
        # the first few thousand outputs reach; a wrong candidate passes with the survivor budget
        cap = min(max(MT_N, 16 * stride + offset), 4 * MT_N)
        deepest = max(h.depth for h in self.hypotheses if h.kind == kind)
        reach = max(1, min(deepest, (cap - offset) // stride, (self.n - 1) // stride))
        depths = sorted({h.depth for h in self.hypotheses if h.kind == kind and h.depth <= reach} | {reach})
        beta = SURVIVORS_PER_MILLION * 1e-6 / (pairs * len(depths))
        need_at = tuple(_least_hits(self.n, k, unit * d, beta) for d in depths)
        return _Filter(rank_positions, need, offset + reach * stride, tuple(depths), need_at)

    def _layout(self, kind: Kind) -> tuple[int, int]:
        """(entries of the order per step of one rank, draws before the permutation starts)."""
        return (self.shape.world_size, 0) if kind == "distributed" else (1, BASE_SEED_DRAWS)

    # ---- stage 1 -----------------------------------------------------------------------------

    def _survivors(self, values: U32) -> dict[int, set[tuple[Kind, int | None]]]:
        """Stage 1 on a chunk: value -> the (kind, node) pairs worth an exact check."""
        draws = mt19937_outputs(values, self.outputs)
        out: dict[int, set[tuple[Kind, int | None]]] = {}
        for kind, f in self.filters.items():
            stride, offset = self._layout(kind)
            # 1a: the global positions of the looked-up entries of every rank
            t = (f.rank_positions[:, None] * stride + np.arange(stride)[None, :]).reshape(-1)
            hit = self._naive_hits(draws[offset + t], t)
            counts = self._per_node(
                kind, hit.reshape(f.rank_positions.shape[0], stride, -1).sum(axis=0, dtype=np.uint16)
            )
            passed = np.flatnonzero((counts >= f.need).any(axis=0))
            for lo in range(0, passed.shape[0], max(1, _WORK_BYTES // (12 * f.outputs))):
                sel = passed[lo : lo + max(1, _WORK_BYTES // (12 * f.outputs))]
                for k, i in self._deep_count(kind, f, values[sel]):
                    out.setdefault(int(values[sel[i]]), set()).add((kind, k))
        return out

    def _naive_hits(self, draws: U32, t: I64) -> npt.NDArray[np.uint8]:
        """Whether the file at permutation position t (rows) was opened, per candidate (columns).

        The file is taken as ``t + draw % (n - t)``: exact unless an earlier swap moved it (for the
        first few entries of a large dataset, rare; a true seed only loses a hit or two to it).
        """
        steps = t.astype(np.uint32)[:, None]
        z = draws % (np.uint32(self.n) - steps)
        z += steps
        hit: npt.NDArray[np.uint8] = self.member.take(z)
        return hit

    def _per_node(self, kind: Kind, per_rank: npt.NDArray[np.uint16]) -> npt.NDArray[np.uint16]:
        """(ranks, c) counts -> (nodes, c) (distributed); the shared order's (1, c) as it is."""
        if kind == "random":
            return per_rank
        out: npt.NDArray[np.uint16] = per_rank[self._node_ranks].sum(axis=1, dtype=np.uint16)
        return out

    def _deep_count(self, kind: Kind, f: _Filter, values: U32) -> list[tuple[int | None, int]]:
        """1b: (node, index into values) of those whose count at some depth reaches its threshold."""
        if values.shape[0] == 0:
            return []
        stride, offset = self._layout(kind)
        draws = mt19937_outputs(values, f.outputs)
        reach = f.depths[-1]
        t = np.arange(reach * stride, dtype=np.int64)
        hit = self._naive_hits(draws[offset : offset + t.shape[0]], t).reshape(reach, stride, -1)
        cum = np.cumsum(hit, axis=0, dtype=np.uint16)  # (depth, rank, c): opened among the first entries
        ok = np.zeros((self.shape.nodes if kind == "distributed" else 1, values.shape[0]), dtype=np.bool_)
        for d, need in zip(f.depths, f.need_at, strict=True):
            ok |= self._per_node(kind, cum[d - 1]) >= need
        nodes, idx = np.nonzero(ok)
        return [
            (None if kind == "random" else int(k), int(i)) for k, i in zip(nodes.tolist(), idx.tolist(), strict=True)
        ]

    # ---- stage 2 -----------------------------------------------------------------------------

    def evaluate(self, value: int, only: Iterable[tuple[Kind, int | None]] | None = None) -> SeedMatch | None:
        """The exact check of one seed value: its best-fitting hypothesis, accepted or not.

        ``only``: restrict to these (kind, node) pairs.  ``false_match_chance`` is the tail chance
        times :attr:`comparisons`; the caller compares it with the threshold (or use :meth:`steps`).
        None when the search has no hypothesis to test.
        """
        if not self.hypotheses:
            return None
        allowed = set(only) if only is not None else None
        hyps = [h for h in self.hypotheses if allowed is None or (h.kind, h.node) in allowed]
        if not hyps:
            return None
        v = seed_value(value)
        positions = {h: self._positions(h) for h in hyps}
        lengths = {kind: 0 for kind in KINDS}
        for h, t in positions.items():
            lengths[h.kind] = max(lengths[h.kind], int(t.max()) + 1)
        need = max(lengths["distributed"], BASE_SEED_DRAWS + lengths["random"] if lengths["random"] else 0)
        draws = Mt19937Stream(v).draws(need)
        perms: dict[Kind, I64] = {}
        if lengths["distributed"]:
            perms["distributed"] = randperm_prefix(draws, self.n, lengths["distributed"])
        if lengths["random"]:
            perms["random"] = randperm_prefix(draws[BASE_SEED_DRAWS:], self.n, lengths["random"])
        best: SeedMatch | None = None
        k = int(self.opened.shape[0])
        for h in hyps:
            files = perms[h.kind][positions[h]]
            if h.predicted < files.shape[0]:  # padding repeats files
                files = _distinct(files)
            predicted = int(files.shape[0])
            hits = int(self.member.take(files).sum())
            chance = min(1.0, hypergeom_sf(hits, self.n, k, predicted) * self.comparisons)
            if best is None or chance < best.false_match_chance:
                best = SeedMatch(
                    value=v,
                    kind=h.kind,
                    identifies="seed+epoch" if h.kind == "distributed" else "seed",
                    node=h.node,
                    sampler_drop_last=h.drop_last,
                    depth=h.depth,
                    hits=hits,
                    opens=k,
                    predicted=predicted,
                    false_match_chance=chance,
                )
        return best

    # ---- driving -----------------------------------------------------------------------------

    def steps(self) -> Generator[SearchProgress, None, None]:
        """Run the plan one chunk per step; the last step carries the result.

        Stop iterating (or ``close()`` the generator) to cancel; nothing needs cleaning up.
        """
        if self.status is not None:
            yield SearchProgress(0, self.planned, 0, self._result(self.status, None, 0, 0, 1.0, self.reason))
            return
        chunk = max(256, min(self._chunk, _WORK_BYTES // (4 * (3 * self.outputs + 8))))
        tried = checked = 0
        best_chance = 1.0
        for values in self.candidates.chunks(chunk):
            matches: list[SeedMatch] = []
            for v, pairs in self._survivors(values).items():
                checked += len(pairs)
                m = self.evaluate(v, pairs)
                if m is None:
                    continue
                best_chance = min(best_chance, m.false_match_chance)
                if m.false_match_chance < self.threshold:
                    matches.append(m)
            tried += int(values.shape[0])
            if matches:
                m = min(matches, key=lambda x: x.false_match_chance)
                why = m.describe()
                if len(matches) > 1:
                    why += f"; {len(matches) - 1} other candidate(s) also fit"
                yield SearchProgress(
                    tried, self.planned, checked, self._result("found", m, tried, checked, m.false_match_chance, why)
                )
                return
            yield SearchProgress(tried, self.planned, checked)
        why = f"none of {tried} candidates fits with a false-match chance below {self.threshold:g}"
        why += f" (best {best_chance:.2g})"
        yield SearchProgress(
            tried, self.planned, checked, self._result("not_found", None, tried, checked, best_chance, why)
        )

    def run(self) -> SearchResult:
        """The whole plan at once (tests, benchmarks); a daemon drives :meth:`steps` instead."""
        result: SearchResult | None = None
        for progress in self.steps():
            result = progress.result
        assert result is not None
        return result

    def _result(
        self, status: Status, match: SeedMatch | None, tried: int, checked: int, best: float, reason: str
    ) -> SearchResult:
        return SearchResult(
            status=status,
            match=match,
            candidates_tried=tried,
            candidates_planned=self.planned,
            comparisons=self.comparisons,
            checked=checked,
            best_chance=best,
            reason=reason,
        )


PASS_1A = 0.05  # share of wrong candidates stage 1a may let through to 1b


def _lookups(
    per_rank_opens: int, batch: int, unit: int, stride: int, offset: int, n: int, q: float, pairs: int
) -> tuple[I64, int]:
    """Stage 1a: which entries of each local rank to look up, and how many must have been opened.

    The first J entries of the rank's first and (where its draws come early enough) second batch:
    DataLoader workers fetch batch i on worker i % W, each opening its batch in order, so these are
    opened first whatever W is; a rank that opened ``per_rank_opens`` files in order has opened
    them too.  The fewest look-ups for which a wrong candidate passes at most PASS_1A of the time
    while a true one may miss three in four (workers far apart, a late rank, a moved entry); the
    look-ups stay within mt19937's first 227 outputs where the world allows.
    """
    cap = LOW_OUTPUTS if stride + offset <= LOW_OUTPUTS else max(MT_N, stride + offset)
    batches = min(2, max(1, math.ceil(per_rank_opens / batch)))
    fallback: tuple[I64, int] | None = None
    for j in (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192):
        if j > max(1, min(batch, per_rank_opens)):
            break
        heads = max((k for k in range(1, batches + 1) if ((k - 1) * batch + j) * stride + offset <= cap), default=0)
        if heads == 0 or ((heads - 1) * batch + j) * stride > n - 1:
            break
        positions = (np.arange(heads, dtype=np.int64)[:, None] * batch + np.arange(j)[None, :]).reshape(-1)
        positions = _distinct(positions)
        checks = unit * int(positions.shape[0])
        need = next((h for h in range(1, checks + 1) if pairs * binom_sf(h, checks, q) <= PASS_1A), checks)
        fallback = (positions, need)
        if need <= max(1, checks // 4):
            break
    if fallback is None:  # even one entry per rank lies past the world's first outputs
        return np.zeros(1, dtype=np.int64), 1
    return fallback


def _least_hits(n: int, opened: int, predicted: int, beta: float) -> int:
    """The fewest opened files among ``predicted`` ones whose tail chance is at most ``beta``
    (``min(opened, predicted) + 1`` when no count is that unlikely)."""
    lo, hi = 0, min(opened, predicted) + 1
    while lo < hi:
        mid = (lo + hi) // 2
        if hypergeom_sf(mid, n, opened, predicted) <= beta:
            hi = mid
        else:
            lo = mid + 1
    return lo
