"""Several seerfs "nodes" on this machine: one daemon each, own mountpoint, cache and loopback address.

Each node binds 127.0.0.(k+1), so peer traffic really crosses the network stack (never leaving
loopback).  Groups form through MPI (``mpirun --oversubscribe``) or a rendezvous directory.
Teardown always unmounts every node and stops mpirun.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import trio
import yaml

from fusefs.cluster.peer_client import PeerClient
from fusefs.cluster.protocol import FileId
from tools.harness.jobs import Job
from tools.harness.mounts import force_unmount, is_mounted, seerfs, status, wait_for

MPI_ENV = {
    "OMPI_ALLOW_RUN_AS_ROOT": "1",
    "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
    "OMPI_MCA_btl": "self,tcp",
    "OMPI_MCA_btl_tcp_if_include": "lo",
    "OMPI_MCA_oob_tcp_if_include": "lo",
}


def node_config(
    work: Path, k: int, job: Job, *, tier_bytes: int, peers: dict[str, Any], ranks_per_node: int = 1, **sections: Any
) -> Path:
    """Node ``k``'s config; ``sections`` replace whole top-level sections (e.g. ``prefetch``, ``fuse``)."""
    d = work / f"node{k}"
    d.mkdir(parents=True, exist_ok=True)
    cfg = {
        "cache_dir": str(d / "cache"),
        "datasets": [{"root": "train"}, {"root": "val", "follows": "train", "sampler": {"shuffle": False}}]
        if job.val
        else [{"root": "train"}],
        "job": {
            "world_size": job.world_size,
            "ranks_per_node": ranks_per_node,
            "epochs": job.epochs,
            "batch_size": job.batch_size,
            "num_workers": job.num_workers,
        },
        "tiers": [{"kind": "memory", "bytes": tier_bytes + (2 << 20), "threads": 4}],
        "prefetch": {"lookahead_bytes": "2MiB", "threads": 8},
        "peers": {"bind": f"127.0.0.{k + 1}", **peers},
        **sections,
    }
    path = d / "seerfs.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def mountpoints(work: Path, n: int) -> list[Path]:
    out = []
    for k in range(n):
        mnt = work / f"node{k}" / "mnt"
        mnt.mkdir(parents=True, exist_ok=True)
        out.append(mnt)
    return out


def _teardown(mnts: list[Path]) -> None:
    for mnt in mnts:
        if is_mounted(mnt):
            seerfs("umount", str(mnt), timeout=60)
        force_unmount(mnt)


@contextlib.contextmanager
def rendezvous_group(
    source: Path,
    work: Path,
    job: Job,
    *,
    tier_bytes: int,
    n: int = 3,
    timeout: float = 1.0,
    alone: bool = False,
    **sections: Any,
) -> Iterator[list[Path]]:
    """``n`` daemonised mounts that find each other through a rendezvous directory (``alone``: that do not);
    ``sections`` replace whole top-level sections of every node's config."""
    mnts = mountpoints(work, n)
    peers: dict[str, Any] = {
        "discovery": "rendezvous",
        "rendezvous_dir": str(work / "rendezvous"),
        "expect": n,
        "timeout": timeout,
        "retry_down_after": 60.0,
    }
    if alone:
        peers = {"discovery": "none"}
    try:
        for k, mnt in enumerate(mnts):
            cfg = node_config(work, k, job, tier_bytes=tier_bytes, peers=peers, **sections)
            seerfs("mount", str(source), str(mnt), "-c", str(cfg), check=True)
        for mnt in mnts:
            seerfs("wait", str(mnt), "--timeout", "60", check=True)
        yield mnts
    finally:
        _teardown(mnts)


@contextlib.contextmanager
def mpi_group(
    source: Path, work: Path, job: Job, *, tier_bytes: int, n: int = 3, ranks_per_node: int = 1, **sections: Any
) -> Iterator[list[Path]]:
    """``mpirun -np n seerfs mount --fg``: one process per node, each with its own mountpoint."""
    mnts = mountpoints(work, n)
    for k in range(n):
        node_config(
            work,
            k,
            job,
            tier_bytes=tier_bytes,
            peers={"discovery": "mpi", "timeout": 1.0},
            ranks_per_node=ranks_per_node,
            **sections,
        )
    rank_cmd = (
        f"k=$OMPI_COMM_WORLD_RANK; exec {sys.executable} -m fusefs mount --fg {source} "
        f"{work}/node$k/mnt -c {work}/node$k/seerfs.yaml"
    )
    mpirun = shutil.which("mpirun")
    assert mpirun, "mpirun not found (install openmpi-bin: tools/setup does)"
    proc = subprocess.Popen(
        [mpirun, "-np", str(n), "--oversubscribe", "sh", "-c", rank_cmd],
        env={**os.environ, **MPI_ENV},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    try:
        for mnt in mnts:
            wait_for(partial(_mounted_or_exited, mnt, proc), timeout=120, what=f"{mnt} mounted")
            if proc.poll() is not None:
                raise AssertionError(f"mpirun exited {proc.returncode}:\n{proc.stdout.read() if proc.stdout else ''}")
        for mnt in mnts:
            seerfs("wait", str(mnt), "--timeout", "60", check=True)
        yield mnts
    finally:
        _teardown(mnts)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _mounted_or_exited(mnt: Path, proc: subprocess.Popen[str]) -> bool:
    return is_mounted(mnt) or proc.poll() is not None


def peer_reads(mnt: Path) -> int:
    return int(status(mnt)["reads"]["by_source"]["peer"]["files"])


def member_state(mnt: Path, address_prefix: str) -> str:
    """State of the member whose data address starts with ``address_prefix``, as ``mnt``'s node sees it."""
    for m in status(mnt)["group"]["members"]:
        if str(m["address"]).startswith(address_prefix):
            return str(m.get("state"))
    return "missing"


def wait_seed(mnts: list[Path], value: int, timeout: float = 20) -> None:
    seeds: list[Any] = []

    def everywhere() -> bool:
        nonlocal seeds
        seeds = [status(m)["seed"]["value"] for m in mnts]
        return all(s == value for s in seeds)

    wait_for(everywhere, timeout, lambda: f"seed {value} to reach every node (seeds now: {seeds})")


def held_only_get(address: str, token: bytes, ident: FileId) -> bytes | None:
    """A peer's held-only request to the node at ``address`` (``host:port``): the bytes it holds, or
    None where it holds none (it must then answer without reading the PFS)."""
    host, _, port = address.rpartition(":")

    async def main() -> bytes | None:
        client = PeerClient(0, host, int(port), token, timeout=5.0, max_requests=2, down_after=3)
        try:
            return await client.fetch(0, 0, b"", ident, held_only=True)
        finally:
            await client.aclose()

    return trio.run(main)
