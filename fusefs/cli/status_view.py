"""Human rendering of the status document (``seerfs status`` without --json)."""

from __future__ import annotations

from typing import Any

from fusefs.progress import current_line


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def _bar(done: float, total: float, width: int = 24) -> str:
    frac = 0.0 if total <= 0 else min(1.0, done / total)
    full = int(frac * width)
    return "[" + "#" * full + "." * (width - full) + f"] {frac * 100:5.1f}%"


def render(doc: dict[str, Any]) -> str:
    lines = [
        f"seerfs {doc.get('version', '?')}  {doc.get('state', '?')}  pid {doc.get('pid')}  "
        f"up {doc.get('uptime_s', 0):.0f}s",
        f"  {doc.get('source')} -> {doc.get('mountpoint')}",
    ]
    progress = doc.get("progress") or {}
    if any(isinstance(t, dict) and t.get("state") == "running" for t in progress.values()):
        lines.append(f"progress  {current_line(progress)}")
    if doc.get("state") == "starting":
        lines.append(f"  not mounted yet; log {doc.get('log_file')}")
    snap = doc.get("snapshot", {})
    if snap:
        lines.append(
            f"snapshot  {snap.get('files', 0)} files, {snap.get('dirs', 0)} dirs, "
            f"{snap.get('symlinks', 0)} symlinks, "
            f"{human_bytes(snap.get('bytes', 0))}; {'reused' if snap.get('reused') else 'walked'} in "
            f"{snap.get('build_seconds', 0):.2f}s ({snap.get('reason', '')})"
        )
        if snap.get("external_symlinks_total"):
            lines.append(
                f"  {snap['external_symlinks_total']} symlinks leave the tree (reads bypass seerfs): "
                + ", ".join(snap.get("external_symlinks", [])[:5])
            )
    seed = doc.get("seed", {})
    if seed:
        err = f"  last write rejected: {seed['last_error']}" if seed.get("last_error") else ""
        lines.append(f"seed      {seed.get('value')} ({seed.get('origin')}, generation {seed.get('generation')}){err}")
    disc = doc.get("discovery")
    if disc and disc.get("state") not in (None, "off", "idle"):
        lines.append(f"discovery {discovery_line(disc)}")
    plan = doc.get("plan")
    if plan:
        lines.append(
            f"plan      {plan.get('state', '?')} {plan.get('progress', '')} "
            f"digest {plan.get('digest') or '-'}"
            + (f"  {plan['message']}" if plan.get("message") else "")
            + (f"  (cached plan refused: {plan['cache_refused']})" if plan.get("cache_refused") else "")
        )
    cursor = doc.get("cursor")
    if cursor:
        lines.append(
            f"cursor    epoch {cursor.get('epoch')} step {cursor.get('step')}  ranks {cursor.get('ranks')}  "
            f"hit rate {cursor.get('hit_rate', 0) * 100:.2f}%"
            + ("  MISMATCH: " + str(cursor.get("mismatch_reason")) if cursor.get("mismatch") else "")
        )
    for tier in doc.get("tiers", []) or []:
        lines.append(
            f"tier      {tier.get('name')}: {_bar(tier.get('used_bytes', 0), tier.get('budget_bytes', 0))} "
            f"{human_bytes(tier.get('used_bytes', 0))} / {human_bytes(tier.get('budget_bytes', 0))}, "
            f"{tier.get('files', 0)} files"
        )
    staging = (doc.get("prefetch") or {}).get("staging")
    if staging:
        # Dropped pages are the ones readers will pull through FUSE again: worth seeing at a glance.
        lines.append(
            f"pagecache {human_bytes(staging.get('page_cache_bytes', 0))} held, {staging.get('kept_files', 0)} files "
            f"kept, {staging.get('pushes', 0)} pushed, {staging.get('invalidations', 0)} dropped, "
            f"{staging.get('uncached_opens', 0)} opens uncached (budget full)"
        )
    reads = doc.get("reads", {})
    if reads:
        lines.append(
            f"reads     {reads.get('opens', 0)} opens, {human_bytes(reads.get('bytes_served', 0))} served, "
            f"stall {reads.get('stall_seconds', 0):.2f}s, PFS {human_bytes(reads.get('pfs_bytes', 0))}"
        )
        for name, c in reads.get("by_source", {}).items():
            if c.get("files") or c.get("bytes"):
                lines.append(f"  {name:<10} {c['files']:>8} files {human_bytes(c['bytes']):>11}")
        if reads.get("stale_total"):
            lines.append(
                f"  {reads['stale_total']} files changed since the snapshot (EIO until a remount): "
                + ", ".join(list(reads.get("stale_files", {}))[:5])
            )
    reval = doc.get("revalidation")
    if reval:
        stats = reval.get("stats", {})
        lines.append(
            f"sources   {reval.get('round_files', 0)} cached files rechecked every "
            f"{reval.get('round_seconds', 0):.0f}s "
            f"({reval.get('rate_per_s', 0):g} stats/s: the staleness bound), {reval.get('fresh_files', 0)} checked "
            f"this mount, {sum(stats.values())} stats, {reval.get('changed_total', 0)} changed"
        )
    peers = doc.get("peers")
    if peers:
        for p in peers.get("nodes", []):
            lines.append(f"peer      node {p.get('node')} {p.get('address')} {p.get('state')}")
    return "\n".join(lines)


def discovery_line(d: dict[str, Any]) -> str:
    """The seed search in one line: what it found (or why not), or how far it got."""
    state = d.get("state")
    tried, planned = d.get("candidates_tried"), d.get("candidates_planned")
    if state == "searching":
        frac = d.get("fraction") or 0.0
        return (
            f"searching ({d.get('tier')} tier) {_bar(frac, 1.0)} {tried or 0:,} of {planned or 0:,} candidates, "
            f"{d.get('seconds') or 0:.1f}s, {d.get('opens_used')} opens"
        )
    if state in ("waiting", "preparing"):
        need = d.get("opens_needed") or "?"
        return f"{state}: {d.get('opens_recorded', 0)} opens recorded, {need} of the lead dataset needed"
    if state == "found":
        return (
            f"{d.get('result')}: {d.get('hits')} of {d.get('opens_used')} opens fit, false-match chance "
            f"{d.get('false_match_chance') or 0:.1e}, {tried:,} candidates in {d.get('seconds') or 0:.2f}s"
            + (f"; {d['note']}" if d.get("note") else "")
        )
    line = str(d.get("result") or state)
    if d.get("message"):
        line += f"; failed: {d['message']}"
    if d.get("note"):
        line += f"; {d['note']}"
    return line
