"""Ways to damage what seerfs keeps on disk: cached plans, directory-tier copies, index files."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np


def plan_dirs(cache_dir: Path) -> list[Path]:
    """Every cached plan under ``cache_dir/plans`` (a directory holding plan.json)."""
    return sorted(p.parent for p in (cache_dir / "plans").rglob("plan.json"))


def shift_plan_column(plan_dir: Path, column: str = "obj_entry", by: int = 1) -> None:
    """Rotate one saved column of a plan by ``by`` places, keeping dtype and shape (so it still
    loads): what a bit of on-disk damage or a half-replaced file can leave."""
    path = plan_dir / f"{column}.npy"
    arr = np.load(path)
    np.save(path, np.roll(arr, by))


def flip_byte(path: Path, offset: int = 0) -> None:
    with open(path, "r+b") as fh:
        fh.seek(offset)
        b = fh.read(1)
        fh.seek(offset)
        fh.write(bytes([b[0] ^ 0xFF]))


def truncate(path: Path, size: int) -> None:
    os.truncate(path, size)


def swap(a: Path, b: Path) -> None:
    tmp = a.with_name(a.name + ".swap")
    os.rename(a, tmp)
    os.rename(b, a)
    os.rename(tmp, b)


def replace_with_symlink(path: Path, target: Path) -> None:
    path.unlink()
    os.symlink(target, path)


def replace_with_fifo(path: Path) -> None:
    path.unlink()
    os.mkfifo(path)


def release_fifo(path: Path) -> bool:
    """Unblock whoever waits in open() on the FIFO at ``path`` (opens and closes the write end);
    False when nobody was waiting."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
    except OSError:
        return False
    os.close(fd)
    return True


def scribble(path: Path, offset: int | None = None, length: int = 64) -> None:
    """Overwrite ``length`` bytes in the middle of a file (or at ``offset``) with 0xA5: a torn or
    bit-rotted snapshot or index that still has its name and size."""
    size = path.stat().st_size
    at = size // 2 if offset is None else offset
    with open(path, "r+b") as fh:
        fh.seek(at)
        fh.write(b"\xa5" * min(length, max(0, size - at)))


def snapshot_files(cache_dir: Path) -> list[Path]:
    return sorted((cache_dir / "snapshots").glob("*.npz"))


def index_file(tier_dir: Path) -> Path:
    return tier_dir / "seerfs-index.npz"
