"""Fault injection across nodes: a damaged plan on one node, restarts into a rendezvous group, stale
rendezvous entries, and authenticated peers that send what no daemon would.

Several daemons run on this machine, each with its own mountpoint, cache_dir and loopback address,
grouped through a rendezvous directory (tests/faults/nodes.py).  Bytes are checked against a
manifest read from the source directly; raw peer clients (tests/faults/peerwire.py) speak the real
wire format with the job token from the rendezvous directory.
"""

from __future__ import annotations

import contextlib
import errno
import json
import shutil
import socket
import time
from pathlib import Path
from typing import Any

import pytest
from faults import damage, peerwire, procs
from faults.manifest import CheckReport, Manifest, check_mount, equal_size_tree
from faults.nodes import Nodes, members
from mounting import status, wait_for
from pfsemu_fixture import requires_fuse

from tools.harness.jobs import wait_plan, write_seed

pytestmark = [pytest.mark.mount, pytest.mark.faults, requires_fuse]

FILE = 8192  # every file has this size: a size check cannot tell one file's bytes from another's
SEED_MAX = 2**64 - 1  # torch's range, which .control/seed enforces


def get_requests(mnt: Path) -> int:
    """GETs this node's data port answered, whatever the answer."""
    done = status(mnt)["group"]["server"]["requests"]
    return sum(int(v) for k, v in done.items() if k not in ("note", "ping", "malformed"))


def settle(mnts: list[Path], timeout: float = 60) -> None:
    """Until no node fetches anything for 2 s (its tier fill is done)."""

    def fetches() -> list[tuple[int, int]]:
        return [
            (int(d["prefetch"]["fill_fetches"]), int(d["prefetch"]["fetches_inflight"]))
            for d in (status(m) for m in mnts)
        ]

    deadline = time.monotonic() + timeout
    last, since = fetches(), time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.25)
        now = fetches()
        if now != last or any(inflight for _, inflight in now):
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= 2:
            return


# ---------------------------------------------------------------- a damaged plan


def test_a_damaged_cached_plan_on_one_node_makes_no_node_serve_wrong_bytes(tmp_path: Path) -> None:
    """obj_entry of node 0's cached plan shifted by one between mounts: the plan still loads, has the
    same digest, and maps every id to its neighbour's file.  No node may serve those bytes."""
    manifest = equal_size_tree(tmp_path / "pfs", classes=3, per_class=60, size=FILE)
    nodes = Nodes(
        tmp_path / "pfs",
        tmp_path,
        3,
        {"timeout": 2.0},
        {
            "tiers": [{"kind": "directory", "path": "@TIER@", "bytes": "64MiB"}],
            "prefetch": {"lookahead_bytes": "4KiB"},
            "job": {"world_size": 3, "epochs": 2},
        },
    )
    seed = 11
    with nodes.running() as mnts:  # every node plans for the seed and caches the plan
        write_seed(mnts[0], seed)
        for m in mnts:
            wait_plan(m, seed)
    for k in range(nodes.n):  # start the second run with empty tiers: they fill under the damaged plan
        shutil.rmtree(nodes.tier(k))
    cached = [
        d
        for d in damage.plan_dirs(nodes.cache(0))
        if json.loads((d / "plan.json").read_text())["inputs"]["seed"] == seed
    ]
    assert len(cached) == 1, cached
    damage.shift_plan_column(cached[0], "obj_entry", 1)
    damaged = (cached[0] / "obj_entry.npy").read_bytes()
    with nodes.running() as mnts:
        write_seed(mnts[0], seed)
        docs = [wait_plan(m, seed) for m in mnts]
        column = cached[0] / "obj_entry.npy"
        looked_at = docs[0]["plan"]["reused"] or not column.exists() or column.read_bytes() != damaged
        assert looked_at, "the fault needs node 0 to load its damaged cached plan (or to replace it)"
        assert len({d["plan"]["digest"] for d in docs}) == 1, "the damaged plan keeps its digest"
        settle(mnts)
        peer = [int(status(m)["reads"]["by_source"]["peer"]["files"]) for m in mnts]
        reports: list[CheckReport] = [check_mount(m, manifest) for m in mnts]
    wrong = {k: r.wrong_bytes for k, r in enumerate(reports) if r.wrong_bytes}
    assert sum(peer) > 0, "the fault needs files to travel between nodes"
    assert not wrong, (
        f"wrong bytes served per node: {wrong} of {manifest.total_bytes} each ("
        + "; ".join(f"node {k}: {r.summary()}" for k, r in enumerate(reports))
        + f"; files fetched from peers {peer}).  The cached plan is loaded unchecked (fusefs/planning/manager.py "
        "PlanManager._cached), its digest does not cover obj_entry (placement/plan.py _digest), and a peer's "
        "reply is checked only against the sender's own block digests (fusefs/cluster/peer_client.py _receive_body)"
    )


# ---------------------------------------------------------------- rendezvous membership


def restart_group(tmp_path: Path) -> tuple[Nodes, Manifest]:
    # Each tier holds two thirds of the dataset: its own third and a replica third from its owners.
    manifest = equal_size_tree(tmp_path / "pfs", classes=3, per_class=40, size=FILE)
    tier = int(manifest.total_bytes * 2 / 3) + (64 << 10)
    nodes = Nodes(
        tmp_path / "pfs",
        tmp_path,
        3,
        {"timeout": 1.0, "retry_down_after": 3.0, "down_after": 1},
        {
            "tiers": [{"kind": "memory", "bytes": tier}],
            "prefetch": {"lookahead_bytes": "4KiB"},
            "job": {"world_size": 3, "epochs": 2},
        },
    )
    return nodes, manifest


@pytest.mark.slow
def test_a_node_restarted_into_a_rendezvous_group_is_used_as_a_peer_again(tmp_path: Path) -> None:
    nodes, manifest = restart_group(tmp_path)
    retry = 3.0
    with nodes.running() as mnts:
        write_seed(mnts[0], 5)
        for m in mnts:
            wait_plan(m, 5)
        settle(mnts)
        dead_label, _ = nodes.self_address(2)
        procs.kill9(mnts[2])
        assert (nodes.rendezvous / f"node-{dead_label}.json").exists(), "the fault needs the crashed node's entry"
        nodes.mount(2)
        nodes.wait(2)
        waited = time.monotonic()
        label, address = nodes.self_address(2)
        write_seed(mnts[0], 6)  # a new placement: replicas of node 2's new files must come from it
        for m in mnts:
            wait_plan(m, 6)
        with contextlib.suppress(AssertionError):
            wait_for(lambda: get_requests(mnts[2]) > 0, timeout=retry + 15, what="GETs at the restarted node")
        served = get_requests(mnts[2])
        took = time.monotonic() - waited
        views = {
            k: [
                (m["label"], m["address"], m.get("state"), m.get("node"), m.get("requests"))
                for m in members(mnts[k])
                if m.get("state") != "self"
            ]
            for k in (0, 1)
        }
        restarted_node = status(mnts[2])["prefetch"]["cursor"]
        report = check_mount(mnts[0], manifest)
    assert served > 0, (
        f"the restarted node {label} ({address}) answered no GET in {took:.1f}s after its seerfs wait "
        f"(peers.retry_down_after {retry}s); nodes 0 and 1 see {views}; its own cursor: "
        f"{(restarted_node or {}).get('state')} node {(restarted_node or {}).get('node')}.  Requests for node 2's "
        f"files go to the crashed entry, whose view still claims node 2 (fusefs/cluster/peerclients.py member_of), "
        f"and the restarted daemon's group index counts the stale entry, so it presumes no training node "
        f"(fusefs/cluster/formation.py Rendezvous.scan)"
    )
    assert not report.wrong and not report.errors, report.summary()


def test_removing_a_stale_rendezvous_entry_keeps_labels_paired_with_their_ports(tmp_path: Path) -> None:
    nodes, _manifest = restart_group(tmp_path)
    with nodes.running() as mnts:
        dead_label, _ = nodes.self_address(2)
        procs.kill9(mnts[2])
        nodes.mount(2)
        nodes.wait(2)
        (nodes.rendezvous / f"node-{dead_label}.json").unlink(missing_ok=True)  # cleaned up (the joiner may have)
        truth = dict(nodes.self_address(k) for k in range(nodes.n))

        def paired() -> list[tuple[int, str, str, str]]:
            return [
                (k, m["label"], m["address"], truth.get(m["label"], "?"))
                for k in range(nodes.n)
                for m in members(mnts[k])
                if m.get("state") != "self" and m["address"] != truth.get(m["label"])
            ]

        with contextlib.suppress(AssertionError):  # rescans run every 2 s: give them a few
            wait_for(
                lambda: not paired() and all(len(members(m)) == nodes.n for m in mnts),
                timeout=12,
                what="every member paired with its own address",
            )
        wrong = paired()
        sizes = [len(members(m)) for m in mnts]
    assert not wrong, (
        f"(node, label, address used, label's real address): {wrong}; members per node {sizes}.  After the stale "
        f"entry went, Rendezvous.scan renumbered the members but "
        f"fusefs/cluster/peerclients.py PeerClients.sync keeps the "
        f"clients keyed by the old index, so labels are paired with other nodes' ports"
    )


# ---------------------------------------------------------------- hostile authenticated peers


def one_node(tmp_path: Path, n: int = 1) -> Nodes:
    (tmp_path / "pfs" / "train" / "c0").mkdir(parents=True)
    for i in range(4):
        (tmp_path / "pfs" / "train" / "c0" / f"f{i}.jpg").write_bytes(bytes([i]) * 5000)
    return Nodes(
        tmp_path / "pfs",
        tmp_path,
        n,
        {"timeout": 1.0},
        {"tiers": [{"kind": "memory", "bytes": "8MiB"}], "prefetch": {"lookahead_bytes": "64KiB"}},
    )


def data_port(mnt: Path) -> tuple[str, int]:
    doc = status(mnt)["group"]
    me = next(m for m in doc["members"] if m.get("state") == "self")
    return str(me["address"]).rsplit(":", 1)[0], int(doc["server"]["port"])


def test_block_frames_from_authenticated_peers_cost_the_server_bounded_memory(tmp_path: Path) -> None:
    """A BLOCK frame is only ever a reply: sent to a server it is a protocol error, known from its
    5-byte header.  40 connections sending the largest one must not make the daemon buffer them."""
    nodes = one_node(tmp_path)
    conns = 40
    with nodes.running() as (mnt,):
        pid = procs.daemon_pid(mnt)
        host, port = data_port(mnt)
        token = peerwire.read_token(nodes.rendezvous / "token")
        before = procs.vm_hwm(pid)
        header = peerwire.largest_block_frame_header()
        body = bytes(8 + (16 << 20) - 1)  # all but the frame's last byte: the server waits for it
        socks: list[socket.socket] = []
        try:
            for _ in range(conns):
                s = peerwire.connect(host, port, token)
                socks.append(s)
                s.settimeout(10)
                with contextlib.suppress(OSError):  # the server refused the frame and closed: what it should do
                    s.sendall(header + body)
            time.sleep(0.5)
            peak = procs.vm_hwm(pid) - before
            server = status(mnt)["group"]["server"]
        finally:
            for s in socks:
                s.close()
        assert server["authenticated_total"] >= conns, "the fault needs authenticated connections"
        assert procs.alive(pid) and (mnt / "train" / "c0" / "f1.jpg").read_bytes() == bytes([1]) * 5000
    assert peak <= 64 << 20, (
        f"{conns} authenticated connections each sending a BLOCK frame header and 16 MiB raised the daemon's "
        f"peak RSS by {peak >> 20} MiB ({server['protocol_errors']} protocol errors so far): the server reads "
        f"a whole BLOCK payload (up to MAX_BLOCK_SIZE) before refusing the frame (fusefs/cluster/peer_server.py "
        f"_requests -> parse_frame_header allows BLOCK lengths; rx.exactly buffers it)"
    )


def test_a_peer_note_with_an_out_of_range_seed_is_not_adopted(tmp_path: Path) -> None:
    nodes = one_node(tmp_path, n=2)
    bad = SEED_MAX + 5
    with nodes.running() as mnts:
        with pytest.raises(OSError) as written:  # the validation a seed written on the mount gets
            (mnts[0] / ".control" / "seed").write_text(f"{bad}\n")
        assert written.value.errno == errno.EINVAL
        host, port = data_port(mnts[0])
        notes_before = status(mnts[0])["group"]["server"]["requests"].get("note", 0)
        with peerwire.connect(host, port, peerwire.read_token(nodes.rendezvous / "token")) as s:
            answer = peerwire.send_note(
                s, {"m": 1, "node": None, "plan": None, "plan_seed": None, "seed": [bad, 1000, 1]}
            )
        assert answer is not None and status(mnts[0])["group"]["server"]["requests"]["note"] > notes_before
        time.sleep(5)  # two state rounds: node 0 tells node 1 what it adopted
        seeds: dict[int, Any] = {}
        for k, m in enumerate(mnts):
            try:
                seeds[k] = status(m)["seed"]["value"]
            except OSError as exc:
                seeds[k] = f"mount failed: {errno.errorcode.get(exc.errno or 0)}"
    adopted = {k: v for k, v in seeds.items() if not isinstance(v, int) or not -(2**63) <= v <= SEED_MAX}
    assert not adopted, (
        f"a NOTE carrying seed {bad} (outside [-2**63, 2**64-1], refused with EINVAL on .control/seed) was "
        f"adopted: seed per node {seeds} (fusefs/cluster/peergroup.py _absorb passes int(seed[0]) to SeedState.set "
        f"without parse_seed's range check)"
    )
