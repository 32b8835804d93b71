"""The front seam (``fusefs.fuse.front``): the recording kernel the in-process tests use and both
fronts' kernels (pyfuse3, native) keep one contract (``kernel_contract.run_contract``), and the
pyfuse3 handlers turn the binding-free answers and errors into pyfuse3's."""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import subprocess
import sys
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import pyfuse3
import pytest
import trio
from e2e import make_source
from kernel_contract import KNOWN, OPENS_WHILE_BLOCKED, STORED, UNKNOWN, run_contract
from mounting import mounted, status, wait_for
from readpath_fakes import RecordingKernel

from fusefs.errors import FsError
from fusefs.fuse.front import Context
from fusefs.fuse.pyfuse3_front import Pyfuse3Operations
from tools.harness.mounts import FRONT_ENV

HERE = Path(__file__).resolve().parent


def recording_log() -> list[list[object]]:
    kernel = RecordingKernel()
    kernel.unknown.add(UNKNOWN)  # as the real kernel before any lookup of b
    log = run_contract(kernel)
    assert kernel.pushed == [KNOWN, UNKNOWN] and kernel.invalidated == [KNOWN, UNKNOWN, UNKNOWN]
    return log


def test_the_recording_kernel_keeps_the_kernel_contract() -> None:
    log = recording_log()
    assert [c[0] for c in log][:4] == ["notify_store", "read_pages", "invalidate_inode", "read_pages"]


def _native_built() -> bool:
    try:
        import fusefs.fuse.native_front  # noqa: F401
    except ImportError:
        return False
    return True


FRONTS = [
    "pyfuse3",
    pytest.param(
        "native", marks=pytest.mark.skipif(not _native_built(), reason="fusefs.fuse._native not built (libfuse3-dev)")
    ),
]


@pytest.mark.skipif(not _native_built(), reason="fusefs.fuse._native not built (libfuse3-dev)")
def test_the_native_front_folds_an_open_and_its_release_into_a_visit_only_with_nothing_on_the_file_between() -> None:
    """fold()'s rules, on what drain() would hand trio for these ring records: an open and the release
    of the same handle become one visit at the open's place (pid the opener's) when no other event on
    that inode lies between them, in one run of events; events of other files between do not stop it,
    a second open of the file, the daemon's own open (a read back), a forwarded request (it ends the
    run) or a release of another handle do.  Fails if fold() folds across any of those or misses one."""
    from fusefs.fuse import _native

    o, r, getattr_op = _native.EV_OPEN, _native.EV_RELEASE, _native.OP_GETATTR
    v = _native.EV_VISIT
    records = [
        (o, 5, 50, 0, 100),  # visit: open and release of 5, with 6's open and 7's release between
        (o, 6, 60, 0, 101),  # not folded: 6 opened again (handle 61) before its release
        (r, 7, 70, 0, 0),  # a release whose open was in an earlier drain
        (r, 5, 50, 0, 0),
        (o, 6, 61, 0, 102),
        (r, 6, 60, 0, 0),
        (r, 6, 61, 0, 0),  # the scan for 6/61 stops at 6/60's release: left too
        (o, 8, 80, 1, 103),  # a read back (own thread): never folded
        (r, 8, 80, 0, 0),
        (o, 9, 0, 0, 104),  # fanotify's (fh 0): a visit, twice in a row
        (r, 9, 0, 0, 0),
        (o, 9, 0, 0, 105),
        (r, 9, 0, 0, 0),
        (o, 10, 90, 0, 106),  # a forwarded request between: two runs, nothing folded
        (getattr_op, 10, 0, 0, 0),
        (r, 10, 90, 0, 0),
        (o, 11, 91, 0, 107),  # a release of another handle of the file: not this open's
        (r, 11, 92, 0, 0),
    ]
    runs = _native.fold_events(records)
    assert runs[0][:2] == (_native.EV_BATCH, 0) and runs[1] == (getattr_op,) and runs[2][:2] == (_native.EV_BATCH, 0)
    quads = [tuple(runs[0][2][i : i + 4]) for i in range(0, len(runs[0][2]), 4)]
    assert quads == [
        (v, 5, 50, 100),
        (1, 6, 60, 101),
        (0, 7, 70, 0),
        (1, 6, 61, 102),
        (0, 6, 60, 0),
        (0, 6, 61, 0),
        (2, 8, 80, 103),
        (0, 8, 80, 0),
        (v, 9, 0, 104),
        (v, 9, 0, 105),
        (1, 10, 90, 106),
    ]
    assert runs[2][2] == [0, 10, 90, 0, 1, 11, 91, 107, 0, 11, 92, 0]
    assert len(runs) == 3


@pytest.mark.mount
@pytest.mark.parametrize("front", FRONTS)
def test_each_front_keeps_the_same_contract_under_a_real_mount(mountpoint: Path, front: str) -> None:
    """Under a real mount: the same calls with the same arguments have the same outcomes as on the
    recording kernel; stored pages serve a reader without a READ reaching the daemon, and after
    invalidate_inode its READs do; invalidate_entry makes the next lookup reach the daemon.  With
    pages marked cached (set_pages) the native front answers the open itself and tells the daemon
    (an open and a release event), pyfuse3 sends it to the daemon; invalidate_inode unmarks; pages
    dropped while such a handle is open make its READs reach the daemon, which knows the handle;
    with the trio thread held up, opens that find the native front's ring full are forwarded."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE.parent), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, str(HERE / "kernel_contract.py"), str(mountpoint), front],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["log"] == recording_log()
    seen = out["seen"]
    assert seen["reader_after_store"] == f"{len(STORED)} bytes sha256:" + _sha(STORED)
    assert seen["reads_reaching_daemon_after_store"] == 0
    assert seen["reader_after_invalidate"] == f"{len(STORED)} bytes sha256:" + _sha(b"d" * len(STORED))
    assert seen["reads_reaching_daemon_after_invalidate"] > 0
    assert seen["lookups_of_a_while_cached"] == 0
    assert seen["lookups_of_a_after_invalidate_entry"] == 1
    assert seen["reader_while_marked"] == f"{len(STORED)} bytes sha256:" + _sha(STORED)
    native = front == "native"
    assert seen["opens_reaching_daemon_while_marked"] == (0 if native else 1)
    assert seen["opens_reaching_daemon_after_invalidate"] == (1 if native else 2)
    assert seen["read_after_drop_while_open"] == f"{len(STORED)} bytes sha256:" + _sha(b"d" * len(STORED))
    assert seen["reads_after_drop_on_known_handles"] is True
    assert seen["native_events"] == ([2, 2] if native else [0, 0])
    if native:  # a full ring forwards the open (it waits for room): no open is answered unbooked
        ring = seen["ring_overflow"]
        # whichever found it full (an open, or a release) was forwarded, not answered natively
        assert ring["ring_full"] > 0 and ring["opens_forwarded"] + ring["releases_forwarded"] > 0, ring
        assert ring["open_events_booked"] == ring["native_opens"] > 0, ring
        assert ring["release_events_booked"] == ring["native_releases"], ring
        assert ring["native_opens"] + ring["opens_forwarded"] == OPENS_WHILE_BLOCKED, ring


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


class _Handlers:
    """Binding-free answers, as SeerOperations gives them."""

    supports_dot_lookup = True
    enable_writeback_cache = False
    enable_acl = False

    def __init__(self) -> None:
        self.entries: list[tuple[bytes, object, int]] = []

    async def lookup(self, parent: int, name: bytes, ctx: object) -> object:
        raise FsError(errno.ENOENT)

    async def getattr(self, inode: int, ctx: object) -> object:
        return pyfuse3.EntryAttributes()

    async def read(self, fh: int, off: int, size: int) -> bytes:
        raise ValueError("a bug")


def test_the_pyfuse3_handlers_answer_fs_errors_with_fuse_errors_and_let_bugs_through() -> None:
    """FsError becomes the FUSEError pyfuse3 replies with (same errno); any other exception stays
    itself, so pyfuse3 treats a bug as before; answers pass through untouched."""
    ops = Pyfuse3Operations(_Handlers())  # type: ignore[arg-type]
    ctx = Context()

    async def body() -> None:
        with pytest.raises(pyfuse3.FUSEError) as failed:
            await ops.lookup(pyfuse3.InodeT(1), b"x", ctx)  # type: ignore[arg-type]
        assert failed.value.errno == errno.ENOENT
        assert isinstance(await ops.getattr(pyfuse3.InodeT(1), ctx), pyfuse3.EntryAttributes)  # type: ignore[arg-type]
        with pytest.raises(ValueError):
            await ops.read(pyfuse3.FileHandleT(1), 0, 1)

    trio.run(body)
    assert ops.supports_dot_lookup and not ops.enable_writeback_cache and not ops.enable_acl


def _expected_front() -> str:
    """The front a plain mount serves through here: SEERFS_TEST_FRONT (tools/run-tests' second pass),
    else the default, native where the extension was built."""
    return os.environ.get(FRONT_ENV) or ("native" if _native_built() else "pyfuse3")


@pytest.mark.mount
def test_native_opens_are_booked_within_moments_without_a_request_to_wake_the_daemon(tmp_path: Path) -> None:
    """Open and release events do not wake a busy daemon (one wake per drain, not per open); its
    own timer brings it back to book them.  Warm opens answered in C, then nothing through FUSE:
    the metrics endpoint (TCP, not a FUSE request, so nothing else wakes the ring's drain) shows
    every open booked within seconds, served from the page cache.  Without the timer the events
    after the first drain stay in the ring until the next request."""
    if _expected_front() != "native":
        pytest.skip("the native front is not in use (not built, or the pyfuse3 pass)")
    src = tmp_path / "src"
    digests, _total = make_source(src, 60, 0, mean_size=20000)
    rels = sorted(digests)
    with mounted(
        src, tmp_path / "mnt", "-o", "metrics.enabled=true,metrics.port=0", cache_dir=tmp_path / "cache"
    ) as mnt:
        for rel in rels:
            (mnt / rel).read_bytes()
        url = status(mnt)["metrics"]["url"]
        before = status(mnt)  # the last FUSE request: the release events after it wake nobody

        def booked() -> float:
            with urllib.request.urlopen(url, timeout=30) as res:
                text = res.read().decode()
            return sum(
                float(line.split()[-1]) for line in text.splitlines() if line.startswith("seerfs_reads_opens_total")
            )

        for rel in rels:
            (mnt / rel).read_bytes()
        wait_for(
            lambda: booked() >= before["reads"]["opens"] + len(rels), 10, "the warm opens booked, nothing else asked"
        )
        after = status(mnt)
    assert after["front"]["native_opens"] - before["front"]["native_opens"] == len(rels)
    page_cache = (
        after["reads"]["by_source"]["page_cache"]["files"] - before["reads"]["by_source"]["page_cache"]["files"]
    )
    assert page_cache == len(rels)


@pytest.mark.mount
def test_status_names_the_front_in_use_and_both_count_warm_opens_alike(tmp_path: Path) -> None:
    """A real daemon: the bytes are the source's on both passes; status names the front; the second,
    warm pass (pages kept after the first) is answered natively on the native front (one native open
    and release per file, no open forwarded) and through the daemon on pyfuse3, and the daemon's own
    bookkeeping (opens counted, page-cache opens) is the same on both."""
    src = tmp_path / "src"
    digests, _total = make_source(src, 40, 0, mean_size=20000)
    rels = sorted(digests)
    originals = {rel: (src / rel).read_bytes() for rel in rels}
    with mounted(src, tmp_path / "mnt", cache_dir=tmp_path / "cache") as mnt:
        first = {rel: (mnt / rel).read_bytes() for rel in rels}
        before = status(mnt)
        second = {rel: (mnt / rel).read_bytes() for rel in rels}
        if _expected_front() == "native":  # the kernel sends RELEASE after close() returned
            done = before["front"]["native_releases"] + len(rels)
            wait_for(lambda: status(mnt)["front"]["native_releases"] >= done, what="the last releases")
        after = status(mnt)
    assert first == originals and second == originals
    name = _expected_front()
    assert after["front"]["name"] == name
    assert after["reads"]["opens"] - before["reads"]["opens"] == len(rels)
    page_cache = (
        after["reads"]["by_source"]["page_cache"]["files"] - before["reads"]["by_source"]["page_cache"]["files"]
    )
    assert page_cache == len(rels), "the warm pass was not served from kept pages"
    native = after["front"]["native_opens"] - before["front"]["native_opens"]
    released = after["front"]["native_releases"] - before["front"]["native_releases"]
    assert (native, released) == ((len(rels), len(rels)) if name == "native" else (0, 0))
    if name == "native":  # some opens were booked folded with their release, and counted alike (above)
        assert after["front"]["visits"] > before["front"]["visits"]


def test_a_native_front_that_does_not_load_falls_back_to_pyfuse3_with_one_info_line(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """fuse.front: native without the extension (not built, or libfuse3 missing at load): pyfuse3
    serves, and the log says why in one INFO line."""
    from fusefs.daemon.assembly import make_front
    from fusefs.fuse.pyfuse3_front import Pyfuse3Front

    monkeypatch.setitem(sys.modules, "fusefs.fuse.native_front", None)  # its import raises ImportError
    tree = SimpleNamespace(path=lambda entry: b"x", __len__=lambda: 1)
    with caplog.at_level(logging.INFO, logger="fusefs.daemon.assembly"):
        front = make_front("native", SimpleNamespace(tree=tree))  # type: ignore[arg-type]
    assert isinstance(front, Pyfuse3Front)
    lines = [r for r in caplog.records if "native FUSE front not available" in r.getMessage()]
    assert len(lines) == 1 and lines[0].levelno == logging.INFO
    assert isinstance(make_front("pyfuse3", SimpleNamespace(tree=tree)), Pyfuse3Front)  # type: ignore[arg-type]


def _stat_fields(st: os.stat_result) -> tuple[int, ...]:
    return (st.st_mode, st.st_nlink, st.st_uid, st.st_gid, st.st_size, st.st_mtime_ns)


def _mounted_stat(st: os.stat_result) -> tuple[int, ...]:
    """What a stat through the mount must give: the source's fields, and blocks of 512 bytes by size
    (the source's allocation is its file system's, not a property of the file)."""
    assert st.st_blocks == (st.st_size + 511) // 512 and st.st_blksize == 128 * 1024
    return _stat_fields(st)


@pytest.mark.mount
@pytest.mark.parametrize("front", FRONTS)
def test_attributes_are_the_sources_on_both_fronts_and_answered_in_c_on_the_native_one(
    tmp_path: Path, front: str
) -> None:
    """Every entry's attributes through the mount are the source's (mode, links, owner, size, mtime;
    blocks by size), on either front.  A cold read through CPython's open() makes the kernel ask GETATTR again
    (a READ answered by the daemon marks atime stale; the fstat open() makes wants it): on the native
    front each of those is answered from the snapshot's arrays in C (counted in native_getattrs),
    on pyfuse3 by the daemon (native_getattrs stays 0)."""
    src = tmp_path / "src"
    digests, _total = make_source(src, 24, 0, mean_size=20000)
    rels = sorted(digests)
    dirs = sorted({str(Path(rel).parent) for rel in rels} | {"train"})
    with mounted(src, tmp_path / "mnt", "-o", f"fuse.front={front}", cache_dir=tmp_path / "cache") as mnt:
        for rel in [*dirs, *rels]:
            assert _mounted_stat(os.stat(mnt / rel)) == _stat_fields(os.lstat(src / rel)), rel
        before = status(mnt)["front"]
        for rel in rels:
            with open(mnt / rel, "rb") as fh:  # default buffering: fstat, and on CPython <= 3.13 isatty
                assert hashlib.sha1(fh.read()).hexdigest() == digests[rel], rel
        for rel in rels:
            with open(mnt / rel, "rb") as fh:  # the second open's fstat: atime stale since the first's READs
                assert _mounted_stat(os.fstat(fh.fileno())) == _stat_fields(os.lstat(src / rel)), rel
        after = status(mnt)["front"]
    assert after["name"] == front
    answered = after["native_getattrs"] - before["native_getattrs"]
    if front == "native":
        assert answered >= len(rels), (before, after)
    else:
        assert answered == 0
