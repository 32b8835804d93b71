"""Which cached files a background revalidation round stats, and what staleness that promises.

Each node rechecks the sources of the cached files it owns every round; its replicas of files other
nodes own only every ``every``-th round (``every`` = the group's size), because no message tells it
what the owner saw.  Round ``r`` covers the replicas when ``r % every == 0``.

Rounds must be counted even when there is nothing of this node's own to check: a node whose cache
holds only replicas (its owned files not cached, or all seen changed) would otherwise never reach
its next replica round, and its replicas would go unchecked for the rest of the mount.  A round with
nothing to stat lasts the minimum round time and counts.

The promise: a change made right after a file's check is seen at its next check.  An owned file is
checked once per round, so within one round's time; a replica once per ``every`` rounds, so within
``every - 1`` owner rounds and one full round.  Opens do not stat a file already checked in this
mount, so these are the bounds for serving a copy.

Pure: arrays and numbers in, arrays and numbers out.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt


def with_replicas(round_number: int, every: int) -> bool:
    """Whether round ``round_number`` also rechecks this node's replicas of other owners' files."""
    return round_number % max(1, every) == 0


def round_entries(
    cached: npt.NDArray[np.int64], mine: npt.NDArray[np.bool_], round_number: int, every: int
) -> npt.NDArray[np.int64]:
    """The entries round ``round_number`` stats: every cached one on replica rounds, else those this
    node owns (``mine``, aligned with ``cached``).  May be empty: the round still counts."""
    if with_replicas(round_number, every):
        return cached
    out: npt.NDArray[np.int64] = cached[mine]
    return out


def round_seconds(files: int, rate: float, min_round: float) -> float:
    """How long a round of ``files`` stats at ``rate`` per second takes (at least ``min_round``)."""
    return max(files / rate, min_round)


def replica_bound_seconds(owned: int, held: int, rate: float, every: int, min_round: float) -> float:
    """Longest a replica can be served after its source changed: ``every - 1`` rounds of the
    ``owned`` files and one round of all ``held`` ones (every cached file, replicas included)."""
    every = max(1, every)
    return (every - 1) * round_seconds(owned, rate, min_round) + round_seconds(held, rate, min_round)
