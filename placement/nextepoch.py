"""What a node reads next epoch that it does not read this epoch, and when a peer has each file.

In a group each node reads one share of the dataset per epoch; next epoch it reads a different
share, most of which other nodes read now.  Each such file is on the node holding it (its plan
owner, who reads it first) from the moment that node's ranks get to it, and since ranks of a
data-parallel job advance in step (every step ends in an allreduce), "the position this node's
ranks reached" says which of those files its peers have by now.  The daemon fetches them from
there ahead of the next epoch, never from the PFS (see :mod:`fusefs.readpath.policy`).

Pure: plan arrays in, arrays out.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from placement.jobstreams import DatasetStreams
from placement.plan import Plan

I64 = npt.NDArray[np.int64]

# Files a holder has from the start of the epoch are released over this share of it, in the order
# the node needs them next epoch: at once, they made a burst of peer transfers that the readers'
# opens waited behind at the epoch's start.
SPREAD = 0.75

# Epochs a lane carries from an epoch in which the job reads a dataset for the first time
# (:func:`reads_first`).  There the readers wait on the PFS, and the peer transfers that fetch what
# a node reads later cost CPU nobody waits on; in a later epoch they take the trio thread the
# readers' opens wait on.  With one epoch, epoch 1 of two nodes carried about 500 per
# node (what epoch 2 reads and the node had not read yet), and was their slowest later epoch
# (tools/bench/train --nodes 2, tools/RESULTS.md).  Each later epoch carries only the next one.
AHEAD_FIRST = 2


def first_epochs(plan: Plan, upto: int) -> dict[int, int]:
    """Per dataset offset, the first job epoch (at most ``upto``) in which the job reads it."""
    js = plan.job_streams()
    first: dict[int, int] = {}
    for e in range(upto + 1):
        for d, _sampler_epoch in js.phases(e):
            first.setdefault(d.offset, e)
    return first


def first_read(plan: Plan, epoch: int) -> list[DatasetStreams]:
    """The datasets the job reads for the first time in job epoch ``epoch``."""
    starts = first_epochs(plan, epoch)
    return [d for d, _sampler_epoch in plan.job_streams().phases(epoch) if starts.get(d.offset) == epoch]


def reads_first(plan: Plan, epoch: int) -> bool:
    """Whether job epoch ``epoch`` reads a training dataset (one that follows none) for the first
    time.  Its readers then wait on the PFS (each node reads its share from it once), and work a
    node does for later epochs costs CPU nobody waits on.  A validation set read for the first
    time after some epochs does not count: the training reads of that epoch come from caches."""
    return _starts_training(first_read(plan, epoch))


def _starts_training(fresh: list[DatasetStreams]) -> bool:
    """Whether the datasets first read in an epoch (:func:`first_read`) include a training one."""
    return any(d.follows is None for d in fresh)


def next_epoch_reads(plan: Plan, node: int, epoch: int, hold_off: int = 0) -> tuple[I64, I64]:
    """(entries, ready_at) for ``node`` in the epochs after job epoch ``epoch``: the lane of ``epoch``.

    ``entries``: what ``node`` opens in epoch ``epoch + 1`` and none of its ranks opens in
    ``epoch``, each once, in the order it opens them; in an epoch in which the job reads a training
    dataset for the first time (:func:`reads_first`), followed by what it opens in epoch ``epoch +
    2`` and opens in neither epoch before, in the same order (:data:`AHEAD_FIRST`). ``ready_at``:
    for each, the position of ``epoch`` (in a rank's stream) from which to fetch it: where another
    rank first reads it in ``epoch`` when the job reads its dataset for the first time then; else
    (it was read in an earlier epoch: its holder has it now) its share of the first ``SPREAD`` of
    the epoch after its first ``hold_off`` positions, the first at ``hold_off - 1``.

    Files no node holds in its tiers (the plan gives them no owner), and files of a dataset first
    read in ``epoch`` that nobody reads then, are left out: nobody could serve them from a copy.

    ``hold_off``: the positions a rank's DataLoader reads in its first moments (the daemon passes
    the cursor's window: twice the batches its workers keep in flight).  Each epoch starts with
    fresh workers reading their first batches one file after another while the rank waits for
    them, and peer transfers then take the trio thread their opens wait on: tier fills did, 30-45
    ms of each daemon's first 200 ms of every later epoch on two nodes (tools/bench/train --nodes
    2; they now wait the same way, ``ReadPolicy._pump_fill``).  There the lane moved few files,
    most next-epoch files being the fills' memory-tier replicas; on a node without a memory tier
    the lane moves them all.  At most half the spread is held off, so a short epoch leaves room.
    """
    js = plan.job_streams()
    fresh = first_read(plan, epoch)
    later = range(epoch + 1, epoch + 1 + (AHEAD_FIRST if _starts_training(fresh) else 1))
    ahead = np.concatenate([js.node_stream(e, node) for e in later])
    now = js.epoch_map(epoch)
    mine = np.asarray(js.shape.ranks_of_node(node), dtype=np.int64)
    gids = ahead[~np.isin(now.rank_of[ahead].astype(np.int64), mine)]
    held = plan.owner()[gids] >= 0
    gids = gids[held]
    entries = plan.entry_of(gids).astype(np.int64)
    _unique, first = np.unique(entries, return_index=True)
    keep = np.sort(first)
    gids, entries = gids[keep], entries[keep]
    read_by = now.rank_of[gids].astype(np.int64)
    position = now.pos_of[gids].astype(np.int64)
    new_now = np.zeros(gids.shape[0], np.bool_)
    for d in fresh:
        new_now |= (gids >= d.offset) & (gids < d.offset + d.n)
    ready = np.where(new_now, position, -1).astype(np.int64)
    unread = new_now & (read_by < 0)  # read by nobody yet: no holder has it before the epoch starts
    entries, ready = entries[~unread], ready[~unread]
    held_now = np.flatnonzero(ready < 0)
    if held_now.shape[0]:
        span = int(SPREAD * min(now.length(int(r)) for r in mine))
        start = min(max(0, hold_off), span // 2)
        spread = np.arange(held_now.shape[0], dtype=np.int64) * (span - start) // held_now.shape[0]
        ready[held_now] = start + spread - 1
    return entries, ready
