"""Every user mistake is one line on stderr with its documented exit code, never a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest
from mounting import mounted, seerfs


def one_line_error(res: object, code: int, *fragments: str) -> None:
    stderr = res.stderr  # type: ignore[attr-defined]
    assert res.returncode == code, (res.returncode, stderr)  # type: ignore[attr-defined]
    assert "Traceback" not in stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    for frag in fragments:
        assert frag in lines[0], lines[0]


def test_missing_source(tmp_path: Path, mountpoint: Path) -> None:
    one_line_error(seerfs("mount", str(tmp_path / "nope"), str(mountpoint)), 4, "no such directory")


def test_source_is_a_file(tmp_path: Path, mountpoint: Path) -> None:
    (tmp_path / "f").write_text("x")
    one_line_error(seerfs("mount", str(tmp_path / "f"), str(mountpoint)), 4, "not a directory")


def test_mountpoint_not_empty(tmp_path: Path, mountpoint: Path) -> None:
    (mountpoint / "x").write_text("x")
    one_line_error(seerfs("mount", str(tmp_path), str(mountpoint)), 5, "not empty")


def test_missing_mountpoint(tmp_path: Path) -> None:
    one_line_error(seerfs("mount", str(tmp_path), str(tmp_path / "absent")), 5, "no such directory")


def test_bad_config_names_the_key(tmp_path: Path, mountpoint: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("job:\n  world_size: two\n")
    one_line_error(seerfs("mount", str(tmp_path), str(mountpoint), "-c", str(cfg)), 3, "job.world_size", "an integer")
    cfg.write_text("tiers:\n  - kind: memory\n    bytez: 1G\n")
    one_line_error(seerfs("mount", str(tmp_path), str(mountpoint), "-c", str(cfg)), 3, "tiers.0.bytez", "unknown key")
    one_line_error(seerfs("mount", str(tmp_path), str(mountpoint), "-o", "job.epochs=-1"), 3, "job.epochs")
    one_line_error(
        seerfs("mount", str(tmp_path), str(mountpoint), "-c", str(tmp_path / "none.yaml")),
        3,
        "cannot read config",
    )


@pytest.mark.mount
def test_already_mounted(tmp_path: Path, mountpoint: Path, cache_dir: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    with mounted(src, mountpoint, cache_dir=cache_dir):
        one_line_error(seerfs("mount", str(src), str(mountpoint)), 5, "already mounted", "seerfs umount")


def test_umount_not_mounted(mountpoint: Path) -> None:
    one_line_error(seerfs("umount", str(mountpoint)), 9, "not mounted")


def test_status_and_wait_not_mounted(mountpoint: Path) -> None:
    one_line_error(seerfs("status", str(mountpoint)), 9, "not a seerfs mount")
    one_line_error(seerfs("wait", str(mountpoint), "--timeout", "0.3"), 7, "not answering")


def test_generic_mount_options_are_ignored_but_typos_are_not(tmp_path: Path) -> None:
    res = seerfs("config", "-o", "rw,nodev,nosuid,noauto,_netdev,job.epochs=4")
    assert res.returncode == 0 and "epochs: 4" in res.stdout
    one_line_error(seerfs("config", "-o", "nodevv"), 3, "nodevv")
