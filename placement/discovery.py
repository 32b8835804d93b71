"""What a seed search of the daemon looks for, when a node's opens are enough to start it, and how
its outcome reads: the decisions around :mod:`placement.seedsearch`, without the process that runs it.

A job that writes no seed, or a wrong one, still shows its sampler's order in the files its node
opens first.  The daemon records them, and a background process (``fusefs.planning.search_worker``)
maps them to the lead dataset's indices and searches (:class:`placement.seedsearch.SeedSearch`).
This module decides:

* which dataset and sampler to search (:func:`search_setup`): the job's lead dataset (the one whose
  passes are its epochs), with the sampler kind the config names for it.  A sampler without a seed
  (sequential, an explicit order, ``shuffle: false``) is not searchable, and neither is one the
  search does not model: the reason says what decides its order and what to write;
* in which catalog orders (:func:`orders_to_try`): the layout the config gives, or, when it gives
  none, every modelled order (:data:`MODELLED_ORDERS`) with the likely seeds, and the whole range
  only for those :func:`range_orders` names.  A candidate is tried once per order, so each order's
  search is held to ``threshold / orders`` (a union bound over the orders); the orders' likely seeds
  are searched together (the worker takes a chunk of each in turn), so a common seed in the second
  order is found as soon as one in the first;
* when to start (:class:`OpensGate`): once the node has opened two batches per local rank of the
  lead (what DataLoader workers open first; fewer leave too little margin over the false-match
  bound to survive the workers' reordering), and later again with half as many more opens each
  time the search answers ``too_few_opens``;
* how to report it (:func:`describe`): one line for a person and the fields of the status section;
* whether a match says anything against the seed in use (:func:`epoch_in_plan`).

Pure: no I/O, no clocks.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from placement import seedsearch as ss
from placement.jobstreams import JobStreams
from placement.randperm import THRESHOLD_64BIT
from placement.streams import JobShape

MAX_OPENS = 4096
"""Distinct lead opens a search compares at most (the engine's own cap: evidence saturates long before)."""

SAMPLER_NAMES = {"distributed": "DistributedSampler", "random": "DataLoader(shuffle=True, seeded generator)"}

MODELLED_ORDERS = ("imagefolder", "timm_folder", "files")
"""Catalog orders tried when the config gives no layout, likeliest first.  Training code lists an image
folder as torchvision's ImageFolder/DatasetFolder does (pytorch/examples imagenet, Lightning and
accelerate examples, DALI's file reader: classes sorted, files sorted per class), as timm's folder reader
does (natural sort of the full path: timm's train.py), or as a plain ``sorted()`` of every path
(custom Datasets over ``sorted(glob(...))`` or ``sorted(os.listdir(...))``)."""

NO_ORDER_FITS = "no modelled order with a likely seed fits"
"""The result when every modelled order's likely seeds were tried in vain and no range follows."""

UNSEARCHED = {
    "accelerate": (
        "accelerate's seedable sampler (use_seedable_sampler=True) deals batches of a DistributedSampler-like "
        "permutation seeded with set_seed's value (or DataLoaderConfiguration's data_seed): not searched; write "
        "that value"
    ),
    "accelerate_default": (
        "accelerate's default sampler draws its order from a generator seeded at prepare() with a 64-bit "
        "number from rank 0's global RNG (set_seed's value does not decide it), out of a search's reach; "
        "write rank 0's loader.synchronized_generator.initial_seed() after prepare(), or use "
        "use_seedable_sampler=True and write set_seed's value"
    ),
    "torchdata_random": (
        "torchdata's RandomSampler seeds its generator with a 64-bit number from the global RNG, out of a "
        "search's reach; write loader.sampler.generator.initial_seed(), or give the loader "
        "generator=torch.Generator().manual_seed(S) and write S"
    ),
}
"""Why a shuffling sampler kind is not searched, and what to write instead."""

WHAT_DECIDES = {
    "distributed": (
        "a DistributedSampler's order is decided by its seed argument (0 unless the script passes one; "
        "Lightning: seed_everything's value) and the dataset's index order: write the seed to .control/seed, "
        "and set datasets.N.layout if the dataset lists its files in an order seerfs models; a file list the "
        "script shuffles itself (random.shuffle, np.random.permutation, unseeded) cannot be predicted and is "
        "served reactively"
    ),
    "random": (
        "DataLoader(shuffle=True)'s order is decided by its generator's seed; without generator= (timm's "
        "train.py in one process, most single-GPU scripts) it is drawn from torch's global RNG as it stands at "
        "iter(), after the model's initialisation drew from it, which no seed written here can predict: pass "
        "generator=torch.Generator().manual_seed(S) and write S; a file list the script shuffles itself cannot "
        "be predicted and is served reactively"
    ),
}
"""For a search that found nothing: what decides the configured kind's order, and what to write."""


@dataclass(frozen=True)
class SearchSetup:
    """What to search: ``lead`` (dataset index), its ``root`` and ``n`` files, the sampler ``kinds``,
    the job ``shape`` and ``start_opens`` (distinct lead opens to wait for); or ``reason`` why the
    job cannot be searched (then nothing else matters)."""

    lead: int
    root: str
    n: int
    kinds: tuple[ss.Kind, ...]
    shape: JobShape
    start_opens: int
    reason: str | None = None

    @property
    def searchable(self) -> bool:
        return self.reason is None


def search_setup(config: Mapping[str, Any], js: JobStreams) -> SearchSetup:
    """The search for the job in ``config`` (``Config.to_dict()``) whose streams are ``js``.

    Only the sampler kind the config names is searched: a seed found for another kind would plan
    the wrong order anyway (the config has to say which sampler the job uses).
    """
    lead = js.lead
    ds = config["datasets"][lead]
    smp = ds["sampler"]
    n = int(js.datasets[lead].n)
    shape = js.datasets[lead].streams.shape  # the lead's own DataLoader batching (datasets.N.loader)
    kind = str(smp["kind"])
    reason: str | None = None
    kinds: tuple[ss.Kind, ...] = ()
    if kind == "distributed" and smp.get("shuffle", True):
        kinds = ("distributed",)
    elif kind == "random":
        kinds = ("random",)
    elif kind == "distributed":
        reason = f"dataset {ds['root']!r} is read in index order (sampler.shuffle false): no seed decides it"
    elif kind == "repeat_aug":
        reason = (
            f"dataset {ds['root']!r} is read by timm's RepeatAugSampler, which seeds its shuffle with the epoch "
            "alone: no seed decides it, nothing to write; with no seed to search, its catalog order is not "
            "discovered either: set datasets.N.layout (timm_folder for timm's folder reader)"
        )
    elif kind in UNSEARCHED and smp.get("shuffle", True):
        reason = f"dataset {ds['root']!r}: {UNSEARCHED[kind]}"
    else:
        reason = f"dataset {ds['root']!r} is read in a fixed order (sampler.kind {kind}): no seed decides it"
    if reason is None and n >= THRESHOLD_64BIT:
        reason = f"{n} files: torch's randperm uses 64-bit draws from 214,748,364 files on"
    elif reason is None and n < 2:
        reason = f"dataset {ds['root']!r} has {n} file(s): a single order"
    return SearchSetup(lead, str(ds["root"]), n, kinds, shape, start_opens(n, shape, kinds), reason)


def orders_to_try(config: Mapping[str, Any], lead: int) -> tuple[str, ...]:
    """The lead dataset's catalog orders to search: its configured layout, or every modelled one."""
    layout = config["datasets"][lead].get("layout")
    return (str(layout),) if layout else MODELLED_ORDERS


def range_orders(config: Mapping[str, Any], lead: int, tried: tuple[str, ...]) -> tuple[str, ...]:
    """Of the orders ``tried``, those searched past the likely seeds (``seed_discovery.range_orders``):
    the configured layout only, unless the config asks for all.  An order nobody named gets the likely
    seeds only, so a job in an order seerfs does not model costs a second, not the whole range."""
    if config.get("seed_discovery", {}).get("range_orders", "configured") == "all":
        return tried
    layout = config["datasets"][lead].get("layout")
    return tuple(o for o in tried if o == layout)


def start_opens(n: int, shape: JobShape, kinds: tuple[ss.Kind, ...]) -> int:
    """Distinct lead opens to wait for: two batches per local rank (every rank of a DataLoader without
    a DistributedSampler reads the same order, so one rank's worth is distinct), at most half of
    what the node reads in an epoch and at most :data:`MAX_OPENS`."""
    if not kinds:
        return 1
    distributed = "distributed" in kinds
    ranks = shape.ranks_per_node if distributed else 1
    per_epoch = ranks * (math.ceil(n / shape.world_size) if distributed else n)
    return max(1, min(2 * shape.batch_size * ranks, MAX_OPENS, max(1, per_epoch // 2)))


class OpensGate:
    """When the recorded opens are enough to search (again).

    ``ready(k)``: start a search with ``k`` distinct lead opens.  After a ``too_few_opens`` answer
    with ``k`` opens, :meth:`too_few` asks for half as many more (at least one more); once
    :data:`MAX_OPENS` did not suffice, :attr:`exhausted` is set and no search is worth starting.
    """

    def __init__(self, first: int) -> None:
        self.need = max(1, min(first, MAX_OPENS))
        self.exhausted = False

    def ready(self, opens: int) -> bool:
        return not self.exhausted and opens >= self.need

    def too_few(self, opens: int) -> None:
        if opens >= MAX_OPENS:
            self.exhausted = True
            return
        self.need = min(MAX_OPENS, max(opens + 1, math.ceil(opens * 1.5)))


def candidates(limit: int, epoch_span: int) -> tuple[ss.Candidates, int]:
    """The search plan (:func:`placement.seedsearch.default_candidates`) and how many of its first
    values are the likely tier (the common seeds, 0..65535, seed + epoch of the common seeds, dates):
    what the daemon tries first, before the rest of 0..limit-1."""
    plan = ss.default_candidates(limit=limit, epoch_span=epoch_span)
    likely = len(ss.default_candidates(limit=min(limit, ss.LIKELY_RANGE), epoch_span=epoch_span))
    return plan, min(likely, len(plan))


def epoch_in_plan(seed: int, found: int, identifies: str | None, epochs: int) -> int | None:
    """The epoch, among the plan's ``epochs``, in which a sampler seeded with ``seed`` reads the order a
    search found as ``found``; None when it reads it in none (the seed is wrong for these opens).

    A DistributedSampler's order in epoch e is seed + e's in epoch 0 (torch seeds it with the low 32
    bits of seed + e), and a search finds it as that sum (``seed+epoch``): a job seeded 17 and seen in
    epoch 12 is found as 29, and the plan for 17 predicts it as its epoch 12, as well as the plan for
    29 would as its epoch 0.  A seeded shuffling DataLoader is found from its epoch 0 only (``seed``).
    """
    e = (int(found) - ss.seed_value(seed)) % ss.SEED_SPACE
    if identifies == "seed+epoch":
        return e if e < epochs else None
    return 0 if e == 0 else None


def describe(result: ss.SearchResult, order: str | None = None) -> str:
    """One line for a person: what was identified (in which catalog ``order``), or why nothing was."""
    m = result.match
    if m is not None:
        where = f", node {m.node}" if m.node is not None else ""
        how = f", {order} order" if order else ""
        return f"{m.identifies} = {m.value} ({SAMPLER_NAMES[m.kind]}{where}{how})"
    if result.status == "not_found":
        return f"not found (searched {result.candidates_tried:,} candidates)"
    if result.status == "not_searchable":
        return f"not searchable ({result.reason})"
    return f"too few opens ({result.reason})"


def result_fields(result: ss.SearchResult, order: str | None = None, orders: int = 1) -> dict[str, Any]:
    """The status fields of a finished search (see seerfs-control(7), section discovery).  ``order``:
    the catalog order searched; ``orders``: how many were, each at ``threshold / orders``, so the
    false-match chances stated are per order times ``orders`` (a bound over all of them)."""
    m = result.match
    scale = max(1, orders)
    return {
        "status": result.status,
        "result": describe(result, order),
        "order": order if m is not None else None,
        "seed": None if m is None else m.value,
        "identifies": None if m is None else m.identifies,
        "sampler": None if m is None else m.kind,
        "node": None if m is None else m.node,
        "hits": None if m is None else m.hits,
        "predicted": None if m is None else m.predicted,
        "false_match_chance": None if m is None else min(1.0, m.false_match_chance * scale),
        "best_chance": min(1.0, result.best_chance * scale),
        "candidates_tried": result.candidates_tried,
        "candidates_planned": result.candidates_planned,
        "comparisons": result.comparisons,
        "reason": result.reason,
    }
