"""A real mount's status document has exactly the fields its types document, and the Prometheus
endpoint generated from the same types mirrors it: counters never go back while a real torch job
reads, and once the reads stop every metric equals the status field it mirrors.

Independent checks: the opens counted against what the real samplers open (computed with torch),
the PFS bytes against the emulator's own counter, the bytes each reader got against the source.
"""

from __future__ import annotations

import itertools
import threading
import time
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
from e2e import Job, expected_opens, make_source, run_readers, seerfs_config, wait_plan, write_seed
from mounting import mounted, status, wait_for
from pfsemu_fixture import requires_fuse, running_pfsemu
from prometheus_client.parser import text_string_to_metric_families

from fusefs.cluster.peergroup import PeeredGroupStatus
from fusefs.daemon import schema
from fusefs.daemon.status import StatusDocument
from tools.harness.nodes import rendezvous_group

pytestmark = [pytest.mark.mount]

TRAIN, VAL = 160, 32

Key = tuple[str, frozenset[tuple[str, str]]]


def scrape(url: str) -> dict[Key, float]:
    """Every series the endpoint serves now: (sample name, labels) -> value."""
    with urllib.request.urlopen(url, timeout=30) as res:
        text = res.read().decode()
    return {
        (s.name, frozenset(s.labels.items())): float(s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def counters(series: Mapping[Key, float]) -> dict[Key, float]:
    return {k: v for k, v in series.items() if k[0].endswith("_total")}


def mirrored(doc: Mapping[str, Any]) -> dict[Key, tuple[float, str]]:
    """What a document says each series must be, by the naming rules of seerfs-control(7) METRICS:
    counters get _total, an info's strings are labels of NAME_info (value 1), a state set has one
    series per state labelled with its own name (1 for the current state)."""
    specs = schema.metric_specs(StatusDocument)
    out: dict[Key, tuple[float, str]] = {}
    for s in schema.samples(StatusDocument, doc, specs):
        spec, labels = specs[s.metric], dict(s.labels)
        if spec.type == "info":
            assert isinstance(s.value, dict)
            info = {k: v for k, v in s.value.items() if isinstance(v, str)}
            assert len(info) == len(s.value), s.value  # an info's value is its labels: strings only
            out[(f"{spec.name}_info", frozenset({**labels, **info}.items()))] = (1.0, s.path)
        elif spec.type == "stateset":
            assert isinstance(s.value, dict)
            for state, on in s.value.items():
                out[(spec.name, frozenset({**labels, spec.name: str(state)}.items()))] = (float(on), s.path)
        else:
            assert isinstance(s.value, float)
            out[(f"{spec.name}_total" if spec.type == "counter" else spec.name, frozenset(labels.items()))] = (
                s.value,
                s.path,
            )
    return out


def one(series: Mapping[Key, float], name: str, **labels: str) -> float:
    return series[(name, frozenset(labels.items()))]


class Background:
    """The job's readers in a thread, so the test can scrape while they read."""

    def __init__(self, *args: Any) -> None:
        self.out: list[dict[str, Any]] = []
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=args, daemon=True)

    def _run(self, *args: Any) -> None:
        try:
            self.out = run_readers(*args)
        except BaseException as exc:  # re-raised by result()
            self.error = exc

    def result(self) -> list[dict[str, Any]]:
        self.thread.join(timeout=300)
        assert not self.thread.is_alive(), "readers did not finish"
        if self.error is not None:
            raise self.error
        return self.out


def settled(mnt: Path) -> Callable[[], bool]:
    """A predicate: the prefetcher has nothing in flight and its counters stood still since the last poll."""
    last: list[Any] = []

    def still() -> bool:
        doc = status(mnt)
        now = (doc["prefetch"]["fetches_inflight"], doc["prefetch"]["fill_fetches"], doc["reads"], doc["tiers"])
        done = bool(last) and now == last[-1] and now[0] == 0
        last.append(now)
        return done

    return still


@requires_fuse
@pytest.mark.torch
def test_a_mounts_status_has_exactly_the_documented_fields_and_the_metrics_mirror_it(tmp_path: Path) -> None:
    t0 = time.monotonic()
    backing = tmp_path / "pfs"
    digests, total = make_source(backing, TRAIN, VAL, mean_size=8000)
    job = Job(world_size=1, epochs=2, batch_size=8, num_workers=0, seed=5, compute_s=0.002)
    with running_pfsemu(backing) as emu:
        cfg = seerfs_config(
            tmp_path / "seerfs.yaml",
            job,
            cache_dir=tmp_path / "cache",
            tiers=[
                {"kind": "memory", "bytes": total // 3 + (4 << 20), "threads": 4},
                {"kind": "directory", "path": str(tmp_path / "ssd"), "bytes": "64MiB", "threads": 2},
            ],
            peers={"discovery": "none"},
            metrics={"enabled": True, "port": 0},
        )
        emu.reset()
        with mounted(emu.mountpoint, tmp_path / "mnt", "-c", str(cfg)) as mnt:
            write_seed(mnt, job.seed)
            wait_plan(mnt, job.seed)
            url = status(mnt)["metrics"]["url"]
            assert url is not None and url.startswith("http://127.0.0.1:")
            print(f"mounted and planned at {time.monotonic() - t0:.1f}s")

            # During the job: counters never go back, and the scrapes saw the job move.
            readers = Background(mnt, job, digests, tmp_path / "run")
            readers.thread.start()
            seen = [scrape(url)]
            while readers.thread.is_alive():
                seen.append(scrape(url))
                time.sleep(0.02)  # the job reads for about a second: scrapes must catch it
            results = readers.result()
            print(f"job done at {time.monotonic() - t0:.1f}s")
            assert all(not r["bad"] for r in results), "a reader got bytes other than the source's"
            for earlier, later in itertools.pairwise(seen):
                back = {k: (v, later[k]) for k, v in counters(earlier).items() if k in later and later[k] < v}
                assert not back, f"counters went back between two scrapes: {back}"
            opens = [one(s, "seerfs_reads_opens_total") for s in seen]
            assert len({o for o in opens if 0 < o < opens[-1]}) >= 2, f"no scrape caught the job reading: {opens}"

            wait_for(settled(mnt), 30, "the prefetcher to settle after the job")
            print(f"settled at {time.monotonic() - t0:.1f}s")
            # After the reads: the document matches its types exactly ...
            before = status(mnt)
            series = scrape(url)
            after = status(mnt)
            errors = schema.check(before, StatusDocument)
            assert errors == [], "status fields differ from their documentation:\n" + "\n".join(errors)
            kinds = [t["kind"] for t in before["tiers"]]
            assert kinds == ["memory", "directory"] and before["tiers"][1]["journal"] is not None
            assert before["cursor"] is not None and before["group"]["mode"] == "alone"
            assert before["prefetch"]["cursor"] == before["cursor"]

            # ... and each metric is the status field it mirrors (equal where the field stood still
            # between the two reads around the scrape, between them where it moved: uptime, rounds).
            first, second = mirrored(before), mirrored(after)
            assert set(series) == set(first) == set(second), set(series) ^ set(first)
            moved = []
            for key, value in series.items():
                (v1, path), (v2, _) = first[key], second[key]
                if v1 == v2:
                    assert value == v1, f"{key[0]} {dict(key[1])} = {value}, status {path} = {v1}"
                else:
                    moved.append(path)
                    assert min(v1, v2) <= value <= max(v1, v2), f"{key[0]}: {value} not within {v1}..{v2} ({path})"
            assert len(moved) < len(series) / 20, f"too much moved to compare: {moved}"
            print(f"{len(seen)} scrapes during the job, {len(series)} series after it; moved: {sorted(set(moved))}")

            # Checked against what did not come from seerfs: torch's samplers and the emulator.
            assert one(series, "seerfs_reads_opens_total") == expected_opens(job, TRAIN, VAL)
            assert one(series, "seerfs_reads_pfs_bytes_total") == emu.counters().bytes
            assert (
                one(series, "seerfs_reads_source_files_total", source="pfs")
                == before["reads"]["by_source"]["pfs"]["files"]
            )
            assert one(series, "seerfs_tier_puts_total", tier="directory:1") == before["tiers"][1]["puts"] > 0
            assert one(series, "seerfs_cursor_hit_ratio") == before["cursor"]["hit_rate"] > 0.9
            assert one(series, "seerfs_plan_state", seerfs_plan_state="ready") == 1.0
            assert one(series, "seerfs_metrics_scrapes_total") >= len(seen)
            print(f"checked at {time.monotonic() - t0:.1f}s")
        print(f"unmounted at {time.monotonic() - t0:.1f}s")
    print(f"emulator stopped at {time.monotonic() - t0:.1f}s")


@requires_fuse
def test_a_two_node_groups_status_has_exactly_the_documented_fields(tmp_path: Path) -> None:
    """The group section with peers (the PeeredGroupStatus variant: members, server, notes) on both
    nodes of a rendezvous group, and each node's metrics show the other up."""
    backing = tmp_path / "pfs"
    make_source(backing, 60, 0, mean_size=4000)
    job = Job(world_size=2, epochs=2, batch_size=4, num_workers=0, seed=3, val=False)
    metrics = {"enabled": True, "port": 0}
    # The reads below go in sorted order, not the sampler's: a seed search would start and change its
    # fields between a status read and a scrape, so it is off here (test_discovery.py covers it).
    off = {"enabled": False}
    with rendezvous_group(backing, tmp_path, job, tier_bytes=1 << 20, n=2, metrics=metrics, seed_discovery=off) as mnts:
        write_seed(mnts[0], job.seed)
        for mnt in mnts:
            wait_plan(mnt, job.seed)
        for path in sorted((mnts[0] / "train").rglob("*"))[:30]:  # real reads: some from the peer
            if path.is_file():
                assert path.read_bytes() == (backing / path.relative_to(mnts[0])).read_bytes()
        wait_for(lambda: all(status(m)["group"]["server"]["requests"] for m in mnts), 20, "notes between the nodes")
        docs = [status(m) for m in mnts]
        for k, doc in enumerate(docs):
            errors = schema.check(doc, StatusDocument) + schema.check(doc["group"], PeeredGroupStatus, "group")
            assert errors == [], f"node {k}: status fields differ from their documentation:\n" + "\n".join(errors)
            states = sorted(m["state"] for m in doc["group"]["members"])
            assert states == ["self", "up"], doc["group"]["members"]
        for k, mnt in enumerate(mnts):
            other = docs[1 - k]["group"]["members"][docs[1 - k]["group"]["me"]]["label"]
            first = set(mirrored(status(mnt)))
            series = scrape(docs[k]["metrics"]["url"])
            second = set(mirrored(status(mnt)))
            assert one(series, "seerfs_group_peer_state", peer=other, seerfs_group_peer_state="up") == 1.0
            assert one(series, "seerfs_group_size") == 2.0
            # A field may turn from null (no series) to a value while the scrape runs: the series are
            # those of the document just before or just after it.
            assert first & second <= set(series) <= first | second, set(series) ^ (first & second)
