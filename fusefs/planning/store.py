"""Plans on disk: the plan worker saves one, the daemon maps it read-only after checking it.

A plan is a directory: one ``.npy`` per column (:meth:`placement.plan.Plan.arrays`) and
``plan.json`` (:meth:`placement.plan.Plan.meta`).  It is written whole into a private temporary
directory beside its place and renamed into it, so a half-written plan never loads.  ``plan.json``
carries the store's format version and a digest over its own content and every column as the loader
maps it (:mod:`fusefs.meta.digests`): a column changed or swapped between mounts, or a plan written
by another format, is refused and planned again.  Kept here, not in ``placement``, because
``placement`` does no I/O.

Concurrency rule: several daemons may write the same plan into the same directory at once.
``cache_dir`` defaults to ``~/.cache/seerfs``, and a cluster's home directory is usually shared by
every node, so the daemons of one job (same dataset, config, mountpoint and seed: the same plan
key) plan into one directory together.  When the plan's files had fixed temporary names there, one
writer renamed away the file another had just written, and that node's plan failed (ENOENT) and it
predicted nothing for the whole job (seen in the two-node Slurm test, which shares one cache_dir).
Now no two writers share a file: each writes its own temporary directory, and the first rename
wins; the plans are the same bytes (the key is a digest of every input), so a later writer drops
its copy and the daemons load the one in place.  Nothing removes a plan directory that holds
``plan.json`` except the daemon's check that refuses it (wrong format or digest) and pruning of old
plans (:mod:`fusefs.planning.manager`).
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from fusefs.meta.digests import persisted_digest, roundtrip
from placement.plan import Plan
from placement.randperm import Backend

FORMAT = 3
"""Version of the on-disk layout; a plan saved in another format is refused (planned again).
2: ``plan.json`` carries ``store_digest``.
3: a per-node plan (``plan.json``'s ``per_node`` lists its nodes) stores ``owner`` and, per node k
planned, ``node{k}_held``/``node{k}_tier`` (its held objects and their tiers) and its fill order
and tier totals, instead of the dense ``tier_of`` and every node's fill order."""


TMP_SUFFIX = ".tmp"
"""Suffix of a writer's temporary plan directory (``.KEY.RANDOM.tmp``, hidden, beside the plan)."""


def save_plan(plan: Plan, directory: str | os.PathLike[str]) -> Path:
    """Write ``plan`` as ``directory``: whole into a temporary directory beside it, then renamed into
    place (see the module's concurrency rule); a plan already there (another writer's, of the same
    inputs) is kept, and one without ``plan.json`` (left by a writer killed before the rename into
    place existed) is replaced.  Raises OSError (a full disk, say) after removing what it wrote."""
    out = Path(directory)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=TMP_SUFFIX, dir=out.parent))
    try:
        arrays = {name: np.ascontiguousarray(arr) for name, arr in plan.arrays().items()}
        for name, arr in arrays.items():
            np.save(tmp / f"{name}.npy", arr)
        meta = roundtrip({"format": FORMAT, "arrays": sorted(arrays), **plan.meta()})
        meta["store_digest"] = persisted_digest(meta, arrays)
        (tmp / "plan.json").write_text(json.dumps(meta))
        _put_in_place(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # gone already once renamed into place
    return out


def _put_in_place(tmp: Path, out: Path) -> None:
    """Rename ``tmp`` to ``out``; if ``out`` is a plan already, leave it (``tmp`` is dropped)."""
    for _attempt in range(3):
        try:
            os.rename(tmp, out)  # onto a missing or empty directory only: never into another writer's
            return
        except OSError as exc:
            if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                raise
        if (out / "plan.json").exists():
            return  # another writer's whole plan of the same inputs: the same bytes
        aside = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".old", dir=out.parent))
        try:
            os.rename(out, aside)  # the incomplete one, out of the way (onto an empty directory)
        except FileNotFoundError:
            pass  # another writer moved it first
        finally:
            shutil.rmtree(aside, ignore_errors=True)
    raise OSError(errno.EEXIST, f"{out} kept being replaced while a plan was put there", str(out))


def load_plan(directory: str | os.PathLike[str], backend: Backend = "auto") -> Plan:
    """Map a saved plan (columns read-only, memory-mapped) after checking its digest over every
    column it maps and its JSON part; raises ValueError saying why it is unusable."""
    src = Path(directory)
    try:
        meta: Any = json.loads((src / "plan.json").read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"no readable plan in {src}: {exc}") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        found = meta.get("format") if isinstance(meta, dict) else "?"
        raise ValueError(f"plan in {src} has format {found}, expected {FORMAT}")
    recorded = meta.pop("store_digest", None)
    try:
        arrays = {name: np.load(src / f"{name}.npy", mmap_mode="r", allow_pickle=False) for name in meta["arrays"]}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"plan in {src} is incomplete: {exc}") from None
    if recorded is None or recorded != persisted_digest(meta, arrays):
        raise ValueError(f"plan in {src} fails its digest (a column was changed or damaged)")
    try:
        return Plan.from_parts(meta, arrays, backend)
    except (ValueError, KeyError) as exc:
        raise ValueError(f"plan in {src} is incomplete: {exc}") from None
