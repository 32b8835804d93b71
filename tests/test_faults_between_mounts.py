"""Cached state damaged between two mounts: a cached plan, the persisted snapshot, a directory tier's
index and its copies, each with a flipped bit, cut short, or with one column shifted (a file that
still loads, with the right dtype and shape: only a digest over the content can tell).

Every case mounts twice over the same source.  The first mount plans, persists its snapshot and
fills a directory tier; the damage is done on disk with no daemon running; the second mount must
notice (status says what it refused and why), start that part cold, and serve only the source's
bytes (compared with a manifest read from the source directly).
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from e2e import wait_plan
from faults import damage
from faults.manifest import Manifest, check_mount
from mounting import mounted, status, wait_for
from pfsemu_fixture import requires_fuse

pytestmark = [pytest.mark.mount, pytest.mark.faults, requires_fuse]

FILES = 30
SIZE = 6000  # one size for all: a copy or row of another file passes any size check


def flip_middle(path: Path) -> None:
    """Invert one byte in the middle (past any header): one bit-rotted sector."""
    damage.flip_byte(path, path.stat().st_size // 2)


def truncate_half(path: Path) -> None:
    damage.truncate(path, path.stat().st_size // 2)


def shift_npz_column(path: Path, column: str) -> None:
    """Rotate one member of an .npz by one place and write it back whole: it loads like before."""
    with np.load(path) as data:
        arrays: dict[str, Any] = {k: data[k] for k in data.files}
    arrays[column] = np.roll(arrays[column], 1)
    with open(path, "wb") as fh:
        np.savez(fh, **arrays)


def make_tree(tmp_path: Path) -> tuple[Path, Path, Manifest]:
    src = tmp_path / "src"
    rng = random.Random(7)
    for i in range(FILES):
        d = src / "train" / f"c{i % 3}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"f{i:03d}.jpg").write_bytes(rng.randbytes(SIZE))
    cfg = tmp_path / "seerfs.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "cache_dir": str(tmp_path / "cache"),
                "datasets": [{"root": "train"}],
                "job": {"world_size": 2, "ranks_per_node": 1, "epochs": 2, "batch_size": 4},
                "tiers": [{"kind": "directory", "path": str(tmp_path / "tier"), "bytes": "64MiB"}],
                "prefetch": {"lookahead_bytes": "4KiB"},
            }
        )
    )
    return src, cfg, Manifest.of(src)


def first_mount(src: Path, mnt: Path, cfg: Path, manifest: Manifest) -> dict[str, Any]:
    """Plan (seed 0, assumed at mount), persist the snapshot, and fill the tier with every file."""
    with mounted(src, mnt, "-c", str(cfg)) as m:
        doc = wait_plan(m, 0)
        report = check_mount(m, manifest)
        assert not report.wrong and not report.errors, report.summary()
        wait_for(lambda: status(m)["tiers"][0]["files"] >= FILES, timeout=30, what="every file in the tier")
    return doc


def plan_column(cache: Path) -> Path:
    [plan_dir] = damage.plan_dirs(cache)
    return plan_dir / "obj_entry.npy"


def damage_plan(cache: Path, tier: Path, how: str) -> Path:
    column = plan_column(cache)
    if how == "flip":
        damage.flip_byte(column, column.stat().st_size - 2)  # in the data, past the .npy header
    elif how == "truncate":
        truncate_half(column)
    else:
        damage.shift_plan_column(column.parent, "obj_entry", 1)
    return column


def damage_snapshot(cache: Path, tier: Path, how: str) -> Path:
    [snap] = damage.snapshot_files(cache)
    if how == "flip":
        flip_middle(snap)
    elif how == "truncate":
        truncate_half(snap)
    else:
        shift_npz_column(snap, "ino")
    return snap


def damage_index(cache: Path, tier: Path, how: str) -> Path:
    index = damage.index_file(tier)
    if how == "flip":
        flip_middle(index)
    elif how == "truncate":
        truncate_half(index)
    else:
        with np.load(index) as data:
            columns = [k for k in data.files if k != "meta" and data[k].size > 1]
        assert "entry" in columns, columns
        shift_npz_column(index, "entry")  # each copy's record now names its neighbour's entry
    return index


TARGETS = {"plan": damage_plan, "snapshot": damage_snapshot, "index": damage_index}
CI_CASES = {("plan", "truncate"), ("snapshot", "flip"), ("index", "shift")}


# One case per target runs in CI (each is two mounts); the rest with the slow tests.
CASES = [
    pytest.param(what, how, marks=() if (what, how) in CI_CASES else pytest.mark.slow, id=f"{what}-{how}")
    for what in sorted(TARGETS)
    for how in ("flip", "truncate", "shift")
]


@pytest.mark.parametrize(("what", "how"), CASES)
def test_cached_state_damaged_between_mounts_is_refused_with_its_reason_and_never_serves_a_wrong_byte(
    tmp_path: Path, what: str, how: str
) -> None:
    src, cfg, manifest = make_tree(tmp_path)
    mnt = tmp_path / "mnt"
    first = first_mount(src, mnt, cfg, manifest)
    assert not first["plan"]["reused"] and first["tiers"][0]["files"] >= 0
    target = TARGETS[what](tmp_path / "cache", tmp_path / "tier", how)
    damaged = target.read_bytes() if target.exists() else b""
    with mounted(src, mnt, "-c", str(cfg)) as m:
        doc = wait_plan(m, 0)  # the daemon looks up its cached plan for the seed it assumes at mount
        report = check_mount(m, manifest)
        again = check_mount(m, manifest)  # and once more: whatever was cached from the first pass
        doc = status(m) if what != "plan" else doc
    assert not report.wrong and not report.errors, f"{what} {how}: {report.summary()}"
    assert not again.wrong and not again.errors, f"{what} {how}, second pass: {again.summary()}"
    if what == "plan":
        plan = doc["plan"]
        assert not plan["reused"], f"the damaged plan was used: {plan}"
        assert plan["cache_refused"], f"status does not say the cached plan was refused: {plan}"
        assert plan["digest"] == first["plan"]["digest"], "planned again, the same plan as before the damage"
        assert target.read_bytes() != damaged, "the damaged plan was left in place"
    elif what == "snapshot":
        snap = doc["snapshot"]
        assert not snap["reused"], f"the damaged snapshot was used: {snap}"
        assert "refused" in snap["reason"], f"status does not say why the snapshot was not reused: {snap}"
    else:
        opened = doc["tiers"][0]["opened"]
        assert not opened["warm"], f"the damaged index was used: {opened}"
        assert opened["reason"], f"status does not say why the tier started cold: {opened}"
    print(f"{what} {how}: {json.dumps(refusal(doc, what))}")


def refusal(doc: dict[str, Any], what: str) -> Any:
    if what == "plan":
        return doc["plan"]["cache_refused"]
    if what == "snapshot":
        return doc["snapshot"]["reason"]
    return doc["tiers"][0]["opened"]


@pytest.mark.parametrize(
    "how",
    [pytest.param("flip", marks=pytest.mark.slow), "truncate", "swap", pytest.param("shift", marks=pytest.mark.slow)],
)
def test_tier_copies_damaged_between_mounts_are_refused_when_read_and_never_served(tmp_path: Path, how: str) -> None:
    """The index is intact and the tier starts warm; the copies themselves were damaged (``shift``:
    a copy's bytes moved by one, as a misdirected write would leave them).  Each is refused when
    looked up (status: corrupt), the reader gets the source's bytes, and the rest stay warm."""
    src, cfg, manifest = make_tree(tmp_path)
    mnt = tmp_path / "mnt"
    first_mount(src, mnt, cfg, manifest)
    copies = sorted(p for p in (tmp_path / "tier").rglob("*") if p.is_file() and not p.name.startswith("seerfs-"))
    assert len(copies) >= FILES, copies[:5]
    victims = copies[:4]
    if how == "flip":
        for p in victims:
            flip_middle(p)
    elif how == "truncate":
        for p in victims:
            truncate_half(p)
    elif how == "swap":
        damage.swap(victims[0], victims[1])
        damage.swap(victims[2], victims[3])
    else:
        for p in victims:
            data = p.read_bytes()
            p.write_bytes(data[-1:] + data[:-1])
            os.utime(p, ns=(p.stat().st_atime_ns, p.stat().st_mtime_ns))
    with mounted(src, mnt, "-c", str(cfg)) as m:
        opened = status(m)["tiers"][0]["opened"]
        report = check_mount(m, manifest)
        tier = status(m)["tiers"][0]
    assert not report.wrong and not report.errors, f"{how}: {report.summary()}"
    assert opened["warm"], f"an intact index should keep the tier warm: {opened}"
    # A copy of the wrong size is removed when the tier opens; one of the right size when it is read.
    refused = int(tier["corrupt"]) + int(opened["removed_files"])
    assert refused >= len(victims), f"{how}: the damaged copies were not all refused: {opened}, {tier}"
    assert opened["kept_files"] >= FILES - len(victims), f"intact copies were thrown away: {opened}"
    print(f"copies {how}: corrupt {tier['corrupt']}, removed at open {opened['removed_files']}")
