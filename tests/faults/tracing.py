"""strace-based checks of how files are created: the mode a file has from its creating syscall on."""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass
from pathlib import Path

TRACED = "trace=open,openat,creat,mknodat,chmod,fchmod,fchmodat,link,linkat,rename,renameat,renameat2"

_LINE = re.compile(r"^(?P<pid>\d+)\s+(?P<call>\w+)\((?P<args>.*)\)\s+=\s+(?P<result>-?\d+)")


def strace_prefix(out: Path) -> list[str]:
    """``strace`` arguments that follow every child (the daemon forks twice) into ``out``."""
    exe = shutil.which("strace")
    assert exe, "strace not found (tools/setup installs it)"
    return [exe, "-f", "-qq", "-e", TRACED, "-o", str(out)]


@dataclass(frozen=True)
class Call:
    pid: int
    call: str
    args: str
    result: int


def calls(trace: Path) -> list[Call]:
    out = []
    for line in trace.read_text(errors="replace").splitlines():
        m = _LINE.match(line)
        if m:
            out.append(Call(int(m["pid"]), m["call"], m["args"], int(m["result"])))
    return out


_PATH = re.compile(r'"((?:[^"\\]|\\.)*)"')


def creations(trace: Path, directory: Path, name_part: str) -> list[tuple[Call, int | None]]:
    """Successful calls that create a file in ``directory`` whose name contains ``name_part``, with
    the mode they asked for (None when the call carries none)."""
    found = []
    for c in calls(trace):
        m = _PATH.search(c.args)
        if m is None or c.result < 0:
            continue
        path = Path(m.group(1))
        if path.parent != directory or name_part not in path.name:
            continue
        if (c.call in ("open", "openat") and "O_CREAT" in c.args) or c.call == "creat":
            mode = re.search(r",\s*(0[0-7]+)\s*$", c.args)
            found.append((c, int(mode.group(1), 8) if mode else None))
    return found
