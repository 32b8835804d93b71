"""Shared fixtures: an isolated cache dir per test, and a guard that no test leaves a mount behind."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from mounting import force_unmount, is_mounted

pytest_plugins = ["pfsemu_fixture", "slurm_cluster", "wheelhouse"]  # the emulated PFS, a real Slurm cluster, the wheel


@pytest.fixture
def cache_dir(tmp_path: Path) -> Path:
    d = tmp_path / "cache"
    d.mkdir()
    return d


@pytest.fixture
def mountpoint(tmp_path: Path) -> Iterator[Path]:
    mp = tmp_path / "mnt"
    mp.mkdir()
    yield mp
    if is_mounted(mp):
        force_unmount(mp)
        pytest.fail(f"test left {mp} mounted")
