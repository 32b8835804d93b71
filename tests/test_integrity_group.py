"""In a group, each node rechecks the sources of the files it owns every round, and its replicas of
files other nodes own every N-th round: the work is split, and no cached copy goes unchecked."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from e2e import Job, make_source, run_readers, wait_plan, write_seed
from mounting import status, wait_for
from pfsemu_fixture import requires_fuse, running_pfsemu

from tools.harness.nodes import rendezvous_group

pytestmark = [pytest.mark.mount, pytest.mark.torch, pytest.mark.slow]

FILES = 240


@requires_fuse
def test_owners_recheck_their_files_every_round_and_replicas_every_nth(tmp_path: Path) -> None:
    backing = tmp_path / "pfs"
    digests, total = make_source(backing, FILES, 0, mean_size=6000)
    job = Job(world_size=2, epochs=2, batch_size=8, num_workers=0, seed=5, val=False)
    with (
        running_pfsemu(backing) as emu,
        rendezvous_group(
            emu.mountpoint, tmp_path, job, tier_bytes=int(total * 0.75), n=2, snapshot={"revalidate_round_min_s": 0.5}
        ) as mnts,
    ):
        write_seed(mnts[0], 5)
        for mnt in mnts:
            wait_plan(mnt, 5)
        results = run_readers(mnts, job, digests, tmp_path / "run")
        assert all(not r["bad"] for r in results)
        sizes: list[set[int]] = [set(), set()]
        deadline = time.monotonic() + 8
        while time.monotonic() < deadline:  # rounds of both kinds on both nodes
            for k, mnt in enumerate(mnts):
                sizes[k].add(int(status(mnt)["revalidation"]["round_files"]))
            time.sleep(0.1)
        docs = [status(m) for m in mnts]
        wait_for(lambda: all(status(m)["revalidation"]["rounds"] >= 4 for m in mnts), 20, "a few rounds per node")
    held = [sum(t["files"] for t in d["tiers"]) for d in docs]
    print("round sizes per node", sorted(sizes[0]), sorted(sizes[1]), "held", held)
    assert all(d["revalidation"]["replicas_every_rounds"] == 2 for d in docs), [d["revalidation"] for d in docs]
    owned = [min(s - {0}) for s in sizes]
    every = [max(s) for s in sizes]
    # Each file has one owner, who holds it: the owners' rounds cover each file once.
    assert sum(owned) <= FILES, (owned, every, held)
    # Replicas exist (75% per node = 150% in all) and are left to their owner on most rounds ...
    assert sum(every) > FILES and all(o < e for o, e in zip(owned, every, strict=True)), (owned, every)
    # ... but every copy this node holds is in its replica rounds.
    assert all(e >= h for e, h in zip(every, held, strict=True)), (every, held)
    assert all(d["revalidation"]["changed_total"] == 0 for d in docs)
