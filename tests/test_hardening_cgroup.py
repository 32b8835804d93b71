"""A daemon fits the memory cgroup it runs in: its RAM budget is sized to what the limit leaves, and
lowered under pressure; a memory tier's ``bytes`` given that cannot fit is exit 3 with one line.

Before: in a 256 MiB cgroup the daemon kept whole files in its memory tier up to the tier's 1 GiB
and was OOM-killed within seconds of the first reads; readers got ECONNABORTED, then ENOTCONN.

The parsing of both hierarchies runs on fixture files (``tests/cgroup_fixtures``: v1, where the
memory controller has a hierarchy of its own, and v2), without I/O on the host's cgroups.  The
mount tests make a real memory cgroup of 256 MiB (v1: a child of the test's own cgroup; v2, where
the unified hierarchy has the memory controller: a child of its root), start ``seerfs mount --fg``
inside a child of that (so the limit that binds is an ancestor's), read a dataset twice the limit's
size through the mount twice and compare every byte with a manifest made from the source.  The
evidence that the daemon fit is the kernel's: the daemon's pid still in the cgroup, its process
alive, the cgroup's ``oom_kill`` counter unchanged.  A third mount has a process of the job take
140 MiB after the mount, where the sizing could not see it: the running fit must give memory back.

With the sizing at mount disabled both read tests failed in their first round (ECONNABORTED: the
OOM killer took the daemon); with the running fit disabled the third failed (the process holding
the memory was OOM-killed).
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import xxhash
from mounting import force_unmount, is_mounted, seerfs, status, wait_for
from test_cli_errors import one_line_error

from fusefs.config import load
from fusefs.daemon import cgroup as cg
from fusefs.daemon.memfit import MARGIN_MIN, MemoryFit, Reserve, plan_sizing
from fusefs.errors import ConfigError, ExitCode
from fusefs.meta.identity import SourceId
from fusefs.readpath.policy import PolicySettings, ReadPolicy
from fusefs.tiers import Budget, MemoryTier
from tools.mkdataset import Spec, make_dataset

REPO = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "cgroup_fixtures"
MiB = 1 << 20
LIMIT = 256 * MiB


# --------------------------------------------------------------------------- parsing (fixture files)


def _located(version: str) -> cg.MemoryCgroup | None:
    """The fixture's cgroup, with its mounts pointed at the fixture's ``sys`` directory."""
    base = FIXTURES / version
    mountinfo = (base / "proc_self_mountinfo").read_text().replace(" /sys/fs/cgroup", f" {base / 'sys'}")
    return cg.locate((base / "proc_self_cgroup").read_text(), mountinfo)


def test_v2_is_found_through_mountinfo_and_the_tightest_level_binds() -> None:
    """The step's memory.high (240 MiB) leaves more room than the job's memory.max (256 MiB, more in
    use): the job binds, and the effective limit is the smallest max over the chain."""
    found = _located("v2")
    assert found is not None and found.version == "v2" and found.path == "/job_42/step_0"
    sys_dir = str(FIXTURES / "v2" / "sys")
    assert found.dirs == (f"{sys_dir}/job_42/step_0", f"{sys_dir}/job_42", sys_dir)
    reading = cg.read(found)
    step, job, root = reading.levels
    assert (step.path, job.path, root.path) == ("/job_42/step_0", "/job_42", "/")
    assert (step.limit, step.high, step.bound) == (None, 240 * MiB, 240 * MiB)
    assert (job.limit, job.high, job.usage) == (LIMIT, None, 200 * MiB)
    assert job.unreclaimable == 200 * MiB - (120 * MiB - 20 * MiB)  # file pages less shmem can be reclaimed
    assert step.unreclaimable == 50 * MiB
    assert (root.limit, root.bound) == (None, None)  # the root cgroup has no limit files
    assert reading.binding == job and reading.limit == LIMIT
    assert job.events == {"high": 0, "max": 17, "oom": 1, "oom_kill": 1}
    assert reading.events() == {"/job_42/step_0": step.events, "/job_42": job.events}


def test_v1_memory_hierarchy_wins_over_a_cgroup2_mount_without_the_controller() -> None:
    """As on this machine: a ``0::/`` line and a cgroup2 mount exist, but memory is a v1 hierarchy."""
    found = _located("v1")
    assert found is not None and found.version == "v1" and found.path == "/job_42/step_0"
    reading = cg.read(found)
    step, job, root = reading.levels
    assert step.limit is None and root.limit is None  # 9223372036854771712: the page counter's "no limit"
    assert (job.limit, job.usage, job.unreclaimable) == (LIMIT, 200 * MiB, 100 * MiB)
    assert job.events == {"high": 0, "max": 17, "oom": 1, "oom_kill": 1}  # failcnt, oom_control
    assert reading.binding == job and reading.limit == LIMIT


def test_a_subtree_mount_escaped_names_and_no_memory_controller() -> None:
    proc = "0::/docker/abc/app\n"
    info = "40 1 0:38 /docker/abc /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n"
    found = cg.locate(proc, info, exists=lambda p: True)
    assert found is not None and found.dirs[0] == "/sys/fs/cgroup/app" and found.dirs[-1] == "/sys/fs/cgroup"
    assert cg.locate("0::/other\n", info, exists=lambda p: True) is None  # outside what the mount shows
    assert cg.locate(proc, info, exists=lambda p: False) is None  # v2 without the memory controller
    spaced = "40 1 0:38 / /a\\040b rw - cgroup2 cgroup2 rw\n"
    located = cg.locate("0::/x\n", spaced, exists=lambda p: True)
    assert located is not None and located.dirs[0] == "/a b/x"
    assert cg.parse_limit("max\n") is None and cg.parse_limit("9223372036854771712") is None
    assert cg.parse_limit("268435456\n") == LIMIT


# --------------------------------------------------------------------------- sizing (pure)


def _reading(bound: int | None, unreclaimable: int) -> cg.Reading:
    group = cg.MemoryCgroup("v2", "/job/step", ("/x/job/step", "/x/job"))
    return cg.Reading(
        group,
        (
            cg.Level("/job/step", None, None, unreclaimable, unreclaimable, dict.fromkeys(cg.EVENTS, 0)),
            cg.Level("/job", bound, None, unreclaimable, unreclaimable, dict.fromkeys(cg.EVENTS, 0)),
        ),
    )


RESERVE = Reserve(daemon=24 * MiB, inflight=8 * MiB, plan_worker=40 * MiB, search_worker=40 * MiB, margin=MARGIN_MIN)


def test_a_default_memory_tier_is_sized_and_bytes_given_that_cannot_fit_are_refused() -> None:
    reading = _reading(LIMIT, 40 * MiB)
    room = LIMIT - 40 * MiB - RESERVE.total  # 88 MiB
    sized = plan_sizing(load(), reading.cgroup, reading, RESERVE)
    assert sized.sized and sized.budget == room and sized.tier_bytes == (room,) and sized.configured == 1 << 30
    assert sized.limited_by == "/job" and sized.bound == LIMIT and sized.in_use == 40 * MiB
    assert (
        "RAM budget sized to 88MiB" in sized.message
        and "tiers.0.bytes defaults to 1024MiB" in sized.message
        and "\n" not in sized.message
    )
    # the same size written out is a promise: it cannot be kept, so the mount stops
    with pytest.raises(ConfigError) as exc:
        plan_sizing(load(None, {"tiers.0.bytes": "2GiB"}), reading.cgroup, reading, RESERVE)
    text = str(exc.value)
    assert (
        text.startswith("tiers.0.bytes: 2048MiB of memory tiers do not fit the memory cgroup /job") and "\n" not in text
    )
    assert exc.value.code == ExitCode.CONFIG
    fits = plan_sizing(load(None, {"tiers.0.bytes": "64MiB"}), reading.cgroup, reading, RESERVE)
    assert not fits.sized and fits.budget == 64 * MiB and "fits" in fits.message
    # a default tier beside a given one gets what the given one leaves; a directory tier is untouched
    two = load(
        None, {"tiers.0.bytes": "64MiB", "tiers.1.kind": "memory", "tiers.2.kind": "directory", "tiers.2.path": "/d"}
    )
    split = plan_sizing(two, reading.cgroup, reading, RESERVE)
    assert split.tier_bytes == (64 * MiB, room - 64 * MiB, None) and split.budget == room
    # no memory tier: the staging window is the budget
    window = plan_sizing(
        load(None, {"tiers.0.kind": "directory", "tiers.0.path": "/d"}), reading.cgroup, reading, RESERVE
    )
    assert window.budget == room and window.configured == 256 * MiB
    # no limit anywhere: nothing to fit
    free = plan_sizing(load(), reading.cgroup, _reading(None, 40 * MiB), RESERVE)
    assert not free.sized and free.budget == 1 << 30 and "has no limit" in free.message


def _fit(budget_bytes: int, copies: int) -> tuple[MemoryFit, Budget, MemoryTier, ReadPolicy]:
    """A fit over a real budget, policy and memory tier holding ``copies`` files of 1 MiB."""
    import trio

    budget = Budget(budget_bytes, "memory", lambda need: policy.reclaim(need))  # the policy below
    tier = MemoryTier(0, budget, 1)
    sizes = np.full(copies + 1, MiB, np.int64)
    policy = ReadPolicy(sizes, budget, [tier], PolicySettings(staging_limit=0))

    async def fill() -> None:
        for e in range(copies):
            assert await tier.put(e, bytes(MiB), SourceId(MiB, 0, 0, e))

    trio.run(fill)
    reading = _reading(LIMIT, 0)
    sizing = plan_sizing(load(), reading.cgroup, reading, RESERVE)
    return MemoryFit(sizing, reading.cgroup, budget, policy, [tier]), budget, tier, policy


def test_while_mounted_pressure_gives_back_copies_and_room_grows_back_gently() -> None:
    fit, budget, tier, _ = _fit(64 * MiB, 48)
    held = tier.status()["tier_bytes"]
    # the others' use rose: the room left is 100 MiB less than the copies' room; copies go, oldest first
    others = LIMIT - MARGIN_MIN - RESERVE.inflight - RESERVE.workers - 24 * MiB  # leaves the budget 24 MiB
    fit.step(_reading(LIMIT, others + held), children=0)
    assert budget.limit == 24 * MiB and budget.used <= budget.limit
    assert not tier.contains(0) and tier.contains(47) and len(tier.entries()) <= 24
    assert fit.shrinks == 1 and fit.freed > 0
    # an OOM kill in the cgroup: at least a quarter less, even though the numbers leave room
    reading = _reading(LIMIT, 0)
    fit.step(reading, children=0)
    bumped = cg.Reading(
        reading.cgroup,
        tuple(
            cg.Level(lv.path, lv.limit, lv.high, lv.usage, lv.unreclaimable, {**lv.events, "oom_kill": 1, "oom": 1})
            for lv in reading.levels
        ),
    )
    before = budget.limit
    fit.step(bumped, children=0)
    assert budget.limit <= before * 3 // 4 and fit.events["oom_kill"] == 1  # the limited level's counters
    # room again: nothing for CALM_ROUNDS - 1 rounds, then at most 16 MiB a round, never past the configured bytes
    low = budget.limit
    limits = []
    for _ in range(6):
        fit.step(bumped, children=0)
        limits.append(budget.limit)
    assert limits[0] == limits[1] == low and limits[2] == low + 16 * MiB and limits[-1] == low + 64 * MiB
    assert fit.grows == 4 and fit.status()["oom_kills"] == 1


# --------------------------------------------------------------------------- a real cgroup


@dataclass
class Cgroup:
    """A memory cgroup made for the test: ``parent`` holds the limit, the daemon runs in ``child``."""

    version: cg.Version
    parent: Path
    child: Path
    home: Path  # where the test's own processes are (pids are moved back there)
    path: str  # the parent's path in the hierarchy

    def procs(self, where: Path) -> list[int]:
        return [int(p) for p in (where / "cgroup.procs").read_text().split()]

    def oom_kills(self) -> int:
        name = "memory.oom_control" if self.version == "v1" else "memory.events"
        return sum(cg.parse_flat((d / name).read_text()).get("oom_kill", 0) for d in (self.parent, self.child))

    def peak(self) -> int | None:
        name = "memory.max_usage_in_bytes" if self.version == "v1" else "memory.peak"
        try:
            return int((self.parent / name).read_text())
        except OSError:
            return None

    def level(self) -> cg.Level:
        return cg.level_of(self.version, self.path, lambda n: _read(self.parent / n))


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def _make_cgroup() -> Cgroup:
    """A 256 MiB cgroup with a child, or skip saying why none can be made here."""
    if os.geteuid() != 0:
        pytest.skip("making a memory cgroup needs root")
    own = cg.find()
    if own is None:
        pytest.skip("no memory cgroup hierarchy (neither v1 memory nor v2 with the memory controller)")
    name = f"seerfs-test-{os.getpid()}"
    try:
        if own.version == "v1":
            home = Path(own.dirs[0])
            parent = home / name
            parent.mkdir()
            (parent / "memory.limit_in_bytes").write_text(str(LIMIT))
            (parent / "daemon").mkdir()
        else:
            # v2: a cgroup with processes cannot hand controllers down, so the pair goes under the
            # hierarchy's root, which has none
            home, root = Path(own.dirs[0]), Path(own.dirs[-1])
            if "memory" not in (root / "cgroup.subtree_control").read_text().split():
                (root / "cgroup.subtree_control").write_text("+memory")
            parent = root / name
            parent.mkdir()
            (parent / "memory.max").write_text(str(LIMIT))
            (parent / "cgroup.subtree_control").write_text("+memory")
            (parent / "daemon").mkdir()
    except OSError as exc:
        pytest.skip(f"cannot make a memory cgroup under {own.dirs[0]}: {exc.strerror}")
    top = own.path.rstrip("/") if own.version == "v1" else ""
    return Cgroup(own.version, parent, parent / "daemon", home, f"{top}/{name}")


def _empty(group: Cgroup, where: Path) -> bool:
    return not group.procs(where)


def _remove_cgroup(group: Cgroup) -> None:
    """Move whatever still runs there back to the test's cgroup, then remove both directories."""
    for d in (group.child, group.parent):
        if not d.exists():
            continue
        for pid in group.procs(d):
            with contextlib.suppress(OSError):  # exited meanwhile
                (group.home / "cgroup.procs").write_text(str(pid))
        wait_for(functools.partial(_empty, group, d), 10, f"{d} to empty")
    for d in (group.child, group.parent):
        if d.exists():
            d.rmdir()


@pytest.fixture
def small_cgroup() -> Iterator[Cgroup]:
    group = _make_cgroup()
    try:
        yield group
    finally:
        _remove_cgroup(group)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """About 500 MB in 1,000 files (twice the cgroup's limit), and a manifest of their hashes made
    from the source directly, in ImageFolder order (classes, then files, sorted)."""
    root = tmp_path_factory.mktemp("cgroup") / "src"
    make_dataset(root, Spec(classes=10, files=1000, mean_size=500 << 10, seed=42))
    manifest = {}
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        manifest[str(path.relative_to(root))] = xxhash.xxh3_128_hexdigest(path.read_bytes())
    return root, manifest


def _in_cgroup(group: Cgroup, *args: str) -> list[str]:
    """``seerfs ARGS`` run as a process that put itself into the cgroup first (exec keeps the pid)."""
    command = f'echo $$ > "{group.child}/cgroup.procs" && exec "$@"'
    return ["sh", "-c", command, "sh", sys.executable, "-m", "fusefs", *args]


MODES = {
    # DistributedSampler's shuffle read in sorted order: no plan fits, the reactive policy keeps copies
    "reactive": [],
    # a sequential sampler: the plan predicts every open; staging pushes pages (charged to the daemon's cgroup)
    "predicting": ["-o", "datasets.0.sampler.kind=sequential", "-o", "datasets.0.sampler.shuffle=false"],
}


@dataclass
class Daemon:
    proc: subprocess.Popen[bytes]
    log: Path

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]


@contextlib.contextmanager
def _daemon(group: Cgroup, source: Path, mountpoint: Path, tmp_path: Path, *extra: str) -> Iterator[Daemon]:
    """``seerfs mount --fg`` in the cgroup's child, until unmounted (in every case).  The memory tier is
    left at its default (1 GiB) and the staging window made small (32 MiB), so that most of the budget
    goes to copies in daemon RAM: anonymous memory, what the kernel kills for."""
    log_path = tmp_path / "daemon.log"
    args = ["mount", "--fg", str(source), str(mountpoint), "-o", f"cache_dir={tmp_path / 'cache'}"]
    args += ["-o", "prefetch.lookahead_bytes=32MiB", *extra]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(_in_cgroup(group, *args), stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
    daemon = Daemon(proc, log_path)
    try:
        wait_for(lambda: proc.poll() is not None or is_mounted(mountpoint), 60, "the mount")
        wait_for(lambda: proc.poll() is not None or (mountpoint / ".control" / "status").exists(), 30, "status")
        assert proc.poll() is None, daemon.tail()
        assert proc.pid in group.procs(group.child)  # the daemon itself runs in the cgroup
        yield daemon
        res = seerfs("umount", str(mountpoint), timeout=60)
        assert res.returncode == 0, res.stderr
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            if is_mounted(mountpoint):
                seerfs("umount", str(mountpoint), timeout=60)
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        force_unmount(mountpoint)


def _read_all(mountpoint: Path, manifest: dict[str, str], daemon: Daemon, group: Cgroup, kills: int) -> int:
    """Read every file through the mount and compare it with the manifest; the most unreclaimable
    memory the cgroup showed meanwhile (sampled every 50 files)."""
    peak, wrong = 0, []
    for n, (rel, digest) in enumerate(manifest.items()):
        try:
            data = (mountpoint / rel).read_bytes()
        except OSError as exc:
            alive = daemon.proc.poll() is None
            pytest.fail(
                f"{rel}: {exc} (daemon alive: {alive}, OOM kills: {group.oom_kills() - kills})\n{daemon.tail()}"
            )
        if xxhash.xxh3_128_hexdigest(data) != digest:
            wrong.append(rel)
        if n % 50 == 0:
            peak = max(peak, group.level().unreclaimable)
    assert wrong == [], f"{len(wrong)} files read wrong: {wrong[:5]}"
    return peak


def _alive(daemon: Daemon, group: Cgroup, kills: int) -> None:
    assert daemon.proc.poll() is None and daemon.proc.pid in group.procs(group.child), "the daemon died"
    assert group.oom_kills() == kills, "the kernel OOM-killed a process in the cgroup"


@pytest.mark.mount
@pytest.mark.parametrize("mode", list(MODES))
def test_a_daemon_in_a_256mib_cgroup_sizes_its_memory_tier_and_serves_every_byte(
    mode: str, small_cgroup: Cgroup, dataset: tuple[Path, dict[str, str]], tmp_path: Path, mountpoint: Path
) -> None:
    source, manifest = dataset
    group = small_cgroup
    kills = group.oom_kills()
    with _daemon(group, source, mountpoint, tmp_path, *MODES[mode]) as daemon:
        peak = max(_read_all(mountpoint, manifest, daemon, group, kills) for _ in range(2))
        _alive(daemon, group, kills)
        doc = status(mountpoint)
        fit, budget, tier = doc["memory_cgroup"], doc["memory_budget"], doc["tiers"][0]
        assert fit["sized"] and fit["hierarchy"] == group.version
        assert fit["limited_by"] == group.path and fit["limit_bytes"] == LIMIT  # the parent's limit binds
        assert fit["configured_bytes"] == 1 << 30 and fit["mount_bytes"] < LIMIT
        assert budget["limit"] < LIMIT and tier["budget_bytes"] == budget["limit"]
        assert tier["files"] > 0  # copies were kept in daemon RAM: the memory the cgroup charges
        if mode == "predicting":
            assert doc["prefetch"]["mode"] == "predicting" and doc["prefetch"]["staging"]["pushes"] > 0
        lines = daemon.log.read_text().splitlines()
        warnings = [line for line in lines if " WARNING fusefs.daemon.memfit" in line]
        assert len(warnings) == 1 and "RAM budget sized to" in warnings[0], warnings
        print(
            f"\n{mode}: {warnings[0].split(': ', 1)[1]}\n  budget now {budget['limit'] / MiB:.1f} MiB, memory tier "
            f"{tier['tier_bytes'] / MiB:.1f} MiB in {tier['files']} files (lowered {fit['shrinks']}, raised "
            f"{fit['grows']} times); peak unreclaimable seen {peak / MiB:.1f} MiB, peak usage "
            f"{(group.peak() or 0) / MiB:.1f} MiB of {LIMIT / MiB:.0f}"
        )


HOG = 140 * MiB
"""What a training process that starts after the mount takes (and holds) in the same cgroup."""


@pytest.mark.mount
def test_a_job_process_arriving_after_the_mount_makes_the_daemon_give_memory_back(
    small_cgroup: Cgroup, dataset: tuple[Path, dict[str, str]], tmp_path: Path, mountpoint: Path
) -> None:
    """Under Slurm the training processes share the daemon's cgroup and may start after the mount,
    where the sizing cannot see them: the running fit must lower the budget before the memory tier
    fills into their room (predicting: the plan's fills take the whole budget for memory-tier
    copies).  Both the daemon and the process holding the memory must live through a read of the
    whole dataset.  Without the running fit the kernel OOM-killed the process holding the memory."""
    source, manifest = dataset
    group = small_cgroup
    kills = group.oom_kills()
    with _daemon(group, source, mountpoint, tmp_path, *MODES["predicting"]) as daemon:
        mounted_with = status(mountpoint)["memory_budget"]["limit"]
        hold = f"import sys, time; b = b'x' * {HOG}; print('holding', flush=True); time.sleep(600)"
        command = f'echo $$ > "{group.child}/cgroup.procs" && exec "$@"'
        hog = subprocess.Popen(["sh", "-c", command, "sh", sys.executable, "-c", hold], stdout=subprocess.PIPE)
        try:
            assert hog.stdout is not None and hog.stdout.readline() == b"holding\n"
            assert hog.pid in group.procs(group.child)
            wait_for(lambda: status(mountpoint)["memory_cgroup"]["shrinks"] > 0, 20, "the budget to be lowered")
            _read_all(mountpoint, manifest, daemon, group, kills)
            _alive(daemon, group, kills)
            assert hog.poll() is None, "the process holding memory was killed"
            doc = status(mountpoint)
            fit, budget = doc["memory_cgroup"], doc["memory_budget"]
            assert budget["limit"] < mounted_with and fit["shrinks"] >= 1
            print(
                f"\nafter {HOG / MiB:.0f} MiB taken by another process: budget {mounted_with / MiB:.1f} -> "
                f"{budget['limit'] / MiB:.1f} MiB, {fit['freed_bytes'] / MiB:.1f} MiB given back, memory tier "
                f"{doc['tiers'][0]['tier_bytes'] / MiB:.1f} MiB; peak usage {(group.peak() or 0) / MiB:.1f} MiB"
            )
        finally:
            hog.kill()
            hog.wait()


@pytest.mark.mount
def test_memory_tier_bytes_given_that_cannot_fit_the_cgroup_is_exit_3(
    small_cgroup: Cgroup, dataset: tuple[Path, dict[str, str]], tmp_path: Path, mountpoint: Path
) -> None:
    source, _ = dataset
    args = ["mount", str(source), str(mountpoint), "-o", f"cache_dir={tmp_path / 'cache'}", "-o", "tiers.0.bytes=2GiB"]
    res = subprocess.run(_in_cgroup(small_cgroup, *args), capture_output=True, text=True, timeout=120, cwd=REPO)
    try:
        one_line_error(
            res, ExitCode.CONFIG, "tiers.0.bytes: 2048MiB", "do not fit the memory cgroup", small_cgroup.path
        )
        assert not is_mounted(mountpoint)
    finally:
        if is_mounted(mountpoint):
            seerfs("umount", str(mountpoint), timeout=60)
        force_unmount(mountpoint)
