"""``seerfs plan``: what the placement planner decides for a config, a source and a seed.

Runs the same planner a mount runs (``placement.plan.Plan``) and shows, per node, the bytes each
tier would hold, the share of reads expected from the local tiers, a peer and the PFS in the
first epoch and in later ones, the predicted I/O time, and the PFS traffic of the whole job.
It needs no mount and no other node: every node computes the same plan.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from fusefs.cli.options import add_config_args, load_config
from fusefs.cli.status_view import human_bytes
from fusefs.errors import ConfigError, ExitCode, SeerfsError, SourceError

DESCRIPTION = """\
Plan the job described by the configuration over SOURCE for the sampler seed N, as every node's
daemon would, and show per node: bytes per tier, files owned (fetched from the PFS by that node
and served to its peers), the expected share of reads from the local tiers, a peer and the PFS
in the first epoch and in later ones, and the predicted I/O seconds per epoch; then the PFS
bytes read over the whole job.  SOURCE is the dataset directory (its persisted snapshot is
reused when the source is unchanged) or a snapshot file (.npz) that seerfs saved.  list_file
and order_file paths that are not absolute are read relative to SOURCE."""


def add_parser(sub: Any, epilog: str) -> None:
    p = sub.add_parser(
        "plan",
        help="show the placement plan for a config, source and seed",
        description=DESCRIPTION,
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("source", metavar="SOURCE", help="dataset directory, or a snapshot file (.npz) seerfs saved")
    add_config_args(p)
    p.add_argument(
        "--seed", type=int, default=0, metavar="N", help="the sampler's seed, as written to .control/seed (default 0)"
    )
    p.add_argument("--node", type=int, metavar="K", help="show only node K (0-based)")
    p.add_argument("--json", action="store_true", help="print the plan summary as JSON (fields: see seerfs(1))")
    p.add_argument("--rescan", action="store_true", help="walk SOURCE even if a persisted snapshot matches")


def _snapshot(source: str, cfg: Any, rescan: bool) -> Any:
    from fusefs.meta.snapshot import Snapshot, load_or_scan

    if os.path.isfile(source):
        try:
            return Snapshot.load(Path(source))
        except (OSError, ValueError, KeyError) as exc:
            raise SourceError(f"{source}: not a seerfs snapshot ({exc})") from None
    if not os.path.exists(source):
        raise SourceError(f"source {source}: No such file or directory")
    from fusefs.progress import Progress, shown

    walk = Progress("walk", "entries")
    with shown(walk, sys.stderr):  # a large SOURCE takes minutes to walk: say how far it got
        snap, _reason = load_or_scan(
            source,
            cfg.cache_path,
            threads=cfg.snapshot.walk_threads,
            reuse=cfg.snapshot.reuse,
            rescan=rescan,
            progress=walk,
        )
    return snap


def build(args: argparse.Namespace) -> dict[str, Any]:
    """The plan summary for the command line's config, source and seed."""
    from fusefs.planning.inputs import build_plan, planning_config

    cfg = load_config(args)
    snap = _snapshot(args.source, cfg, args.rescan)
    config = planning_config(cfg)
    nodes = int(config["job"]["world_size"]) // max(1, int(config["job"]["ranks_per_node"]))
    if args.node is not None and not 0 <= args.node < nodes:
        raise SeerfsError(f"--node: expected 0..{nodes - 1}, got {args.node}", ExitCode.USAGE)
    try:  # a per-node plan (large jobs) is made for --node and reports that node only
        plan = build_plan(snap, config, args.seed, node=args.node)
    except ValueError as exc:
        raise ConfigError(f"cannot plan: {exc}") from None
    summary = dict(plan.summary())
    summary["source"] = os.fsdecode(snap.source)
    if args.node is not None:
        summary["per_node"] = [n for n in summary["per_node"] if n["node"] == args.node]
    return summary


def run(args: argparse.Namespace) -> int:
    summary = build(args)
    print(json.dumps(summary, indent=2) if args.json else render(summary))
    return 0


# --------------------------------------------------------------------------- text


def _pct(x: float) -> str:
    return f"{100 * x:5.1f}%"


def _phase(p: dict[str, Any] | None) -> str:
    if p is None:
        return f"{'-':>7}{'-':>7}{'-':>7}{'-':>9}"
    s = p["share"]
    return f"{_pct(s['local']):>7}{_pct(s['peer']):>7}{_pct(s['pfs']):>7}{p['predicted_io_seconds_per_epoch']:>9.2f}"


def render(s: dict[str, Any]) -> str:
    """The summary for a person: header lines, then one row per node."""
    out = [
        f"plan {s['digest'][:16]}  seed {s['seed']}  {s['nodes']} nodes x {s['ranks_per_node']} ranks  "
        f"{s['epochs']} epochs  spread {'on' if s['spread'] else 'off'}  ({s['plan_seconds']:.1f}s)",
        f"source {s['source']}",
    ]
    for d in s["datasets"]:
        when = f"read {d['reads']}x" + (f", after {d['follows']}" if d["follows"] else "")
        extra = f", {d['classes']} classes" if d["layout"] == "imagefolder" else ""
        out.append(f"  {d['root']}: {d['files']:,} files, {human_bytes(d['bytes'])} ({d['layout']}{extra}), {when}")
        if d["outside_links"] or d["unreadable"]:
            out.append(
                f"    {d['unreadable']} unreadable (dangling or outside links), {d['outside_links']} links leave "
                f"the tree{'' if d['exact'] else '; the listing may differ from the training code'}"
            )
    tiers = ", ".join(f"{j}: {t['kind']} {human_bytes(t['bytes'])}" for j, t in enumerate(s["tiers"]))
    out.append(f"tiers per node  {tiers or 'none'}")
    cov = s["coverage"]
    guaranteed = " (spread covers all)" if cov["spread_guaranteed"] and s["spread"] else ""
    out.append(
        f"held on some node  {cov['held_objects']:,} of {cov['read_objects']:,} files read, "
        f"{human_bytes(cov['held_bytes'])} of {human_bytes(cov['read_bytes'])}{guaranteed}"
    )
    out.append(
        f"PFS reads over the job  {human_bytes(s['pfs_bytes_job'])} "
        f"(without a cache {human_bytes(s['pfs_bytes_without_cache'])})"
    )
    f = s.get("frequency")
    if f:
        observed = sum(f["observed_heavy_per_node"]) / max(1, len(f["observed_heavy_per_node"]))
        out.append(
            f"access frequency  a node reads a file {f['mean_reads_per_node']:.2f} times on average; "
            f">= {f['threshold']} times: {observed:,.0f} files per node "
            f"(NoPFS estimate {f['expected_heavy_per_node']:,.0f})"
        )
    tier_head = "".join(f"{'tier ' + str(j):>11}" for j in range(len(s["tiers"])))
    out.append("")
    out.append(f"{'':4}{'':{len(tier_head)}}{'':9}  {'first epoch':^30}  {'later epochs (each)':^30}")
    out.append(
        f"{'node':>4}{tier_head}{'owned':>9}  {'local':>7}{'peer':>7}{'pfs':>7}{'I/O s':>9}  "
        f"{'local':>7}{'peer':>7}{'pfs':>7}{'I/O s':>9}  {'PFS/epoch':>10}"
    )
    for n in s["per_node"]:
        tiers_cols = "".join(f"{human_bytes(b):>11}" for b in n["tier_bytes"])
        later = n["later_epochs"]
        pfs = human_bytes(later["pfs_bytes_per_epoch"]) if later else "-"
        out.append(
            f"{n['node']:>4}{tiers_cols}{n['owned_files']:>9,}  {_phase(n['first_epoch'])}  {_phase(later)}  {pfs:>10}"
        )
    return "\n".join(out)
