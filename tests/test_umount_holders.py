"""``seerfs umount`` on a busy mount names every holder it can find: processes with an open file, cwd,
root or mapping under it (from /proc), and readers the daemon is serving a request for right now: a
reader blocked inside open on a hung source has no descriptor yet, so only the daemon knows its pid.
"""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from faults.procs import stopped
from mounting import is_mounted, mounted, seerfs, status, wait_for
from pfsemu_fixture import requires_fuse, running_pfsemu

from fusefs.cli.umount import busy_message, holders, served_requests
from fusefs.errors import ExitCode

MAP = """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
fd = os.open({path!r}, os.O_RDONLY)
assert libc.mmap(None, 4096, 1, 2, fd, 0) not in (None, ctypes.c_void_p(-1).value)  # PROT_READ, MAP_PRIVATE
os.close(fd)  # Python's mmap module would keep a dup of it: an open file, not only a mapping
"""
HOLD = "import sys, time\nprint('ready', flush=True)\ntime.sleep(600)\n"


def test_holders_names_open_files_cwds_and_mappings_with_why(tmp_path: Path) -> None:
    """Plain directories are enough: the scan reads /proc only, never the path itself."""
    top = tmp_path / "top"
    (top / "sub").mkdir(parents=True)
    (top / "f").write_bytes(b"x" * 4096)
    procs: list[subprocess.Popen[str]] = []
    try:
        in_cwd = subprocess.Popen([sys.executable, "-c", HOLD], cwd=top / "sub", stdout=subprocess.PIPE, text=True)
        with_fd = subprocess.Popen(
            [sys.executable, "-c", f"f = open({str(top / 'f')!r}, 'rb')\n" + HOLD], stdout=subprocess.PIPE, text=True
        )
        mapped = subprocess.Popen(  # mapped with libc's mmap, then closed: only /proc/PID/maps shows it
            [sys.executable, "-c", MAP.format(path=str(top / "f")) + HOLD], stdout=subprocess.PIPE, text=True
        )
        procs = [in_cwd, with_fd, mapped]
        for p in procs:
            assert p.stdout is not None and p.stdout.readline() == "ready\n"
        found = {pid: why for pid, _comm, why in holders(str(top))}
        assert found.get(in_cwd.pid) == "cwd"
        assert found.get(with_fd.pid) == "open file"
        assert found.get(mapped.pid) == "mapping"
        assert os.getpid() not in found  # the caller never names itself
        requests = [{"pid": with_fd.pid, "op": "open", "seconds": 1.5}, {"pid": 999_999_999, "op": "open"}]
        named = {pid: why for pid, _comm, why in holders(str(top), requests, daemon_pid=in_cwd.pid)}
        assert named[with_fd.pid] == "open file, waiting on open for 1.5s"
        assert named[in_cwd.pid] == "cwd"  # the daemon's pid only drops its requests, not what /proc shows
        assert 999_999_999 in named  # a thread /proc does not know any more is still named as given
    finally:
        for p in procs:
            p.kill()
            p.wait(timeout=30)


def test_a_daemon_that_does_not_answer_costs_the_timeout_not_a_hung_umount(tmp_path: Path) -> None:
    """``.control/status`` as a FIFO: opening it blocks as a hung daemon's mount would."""
    (tmp_path / ".control").mkdir()
    fifo = tmp_path / ".control" / "status"
    os.mkfifo(fifo)
    try:
        t0 = time.monotonic()
        assert served_requests(str(tmp_path), 0.5) is None
        message = busy_message(str(tmp_path), 0.5)
        assert time.monotonic() - t0 < 30  # returned (the bound itself is the join timeout)
        assert "busy, held by unknown processes (the daemon did not say which requests it serves within 0.5s)" in (
            message
        )
    finally:
        with contextlib.suppress(OSError):  # a writer end releases the threads left waiting in open
            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            os.close(fd)


@requires_fuse
@pytest.mark.mount
def test_a_busy_umount_names_a_reader_blocked_in_open_on_a_hung_source(tmp_path: Path) -> None:
    backing = tmp_path / "pfs"
    (backing / "train" / "c").mkdir(parents=True)
    data = os.urandom(20_000)
    (backing / "train" / "c" / "a.jpg").write_bytes(data)
    with (
        running_pfsemu(backing) as emu,
        mounted(emu.mountpoint, tmp_path / "mnt", "-o", "datasets.0.root=train", cache_dir=tmp_path / "cache") as mnt,
    ):
        target = mnt / "train" / "c" / "a.jpg"
        probe = (
            f"import sys\ndata = open({str(target)!r}, 'rb').read()\n"
            "sys.exit(0 if data == bytes.fromhex(sys.argv[1]) else 1)\n"
        )
        with stopped(emu.process.pid):  # the source hangs: seerfs's open of the file waits in a worker thread
            reader = subprocess.Popen([sys.executable, "-c", probe, data.hex()], cwd=tmp_path)
            try:
                wait_for(
                    lambda: any(r["pid"] == reader.pid for r in status(mnt)["requests"]["waiting"]),
                    30,
                    "the reader's open to reach the daemon",
                )
                # Nothing in /proc ties the reader to the mount: it has no descriptor yet, and its cwd is outside.
                fds = [os.readlink(f"/proc/{reader.pid}/fd/{fd}") for fd in os.listdir(f"/proc/{reader.pid}/fd")]
                assert not [t for t in fds if t.startswith(str(mnt))], fds
                res = seerfs("umount", str(mnt), timeout=60)
                assert res.returncode == ExitCode.BUSY, res.stderr
                assert f"held by {reader.pid} (" in res.stderr and "[waiting on open for " in res.stderr, res.stderr
                assert is_mounted(mnt)
            except BaseException:
                reader.kill()
                raise
        # The source answers again: the reader gets the right bytes and the mount comes off cleanly.
        assert reader.wait(timeout=60) == 0
        res = seerfs("umount", str(mnt), timeout=60)
        assert res.returncode == 0, res.stderr
        assert not is_mounted(mnt)
        with pytest.raises(OSError) as gone:
            os.stat(mnt / "train")
        assert gone.value.errno == errno.ENOENT
