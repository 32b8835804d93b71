"""Progress of long work: the source walk and the plan, in ``seerfs mount``, ``seerfs wait`` and ``seerfs status``.

The walk is made slow the way a loaded PFS makes it slow: the emulator answers every metadata request
after a fixed latency, and the daemon walks with two threads.  What the commands print is read from
a real terminal (a pty) and from plain pipes; the expected entry count comes from the source tree
itself, never from seerfs.
"""

from __future__ import annotations

import fcntl
import itertools
import json
import os
import pty
import re
import struct
import subprocess
import termios
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from mounting import force_unmount, is_mounted, seerfs, status, wait_for
from pfsemu_fixture import requires_fuse, running_pfsemu

from fusefs.daemon.runtime import pid_alive
from fusefs.progress import Progress, ProgressPrinter, describe, shown
from tools.harness.mounts import SEERFS

DIRS, FILES_PER_DIR = 30, 60
META_LATENCY_MS = 100  # a loaded metadata server; with 2 walk threads the walk takes ~4 s
PLAN_EPOCHS = 1500  # the plan for a new seed takes 1-3 s, several status polls


# --------------------------------------------------------------------------- the counting itself


def test_rate_and_time_left_against_an_expected_count() -> None:
    """A known total (the previous snapshot's count) gives a remaining time: (total - done) / rate."""
    p = Progress("walk", "entries")
    p.start("walking", total=1000)
    p.add(250)
    time.sleep(0.2)
    doc = p.doc()
    assert doc["state"] == "running" and doc["done"] == 250 and doc["total"] == 1000
    rate = doc["rate"]
    assert rate is not None  # counted as the work goes: a rate is known
    assert rate == pytest.approx(250 / doc["elapsed_s"], rel=0.05)
    assert doc["eta_s"] == pytest.approx(750 / rate, rel=0.05)
    assert "250 of ~1,000 entries" in doc["line"] and "entries/s" in doc["line"] and "left" in doc["line"]
    p.add(900)  # the tree grew since the previous snapshot: no remaining time can be known
    doc = p.doc()
    assert doc["eta_s"] is None and "more entries than last time" in doc["line"]
    p.finish(done=1151)
    doc = p.doc()
    assert doc["state"] == "done" and doc["eta_s"] is None and doc["line"].startswith("walk done: 1,151 entries in ")


def test_time_left_from_an_expected_duration_and_no_rate_without_counting() -> None:
    p = Progress("plan", "files")
    p.start("planning", detail="seed 3")
    assert p.doc()["eta_s"] is None  # nothing known yet
    p.expect(30.0)
    doc = p.doc()
    eta = doc["eta_s"]
    assert eta is not None  # an expected duration gives a time left
    assert 29.0 < eta <= 30.0 and doc["rate"] is None
    assert doc["line"].startswith("plan: planning (seed 3), ") and "left" in doc["line"]
    p.finish(done=5000, detail="persisted snapshot reused")
    assert p.doc()["rate"] is None  # a count that was not measured as it went has no rate
    assert describe({"task": "x", "state": "idle"}) == "x: not started"


class _Stream:
    def __init__(self) -> None:
        self.text = ""

    def write(self, s: str) -> int:
        self.text += s
        return len(s)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False


def test_printer_without_terminal_prints_a_line_per_interval_at_most() -> None:
    out = _Stream()
    printer = ProgressPrinter(out, interval=0.3)  # type: ignore[arg-type]
    t0 = time.monotonic()
    times: list[float] = []
    while time.monotonic() - t0 < 1.0:
        before = out.text.count("\n")
        printer.show(f"walk: {time.monotonic() - t0:.2f}")
        if out.text.count("\n") > before:
            times.append(time.monotonic() - t0)
        time.sleep(0.01)
    printer.close()
    assert "\r" not in out.text and 2 <= len(times) <= 3, out.text
    assert times[0] >= 0.3  # nothing before the first interval: short waits print nothing
    assert all(b - a >= 0.3 for a, b in itertools.pairwise(times))


def test_printer_on_a_terminal_redraws_one_line_and_erases_it() -> None:
    out = _Stream()
    printer = ProgressPrinter(out, tty=True)  # type: ignore[arg-type]
    printer.show("walk: a")
    time.sleep(0.25)
    printer.show("walk: b")
    printer.close()
    assert out.text == "\rwalk: a\x1b[K\rwalk: b\x1b[K\r\x1b[K"


def test_shown_follows_work_done_in_the_block() -> None:
    """``seerfs plan`` walks in the foreground: a thread shows the walk while the block runs."""
    out = _Stream()
    walk = Progress("walk", "entries")
    with shown(walk, out, tty=True):  # type: ignore[arg-type]
        walk.start("walking")
        for _ in range(6):
            walk.add(100)
            time.sleep(0.1)
    assert re.search(r"\rwalk: walking, [1-6]00 entries, [\d,]+ entries/s, [\d.]+ s so far\x1b\[K", out.text), out.text
    assert out.text.endswith("\r\x1b[K")


# --------------------------------------------------------------------------- through real mounts


class PtyRun:
    """A command whose stdin, stdout and stderr are a terminal (120 columns); output collected."""

    def __init__(self, cmd: list[str]) -> None:
        master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
        self.proc = subprocess.Popen(cmd, stdin=slave, stdout=slave, stderr=slave, close_fds=True)
        os.close(slave)
        self.master = master
        self.chunks: list[bytes] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        while True:
            try:
                data = os.read(self.master, 4096)
            except OSError:  # EIO: every process holding the terminal has closed it
                return
            if not data:
                return
            self.chunks.append(data)

    def finish(self, timeout: float = 120) -> tuple[int, str]:
        code = self.proc.wait(timeout)
        self.reader.join(10)
        os.close(self.master)
        return code, b"".join(self.chunks).decode(errors="replace")


def _slow_tree(root: Path) -> int:
    """DIRS class directories of FILES_PER_DIR small files; returns the entries a walk finds (root included)."""
    for d in range(DIRS):
        cls = root / f"class{d:02d}"
        cls.mkdir(parents=True)
        for f in range(FILES_PER_DIR):
            (cls / f"img{f:03d}.jpg").write_bytes(b"%d" % f)
    return sum(1 for _ in root.rglob("*")) + 1


def _status_json(mp: Path) -> dict[str, Any] | None:
    res = seerfs("status", "--json", "--timeout", "5", str(mp))
    return json.loads(res.stdout) if res.returncode == 0 else None


def _walking(mp: Path) -> dict[str, Any] | None:
    """``seerfs status --json`` while the daemon is starting and its walk has a measured rate."""
    doc = _status_json(mp)
    if doc is None or doc.get("state") != "starting":
        return None
    walk = doc["progress"]["walk"]
    return doc if walk["state"] == "running" and walk["phase"] == "walking" and walk["rate"] else None


@requires_fuse
@pytest.mark.mount
def test_walk_and_plan_progress_in_mount_wait_and_status(tmp_path: Path) -> None:
    """First mount on a terminal: a refreshing walk line with entries/s, the same line in ``seerfs
    wait``, the walk in ``seerfs status`` before the mount answers; then the plan's progress; then a
    rescan without a terminal, where the previous snapshot's count gives the time left."""
    entries = _slow_tree(tmp_path / "backing")
    cfg = tmp_path / "seerfs.yaml"
    # Enough epochs that a plan takes seconds: the prepared plan worker builds 1,800 files x 1 epoch
    # faster than one status poll, and a plan never seen running proves nothing about its time left.
    cfg.write_text(f"cache_dir: {tmp_path / 'cache'}\nsnapshot: {{walk_threads: 2}}\njob: {{epochs: {PLAN_EPOCHS}}}\n")
    mp = tmp_path / "mnt"
    mp.mkdir()
    with running_pfsemu(tmp_path / "backing", meta_latency_ms=META_LATENCY_MS) as emu:
        try:
            mount = PtyRun([*SEERFS, "mount", str(emu.mountpoint), str(mp), "-c", str(cfg)])
            waiter = PtyRun([*SEERFS, "wait", "--timeout", "60", str(mp)])
            doc = wait_for(lambda: _walking(mp), timeout=30, what="seerfs status to show the walk")
            walk = doc["progress"]["walk"]
            assert 0 < walk["done"] < entries and walk["total"] is None  # nothing to compare with yet
            assert walk["eta_s"] is None and walk["unit"] == "entries"
            human = seerfs("status", str(mp)).stdout
            assert "starting" in human
            assert re.search(r"progress  walk: walking, [\d,]+ entries, [\d,]+ entries/s", human), human

            code, out = mount.finish()
            assert code == 0, out
            assert re.search(r"\rwalk: walking, [\d,]+ entries, [\d,]+ entries/s, [\d.]+ s so far\x1b\[K", out), out
            assert out.endswith("\r\x1b[K"), "the refreshing line is erased once the mount answers"
            code, wout = waiter.finish()
            assert code == 0, wout
            assert re.search(r"walk: walking, [\d,]+ entries, [\d,]+ entries/s", wout), wout

            # Serving: the finished walk stays in status; `wait --plan` returns once the plan is ready.
            res = seerfs("wait", "--plan", "--timeout", "60", str(mp))
            assert res.returncode == 0, res.stderr
            doc = status(mp)
            assert doc["progress"]["walk"]["state"] == "done" and doc["progress"]["walk"]["done"] == entries
            plan = doc["progress"]["plan"]
            assert plan["state"] == "done" and plan["done"] == DIRS * FILES_PER_DIR and doc["plan"]["state"] == "ready"

            # A plan for a new seed is estimated from the last build: its time left shows while it runs.
            (mp / ".control" / "seed").write_text("7\n")
            seen: list[dict[str, Any]] = []

            def planned() -> bool:
                doc = status(mp)
                seen.append(doc["progress"]["plan"])
                return bool(doc["plan"]["state"] == "ready" and doc["plan"]["seed"] == 7)

            wait_for(planned, timeout=60, what="the plan for seed 7")
            running = [p for p in seen if p["state"] == "running"]
            assert running and all(p["eta_s"] is not None for p in running), running
            assert "left" in running[-1]["line"] and "seed 7" in running[-1]["line"]
            assert seerfs("umount", str(mp)).returncode == 0

            # No terminal, a rescan: the persisted snapshot's count gives the walk its time left.
            t0 = time.monotonic()
            rescan = subprocess.Popen(
                [*SEERFS, "mount", "--rescan", str(emu.mountpoint), str(mp), "-c", str(cfg)],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            doc = wait_for(lambda: _walking(mp), timeout=30, what="the rescan in status")
            walk = doc["progress"]["walk"]
            assert walk["total"] == entries and walk["eta_s"] is not None and walk["eta_s"] > 0
            assert re.search(rf"walk: walking, [\d,]+ of ~{entries:,} entries, .* left", walk["line"]), walk
            _, err = rescan.communicate(timeout=120)
            took = time.monotonic() - t0
            assert rescan.returncode == 0, err
            lines = [line for line in err.splitlines() if line.startswith("walk:")]
            assert "\r" not in err and len(lines) <= int(took // 10), err  # one line per 10 s at most
        finally:
            if is_mounted(mp):
                seerfs("umount", str(mp))
            force_unmount(mp)


@requires_fuse
@pytest.mark.mount
@pytest.mark.slow
def test_mount_without_terminal_prints_the_walk_every_ten_seconds(tmp_path: Path) -> None:
    """A walk of ~25 s with output to a pipe (a batch job's log): a walk line after 10 s and 20 s."""
    entries = _slow_tree(tmp_path / "backing")
    cfg = tmp_path / "seerfs.yaml"
    cfg.write_text(f"cache_dir: {tmp_path / 'cache'}\nsnapshot: {{walk_threads: 1}}\n")
    mp = tmp_path / "mnt"
    mp.mkdir()
    with running_pfsemu(tmp_path / "backing", meta_latency_ms=400) as emu:
        try:
            t0 = time.monotonic()
            res = seerfs("mount", str(emu.mountpoint), str(mp), "-c", str(cfg), timeout=300)
            took = time.monotonic() - t0
            assert res.returncode == 0, res.stderr
            lines = [line for line in res.stderr.splitlines() if line.startswith("walk: walking, ")]
            assert took >= 20 and 1 <= len(lines) <= int(took // 10), (took, res.stderr)
            assert all(re.search(r"[\d,]+ entries, [\d,]+ entries/s", line) for line in lines), lines
            assert status(mp)["progress"]["walk"]["done"] == entries
        finally:
            if is_mounted(mp):
                seerfs("umount", str(mp))
            force_unmount(mp)


@requires_fuse
@pytest.mark.mount
def test_umount_stops_a_daemon_still_walking(tmp_path: Path) -> None:
    """A mount of the wrong (huge) tree need not run to the end: ``seerfs umount`` stops the daemon
    while it walks, the waiting ``seerfs mount`` reports the failure, and nothing stays mounted."""
    _slow_tree(tmp_path / "backing")
    cfg = tmp_path / "seerfs.yaml"
    cfg.write_text(f"cache_dir: {tmp_path / 'cache'}\nsnapshot: {{walk_threads: 1}}\n")
    mp = tmp_path / "mnt"
    mp.mkdir()
    with running_pfsemu(tmp_path / "backing", meta_latency_ms=META_LATENCY_MS) as emu:
        mount = subprocess.Popen(
            [*SEERFS, "mount", str(emu.mountpoint), str(mp), "-c", str(cfg)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            pid = wait_for(lambda: (d := _walking(mp)) and d["pid"], timeout=30, what="the walk in status")
            res = seerfs("umount", str(mp))
            assert res.returncode == 0 and f"stopped daemon {pid}" in res.stdout, res.stdout + res.stderr
            assert not pid_alive(pid)  # gone (a zombie until its new parent reaps it counts as gone)
            _, err = mount.communicate(timeout=60)
            assert mount.returncode == 1 and "daemon exited during startup" in err, err
            assert not is_mounted(mp) and _status_json(mp) is None  # nothing left: status says not mounted
        finally:
            if mount.poll() is None:
                mount.kill()
            force_unmount(mp)
