"""What the source holds, read from the source directly (never through seerfs), and a checker
that reads every file through a mount and compares."""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass, field
from pathlib import Path

import xxhash


@dataclass(frozen=True)
class Manifest:
    """Size and xxh3_64 of every regular file under ``root`` (relative path -> (size, digest))."""

    root: Path
    files: dict[str, tuple[int, int]]

    @classmethod
    def of(cls, root: Path) -> Manifest:
        files: dict[str, tuple[int, int]] = {}
        for dirpath, _dirs, names in os.walk(root):
            for name in names:
                path = os.path.join(dirpath, name)
                if os.path.islink(path) or not os.path.isfile(path):
                    continue
                data = Path(path).read_bytes()
                files[os.path.relpath(path, root)] = (len(data), xxhash.xxh3_64_intdigest(data))
        return cls(root, files)

    @property
    def total_bytes(self) -> int:
        return sum(size for size, _ in self.files.values())


@dataclass
class CheckReport:
    """The outcome of reading files through a mount: right, wrong (other bytes) or failed (errno)."""

    ok: list[str] = field(default_factory=list)
    wrong: list[str] = field(default_factory=list)
    wrong_bytes: int = 0  # bytes served in files whose content was not the source's
    errors: dict[str, str] = field(default_factory=dict)  # path -> errno name

    def summary(self) -> str:
        shown = ", ".join(self.wrong[:5])
        errs = ", ".join(f"{p}: {e}" for p, e in list(self.errors.items())[:5])
        return (
            f"{len(self.ok)} right, {len(self.wrong)} wrong ({self.wrong_bytes} bytes: {shown}), "
            f"{len(self.errors)} failed ({errs})"
        )


def read_all(path: Path) -> bytes:
    with open(path, "rb") as fh:
        return fh.read()


def check_mount(mnt: Path, manifest: Manifest, paths: list[str] | None = None) -> CheckReport:
    """Read ``paths`` (default: every file of the manifest) through ``mnt`` and compare."""
    report = CheckReport()
    for rel in sorted(manifest.files) if paths is None else paths:
        size, digest = manifest.files[rel]
        try:
            data = read_all(mnt / rel)
        except OSError as exc:
            report.errors[rel] = errno.errorcode.get(exc.errno or 0, str(exc))
            continue
        if len(data) == size and xxhash.xxh3_64_intdigest(data) == digest:
            report.ok.append(rel)
        else:
            report.wrong.append(rel)
            report.wrong_bytes += len(data)
    return report


def equal_size_tree(root: Path, classes: int, per_class: int, size: int, seed: int = 1) -> Manifest:
    """An ImageFolder tree of files that all have one size (fixed-size records, as in many datasets):
    a size check cannot tell one file's bytes from another's, only content checks can."""
    import random

    rng = random.Random(seed)
    for c in range(classes):
        d = root / "train" / f"class{c:02d}"
        d.mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            (d / f"img{i:04d}.jpg").write_bytes(rng.randbytes(size))
    return Manifest.of(root)
