"""What seerfs(1) says TERM, INT and HUP do to a serving daemon, checked on a real one: each stops it
the same way (HUP is no reload), unmounting even while a file is open there, and it exits 0."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
from pathlib import Path

import pytest
from mounting import force_unmount, is_mounted, seerfs

from fusefs.cli.main import SIGNALS
from tools.harness.mounts import SEERFS


def test_seerfs_1_says_what_each_signal_does() -> None:
    page = (Path(__file__).parent.parent / "man" / "seerfs.1").read_text()
    for name in ("TERM", "INT", "HUP"):
        assert name in SIGNALS
    assert "HUP does not reload" in SIGNALS
    assert SIGNALS.split(".")[0] in page.replace("\\-", "-")  # generated into the page (tools.genman)


@pytest.mark.mount
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP], ids=lambda s: s.name)
def test_each_stop_signal_unmounts_a_busy_mount_and_exits_0(tmp_path: Path, sig: signal.Signals) -> None:
    src, mnt = tmp_path / "src", tmp_path / "mnt"
    (src / "train" / "c").mkdir(parents=True)
    (src / "train" / "c" / "a.jpg").write_bytes(os.urandom(300_000))
    mnt.mkdir()
    cmd = [*SEERFS, "mount", "--fg", str(src), str(mnt), "-o", f"datasets.0.root=train,cache_dir={tmp_path / 'c'}"]
    daemon = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        assert seerfs("wait", str(mnt), "--timeout", "60").returncode == 0
        fd = os.open(mnt / "train" / "c" / "a.jpg", os.O_RDONLY)  # the mount is busy from here on
        try:
            assert len(os.pread(fd, 10, 0)) == 10
            daemon.send_signal(sig)
            _, err = daemon.communicate(timeout=60)
            assert daemon.returncode == 0, err[-2000:]
            assert f"signal {int(sig)}: unmounting" in err
            assert not is_mounted(mnt)  # detached although a file was open
            with pytest.raises(OSError) as failed:
                os.pread(fd, 10, 100_000)
            assert failed.value.errno == errno.ENOTCONN
        finally:
            os.close(fd)
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait(timeout=30)
        force_unmount(mnt)
