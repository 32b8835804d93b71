"""Fault injection on one node: damaged caches, changed sources, full disks, crashes, hostile writes.

seerfs must never serve a wrong byte, never crash on any input and never lose its disk cache on a
crash.  Each test damages one thing the way it happens in the field, checks the bytes read through
the mount against a manifest made from the source directly (tests/faults/manifest.py), and also
asserts that the damaged thing was really looked up, so a test cannot pass by missing its fault.
Helpers live in tests/faults/; seerfs is driven through its CLI and its mount.
"""

from __future__ import annotations

import contextlib
import errno
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from e2e import wait_plan
from faults import damage, fs, procs, tracing
from faults.internals import tier_file
from faults.manifest import Manifest, check_mount
from mounting import force_unmount, is_mounted, mounted, seerfs, status, wait_for
from pfsemu_fixture import requires_fuse

pytestmark = [pytest.mark.mount, pytest.mark.faults, requires_fuse]

TMPFS_REASON = fs.can_mount_tmpfs()
requires_tmpfs = pytest.mark.skipif(TMPFS_REASON is not None, reason=f"needs a sized tmpfs: {TMPFS_REASON}")


@dataclass
class Node:
    """One node's paths: the source (standing in for the PFS), mountpoint, cache_dir, tier, config."""

    root: Path

    @property
    def src(self) -> Path:
        return self.root / "src"

    @property
    def mnt(self) -> Path:
        return self.root / "mnt"

    @property
    def cache(self) -> Path:
        return self.root / "cache"

    @property
    def tier(self) -> Path:
        return self.root / "tier"

    @property
    def config(self) -> Path:
        return self.root / "seerfs.yaml"

    def configure(self, tier_bytes: str = "64MiB", memory: bool = False, **extra: Any) -> Path:
        """A directory tier (what survives a remount) and one training node.  The 4 KiB staging window
        keeps no pages of files above 4 KiB, so every open of one reaches the daemon and its tiers."""
        tiers: list[dict[str, Any]] = [{"kind": "directory", "path": str(self.tier), "bytes": tier_bytes}]
        if memory:
            tiers.insert(0, {"kind": "memory", "bytes": "16MiB"})
        cfg = {
            "cache_dir": str(self.cache),
            "datasets": [{"root": "train"}],
            "tiers": tiers,
            "prefetch": {"lookahead_bytes": "4KiB"},
            **extra,
        }
        self.config.write_text(yaml.safe_dump(cfg))
        return self.config

    def files(self, n: int, size: int | None = None, classes: int = 3, seed: int = 0) -> Manifest:
        rng = random.Random(seed)
        for i in range(n):
            d = self.src / "train" / f"c{i % classes}"
            d.mkdir(parents=True, exist_ok=True)
            (d / f"f{i:04d}.jpg").write_bytes(rng.randbytes(size or rng.randint(5000, 9000)))
        return Manifest.of(self.src)

    @contextlib.contextmanager
    def mounted(self, *extra: str) -> Iterator[Path]:
        with mounted(self.src, self.mnt, "-c", str(self.config), *extra) as mnt:
            yield mnt


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    n = Node(tmp_path)
    n.mnt.mkdir()
    yield n
    if is_mounted(n.mnt):
        force_unmount(n.mnt)
        pytest.fail(f"test left {n.mnt} mounted")


def tier_status(mnt: Path, kind: str = "directory") -> dict[str, Any]:
    return next(t for t in status(mnt)["tiers"] if t["kind"] == kind)


def entry_of(mnt: Path, rel: str) -> int:
    """The snapshot entry behind a path: seerfs numbers inodes entry + 1."""
    return os.stat(mnt / rel).st_ino - 1


def source_reads(mnt: Path) -> dict[str, int]:
    return {k: int(v["files"]) for k, v in status(mnt)["reads"]["by_source"].items()}


def fill_tier(mnt: Path, manifest: Manifest, rels: list[str] | None = None) -> None:
    """Read files once (no seed written: the reactive policy keeps them) until the tier holds them."""
    rels = sorted(manifest.files) if rels is None else rels
    report = check_mount(mnt, manifest, rels)
    assert not report.wrong and not report.errors, report.summary()
    wait_for(lambda: tier_status(mnt)["files"] >= len(rels), timeout=30, what=f"{len(rels)} files in the tier")


def alive_and_serving(mnt: Path, pid: int, manifest: Manifest, rel: str) -> None:
    """The daemon still runs and its mount still serves ``rel`` correctly (checked after a moment:
    a daemon on its way out may still be listed)."""
    time.sleep(0.5)
    report = check_mount(mnt, manifest, [rel]) if is_mounted(mnt) else None
    state = "alive" if procs.alive(pid) else "exited"
    assert report is not None and report.ok == [rel], (
        f"daemon {pid} {state}, mount {'gone' if report is None else 'serving ' + report.summary()}"
    )


# ---------------------------------------------------------------- changed sources


def test_a_source_file_rewritten_after_it_was_cached_is_never_served_stale(node: Node) -> None:
    """The documented guarantee (seerfs.yaml(5), SOURCE CHANGES): a cached file rewritten in the source
    reads as EIO at the latest one revalidation round (``revalidation.round_seconds``) after the change,
    never as new bytes under the old size, and a plain remount serves the new file, never the old one."""
    manifest = node.files(6)
    node.configure(snapshot={"revalidate_round_min_s": 1})  # the default 300 s floor would only slow the test
    victim = sorted(manifest.files)[0]
    old = (node.src / victim).read_bytes()
    failures = []
    with node.mounted() as mnt:
        fill_tier(mnt, manifest)
        bound = float(status(mnt)["revalidation"]["round_seconds"])
        new = os.urandom(len(old) + 1000)
        (node.src / victim).write_bytes(new)  # rewritten in place: new size and mtime
        changed_at = time.monotonic()
        before = source_reads(mnt)
        seen: list[str] = []  # each read until the change is seen: "old" (allowed within the bound) or the error
        while True:
            got = procs.bounded_read(mnt / victim, 20)
            if got.state == "error":
                seen.append(str(got.error))
                break
            seen.append("old" if got.data == old else f"other bytes ({len(got.data)})")
            if time.monotonic() - changed_at > 2 * bound + 5:
                break
            time.sleep(0.1)
        after = source_reads(mnt)
        served_from = sorted(k for k in after if after[k] > before[k])
        assert served_from, "the fault needs the open to reach the daemon"
        if seen[-1] != "EIO" or any(s not in ("old", "EIO") for s in seen):
            failures.append(f"while mounted (round {bound:g} s): reads gave {seen[-4:]} from {served_from}")
        elif procs.bounded_read(mnt / victim, 20).error != "EIO":
            failures.append("while mounted: EIO once, then something else")
    with node.mounted() as mnt:
        got = procs.bounded_read(mnt / victim, 20)
        if not (got.state == "error" or got.data == new):
            what = "its old bytes" if got.data == old else f"{got.state} {got.error}"
            failures.append(
                f"after a remount: read as {what} ({len(got.data)} bytes, stat size "
                f"{os.stat(mnt / victim).st_size}; snapshot {status(mnt)['snapshot']['reason']!r})"
            )
    assert not failures, (
        f"{victim} rewritten in the source ({len(old)} -> {len(new)} bytes): "
        + "; ".join(failures)
        + " (tier copies are served without checking the source's size/mtime: fusefs/readpath/openfiles.py _locate -> "
        "fetcher.from_tiers; the persisted snapshot is reused because no directory changed)"
    )


def test_a_big_file_rewritten_while_it_is_read_is_never_served_mixed(node: Node) -> None:
    """A file above fuse.whole_file_max is read from the source in ranges: rewritten mid-read, the
    reader must get EIO (or one whole version), never old bytes followed by new ones."""
    size = 24 << 20
    (node.src / "train" / "c0").mkdir(parents=True)
    big = node.src / "train" / "c0" / "big.jpg"
    old = os.urandom(size)
    new = os.urandom(size)
    big.write_bytes(old)
    node.configure(tier_bytes="4MiB")  # too small to keep it: every byte comes from the source
    with node.mounted() as mnt:
        got = b""
        error = None
        with open(mnt / "train" / "c0" / "big.jpg", "rb", buffering=0) as fh:
            while len(got) < 8 << 20:
                got += fh.read(1 << 20)
            with open(big, "r+b") as w:  # rewritten in place (same inode), as a copy tool does
                w.write(new)
            try:
                while chunk := fh.read(1 << 20):
                    got += chunk
            except OSError as exc:
                error = exc
        assert source_reads(mnt)["pfs"] >= 1, "the fault needs a ranged read from the source"
    if error is not None:
        assert error.errno == errno.EIO, error
        assert got == old[: len(got)], "bytes before the error must all be the old version"
        return
    first_new = next((i for i in range(0, size, 1 << 20) if got[i : i + (1 << 20)] == new[i : i + (1 << 20)]), None)
    whole = got in (old, new)
    assert whole, (
        f"read {len(got)} bytes with no error: old up to byte {first_new}, new after "
        f"(fusefs/readpath/pfs.py PfsReader.pread never re-checks the file's size and mtime)"
    )


def test_rescan_after_a_cached_file_changed_mounts_and_later_mounts_too(node: Node) -> None:
    manifest = node.files(6)
    node.configure()
    victim = sorted(manifest.files)[1]
    with node.mounted() as mnt:
        fill_tier(mnt, manifest)
    (node.src / victim).write_bytes(os.urandom(12345))  # the tier now holds a stale copy
    outcomes = []
    for i, args in enumerate((["--rescan"], [], ["--rescan"])):
        res = seerfs("mount", str(node.src), str(node.mnt), "-c", str(node.config), *args)
        try:
            if res.returncode == 0:
                assert (node.mnt / victim).read_bytes() == (node.src / victim).read_bytes()
                if i == 0:
                    assert tier_status(node.mnt)["stale"] >= 1, "the fault needs the stale copy to be found"
            outcomes.append((" ".join(["mount", *args]), res.returncode, res.stderr.strip().split(" (see ")[0]))
        finally:
            if is_mounted(node.mnt):
                seerfs("umount", str(node.mnt))
    assert all(code == 0 for _, code, _ in outcomes), (
        f"after {victim} changed under its tier copy: {outcomes} (prune_stale at startup drops the copy, and "
        "DirectoryTier.drop -> _schedule_unlink -> trio.lowlevel.spawn_system_task runs before trio.run: "
        "fusefs/daemon/assembly.py _build_cache)"
    )


def test_a_fifo_in_place_of_a_source_file_fails_the_read_and_never_hangs(node: Node) -> None:
    manifest = node.files(4)
    node.configure()
    victim = sorted(manifest.files)[2]
    with node.mounted() as mnt:
        damage.replace_with_fifo(node.src / victim)  # after the walk: the snapshot says regular file
        released: list[bool] = []
        fifo = node.src / victim
        try:  # the FIFO's write end is opened after the kill: it lets the daemon's blocked open go
            got = procs.bounded_read(mnt / victim, 5, unblock=lambda: released.append(damage.release_fifo(fifo)))
        finally:
            damage.release_fifo(fifo)
        assert got.state != "hung", (
            f"reading {victim} (a FIFO in the source now) hung for 5 s in state {got.proc_state} at "
            f"{got.wchan!r}; the daemon's open of the FIFO was {'blocked' if any(released) else 'not blocked'}"
        )
        assert got.state == "error" and got.error == "EIO", got
        other = sorted(manifest.files)[0]
        assert check_mount(mnt, manifest, [other]).ok == [other]


# ---------------------------------------------------------------- damaged tier copies


def test_damaged_tier_copies_are_never_served_and_are_cached_again(node: Node) -> None:
    """Flip, truncate, delete, swap, symlink: each damaged copy is detected when looked up, the
    reader gets the source's bytes, and the file is cached again on later reads."""
    manifest = node.files(8, size=6000)
    node.configure()
    rels = sorted(manifest.files)
    with node.mounted() as mnt:
        fill_tier(mnt, manifest)
        path = {rel: tier_file(node.tier, entry_of(mnt, rel)) for rel in rels}
        assert all(p.exists() for p in path.values()), "tier copies not where the layout says"
        damage.flip_byte(path[rels[0]], 100)
        damage.truncate(path[rels[1]], 10)
        path[rels[2]].unlink()
        damage.swap(path[rels[3]], path[rels[4]])  # equal sizes: only the content tells them apart
        damage.replace_with_symlink(path[rels[5]], node.src / rels[6])
        damaged = rels[:6]
        before = tier_status(mnt)
        report = check_mount(mnt, manifest, damaged)
        after = tier_status(mnt)
        assert not report.wrong and not report.errors, report.summary()
        assert after["corrupt"] - before["corrupt"] == len(damaged), (before["corrupt"], after["corrupt"])
        puts = after["puts"]
        for _ in range(3):  # read again: the policy that kept them once keeps them again
            assert not check_mount(mnt, manifest, damaged).wrong
        recached = [rel for rel in damaged if tier_file(node.tier, entry_of(mnt, rel)).is_file()]
        final = tier_status(mnt)
        assert len(recached) == len(damaged), (
            f"copies dropped as damaged are never cached again: {len(recached)} of {len(damaged)} back "
            f"after 3 more reads each (tier puts {puts} -> {final['puts']}, files {final['files']}; the reactive "
            f"set still counts them as admitted: fusefs/tiers/directory.py drop() is not reported to it)"
        )


def test_a_fifo_in_place_of_a_tier_copy_is_dropped_and_never_hangs(node: Node) -> None:
    manifest = node.files(4, size=5000)
    node.configure()
    victim = sorted(manifest.files)[0]
    with node.mounted() as mnt:
        fill_tier(mnt, manifest)
        copy = tier_file(node.tier, entry_of(mnt, victim))
        damage.replace_with_fifo(copy)
        released: list[bool] = []
        try:
            got = procs.bounded_read(mnt / victim, 5, unblock=lambda: released.append(damage.release_fifo(copy)))
        finally:
            damage.release_fifo(copy)
        assert got.state != "hung", (
            f"reading {victim} whose tier copy is a FIFO hung for 5 s in state {got.proc_state} at "
            f"{got.wchan!r}; the tier's open of the FIFO was {'blocked' if any(released) else 'not blocked'} "
            f"(fusefs/tiers/fileio.py read_verified opens without O_NONBLOCK and checks the type after)"
        )
        assert got.state == "ok" and got.data == (node.src / victim).read_bytes(), got
        assert tier_status(mnt)["corrupt"] >= 1


# ---------------------------------------------------------------- crashes and full disks


def test_kill_9_keeps_the_directory_tier_copies_made_before_the_crash(node: Node) -> None:
    manifest = node.files(300, size=3000, classes=6)
    node.configure()
    with node.mounted() as mnt:
        fill_tier(mnt, manifest)
        on_disk = len([p for p in node.tier.rglob("*") if p.is_file() and p.name.isdigit()])
        time.sleep(5)  # well after the copies were made, before the index's 30 s write
        pid = procs.kill9(mnt)
    assert on_disk == 300, on_disk
    with node.mounted() as mnt:
        opened = tier_status(mnt)["opened"]
        assert opened["kept_files"] >= 300, (
            f"after kill -9 of daemon {pid} the tier came back with {opened['kept_files']} of the 300 intact "
            f"copies on disk ({opened['reason']}; removed {opened['removed_files']}): the index is written at "
            f"most every 30 s (fusefs/tiers/directory.py persist_interval) and files missing from it are removed"
        )
        assert not check_mount(mnt, manifest).wrong


@requires_tmpfs
def test_a_full_tier_filesystem_still_gets_its_index_written(node: Node) -> None:
    """The tier's budget is larger than its filesystem: puts fail with ENOSPC.  A clean unmount
    must still leave an index, so the copies that fit are kept warm at the next mount."""
    # Files of exactly one page fill tmpfs to its last byte (2.5 MB against 2 MiB).
    manifest = node.files(600, size=4096, classes=4)
    node.configure(tier_bytes="64MiB")
    with fs.small_tmpfs(node.tier, "2m"):
        with node.mounted() as mnt:
            report = check_mount(mnt, manifest)
            assert not report.wrong and not report.errors, report.summary()
            wait_for(lambda: tier_status(mnt)["put_errors"] > 0, timeout=20, what="ENOSPC on the tier")
            held = tier_status(mnt)["files"]
            assert held > 0
        with node.mounted() as mnt:
            opened = tier_status(mnt)["opened"]
            assert opened["warm"] and opened["kept_files"] >= held, (
                f"after a clean unmount with the tier filesystem full, the remount kept {opened['kept_files']} of "
                f"the {held} copies on disk ({opened['reason']}, removed {opened['removed_files']}): the index "
                f"write at unmount hit ENOSPC, so the index on disk is the empty one of the cold start "
                f"(fusefs/tiers/directory.py keeps no room for its index on the tier filesystem)"
            )


@requires_tmpfs
def test_a_full_cache_dir_at_mount_is_a_configuration_error(node: Node) -> None:
    """Documented: every error a user can cause is one line and an exit status; a full cache_dir is
    bad configuration (3), not an internal error (1)."""
    node.files(10)
    node.configure()
    with fs.small_tmpfs(node.cache, "1m"):
        fs.fill(node.cache)
        res = seerfs("mount", str(node.src), str(node.mnt), "-c", str(node.config))
        try:
            assert fs.free_bytes(node.cache) == 0
            lines = res.stderr.strip().splitlines()
            assert res.returncode == 3 and len(lines) == 1, (
                f"exit {res.returncode}: {res.stderr.strip()!r} (fusefs/daemon/assembly.py _build_cache saves the "
                f"snapshot copy for the planner unguarded; fusefs/daemon/lifecycle.py run_daemon turns the OSError "
                f"into 'startup failed', exit 1)"
            )
            assert "cache_dir" in lines[0] or "No space" in lines[0], lines
        finally:
            if is_mounted(node.mnt):
                seerfs("umount", str(node.mnt))
            force_unmount(node.mnt)


# ---------------------------------------------------------------- hostile writes to .control/seed


def test_a_seed_of_thousands_of_digits_is_refused_and_the_daemon_keeps_serving(node: Node) -> None:
    manifest = node.files(4)
    node.configure()
    with node.mounted() as mnt:
        pid = procs.daemon_pid(mnt)
        err = None
        try:
            (mnt / ".control" / "seed").write_text("9" * 5000 + "\n")
        except OSError as exc:
            err = exc
        try:
            alive_and_serving(mnt, pid, manifest, sorted(manifest.files)[0])
        except AssertionError as exc:
            raise AssertionError(f"{exc}: {procs.last_exception(node.cache)}") from None
        assert err is not None and err.errno == errno.EINVAL, err
        assert "seed" in (status(mnt)["seed"]["last_error"] or "")


@requires_tmpfs
def test_a_seed_written_while_cache_dir_is_full_fails_planning_not_the_daemon(node: Node) -> None:
    manifest = node.files(20)
    node.configure()
    with fs.small_tmpfs(node.cache, "4m"), node.mounted() as mnt:
        pid = procs.daemon_pid(mnt)
        wait_plan(mnt, 0)  # the assumed seed's plan is done: nothing of it frees room later
        fs.fill(node.cache)
        assert fs.free_bytes(node.cache) == 0
        with contextlib.suppress(OSError):
            (mnt / ".control" / "seed").write_text("77\n")
        time.sleep(2)  # planning runs in the background; a crash comes within a second
        try:
            alive_and_serving(mnt, pid, manifest, sorted(manifest.files)[0])
        except AssertionError as exc:
            raise AssertionError(f"{exc}: {procs.last_exception(node.cache)}") from None
        plan = status(mnt)["plan"]
        assert plan["seed"] == 77 and plan["state"] == "failed" and plan["message"], plan


def test_a_seed_pwrite_at_a_large_offset_costs_no_memory(node: Node) -> None:
    manifest = node.files(4)
    node.configure()
    offset = 256 << 20
    with node.mounted() as mnt:
        pid = procs.daemon_pid(mnt)
        before = procs.vm_hwm(pid)
        fd = os.open(mnt / ".control" / "seed", os.O_WRONLY)
        err = None
        try:
            os.pwrite(fd, b"5", offset)
        except OSError as exc:
            err = exc
        finally:
            with contextlib.suppress(OSError):
                os.close(fd)
        alive_and_serving(mnt, pid, manifest, sorted(manifest.files)[0])
        grown = procs.vm_hwm(pid) - before
        assert grown <= 64 << 20, (
            f"one 1-byte pwrite at offset {offset} raised the daemon's peak RSS by {grown >> 20} MiB "
            f"(fusefs/fuse/control.py ControlFiles.write pads the buffer with NULs up to the offset, then copies it)"
        )
        assert err is not None and err.errno == errno.EINVAL, err


# ---------------------------------------------------------------- the job token


def test_the_job_token_is_created_private_from_its_first_syscall(node: Node, tmp_path: Path) -> None:
    """The token file (rendezvous default RENDEZVOUS_DIR/token) is secret: it must never exist with
    group or other permissions, not even between its creation and a later chmod."""
    node.files(4)
    rdv = tmp_path / "rendezvous"
    node.configure(peers={"discovery": "rendezvous", "rendezvous_dir": str(rdv), "expect": 1})
    trace = tmp_path / "strace.txt"
    cmd = [
        *tracing.strace_prefix(trace),
        sys.executable,
        "-m",
        "fusefs",
        "mount",
        "--fg",
        str(node.src),
        str(node.mnt),
        "-c",
        str(node.config),
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: is_mounted(node.mnt) or proc.poll() is not None, timeout=60, what="mounted under strace")
        assert is_mounted(node.mnt), f"mount under strace exited {proc.returncode}"
        token = rdv / "token"
        assert token.exists()
    finally:
        if is_mounted(node.mnt):
            seerfs("umount", str(node.mnt), timeout=60)
        force_unmount(node.mnt)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
    made = tracing.creations(trace, rdv, "token")
    assert made, "the trace shows no creation of the token file"
    loose = [
        (c.call, c.args, oct(mode) if mode is not None else None) for c, mode in made if mode is None or mode & 0o077
    ]
    assert not loose, (
        f"token created readable by others, chmod 600 only afterwards: {loose} "
        f"(fusefs/cluster/formation.py read_or_create_token: Path.write_text, then chmod)"
    )
    assert token.stat().st_mode & 0o777 == 0o600


# ---------------------------------------------------------------- damaged metadata


@pytest.mark.parametrize("what", ["snapshot", "index"])
def test_a_damaged_snapshot_or_tier_index_costs_a_walk_or_a_cold_tier_never_bytes(node: Node, what: str) -> None:
    """Scribbled in the middle (name and size kept): the next mount must notice, rebuild what it
    needs and serve the source's bytes."""
    manifest = node.files(30)
    node.configure()
    with node.mounted() as mnt:
        fill_tier(mnt, manifest)
    target = damage.snapshot_files(node.cache)[0] if what == "snapshot" else damage.index_file(node.tier)
    damage.scribble(target)
    res = seerfs("mount", str(node.src), str(node.mnt), "-c", str(node.config))
    try:
        assert res.returncode == 0, (
            f"mount with a damaged {what}: exit {res.returncode}: {res.stderr.strip().split(' (see ')[0]} "
            f"(fusefs/meta/snapshot.py load_or_scan catches OSError/ValueError/KeyError, not zipfile.BadZipFile, "
            f"which np.load's members raise on a CRC mismatch)"
        )
        doc = status(node.mnt)
        report = check_mount(node.mnt, manifest)
    finally:
        if is_mounted(node.mnt):
            seerfs("umount", str(node.mnt))
    if what == "snapshot":
        assert not doc["snapshot"]["reused"], f"the damaged snapshot was used: {doc['snapshot']['reason']}"
    else:
        opened = doc["tiers"][0]["opened"]
        assert not opened["warm"], f"the damaged index was used: {opened}"
    assert not report.wrong and not report.errors, report.summary()
