"""Pages in the page cache are holdings: a node serves a peer from them without reading the PFS.

A file a reader read through the mount stays in the kernel's page cache (its pages are *kept*); it
is in no tier.  Before, a peer that asked for it made this node read it from the PFS again.  Now the
daemon reads the pages back through its own mount (fusefs/readpath/staging.py, ``read_back``), and:

* a peer's held-only request (protocol HELD_ONLY: "a copy you hold now, never a PFS read") is
  answered with the file's bytes, equal to the source's, and the emulated PFS sees no read;
* the read back is no reader's open: the mount's open count does not move;
* once the kernel dropped the pages (``posix_fadvise(DONTNEED)`` through the mount), the read back
  fails without fetching (no PFS read, a miss counted) and the held-only request is refused; a
  reader's own open still gets the right bytes.

One daemon in a rendezvous group of one (so it serves the data port), a directory tier of one byte
(nothing is kept in a tier, only pages), the real peer client with the group's token.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
from mounting import status
from pfsemu_fixture import requires_fuse, running_pfsemu

from fusefs.cluster.protocol import FileId
from fusefs.meta.snapshot import load_or_scan
from tools.harness.jobs import Job, make_source
from tools.harness.nodes import held_only_get, rendezvous_group

pytestmark = [pytest.mark.mount, requires_fuse]


def test_kept_pages_serve_a_held_only_request_and_dropped_pages_are_refused_without_a_pfs_read(
    tmp_path: Path,
) -> None:
    root = tmp_path / "pfs"
    digests, _total = make_source(root, 40, 0, mean_size=50_000)
    rel = sorted(digests)[7]
    snap, _ = load_or_scan(str(root), tmp_path / "test-cache")  # entry numbers: the same walk
    entry = 0
    for part in rel.split("/"):
        entry = snap.tree.find_child(entry, part.encode())
    ident = FileId(entry, int(snap.tree.size[entry]), int(snap.tree.mtime_ns[entry]))
    job = Job(world_size=1, epochs=1, batch_size=4, num_workers=0, seed=0)
    tiers = [{"kind": "directory", "path": str(tmp_path / "tier"), "bytes": 1}]
    with (
        running_pfsemu(root) as emu,
        rendezvous_group(
            emu.mountpoint,
            tmp_path,
            job,
            tier_bytes=0,
            n=1,
            tiers=tiers,
            prefetch={"lookahead_bytes": "8MiB"},
            seed_discovery={"enabled": False},
        ) as mnts,
    ):
        mnt = mnts[0]
        token = bytes.fromhex((tmp_path / "rendezvous" / "token").read_text().strip())
        address = next(m["address"] for m in status(mnt)["group"]["members"] if m["state"] == "self")
        assert hashlib.sha1((mnt / rel).read_bytes()).hexdigest() == digests[rel]  # a reader: pages kept
        before = status(mnt)
        assert before["prefetch"]["staging"]["kept_files"] == 1
        emu.reset()

        data = held_only_get(address, token, ident)
        after = status(mnt)
        assert data is not None and hashlib.sha1(data).hexdigest() == digests[rel]
        assert emu.counters().bytes == 0  # served from the page cache, not read again
        assert after["prefetch"]["staging"]["read_backs"] == 1
        assert after["reads"]["opens"] == before["reads"]["opens"]  # the read back is no reader's open

        fd = os.open(mnt / rel, os.O_RDONLY)  # drop the file's pages from the page cache
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
        emu.reset()
        assert held_only_get(address, token, ident) is None
        assert emu.counters().bytes == 0  # refused, never fetched for a held-only request
        assert status(mnt)["prefetch"]["staging"]["read_back_misses"] == 1
        assert hashlib.sha1((mnt / rel).read_bytes()).hexdigest() == digests[rel]  # a reader still gets it
