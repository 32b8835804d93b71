"""The README's demo: generate a dataset, mount it, read it with unchanged ImageFolder, show status.

Everything happens under one work directory that is removed at the end (``--keep`` leaves it).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tools import torchvision_cpu
from tools.mkdataset import Spec, make_dataset

SEERFS = [sys.executable, "-m", "fusefs"]


def run(*args: str) -> str:
    res = subprocess.run([*SEERFS, *args], capture_output=True, text=True)
    if res.returncode != 0:
        raise SystemExit(f"demo: seerfs {args[0]} failed: {res.stderr.strip()}")
    return res.stdout


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="demo", description="Mount a generated dataset and read it with ImageFolder.")
    p.add_argument("--files", type=int, default=2000, help="training images (default 2000)")
    p.add_argument("--workdir", help="where to put the dataset and mountpoint (default: a temp dir)")
    p.add_argument("--keep", action="store_true", help="keep the work directory")
    a = p.parse_args(argv)

    work = Path(a.workdir or tempfile.mkdtemp(prefix="seerfs-demo-"))
    src, mnt, cache = work / "pfs", work / "mnt", work / "cache"
    mnt.mkdir(parents=True, exist_ok=True)
    print(f"demo: generating {a.files} JPEGs in {src}")
    make_dataset(src, Spec(classes=10, files=a.files, val_files=a.files // 10, jpeg=True, mean_size=20_000))
    t0 = time.monotonic()
    run("mount", str(src), str(mnt), "-o", f"cache_dir={cache}")
    print(f"demo: mounted {src} on {mnt} in {time.monotonic() - t0:.2f}s")
    try:
        (mnt / ".control" / "seed").write_text("0\n")
        tv = torchvision_cpu.load()
        direct = tv.datasets.ImageFolder(str(src / "train"))
        t0 = time.monotonic()
        through = tv.datasets.ImageFolder(str(mnt / "train"))
        scan = time.monotonic() - t0
        same = through.classes == direct.classes and [(os.path.relpath(p, mnt), t) for p, t in through.samples] == [
            (os.path.relpath(p, src), t) for p, t in direct.samples
        ]
        t0 = time.monotonic()
        pixels = 0
        for img, _label in through:
            pixels += img.size[0] * img.size[1]
        read = time.monotonic() - t0
        print(
            f"demo: ImageFolder(mount): {len(through)} samples, {len(through.classes)} classes, "
            f"same as ImageFolder(source): {same}; scan {scan:.2f}s, decoded all in {read:.2f}s"
        )
        print()
        print(run("status", str(mnt)))
    finally:
        run("umount", str(mnt))
        print(f"demo: unmounted {mnt}")
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
