"""Real-mount helpers for tests (shared with the benchmarks, see tools.harness.mounts)."""

import os

from fusefs import mountinfo
from tools.harness.mounts import force_unmount, is_mounted, mounted, seerfs, status, wait_for

__all__ = ["force_unmount", "fuse_mounts", "is_mounted", "mounted", "seerfs", "status", "wait_for"]


def fuse_mounts(under: str | os.PathLike[str]) -> list[str]:
    """FUSE mountpoints below ``under`` (a test's own directory): empty after the test proves it left none.

    Only below ``under``: other tests or programs may mount elsewhere on the host at the same time.
    """
    top = os.path.abspath(under).rstrip("/") + "/"
    return [m.mountpoint for m in mountinfo.mounts() if m.fstype.startswith("fuse") and m.mountpoint.startswith(top)]
