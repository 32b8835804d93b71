"""Real-mount helpers for tests (shared with the benchmarks, see tools.mounts)."""

from fusefs import mountinfo
from tools.mounts import force_unmount, is_mounted, mounted, seerfs, status, wait_for

__all__ = ["force_unmount", "fuse_mounts", "is_mounted", "mounted", "seerfs", "status", "wait_for"]


def fuse_mounts() -> list[str]:
    """Mountpoints of every FUSE filesystem mounted now: a test compares them to prove it left none behind."""
    return [m.mountpoint for m in mountinfo.mounts() if m.fstype.startswith("fuse")]
