"""Real training clients over seerfs: does the prediction hold on the loop shapes people actually write?

Every test runs unmodified framework code (torchrun + gloo, DataLoader workers, torchvision
ImageFolder on the mount; Lightning, accelerate and torchdata where the shape is theirs; the
scripts are in tests/clients/) over seerfs over the PFS emulator, and checks five things, all from
sources independent of the code under test where possible:

* bytes: every sample every rank consumed matches a digest computed from the source directly;
* prediction: per epoch, the share of the mount's opens that its plan predicted (status'
  ``prefetch.predicted_opens`` against ``reads.opens``, split at epoch boundaries by snapshots the
  client takes after a barrier; the status document itself only keeps totals since the mount);
* prediction as the training side sees it, seerfs unasked: per epoch, the share of consumed samples
  whose open()+read() in the DataLoader worker took less than the emulator's open latency
  (``OPEN_MS``, less the time the worker waited for a CPU), outside the first two batches per local
  rank after each break (start, resume, epoch change, validation start and end), judged wherever
  the status-based rule is, but only in the slow set: a CI test's ``[wall-clock]`` twin is slow, its
  ``[counters]`` run is CI's, whose verdict never depends on how busy the machine is;
* PFS traffic from the emulator's own counters: at most 1.05x the dataset when the tiers hold it;
* for shapes where a seed is written that the sampler may not follow (a wrong seed, Lightning's
  sanity check, a mid-epoch resume, accelerate's default prepare()): the seeded run takes at most
  1.03x the wall time of the same run without a seed, run side by side.

A test reports every check that failed (not only the first) and prints its measurements as one JSON
line (also appended to $SEERFS_CLIENTS_LOG when set), so a run of the module shows precisely how
each shape fares.  Many fail on today's code, and that is what they are for.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from mounting import mounted, status
from pfsemu_fixture import requires_fuse, running_pfsemu

from tools.harness.jobs import free_port, make_source, wait_plan

sys.path.insert(0, str(Path(__file__).resolve().parent / "clients"))
from statusfields import status_fields

# Tests with a side-by-side unseeded run launch three torchruns (Lightning's start alone takes ~15 s here).
pytestmark = [pytest.mark.clients, pytest.mark.mount, pytest.mark.torch, requires_fuse, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parent.parent
CLIENTS = Path(__file__).resolve().parent / "clients"
TRAIN, VAL = 503, 125  # 503 train files: 252 per rank on two ranks (one padded); val: 8 batches per rank
OPEN_MS = 20  # PFS open latency: what makes a missed prediction cost time
MIN_RATE = 0.99  # share of an epoch's opens the plan must have predicted
BATCH = 8  # every client's batch size (seerfs_options' default)
BREAK_BATCHES = 2  # after a resume the plan cannot foresee, this many batches per local rank may go unpredicted
SLOW_S = OPEN_MS / 1000  # a consumed sample whose open()+read() took this long waited for a PFS open: unpredicted
# Share of a segment's consumed samples, after the break windows, that must open+read in under OPEN_MS: the
# acceptance criterion's 95%, not MIN_RATE.  Status counters have no noise; timings on a shared two-core host
# do: with other jobs running (load 3-7), up to 9 of an epoch's 472 samples after the windows (1.9%), every
# one predicted and staged, still took 20-33 ms less the worker's CPU wait (the daemon waited for a CPU), so
# MIN_RATE failed 1 of 4 control runs; at load 10 one Lightning epoch reached 5.1%, scattered, and failed
# this.  An epoch read before its files are staged measures 0-60%, slow samples in every batch.
FAST_MIN_RATE = 0.95
PFS_FACTOR = 1.05
WALL_FACTOR = 1.03
WALL_REPEATS = 2  # runs per side for the wall-time check: the best of each is compared (the host is shared)
TIERS = "64MiB"  # holds the whole dataset (about 9 MB)


@dataclass(frozen=True)
class Source:
    root: Path
    digests: dict[str, str]  # relative path -> sha1, computed from the backing files before any mount
    total: int  # bytes of every file (train + val)


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Source:
    root = tmp_path_factory.mktemp("clients-pfs") / "data"
    digests, total = make_source(root, TRAIN, VAL, mean_size=16_000)
    return Source(root, digests, total)


@dataclass
class Run:
    """One client run over a fresh seerfs mount: what the ranks consumed, what status and the PFS saw."""

    label: str
    ranks: list[dict[str, Any]]
    final: dict[str, Any]  # status fields after the run
    pfs_bytes: int
    pfs_opens: int
    seconds: float  # the slowest rank's training-loop wall time

    @property
    def snapshots(self) -> list[dict[str, Any]]:
        return next(r["snapshots"] for r in self.ranks if r["rank"] == 0)

    def segments(self) -> list[dict[str, Any]]:
        """Per segment between consecutive snapshots (an epoch, a sanity check): opens and how many were predicted.

        ``rate`` is the cursor's own measure (``cursor.hits`` over ``cursor.opens``, the status' hit
        rate, which credits the opens that located the job once detection succeeds); a segment in
        which a new plan replaced the cursor (its counters restart) counts from the new cursor on.
        ``open_rate`` counts only what was predicted at the moment of the open
        (``prefetch.predicted_opens`` over ``reads.opens``).
        """
        out = []
        snaps = self.snapshots
        for before, after in itertools.pairwise(snaps):
            opens = after["reads_opens"] - before["reads_opens"]
            predicted = after["predicted_opens"] - before["predicted_opens"]
            c0, c1 = before["cursor"], after["cursor"]
            restarted = c1["opens"] is None or c0["opens"] is None or c1["opens"] < c0["opens"]
            c_opens = (c1["opens"] or 0) - (0 if restarted else c0["opens"])
            c_hits = (c1["hits"] or 0) - (0 if restarted else c0["hits"])
            out.append(
                {
                    "segment": after["label"],
                    "opens": opens,
                    "cursor_opens": c_opens,
                    "hits": c_hits,
                    "rate": round(c_hits / c_opens, 4) if c_opens else 0.0,
                    "open_rate": round(predicted / opens, 4) if opens else None,
                    "cursor_restarted": restarted and c0["opens"] is not None,
                    "cursor_state": c1["state"],
                    "mode": after["mode"],
                }
            )
        return out


def segment_of(phase: str, epoch: int) -> str:
    """The status segment a consumed sample falls in: the clients snapshot after the sanity check and each epoch."""
    return "sanity" if phase == "sanity" else f"epoch{epoch}"


def ms_quantiles(seconds: list[float]) -> dict[str, float | int | None]:
    """Count, p50, p99 and max in milliseconds (nearest rank), None where there is nothing to rank."""
    xs = sorted(seconds)

    def at(q: float) -> float | None:
        return round(xs[min(len(xs) - 1, int(q * len(xs)))] * 1e3, 3) if xs else None

    return {"n": len(xs), "p50": at(0.50), "p99": at(0.99), "max": round(xs[-1] * 1e3, 3) if xs else None}


def fs_seconds(sample: list[Any]) -> float:
    """A consumed sample's open+read wall time less the CPU wait in it: how long the filesystem kept the reader."""
    return float(sample[4] - sample[5])


def slow_counts(seconds: list[float]) -> dict[str, Any]:
    """How many times there are, how many reached :data:`SLOW_S`, and the share below it."""
    slow = sum(x >= SLOW_S for x in seconds)
    return {"samples": len(seconds), "slow": slow, "share": round(1 - slow / len(seconds), 4) if seconds else None}


def open_reads(run: Run) -> dict[str, dict[str, Any]]:
    """Per segment, the training side's own timing of every consumed sample's open()+read(), seerfs unasked.

    A sample is *slow* when the filesystem kept its reader at least :data:`SLOW_S` (the emulator's
    open latency) in the open and read: the wall time less the time the DataLoader worker spent
    runnable but waiting for a CPU (the kernel's schedstat, :func:`clientlib.digest_of_file`).  A
    file staged ahead of its reader is served from seerfs's caches in about a millisecond; one
    that was not waits for a PFS open, sleeping, which no CPU wait can hide.  On this shared
    two-core host a cache hit's wall time alone reaches 20-30 ms a few times per epoch while other
    jobs run (the worker waits for a CPU); ``wall_share`` is that plain measure, reported next to it.

    A *break* in a rank's stream is its first sample, and any sample whose segment or phase differs
    from the one before it (start or resume, epoch change, validation start and end, the sanity
    check); a rank's first :data:`BREAK_BATCHES` batches after a break form its *window*.
    ``rest_share`` is the share of fast samples outside the windows, ``share`` that of all samples.
    Samples are in the order each rank consumed them, so the windows follow the loop.
    """
    window = BREAK_BATCHES * BATCH
    out: dict[str, dict[str, Any]] = {}
    for r in run.ranks:
        key, since = None, 0
        for sample in r["samples"]:
            phase, epoch, seconds = sample[0], sample[1], fs_seconds(sample)
            seg = segment_of(phase, epoch)
            if (seg, phase) != key:
                key, since = (seg, phase), 0
                out.setdefault(seg, {"breaks": 0, "times": [], "wall": [], "rest": [], "phases": {}})["breaks"] += 1
            o = out[seg]
            o["times"].append(seconds)
            o["wall"].append(sample[4])
            o["phases"].setdefault(phase, []).append(seconds)
            if since >= window:
                o["rest"].append(seconds)
            since += 1
    summary: dict[str, dict[str, Any]] = {}
    for seg, o in out.items():
        rest, wall = slow_counts(o["rest"]), slow_counts(o["wall"])
        summary[seg] = {
            **slow_counts(o["times"]),
            "wall_slow": wall["slow"],
            "wall_share": wall["share"],
            "breaks": o["breaks"],
            "rest_samples": rest["samples"],
            "rest_slow": rest["slow"],
            "rest_share": rest["share"],
            "phases": {ph: slow_counts(xs) for ph, xs in o["phases"].items()},
            "fast_ms": ms_quantiles([x for x in o["times"] if x < SLOW_S]),
            "slow_ms": ms_quantiles([x for x in o["times"] if x >= SLOW_S]),
        }
    return summary


def seerfs_options(
    world: int,
    epochs: int,
    *,
    val: bool,
    val_drop_last: bool = False,
    batch: int = 8,
    workers: int = 2,
) -> dict[str, Any]:
    """The job as seerfs is told it, as ``-o`` keys (see ``seerfs config --defaults``, seerfs.yaml(5))."""
    opts: dict[str, Any] = {
        "job.world_size": world,
        "job.ranks_per_node": world,
        "job.epochs": epochs,
        "job.batch_size": batch,
        "job.num_workers": workers,
        "tiers.0.kind": "memory",
        "tiers.0.bytes": TIERS,
        "prefetch.lookahead_bytes": "4MiB",
        "datasets.0.root": "train",
    }
    if val:
        opts |= {
            "datasets.1.root": "val",
            "datasets.1.follows": "train",
            "datasets.1.sampler.shuffle": "false",
            "datasets.1.sampler.drop_last": str(val_drop_last).lower(),
        }
    return opts


def torchrun(script: str, nprocs: int, args: list[str], timeout: float = 300) -> None:
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes=1",
        f"--nproc-per-node={nprocs}",
        "--master-addr=127.0.0.1",
        f"--master-port={free_port()}",
        str(CLIENTS / script),
        *args,
    ]
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    res = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    if res.returncode != 0:
        raise AssertionError(f"{script} {' '.join(args)} failed ({res.returncode}):\n{res.stderr[-4000:]}")


def hung(mnt: Path) -> str:
    """What a job that did not finish left behind: the mount's status and its daemon's threads (py-spy
    dump, where installed), so that a hang seen once can be told apart from a slow host."""
    try:
        doc = status(mnt)
    except Exception as exc:  # the daemon may be what hangs
        return f"status unreadable: {exc}"
    spy = Path(sys.executable).parent / "py-spy"
    stacks = ""
    if spy.exists():
        dump = subprocess.run([str(spy), "dump", "--pid", str(doc["pid"])], capture_output=True, text=True, timeout=30)
        stacks = dump.stdout[-6000:] or dump.stderr[-2000:]
    return json.dumps(status_fields(doc), indent=1, default=str)[-6000:] + "\n" + stacks


def run_client(
    tmp: Path,
    source: Source,
    label: str,
    script: str,
    nprocs: int,
    args: list[str],
    options: dict[str, Any],
    *,
    seed: int | None,
) -> Run:
    """Emulator over the source, seerfs over the emulator (fresh cache), optional seed, then the client."""
    work = tmp / label
    out = work / "out"
    out.mkdir(parents=True)
    opts = {"cache_dir": str(work / "cache"), **options}
    o = ",".join(f"{k}={v}" for k, v in opts.items())
    with (
        # 64 requests at once: a PFS serves many clients in parallel, and with its default 16 the
        # emulator alone caps a 20 ms-open PFS at 800 files/s, below what these jobs read (up to 1,600
        # samples/s): epoch 0 of a job that writes its seed as it starts would then measure that cap.
        running_pfsemu(source.root, open_latency_ms=OPEN_MS, extra_args=("--threads", "64")) as emu,
        mounted(emu.mountpoint, work / "mnt", "-o", o) as mnt,
    ):
        if seed is not None:  # the job script: echo SEED > MOUNT/.control/seed, before the training starts
            (mnt / ".control" / "seed").write_text(f"{seed}\n")
            wait_plan(mnt, seed)
        try:
            torchrun(script, nprocs, ["--data", str(mnt), "--out", str(out), *args])
        except subprocess.TimeoutExpired as exc:
            raise AssertionError(f"{label}: {script} did not finish in {exc.timeout:.0f} s\n{hung(mnt)}") from exc
        final = status_fields(status(mnt))
        counters = emu.counters()
    ranks = [json.loads(p.read_text()) for p in sorted(out.glob("rank*.json"))]
    assert len(ranks) == nprocs, f"{label}: {len(ranks)} of {nprocs} ranks wrote results"
    return Run(label, ranks, final, counters.bytes, counters.opens, max(r["wall_s"] for r in ranks))


def side_by_side(
    tmp: Path,
    source: Source,
    script: str,
    nprocs: int,
    args: list[str],
    options: dict[str, Any],
    *,
    seed: int | None,
    seeded_args: list[str] | None = None,
) -> tuple[list[Run], list[Run]]:
    """The same job with and without a seed, WALL_REPEATS times each, interleaved (unseeded first).

    ``seed`` is written by the job script before the run; ``seeded_args`` replace ``args`` for the
    seeded runs (a client that writes its seed itself).  Returns (seeded runs, unseeded runs).
    """
    seeded, unseeded = [], []
    for i in range(WALL_REPEATS):
        unseeded.append(run_client(tmp, source, f"unseeded{i}", script, nprocs, args, options, seed=None))
        seeded.append(run_client(tmp, source, f"seeded{i}", script, nprocs, seeded_args or args, options, seed=seed))
    return seeded, unseeded


@dataclass
class Verdict:
    """Every check of one test, failed or not, and its measurements: reported together at the end."""

    name: str
    timed: bool  # judge the training side's clock (fast_reads): only in the slow set, never in CI's verdict
    failures: list[str] = field(default_factory=list)
    metrics: dict[str, Any] = field(default_factory=dict)

    def check(self, ok: bool, message: str) -> None:
        if not ok:
            self.failures.append(message)

    def bytes_identical(self, run: Run, source: Source) -> None:
        bad, n = [], 0
        for r in run.ranks:
            for _phase, _epoch, rel, sha, *_times in r["samples"]:
                n += 1
                if source.digests.get(rel) != sha:
                    bad.append(rel)
        self.metrics.setdefault("samples", {})[run.label] = n
        self.check(n > 0 and not bad, f"{run.label}: {len(bad)} of {n} samples differ from the source, e.g. {bad[:3]}")

    def predicted(
        self, run: Run, *, skip: tuple[str, ...] = (), resumed: tuple[str, ...] = (), after_break: tuple[str, ...] = ()
    ) -> None:
        """Every segment (epoch, sanity check) not in ``skip`` had >= MIN_RATE of its opens predicted.

        The first segment judged is held to the cursor's hit rate (detection needs a few opens and
        credits them once it succeeds); later ones also to the share predicted at open time, which
        a retroactive credit cannot inflate.  A segment whose hits exceed its opens is reported as
        such: the status then claims more than was predicted.

        A segment in ``resumed`` starts in the middle of an epoch the plan cannot foresee (a job
        resumed from a mid-epoch checkpoint): the cursor has to find its position from the opens
        first.  It is held to the bound stated for such a break: at most two batches per local rank
        unpredicted (:data:`BREAK_BATCHES`), by both measures.  A fixed share would not do: the rest
        of a resumed epoch can be short (100 samples per rank after torchdata's resume at 152 of 252),
        and two batches per rank are then more than 5% of it.

        A segment in ``after_break`` is a whole epoch that begins where the loop left the one before
        early: held to the same two batches per local rank and to the criterion's 95%, not to
        MIN_RATE.  A rank that left its epoch early has not finished its pass, so its first opens of
        the next epoch are placed only by a relock, and how the ranks' workers interleave decides
        whether one relock takes both: under two CPU hogs 2 of 22 runs left 12-14 opens of the last
        epoch unpredicted (96.4-96.9%), one rank followed into it while the other's first batch
        waited for a relock (the daemon's debug log).
        """
        segs = run.segments()
        timed = open_reads(run)
        for s in segs:  # the latency measure next to the status' own
            t = timed.get(s["segment"])
            s["fast_share"], s["fast_rest_share"] = (t["share"], t["rest_share"]) if t else (None, None)
            s["fast_wall_share"] = t["wall_share"] if t else None
        self.metrics.setdefault("segments", {})[run.label] = segs
        self.check(bool(segs), f"{run.label}: no status snapshots (was the mount a seerfs mount?)")
        judged = [s for s in segs if s["segment"] not in skip and s["opens"]]
        for s in judged if self.timed else ():
            self.fast_reads(run, s["segment"], timed.get(s["segment"]))
        budget = BREAK_BATCHES * BATCH * len(run.ranks)  # every rank of these runs is on the one node
        for i, s in enumerate(judged):
            where = f"{run.label}: {s['segment']}"
            counts = (
                f"{s['hits']} hits of {s['cursor_opens']} cursor opens, {s['open_rate']:.1%} of {s['opens']} opens "
                f"predicted at open time; cursor {s['cursor_state']}, mode {s['mode']}"
            )
            broke = s["segment"] in after_break
            if broke or s["segment"] in resumed:
                missed = s["cursor_opens"] - s["hits"]
                missed_at_open = s["opens"] - round(s["open_rate"] * s["opens"])
                whole = not broke or (s["rate"] >= FAST_MIN_RATE and s["open_rate"] >= FAST_MIN_RATE)
                self.check(
                    0 <= missed <= budget and missed_at_open <= budget and s["hits"] <= s["cursor_opens"] and whole,
                    f"{where}: {missed} opens unpredicted by the cursor, {missed_at_open} at open time, after the "
                    f"{'early break' if broke else 'resume'} (allowed {budget}: {BREAK_BATCHES} batches per local "
                    f"rank{f', and {FAST_MIN_RATE:.0%} of the epoch' if broke else ''}; {counts})",
                )
                continue
            ok = MIN_RATE <= s["rate"] <= 1.0
            self.check(
                ok,
                f"{where}: hit rate {s['rate']:.1%} not in [{MIN_RATE:.0%}, 100%] ({counts})",
            )
            if i > 0 and ok:  # one message per segment
                self.check(
                    s["open_rate"] >= MIN_RATE,
                    f"{where}: predicted at open time {s['open_rate']:.1%} < {MIN_RATE:.0%} ({counts})",
                )
        cursor = run.final["cursor"]
        self.check(not cursor["mismatch"], f"{run.label}: cursor declared a mismatch: {cursor['mismatch_reason']}")

    def fast_reads(self, run: Run, segment: str, timed: dict[str, Any] | None) -> None:
        """The same segment judged by the training side's clock instead of seerfs's counters (see :func:`open_reads`).

        After each break a rank's first :data:`BREAK_BATCHES` batches may be slow (what a break may
        cost, as for the status' count after a resume); of the rest of the segment, at least
        :data:`FAST_MIN_RATE` of the consumed samples kept their reader under :data:`OPEN_MS` in
        open+read.  Judged where the status-based rule judges (seeded runs, the same segments).

        What it can see: a file read from the PFS while its reader waits.  The tiers here hold the
        whole dataset, so a file the plan missed is read from the memory tier in about a millisecond
        once the tier has it: in every epoch after the first, and in the first too when the seed is
        written before the job starts (the tier fill ends before the first open; test_wrong_seed's
        seeded run, 3-9% predicted, reads all fast).  It bites where the job writes its seed just
        before training (accelerate's clients): the reader then outruns the staging in epoch 0.
        """
        where = f"{run.label}: {segment}"
        if timed is None:
            self.check(False, f"{where}: the mount saw opens but no consumed sample is labelled for this segment")
            return
        rest = timed["rest_share"]
        if rest is not None and rest < FAST_MIN_RATE:
            self.check(
                False,
                f"{where}: {timed['rest_slow']} of {timed['rest_samples']} samples after the break windows took >= "
                f"{OPEN_MS} ms to open+read less CPU wait ({rest:.1%} fast < {FAST_MIN_RATE:.0%}; {timed['slow']} "
                f"slow of {timed['samples']} in all, {timed['wall_slow']} by wall time alone, {timed['breaks']} "
                f"breaks over the ranks; fast ms {timed['fast_ms']}, slow ms {timed['slow_ms']})",
            )

    def pfs_once(self, run: Run, source: Source) -> None:
        ratio = run.pfs_bytes / source.total
        self.metrics.setdefault("pfs_ratio", {})[run.label] = round(ratio, 3)
        self.check(ratio <= PFS_FACTOR, f"{run.label}: PFS read {ratio:.2f}x the dataset (> {PFS_FACTOR}x)")

    def no_slower(self, seeded: list[Run], unseeded: list[Run]) -> None:
        """The fastest seeded run against the fastest unseeded one: the least disturbed of each (shared host)."""
        best_s, best_u = min(r.seconds for r in seeded), min(r.seconds for r in unseeded)
        ratio = best_s / best_u
        self.metrics["wall"] = {
            "seeded_s": [round(r.seconds, 2) for r in seeded],
            "unseeded_s": [round(r.seconds, 2) for r in unseeded],
            "ratio": round(ratio, 3),
            "loadavg": [round(x, 2) for x in os.getloadavg()],
        }
        self.check(
            ratio <= WALL_FACTOR,
            f"seeded run took {ratio:.2f}x the unseeded one (best of {len(seeded)}: {best_s:.1f}s vs {best_u:.1f}s; "
            f"> {WALL_FACTOR}x)",
        )

    def done(self, *runs: Run) -> None:
        for run in runs:
            self.metrics.setdefault("final", {})[run.label] = run.final
            samples = [sample for r in run.ranks for sample in r["samples"]]
            times = [fs_seconds(sample) for sample in samples]
            self.metrics.setdefault("open_read", {})[run.label] = {
                "fast_ms": ms_quantiles([x for x in times if x < SLOW_S]),
                "slow_ms": ms_quantiles([x for x in times if x >= SLOW_S]),
                "wall_ms": ms_quantiles([sample[4] for sample in samples]),
                "cpu_wait_ms": ms_quantiles([sample[5] for sample in samples]),
                "segments": open_reads(run),
            }
        line = json.dumps({"test": self.name, "failures": self.failures, **self.metrics})
        print(line)
        log = os.environ.get("SEERFS_CLIENTS_LOG")
        if log:
            with open(log, "a") as fh:
                fh.write(line + "\n")
        if self.failures:
            pytest.fail(f"{self.name}: {len(self.failures)} check(s) failed:\n  " + "\n  ".join(self.failures))


@pytest.fixture
def verdict(request: pytest.FixtureRequest) -> Iterator[Verdict]:
    """A slow test also judges timings; a CI test takes ``wall_clock`` and so has a slow twin that does."""
    yield Verdict(request.node.name, timed=request.node.get_closest_marker("slow") is not None)


# ---------------------------------------------------------------------------------------------- torchrun


def test_plain_loop_control(tmp_path: Path, source: Source, verdict: Verdict, wall_clock: bool) -> None:
    """The shape seerfs models exactly (seeded DistributedSampler, set_epoch, full epochs): the harness's control."""
    opts = seerfs_options(2, 3, val=False)
    run = run_client(tmp_path, source, "seeded", "ddp_loop.py", 2, ["--sampler-seed", "7"], opts, seed=7)
    verdict.bytes_identical(run, source)
    verdict.predicted(run)
    verdict.pfs_once(run, source)
    verdict.done(run)


@pytest.mark.slow
@pytest.mark.parametrize(("epoch", "skip"), [(0, 150), (1, 150), (2, 40)], ids=["e0-150", "e1-150", "e2-40"])
def test_mid_epoch_resume_by_sampler_skip(
    tmp_path: Path, source: Source, verdict: Verdict, epoch: int, skip: int
) -> None:
    """A job resumed on a fresh mount at (epoch, samples consumed per rank): the sampler skips what was consumed."""
    opts = seerfs_options(2, 3, val=False)
    args = ["--sampler-seed", "7", "--start-epoch", str(epoch), "--skip", str(skip)]
    seeded_runs, unseeded_runs = side_by_side(tmp_path, source, "ddp_loop.py", 2, args, opts, seed=7)
    for run in (*seeded_runs, *unseeded_runs):
        verdict.bytes_identical(run, source)
    seeded = seeded_runs[0]
    verdict.predicted(seeded, resumed=(f"epoch{epoch}",))
    verdict.pfs_once(seeded, source)
    verdict.no_slower(seeded_runs, unseeded_runs)
    verdict.done(*seeded_runs, *unseeded_runs)


@pytest.mark.slow
def test_seed_written_late(tmp_path: Path, source: Source, verdict: Verdict) -> None:
    """Rank 0 writes the seed after 5 batches of epoch 0: later epochs must be predicted."""
    opts = seerfs_options(2, 3, val=False)
    args = ["--sampler-seed", "7", "--write-seed", "7", "--write-seed-after", "5"]
    run = run_client(tmp_path, source, "late", "ddp_loop.py", 2, args, opts, seed=None)
    verdict.bytes_identical(run, source)
    verdict.predicted(run, skip=("epoch0",))
    verdict.pfs_once(run, source)
    verdict.done(run)


@pytest.mark.slow
def test_validation_every_epoch(tmp_path: Path, source: Source, verdict: Verdict) -> None:
    """The ImageNet example's validation: DistributedSampler(shuffle=False, drop_last=True), then the tail per rank."""
    opts = seerfs_options(2, 3, val=True, val_drop_last=True)
    run = run_client(tmp_path, source, "val", "ddp_loop.py", 2, ["--sampler-seed", "7", "--val"], opts, seed=7)
    verdict.bytes_identical(run, source)
    verdict.predicted(run)
    verdict.pfs_once(run, source)
    verdict.done(run)


@pytest.mark.slow
def test_epochs_past_configured(tmp_path: Path, source: Source, verdict: Verdict) -> None:
    """job.epochs says 2, the job trains 3 (a longer schedule than the config, or a resumed run that goes on)."""
    opts = seerfs_options(2, 2, val=False)
    run = run_client(tmp_path, source, "past", "ddp_loop.py", 2, ["--sampler-seed", "7", "--epochs", "3"], opts, seed=7)
    verdict.bytes_identical(run, source)
    verdict.predicted(run)
    verdict.pfs_once(run, source)
    verdict.done(run)


@pytest.mark.slow
def test_never_set_epoch(tmp_path: Path, source: Source, verdict: Verdict) -> None:
    """No set_epoch: DistributedSampler repeats epoch 0's order (seed + 0) every epoch."""
    opts = seerfs_options(2, 3, val=False)
    run = run_client(
        tmp_path, source, "noepoch", "ddp_loop.py", 2, ["--sampler-seed", "7", "--no-set-epoch"], opts, seed=7
    )
    verdict.bytes_identical(run, source)
    verdict.predicted(run)
    verdict.pfs_once(run, source)
    verdict.done(run)


@pytest.mark.slow
def test_early_break(tmp_path: Path, source: Source, verdict: Verdict) -> None:
    """Each epoch stops after 20 of its 32 batches (a step budget per epoch), then set_epoch(epoch + 1)."""
    opts = seerfs_options(2, 3, val=False)
    run = run_client(
        tmp_path, source, "break", "ddp_loop.py", 2, ["--sampler-seed", "7", "--break-after", "20"], opts, seed=7
    )
    verdict.bytes_identical(run, source)
    verdict.predicted(run, after_break=("epoch1", "epoch2"))
    verdict.pfs_once(run, source)
    verdict.done(run)


@pytest.mark.slow
def test_wrong_seed(tmp_path: Path, source: Source, verdict: Verdict) -> None:
    """The ImageNet example run with --seed 42 and 42 written: its DistributedSampler is seeded 0, not 42.

    A wrong seed cannot be predicted from; what must hold is that the daemon names it within two
    batches per local rank, still reads the PFS about once, and costs no time against writing no
    seed at all.  Afterwards the mount either stays in mismatch or its seed search finds the seed
    the sampler really uses (0) and follows that: a seed found from the opens replaces the written
    one (seerfs-control(7), SEED DISCOVERY), so the mismatch need not last to the end of the run.
    """
    opts = seerfs_options(2, 3, val=False)
    seeded_runs, unseeded_runs = side_by_side(tmp_path, source, "ddp_loop.py", 2, ["--seed", "42"], opts, seed=42)
    for run in (*seeded_runs, *unseeded_runs):
        verdict.bytes_identical(run, source)
    seeded = seeded_runs[0]
    verdict.metrics["segments"] = {"seeded0": seeded.segments()}
    final = seeded.final["cursor"]
    first = final["first_mismatch_open"]
    budget = BREAK_BATCHES * BATCH * 2
    verdict.check(
        first is not None and first <= budget,
        f"the wrong seed was not named within {budget} opens (2 batches per local rank): cursor {final}",
    )
    after0 = seeded.snapshots[1]
    # Named as a wrong seed; or already replaced by the sampler's real seed, found from the opens:
    # a DistributedSampler order of another seed is what a wrong seed is (the search can finish
    # within epoch 0, and then the mismatch is over before the snapshot).
    found0 = after0["seed_origin"] == "discovered" and after0["seed"] == 0
    verdict.check(
        (after0["cursor"]["mismatch"] and after0["cursor"]["mismatch_kind"] == "wrong_seed") or found0,
        f"after epoch 0 the status neither names a wrong seed nor follows the real one found: seed "
        f"{after0['seed']} ({after0['seed_origin']}), cursor {after0['cursor']}",
    )
    found = seeded.final["seed_origin"] == "discovered" and seeded.final["seed"] == 0
    verdict.check(
        final["mismatch"] or (found and final["state"] == "tracking"),
        f"at the end neither a mismatch nor the sampler's real seed found: seed {seeded.final['seed']} "
        f"({seeded.final['seed_origin']}), cursor {final}",
    )
    verdict.pfs_once(seeded, source)
    verdict.no_slower(seeded_runs, unseeded_runs)
    verdict.done(*seeded_runs, *unseeded_runs)


@pytest.mark.slow
def test_wrong_job_shape(tmp_path: Path, source: Source, verdict: Verdict) -> None:
    """The config says 2 ranks, batch 16, 4 workers; the job runs 3 ranks, batch 8, 2 workers."""
    opts = seerfs_options(2, 3, val=False, batch=16, workers=4)
    run = run_client(tmp_path, source, "shape", "ddp_loop.py", 3, ["--sampler-seed", "7"], opts, seed=7)
    verdict.bytes_identical(run, source)
    verdict.predicted(run)
    verdict.pfs_once(run, source)
    verdict.done(run)


# ---------------------------------------------------------------------------------------------- torchdata


STATEFUL_ARGS = ["--sampler-seed", "7", "--stateful"]


def stateful_first_part(tmp_path: Path, source: Source) -> Path:
    """Run a StatefulDataLoader job straight on the source and stop it after 19 batches of epoch 1
    (152 of 252 samples per rank); return the directory holding its state_dict.  Only the resumed
    part is under test, so this part needs no mount."""
    part1 = tmp_path / "part1"
    part1.mkdir()
    args = [*STATEFUL_ARGS, "--data", str(source.root), "--out", str(part1), "--stop-at", "1:19", "--compute-ms", "0"]
    torchrun("ddp_loop.py", 2, args)
    return part1 / "state"


def test_stateful_dataloader_resume(tmp_path: Path, source: Source, verdict: Verdict, wall_clock: bool) -> None:
    """torchdata StatefulDataLoader resumed from a mid-epoch state_dict on a fresh mount: every byte right, the
    rest of the epoch and the next one predicted, the PFS read once.  (Its wall time against the same resume
    without a seed: the slow test below.)"""
    opts = seerfs_options(2, 3, val=False)
    args = [*STATEFUL_ARGS, "--resume-state", str(stateful_first_part(tmp_path, source))]
    run = run_client(tmp_path, source, "seeded", "ddp_loop.py", 2, args, opts, seed=7)
    verdict.bytes_identical(run, source)
    n = len(run.ranks[0]["samples"])
    verdict.check(n == (252 - 152) + 252, f"rank 0 read {n} samples after the resume, not 352")
    verdict.predicted(run, resumed=("epoch1",))
    verdict.pfs_once(run, source)
    verdict.done(run)


@pytest.mark.slow
def test_stateful_dataloader_resume_is_no_slower_than_without_a_seed(
    tmp_path: Path, source: Source, verdict: Verdict
) -> None:
    """The same resume, with and without the seed written, side by side: writing it costs no wall time."""
    opts = seerfs_options(2, 3, val=False)
    args = [*STATEFUL_ARGS, "--resume-state", str(stateful_first_part(tmp_path, source))]
    seeded_runs, unseeded_runs = side_by_side(tmp_path, source, "ddp_loop.py", 2, args, opts, seed=7)
    for run in (*seeded_runs, *unseeded_runs):
        verdict.bytes_identical(run, source)
    verdict.no_slower(seeded_runs, unseeded_runs)
    verdict.done(*seeded_runs, *unseeded_runs)


# ---------------------------------------------------------------------------------------------- Lightning


def test_lightning_distributed_sampler(tmp_path: Path, source: Source, verdict: Verdict, wall_clock: bool) -> None:
    """Lightning injects DistributedSampler(seed=PL_GLOBAL_SEED) and calls set_epoch: write seed_everything's seed."""
    opts = seerfs_options(2, 3, val=False)
    run = run_client(tmp_path, source, "lightning", "lightning_loop.py", 2, ["--seed", "7"], opts, seed=7)
    verdict.bytes_identical(run, source)
    verdict.predicted(run)
    verdict.pfs_once(run, source)
    verdict.done(run)


@pytest.mark.slow
def test_lightning_sanity_check(tmp_path: Path, source: Source, verdict: Verdict) -> None:
    """Lightning's default sanity check reads 2 val batches per rank before epoch 0; then val after every epoch."""
    opts = seerfs_options(2, 3, val=True)
    args = ["--seed", "7", "--val", "epoch"]
    seeded_runs, unseeded_runs = side_by_side(tmp_path, source, "lightning_loop.py", 2, args, opts, seed=7)
    for run in (*seeded_runs, *unseeded_runs):
        verdict.bytes_identical(run, source)
    seeded = seeded_runs[0]
    verdict.predicted(seeded)
    verdict.pfs_once(seeded, source)
    verdict.no_slower(seeded_runs, unseeded_runs)
    verdict.done(*seeded_runs, *unseeded_runs)


@pytest.mark.slow
def test_lightning_val_every_n_steps(tmp_path: Path, source: Source, verdict: Verdict) -> None:
    """val_check_interval=10: the whole val set is read after every 10 training steps, mid-epoch."""
    opts = seerfs_options(2, 3, val=True)
    args = ["--seed", "7", "--val", "steps", "--val-every", "10", "--sanity-steps", "0"]
    run = run_client(tmp_path, source, "valsteps", "lightning_loop.py", 2, args, opts, seed=7)
    verdict.bytes_identical(run, source)
    verdict.predicted(run)
    verdict.pfs_once(run, source)
    verdict.done(run)


# ---------------------------------------------------------------------------------------------- accelerate


def test_accelerate_seedable_sampler(tmp_path: Path, source: Source, verdict: Verdict, wall_clock: bool) -> None:
    """use_seedable_sampler=True: epoch e draws randperm from a generator seeded set_seed + e; batches go
    round-robin to the processes (BatchSamplerShard), not sample by sample as DistributedSampler does."""
    # seerfs.yaml(5): use_seedable_sampler=True is the sampler kind "accelerate" (set_seed's value written)
    opts = seerfs_options(2, 3, val=False) | {"datasets.0.sampler.kind": "accelerate"}
    run = run_client(
        tmp_path,
        source,
        "seedable",
        "accelerate_loop.py",
        2,
        ["--seed", "7", "--seedable", "--write-seed", "set-seed"],
        opts,
        seed=None,
    )
    verdict.bytes_identical(run, source)
    verdict.predicted(run)
    verdict.pfs_once(run, source)
    verdict.done(run)


@pytest.mark.slow
def test_accelerate_default_prepare(tmp_path: Path, source: Source, verdict: Verdict) -> None:
    """Default prepare(): one generator, seeded from rank 0's global RNG at prepare(), runs on across epochs;
    the job writes that generator's initial seed, the only number that decides the order, and names the
    sampler kind "accelerate_default" (seerfs.yaml(5)): the order is one generator stream across epochs,
    which no DistributedSampler-shaped plan predicts past epoch 0."""
    opts = seerfs_options(2, 3, val=False) | {"datasets.0.sampler.kind": "accelerate_default"}
    seeded_runs, unseeded_runs = side_by_side(
        tmp_path,
        source,
        "accelerate_loop.py",
        2,
        ["--seed", "7"],
        opts,
        seed=None,
        seeded_args=["--seed", "7", "--write-seed", "generator"],
    )
    for run in (*seeded_runs, *unseeded_runs):
        verdict.bytes_identical(run, source)
    seeded = seeded_runs[0]
    verdict.predicted(seeded)
    verdict.pfs_once(seeded, source)
    verdict.no_slower(seeded_runs, unseeded_runs)
    verdict.done(*seeded_runs, *unseeded_runs)


@pytest.mark.slow  # both twins: epoch 0 sits at the 95% bound (93.7-98.6% in runs on a busy machine)
def test_lightning_sanity_check_nothing_written(
    tmp_path: Path, source: Source, verdict: Verdict, wall_clock: bool
) -> None:
    """The sanity check's validation batches come first and nothing is written: the seed is found from the
    training opens, the sanity pass never locks the training cursor, and epoch 0 is >= 95% predicted
    (status' predicted opens at open time; the cursor's own rate too), every later epoch as the control.

    Slow, not in CI: epoch 0 sits at the 95% bound by the readers' clock (93-99% on 2 cores): the
    opens before the lock (about 20 per rank) and a few first reads of a batch that a busy CPU
    delayed are slow.  Runs that waited on the PFS for about a hundred opens after the lock were the
    view held back by positions the relock never saw (the cursor's progress now counts consumed
    positions, ``NodeCursor.progress_key``), and later a validation schedule learned from the
    sanity pass as the relock replayed it (it now learns none: test_cursor.py's
    ``test_a_sanity_pass_relocked_from_carried_opens_teaches_no_schedule``)."""
    opts = seerfs_options(2, 3, val=True)
    run = run_client(
        tmp_path, source, "found", "lightning_loop.py", 2, ["--seed", "7", "--val", "epoch"], opts, seed=None
    )
    verdict.bytes_identical(run, source)
    segs = run.segments()
    verdict.metrics["segments"] = {run.label: segs}
    verdict.metrics["discovery_found_at_opens"] = run.final.get("discovery_found_at_opens")
    epoch0 = next((s for s in segs if s["segment"] == "epoch0"), None)
    verdict.check(epoch0 is not None, f"no epoch0 segment: {segs}")
    if epoch0 is not None:
        verdict.check(
            (epoch0["open_rate"] or 0.0) >= FAST_MIN_RATE,
            f"epoch 0: {epoch0['open_rate']} of {epoch0['opens']} opens predicted at open time (< {FAST_MIN_RATE:.0%})",
        )
        if wall_clock:
            timed = open_reads(run).get("epoch0")
            verdict.check(
                timed is not None and (timed["share"] or 0.0) >= FAST_MIN_RATE,
                f"epoch 0: the readers' clock: {timed}",
            )
    later = [s for s in segs if s["segment"] in ("epoch1", "epoch2")]
    for s in later:
        verdict.check((s["open_rate"] or 0.0) >= MIN_RATE, f"{s['segment']}: {s['open_rate']} predicted at open time")
    verdict.check(
        run.final["seed_origin"] == "discovered" and run.final["seed"] == 7,
        f"seed {run.final['seed']} ({run.final['seed_origin']}), not 7 discovered",
    )
    verdict.pfs_once(run, source)
    verdict.done(run)
