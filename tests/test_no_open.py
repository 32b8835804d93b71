"""``fuse.no_open``: zero FUSE requests per warm open, opens seen through fanotify (root only).

Real mounts through the native front with the mode on: the kernel is told OPEN is not implemented
(ENOSYS), so it sends neither OPEN nor RELEASE again and READs come without a handle, served by
inode; the daemon learns of each open and close, with its pid, from a fanotify mount mark.  These
tests prove the bytes (against digests taken from the source before the mount), that the cursor and
counters see every reader's open and none of the daemon's own, that a warm pass costs no request,
that a source change fails reads with EIO (an open cannot fail in this mode), and a clean unmount.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from e2e import make_source, wait_plan, write_seed
from mounting import fuse_mounts, mounted, status, wait_for

from fusefs.cluster.protocol import FileId
from fusefs.meta.snapshot import load_or_scan
from placement.randperm import randperm
from tools.harness.jobs import Job
from tools.harness.nodes import held_only_get, rendezvous_group


def _why_not() -> str | None:
    try:
        from fusefs.fuse.native_front import may_watch
    except ImportError:
        return "fusefs.fuse._native not built (libfuse3-dev)"
    if not may_watch():
        return "no CAP_SYS_ADMIN: fanotify mount marks need it"
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse"
    return None


pytestmark = [pytest.mark.mount, pytest.mark.skipif(_why_not() is not None, reason=str(_why_not()))]


def _status_when(mnt: Path, ok: Callable[[dict[str, Any]], bool], what: str, timeout: float = 20) -> dict[str, Any]:
    """The first status document that satisfies ``ok`` (in this mode one is rendered at most once a second)."""

    def check() -> dict[str, Any] | None:
        doc = status(mnt)
        return doc if ok(doc) else None

    found: dict[str, Any] = wait_for(check, timeout, what)
    return found


def _armed(mnt: Path) -> dict[str, Any]:
    return _status_when(mnt, lambda d: d["front"]["open_mode"] == "no_open", "no_open armed")


def _digests(mnt: Path, rels: list[str]) -> dict[str, str]:
    return {rel: hashlib.sha1((mnt / rel).read_bytes()).hexdigest() for rel in rels}


_CHILD = """
import hashlib, json, sys
root, rels = sys.argv[1], json.loads(sys.stdin.read())
print(json.dumps({r: hashlib.sha1(open(root + "/" + r, "rb").read()).hexdigest() for r in rels}))
"""


def _digests_in_child(mnt: Path, rels: list[str]) -> dict[str, str]:
    """One pass read by a process of its own: fanotify merges a queued event with a later one of the
    same file and process (one pid reopening a file before the daemon read the queue is booked
    once), so counting tests give each pass its own pid."""
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, str(mnt)], input=json.dumps(rels), capture_output=True, text=True, check=True
    )
    got: dict[str, str] = json.loads(out.stdout)
    return got


def test_every_file_is_served_right_and_warm_opens_cost_no_request(tmp_path: Path) -> None:
    """Cold and warm passes give the source's bytes; every reader open is counted once (fanotify),
    and after the first warm pass (one GETATTR per file: READs made the kernel drop the size it
    knew) three more warm passes cost the daemon no request at all: no OPEN, no RELEASE, no READ."""
    src = tmp_path / "src"
    manifest, _ = make_source(src, 40, 0, mean_size=20_000)
    rels = sorted(manifest)
    with mounted(src, tmp_path / "mnt", "-o", "fuse.no_open=on", cache_dir=tmp_path / "cache") as mnt:
        _armed(mnt)
        assert _digests_in_child(mnt, rels) == manifest  # cold: each file's first READ fetches it
        assert _digests_in_child(mnt, rels) == manifest  # warm
        before = _status_when(mnt, lambda d: d["reads"]["opens"] == 2 * len(rels), "the opens booked")
        for _ in range(3):
            assert _digests_in_child(mnt, rels) == manifest
        after = _status_when(mnt, lambda d: d["reads"]["opens"] == 5 * len(rels), "the warm opens booked")
    assert fuse_mounts(tmp_path) == []
    front, was = after["front"], before["front"]
    assert front["name"] == "native" and front["open_mode"] == "no_open" and front["fanotify"] == "fid"
    assert front["native_opens"] == front["native_releases"] == 0 and front["opens_answered_enosys"] >= 1
    assert front["observed_opens"] - was["observed_opens"] >= 3 * len(rels)
    assert front["observed_overflows"] == 0
    # Most opens reach the daemon folded with their close (one event, booked as one step), and are
    # counted the same (below): the readers made 3 * len(rels) opens.
    assert front["visits"] - was["visits"] > 0
    # The status reads themselves (a lookup, a getattr, a read) are the only requests in between.
    assert front["forwarded"] - was["forwarded"] <= 6, (was, front)
    page_cache = (
        after["reads"]["by_source"]["page_cache"]["files"] - before["reads"]["by_source"]["page_cache"]["files"]
    )
    assert page_cache == 3 * len(rels)


def test_a_seed_written_job_is_predicted(tmp_path: Path) -> None:
    """The seed is written through the mount (a WRITE without a handle) and read back; the plan
    follows, and a reader that opens the files in that seed's epoch-0 order has its opens, seen only
    through fanotify, predicted by the cursor."""
    src = tmp_path / "src"
    manifest, _ = make_source(src, 60, 0, mean_size=12_000)
    rels = sorted(manifest)  # ImageFolder's order for these names (classes, then files, sorted)
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"cache_dir: {tmp_path / 'cache'}\ndatasets: [{{root: train}}]\nfuse: {{no_open: on}}\n")
    seed = 7
    order = [rels[int(i)] for i in randperm(len(rels), seed)]  # DistributedSampler(seed=7), epoch 0, one rank
    with mounted(src, tmp_path / "mnt", "-c", str(cfg)) as mnt:
        _armed(mnt)
        write_seed(mnt, seed)
        wait_plan(mnt, seed)
        assert (mnt / ".control" / "seed").read_text() == f"{seed}\n"
        assert _digests_in_child(mnt, order) == manifest
        doc = _status_when(mnt, lambda d: d["reads"]["opens"] == len(rels), "the opens booked")
        # the cursor takes the booked opens in its own turns (10-30 ms apart)
        doc = _status_when(mnt, lambda d: d["prefetch"]["cursor"]["step"] >= len(rels), "the cursor's steps")
    assert doc["prefetch"]["predicted_opens"] >= len(rels) - 2, doc["prefetch"]
    assert doc["reads"]["opens"] == len(rels)
    assert fuse_mounts(tmp_path) == []


def test_the_daemons_own_reads_back_are_not_a_readers_opens(tmp_path: Path) -> None:
    """tests/test_readback.py in this mode: a peer's held-only request is served by reading the
    kept pages back through the mount.  fanotify reports that open with the daemon's pid: dropped,
    not booked (the open count does not move).  Once the pages are dropped, the read back's READ
    (no handle, the daemon's thread) is refused at once, never fetched."""
    root = tmp_path / "pfs"
    digests, _total = make_source(root, 40, 0, mean_size=50_000)
    rel = sorted(digests)[7]
    snap, _ = load_or_scan(str(root), tmp_path / "test-cache")  # entry numbers: the same walk
    entry = 0
    for part in rel.split("/"):
        entry = snap.tree.find_child(entry, part.encode())
    ident = FileId(entry, int(snap.tree.size[entry]), int(snap.tree.mtime_ns[entry]))
    job = Job(world_size=1, epochs=1, batch_size=4, num_workers=0, seed=0)
    tiers = [{"kind": "directory", "path": str(tmp_path / "tier"), "bytes": 1}]
    with rendezvous_group(
        root,
        tmp_path,
        job,
        tier_bytes=0,
        n=1,
        tiers=tiers,
        prefetch={"lookahead_bytes": "8MiB"},
        seed_discovery={"enabled": False},
        fuse={"no_open": "on"},
    ) as mnts:
        mnt = mnts[0]
        _armed(mnt)
        token = bytes.fromhex((tmp_path / "rendezvous" / "token").read_text().strip())
        address = next(m["address"] for m in status(mnt)["group"]["members"] if m["state"] == "self")
        assert _digests_in_child(mnt, [rel]) == {rel: digests[rel]}  # a reader: pages kept
        before = _status_when(mnt, lambda d: d["prefetch"]["staging"]["kept_files"] == 1, "the pages kept")
        assert before["reads"]["opens"] == 1
        data = held_only_get(address, token, ident)
        assert data is not None and hashlib.sha1(data).hexdigest() == digests[rel]
        # one event, or two: fanotify merges an open and its close still queued
        after = _status_when(mnt, lambda d: d["front"]["own_opens_dropped"] >= 1, "the read back's open seen")
        assert after["prefetch"]["staging"]["read_backs"] == 1
        assert after["reads"]["opens"] == 1  # the read back is no reader's open

        fd = os.open(mnt / rel, os.O_RDONLY)  # drop the file's pages from the page cache
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
        assert held_only_get(address, token, ident) is None  # its READ refused: no fetch
        _status_when(mnt, lambda d: d["prefetch"]["staging"]["read_back_misses"] == 1, "the miss counted")
        assert _digests_in_child(mnt, [rel]) == {rel: digests[rel]}  # a reader still gets it
        doc = _status_when(mnt, lambda d: d["reads"]["opens"] == 3, "the readers' opens booked")
    assert doc["front"]["observed_overflows"] == 0
    assert fuse_mounts(tmp_path) == []


def test_a_changed_source_fails_reads_with_eio(tmp_path: Path) -> None:
    """In no_open mode an open cannot fail: once the daemon has seen a file's source change, the
    file's pages are dropped and its reads fail with EIO; the other files still read right."""
    src = tmp_path / "src"
    manifest, _ = make_source(src, 30, 0, mean_size=3_000)
    rels = sorted(manifest)
    victim = rels[5]
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        f"cache_dir: {tmp_path / 'cache'}\ndatasets: [{{root: train}}]\n"
        f"tiers: [{{kind: directory, path: {tmp_path / 'ssd'}, bytes: 64MiB}}]\n"
        "snapshot: {revalidate_round_min_s: 1}\nfuse: {no_open: on}\n"
    )
    with mounted(src, tmp_path / "mnt", "-c", str(cfg)) as mnt:
        _armed(mnt)
        assert _digests(mnt, rels) == manifest
        path = src / victim
        old = path.stat()
        path.write_bytes(bytes(b ^ 0x5A for b in path.read_bytes()))  # same size, new bytes
        os.utime(path, ns=(old.st_atime_ns, old.st_mtime_ns))  # only ctime tells

        def failed() -> bool:
            try:
                data = (mnt / victim).read_bytes()
            except OSError as exc:
                assert exc.errno == errno.EIO, exc
                return True
            assert hashlib.sha1(data).hexdigest() == manifest[victim], "new bytes under the old version"
            return False

        wait_for(failed, 30, "the change seen and the reads failing")
        with pytest.raises(OSError) as err:
            (mnt / victim).read_bytes()
        assert err.value.errno == errno.EIO  # and from then on
        assert {r: d for r, d in _digests(mnt, [r for r in rels if r != victim]).items()} == {
            r: manifest[r] for r in rels if r != victim
        }
        doc = _status_when(mnt, lambda d: victim in d["revalidation"]["changed"], "the change in status")
    assert victim in doc["reads"]["stale_files"]
    assert fuse_mounts(tmp_path) == []


def test_a_file_above_whole_file_max_is_read_in_ranges_by_inode(tmp_path: Path) -> None:
    """A big file (above fuse.whole_file_max) is read from the source in ranges, by inode, through
    READs that carry no handle; twice, by two processes, and each time whole and right."""
    src = tmp_path / "src"
    (src / "train" / "c0").mkdir(parents=True)
    big = os.urandom(3 << 20)
    (src / "train" / "c0" / "big.bin").write_bytes(big)
    (src / "train" / "c0" / "small.bin").write_bytes(os.urandom(5000))
    manifest = {str(p.relative_to(src)): hashlib.sha1(p.read_bytes()).hexdigest() for p in src.rglob("*.bin")}
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        f"cache_dir: {tmp_path / 'cache'}\ndatasets: [{{root: train}}]\nfuse: {{no_open: on, whole_file_max: 256KiB}}\n"
    )
    with mounted(src, tmp_path / "mnt", "-c", str(cfg)) as mnt:
        _armed(mnt)
        assert _digests_in_child(mnt, sorted(manifest)) == manifest
        assert _digests_in_child(mnt, sorted(manifest)) == manifest
        doc = _status_when(mnt, lambda d: d["reads"]["opens"] == 4, "the opens booked")
    assert doc["reads"]["by_source"]["pfs"]["files"] >= 1
    assert fuse_mounts(tmp_path) == []


def test_the_seed_is_rewritten_by_truncating_writes_after_a_refused_one(tmp_path: Path) -> None:
    """Without OPEN, ``echo N > .control/seed`` must still start the seed's text afresh: the kernel
    truncates through SETATTR (atomic O_TRUNC is off in this mode), so a refused seed leaves
    nothing behind for the next write."""
    src = tmp_path / "src"
    make_source(src, 10, 0, mean_size=2_000)
    with mounted(src, tmp_path / "mnt", "-o", "fuse.no_open=on", cache_dir=tmp_path / "cache") as mnt:
        _armed(mnt)
        seed = mnt / ".control" / "seed"
        write_seed(mnt, 41)
        with pytest.raises(OSError) as err:
            seed.write_text("9" * 200 + "\n")  # outside torch's range: refused
        assert err.value.errno == errno.EINVAL
        write_seed(mnt, 42)
        doc = _status_when(mnt, lambda d: d["seed"]["value"] == 42, "the seed rewritten")
        assert seed.read_text() == "42\n"
    assert doc["seed"]["origin"] == "written"
    assert fuse_mounts(tmp_path) == []
