"""``seerfs plan``: the planner from the command line, its text and JSON output, its one-line errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from mounting import mounted, status, wait_for
from pfsemu_fixture import requires_fuse

from fusefs.cli.main import main

YAML = """\
cache_dir: {cache}
datasets:
  - root: train
  - root: val
    follows: train
    sampler: {{shuffle: false}}
job: {{world_size: 8, ranks_per_node: 2, epochs: 4, batch_size: 3}}
tiers:
  - {{kind: memory, bytes: 30000}}
  - {{kind: directory, path: {cache}/tier, bytes: 50000}}
"""


@pytest.fixture
def setup(tmp_path: Path) -> tuple[Path, Path]:
    src = tmp_path / "src"
    for split, n in (("train", 25), ("val", 4)):
        for c in range(3):
            d = src / split / f"c{c}"
            d.mkdir(parents=True)
            for i in range(n):
                (d / f"{i}.jpg").write_bytes(bytes(100 + 37 * i))
    cfg = tmp_path / "seerfs.yaml"
    cfg.write_text(YAML.format(cache=tmp_path / "cache"))
    return src, cfg


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["plan", *argv])
    out, err = capsys.readouterr()
    return code, out, err


@requires_fuse
def test_json_digest_is_the_digest_a_live_daemon_reports(
    setup: tuple[Path, Path], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """With a memory and a directory tier, ``seerfs plan`` must plan what a mounted daemon plans.

    The daemon gives the staging window its share of the memory tier before planning; a plan
    computed from the raw config has other tier bytes and a digest no daemon ever reports.
    """
    src, cfg = setup
    code, out, err = run(capsys, str(src), "-c", str(cfg), "--seed", "7", "--json")
    assert code == 0 and err == ""
    s: dict[str, Any] = json.loads(out)
    assert s["seed"] == 7 and s["source"] == str(src)
    with mounted(src, tmp_path / "mnt", "-c", str(cfg)) as mp:
        (mp / ".control" / "seed").write_text("7\n")
        plan = wait_for(
            lambda: (p := status(mp)["plan"])["state"] == "ready" and p["seed"] == 7 and p,
            timeout=60,
            what="the daemon's plan for seed 7",
        )
    assert s["digest"] == plan["digest"]
    assert [n["node"] for n in s["per_node"]] == [0, 1, 2, 3]
    for n in s["per_node"]:
        assert n["tier_bytes"][0] <= 30000 and n["tier_bytes"][1] <= 50000
        assert set(n["first_epoch"]["share"]) == {"local", "peer", "pfs"}
    assert s["coverage"]["read_objects"] == 3 * 25 + 3 * 4
    assert s["pfs_bytes_job"] <= s["pfs_bytes_without_cache"]


def test_text_shows_one_row_per_node_and_node_selects_one(
    setup: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    src, cfg = setup
    code, out, _ = run(capsys, str(src), "-c", str(cfg))
    assert code == 0
    lines = out.splitlines()
    assert lines[0].startswith("plan ") and "4 nodes x 2 ranks" in lines[0]
    assert any(line.startswith("PFS reads over the job") for line in lines)
    head = next(i for i, line in enumerate(lines) if line.split()[:1] == ["node"])
    rows = [line.split() for line in lines[head + 1 :]]
    assert [r[0] for r in rows] == ["0", "1", "2", "3"]
    _, out, _ = run(capsys, str(src), "-c", str(cfg), "--node", "2", "--json")
    assert [n["node"] for n in json.loads(out)["per_node"]] == [2]


def test_a_large_jobs_per_node_plan_reports_the_node_asked_for(
    setup: tuple[Path, Path], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Above DENSE_CELLS a plan holds one node's part: --node makes it for that node, and the digest
    (owners and inputs) is the same whichever node asks."""
    from placement import plan as P

    src, cfg = setup
    monkeypatch.setattr(P, "DENSE_CELLS", 1)
    digests = set()
    for node in ("1", "3"):
        code, out, _ = run(capsys, str(src), "-c", str(cfg), "--node", node, "--json")
        summary = json.loads(out)
        assert code == 0 and [n["node"] for n in summary["per_node"]] == [int(node)]
        digests.add(summary["digest"])
    assert len(digests) == 1


def test_a_saved_snapshot_plans_like_its_directory(
    setup: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    src, cfg = setup
    _, out, _ = run(capsys, str(src), "-c", str(cfg), "--json")  # persists the snapshot in cache_dir
    snapshot = next((cfg.parent / "cache" / "snapshots").glob("*.npz"))
    _, again, _ = run(capsys, str(snapshot), "-c", str(cfg), "--json")
    assert json.loads(again)["digest"] == json.loads(out)["digest"]


def test_list_layout_and_order_files_are_read_relative_to_the_source(
    setup: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    src, cfg = setup
    (src / "train.txt").write_text("c0/1.jpg\nc2/0.jpg\nc1/3.jpg\n")
    (src / "order.txt").write_text("2\n0\n1\n2\n")
    extra = "datasets.0.layout=list,datasets.0.list_file=train.txt,datasets.0.sampler.kind=list,"
    extra += "datasets.0.sampler.order_file=order.txt"
    code, out, err = run(capsys, str(src), "-c", str(cfg), "-o", extra, "--json")
    assert code == 0, err
    s = json.loads(out)
    assert s["datasets"][0]["files"] == 3 and s["datasets"][0]["layout"] == "list"
    (src / "order.txt").write_text("2\nx\n")
    code, _, err = run(capsys, str(src), "-c", str(cfg), "-o", extra)
    assert (
        code == 3
        and err.strip() == "seerfs: datasets.0.sampler.order_file: expected one integer dataset index per line"
    )


@pytest.mark.parametrize(
    ("argv", "code", "message"),
    [
        (["{missing}"], 4, "No such file or directory"),
        (
            ["{src}", "-o", "datasets.0.sampler.kind=random,datasets.0.sampler.persistent_workers=true"],
            3,
            "cannot plan",
        ),
        (
            ["{src}", "-o", "datasets.0.layout=list,datasets.0.list_file=nope.txt"],
            3,
            "datasets.0.list_file: cannot read",
        ),
        (["{src}", "--node", "4"], 2, "--node: expected 0..3, got 4"),
        (["{cfg}"], 4, "not a seerfs snapshot"),
    ],
)
def test_user_errors_are_one_line_with_the_documented_code(
    setup: tuple[Path, Path], capsys: pytest.CaptureFixture[str], argv: list[str], code: int, message: str
) -> None:
    src, cfg = setup
    args = [a.format(src=src, cfg=cfg, missing=src / "missing") for a in argv]
    got, out, err = run(capsys, *args, "-c", str(cfg))
    assert got == code and out == ""
    assert len(err.strip().splitlines()) == 1 and message in err and err.startswith("seerfs: ")
