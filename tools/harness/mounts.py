"""Mounting through the real CLI for tests and benchmarks: poll with deadlines, always unmount."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from fusefs.waiting import WaitTimeout, wait_until

SEERFS = [sys.executable, "-m", "fusefs"]


FRONT_ENV = "SEERFS_TEST_FRONT"
"""Set (native or pyfuse3): every ``seerfs mount`` run here serves through that front (``fuse.front``),
unless its own ``-o`` names one; tools/run-tests runs a mount subset on the non-default front so."""


def seerfs(*args: str, check: bool = False, timeout: float = 120, **kw: Any) -> subprocess.CompletedProcess[str]:
    front = os.environ.get(FRONT_ENV)
    if front and args and args[0] == "mount":
        args = ("mount", "-o", f"fuse.front={front}", *args[1:])
    res = subprocess.run([*SEERFS, *args], capture_output=True, text=True, timeout=timeout, **kw)
    if check and res.returncode != 0:
        raise AssertionError(f"seerfs {' '.join(args)} failed ({res.returncode}): {res.stderr}")
    return res


def is_mounted(mountpoint: str | os.PathLike[str]) -> bool:
    target = os.path.abspath(mountpoint)
    with open("/proc/self/mountinfo") as fh:
        return any(line.split()[4] == target for line in fh)


def force_unmount(mountpoint: str | os.PathLike[str]) -> None:
    """Last-resort teardown: lazy unmount whatever is there (dead daemons included)."""
    for _ in range(5):
        if not is_mounted(mountpoint):
            return
        subprocess.run(["fusermount3", "-u", "-z", str(mountpoint)], capture_output=True)


def wait_for(predicate: Callable[[], Any], timeout: float = 20.0, what: str | Callable[[], str] = "condition") -> Any:
    """:func:`fusefs.waiting.wait_until` whose timeout is a test failure (AssertionError), not an error."""
    try:
        return wait_until(predicate, timeout, what)
    except WaitTimeout as exc:
        raise AssertionError(str(exc)) from None


def status(mountpoint: str | os.PathLike[str]) -> dict[str, Any]:
    # Unbuffered: no isatty() ioctl (CPython <= 3.13 asks it of every default-buffered open), so a
    # benchmark's status reads add no IOCTL to the requests it counts per open.
    with open(os.path.join(mountpoint, ".control", "status"), "rb", buffering=0) as fh:
        doc: dict[str, Any] = json.loads(fh.read())
    return doc


@contextlib.contextmanager
def mounted(
    source: str | os.PathLike[str],
    mountpoint: str | os.PathLike[str],
    *extra: str,
    cache_dir: str | os.PathLike[str] | None = None,
) -> Iterator[Path]:
    """``seerfs mount`` (daemonised) for the duration of the block; unmounts in all cases."""
    mp = Path(mountpoint)
    mp.mkdir(parents=True, exist_ok=True)
    args = ["mount", str(source), str(mp), *extra]
    if cache_dir is not None:
        args += ["-o", f"cache_dir={cache_dir}"]
    try:
        seerfs(*args, check=True)
        yield mp
    finally:
        if is_mounted(mp):
            seerfs("umount", str(mp), timeout=60)
        force_unmount(mp)
