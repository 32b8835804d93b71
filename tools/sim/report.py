"""Tables and the NoPFS Fig. 8-style PNG of simulation results."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from tools.sim.runs import ScenarioResult
from tools.sim.system import GB
from tools.sim.trace import HitRate

SHARES = ("local", "remote", "pfs", "stall")
COLORS = {"local": "#4c72b0", "remote": "#55a868", "pfs": "#dd8452", "stall": "#c44e52"}


def duration(seconds: float) -> str:
    """Seconds as a person reads them: ms, s, min or h."""
    if seconds < 1:
        return f"{seconds * 1000:.3g} ms"
    if seconds < 120:
        return f"{seconds:.3g} s"
    if seconds < 7200:
        return f"{seconds / 60:.3g} min"
    return f"{seconds / 3600:.3g} h"


def volume(nbytes: float) -> str:
    for unit, size in (("TB", 1000 * GB), ("GB", GB), ("MB", GB / 1000)):
        if nbytes >= size:
            return f"{nbytes / size:.3g} {unit}"
    return f"{nbytes:.0f} B"


def scenario_table(r: ScenarioResult) -> str:
    s = r.setup
    sc = s.scenario
    ratios = ", ".join(f"{k} = {v:.3g}" for k, v in r.ratios().items())
    lines = [
        f"Scenario {sc.number}: {sc.regime} ({sc.dataset}; {s.files:,} of {sc.files:,} files, scale {s.scale:.4g}, "
        f"{s.epochs} epochs, {s.system.nodes} nodes, batch {sc.batch}, PFS contention by {r.contention})",
        f"  dataset {volume(s.dataset_bytes)} simulated, {volume(s.dataset_bytes / s.scale)} at full size: {ratios}",
    ]
    head = (
        f"  {'policy':<22}{'time':>10}{'full size':>11}{'x best':>8}{'x perf':>8}"
        f"{'local':>8}{'remote':>8}{'PFS':>8}{'stall':>8}{'PFS/file':>9}  gamma"
    )
    lines.append(head)
    best, lower = r.best_seconds(), r.perfect_seconds()
    for p in r.results:
        o = p.outcome
        if o is None:
            lines.append(f"  {p.label:<22}{'failed':>10}  ({p.failure})")
            continue
        sh = o.shares()
        xbest = f"{o.seconds / best:8.3f}" if best else f"{'-':>8}"
        gamma = "-" if p.policy == "perfect" else ",".join(str(g) for g in o.pfs_readers)
        times = f"{duration(o.seconds):>10}{duration(o.seconds / s.scale):>11}"
        lines.append(
            f"  {p.label:<22}{times}{xbest}{o.seconds / lower:8.3f}"
            + "".join(f"{100 * sh[k]:7.1f}%" for k in SHARES)
            + f"{o.source_bytes[2] / s.dataset_bytes:9.2f}  {gamma}"
        )
    return "\n".join(lines)


def trace_table(rates: Sequence[HitRate], files: int, epochs: int, nodes: int, fraction: float) -> str:
    lru = next((h.rate for h in rates if h.policy == "lru"), 0.0)
    lines = [
        f"Epoch-wise shuffled trace: node 0 of {nodes}, {files:,} files, {epochs} epochs, "
        f"cache {100 * fraction:g}% of the dataset",
        f"  {'policy':<12}{'hit rate':>10}{'byte hits':>11}{'x LRU':>8}",
    ]
    for h in rates:
        x = f"{h.rate / lru:8.2f}" if lru else f"{'-':>8}"
        lines.append(f"  {h.policy:<12}{100 * h.rate:9.1f}%{100 * h.byte_rate:10.1f}%{x}")
    return "\n".join(lines)


def write_png(results: Sequence[ScenarioResult], path: str | Path, title: str = "") -> None:
    """One panel per scenario: a stacked bar per policy, height = time / Perfect, split by share."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(4.2 * len(results), 4.6), squeeze=False)
    for ax, r in zip(axes[0], results, strict=True):
        lower = r.perfect_seconds()
        labels = [p.label.replace(" (", "\n(") for p in r.results]
        for i, p in enumerate(r.results):
            o = p.outcome
            if o is None:
                ax.text(i, 0.05, "failed", rotation=90, ha="center", va="bottom", fontsize=8, color="0.3")
                continue
            height = o.seconds / lower
            bottom = 0.0
            for key, share in o.shares().items():
                ax.bar(i, height * share, bottom=bottom, color=COLORS[key], label=key if i == 0 else None)
                bottom += height * share
        sc = r.setup.scenario
        ax.set_title(f"{sc.number}: {sc.regime} ({sc.dataset})", fontsize=10)
        ax.set_xticks(range(len(labels)))
        ax.set_xticklabels(labels, rotation=60, ha="right", fontsize=8)
        ax.set_ylabel("time / Perfect")
        ax.axhline(1.0, color="0.5", lw=0.6, ls="--")
    from matplotlib.patches import Patch

    handles = [Patch(color=COLORS[k]) for k in SHARES]
    fig.legend(handles, ["local", "remote", "PFS", "stall"], loc="upper right", ncol=4, fontsize=8)
    if title:
        fig.suptitle(title, x=0.01, ha="left", fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.93))
    fig.savefig(path, dpi=120)
    plt.close(fig)
