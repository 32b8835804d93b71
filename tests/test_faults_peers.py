"""A peer daemon SIGSTOPped or killed -9 in the middle of an epoch of a three-node job.

Three daemons over the emulated PFS, one real DistributedSampler rank per node (tests/faults/epochs.py),
every sample compared with a manifest read from the source directly.  Node 2's daemon is stopped or
killed while ranks 0 and 1 read; they must finish with the source's bytes, no read waiting longer than
peers.timeout plus one PFS read, and node 2 marked down.  Then the stopped daemon is continued (the
killed one mounted again): it must be up again on the others within peers.retry_down_after, its own
rank must read right bytes, and the others must fetch from it again.

Two members each stopped in turn while the other reads mark each other down; state notes must still
cross, so both are served peer to peer again long before peers.retry_down_after.
"""

from __future__ import annotations

import os
import signal
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from e2e import make_source, wait_plan, write_seed
from faults import procs
from faults.manifest import Manifest
from faults.nodes import Nodes
from faults.ranks import Rank, ranks
from mounting import status, wait_for
from pfsemu_fixture import requires_fuse, running_pfsemu

from tools.harness.nodes import member_state, wait_seed

pytestmark = [pytest.mark.mount, pytest.mark.torch, pytest.mark.faults, requires_fuse]

TIMEOUT = 1.0  # peers.timeout
RETRY = 3.0  # peers.retry_down_after
SEED = 5


def is_state(nodes: Nodes, k: int, node: int, state: str) -> bool:
    """Whether node ``k`` sees node ``node`` in ``state``."""
    return member_state(nodes.mnt(k), f"{nodes.host(node)}:") == state


def served(mnt: Path, kind: str = "ok") -> int:
    """Requests of ``kind`` this node's data port answered: "ok" (files served to its peers), "note"
    (its peers' state notes that reached it)."""
    return int(status(mnt)["group"]["server"]["requests"].get(kind, 0))


def epoch(readers: list[Rank], n: int, which: list[int] | None = None) -> list[dict[str, Any]]:
    chosen = [readers[k] for k in (which if which is not None else range(len(readers)))]
    for r in chosen:
        r.start(n, SEED)
    return [r.result() for r in chosen]


def group(source: Path, work: Path, manifest: Manifest, n: int, *, retry: float, tier_share: float) -> Nodes:
    """``n`` nodes, one rank each, peers down after one failure and probed again after ``retry`` s."""
    return Nodes(
        source,
        work,
        n,
        {"timeout": TIMEOUT, "retry_down_after": retry, "down_after": 1},
        {
            "tiers": [{"kind": "memory", "bytes": int(manifest.total_bytes * tier_share)}],
            "prefetch": {"lookahead_bytes": "256KiB"},
            "job": {"world_size": n, "ranks_per_node": 1, "epochs": 6, "batch_size": 8},
        },
    )


@contextmanager
def seeded(nodes: Nodes, manifest: Manifest, work: Path) -> Iterator[tuple[list[Path], list[Rank]]]:
    """The nodes mounted, SEED written and planned on every one, and their ranks ready."""
    with nodes.running() as mnts, ranks(nodes, manifest, work) as readers:
        write_seed(mnts[0], SEED)
        wait_seed(mnts, SEED)
        for m in mnts:
            wait_plan(m, SEED)
        yield mnts, readers


def right(results: list[dict[str, Any]]) -> None:
    for r in results:
        assert r["bad_count"] == 0 and r["error_count"] == 0, r
        assert r["samples"] > 0, r


@pytest.mark.parametrize("how", ["stop", pytest.param("kill", marks=pytest.mark.slow)])
def test_a_peer_stopped_or_killed_mid_epoch_costs_no_byte_no_hang_and_comes_back(tmp_path: Path, how: str) -> None:
    backing = tmp_path / "pfs"
    make_source(backing, 240, 0, mean_size=8000)
    manifest = Manifest.of(backing)
    with running_pfsemu(backing) as emu:
        nodes = group(emu.mountpoint, tmp_path, manifest, 3, retry=RETRY, tier_share=0.4)
        with seeded(nodes, manifest, tmp_path) as (mnts, readers):
            right(epoch(readers, 0))  # tiers filled, node 2 serving its peers
            victim = int(status(mnts[2])["pid"])
            served_before = served(mnts[2])
            assert served_before > 0, "node 2 must serve its peers before the fault for the test to mean anything"

            # The data port's handshake deadline follows peers.timeout: a silent stranger is closed then.
            port = int(status(mnts[0])["group"]["server"]["port"])
            with socket.create_connection((nodes.host(0), port), timeout=10) as stranger:
                t0 = time.monotonic()
                assert stranger.recv(1) == b""
                silent_closed_after = time.monotonic() - t0

            opened = int(status(mnts[0])["reads"]["opens"])
            for r in readers[:2]:
                r.start(1, SEED)
            wait_for(lambda: int(status(mnts[0])["reads"]["opens"]) >= opened + 10, 60, "node 0 reading epoch 1")
            harmed = time.monotonic()
            if how == "stop":
                os.kill(victim, signal.SIGSTOP)
            else:
                procs.kill9(mnts[2], victim)
            try:
                survivors = [r.result() for r in readers[:2]]
                epoch_s = time.monotonic() - harmed
                for k in (0, 1):
                    wait_for(partial(is_state, nodes, k, 2, "down"), 60, f"node {k}: 2 down")
            finally:
                if how == "stop":
                    os.kill(victim, signal.SIGCONT)
            back = time.monotonic()
            if how == "kill":
                nodes.mount(2)
                nodes.wait(2)
                wait_seed(mnts, SEED)
                wait_plan(mnts[2], SEED)
            served_after = served(mnts[2])
            for k in (0, 1):  # up again on both, within retry_down_after (plus slack for 2 loaded cores)
                wait_for(partial(is_state, nodes, k, 2, "up"), RETRY + 15, f"node {k}: 2 up")
            up_after = time.monotonic() - back
            later = [epoch(readers, n) for n in (2, 3)]
            served_again = served(mnts[2]) - served_after
    right(survivors)
    for results in later:
        right(results)
    slowest = max(r["read_max_s"] for r in survivors)
    print(
        f"{how}: survivors finished epoch 1 in {epoch_s:.1f}s, slowest read {slowest * 1000:.0f} ms; node 2 up "
        f"again on both after {up_after:.1f}s; it served {served_again} files to its peers in the next two "
        f"epochs; a silent connection was closed after {silent_closed_after:.2f}s"
    )
    # One PFS read of an 8 KB file at the emulator's defaults is a few ms: 0.5 s of slack on 2 loaded cores.
    assert slowest <= TIMEOUT + 0.5, slowest
    assert served_again > 0, "the peers never fetched from node 2 again"
    assert TIMEOUT - 0.1 <= silent_closed_after <= TIMEOUT + 1.5, silent_closed_after


@pytest.mark.slow  # 22 s of real daemons; the client half runs in CI on trio's MockClock (test_hardening_peers.py)
def test_two_members_that_each_marked_the_other_down_hear_from_each_other_again(tmp_path: Path) -> None:
    """Each member stopped in turn while the other reads: node 0 marks node 1 down, then node 1 marks
    node 0 down, so neither would talk to the other until peers.retry_down_after (120 s here) if a
    down verdict stopped state notes too: both would read the PFS for what the other holds.  Notes
    must cross both ways within a few state rounds of both running, and the next epoch must be served
    peer to peer again, with right bytes throughout."""
    backing = tmp_path / "pfs"
    make_source(backing, 160, 0, mean_size=8000)
    manifest = Manifest.of(backing)
    with running_pfsemu(backing) as emu:
        nodes = group(emu.mountpoint, tmp_path, manifest, 2, retry=120.0, tier_share=0.6)
        with seeded(nodes, manifest, tmp_path) as (mnts, readers):
            results = [epoch(readers, 0)]  # tiers filled, each node serving the other
            pids = [int(status(m)["pid"]) for m in mnts]
            for stopped, reader in ((1, 0), (0, 1)):  # node 0 sees 1 down, then node 1 sees 0 down
                os.kill(pids[stopped], signal.SIGSTOP)
                try:
                    readers[reader].start(1, SEED)
                    wait_for(
                        partial(is_state, nodes, reader, stopped, "down"),
                        60,
                        f"node {reader} marks node {stopped} down",
                    )
                    results.append([readers[reader].result()])
                finally:
                    os.kill(pids[stopped], signal.SIGCONT)
            back = time.monotonic()
            notes = [served(m, "note") for m in mnts]
            wait_for(
                lambda: all(served(m, "note") > n for m, n in zip(mnts, notes, strict=True)),
                20,
                "a state note crossing each way after both marked the other down",
            )
            heard_after = time.monotonic() - back
            before = [served(m) for m in mnts]
            results.append(epoch(readers, 2))
            served_again = [served(m) - s for m, s in zip(mnts, before, strict=True)]
            states = [member_state(mnts[k], f"{nodes.host(1 - k)}:") for k in (0, 1)]
    for r in results:
        right(r)
    print(f"notes crossed both ways {heard_after:.1f}s after both ran; epoch 2 served {served_again}; states {states}")
    assert states == ["up", "up"], states
    assert all(n > 0 for n in served_again), f"a node never fetched from the other again: {served_again}"
