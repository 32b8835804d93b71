"""A mount's read path assembled in one process, served under trio through the real Operations handlers.

Built as the daemon builds it (:func:`build_readpath`, :func:`build_operations`) over a real source
directory, real tiers and the real PFS reader; only the kernel's page-cache calls and the owning
peer are stand-ins (:mod:`readpath_fakes`).  No /dev/fuse: a test calls ``lookup``, ``open``,
``read`` and ``release`` as the kernel would.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import trio
from readpath_fakes import MemoryPeer, RecordingKernel

from fusefs.config import load
from fusefs.daemon.assembly import ReadPath, build_operations, build_readpath
from fusefs.daemon.status import StatusBoard
from fusefs.fuse.front import ROOT_INODE, Context, FileInfo
from fusefs.fuse.operations import SeerOperations
from fusefs.meta.snapshot import Snapshot
from fusefs.planning.inputs import build_plan, planning_config
from fusefs.planning.seed import SeedState
from fusefs.readpath.hooks import NO_HOOKS, ReadPathHooks
from fusefs.tiers import DirectoryTier, MemoryTier, TierCounters
from placement.plan import Plan

CTX = Context()
BIG = "c1/big.jpg"  # over whole_file_max: read from the PFS in ranges


def make_source(root: Path) -> dict[str, bytes]:
    """Two classes of six files (3-18 KB, distinct bytes) and one 100 KB file; relative path -> bytes."""
    files: dict[str, bytes] = {}
    for c in range(2):
        (root / f"c{c}").mkdir(parents=True)
        for i in range(6):
            files[f"c{c}/f{i}.jpg"] = os.urandom(3_000 + 3_000 * i + 17 * c)
    files[BIG] = os.urandom(100_000)
    for rel, data in files.items():
        (root / rel).write_bytes(data)
    return files


@dataclass
class Mount:
    rp: ReadPath
    ops: SeerOperations
    kernel: RecordingKernel
    peer: MemoryPeer
    files: dict[str, bytes]

    def entry(self, rel: str) -> int:
        tree = self.rp.snapshot.tree
        return next(e for e in range(len(self.rp.snapshot)) if os.fsdecode(tree.path(e)) == rel)

    def bytes_of(self, entry: int) -> bytes:
        """The source file's bytes, as written (independent of the read path)."""
        return self.files[os.fsdecode(self.rp.snapshot.tree.path(entry))]

    def tier_counters(self, t: int) -> TierCounters:
        tier = self.rp.tiers[t]
        assert isinstance(tier, MemoryTier | DirectoryTier)
        return tier.counters

    def served(self) -> dict[str, tuple[int, int]]:
        """Per source that served any file: (files, bytes)."""
        return {k: (c.files, c.bytes) for k, c in self.rp.counters.sources.items() if c.files}

    def plan(self, seed: int = 0) -> Plan:
        return build_plan(self.rp.snapshot, planning_config(self.rp.cfg), seed=seed, backend="numpy")

    async def lookup(self, rel: str) -> int:
        inode = ROOT_INODE
        for part in rel.split("/"):
            inode = (await self.ops.lookup(inode, part.encode(), CTX)).st_ino
        return inode

    async def read_inode(self, inode: int, chunk: int = 16_384) -> tuple[bytes, FileInfo]:
        """Open, read to the end in ``chunk``-byte requests, release (as the kernel does without a cache)."""
        fi = await self.ops.open(inode, os.O_RDONLY, CTX)
        parts: list[bytes] = []
        while True:
            part = await self.ops.read(fi.fh, sum(len(p) for p in parts), chunk)
            if not part:
                break
            parts.append(bytes(part))
        await self.ops.release(fi.fh)
        return b"".join(parts), fi

    async def read(self, rel: str, chunk: int = 16_384) -> tuple[bytes, FileInfo]:
        return await self.read_inode(await self.lookup(rel), chunk)


def assemble(
    root: Path,
    files: dict[str, bytes],
    tmp_path: Path,
    ssd: bool = False,
    overrides: dict[str, str] | None = None,
    hooks: ReadPathHooks = NO_HOOKS,
) -> Mount:
    """The mount's read path and handlers: a memory tier (and with ``ssd`` a directory tier after it);
    ``overrides``: config keys by dotted name, as ``-o`` takes them; ``hooks``: as the daemon's
    (:meth:`fusefs.daemon.assembly.Daemon._hooks`), none by default."""
    tiers = "{kind: memory, bytes: 2MiB, threads: 2}"
    if ssd:
        tiers += f", {{kind: directory, path: {tmp_path / 'ssd'}, bytes: 2MiB, threads: 2}}"
    options = {
        "cache_dir": str(tmp_path / "cache"),
        "tiers": f"[{tiers}]",
        "prefetch.lookahead_bytes": "48KiB",
        "fuse.whole_file_max": "64KiB",
        "job.batch_size": "2",
        "job.epochs": "2",
        # Every policy step of every in-process test checks the policy's books (ReadPolicy.validate),
        # and the last steps are logged, so a failing test's policy_log tells what led there.
        "debug.validate": "true",
        "debug.policy_log": "256",
        **(overrides or {}),
    }
    cfg = load(None, options)
    snapshot = Snapshot.scan(str(root), threads=2)
    kernel, peer = RecordingKernel(), MemoryPeer()
    rp = build_readpath(cfg, snapshot, kernel=kernel, peer_fetch=peer.fetch, hooks=hooks)
    ops = build_operations(rp, SeedState(), StatusBoard(str(root), str(tmp_path / "mnt")))
    return Mount(rp, ops, kernel, peer, files)


def serve(mount: Mount, body: Callable[[], Awaitable[None]], timeout: float = 10) -> None:
    """Run ``body`` while the read path serves (fetches, staging, prefetching), then stop it."""

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(mount.rp.run)
            with trio.fail_after(timeout):
                await body()
            nursery.cancel_scope.cancel()
        for tier in mount.rp.tiers:
            await tier.close()

    trio.run(main)


async def until(check: Callable[[], bool]) -> None:
    """Poll ``check`` (the caller's ``serve`` timeout bounds the wait)."""
    while not check():
        await trio.sleep(0.002)


async def settled(mount: Mount) -> None:
    """Until no stage is fetching or pushing (a push the test waited for may have others queued behind
    it), then every invalidation queued so far reached the kernel."""
    pages = mount.rp.policy.pages
    await until(lambda: all(p.state not in ("fetching", "pushing") for p in pages.values()))
    await drained(mount)


async def drained(mount: Mount) -> None:
    """Until every invalidation queued so far reached the kernel (the stand-in refuses none)."""
    staging = mount.rp.staging
    await until(lambda: staging.invalidations >= staging.drops_queued)
