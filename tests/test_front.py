"""The front seam (``fusefs.fuse.front``): the recording kernel the in-process tests use and the
pyfuse3 front's kernel keep one contract (``kernel_contract.run_contract``), and the pyfuse3
handlers turn the binding-free answers and errors into pyfuse3's."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pyfuse3
import pytest
import trio
from kernel_contract import KNOWN, STORED, UNKNOWN, run_contract
from readpath_fakes import RecordingKernel

from fusefs.errors import FsError
from fusefs.fuse.front import Context
from fusefs.fuse.pyfuse3_front import Pyfuse3Operations

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


@pytest.mark.mount
def test_the_pyfuse3_front_keeps_the_same_contract_under_a_real_mount(mountpoint: Path) -> None:
    """Under a real mount: the same calls with the same arguments have the same outcomes as on the
    recording kernel; stored pages serve a reader without a READ reaching the daemon, and after
    invalidate_inode its READs do; invalidate_entry makes the next lookup reach the daemon."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE.parent), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, str(HERE / "kernel_contract.py"), str(mountpoint)],
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
