"""The stand-by plan worker: started at mount, it serves every plan and never outlives its daemon.

Which processes exist is read from ``/proc`` (the daemon's threads' children and their command
lines), never from seerfs.  That the stand-by built the plans: while each seed was planned, a
sampler listing the daemon's children every 2 ms saw no other plan worker (a new one lives 0.2 s at
least: a Python start and numpy's import), and the same worker waits after each.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from faults.procs import alive
from mounting import force_unmount, mounted, status, wait_for

WORKER = "fusefs.planning.worker"


def children(parent: int) -> set[int]:
    """The direct children of ``parent``, from each of its threads' ``children`` list (the thread
    that forked is the parent a child is listed under)."""
    found: set[int] = set()
    try:
        tids = os.listdir(f"/proc/{parent}/task")
    except OSError:
        return found
    for tid in tids:
        try:
            with open(f"/proc/{parent}/task/{tid}/children") as fh:
                found.update(int(x) for x in fh.read().split())
        except OSError:
            continue
    return found


def is_plan_worker(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return WORKER.encode() in fh.read().split(b"\0")
    except OSError:
        return False  # gone before its command line was read: it lived under 2 ms, no Python start


def plan_workers(parent: int) -> set[int]:
    return {pid for pid in children(parent) if is_plan_worker(pid)}


class WorkerSampler:
    """Every plan worker ``parent`` had while the block ran, sampled every 2 ms."""

    def __init__(self, parent: int) -> None:
        self.parent, self.seen, self._stop = parent, set[int](), threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> None:
        # Every time, not once per pid: a child between fork and exec still shows its parent's command.
        self.seen |= plan_workers(self.parent)

    def _run(self) -> None:
        while not self._stop.wait(0.002):
            self._sample()

    def __enter__(self) -> WorkerSampler:
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


@pytest.fixture
def source(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    for c in range(3):
        (src / f"c{c}").mkdir(parents=True)
        for i in range(40):
            (src / f"c{c}" / f"{i}.jpg").write_bytes(os.urandom(1000 + i))
    return src


def standby_of(mnt: Path) -> tuple[int, int]:
    """(daemon pid, the one stand-by worker's pid), once the first plan is ready and a stand-by waits."""
    pid = int(status(mnt)["pid"])
    wait_for(lambda: status(mnt)["plan"]["state"] == "ready", 60, "the mount's first plan")
    workers = wait_for(lambda: plan_workers(pid), 30, "a stand-by plan worker after the first plan")
    assert len(workers) == 1, workers  # one, not one per plan
    return pid, workers.pop()


@pytest.mark.mount
def test_written_seeds_are_planned_by_the_worker_started_at_mount(
    source: Path, mountpoint: Path, cache_dir: Path
) -> None:
    with mounted(source, mountpoint, cache_dir=cache_dir):
        pid, standby = standby_of(mountpoint)
        for seed in (5, 6):

            def planned(s: int = seed) -> dict[str, Any] | None:
                d = status(mountpoint)
                return d if d["plan"]["seed"] == s and d["plan"]["state"] == "ready" else None

            with WorkerSampler(pid) as sampler:
                (mountpoint / ".control" / "seed").write_text(f"{seed}\n")
                doc = wait_for(planned, 60, f"the plan for seed {seed}")
            assert not doc["plan"]["reused"]  # built, not loaded: some worker ran for it
            assert sampler.seen == {standby}, (
                f"plan workers while {seed} was planned: {sampler.seen}, stand-by {standby}"
            )
            assert alive(standby) and plan_workers(pid) == {standby}  # it waits for the next, nothing else lingers


@pytest.mark.mount
def test_unmounting_stops_the_waiting_worker(source: Path, mountpoint: Path, cache_dir: Path) -> None:
    with mounted(source, mountpoint, cache_dir=cache_dir):
        _pid, standby = standby_of(mountpoint)
        assert alive(standby)
    wait_for(lambda: not alive(standby), 10, "the stand-by to be stopped with its daemon")


@pytest.mark.mount
def test_a_killed_daemon_leaves_no_worker_behind(source: Path, mountpoint: Path, cache_dir: Path) -> None:
    """SIGKILL runs no cleanup: the worker reads the end of its input (the daemon's end of the pipe
    closed with the daemon) and exits by itself."""
    with mounted(source, mountpoint, cache_dir=cache_dir):
        pid, standby = standby_of(mountpoint)
        try:
            os.kill(pid, signal.SIGKILL)
            wait_for(lambda: not alive(standby), 10, "the orphaned stand-by to exit")
        finally:
            force_unmount(mountpoint)


def run_worker(stdin: bytes) -> tuple[int, list[dict[str, object]]]:
    res = subprocess.run([sys.executable, "-m", WORKER], input=stdin, capture_output=True, timeout=120)
    return res.returncode, [json.loads(line) for line in res.stdout.splitlines()]


def test_a_worker_given_no_request_exits_quietly() -> None:
    code, lines = run_worker(b"")
    assert code == 0 and [x["phase"] for x in lines] == ["standing by"]


def test_a_worker_loads_the_snapshot_once_and_plans_seed_after_seed(source: Path, tmp_path: Path) -> None:
    """The snapshot named ahead is loaded before any seed; two requests, two plans, then the end of input."""
    from fusefs import config as cfgmod
    from fusefs.meta.snapshot import load_or_scan, snapshot_file
    from fusefs.planning.inputs import planning_config

    snap, _ = load_or_scan(str(source), tmp_path / "cache")
    path = str(snapshot_file(tmp_path / "cache", snap.source))
    config = planning_config(cfgmod.load(None, {"job.world_size": "2", "job.ranks_per_node": "2"}))
    requests = [{"snapshot": path}] + [
        {"snapshot": path, "config": config, "seed": s, "out": str(tmp_path / f"plan{s}")} for s in (5, 6)
    ]
    code, lines = run_worker(b"".join(json.dumps(r).encode() + b"\n" for r in requests))
    phases = [x["phase"] for x in lines]
    assert code == 0, lines
    assert phases[:2] == ["standing by", "loaded"] and phases.count("done") == 2, phases
    assert (tmp_path / "plan5" / "plan.json").exists() and (tmp_path / "plan6" / "plan.json").exists()


BAD_REQUESTS = [b"not json\n", b'{"seed": 1}\n', b'{"snapshot": "/nonexistent", "seed": 1}\n']


@pytest.mark.parametrize("request_line", BAD_REQUESTS)
def test_a_bad_request_fails_with_one_line(request_line: bytes) -> None:
    code, lines = run_worker(request_line)
    assert code == 1 and lines[-1]["phase"] == "failed", lines
    error = lines[-1]["error"]
    assert isinstance(error, str) and error and "\n" not in error
