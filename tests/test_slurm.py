"""seerfs under a real Slurm (Debian slurm-wlm + munge, see slurm_cluster.py), run the way users run it.

The job script is README's "How a job uses it" recipe, read from README.md here so the two cannot
drift, with only its paths substituted: the emulated PFS for the source, a mountpoint, a config, and
``slurm_train.py`` (ImageFolder + DistributedSampler ranks under srun) for ``train.py``.  Evidence
comes from outside seerfs wherever it can: the emulator's counters for PFS bytes, a manifest of the
source's digests for every byte training read, torch's own sampler for the opens, /proc and the mount
table for what was left behind; the only seerfs figure used is its status for which opens it predicted.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
from e2e import Job, expected_opens, free_port, make_source, seerfs_config
from mounting import wait_for
from pfsemu_fixture import RunningEmulator, requires_fuse, running_pfsemu
from slurm_cluster import NODE_IFNAME, SlurmCluster, SlurmUnavailable, job_user, requires_slurm, running_slurm

pytestmark = [pytest.mark.mount, pytest.mark.torch, pytest.mark.slurm, requires_fuse, requires_slurm]

ROOT = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent
# Small, for the CI budget on 2 cores, but not smaller: with a 240-file tree the cursor never leaves
# "presumed" (its detection wants more opens than two epochs make), so nothing counts as predicted.
TRAIN_FILES = 600
SEED = 0  # the recipe writes 0: DistributedSampler's default seed, which slurm_train.py keeps


def readme_recipe() -> list[str]:
    """The shell lines of README's "How a job uses it" block, verbatim."""
    text = (ROOT / "README.md").read_text()
    section = text.split("## How a job uses it", 1)[1]
    block = re.search(r"```sh\n(.*?)```", section, re.S)
    assert block is not None, "README's 'How a job uses it' has no sh block"
    return [line for line in block.group(1).splitlines() if line.strip()]


@dataclass(frozen=True)
class Dataset:
    backing: Path  # the PFS's own directory: backing/train/CLASS/FILE
    digests: dict[str, str]  # relative path -> sha1, computed from the backing files before any mount
    total: int  # bytes


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Dataset:
    backing = tmp_path_factory.mktemp("slurm-pfs") / "backing"
    digests, total = make_source(backing, TRAIN_FILES, 0)
    return Dataset(backing, digests, total)


@dataclass
class JobFiles:
    """One job's files, in a directory the job (and its user) can reach."""

    dir: Path
    mnt: Path
    config: Path
    spec: Path
    out: Path  # train_reader results: out.rankN.json
    log: Path  # the job's stdout+stderr

    def status(self, node: int = 0) -> dict[str, Any]:
        """Node ``node``'s ``seerfs status --json``, taken by the job before the unmount."""
        doc: dict[str, Any] = json.loads((self.dir / f"status.{node}.json").read_text())
        return doc

    def mount_lines(self, node: int = 0) -> list[str]:
        """Node ``node``'s mountinfo lines for the mountpoint, taken by the job before the unmount."""
        return (self.dir / f"mountinfo.{node}.txt").read_text().splitlines()


def job_files(cluster: SlurmCluster, name: str, job: Job, *, tiers_bytes: str = "64MiB", **cfg: Any) -> JobFiles:
    d = cluster.root / name
    d.mkdir(mode=0o1777)
    # The job may run as another user.  Sticky, like /tmp: seerfs refuses a cache_dir below a directory
    # others can write unless no one can replace what is not theirs in it (fusefs/trust.py).
    d.chmod(0o1777)
    mnt = d / "mnt"
    mnt.mkdir()
    config = seerfs_config(
        d / "seerfs.yaml",
        job,
        cache_dir=d / "cache",
        tiers=[{"kind": "memory", "bytes": tiers_bytes, "threads": 4}],
        **cfg,
    )
    snapshot = d / "snapshot.sh"  # run on every node by the job before the unmount (see recipe_script)
    snapshot.write_text(
        "#!/bin/bash\n# What the test reads: this node's seerfs status and its mount table lines for MOUNT ($1).\n"
        f'seerfs status --json "$1" > {d}/status.$SLURM_NODEID.json\n'
        f"awk -v m=\"$1\" '$5 == m' /proc/self/mountinfo > {d}/mountinfo.$SLURM_NODEID.txt\n"
    )
    return JobFiles(d, mnt, config, d / "spec.json", d / "train", d / "job.out")


def write_spec(files: JobFiles, job: Job, digests: dict[str, str]) -> None:
    spec = {k: v for k, v in job.__dict__.items()} | {"digests": digests, "out": str(files.out)}
    files.spec.write_text(json.dumps(spec))


def environment(files: JobFiles, bin_dir: Path = VENV_BIN, pythonpath: str = str(ROOT)) -> list[str]:
    """The job script's environment lines: what a user's ~/.bashrc or module load would set up."""
    return [
        f"export PATH={shlex.quote(str(bin_dir))}:$PATH",  # python and seerfs, as installed
        f"export PYTHONPATH={shlex.quote(pythonpath)}",  # this checkout's seerfs, not the venv's editable copy
        f"export SEERFS_TRAIN_SPEC={shlex.quote(str(files.spec))}",
        f"export MASTER_PORT={free_port()}",
    ]


def user_python(cluster: SlurmCluster, user: str) -> tuple[Path, str]:
    """``python`` and ``seerfs`` the job user can run: (directory for PATH, PYTHONPATH).

    The venv's interpreter may be a link into a directory other users cannot enter (a pyenv build
    under /root): then the system's python3 of the same version runs with the venv's packages, as a
    cluster's shared Python module would.
    """
    probe = "import torch, fusefs; from tools.harness import torchvision_cpu; torchvision_cpu.load()"
    if cluster.run(str(VENV_BIN / "python"), "-c", probe, user=user, check=False).returncode == 0:
        return VENV_BIN, str(ROOT)
    site = [p for p in sys.path if p.endswith("site-packages") and p.startswith(sys.prefix)]
    system = Path(f"/usr/bin/python{sys.version_info[0]}.{sys.version_info[1]}")
    bin_dir = cluster.root / "user-bin"
    if not bin_dir.exists():
        bin_dir.mkdir(mode=0o755)
        (bin_dir / "python").symlink_to(system)
        (bin_dir / "seerfs").write_text('#!/bin/sh\nexec python -m fusefs "$@"\n')
        (bin_dir / "seerfs").chmod(0o755)
    pythonpath = ":".join([str(ROOT), *site])
    env = {**cluster.env, "PYTHONPATH": pythonpath}
    res = subprocess.run(
        ["runuser", "-u", user, "--", str(bin_dir / "python"), "-c", probe],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    if res.returncode != 0:
        pytest.skip(f"no Python the job user {user} can run with torch: {res.stderr.strip()[-300:]}")
    return bin_dir, pythonpath


def recipe_script(
    files: JobFiles,
    source: Path,
    *,
    mnt: str | None = None,
    prolog_form: bool = False,
    env: list[str] | None = None,
    before_umount: list[str] | None = None,
) -> str:
    """README's recipe with its paths substituted; ``seerfs status --json`` saved before the unmount.

    ``prolog_form`` keeps only the job's own lines (the seed and the training): the prolog mounted and
    the epilog unmounts.  ``mnt`` is the mountpoint as the script names it (it may use $SLURM_JOB_ID).
    """
    mnt = mnt or str(files.mnt)
    subs = {
        "/lustre/imagenet": str(source),
        "/tmp/imagenet": mnt,
        "seerfs.yaml": str(files.config),
        "train.py": str(ROOT / "tests" / "slurm_train.py"),
    }
    recipe = readme_recipe()
    for old in subs:
        assert any(old in line for line in recipe), f"README's recipe no longer names {old}"
    snapshot = [f'srun -N $SLURM_NNODES -n $SLURM_NNODES bash {files.dir}/snapshot.sh "{mnt}"', *(before_umount or [])]
    lines = []
    for line in recipe:
        if prolog_form and re.search(r"seerfs (mount|wait|umount)", line):
            continue
        for old, new in subs.items():
            line = line.replace(old, new)
        if "seerfs umount" in line:
            lines += snapshot
        lines.append(line)
    if prolog_form:
        lines += snapshot
    env = env if env is not None else environment(files)
    return "#!/bin/bash\nset -euo pipefail\n" + "\n".join(env) + "\n" + "\n".join(lines) + "\n"


def job_output(files: JobFiles) -> str:
    try:
        return files.log.read_text(errors="replace")[-4000:]
    except OSError:
        return "(no job output)"


WHY_NO_CURSOR = ("seed", "discovery", "plan", "group", "reads")  # the status sections a failure names


def check_job(files: JobFiles, ds: Dataset, job: Job, emu: RunningEmulator, opens_from: list[dict[str, Any]]) -> None:
    """What every recipe test proves: all opens predicted, PFS read once, every byte right."""
    expected = expected_opens(job, len(ds.digests), 0)
    ranks = [json.loads(files.out.with_suffix(f".rank{r}.json").read_text()) for r in range(job.world_size)]
    assert all(not r["bad"] for r in ranks), [r["bad"][:3] for r in ranks]  # bytes == the source's, by sha1
    assert sum(r["samples"] for r in ranks) == expected
    assert sum(r["bytes"] for r in ranks) > 0
    # seerfs's own figure, the one thing taken from it: which opens its plan predicted (cursor hits).
    opens = sum(d["reads"]["opens"] for d in opens_from)
    assert opens == expected, (opens, expected)
    cursors = [d["cursor"] for d in opens_from]
    # A node with no plan (its planning failed) shows no cursor, as does one between a new plan and
    # its cursor's first view: the failure names the sections and log lines that tell which.
    assert all(c is not None for c in cursors), (
        [{k: d.get(k) for k in WHY_NO_CURSOR} for d in opens_from],
        job_output(files),  # the daemons' log lines: plans ready, cursor states
    )
    assert sum(c["hits"] for c in cursors) == opens, cursors
    assert all(c["state"] == "tracking" and c["hit_rate"] == 1.0 and not c["mismatch"] for c in cursors), cursors
    pfs = emu.counters()
    assert pfs.bytes == ds.total, f"PFS served {pfs.bytes} bytes for a {ds.total}-byte dataset"
    assert set(pfs.files) <= set(ds.digests) and len(pfs.files) == len(ds.digests)


def alive(pid: int) -> bool:
    """The process exists and is not a zombie (an exited daemon not yet reaped by init is gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def gone(pid: int) -> bool:
    return not alive(pid)


def assert_nothing_left(cluster: SlurmCluster, mnt: Path, daemon_pids: list[int], node: int = 0) -> None:
    """No seerfs daemon alive, no FUSE mount on the mountpoint, no process of the job left."""
    for pid in daemon_pids:
        wait_for(functools.partial(gone, pid), timeout=cluster.kill_wait + 10, what=f"daemon {pid} to exit")
    assert str(mnt) not in cluster.fuse_mounts(node), cluster.fuse_mounts(node)
    left = {pid: what for pid, what in cluster.marked_processes().items() if "slurmscriptd" not in what}
    assert not left, left


@pytest.fixture
def pfs(dataset: Dataset) -> Iterator[RunningEmulator]:
    with running_pfsemu(dataset.backing) as emu:
        yield emu


def submit_recipe(
    cluster: SlurmCluster, ds: Dataset, emu: RunningEmulator, job: Job, name: str, *options: str
) -> tuple[int, JobFiles]:
    files = job_files(cluster, name, job)
    write_spec(files, job, ds.digests)
    script = files.dir / "job.sh"
    script.write_text(recipe_script(files, emu.mountpoint))
    job_id = cluster.sbatch(script, f"--output={files.log}", f"--chdir={files.dir}", *options)
    return job_id, files


def test_readme_recipe_under_sbatch(slurm_cluster: SlurmCluster, dataset: Dataset, pfs: RunningEmulator) -> None:
    """README's recipe as an sbatch job of 2 tasks: predicted, PFS read once, bytes right, nothing left."""
    job = Job(world_size=2, epochs=2, batch_size=16, num_workers=2, seed=SEED, val=False)
    t0 = time.monotonic()
    job_id, files = submit_recipe(slurm_cluster, dataset, pfs, job, "recipe", "--nodes=1", "--ntasks=2")
    info = slurm_cluster.wait_job(job_id, timeout=240)
    print(f"job {job_id}: {info['job_state']} in {time.monotonic() - t0:.1f}s")
    assert info["job_state"] == "COMPLETED" and info["exit_code"] == 0, job_output(files)
    doc = files.status()
    assert len(files.mount_lines()) == 1, "not one daemon per node: mounts stacked on the mountpoint"
    check_job(files, dataset, job, pfs, [doc])
    assert_nothing_left(slurm_cluster, files.mnt, [doc["pid"]])


def daemon_log(files: JobFiles) -> str:
    return "".join(p.read_text(errors="replace") for p in sorted((files.dir / "cache" / "log").glob("*.log")))


@pytest.mark.slow
def test_scancel_of_the_recipe_job_leaves_nothing(
    slurm_cluster: SlurmCluster, dataset: Dataset, pfs: RunningEmulator
) -> None:
    """scancel mid-training: Slurm's SIGTERM makes the daemon unmount and exit within KillWait, not SIGKILL."""
    job = Job(world_size=2, epochs=200, batch_size=16, num_workers=2, seed=SEED, val=False, compute_s=0.002)
    job_id, files = submit_recipe(slurm_cluster, dataset, pfs, job, "scancel", "--nodes=1", "--ntasks=2")
    slurm_cluster.wait_job(job_id, timeout=60, states=frozenset({"RUNNING"}))
    ctl = files.mnt / ".control" / "status"

    def training_reads() -> dict[str, Any] | None:
        try:
            doc: dict[str, Any] = json.loads(ctl.read_bytes())
        except (OSError, ValueError):
            return None
        return doc if doc["reads"]["opens"] > 200 else None

    doc = wait_for(training_reads, timeout=120, what="training to read through the mount")
    pid = int(doc["pid"])
    steps = slurm_cluster.steps(job_id)
    assert len(steps) >= 3, steps  # the mount step, the training step and the batch script, all running
    t0 = time.monotonic()
    slurm_cluster.run("scancel", str(job_id))
    wait_for(lambda: not alive(pid), timeout=slurm_cluster.kill_wait + 20, what="the daemon to exit")
    exited = time.monotonic() - t0
    info = slurm_cluster.wait_job(job_id, timeout=slurm_cluster.kill_wait + 30)
    print(f"daemon exited {exited:.2f}s after scancel (KillWait {slurm_cluster.kill_wait}s)")
    assert info["job_state"] == "CANCELLED", info["job_state"]
    log = daemon_log(files)
    assert f"signal {int(signal.SIGTERM)}: unmounting" in log, log[-2000:]
    assert "stopped" in log.split(f"signal {int(signal.SIGTERM)}: unmounting", 1)[1], log[-2000:]
    assert exited < slurm_cluster.kill_wait, f"daemon took {exited:.2f}s: it was SIGKILLed, not unmounted"
    assert_nothing_left(slurm_cluster, files.mnt, [pid])


# --------------------------------------------------------------------------- the root prolog form

PROLOG, EPILOG = ROOT / "tools" / "slurm" / "prolog", ROOT / "tools" / "slurm" / "epilog"


@dataclass
class PrologCluster:
    cluster: SlurmCluster
    env_file: Path  # seerfs.env beside slurm.conf: what the prolog and epilog source
    user: str
    uid: int


@pytest.fixture(scope="module")
def prolog_cluster() -> Iterator[PrologCluster]:
    """A cluster whose Prolog/Epilog are tools/slurm/prolog and epilog, installed as their comment says."""
    try:
        with job_user() as (user, uid), running_slurm(prolog=PROLOG, epilog=EPILOG) as cluster:
            yield PrologCluster(cluster, cluster.conf.parent / "seerfs.env", user, uid)
    except SlurmUnavailable as exc:
        pytest.skip(f"Slurm daemons did not start: {exc}")


def submit_prolog_job(
    pc: PrologCluster, ds: Dataset, emu: RunningEmulator, job: Job, name: str
) -> tuple[int, JobFiles]:
    """The job's part of README's recipe, submitted by the unprivileged user with --comment=seerfs."""
    files = job_files(pc.cluster, name, job)
    files.mnt.rmdir()  # the prolog makes the job's mountpoint
    mnt = f"{files.dir}/mnt-$SLURM_JOB_ID"
    pc.env_file.write_text(
        f"export PYTHONPATH={shlex.quote(str(ROOT))}\n"  # this checkout's seerfs, as in the job
        f"SEERFS={shlex.quote(str(VENV_BIN / 'seerfs'))}\n"
        f"SEERFS_SOURCE={shlex.quote(str(emu.mountpoint))}\n"
        f"SEERFS_MOUNT={mnt}\n"
        f"SEERFS_CONFIG={shlex.quote(str(files.config))}\n"
        "SEERFS_JOBS=comment\n"
    )
    write_spec(files, job, ds.digests)
    script = files.dir / "job.sh"
    bin_dir, pythonpath = user_python(pc.cluster, pc.user)
    env = environment(files, bin_dir, pythonpath)
    script.write_text(recipe_script(files, emu.mountpoint, mnt=mnt, prolog_form=True, env=env))
    script.chmod(0o755)
    job_id = pc.cluster.sbatch(
        script,
        "--comment=seerfs",
        "--nodes=1",
        "--ntasks=2",
        f"--output={files.log}",
        f"--chdir={files.dir}",
        user=pc.user,
    )
    return job_id, replace(files, mnt=files.dir / f"mnt-{job_id}")


@pytest.mark.slow
def test_root_prolog_form(prolog_cluster: PrologCluster, dataset: Dataset, pfs: RunningEmulator) -> None:
    """Prolog mounts as root with allow_other, the user's job writes the seed and trains, the epilog unmounts."""
    pc = prolog_cluster
    job = Job(world_size=2, epochs=2, batch_size=16, num_workers=2, seed=SEED, val=False)
    job_id, files = submit_prolog_job(pc, dataset, pfs, job, "prolog")
    info = pc.cluster.wait_job(job_id, timeout=240)
    assert info["job_state"] == "COMPLETED" and info["exit_code"] == 0, job_output(files) + pc.cluster.log_tail()
    assert info["user_id"] == pc.uid
    mount_lines = files.mount_lines()
    assert len(mount_lines) == 1, mount_lines
    assert "user_id=0" in mount_lines[0] and "allow_other" in mount_lines[0], mount_lines  # root's, shared
    ranks = [files.out.with_suffix(f".rank{r}.json") for r in range(job.world_size)]
    assert all(p.stat().st_uid == pc.uid for p in ranks)  # training ran as the user
    doc = files.status()
    assert doc["seed"]["origin"] == "written", doc["seed"]  # the user's seed write was taken
    check_job(files, dataset, job, pfs, [doc])
    assert_nothing_left(pc.cluster, files.mnt, [doc["pid"]])
    assert not files.mnt.exists()  # the epilog removed the job's mountpoint


@pytest.mark.slow
def test_root_prolog_form_scancel(prolog_cluster: PrologCluster, dataset: Dataset, pfs: RunningEmulator) -> None:
    """scancel mid-training in the prolog form: the epilog still runs and unmounts; nothing is left."""
    pc = prolog_cluster
    job = Job(world_size=2, epochs=200, batch_size=16, num_workers=2, seed=SEED, val=False, compute_s=0.002)
    job_id, files = submit_prolog_job(pc, dataset, pfs, job, "prolog-scancel")
    pc.cluster.wait_job(job_id, timeout=60, states=frozenset({"RUNNING"}))
    ctl = files.mnt / ".control" / "status"

    def training_reads() -> dict[str, Any] | None:
        try:
            doc: dict[str, Any] = json.loads(ctl.read_bytes())
        except (OSError, ValueError):
            return None
        return doc if doc["reads"]["opens"] > 200 else None

    pid = int(wait_for(training_reads, timeout=120, what="training to read through the mount")["pid"])
    t0 = time.monotonic()
    pc.cluster.run("scancel", str(job_id))
    info = pc.cluster.wait_job(job_id, timeout=pc.cluster.kill_wait + 60)
    wait_for(lambda: not alive(pid), timeout=30, what="the daemon to exit")
    print(f"job {info['job_state']} and daemon gone {time.monotonic() - t0:.2f}s after scancel")
    assert info["job_state"] == "CANCELLED", info["job_state"]
    assert_nothing_left(pc.cluster, files.mnt, [pid])
    assert not files.mnt.exists()  # the epilog ran to its end
    assert pc.cluster.node_states() == {pc.cluster.nodes[0].name: "idle"}  # no failed epilog drained the node


# --------------------------------------------------------------------------- two nodes


@pytest.mark.slow
def test_readme_recipe_on_two_nodes(dataset: Dataset) -> None:
    """README's recipe on 2 nodes (network and mount namespaces, one slurmd each), one rank per node.

    The daemons must form one group, so each file is read from the PFS once for the whole job and the
    other node gets it from its owner over TCP: PFS bytes == 1.00x the dataset, not 2x.
    """
    job = Job(world_size=2, epochs=2, batch_size=16, num_workers=2, seed=SEED, val=False)
    # The emulator first: a node's mount namespace copies the host's mounts when the node starts.
    with running_pfsemu(dataset.backing) as emu, contextlib.ExitStack() as stack:
        try:
            cluster = stack.enter_context(running_slurm(nodes=2))
        except SlurmUnavailable as exc:
            pytest.skip(f"two Slurm nodes did not start: {exc}")
        files = job_files(cluster, "two-nodes", job, ranks_per_node=1, peers={"bind": NODE_IFNAME})
        write_spec(files, job, dataset.digests)
        env = [*environment(files), f"export GLOO_SOCKET_IFNAME={NODE_IFNAME}"]  # gloo: the node's interface
        script = files.dir / "job.sh"
        script.write_text(recipe_script(files, emu.mountpoint, env=env))
        t0 = time.monotonic()
        job_id = cluster.sbatch(script, "--nodes=2", "--ntasks=2", f"--output={files.log}", f"--chdir={files.dir}")
        info = cluster.wait_job(job_id, timeout=300)
        print(f"job {job_id}: {info['job_state']} in {time.monotonic() - t0:.1f}s")
        assert info["job_state"] == "COMPLETED" and info["exit_code"] == 0, job_output(files)
        docs = [files.status(k) for k in range(2)]
        assert [len(files.mount_lines(k)) for k in range(2)] == [1, 1]
        groups = [d["group"] for d in docs]
        assert all(g["size"] == 2 for g in groups), groups
        check_job(files, dataset, job, emu, docs)
        for k in range(2):
            assert_nothing_left(cluster, files.mnt, [docs[k]["pid"]], node=k)


# --------------------------------------------------------------------------- a memory cgroup limit

# Slurm's task/cgroup with ConstrainRAMSpace puts each job in a memory cgroup limited to its --mem:
# the daemon runs as a step of the job, so its memory tier and the pages it pushes into the page cache
# are charged to the job.  cgroup/v1 here: this kernel's memory controller is bound to the v1
# hierarchy (/sys/fs/cgroup/memory); the v2 one (/sys/fs/cgroup/unified) has no memory controller.
CGROUP_CONF = """CgroupPlugin=cgroup/v1
CgroupMountpoint=/sys/fs/cgroup
ConstrainRAMSpace=yes
ConstrainSwapSpace=no
ConstrainCores=no
ConstrainDevices=no
"""
MEMCG = Path("/sys/fs/cgroup/memory")
DAEMON_ALLOWANCE = 160 << 20  # the daemon's interpreter, numpy, trio and plan (about 110 MB RSS measured here)
TIER_BYTES = 256 << 20
# Read by the batch step before the unmount: the job's memory cgroup (two levels above this task's)
# and the cgroup the daemon (pid in status.0.json) was charged in.
CGROUP_REPORT = r"""
cg=/sys/fs/cgroup/memory$(awk -F: '$2 == "memory" {print $3}' /proc/self/cgroup)
job=${cg%/step_*}
daemon=${DAEMON_PID:-$(python -c "import json, sys; print(json.load(open(sys.argv[1]))['pid'])" DIR/status.0.json)}
dcg=/sys/fs/cgroup/memory$(awk -F: '$2 == "memory" {print $3}' /proc/$daemon/cgroup)
{
  echo "job_cgroup $job"
  echo "daemon_cgroup $dcg"
  for f in limit_in_bytes max_usage_in_bytes failcnt; do echo "job_$f $(cat $job/memory.$f)"; done
  awk '$1 == "oom_kill" {print "job_oom_kill", $2}' $job/memory.oom_control
  awk '$1 == "total_cache" || $1 == "total_rss" {print "job_" $1, $2}' $job/memory.stat
  awk '$1 == "total_cache" || $1 == "total_rss" {print "daemon_" $1, $2}' $dcg/memory.stat
} > DIR/cgroup.txt
"""


def memory_cgroup_reason() -> str | None:
    if not (MEMCG / "memory.limit_in_bytes").exists():
        unified = Path("/sys/fs/cgroup/cgroup.controllers")
        if unified.exists() and "memory" in unified.read_text().split():
            return "cgroup v2 memory controller only: Slurm 22.05's cgroup/v2 needs systemd (dbus) to delegate"
        return "no cgroup v1 memory controller at /sys/fs/cgroup/memory"
    try:
        probe = MEMCG / f"seerfs-slurm-probe-{os.getpid()}"
        probe.mkdir()
        probe.rmdir()
    except OSError as exc:
        return f"memory cgroup not writable: {exc.strerror}"
    return None


@pytest.fixture(scope="module")
def big_dataset(tmp_path_factory: pytest.TempPathFactory) -> Dataset:
    """150 MB: the memory tier and the page cache it fills are a real part of the job's limit."""
    backing = tmp_path_factory.mktemp("slurm-pfs-big") / "backing"
    digests, total = make_source(backing, TRAIN_FILES, 0, mean_size=250_000)
    return Dataset(backing, digests, total)


def job_memory_peak(cluster: SlurmCluster, ds: Dataset, emu: RunningEmulator) -> int:
    """Peak memory of the job's training alone (no seerfs: it reads the PFS directly), from its cgroup."""
    job = Job(world_size=2, epochs=1, batch_size=16, num_workers=2, seed=SEED, val=False)
    files = job_files(cluster, "calibrate", job)
    write_spec(files, job, ds.digests)
    script = files.dir / "job.sh"
    script.write_text(
        "#!/bin/bash\nset -euo pipefail\n" + "\n".join(environment(files)) + "\n"
        f"srun python {ROOT / 'tests' / 'slurm_train.py'} --data {emu.mountpoint}/train\n"
        + "DAEMON_PID=$$\n"  # no daemon: the batch shell stands in
        + CGROUP_REPORT.replace("DIR", str(files.dir))
    )
    job_id = cluster.sbatch(script, "--nodes=1", "--ntasks=2", f"--output={files.log}", f"--chdir={files.dir}")
    info = cluster.wait_job(job_id, timeout=300)
    assert info["job_state"] == "COMPLETED", job_output(files)
    report = dict(line.split(" ", 1) for line in (files.dir / "cgroup.txt").read_text().splitlines())
    return int(report["job_max_usage_in_bytes"])


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_recipe_under_a_memory_cgroup_limit(big_dataset: Dataset) -> None:
    """--mem = the training's own peak + the memory tier + the daemon: no OOM kill, the cache is the job's."""
    reason = memory_cgroup_reason()
    if reason is not None:
        pytest.skip(reason)
    ds = big_dataset
    with running_pfsemu(ds.backing) as emu, contextlib.ExitStack() as stack:
        try:
            cluster = stack.enter_context(running_slurm(cgroup=True, cgroup_conf=CGROUP_CONF))
        except SlurmUnavailable as exc:
            pytest.skip(f"Slurm with task/cgroup did not start: {exc}")
        peak = job_memory_peak(cluster, ds, emu)
        emu.reset()  # the calibration read the PFS directly: count only the seerfs job
        limit = peak + TIER_BYTES + DAEMON_ALLOWANCE
        job = Job(world_size=2, epochs=2, batch_size=16, num_workers=2, seed=SEED, val=False)
        files = job_files(cluster, "memcg", job, tiers_bytes=str(TIER_BYTES), lookahead="32MiB")
        write_spec(files, job, ds.digests)
        script = files.dir / "job.sh"
        report = [line for line in CGROUP_REPORT.replace("DIR", str(files.dir)).splitlines() if line]
        script.write_text(recipe_script(files, emu.mountpoint, before_umount=report))
        job_id = cluster.sbatch(
            script, "--nodes=1", "--ntasks=2", f"--mem={limit >> 20}M", f"--output={files.log}", f"--chdir={files.dir}"
        )
        info = cluster.wait_job(job_id, timeout=400)
        out = job_output(files)
        assert info["job_state"] == "COMPLETED" and info["exit_code"] == 0, out
        assert "oom" not in out.lower(), out
        cg = dict(line.split(" ", 1) for line in (files.dir / "cgroup.txt").read_text().splitlines())
        doc = files.status()
        print(
            json.dumps(
                {
                    "dataset": ds.total,
                    "training_peak": peak,
                    "limit": limit,
                    **cg,
                    "page_cache_bytes": doc["prefetch"]["staging"]["page_cache_bytes"],
                }
            )
        )
        assert int(cg["job_limit_in_bytes"]) == (limit >> 20) << 20  # the limit is the job's --mem
        assert int(cg["job_oom_kill"]) == 0
        assert cg["daemon_cgroup"].startswith(cg["job_cgroup"] + "/"), cg  # the daemon is charged to the job
        # The pages the mount holds are charged to the job (the daemon's pushes to its own step).
        assert int(cg["job_total_cache"]) >= 0.9 * doc["prefetch"]["staging"]["page_cache_bytes"], cg
        assert doc["prefetch"]["staging"]["pushes"] > 0 and int(cg["daemon_total_cache"]) > 0, cg  # pushed: the job's
        check_job(files, ds, job, emu, [doc])
        assert_nothing_left(cluster, files.mnt, [doc["pid"]])
