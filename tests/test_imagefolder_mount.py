"""Unchanged torchvision ImageFolder over the mount sees exactly what it sees on the source."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from mounting import mounted
from trees import tricky_tree

from tools.harness import torchvision_cpu

pytestmark = [pytest.mark.mount, pytest.mark.torch]


def test_imagefolder_same_classes_samples_labels_and_bytes(tmp_path: Path, mountpoint: Path, cache_dir: Path) -> None:
    src = tricky_tree(tmp_path / "src", big_mb=2)
    (src / "dog" / "dangling.jpg").unlink()  # ImageFolder lists it, but its loader could not open it
    tv = torchvision_cpu.load()

    def raw(path: str) -> bytes:
        with open(path, "rb") as fh:
            return fh.read()

    with mounted(src, mountpoint, cache_dir=cache_dir):
        direct = tv.datasets.ImageFolder(str(src), loader=raw, allow_empty=True)
        through = tv.datasets.ImageFolder(str(mountpoint), loader=raw, allow_empty=True)
        assert ".control" not in through.classes
        assert through.classes == direct.classes
        assert through.class_to_idx == direct.class_to_idx
        rebased = [(os.path.relpath(p, mountpoint), t) for p, t in through.samples]
        assert rebased == [(os.path.relpath(p, src), t) for p, t in direct.samples]
        assert len(through) > 10
        for i in range(len(direct)):
            assert through[i] == direct[i]
