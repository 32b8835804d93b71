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

Which files are a node's own is decided here too (:func:`rechecked_here`): those the plan makes it
the primary owner of, and those no other known member answers for (their holders check them).

Pure: arrays and numbers in, arrays and numbers out.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import numpy as np
import numpy.typing as npt


class Owners(Protocol):
    """What the ownership decision needs of a plan (:class:`placement.plan.Plan` is one)."""

    def owner_of(self, gids: npt.NDArray[np.int64]) -> npt.NDArray[np.int32]: ...


def rechecked_here(
    entries: npt.NDArray[np.int64],
    entry_gid: npt.NDArray[np.integer],
    plan: Owners | None,
    node: int | None,
    member_of: Callable[[int], object] | None,
) -> npt.NDArray[np.bool_]:
    """Which of the cached ``entries`` this node checks in every round (``mine`` for
    :func:`round_entries`): those the plan gives it to own, those nobody owns, and those whose owner
    no member answers for.  Every entry while it knows no plan, no node of its own, or no group.

    ``entry_gid``: snapshot entry -> the plan's global id (-1: not in the plan; entries past its end
    are not either).  ``member_of(node)``: the member answering for ``node``, None when none does.
    """
    if plan is None or node is None or member_of is None:
        return np.ones(entries.shape, np.bool_)
    inside = entries < entry_gid.shape[0]
    g = np.where(inside, entry_gid[np.where(inside, entries, 0)], -1).astype(np.int64)
    owner = np.where(g >= 0, plan.owner_of(np.maximum(g, 0)), -1)
    known = {int(o) for o in np.unique(owner).tolist() if o >= 0 and member_of(int(o)) is not None}
    mine: npt.NDArray[np.bool_] = (owner == node) | (owner < 0) | ~np.isin(owner, list(known))
    return mine


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
