"""The read path's optional observers, in one record built in one place.

Components that only watch the read path (seed discovery, the peer group's note, the persisted
snapshot's staleness) are told through these hooks; what the read path needs to work is a
constructor argument instead.  The record is frozen and passed to constructors (``build_readpath``
in :mod:`fusefs.daemon.assembly` builds it), so nobody sets or registers a hook on a component after
it was built (``tests/test_layering.py`` checks the sources for that).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from fusefs.readpath.contract import CursorView, SeedInDoubt

MineMask = Callable[[npt.NDArray[np.int64]], npt.NDArray[np.bool_]]
"""Which of the given cached entries this node rechecks in its background rounds."""


def _always_trusted() -> bool:
    return True


def _all_mine(entries: npt.NDArray[np.int64]) -> npt.NDArray[np.bool_]:
    return np.ones(entries.shape, np.bool_)


def _every_round() -> int:
    return 1


@dataclass(frozen=True)
class ReadPathHooks:
    """Optional observers of the read path and questions it asks outside itself; the defaults are
    a mount alone, with no seed discovery."""

    on_open: Callable[[int], None] | None = None
    """Every open of a dataset file, by entry (seed discovery records them).  An observer only: it
    must not read or call the read path (``Prefetcher.book`` calls it for a run of opens before
    their policy steps)."""
    on_view: Callable[[CursorView], None] | None = None
    """Every view the cursor publishes for the current plan (seed discovery starts a search when the
    lead dataset's opens do not fit a written seed)."""
    on_view_change: Callable[[], None] | None = None
    """The view's plan, state, node or epoch changed (the peer group sends its note early)."""
    on_source_changed: Callable[[str, str], None] | None = None
    """The revalidator found a source file changed: (relative path, reason); the daemon marks the
    persisted snapshot outdated so the next mount walks the source again."""
    on_seed_doubt: Callable[[SeedInDoubt], None] | None = None
    """The opens fit no epoch, node or position of the plan for the seed in use (the policy's
    ``SeedInDoubt``); seed discovery follows the views instead, so the daemon sets none today."""
    seed_trusted: Callable[[], bool] = _always_trusted
    """False while the seed is only assumed (nobody wrote one)."""
    mine: MineMask = _all_mine
    """The revalidator's background rounds: which cached entries this node rechecks (in a group,
    those it owns; :func:`placement.recheck.rechecked_here`)."""
    replicas_every: Callable[[], int] = _every_round
    """Every this many rounds the revalidator rechecks replicas of other owners' files too (the
    group's size, asked each round: a rendezvous group grows after the mount)."""


NO_HOOKS = ReadPathHooks()
"""A mount alone with nobody watching (in-process tests, benchmarks)."""
