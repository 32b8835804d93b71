"""The status fields prediction is judged by: shared by the clients' snapshots and the harness's final read.

Kept apart from clientlib, which loads torchvision at import (the harness must not pay for that
when pytest merely collects it).
"""

from __future__ import annotations

from typing import Any


def status_fields(doc: dict[str, Any]) -> dict[str, Any]:
    """The parts of a status document the harness judges prediction by."""
    cursor = doc.get("cursor") or {}
    prefetch = doc.get("prefetch") or {}
    reads = doc.get("reads") or {}
    return {
        "reads_opens": reads.get("opens"),
        "pfs_bytes": reads.get("pfs_bytes"),
        "stall_seconds": reads.get("stall_seconds"),
        "by_source": {k: v.get("files") for k, v in (reads.get("by_source") or {}).items()},
        "predicted_opens": prefetch.get("predicted_opens"),
        "unplanned_opens": prefetch.get("unplanned_opens"),
        "mode": prefetch.get("mode"),
        "cursor": {
            k: cursor.get(k)
            for k in (
                "state",
                "epoch",
                "step",
                "ranks",
                "rank_positions",
                "opens",
                "hits",
                "hit_rate",
                "mismatch",
                "mismatch_reason",
                "mismatch_kind",
                "first_mismatch_open",
            )
        },
        "seed": (doc.get("seed") or {}).get("value"),
        "seed_origin": (doc.get("seed") or {}).get("origin"),
        "plan": {k: (doc.get("plan") or {}).get(k) for k in ("state", "seed")},
        "discovery": {
            k: (doc.get("discovery") or {}).get(k)
            for k in (
                "state",
                "result",
                "seed",
                "order",
                "orders",
                "reason",
                "found_at_opens",
                "candidates_tried",
                "candidates_planned",
                "likely_candidates",
                "seconds",
                "cpu_seconds",
            )
        },
        "discovery_found_at_opens": (doc.get("discovery") or {}).get("found_at_opens"),
    }
