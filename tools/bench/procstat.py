"""CPU time of a process from /proc, for the benchmarks' CPU columns (one reading of the format)."""

from __future__ import annotations

import os
from pathlib import Path

CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds_of(stat: str | os.PathLike[str]) -> float:
    """utime + stime (fields 14 and 15) of a /proc/.../stat file: every thread for a process's own."""
    text = Path(stat).read_text()
    fields = text[text.rindex(")") + 2 :].split()  # the name may hold spaces; fields start at 3
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def process_cpu(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (0 once it is gone, or with no /proc)."""
    try:
        return cpu_seconds_of(f"/proc/{pid}/stat")
    except (OSError, ValueError):
        return 0.0
