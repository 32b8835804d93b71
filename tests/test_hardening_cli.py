"""Errors a user can cause keep their documented exit codes: a full or unsafe cache directory is a
configuration error (3), a mount whose daemon died is reported as such (11), never "internal error".

Full filesystems are real: a tmpfs of 64 KiB mounted for the test (and unmounted in teardown),
filled by the test itself.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from mounting import force_unmount, is_mounted, seerfs, status, wait_for
from test_cli_errors import one_line_error

from fusefs.errors import ExitCode

pytestmark = pytest.mark.mount

REPO = Path(__file__).resolve().parent.parent
DEAD = 11  # ExitCode.DEAD, spelt out so the test reads the documented number


@pytest.fixture
def source(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    (src / "c").mkdir(parents=True)
    (src / "c" / "a.bin").write_bytes(os.urandom(5000))
    return src


@pytest.fixture
def full_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 64 KiB tmpfs (private: mode 0700), filled until a write fails with ENOSPC."""
    d = tmp_path / "tiny"
    d.mkdir()
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k,mode=0700", "tmpfs", str(d)], capture_output=True)
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {res.stderr.decode().strip()}")
    try:
        fd = os.open(d / "fill", os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            with pytest.raises(OSError) as exc:
                while True:
                    os.write(fd, b"\0" * 4096)
        finally:
            os.close(fd)
        assert exc.value.errno == 28  # ENOSPC: the filesystem really is full
        st = os.statvfs(d)
        assert st.f_bavail == 0
        yield d
    finally:
        subprocess.run(["umount", "-l", str(d)], capture_output=True)


def test_a_full_cache_dir_at_mount_is_a_configuration_error(
    source: Path, mountpoint: Path, full_tmpfs: Path, tmp_path: Path
) -> None:
    """Before: exit 1, "startup failed: [Errno 28] No space left on device"."""
    cache = full_tmpfs / "cache"  # the check creates it (an inode still fits), then finds no room
    try:
        res = seerfs("mount", str(source), str(mountpoint), "-o", f"cache_dir={cache}")
        one_line_error(res, ExitCode.CONFIG, "cache_dir", "full")
    finally:
        if is_mounted(mountpoint):
            seerfs("umount", str(mountpoint))
            force_unmount(mountpoint)


def test_a_cache_dir_that_fills_during_startup_does_not_stop_the_daemon(
    source: Path, mountpoint: Path, full_tmpfs: Path
) -> None:
    """The daemon's own startup writes (snapshot, plans) fail with ENOSPC after the calling process's
    check passed (run_daemon directly, as a daemon whose cache filled after the check): it mounts,
    serves correct bytes, says so in status, and exits 0 when unmounted.  Before: exit 1,
    "startup failed: [Errno 28] No space left on device"."""
    code = (
        "import sys; from fusefs.config import load; from fusefs.daemon.checks import MountRequest; "
        "from fusefs.daemon.lifecycle import run_daemon; "
        f"cfg = load(None, {{'cache_dir': {str(full_tmpfs)!r}}}); "
        f"sys.exit(run_daemon(MountRequest({str(source)!r}, {str(mountpoint)!r}, cfg), foreground=True))"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE, text=True, cwd=REPO, env=os.environ)
    try:
        doc = wait_for(lambda: is_mounted(mountpoint) and status(mountpoint), 60, "the daemon to serve")
        assert (mountpoint / "c" / "a.bin").read_bytes() == (source / "c" / "a.bin").read_bytes()
        assert any("No space left" in e for e in doc["snapshot"]["unlisted_dirs"]), doc["snapshot"]
        seerfs("umount", str(mountpoint), check=True)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err[-2000:]
        assert "startup failed" not in err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        force_unmount(mountpoint)


@pytest.mark.parametrize("which", ["cache_dir", "tier", "rendezvous"])
def test_a_directory_other_users_can_write_is_refused(
    source: Path, mountpoint: Path, tmp_path: Path, which: str
) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)  # like /tmp: anyone may create files in it
    opts = {
        "cache_dir": f"cache_dir={shared}",
        "tier": f"cache_dir={tmp_path / 'cache'},tiers.0.kind=directory,tiers.0.path={shared},tiers.0.bytes=1M",
        "rendezvous": f"cache_dir={tmp_path / 'cache'},peers.discovery=rendezvous,peers.rendezvous_dir={shared},"
        "peers.expect=1",
    }[which]
    try:
        res = seerfs("mount", str(source), str(mountpoint), "-o", opts)
        one_line_error(res, ExitCode.CONFIG, str(shared), "writable by other users")
    finally:
        if is_mounted(mountpoint):
            seerfs("umount", str(mountpoint))
            force_unmount(mountpoint)


def test_status_and_wait_on_a_dead_mount_say_so_with_their_own_exit_code(
    source: Path, mountpoint: Path, cache_dir: Path
) -> None:
    """kill -9 of the daemon leaves the mount in place, answering ENOTCONN.  Before: exit 1
    ("cannot read status: Transport endpoint is not connected") for status and for wait."""
    seerfs("mount", str(source), str(mountpoint), "-o", f"cache_dir={cache_dir}", check=True)
    try:
        pid = status(mountpoint)["pid"]
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: not os.path.exists(f"/proc/{pid}"), what="the daemon gone")
        with pytest.raises(OSError) as exc:
            os.stat(mountpoint / ".control" / "status")
        assert exc.value.errno == 107  # ENOTCONN: the fault is really there
        assert is_mounted(mountpoint)
        one_line_error(seerfs("status", str(mountpoint)), DEAD, "daemon is gone", "seerfs umount")
        one_line_error(seerfs("status", str(mountpoint), "--json"), DEAD, "daemon is gone")
        one_line_error(seerfs("wait", str(mountpoint), "--timeout", "5"), DEAD, "daemon is gone")
        res = seerfs("umount", str(mountpoint))
        assert res.returncode == 0, res.stderr
        assert not is_mounted(mountpoint)
    finally:
        force_unmount(mountpoint)


def test_the_dead_mount_exit_status_is_documented() -> None:
    meaning = "daemon is gone"
    res = seerfs("--help")
    assert f"{int(DEAD)}  the mount's {meaning}" in res.stdout
    assert meaning in (REPO / "man" / "seerfs.1").read_text()
    assert f"{int(DEAD)} mount whose daemon is gone" in (REPO / "README.md").read_text()


@pytest.mark.parametrize(
    "override",
    [
        "job.epochs=" + "9" * 5000,  # Python's int() refuses above 4,300 digits with a plain ValueError
        "tiers.0.bytes=" + "9" * 5000,
        "tiers.0.bytes=" + "9" * 400 + "G",  # a float of inf
        "datasets=" + "[" * 3000 + "]" * 3000,  # nested deeper than the YAML parser recurses
    ],
)
def test_config_values_of_any_size_are_configuration_errors(override: str) -> None:
    """Before: a traceback and exit 1 for the first three."""
    res = seerfs("config", "-o", override)
    one_line_error(res, ExitCode.CONFIG)
    assert len(res.stderr) < 300


def test_a_config_file_with_a_huge_number_is_a_configuration_error(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("job:\n  epochs: " + "9" * 5000 + "\n")
    one_line_error(seerfs("config", "-c", str(cfg)), ExitCode.CONFIG, "c.yaml")
