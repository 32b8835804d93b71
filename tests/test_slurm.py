"""seerfs under a real Slurm (Debian slurm-wlm + munge, see slurm_cluster.py), run the way users run it.

The job script is README's "How a job uses it" recipe, read from README.md here so the two cannot
drift, with only its paths substituted: the emulated PFS for the source, a mountpoint, a config, and
``slurm_train.py`` (ImageFolder + DistributedSampler ranks under srun) for ``train.py``.  Evidence
comes from outside seerfs wherever it can: the emulator's counters for PFS bytes, a manifest of the
source's digests for every byte training read, torch's own sampler for the opens, /proc and the mount
table for what was left behind; the only seerfs figure used is its status for which opens it predicted.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from e2e import Job, expected_opens, free_port, make_source, seerfs_config
from mounting import wait_for
from pfsemu_fixture import RunningEmulator, requires_fuse, running_pfsemu
from slurm_cluster import SlurmCluster, requires_slurm

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
    status: Path  # seerfs status --json, taken before the unmount
    mounts: Path  # how many mounts the job's node had on the mountpoint before the unmount
    log: Path  # the job's stdout+stderr


def job_files(cluster: SlurmCluster, name: str, job: Job, *, tiers_bytes: str = "64MiB", **cfg: Any) -> JobFiles:
    d = cluster.root / name
    d.mkdir(mode=0o777)
    d.chmod(0o777)  # the job may run as another user
    mnt = d / "mnt"
    mnt.mkdir()
    config = seerfs_config(d / "seerfs.yaml", job, cache_dir=d / "cache",
                           tiers=[{"kind": "memory", "bytes": tiers_bytes, "threads": 4}], **cfg)  # fmt: skip
    return JobFiles(d, mnt, config, d / "spec.json", d / "train", d / "status.json", d / "mounts.txt", d / "job.out")


def write_spec(files: JobFiles, job: Job, digests: dict[str, str]) -> None:
    spec = {k: v for k, v in job.__dict__.items()} | {"digests": digests, "out": str(files.out)}
    files.spec.write_text(json.dumps(spec))


def environment(files: JobFiles) -> list[str]:
    """The job script's environment lines: what a user's ~/.bashrc or module load would set up."""
    return [
        f"export PATH={shlex.quote(str(VENV_BIN))}:$PATH",  # python and seerfs, as installed
        f"export PYTHONPATH={shlex.quote(str(ROOT))}",  # this checkout's seerfs, not the venv's editable copy
        f"export SEERFS_TRAIN_SPEC={shlex.quote(str(files.spec))}",
        f"export MASTER_PORT={free_port()}",
    ]


def recipe_script(files: JobFiles, source: Path) -> str:
    """README's recipe with its paths substituted; ``seerfs status --json`` saved before the unmount."""
    subs = {
        "/lustre/imagenet": str(source),
        "/tmp/imagenet": str(files.mnt),
        "seerfs.yaml": str(files.config),
        "train.py": str(ROOT / "tests" / "slurm_train.py"),
    }
    recipe = readme_recipe()
    for old in subs:
        assert any(old in line for line in recipe), f"README's recipe no longer names {old}"
    lines = []
    for line in recipe:
        for old, new in subs.items():
            line = line.replace(old, new)
        if "seerfs umount" in line:  # what the test reads before the unmount: status, and how many mounts
            lines.append(f"seerfs status --json {files.mnt} > {files.status}")
            lines.append(f"awk -v m={files.mnt} '$5 == m' /proc/self/mountinfo | wc -l > {files.mounts}")
        lines.append(line)
    body = "\n".join(lines)
    return "#!/bin/bash\nset -euo pipefail\n" + "\n".join(environment(files)) + "\n" + body + "\n"


def job_output(files: JobFiles) -> str:
    try:
        return files.log.read_text(errors="replace")[-4000:]
    except OSError:
        return "(no job output)"


def check_job(files: JobFiles, ds: Dataset, job: Job, emu: RunningEmulator, opens_from: list[dict[str, Any]]) -> None:
    """What every recipe test proves: all opens predicted, PFS read once, every byte right."""
    expected = expected_opens(job, TRAIN_FILES, 0)
    ranks = [json.loads(files.out.with_suffix(f".rank{r}.json").read_text()) for r in range(job.world_size)]
    assert all(not r["bad"] for r in ranks), [r["bad"][:3] for r in ranks]  # bytes == the source's, by sha1
    assert sum(r["samples"] for r in ranks) == expected
    assert sum(r["bytes"] for r in ranks) > 0
    # seerfs's own figure, the one thing taken from it: which opens its plan predicted (cursor hits).
    opens = sum(d["reads"]["opens"] for d in opens_from)
    assert opens == expected, (opens, expected)
    cursors = [d["cursor"] for d in opens_from]
    assert sum(c["hits"] for c in cursors) == opens, cursors
    assert all(c["state"] == "tracking" and c["hit_rate"] == 1.0 and not c["mismatch"] for c in cursors), cursors
    pfs = emu.counters()
    assert pfs.bytes == ds.total, f"PFS served {pfs.bytes} bytes for a {ds.total}-byte dataset"
    assert set(pfs.files) <= set(ds.digests) and len(pfs.files) == len(ds.digests)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"


def assert_nothing_left(cluster: SlurmCluster, mnt: Path, daemon_pids: list[int], node: int = 0) -> None:
    """No seerfs daemon alive, no FUSE mount on the mountpoint, no process of the job left."""
    for pid in daemon_pids:
        wait_for(lambda pid=pid: not alive(pid), timeout=cluster.kill_wait + 10, what=f"daemon {pid} to exit")
    assert str(mnt) not in cluster.fuse_mounts(node), cluster.fuse_mounts(node)
    left = {pid: what for pid, what in cluster.marked_processes().items() if "slurmscriptd" not in what}
    assert not left, left


@pytest.fixture
def pfs(dataset: Dataset) -> Iterator[RunningEmulator]:
    with running_pfsemu(dataset.backing) as emu:
        yield emu


def test_readme_recipe_under_sbatch(slurm_cluster: SlurmCluster, dataset: Dataset, pfs: RunningEmulator) -> None:
    """README's recipe as an sbatch job of 2 tasks: predicted, PFS read once, bytes right, nothing left."""
    job = Job(world_size=2, epochs=2, batch_size=16, num_workers=2, seed=SEED, val=False)
    files = job_files(slurm_cluster, "recipe", job)
    write_spec(files, job, dataset.digests)
    script = files.dir / "job.sh"
    script.write_text(recipe_script(files, pfs.mountpoint))
    t0 = time.monotonic()
    job_id = slurm_cluster.sbatch(script, "--nodes=1", "--ntasks=2", f"--output={files.log}", f"--chdir={files.dir}")
    info = slurm_cluster.wait_job(job_id, timeout=240)
    print(f"job {job_id}: {info['job_state']} in {time.monotonic() - t0:.1f}s")
    assert info["job_state"] == "COMPLETED" and info["exit_code"] == 0, job_output(files)
    doc = json.loads(files.status.read_text())
    assert files.mounts.read_text().split() == ["1"], "not one daemon per node: mounts stacked on the mountpoint"
    check_job(files, dataset, job, pfs, [doc])
    assert_nothing_left(slurm_cluster, files.mnt, [doc["pid"]])
