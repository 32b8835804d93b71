"""The digest every persisted thing carries and its loader checks before use.

Why one digest over everything a loader reads (its JSON part and every array, with names, dtypes
and shapes): a cache that passed no check is how a column shifted by one row between mounts made
nodes serve other files' bytes.  A persisted thing whose digest, or format version, does not match
is refused, and the daemon plans or walks again as on a cold start.  xxh3-128 reads about 20 GB/s,
so checking a plan or snapshot of 1.28M files costs milliseconds next to loading it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt
import xxhash


def canonical(meta: Mapping[str, Any]) -> bytes:
    """The JSON bytes a digest covers: key order and spacing fixed, so a loaded copy hashes the same."""
    return json.dumps(meta, sort_keys=True, separators=(",", ":")).encode()


def persisted_digest(meta: Mapping[str, Any], arrays: Mapping[str, npt.NDArray[Any]]) -> str:
    """xxh3-128 over ``meta`` (canonical JSON) and every array's name, dtype, shape and bytes."""
    h = xxhash.xxh3_128()
    h.update(canonical(meta))
    for name in sorted(arrays):
        arr = np.ascontiguousarray(arrays[name])
        h.update(f"\0{name}\0{arr.dtype.str}\0{arr.shape}\0".encode())
        h.update(arr.data.cast("B") if arr.size else b"")
    return h.hexdigest()


def roundtrip(meta: Mapping[str, Any]) -> dict[str, Any]:
    """``meta`` as it will read back from JSON (tuples become lists), so save and load hash the same."""
    out: dict[str, Any] = json.loads(canonical(meta))
    return out
