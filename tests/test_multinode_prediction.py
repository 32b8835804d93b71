"""Two seerfs nodes predict and prefetch as well as one, and never read a file from the PFS twice.

Two daemons on this machine (own mountpoints, loopback addresses, a rendezvous directory), one
emulated PFS under both, one real rank per node (ImageFolder + DataLoader workers +
DistributedSampler, every sample checked against digests taken from the source before mounting).
What the PFS served comes from the emulator's own counters; what each node will read next epoch
is computed with torch's own DistributedSampler.

* Whatever the job writes as its seed -- the right one, a wrong one, none -- the PFS serves each
  file once in all (none twice, by the emulator's per-file counters) while the group's tiers hold
  the dataset: with a trusted plan each file's plan owner reads it, otherwise its owner under the
  group rule (placement/owners.py), and everybody else gets it from that owner.  A wrong seed's plan is
  presumed (filled and staged from the PFS) until the opens refute it, and the rule and then the
  seed found from the opens name other owners: whoever reads a file next asks the earlier
  regimes' readers first (fusefs/readpath/policy.py, ``holders``).
* With the right seed each node has, before the next epoch starts, the files it reads then and
  did not read this epoch (they are on the other node) where an open is served without a fetch:
  pushed into its page cache from the peer, or in its memory tier (the next-epoch lane leaves
  those to their opens).  Counted by the rank as each epoch starts: during epoch 1 almost every
  open was served from the page cache or a local tier, none waiting for a peer or the PFS.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from e2e import Job, make_source, run_readers, wait_plan, write_seed
from mounting import status
from pfsemu_fixture import requires_fuse, running_pfsemu

from tools.harness.nodes import rendezvous_group

pytestmark = [pytest.mark.mount, pytest.mark.torch, requires_fuse]

TRAIN, VAL, MEAN = 600, 60, 20_000
SEED = 1000  # the sampler's seed; far from the assumed 0 (seed + epoch would otherwise coincide)
WRONG = 5000


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str], int]:
    root = tmp_path_factory.mktemp("pfs-multinode") / "data"
    digests, total = make_source(root, TRAIN, VAL, mean_size=MEAN)
    return root, digests, total


@dataclass
class Sample:
    at: float
    reads: int  # FUSE READ requests the kernel sent this node so far
    next_pushed: int  # files this node pushed into its page cache for the next epoch so far
    epoch: int | None


@dataclass
class Poller:
    """Samples every node's status from outside while the job runs (the job itself is untouched)."""

    mnts: list[Path]
    samples: list[list[Sample]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> Poller:
        self.samples = [[] for _ in self.mnts]
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            for k, mnt in enumerate(self.mnts):
                doc = status(mnt)
                self.samples[k].append(
                    Sample(
                        time.time(),
                        int(doc["reads"]["reads"]),
                        int(doc["prefetch"]["staging"]["next_epoch"]["pushed"]),
                        (doc.get("cursor") or {}).get("epoch"),
                    )
                )
            time.sleep(0.05)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def last_before(self, k: int, t: float) -> Sample:
        before = [s for s in self.samples[k] if s.at < t]
        assert before, f"no status sample of node {k} before {t}"
        return before[-1]


@dataclass
class Outcome:
    results: list[dict[str, Any]]
    docs: list[dict[str, Any]]
    pfs_bytes: int
    twice: list[str]  # files the PFS served more than their size
    poller: Poller


def run_job(
    source: tuple[Path, dict[str, str], int], work: Path, job: Job, written: int | None, tier_share: float
) -> Outcome:
    """The job on two nodes; ``written``: the seed written to the mount before it starts (None: none)."""
    root, digests, total = source
    with (
        running_pfsemu(root) as emu,
        rendezvous_group(emu.mountpoint, work, job, tier_bytes=int(total * tier_share), n=2) as mnts,
    ):
        if written is not None:
            write_seed(mnts[0], written)  # written on one node, planned on both
            for mnt in mnts:
                wait_plan(mnt, written)
        with Poller(mnts) as poller:
            results = run_readers(mnts, job, digests, work / "run")
        docs = [status(m) for m in mnts]
        stats = emu.counters(files=True)
    sizes = {rel: (root / rel).stat().st_size for rel in digests}
    twice = sorted(rel for rel, c in stats.files.items() if rel in sizes and c.bytes > sizes[rel])
    return Outcome(results, docs, stats.bytes, twice, poller)


def peer_evidence(docs: list[dict[str, Any]]) -> str:
    """What each node's status says of its peers, for a failure message: a node reads the PFS itself
    when its peer did not answer within peers.timeout (or was marked down), and asks the holders of
    earlier regimes before that (held asks, hits).  Evidence for reading a failure, never a pass."""
    parts = []
    for k, d in enumerate(docs):
        g = d["group"]
        links = [
            f"{m['label']}: timeouts {m['timeouts']}, down {m['times_down']}x, refused while down "
            f"{m['refused_down']}, slowest answer {m['max_seconds']}s"
            for m in g.get("members", [])
            if m.get("state") != "self"
        ]
        seed = d.get("seed") or {}
        parts.append(
            f"node {k}: held asks {g.get('held_asks')}, hits {g.get('held_hits')}; seed {seed.get('value')} "
            f"({seed.get('origin')}); " + "; ".join(links)
        )
    return " | ".join(parts)


def check_bytes(out: Outcome, total: int) -> None:
    assert all(not r["bad"] for r in out.results), [r["bad"][:3] for r in out.results]
    assert all(r["samples"] > 0 for r in out.results)
    ratio = out.pfs_bytes / total
    assert ratio <= 1.05, (
        f"PFS served {ratio:.3f}x the dataset; read more than once: {out.twice[:10]}; {peer_evidence(out.docs)}"
    )


def new_next_epoch(job: Job, rank: int, epoch: int) -> set[int]:
    """Training indices ``rank`` reads in ``epoch`` + 1 and not in ``epoch``, by torch's own sampler."""
    from indices import Indices
    from torch.utils.data import DistributedSampler

    def read(e: int) -> set[int]:
        s: Any = DistributedSampler(Indices(TRAIN), num_replicas=job.world_size, rank=rank, seed=job.seed)
        s.set_epoch(e)
        return set(s)

    return read(epoch + 1) - read(epoch)


@pytest.mark.parametrize(
    ("case", "written"),
    [
        ("right seed", SEED),
        ("wrong seed", WRONG),
        ("no seed", None),
    ],
    ids=lambda x: str(x),
)
def test_the_pfs_serves_each_file_once_whatever_the_seed(
    tmp_path: Path, source: tuple[Path, dict[str, str], int], case: str, written: int | None
) -> None:
    """Tiers of 0.75x the dataset per node (1.5x in the group): without a trusted plan neither node
    could keep the dataset alone, and each file still comes from the PFS once."""
    job = Job(world_size=2, epochs=3, batch_size=16, num_workers=2, seed=SEED)
    out = run_job(source, tmp_path, job, written, tier_share=0.75)
    modes = [d["prefetch"]["mode"] for d in out.docs]
    print(f"{case}: PFS {out.pfs_bytes / source[2]:.3f}x, modes {modes}, read twice {len(out.twice)}")
    check_bytes(out, source[2])
    # Stricter than the bytes bound: a change of regime (a wrong seed refuted, the right one found)
    # used to cost a second read of 0.3-3.6% of the files, within 1.05x.
    assert not out.twice, (
        f"{len(out.twice)} files read from the PFS more than once, e.g. {out.twice[:10]}; {peer_evidence(out.docs)}"
    )
    if written == SEED:
        assert modes == ["predicting", "predicting"], modes
    else:
        # The rule, not a plan, decided -- until the seed search found the sampler's seed from the
        # opens (seerfs-control(7), SEED DISCOVERY; found as seed + epoch when first seen in a later epoch),
        # which the group then follows like a written one: the PFS bound above holds either way.
        for d, mode in zip(out.docs, modes, strict=True):
            seed = d.get("seed") or {}
            found = seed.get("origin") in ("discovered", "peer") and seed.get("value") in range(SEED, SEED + job.epochs)
            assert mode != "predicting" or found, (modes, seed)
        assert all(int(d["reads"]["by_source"]["peer"]["files"]) > 0 for d in out.docs)


def test_each_node_stages_the_next_epochs_files_from_its_peer_before_that_epoch(
    tmp_path: Path, source: tuple[Path, dict[str, str], int]
) -> None:
    job = Job(world_size=2, epochs=3, batch_size=16, num_workers=2, seed=SEED, status_counts=True)
    out = run_job(source, tmp_path, job, SEED, tier_share=2.2)
    check_bytes(out, source[2])
    for rank, result in enumerate(out.results):  # rank k reads through node k's mount
        new = new_next_epoch(job, rank, 0)
        # Counted by the rank itself as each epoch starts (a poller's last sample before that moment
        # can predate the end of epoch 0's validation pass).
        c1, c2 = (result["epochs"][e]["counts_before"] for e in (1, 2))
        opens, local = c2["opens"] - c1["opens"], c2["local"] - c1["local"]
        pushed = out.poller.last_before(rank, result["epochs"][1]["start"]).next_pushed
        print(
            f"node {rank}: {opens - local} of {opens} opens in epoch 1 not served locally ({len(new)} files new "
            f"to the node then; {pushed} pushed from the peer before it began, the rest in its memory tier)"
        )
        # Only what the other node reached in the last moments of epoch 0 may still be missing.
        assert opens - local <= 0.1 * len(new), (opens, local, len(new))


@pytest.fixture(autouse=True)
def _no_leftover_group(tmp_path: Path) -> Iterator[None]:
    yield
    from mounting import fuse_mounts

    assert fuse_mounts(tmp_path) == []
