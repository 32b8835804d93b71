"""Which member of a daemon group reads a file from the PFS when no plan can be trusted.

A plan names an owner per file (:mod:`placement.assign`), but it is the plan of one seed, and its
owners are training nodes that each daemon learns from its readers' opens.  When prediction fails
(no trusted seed, a wrong one, a sampler the planner does not model) neither is known, and each
node would read from the PFS every file its readers miss: N nodes, up to N reads of each file.

The fallback owner depends only on the file and on who is in the group: rendezvous hashing
(highest random weight) of the snapshot entry over the members' keys.  Every member computes the
same owner without talking to the others (snapshots agree across a group: formation compares their
digests), the owners spread the files evenly, the choice does not move while membership stays the
same, and a member joining or leaving moves only the files it wins or held (about 1/N of them).

Pure: integers in, integers out; the member keys are strings the caller builds.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
import xxhash

U64 = npt.NDArray[np.uint64]
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def member_seed(key: str) -> int:
    """A member's 64-bit hashing seed, from its key (the same on every node and in every process)."""
    return int(xxhash.xxh3_64_intdigest(key.encode("utf-8", "surrogateescape")))


def _mix(x: U64) -> U64:
    """splitmix64's finaliser, in place on a fresh array: a bijection that spreads every input bit."""
    x ^= x >> np.uint64(30)
    x *= _M1
    x ^= x >> np.uint64(27)
    x *= _M2
    x ^= x >> np.uint64(31)
    return x


def owners(entries: npt.ArrayLike, seeds: Sequence[int]) -> npt.NDArray[np.int32]:
    """Per entry, the index in ``seeds`` of its owner (-1 for all when there is no member).

    Rendezvous hashing: each (entry, member) pair gets a pseudo-random weight and the heaviest
    member wins; ties (one in 2**64) go to the lower index.
    """
    e = np.asarray(entries, dtype=np.int64).astype(np.uint64)
    best = np.full(e.shape, -1, np.int32)
    if not seeds:
        return best
    top = np.zeros(e.shape, np.uint64)
    with np.errstate(over="ignore"):
        base = _mix(e * _GOLDEN)
        for i, seed in enumerate(seeds):
            w = _mix(base ^ np.uint64(seed & 0xFFFFFFFFFFFFFFFF))
            better = (w > top) | (best < 0)
            best[better] = i
            np.maximum(top, w, out=top)
    return best


def owner(entry: int, seeds: Sequence[int]) -> int:
    """The owner of one entry (see :func:`owners`)."""
    return int(owners([entry], seeds)[0])
