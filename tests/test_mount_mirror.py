"""Real-mount tests of the read-only mirror: the mount must be indistinguishable from the source."""

from __future__ import annotations

import errno
import hashlib
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from mounting import force_unmount, is_mounted, mounted, seerfs, status, wait_for
from trees import NON_UTF8, describe, tricky_tree

pytestmark = pytest.mark.mount


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tricky_tree(tmp_path_factory.mktemp("src") / "data")


def _digest(path: bytes) -> str:
    with open(path, "rb") as fh:
        return hashlib.sha256(fh.read()).hexdigest()


def test_tree_metadata_and_bytes_identical(tree: Path, mountpoint: Path, cache_dir: Path) -> None:
    """Names, types, sizes, modes, mtimes, owners, link targets and file bytes match the source."""
    with mounted(tree, mountpoint, cache_dir=cache_dir):
        src, mnt = describe(tree), describe(mountpoint)
        assert set(mnt) == set(src)
        assert mnt == src
        assert os.path.join(b"dog", NON_UTF8) in mnt
        for rel in src:
            full_src = os.path.join(os.fsencode(tree), rel)
            if os.path.isfile(full_src) and not os.path.islink(full_src):
                assert _digest(os.path.join(os.fsencode(mountpoint), rel)) == _digest(full_src), rel
        # links resolve through the mount like on the source
        assert (mountpoint / "dog" / "link_to_file.jpg").read_bytes() == (tree / "cat" / "a.jpg").read_bytes()
        assert sorted(os.listdir(mountpoint / "dog" / "link_to_dir")) == sorted(os.listdir(tree / "cat"))
        with pytest.raises(FileNotFoundError):
            (mountpoint / "dog" / "dangling.jpg").read_bytes()
        # ranged reads of the big file, not only whole reads
        with open(mountpoint / "dog" / "big.jpg", "rb") as m, open(tree / "dog" / "big.jpg", "rb") as s:
            for off in (0, 131071, 5 << 20, (20 << 20) - 10):
                m.seek(off)
                s.seek(off)
                assert m.read(300_000) == s.read(300_000)


def test_control_hidden_but_reachable(tree: Path, mountpoint: Path, cache_dir: Path) -> None:
    """.control never appears in listings (ImageFolder would make it class 0) yet its files work."""
    with mounted(tree, mountpoint, cache_dir=cache_dir):
        assert ".control" not in os.listdir(mountpoint)
        assert ".control" not in [e.name for e in os.scandir(mountpoint)]
        assert sorted(os.listdir(mountpoint / ".control")) == ["config", "seed", "status"]
        assert (mountpoint / ".control" / "seed").read_text() == "0\n"
        doc = status(mountpoint)
        assert doc["state"] == "serving"
        assert doc["seed"] == {**doc["seed"], "value": 0, "origin": "assumed"}
        assert "datasets:" in (mountpoint / ".control" / "config").read_text()
        assert doc["snapshot"]["external_symlinks_total"] == 0
        page = (Path(__file__).resolve().parent.parent / "man" / "seerfs-control.7").read_text()
        undocumented = [k for k in doc if isinstance(doc[k], dict | list) and f".SS {k}\n" not in page]
        assert not undocumented, f"status sections missing from seerfs-control(7): {undocumented}"


def test_seed_writes(tree: Path, mountpoint: Path, cache_dir: Path) -> None:
    """`echo 7 > seed` works; `abc` fails with EINVAL, keeps the seed and status says why."""
    with mounted(tree, mountpoint, cache_dir=cache_dir):
        seed = mountpoint / ".control" / "seed"
        subprocess.run(["bash", "-c", f"echo 7 > '{seed}'"], check=True)
        assert seed.read_text() == "7\n"
        bad = subprocess.run(["bash", "-c", f"echo abc > '{seed}'"], capture_output=True, text=True)
        assert bad.returncode != 0 and "Invalid argument" in bad.stderr
        with pytest.raises(OSError) as exc, open(seed, "w") as fh:
            fh.write("12x\n")
        assert exc.value.errno == errno.EINVAL
        assert seed.read_text() == "7\n"
        doc = status(mountpoint)
        assert doc["seed"]["value"] == 7 and doc["seed"]["origin"] == "written"
        assert "decimal integer" in doc["seed"]["last_error"] and "12x" in doc["seed"]["last_error"]
        seed.write_text(str(2**32 + 5))  # no newline also fine
        assert status(mountpoint)["seed"]["value"] == 2**32 + 5


def test_dataset_is_read_only(tree: Path, mountpoint: Path, cache_dir: Path) -> None:
    with mounted(tree, mountpoint, cache_dir=cache_dir):
        attempts: list[Callable[[], object]] = [
            lambda: os.open(mountpoint / "cat" / "a.jpg", os.O_RDWR),
            lambda: os.open(mountpoint / "cat" / "new.jpg", os.O_WRONLY | os.O_CREAT),
            lambda: os.mkdir(mountpoint / "newdir"),
            lambda: os.unlink(mountpoint / "cat" / "a.jpg"),
            lambda: os.rename(mountpoint / "cat" / "a.jpg", mountpoint / "cat" / "z.jpg"),
            lambda: os.symlink("x", mountpoint / "cat" / "ln"),
            lambda: os.chmod(mountpoint / "cat" / "a.jpg", 0o600),
            lambda: os.truncate(mountpoint / "cat" / "a.jpg", 0),
            lambda: os.open(mountpoint / ".control" / "status", os.O_WRONLY),
        ]
        for attempt in attempts[:-1]:
            with pytest.raises(OSError) as exc:
                attempt()
            assert exc.value.errno == errno.EROFS
        with pytest.raises(PermissionError):
            attempts[-1]()
        assert (tree / "cat" / "a.jpg").exists() and not (tree / "newdir").exists()


def test_statfs_reports_source(tree: Path, mountpoint: Path, cache_dir: Path) -> None:
    with mounted(tree, mountpoint, cache_dir=cache_dir):
        m, s = os.statvfs(mountpoint), os.statvfs(tree)
        assert (m.f_bsize, m.f_blocks, m.f_files) == (s.f_bsize, s.f_blocks, s.f_files)


def test_read_ahead_is_the_configured_one_after_init(tree: Path, mountpoint: Path, cache_dir: Path) -> None:
    """fuse.read_ahead_kb holds on the live mount: set after INIT, whose reply would cap it at 128 KiB."""
    from fusefs import mountinfo

    with mounted(tree, mountpoint, "-o", "fuse.read_ahead_kb=768", cache_dir=cache_dir):
        entry = mountinfo.find(str(mountpoint))
        assert entry is not None
        path = Path(f"/sys/class/bdi/{entry.device}/read_ahead_kb")
        wait_for(lambda: path.read_text().strip() == "768", timeout=10, what="read_ahead_kb 768")


def test_changed_source_file_reads_eio(tmp_path: Path, mountpoint: Path, cache_dir: Path) -> None:
    """A file rewritten with a new size after mount reads as EIO, never stale or mixed bytes."""
    src = tmp_path / "src"
    (src / "c").mkdir(parents=True)
    (src / "c" / "f.jpg").write_bytes(b"a" * 1000)
    (src / "c" / "g.jpg").write_bytes(b"b" * 1000)
    with mounted(src, mountpoint, cache_dir=cache_dir):
        (src / "c" / "f.jpg").write_bytes(b"new" * 500)
        with pytest.raises(OSError) as exc:
            (mountpoint / "c" / "f.jpg").read_bytes()
        assert exc.value.errno == errno.EIO
        assert (mountpoint / "c" / "g.jpg").read_bytes() == b"b" * 1000  # the rest keeps serving
        reads = status(mountpoint)["reads"]
        assert "c/f.jpg" in reads["stale_files"] and "size changed" in reads["stale_files"]["c/f.jpg"]


def test_snapshot_reused_on_remount(tree: Path, tmp_path: Path, cache_dir: Path) -> None:
    """The second mount of an unchanged source reuses the snapshot; --rescan and changes force a walk."""
    mp = tmp_path / "m"
    with mounted(tree, mp, cache_dir=cache_dir):
        first = status(mp)["snapshot"]
    with mounted(tree, mp, cache_dir=cache_dir):
        second = status(mp)["snapshot"]
    with mounted(tree, mp, "--rescan", cache_dir=cache_dir):
        third = status(mp)["snapshot"]
    (tree / "dog" / "added.jpg").write_bytes(b"new file")
    try:
        with mounted(tree, mp, cache_dir=cache_dir):
            fourth = status(mp)["snapshot"]
            assert (mp / "dog" / "added.jpg").read_bytes() == b"new file"
    finally:
        (tree / "dog" / "added.jpg").unlink()
    assert not first["reused"] and second["reused"] and not third["reused"] and not fourth["reused"]
    assert second["fingerprint"] == first["fingerprint"] != fourth["fingerprint"]
    assert third["reason"] == "rescan requested"
    assert fourth["reason"] == "source changed since the persisted snapshot"


def test_kill_9_then_umount_cleans_up(tree: Path, mountpoint: Path, cache_dir: Path) -> None:
    """A dead daemon's mount ("Transport endpoint is not connected") is cleaned by seerfs umount."""
    seerfs("mount", str(tree), str(mountpoint), "-o", f"cache_dir={cache_dir}", check=True)
    try:
        pid = status(mountpoint)["pid"]
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: not os.path.exists(f"/proc/{pid}"), what="daemon death")
        with pytest.raises(OSError) as exc:
            os.listdir(mountpoint)
        assert exc.value.errno == errno.ENOTCONN
        res = seerfs("umount", str(mountpoint))
        assert res.returncode == 0, res.stderr
        assert not is_mounted(mountpoint) and os.listdir(mountpoint) == []
        with mounted(tree, mountpoint, cache_dir=cache_dir):
            assert (mountpoint / "cat" / "a.jpg").read_bytes() == (tree / "cat" / "a.jpg").read_bytes()
    finally:
        force_unmount(mountpoint)


def test_umount_busy_names_holder_and_lazy_works(tree: Path, mountpoint: Path, cache_dir: Path) -> None:
    seerfs("mount", str(tree), str(mountpoint), "-o", f"cache_dir={cache_dir}", check=True)
    holder = subprocess.Popen(["sleep", "60"], cwd=mountpoint / "cat")
    try:
        res = seerfs("umount", str(mountpoint))
        assert res.returncode == 8, res.stderr
        assert f"{holder.pid} (sleep)" in res.stderr and "--lazy" in res.stderr
        assert is_mounted(mountpoint)
        res = seerfs("umount", "--lazy", str(mountpoint))
        assert res.returncode == 0, res.stderr
        assert not is_mounted(mountpoint)
    finally:
        holder.kill()
        holder.wait()
        force_unmount(mountpoint)


def test_mount_type_fuse_seerfs_with_mount8(tree: Path, mountpoint: Path, cache_dir: Path, tmp_path: Path) -> None:
    """`mount -t fuse 'HELPER#SRC' MNT -o config=FILE,...` (an fstab line) mounts; umount(8) unmounts.

    mount(8) clears PATH for its helpers, so the link-free form names the console script by its
    absolute path (`-t fuse.seerfs` needs seerfs in /usr/local/bin or the like: see test_wheel.py).
    """
    cfg = tmp_path / "seerfs.yaml"
    cfg.write_text(f"cache_dir: {cache_dir}\njob:\n  epochs: 3\n")
    helper = Path(sys.executable).parent / "seerfs"
    assert helper.is_file()
    opts = f"config={cfg},noauto,nodev,job.batch_size=4"
    res = subprocess.run(
        ["mount", "-t", "fuse", f"{helper}#{tree}", str(mountpoint), "-o", opts],
        capture_output=True,
        text=True,
        timeout=60,
    )
    try:
        assert res.returncode == 0, res.stderr
        assert is_mounted(mountpoint)
        config_text = (mountpoint / ".control" / "config").read_text()
        assert "epochs: 3" in config_text and "batch_size: 4" in config_text
        assert (mountpoint / "cat" / "a.jpg").read_bytes() == (tree / "cat" / "a.jpg").read_bytes()
        pid = status(mountpoint)["pid"]
        assert subprocess.run(["umount", str(mountpoint)], capture_output=True).returncode == 0
        wait_for(lambda: not os.path.exists(f"/proc/{pid}"), what="daemon exit after umount(8)")
        assert not is_mounted(mountpoint)
    finally:
        force_unmount(mountpoint)
