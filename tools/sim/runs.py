"""Run the policies on a scenario and collect what the report shows."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tools.sim.engine import Outcome, run
from tools.sim.policies import LABELS, Failed, perfect, routing
from tools.sim.system import GB, Setup


@dataclass(frozen=True)
class PolicyResult:
    policy: str
    outcome: Outcome | None  # None: the policy cannot run here
    failure: str | None = None

    @property
    def label(self) -> str:
        return LABELS[self.policy]

    @property
    def seconds(self) -> float | None:
        return None if self.outcome is None else self.outcome.seconds


@dataclass(frozen=True)
class ScenarioResult:
    setup: Setup
    contention: str
    results: list[PolicyResult]
    lower: float  # the compute-bound lower bound: Perfect's time

    def perfect_seconds(self) -> float:
        return self.lower

    def best_seconds(self) -> float | None:
        """The fastest policy that really does I/O (Perfect excluded)."""
        times = [r.seconds for r in self.results if r.policy != "perfect" and r.seconds is not None]
        return min(times) if times else None

    def ratios(self) -> dict[str, float]:
        """S/d1, S/D and S/(N D): the same as at full size, by construction of the scaling."""
        s = self.setup
        ram, ssd = s.tier_bytes
        return {
            "S/d1": s.dataset_bytes / ram if ram else float("inf"),
            "S/D": s.dataset_bytes / (ram + ssd) if ram + ssd else float("inf"),
            "S/ND": s.dataset_bytes / (s.system.nodes * (ram + ssd)) if ram + ssd else float("inf"),
        }

    def to_json(self) -> dict[str, Any]:
        s = self.setup
        best, perfect = self.best_seconds(), self.perfect_seconds()
        rows = []
        for r in self.results:
            row: dict[str, Any] = {"policy": r.policy, "label": r.label, "failed": r.failure}
            o = r.outcome
            if o is not None:
                row.update(
                    seconds=round(o.seconds, 6),
                    full_size_hours=round(o.seconds / s.scale / 3600, 4),
                    ratio_best=round(o.seconds / best, 4) if best else None,
                    ratio_perfect=round(o.seconds / perfect, 4),
                    shares={k: round(v, 4) for k, v in o.shares().items()},
                    pfs_reads_per_file=round(o.source_bytes[2] / s.dataset_bytes, 4),
                    pfs_readers=list(o.pfs_readers),
                )
            rows.append(row)
        return {
            "scenario": s.scenario.number,
            "regime": s.scenario.regime,
            "dataset": s.scenario.dataset,
            "files": s.files,
            "files_full_size": s.scenario.files,
            "scale": s.scale,
            "dataset_gb": round(s.dataset_bytes / GB, 4),
            "dataset_gb_full_size": round(s.dataset_bytes / s.scale / GB, 1),
            "staging_bytes": s.staging_bytes,
            "tier_bytes": list(s.tier_bytes),
            "ratios": {k: round(v, 4) for k, v in self.ratios().items()},
            "contention": self.contention,
            "policies": rows,
        }


def run_scenario(setup: Setup, policies: Sequence[str], contention: str = "streams") -> ScenarioResult:
    """Every policy in ``policies`` on ``setup``, in that order."""
    results = []
    for name in policies:
        r = routing(name, setup)
        if isinstance(r, Failed):
            results.append(PolicyResult(name, None, r.reason))
        else:
            results.append(PolicyResult(name, run(setup, r, contention)))
    lower = run(setup, perfect(setup), contention).lower
    return ScenarioResult(setup, contention, results, lower)
