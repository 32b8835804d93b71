"""A node killed with -9 and mounted again rejoins its group and serves its peers again.

Three daemons on this machine (own mountpoints, own loopback addresses 127.0.0.1-3) over the PFS
emulator; readers of ranks 0 and 1 train through nodes 0 and 1 the whole time.  Node 2 is killed,
its dead mount cleaned up and mounted again: at a new port (rendezvous, port 0), at the same port
(rendezvous with a fixed port) or at its fixed address (static list).  Proof that it serves its peers
again comes from outside seerfs: the kernel's TCP table (/proc/net/tcp) shows nodes 0 and 1
connected to its new data port, and the emulator's per-process counters show the PFS reads that
nodes 0 and 1 made for node 2's files while it was dead stop once it is back.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import threading
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from e2e import Job, make_source, run_readers, wait_plan, write_seed
from mounting import force_unmount, is_mounted, seerfs, status, wait_for
from pfsemu_fixture import running_pfsemu

from tools.harness.nodes import member_state, mountpoints, node_config

pytestmark = [pytest.mark.mount, pytest.mark.torch, pytest.mark.slow]

TRAIN = 900
RETRY = 20.0  # peers.retry_down_after: the rejoined node must be serving well within it


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str], int]:
    root = tmp_path_factory.mktemp("pfs-rejoin") / "data"
    digests, total = make_source(root, TRAIN, 0, mean_size=30_000)
    return root, digests, total


def free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def group(source: Path, work: Path, job: Job, mode: str, tier_bytes: int) -> Iterator[tuple[list[Path], list[Path]]]:
    """Three daemonised mounts; ``mode``: rendezvous (port 0), rendezvous-port (fixed ports), static."""
    mnts = mountpoints(work, 3)
    hosts = [f"127.0.0.{k + 1}" for k in range(3)]
    ports = [free_port(h) for h in hosts] if mode != "rendezvous" else [0, 0, 0]
    common: dict[str, Any] = {"timeout": 1.0, "down_after": 2, "retry_down_after": RETRY}
    if mode == "static":
        common |= {
            "discovery": "static",
            "static": [f"{h}:{p}" for h, p in zip(hosts, ports, strict=True)],
            "token_file": str(work / "token"),
        }
    else:
        common |= {"discovery": "rendezvous", "rendezvous_dir": str(work / "rendezvous"), "expect": 3}
    configs = [node_config(work, k, job, tier_bytes=tier_bytes, peers={**common, "port": ports[k]}) for k in range(3)]
    try:
        for mnt, cfg in zip(mnts, configs, strict=True):
            seerfs("mount", str(source), str(mnt), "-c", str(cfg), check=True)
        for mnt in mnts:
            seerfs("wait", str(mnt), "--timeout", "60", check=True)
        yield mnts, configs
    finally:
        for mnt in mnts:
            if is_mounted(mnt):
                seerfs("umount", str(mnt), timeout=60)
            force_unmount(mnt)


def connected_to(host: str, port: int, pids: list[int]) -> set[int]:
    """Which of ``pids`` hold an ESTABLISHED TCP connection to host:port, from the kernel's table
    (/proc/net/tcp) and each process's open sockets (/proc/PID/fd), not from seerfs."""
    want = f"{socket.inet_aton(host)[::-1].hex().upper()}:{port:04X}"
    inodes = set()
    with open("/proc/net/tcp") as fh:
        next(fh)
        for line in fh:
            fields = line.split()
            if fields[2] == want and fields[3] == "01":
                inodes.add(fields[9])
    holders = set()
    for pid in pids:
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    link = os.readlink(f"/proc/{pid}/fd/{fd}")
                    if link.startswith("socket:[") and link[8:-1] in inodes:
                        holders.add(pid)
    return holders


def pfs_bytes(emu: Any, pids: list[int]) -> int:
    stats = emu.counters(files=False)
    return sum(stats.pids[p][1].bytes for p in pids if p in stats.pids)


def rate(emu: Any, pids: list[int], seconds: float) -> float:
    before = pfs_bytes(emu, pids)
    time.sleep(seconds)
    return (pfs_bytes(emu, pids) - before) / seconds


class Readers:
    """Ranks 0 and 1 of a world of 3, reading through nodes 0 and 1 in a thread."""

    def __init__(self, mnts: list[Path], job: Job, digests: dict[str, str], work: Path) -> None:
        self.out: list[dict[str, Any]] = []
        self.error: BaseException | None = None

        def go() -> None:
            try:
                self.out = run_readers(mnts, job, digests, work / "run", ranks=[0, 1])
            except BaseException as exc:
                self.error = exc

        self.thread = threading.Thread(target=go, daemon=True)
        self.thread.start()

    def running(self) -> bool:
        return self.thread.is_alive()

    def results(self) -> list[dict[str, Any]]:
        self.thread.join(timeout=600)
        if self.error is not None:
            raise self.error
        return self.out


def group_views(mnts: list[Path]) -> str:
    """What each node's status says about its group (for a failure message)."""
    out = []
    keep = ("index", "address", "label", "state", "node", "plan", "ok", "not_yet", "not_owned", "bad_request")
    for k, mnt in enumerate(mnts):
        g = status(mnt)["group"]
        members = [{f: m.get(f) for f in keep} for m in g["members"]]
        extra = {
            f: g.get(f) for f in ("me", "state", "notes_refused", "notes_unknown", "last_bad_note", "removed_stale")
        }
        out.append(f"node {k}: {extra} {members} plan={status(mnt)['plan'].get('digest')}")
    return "\n".join(out)


def is_down(mnt: Path) -> bool:
    return member_state(mnt, "127.0.0.3:") == "down"


def serves(mnt: Path, address: str) -> bool:
    """Whether ``mnt``'s node has had a file from the member at ``address``."""
    for m in status(mnt)["group"]["members"]:
        if m["address"] == address:
            return m.get("state") == "up" and int(m.get("ok", 0)) > 0
    return False


@pytest.mark.parametrize("mode", ["rendezvous", "rendezvous-port", "static"])
def test_a_node_killed_and_mounted_again_serves_its_peers_again(
    tmp_path: Path, source: tuple[Path, dict[str, str], int], mode: str
) -> None:
    root, digests, total = source
    job = Job(world_size=3, epochs=14, batch_size=16, num_workers=2, seed=9, val=False, sync=False, compute_s=0.004)
    with running_pfsemu(root) as emu, group(emu.mountpoint, tmp_path, job, mode, int(total * 0.4)) as (mnts, cfgs):
        write_seed(mnts[0], 9)
        for mnt in mnts:
            wait_plan(mnt, 9)
        survivors = [int(status(m)["pid"]) for m in mnts[:2]]
        victim = int(status(mnts[2])["pid"])
        old_address = next(
            m["address"] for m in status(mnts[0])["group"]["members"] if m["address"].startswith("127.0.0.3:")
        )
        readers = Readers(mnts, job, digests, tmp_path)
        wait_for(lambda: (status(mnts[0])["cursor"] or {}).get("epoch", -1) >= 1, timeout=120, what="epoch 1")
        os.kill(victim, signal.SIGKILL)
        for mnt in mnts[:2]:
            wait_for(partial(is_down, mnt), timeout=60, what="node 2 marked down")
        down_rate = rate(emu, survivors, 3.0)  # nodes 0 and 1 read node 2's files from the PFS now
        assert readers.running(), "the job ended before the restart: make it longer"

        res = seerfs("umount", str(mnts[2]), timeout=60)  # the dead mount (ENOTCONN) is cleaned up
        assert res.returncode == 0 and not is_mounted(mnts[2]), res.stderr
        seerfs("mount", str(emu.mountpoint), str(mnts[2]), "-c", str(cfgs[2]), check=True)
        seerfs("wait", str(mnts[2]), "--timeout", "60", check=True)
        waited = time.monotonic()
        doc = status(mnts[2])
        reborn = int(doc["pid"])
        port = int(doc["group"]["server"]["port"])
        address = f"127.0.0.3:{port}"
        assert reborn != victim and (mode == "rendezvous") == (address != old_address), (address, old_address)

        # Served again: both survivors connected to its data port and have had files from it.
        try:
            wait_for(
                lambda: (
                    connected_to("127.0.0.3", port, survivors) == set(survivors)
                    and all(serves(m, address) for m in mnts[:2])
                ),
                timeout=RETRY,
                what=f"nodes 0 and 1 served by the rejoined node at {address}",
            )
        except AssertionError as exc:
            raise AssertionError(f"{exc}: {connected_to('127.0.0.3', port, survivors)}\n{group_views(mnts)}") from None
        served_after = time.monotonic() - waited
        assert served_after < RETRY
        for mnt in mnts[:2]:  # no survivor still lists the dead member (rendezvous) or pairs it wrongly
            members = status(mnt)["group"]["members"]
            at3 = [m for m in members if m["address"].startswith("127.0.0.3:")]
            assert [m["address"] for m in at3] == [address], members
        time.sleep(3.0)  # the rejoined node's own tier fills from the PFS as it was planned to
        assert readers.running(), "the job ended before the rejoin could be measured: make it longer"
        up_rate = rate(emu, survivors, 4.0)
        reborn_bytes = pfs_bytes(emu, [reborn])
        results = readers.results()
    print(
        f"{mode}: survivors' PFS rate {down_rate / 1e6:.2f} MB/s with node 2 dead, {up_rate / 1e6:.3f} MB/s after "
        f"it rejoined (served {served_after:.1f}s after its wait); the rejoined node read {reborn_bytes / 1e6:.1f} MB"
    )
    assert all(not r["bad"] for r in results)  # every byte right through all of it
    assert down_rate > 0, "the survivors never fell back to the PFS: node 2's death was not exercised"
    assert reborn_bytes > 0  # it reads its own files, as their owner
    assert up_rate <= 0.05 * down_rate, (up_rate, down_rate)
