"""Plans on disk: the plan worker saves one, the daemon maps it read-only after checking it.

A plan is a directory: one ``.npy`` per column (:meth:`placement.plan.Plan.arrays`) and
``plan.json`` (:meth:`placement.plan.Plan.meta`) written last and atomically, so a half-written plan
never loads.  ``plan.json`` carries the store's format version and a digest over its own content and
every column as the loader maps it (:mod:`fusefs.meta.digests`): a column changed or swapped between
mounts, or a plan written by another format, is refused and planned again.  Kept here, not in
``placement``, because ``placement`` does no I/O.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from fusefs.meta.digests import persisted_digest, roundtrip
from placement.plan import Plan
from placement.randperm import Backend

FORMAT = 2
"""Version of the on-disk layout; a plan saved in another format is refused (planned again).
2: ``plan.json`` carries ``store_digest``."""


def save_plan(plan: Plan, directory: str | os.PathLike[str]) -> Path:
    """Write ``plan`` into ``directory`` (created); ``plan.json`` goes last, atomically.

    Raises OSError (a full disk, say); what was written stays unusable (no ``plan.json``)."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    meta_path = out / "plan.json"
    if meta_path.exists():
        meta_path.unlink()  # an old plan must not pair with new columns
    arrays = {name: np.ascontiguousarray(arr) for name, arr in plan.arrays().items()}
    for name, arr in arrays.items():
        tmp = out / f"{name}.tmp.npy"
        try:
            np.save(tmp, arr)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        os.replace(tmp, out / f"{name}.npy")
    meta = roundtrip({"format": FORMAT, "arrays": sorted(arrays), **plan.meta()})
    meta["store_digest"] = persisted_digest(meta, arrays)
    tmp = out / "plan.json.tmp"
    try:
        tmp.write_text(json.dumps(meta))
        os.replace(tmp, meta_path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return out


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
