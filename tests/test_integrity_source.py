"""A changed source file is never served from a cached copy once seen, and never mixed in one read.

Each test changes the source under a real mount the way users and tools do (rewrite in place, rewrite
with the mtime put back, replace by rename, a FIFO in a file's place) and checks the bytes against
the source read directly, the errors the reader gets, and what status reports.  The PFS emulator's
own counters prove that the revalidation stats reach the PFS (it runs with attribute caching off).
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
from e2e import make_source
from mounting import mounted, seerfs, status, wait_for
from pfsemu_fixture import requires_fuse, running_pfsemu

pytestmark = pytest.mark.mount


def _config(tmp_path: Path, **extra: str) -> Path:
    cfg = tmp_path / "c.yaml"
    lines = [
        f"cache_dir: {tmp_path / 'cache'}",
        "datasets: [{root: train}]",
        f"tiers: [{{kind: directory, path: {tmp_path / 'ssd'}, bytes: 64MiB}}]",
        # A RAM budget too small to keep pages: second reads come from the directory tier.
        "prefetch: {lookahead_bytes: 32KiB}",
        *(f"{k}: {v}" for k, v in extra.items()),
    ]
    cfg.write_text("\n".join(lines) + "\n")
    return cfg


def _tier_files(tier: Path) -> dict[int, Path]:
    return {int(p.name): p for p in tier.rglob("*") if p.is_file() and p.name.isdigit()}


def _entry(mnt: Path, rel: str) -> int:
    return os.stat(mnt / rel).st_ino - 1  # inode = snapshot entry + 1


def _fill_tier(mnt: Path, src: Path, rels: list[str], tier: Path) -> None:
    for rel in rels:
        assert (mnt / rel).read_bytes() == (src / rel).read_bytes(), rel
    wait_for(lambda: len(_tier_files(tier)) == len(rels), timeout=30, what="every file in the directory tier")


def _read_errno(path: Path) -> int:
    try:
        path.read_bytes()
    except OSError as exc:
        return exc.errno or 0
    return 0


@pytest.mark.parametrize("how", ["rewritten_mtime_restored", "replaced_by_rename"])
def test_a_change_is_seen_while_mounted_and_a_remount_serves_the_new_content(tmp_path: Path, how: str) -> None:
    src = tmp_path / "src"
    digests, _ = make_source(src, 40, 0, mean_size=3000)
    rels = sorted(digests)
    victim = rels[7]
    # The default rate, rounds of at least a second (not the default 300 s): 40 files are checked every second.
    cfg = _config(tmp_path, snapshot="{revalidate_round_min_s: 1}")
    with mounted(src, tmp_path / "mnt", "-c", str(cfg)) as mnt:
        _fill_tier(mnt, src, rels, tmp_path / "ssd")
        entry = _entry(mnt, victim)
        assert entry in _tier_files(tmp_path / "ssd")
        path = src / victim
        old = path.stat()
        invalidations = status(mnt)["prefetch"]["staging"]["invalidations"]
        new = bytes(b ^ 0x5A for b in path.read_bytes())  # same size, every byte different
        if how == "rewritten_mtime_restored":  # only ctime tells: rsync -t, cp -p, touch -d do this
            path.write_bytes(new)
            os.utime(path, ns=(old.st_atime_ns, old.st_mtime_ns))
        else:  # how most tools write files: a new inode under the old name
            tmp = path.with_name(path.name + ".new")
            tmp.write_bytes(new)
            os.utime(tmp, ns=(old.st_atime_ns, old.st_mtime_ns))
            os.rename(tmp, path)
        assert path.stat().st_size == old.st_size and path.stat().st_mtime_ns == old.st_mtime_ns
        seen: list[object] = []  # what each read of the file gave until the change was seen: old bytes or an error
        for _ in range(100):
            try:
                seen.append((mnt / victim).read_bytes() == (src / victim).read_bytes() or "old bytes")
            except OSError as exc:
                seen.append(exc.errno)
                break
            time.sleep(0.05)
        assert seen[-1] == errno.EIO, f"the change was not seen within 5 s of background rounds: {seen[-3:]}"
        assert True not in seen  # never the new bytes under the snapshot's version either
        doc = status(mnt)
        assert victim in doc["revalidation"]["changed"] and doc["revalidation"]["stats"]["background"] > 0
        assert _read_errno(mnt / victim) == errno.EIO  # and from then on
        assert entry not in _tier_files(tmp_path / "ssd"), "the stale copy was not dropped"
        wait_for(  # and its pages in the kernel's page cache (from the reads above) invalidated
            lambda: status(mnt)["prefetch"]["staging"]["invalidations"] > invalidations, 10, "the invalidation"
        )
        assert victim in doc["reads"]["stale_files"]
        for rel in rels:  # the others are still served, from their copies
            if rel != victim:
                assert (mnt / rel).read_bytes() == (src / rel).read_bytes(), rel
    with mounted(src, tmp_path / "mnt", "-c", str(cfg)) as mnt:  # a plain remount, no --rescan
        assert (mnt / victim).read_bytes() == new
        assert "changed since the persisted snapshot" in status(mnt)["snapshot"]["reason"]


@requires_fuse
def test_after_a_remount_each_cached_copy_is_served_only_after_one_stat_counted_by_the_pfs(tmp_path: Path) -> None:
    backing = tmp_path / "pfs"
    digests, total = make_source(backing, 40, 0, mean_size=3000)
    rels = sorted(digests)
    # A slow background rate: the stats counted here are the ones made before serving copies.
    cfg = _config(tmp_path, snapshot="{revalidate_per_s: 0.01}")
    with running_pfsemu(backing, extra_args=("--attr-timeout-s", "0")) as emu:
        with mounted(emu.mountpoint, tmp_path / "mnt", "-c", str(cfg)) as mnt:
            _fill_tier(mnt, backing, rels, tmp_path / "ssd")
        with mounted(emu.mountpoint, tmp_path / "mnt", "-c", str(cfg)) as mnt:
            # The PFS counters and seerfs's own start together: a stat made between reading one and
            # resetting the other would count on one side only, so read, reset, and read again.
            while True:
                before = status(mnt)["revalidation"]["stats"]
                emu.reset()
                if status(mnt)["revalidation"]["stats"] == before:
                    break
            for rel in rels:
                assert (mnt / rel).read_bytes() == (backing / rel).read_bytes(), rel
            pfs = emu.counters()
            doc = status(mnt)
        emu.reset()
        for rel in rels:  # what one stat of each file costs the PFS, measured without seerfs
            os.lstat(emu.mountpoint / rel)
        per_pass = emu.counters().meta_ops
    assert pfs.bytes == 0 and pfs.opens == 0  # every byte came from the directory tier ...
    assert doc["reads"]["by_source"]["directory"]["files"] == len(rels)
    # ... and each copy was served only after one stat of its source in this mount, which reached the
    # PFS: the emulator's metadata operations are exactly those of one lstat per file not yet checked
    # when the counters were reset (a background round may have checked one or two before).
    per_stat, rest = divmod(per_pass, len(rels))
    assert rest == 0 and per_stat >= 1
    stats = pfs.meta_ops // per_stat
    assert pfs.meta_ops == stats * per_stat, f"{pfs.meta_ops} metadata operations, {per_stat} per stat"
    assert stats + sum(before.values()) == len(rels), (stats, before)
    made = {k: v - before[k] for k, v in doc["revalidation"]["stats"].items()}
    assert sum(made.values()) == stats, made  # seerfs's own count agrees with the PFS's
    assert doc["revalidation"]["fresh_files"] == len(rels) and doc["revalidation"]["changed_total"] == 0
    assert total > 0


def test_a_file_rewritten_during_a_ranged_read_fails_instead_of_mixing(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "train" / "c").mkdir(parents=True)
    big = src / "train" / "c" / "big.jpg"
    old = os.urandom(8 << 20)
    big.write_bytes(old)
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"cache_dir: {tmp_path / 'cache'}\ndatasets: [{{root: train}}]\nfuse: {{whole_file_max: 256KiB}}\n")
    with mounted(src, tmp_path / "mnt", "-c", str(cfg)) as mnt:
        fd = os.open(mnt / "train" / "c" / "big.jpg", os.O_RDONLY)
        try:
            head = os.pread(fd, 512 << 10, 0)
            assert head == old[: 512 << 10]
            with open(big, "r+b") as fh:  # rewritten in place, same size
                fh.write(bytes(b ^ 0xFF for b in old[: 1 << 20]) * 8)
            got = bytearray(head)
            with pytest.raises(OSError) as err:
                while len(got) < len(old):
                    chunk = os.pread(fd, 1 << 20, len(got))
                    assert chunk, "short read"
                    got += chunk
            assert err.value.errno == errno.EIO
            assert bytes(got) == old[: len(got)], "bytes of two versions were mixed"
        finally:
            os.close(fd)
        assert "train/c/big.jpg" in status(mnt)["reads"]["stale_files"]


def test_a_fifo_in_place_of_a_source_file_reads_as_eio_instead_of_blocking(tmp_path: Path) -> None:
    src = tmp_path / "src"
    digests, _ = make_source(src, 10, 0, mean_size=2000)
    victim = sorted(digests)[3]
    with mounted(src, tmp_path / "mnt", "-o", "datasets.0.root=train", cache_dir=tmp_path / "cache") as mnt:
        (src / victim).unlink()
        os.mkfifo(src / victim)
        probe = "import sys\ntry:\n    open(sys.argv[1], 'rb').read()\nexcept OSError as e:\n    sys.exit(e.errno)\n"
        reader = subprocess.Popen([sys.executable, "-c", probe, str(mnt / victim)])
        try:
            code = reader.wait(timeout=15)
        except subprocess.TimeoutExpired:
            # The failure this test catches: the daemon's open of the FIFO blocks, and its reader with
            # it (not even SIGKILL ends it).  A writer end releases both.
            with contextlib.suppress(OSError):
                fd = os.open(src / victim, os.O_WRONLY | os.O_NONBLOCK)
                reader.kill()
                reader.wait(timeout=30)
                os.close(fd)
            pytest.fail("the read blocked on the FIFO for 15 s")
        assert code == errno.EIO
        assert "regular file" in status(mnt)["reads"]["stale_files"][victim]


def test_rescan_after_a_cached_file_changed_mounts_and_serves_the_new_bytes(tmp_path: Path) -> None:
    src = tmp_path / "src"
    digests, _ = make_source(src, 20, 0, mean_size=3000)
    rels = sorted(digests)
    victim = rels[2]
    cfg = _config(tmp_path)
    with mounted(src, tmp_path / "mnt", "-c", str(cfg)) as mnt:
        _fill_tier(mnt, src, rels, tmp_path / "ssd")
    (src / victim).write_bytes(b"grown " + (src / victim).read_bytes())
    for extra in (["--rescan"], []):  # and every mount after it
        with mounted(src, tmp_path / "mnt", "-c", str(cfg), *extra) as mnt:
            assert (mnt / victim).read_bytes() == (src / victim).read_bytes()
            for rel in rels:
                assert (mnt / rel).read_bytes() == (src / rel).read_bytes(), rel
    res = seerfs("status", str(tmp_path / "mnt"))
    assert res.returncode != 0  # unmounted cleanly in between
