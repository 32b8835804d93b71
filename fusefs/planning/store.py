"""Plans on disk: the plan worker saves one, the daemon maps it read-only.

A plan is a directory: one ``.npy`` per column (:meth:`placement.plan.Plan.arrays`) and
``plan.json`` (:meth:`placement.plan.Plan.meta`) written last and atomically, so a half-written plan
never loads.  Kept here, not in ``placement``, because ``placement`` does no I/O.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from placement.plan import Plan
from placement.randperm import Backend

FORMAT = 1
"""Version of the on-disk layout; a plan saved in another format is refused (planned again)."""


def save_plan(plan: Plan, directory: str | os.PathLike[str]) -> Path:
    """Write ``plan`` into ``directory`` (created); ``plan.json`` goes last, atomically."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    meta_path = out / "plan.json"
    if meta_path.exists():
        meta_path.unlink()  # an old plan must not pair with new columns
    arrays = plan.arrays()
    for name, arr in arrays.items():
        tmp = out / f"{name}.tmp.npy"
        np.save(tmp, np.ascontiguousarray(arr))
        os.replace(tmp, out / f"{name}.npy")
    meta = {"format": FORMAT, "arrays": sorted(arrays), **plan.meta()}
    tmp = out / "plan.json.tmp"
    tmp.write_text(json.dumps(meta))
    os.replace(tmp, meta_path)
    return out


def load_plan(directory: str | os.PathLike[str], backend: Backend = "auto") -> Plan:
    """Map a saved plan (columns read-only, memory-mapped); raises ValueError if it is unusable."""
    src = Path(directory)
    try:
        meta = json.loads((src / "plan.json").read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"no readable plan in {src}: {exc}") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise ValueError(
            f"plan in {src} has format {meta.get('format') if isinstance(meta, dict) else '?'}, expected {FORMAT}"
        )
    try:
        arrays = {name: np.load(src / f"{name}.npy", mmap_mode="r") for name in meta["arrays"]}
        return Plan.from_parts(meta, arrays, backend)
    except (OSError, ValueError, KeyError) as exc:
        raise ValueError(f"plan in {src} is incomplete: {exc}") from None
