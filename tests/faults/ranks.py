"""Ranks of a data-parallel job whose epochs a test starts one at a time: each is a process running
tests/faults/epochs.py (real ImageFolder, DataLoader, DistributedSampler) on one node's mount, and
reports every epoch's checked samples as one JSON line."""

from __future__ import annotations

import contextlib
import json
import queue
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from faults.manifest import Manifest
from faults.nodes import Nodes

ROOT = Path(__file__).resolve().parents[2]


class Rank:
    """A reader process (tests/faults/epochs.py) on one node's mount; epochs are started by ``run``."""

    def __init__(self, spec: Path, rank: int) -> None:
        self.rank = rank
        self.proc = subprocess.Popen(
            [sys.executable, str(ROOT / "tests" / "faults" / "epochs.py"), str(spec), str(rank)],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()
        assert self.next(120) == "READY", f"rank {rank} did not start: {self.stderr()}"

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.strip())
        self.lines.put("EOF")

    def stderr(self) -> str:
        if self.proc.poll() is None:
            return "(running)"
        return self.proc.stderr.read()[-3000:] if self.proc.stderr else ""

    def next(self, timeout: float) -> str:
        try:
            return self.lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"rank {self.rank}: no answer within {timeout}s") from None

    def start(self, epoch: int, seed: int) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"EPOCH {epoch} {seed}\n")
        self.proc.stdin.flush()

    def result(self, timeout: float = 120) -> dict[str, Any]:
        line = self.next(timeout)
        assert line != "EOF", f"rank {self.rank} exited: {self.stderr()}"
        out: dict[str, Any] = json.loads(line)
        return out

    def close(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            assert self.proc.stdin is not None
            self.proc.stdin.write("QUIT\n")
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@contextlib.contextmanager
def ranks(nodes: Nodes, manifest: Manifest, work: Path) -> Iterator[list[Rank]]:
    started: list[Rank] = []
    try:
        for k in range(nodes.n):
            spec = work / f"rank{k}.json"
            spec.write_text(
                json.dumps(
                    {
                        "root": str(nodes.mnt(k)),
                        "world_size": nodes.n,
                        "batch_size": 8,
                        "num_workers": 0,
                        "manifest": {rel: list(v) for rel, v in manifest.files.items()},
                    }
                )
            )
            started.append(Rank(spec, k))
        yield started
    finally:
        for r in started:
            r.close()
