"""The job token and the daemon's files are private from the first syscall that creates them.

Proved on the syscalls themselves: the real ``seerfs mount`` (rendezvous formation, which creates
the token) runs under strace, and every open/creat of a token path must carry O_EXCL and mode 0600,
with no chmod of any kind on it afterwards (a chmod after creation is the window another local
user can open the file in).  File modes are read with stat, not from seerfs.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from mounting import force_unmount, is_mounted, seerfs, status, wait_for

from fusefs.cluster.formation import read_or_create_token

REPO = Path(__file__).resolve().parent.parent
CREATES = re.compile(
    r'^(\d+)\s+(openat|open|creat)\((?:(?:AT_FDCWD|\d+)(?:<[^>]*>)?, )?"([^"]*)", ([A-Z_|]+)(?:, (0\d+))?'
)
CHMODS = re.compile(r"^(\d+)\s+(chmod|fchmod|fchmodat|fchmodat2)\((.*)\)")


def traced_mount(source: Path, mnt: Path, config: dict[str, str], trace: Path) -> None:
    """Mount under ``strace -f`` (daemon included), read its status, unmount; strace ends with it."""
    strace = shutil.which("strace")
    if strace is None:
        pytest.skip("strace is not installed (tools/setup installs it)")
    opts = ",".join(f"{k}={v}" for k, v in config.items())
    cmd = [strace, "-f", "-y", "--seccomp-bpf", "-o", str(trace)]
    cmd += ["-e", "trace=open,openat,creat,chmod,fchmod,fchmodat,link,linkat,rename,renameat,renameat2"]
    cmd += [sys.executable, "-m", "fusefs", "mount", str(source), str(mnt), "-o", opts]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: is_mounted(mnt) or proc.poll() is not None, timeout=120, what="the traced mount")
        assert is_mounted(mnt), proc.communicate(timeout=30)
        assert status(mnt)["group"]["mode"] == "rendezvous"
    finally:
        if is_mounted(mnt):
            seerfs("umount", str(mnt), timeout=60)
        force_unmount(mnt)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.mark.mount
def test_the_token_is_created_0600_with_o_excl_and_never_chmodded(tmp_path: Path, mountpoint: Path) -> None:
    """Before: openat(".token.HOST-PID", O_WRONLY|O_CREAT|O_TRUNC|O_CLOEXEC, 0666) then chmod(0600):
    between the two, any local user could open the token (23 of 200 captured in a fault run)."""
    src = tmp_path / "src"
    (src / "c").mkdir(parents=True)
    (src / "c" / "a").write_bytes(b"x" * 100)
    rdv = tmp_path / "shared" / "rendezvous"
    trace = tmp_path / "strace.txt"
    config = {
        "cache_dir": str(tmp_path / "cache"),
        "peers.discovery": "rendezvous",
        "peers.rendezvous_dir": str(rdv),
        "peers.expect": "1",
    }
    traced_mount(src, mountpoint, config, trace)
    lines = trace.read_text().splitlines()
    creates = [m for m in map(CREATES.match, lines) if m and "O_CREAT" in m.group(4)]
    token_creates = [m for m in creates if os.path.basename(m.group(3)).lstrip(".").startswith("token")]
    assert token_creates, "the traced mount never created the token (the fault was not exercised)"
    for m in token_creates:
        assert "O_EXCL" in m.group(4) and m.group(5) == "0600", m.group(0)
    chmods = [line for line in lines if CHMODS.match(line) and "token" in line]
    assert not chmods, chmods
    token = rdv / "token"
    assert stat.S_IMODE(token.stat().st_mode) == 0o600
    assert stat.S_IMODE(rdv.stat().st_mode) == 0o700  # the rendezvous directory is created private
    # Everything else the daemon left in its cache and rendezvous directories is private too.
    made = [p for base in (tmp_path / "cache", rdv) for p in base.rglob("*")]
    assert any(p.suffix == ".npz" for p in made)
    node_files = [m for m in creates if os.path.basename(m.group(3)).lstrip(".").startswith("node-")]
    assert node_files and all("O_EXCL" in m.group(4) and m.group(5) == "0600" for m in node_files), node_files
    leaked = [(str(p), oct(p.stat().st_mode)) for p in made if p.stat().st_mode & 0o077]
    assert not leaked, leaked


def test_racing_daemons_agree_on_one_token_and_it_is_never_readable_by_others(tmp_path: Path) -> None:
    """Eight creators at once: one token wins, every creator returns it, and a watcher that polls
    the directory for any file whose mode lets others read it finds none at any moment."""
    d = tmp_path / "rdv"
    d.mkdir(mode=0o755)  # a public directory: the file's own mode must protect it
    seen_open: list[str] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            for entry in os.scandir(d):
                try:
                    if entry.stat(follow_symlinks=False).st_mode & 0o044:
                        seen_open.append(entry.name)
                except FileNotFoundError:
                    pass

    watcher = threading.Thread(target=watch)
    watcher.start()
    tokens: list[bytes] = []
    try:
        for round_ in range(20):
            path = d / f"token{round_}"
            results: list[bytes] = []
            threads = [threading.Thread(target=_create, args=(path, results)) for _ in range(8)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert len(results) == 8 and len(set(results)) == 1
            tokens.append(results[0])
    finally:
        stop.set()
        watcher.join()
    assert len(set(tokens)) == 20
    assert not seen_open, seen_open[:5]
    assert sorted(p.name for p in d.iterdir()) == sorted(f"token{i}" for i in range(20))  # no temporaries left


def _create(path: Path, out: list[bytes]) -> None:
    out.append(read_or_create_token(path))


@pytest.mark.mount
def test_a_token_file_other_users_can_read_is_refused_at_mount(tmp_path: Path, mountpoint: Path) -> None:
    from test_cli_errors import one_line_error

    src = tmp_path / "src"
    (src / "c").mkdir(parents=True)
    (src / "c" / "a").write_bytes(b"x")
    token = tmp_path / "token"
    token.write_text("ab" * 32 + "\n")
    os.chmod(token, 0o644)
    opts = (
        f"cache_dir={tmp_path / 'cache'},peers.discovery=rendezvous,peers.rendezvous_dir={tmp_path / 'rdv'},"
        f"peers.expect=1,peers.token_file={token}"
    )
    try:
        one_line_error(seerfs("mount", str(src), str(mountpoint), "-o", opts), 3, str(token), "chmod 600")
    finally:
        force_unmount(mountpoint)
    os.chmod(token, 0o600)
    assert read_or_create_token(token) == bytes.fromhex("ab" * 32)
