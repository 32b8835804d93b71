"""NoPFS-style I/O simulator: policies x scenarios on placement's model and planner.

Simulates data-parallel training (one worker per node) reading a dataset under the I/O policies
of NoPFS section 6 (Perfect, Naive, StagingBuffer, LBANN, LRU) and seerfs's frequency policy,
in the paper's four scenarios (S < d1, d1 < S < D, D < S < ND, ND < S) on its Lassen setup, and
prints per scenario the job time per policy, its ratio to the best policy and to Perfect, and
the share of time by source (local, remote, PFS, stall).  Models: tools/sim/*.py docstrings.

    tools/simulate                          # all four scenarios, a table each
    tools/simulate --scenario 3 --png /tmp/sim.png
    tools/simulate --speedup 20             # 20x faster compute and preprocessing (NoPFS 6.2 uses 5x)
    tools/simulate --lru-trace              # LRU vs random vs frequency hit rates on a shuffled trace
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict

from tools.sim.engine import CONTENTION
from tools.sim.policies import POLICIES
from tools.sim.report import scenario_table, trace_table, write_png
from tools.sim.runs import run_scenario
from tools.sim.system import LASSEN_PFS, SCENARIOS, System, make_setup
from tools.sim.trace import hit_rates, make_trace

DEFAULT = System()


def _floats(text: str, count: int) -> list[float]:
    try:
        values = [float(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {count} comma-separated numbers, got {text!r}") from None
    if len(values) != count:
        raise argparse.ArgumentTypeError(f"expected {count} comma-separated numbers, got {text!r}")
    return values


def _threads(text: str) -> list[int]:
    values = _floats(text, 3)
    if any(v != int(v) or v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"expected three positive integers, got {text!r}")
    return [int(v) for v in values]


def _rates(text: str) -> list[float]:
    return _floats(text, 3)


def _pfs(text: str) -> tuple[tuple[int, float], ...]:
    try:
        pairs = [item.split(":") for item in text.split(",")]
        return tuple(sorted((int(g), float(t)) for g, t in pairs))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected readers:MB/s pairs like 1:330,4:1540, got {text!r}") from None


def _policies(text: str) -> list[str]:
    names = [x.strip() for x in text.split(",") if x.strip()]
    bad = [x for x in names if x not in POLICIES]
    if bad or not names:
        raise argparse.ArgumentTypeError(
            f"unknown policy {bad[0] if bad else text!r}; choose from {', '.join(POLICIES)}"
        )
    return names


def _positive(kind: type[int] | type[float]) -> Callable[[str], int | float]:
    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if not value > 0:
            raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
        return value

    return parse


def build_parser() -> argparse.ArgumentParser:
    d = DEFAULT
    pfs = ",".join(f"{g}:{t:g}" for g, t in LASSEN_PFS)
    p = argparse.ArgumentParser(
        prog="simulate",
        description=__doc__.split("\n\n")[1] if __doc__ else None,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    what = p.add_argument_group("what to simulate")
    what.add_argument("--scenario", choices=["1", "2", "3", "4", "all"], default="all", help="NoPFS 6 scenario")
    what.add_argument(
        "--policies", type=_policies, default=list(POLICIES), help="comma-separated subset of: " + ", ".join(POLICIES)
    )
    what.add_argument(
        "--files",
        type=_positive(int),
        default=65536,
        help="samples simulated per scenario (fewer if the dataset has fewer); capacities scale with S to keep "
        "S/d1, S/D, S/ND (see tools/sim/system.py)",
    )
    what.add_argument("--epochs", type=_positive(int), default=5, help="training epochs")
    what.add_argument("--seed", type=int, default=0, help="DistributedSampler seed (also draws sample sizes)")
    what.add_argument(
        "--contention",
        choices=CONTENTION,
        default="streams",
        help="what gamma in t(gamma) counts: the mean PFS fetches in flight (streams) or the nodes reading it "
        "(nodes, the paper's reading)",
    )
    what.add_argument("--speedup", type=_positive(float), default=1.0, help="multiply compute and preprocessing rates")
    sysg = p.add_argument_group("the machine (defaults: NoPFS 6.1's Lassen parameters)")
    sysg.add_argument("--nodes", type=_positive(int), default=d.nodes, help="N, one worker per node")
    sysg.add_argument(
        "--compute-mbps", type=_positive(float), default=d.compute_mbps, help="c, compute throughput per worker"
    )
    sysg.add_argument(
        "--preprocess-mbps", type=_positive(float), default=d.preprocess_mbps, help="beta, per staging thread"
    )
    sysg.add_argument(
        "--network-mbps", type=_positive(float), default=d.network_mbps, help="b_c, node-to-node bandwidth"
    )
    sysg.add_argument("--staging-gb", type=float, default=d.staging_gb, help="d0, staging buffer per node (full size)")
    sysg.add_argument("--ram-gb", type=float, default=d.ram_gb, help="d1, RAM tier per node (full size)")
    sysg.add_argument("--ssd-gb", type=float, default=d.ssd_gb, help="d2, SSD tier per node (full size)")
    sysg.add_argument(
        "--threads",
        type=_threads,
        default=[d.staging_threads, d.ram_threads, d.ssd_threads],
        help="p0,p1,p2: staging, RAM and SSD threads",
    )
    sysg.add_argument(
        "--read-mbps",
        type=_rates,
        default=[d.staging_mbps, d.ram_mbps, d.ssd_mbps],
        help="r0(p0),r1(p1),r2(p2): staging, RAM, SSD read throughput with their threads",
    )
    sysg.add_argument("--pfs-mbps", type=_pfs, default=LASSEN_PFS, help=f"t(gamma) as gamma:MB/s pairs (default {pfs})")
    out = p.add_argument_group("output")
    out.add_argument("--png", metavar="PATH", help="write stacked bars per scenario (like NoPFS Fig. 8) to PATH")
    out.add_argument("--json", action="store_true", help="print JSON instead of tables")
    tr = p.add_argument_group("LRU under shuffling (instead of the scenarios)")
    tr.add_argument(
        "--lru-trace",
        action="store_true",
        help="hit rates of LRU, random replacement, the frequency policy and Belady on an epoch-wise shuffled "
        "trace of --files samples over --epochs epochs",
    )
    tr.add_argument("--trace-nodes", type=_positive(int), default=1, help="nodes in the traced job (node 0 is traced)")
    tr.add_argument(
        "--cache-fraction", type=_positive(float), default=0.5, help="cache size as a fraction of the dataset"
    )
    return p


def system_of(args: argparse.Namespace) -> System:
    p0, p1, p2 = args.threads
    r0, r1, r2 = args.read_mbps
    return System(
        nodes=args.nodes,
        compute_mbps=args.compute_mbps * args.speedup,
        preprocess_mbps=args.preprocess_mbps * args.speedup,
        network_mbps=args.network_mbps,
        staging_gb=args.staging_gb,
        ram_gb=args.ram_gb,
        ssd_gb=args.ssd_gb,
        staging_threads=p0,
        ram_threads=p1,
        ssd_threads=p2,
        staging_mbps=r0,
        ram_mbps=r1,
        ssd_mbps=r2,
        pfs_mbps=args.pfs_mbps,
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    t0 = time.monotonic()
    if args.lru_trace:
        try:
            trace = make_trace(args.files, args.epochs, args.trace_nodes, args.cache_fraction, args.seed)
        except ValueError as exc:
            parser.error(str(exc))
        rates = hit_rates(trace)
        if args.json:
            rows = [asdict(h) | {"rate": h.rate, "byte_rate": h.byte_rate} for h in rates]
            doc = {
                "files": args.files,
                "epochs": args.epochs,
                "nodes": args.trace_nodes,
                "cache_fraction": args.cache_fraction,
                "seed": args.seed,
                "hit_rates": rows,
            }
            print(json.dumps(doc, indent=1))
        else:
            print(trace_table(rates, args.files, args.epochs, args.trace_nodes, args.cache_fraction))
        return 0
    try:
        system = system_of(args)
        numbers = [1, 2, 3, 4] if args.scenario == "all" else [int(args.scenario)]
        setups = [make_setup(SCENARIOS[n], system, args.files, args.epochs, args.seed) for n in numbers]
    except ValueError as exc:
        parser.error(str(exc))
    results = [run_scenario(s, args.policies, args.contention) for s in setups]
    if args.png:
        try:
            title = (
                f"{system.nodes} nodes, c = {system.compute_mbps:g} MB/s (speedup {args.speedup:g}), "
                f"{args.epochs} epochs, PFS contention by {args.contention}, seed {args.seed}"
            )
            write_png(results, args.png, title)
        except OSError as exc:
            print(f"simulate: cannot write {args.png}: {exc.strerror}", file=sys.stderr)
            return 1
    if args.json:
        doc = {
            "system": asdict(system),
            "speedup": args.speedup,
            "epochs": args.epochs,
            "seed": args.seed,
            "scenarios": [r.to_json() for r in results],
        }
        print(json.dumps(doc, indent=1))
    else:
        print("\n\n".join(scenario_table(r) for r in results))
        print(
            f"\n'time' is the scaled job's, 'full size' projects it (time / scale); x best: to the best policy but "
            f"Perfect; shares: compute time by source of its samples, and stall. ({time.monotonic() - t0:.1f} s)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
