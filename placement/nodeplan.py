"""Plans at cluster scale: one node's reads exactly, everybody else's through a rule all nodes share.

The dense planner (:func:`placement.frequency.access_stats` then :func:`placement.assign.assign`)
keeps every node's read counts and first uses, (nodes x files) arrays: 5 GB at 256 nodes over
ImageNet-1k, 54 GiB at 1,024 nodes over 14 million files.  A node acts on its own tiers and fill
order and on one owner per file; this module computes those in memory that grows with the files, not
with nodes x files:

* :func:`node_pass`: one pass over the job's segments that keeps ``node``'s counts and first uses
  exactly, and per file what every node can compute alike: the job's first read of it (position and
  node) and its total reads.  O(files) memory.  A segment costs a permutation, or, after a whole
  epoch of its dataset, only ``node``'s entries of it (:func:`placement.randperm.randperm_at`).
* :func:`designate`: the *first-reader rule* for spread mode.  Each read, cacheable object is
  designated to the node that reads it first in the job (ties: the lowest node), which fetches it
  from the PFS then anyway.  A node whose designated bytes exceed its room keeps those the job reads
  most (each held object saves a PFS read per read), then those read earliest, and gives the rest
  back; what is given back goes round the nodes that still have room, by object index, each taking
  what fits in the same order, until nothing is left or nobody has room.  Only per-file arrays and
  per-node byte sums go in, so every node computes the same designation.  The dense planner's
  ownership rounds designate the node that reads an object *most*, which needs every node's counts;
  both give every object a holder when :func:`placement.assign.spread_covers` holds, so PFS bytes
  and files held are the same (``tests/test_simulate.py``); with less room than data, the per-node
  rule holds as many files and reads no more from the PFS, within 1% (``tests/test_nodeplan.py``).
* :func:`node_assignment`: ``node``'s tiers exactly as the dense planner places them given the
  designation (its designated objects first, then its most-read others into the room left, tiers
  fastest first), and its fill order.  The primary owner of an object is its designated holder.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from placement.assign import fill, fragmentation_reserve, place_in_tiers, priority_order
from placement.frequency import Segment
from placement.parallel import Pool, run_ahead
from placement.samplers import DistributedSamplerModel, EpochLayout
from placement.streams import JobShape, Streams, _first_reads, entry_nodes, entry_positions, layout_calls
from placement.streams import node_positions as _node_positions

I64 = npt.NDArray[np.int64]
I32 = npt.NDArray[np.int32]
NEVER_KEY = int(np.iinfo(np.int64).max)
_KEY_CHUNK = 1 << 20  # entries whose first-read keys are computed at once


@dataclass(eq=False)
class NodePass:
    """One node's reads over the job, and per file what every node computes alike.

    ``counts``/``first_epoch_counts``/``first``: ``node``'s reads of each file over the job, in job
    epoch 0, and its first job position (:attr:`never` where it never reads it).  ``first_key``: per
    file, ``position * nodes + node`` of the job's first read of it (:data:`NEVER_KEY`: never read),
    so one minimum orders by position, then node.  ``total``: reads of each file by all nodes.
    """

    node: int
    nodes: int
    counts: npt.NDArray[np.unsignedinteger[Any]]
    first_epoch_counts: npt.NDArray[np.unsignedinteger[Any]]
    first: npt.NDArray[np.signedinteger[Any]]
    first_key: I64
    total: npt.NDArray[np.uint32]

    @property
    def never(self) -> int:
        return int(np.iinfo(self.first.dtype).max)

    def earliest(self) -> I64:
        """Per file, the job's first read position (``never`` as in :attr:`first`)."""
        out = self.first_key // self.nodes
        out[self.first_key == NEVER_KEY] = self.never
        return out

    def first_reader(self) -> I32:
        """Per file, the node reading it first (-1: nobody)."""
        out = (self.first_key % self.nodes).astype(np.int32)
        out[self.first_key == NEVER_KEY] = -1
        return out


def node_pass(
    streams: Sequence[Streams],
    offsets: Sequence[int],
    segments: Sequence[Segment],
    node: int,
    count_type: type[np.unsignedinteger[Any]],
    pool: Pool | None = None,
    width: int = 1,
) -> NodePass:
    """``node``'s counts and first uses over ``segments`` (global ids), and per file the job's first
    read and its total reads; one permutation per segment, computed ``width`` ahead in ``pool``."""
    shape = streams[0].shape
    nodes = shape.nodes
    if not 0 <= node < nodes:
        raise ValueError(f"node: expected 0..{nodes - 1}, got {node}")
    total_files = int(offsets[-1])
    job_len = segments[-1].start + segments[-1].length if segments else 0
    pos_type: type[np.signedinteger[Any]] = np.int32 if job_len < np.iinfo(np.int32).max else np.int64
    never = int(np.iinfo(pos_type).max)
    counts = np.zeros(total_files, count_type)
    first = np.full(total_files, never, pos_type)
    first_key = np.full(total_files, NEVER_KEY, np.int64)
    total = np.zeros(total_files, np.uint32)
    epoch0: npt.NDArray[np.unsignedinteger[Any]] | None = None
    mine_at = {st.length: _node_entries(shape, node, st.length) for st in streams}  # per stream length
    unseen: dict[int, int] = {}  # per dataset offset: files nobody has read yet
    sources = _epoch_sources(streams, segments, mine_at, pool, width)
    with contextlib.closing(sources) as epochs:
        for seg, got_epoch in zip(segments, epochs, strict=True):
            if epoch0 is None and seg.job_epoch > 0:
                epoch0 = counts.copy()
            st = streams[seg.dataset]
            off, n, start = int(offsets[seg.dataset]), st.n, seg.start
            sl = slice(off, off + n)
            if isinstance(got_epoch, EpochLayout) and got_epoch.shared:
                lay = got_epoch
                row = lay.order[: st.length]
                first_t, _dup = _first_reads(row, lay.distinct, n)
                times = np.bincount(row, minlength=n).astype(np.uint32) if row.size else np.zeros(n, np.uint32)
                times *= np.uint32(shape.ranks_per_node)
                counts[sl] += times.astype(count_type)
                total[sl] += times * np.uint32(nodes)
                read = np.flatnonzero(first_t >= 0)
                t = first_t.take(read).astype(np.int64)
                pos = _node_positions(t, np.zeros_like(t), st.length, shape) + start
                mine = first[sl]
                np.minimum.at(mine, read, pos.astype(pos_type))
                keys = first_key[sl]
                np.minimum.at(keys, read, pos * nodes)  # node 0 reads it first: every node at once
                continue
            t_mine, pos_mine = mine_at[st.length]
            size = st.length * shape.world_size
            flat: I64 | None
            if isinstance(got_epoch, EpochLayout):
                flat = got_epoch.order[:size]
                u = min(got_epoch.distinct, size)
                files = flat.take(t_mine)
                repeats = flat[u:]
            else:  # this node's entries, then the padding's (:func:`_epoch_sources`)
                if unseen.get(off, n):  # _epoch_sources asks for one after a whole epoch only
                    raise AssertionError("node_pass: an epoch of this node's entries before every file was read")
                flat, u = None, n
                files, repeats = got_epoch[: t_mine.shape[0]], got_epoch[t_mine.shape[0] :]
            # this node's reads: a gather of its entries (files/nodes of them), no inverse of the epoch
            head = int(np.searchsorted(t_mine, u))  # its entries in flat[:u] read distinct files
            files = files + off
            pos = pos_mine + start
            got = files[:head]
            counts[got] += count_type(1)
            cur = first[got]
            np.minimum(cur, pos[:head].astype(pos_type), out=cur)
            first[got] = cur
            if head < files.shape[0]:  # padding: files read again
                np.add.at(counts, files[head:], 1)
                np.minimum.at(first, files[head:], pos[head:].astype(pos_type))
            # every node's reads, per file: how many, and the first while some file is still unread
            if u >= n:
                total[sl] += np.uint32(1)
            else:
                assert flat is not None
                total[flat[:u] + off] += np.uint32(1)
            if repeats.size:
                np.add.at(total, repeats + off, 1)
            if flat is not None and unseen.get(off, n):
                for lo in range(0, flat.size, _KEY_CHUNK):  # slices: no epoch-sized temporaries
                    t = np.arange(lo, min(lo + _KEY_CHUNK, flat.size), dtype=np.int64)
                    keys = entry_positions(t.copy(), st.length, shape)
                    keys += start
                    keys *= nodes
                    keys += entry_nodes(t, shape)
                    files = flat[lo : lo + _KEY_CHUNK] + off
                    distinct = max(0, min(u - lo, files.shape[0]))
                    got = first_key[files[:distinct]]
                    np.minimum(got, keys[:distinct], out=got)
                    first_key[files[:distinct]] = got
                    if distinct < files.shape[0]:
                        np.minimum.at(first_key, files[distinct:], keys[distinct:])
                unseen[off] = int((first_key[sl] == NEVER_KEY).sum())
    if epoch0 is None:
        epoch0 = counts.copy()
    return NodePass(node, nodes, counts, epoch0, first, first_key, total)


def _epoch_sources(
    streams: Sequence[Streams],
    segments: Sequence[Segment],
    mine_at: dict[int, tuple[I64, I64]],
    pool: Pool | None,
    width: int,
) -> Generator[EpochLayout | I64, None, None]:
    """Per segment, the whole epoch (its layout) or, where that is all the pass needs, the files at
    this node's entries followed by the padding's (one array), up to ``width`` ahead in ``pool``.

    The job's first read of every file and the reads per file come from a dataset's first
    segment when that epoch reads every file (no truncation): after it, an epoch adds one read of
    every file, the padding's repeats and this node's own reads, which
    :meth:`DistributedSamplerModel.entries_at` gives without the rest of the permutation (1/1,024
    of it on 1,024 nodes, about a tenth of the cost).
    """
    seen: set[int] = set()
    inline: list[Callable[[], EpochLayout | I64]] = []
    ahead: list[Callable[[], EpochLayout | I64] | None] = []
    for seg in segments:
        st = streams[seg.dataset]
        sampler = st.sampler
        size = st.length * st.shape.world_size
        if isinstance(sampler, DistributedSamplerModel) and min(sampler.total_size, size) >= st.n:
            if seg.dataset in seen:  # every epoch reads every file, and one whole epoch was read
                entries = np.concatenate([mine_at[st.length][0], np.arange(st.n, size, dtype=np.int64)])
                call = functools.partial(sampler.entries_at, seg.ds_epoch, entries)
                inline.append(call)
                ahead.append(call if sampler.shuffle else None)
                continue
            seen.add(seg.dataset)
        whole, early = layout_calls(st, seg.ds_epoch)
        inline.append(whole)
        ahead.append(early)
    return run_ahead(inline, ahead, pool, width)


def _node_entries(shape: JobShape, node: int, length: int) -> tuple[I64, I64]:
    """The strided entries ``node``'s ranks read (rank r: r, r + W, r + 2W, ...; ``length`` each), in
    ascending order, and their positions in the node's stream: the same in every epoch."""
    world = shape.world_size
    ranks = np.array(shape.ranks_of_node(node), np.int64)
    t = (np.arange(length, dtype=np.int64)[:, None] * world + ranks[None, :]).reshape(-1)
    t.sort()
    return t, entry_positions(t.copy(), length, shape)


def fold_pass(p: NodePass, gid_obj: npt.NDArray[np.int32] | None, objects: int) -> NodePass:
    """The pass over objects (snapshot entries shared by several ids): counts summed, firsts the least."""
    if gid_obj is None:
        return p

    def summed(a: npt.NDArray[Any]) -> npt.NDArray[Any]:
        return np.bincount(gid_obj, weights=a, minlength=objects).astype(a.dtype)

    def least(a: npt.NDArray[Any], high: int) -> npt.NDArray[Any]:
        out = np.full(objects, high, a.dtype)
        np.minimum.at(out, gid_obj, a)
        return out

    return NodePass(
        p.node,
        p.nodes,
        summed(p.counts),
        summed(p.first_epoch_counts),
        least(p.first, p.never),
        least(p.first_key, NEVER_KEY),
        summed(p.total),
    )


def node_room(budgets: npt.NDArray[np.int64], largest: int) -> int:
    """Bytes a node may be designated: its capacity less the fragmentation reserve (as in assign)."""
    cap = int(budgets.sum())
    return cap - fragmentation_reserve(largest, int(budgets.shape[0]), cap)


def designate(
    first_key: I64,
    total: npt.NDArray[Any],
    sizes: I64,
    read: npt.NDArray[np.bool_],
    nodes: int,
    budgets: npt.NDArray[np.int64],
) -> I32:
    """Designated holder per object by the first-reader rule (module docstring); -1: none had room.

    ``first_key``, ``total``: :attr:`NodePass.first_key` and the reads by all nodes, over objects;
    ``budgets``: (tiers,) bytes per node.  Where room runs short, the objects read most often over
    the job are kept first (each one held saves a PFS read per read of it), then the earliest read.
    O(objects log objects) time, O(objects + nodes) memory, the same on every node.
    """
    m = int(sizes.shape[0])
    designated = np.full(m, -1, np.int32)
    if not read.any() or not budgets.size:
        return designated
    largest = int(sizes[read].max())
    room = np.full(nodes, node_room(budgets, largest), np.int64)
    objs = np.flatnonzero(read)
    reader = (first_key.take(objs) % nodes).astype(np.int32)
    load = np.bincount(reader, weights=sizes.take(objs), minlength=nodes)
    over = load > room
    designated[objs] = reader
    active = room > 0
    pending: list[I64] = []
    rank = np.zeros(m, np.int64)  # priority where room is short: most reads, then earliest read
    if over.any():
        rank[objs[np.lexsort((first_key.take(objs), -total.take(objs).astype(np.int64)))]] = np.arange(objs.size)
        # an overfull node keeps its objects in that order, as far as they fit
        by_reader = np.lexsort((rank.take(objs), reader))
        by_node = objs[by_reader]
        bounds = np.searchsorted(reader[by_reader], np.arange(nodes + 1))
        for k in np.flatnonzero(over).tolist():
            mine = by_node[bounds[k] : bounds[k + 1]]
            taken = fill(sizes.take(mine), max(0, int(room[k])))
            designated[mine[~taken]] = -1
            pending.append(mine[~taken])
            active[k] = False
    room -= np.bincount(designated[designated >= 0], weights=sizes[designated >= 0], minlength=nodes).astype(np.int64)
    left = np.sort(np.concatenate(pending)) if pending else objs[:0]
    while left.size and active.any():
        candidates = np.flatnonzero(active)
        choice = candidates[left % candidates.size]
        rest: list[I64] = []
        for k in candidates.tolist():
            mine = left[choice == k] if candidates.size > 1 else left
            if not mine.size:
                continue
            mine = mine[np.argsort(rank.take(mine), kind="stable")]
            taken = fill(sizes.take(mine), max(0, int(room[k])))
            designated[mine[taken]] = k
            room[k] -= int(sizes.take(mine[taken]).sum())
            if not taken.all():
                rest.append(mine[~taken])
                active[k] = False
        left = np.sort(np.concatenate(rest)) if rest else left[:0]
    return designated


@dataclass(eq=False)
class NodePart:
    """What one node acts on: its tier per object (-1: not kept), its fill order, bytes per tier."""

    node: int
    tier_of: npt.NDArray[np.int8]
    fill_obj: npt.NDArray[np.int32]
    fill_due: npt.NDArray[np.int64]
    tier_bytes: I64
    tier_files: I64


def node_assignment(
    p: NodePass,
    designated: I32,
    sizes: I64,
    cacheable: npt.NDArray[np.bool_],
    budgets: npt.NDArray[np.int64],
) -> NodePart:
    """``p.node``'s tiers and fill order given the designation (over objects: :func:`fold_pass`)."""
    k = p.node
    tiers = int(budgets.shape[0])
    read = cacheable & (p.first_key != NEVER_KEY)
    largest = int(sizes[read].max()) if read.any() else 0
    room = node_room(budgets, largest)
    wanted = p.counts > 0
    mine = designated == k
    wanted |= mine
    wanted &= read
    order = priority_order(p.counts, p.first, np.flatnonzero(wanted))
    sz = sizes.take(order)
    owned = mine.take(order)
    others = np.flatnonzero(~owned)
    extra_room = room - int(sz[owned].sum())
    owned[others[fill(sz.take(others), max(0, extra_room))]] = True
    order, sz = order[owned], sz[owned]
    placed = place_in_tiers(sz, [int(x) for x in budgets])
    tier_of = np.full(sizes.shape[0], -1, np.int8)
    tier_of[order] = placed
    tier_bytes = np.array([int(sz[placed == j].sum()) for j in range(tiers)], np.int64)
    tier_files = np.array([int((placed == j).sum()) for j in range(tiers)], np.int64)
    # fill order: by due position (the owner's: anybody's first read; the others': their own)
    held = np.flatnonzero(tier_of >= 0)
    due = p.first.take(held).astype(np.int64)
    use_earliest = designated.take(held) == k
    use_earliest |= due == p.never
    if use_earliest.any():
        due[use_earliest] = p.earliest().take(held[use_earliest])
    ordered = np.lexsort((held, due))
    return NodePart(k, tier_of, held[ordered].astype(np.int32), due[ordered], tier_bytes, tier_files)
