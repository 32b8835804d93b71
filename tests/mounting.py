"""Real-mount helpers for tests (shared with the benchmarks, see tools.mounts)."""

from tools.mounts import force_unmount, is_mounted, mounted, seerfs, status, wait_for

__all__ = ["force_unmount", "is_mounted", "mounted", "seerfs", "status", "wait_for"]
