"""``snapshot.identity``: a source that does not maintain ctime hides a same-size rewrite with the mtime put
back from the stat rounds; ``content`` rounds see it by comparing the source's bytes with the copy's digests.

The source is a bindfs ``--ctime-from-mtime`` view of a directory (what an object-store FUSE client
shows too): after the rewrite its stat (size, mtime, ctime, inode) is the one the snapshot recorded,
which the test checks on the view itself before it asks anything of seerfs.  Bytes are compared with a
manifest read from the directory directly.
"""

from __future__ import annotations

import errno
import os
import random
import shutil
import subprocess
from pathlib import Path

import pytest
import xxhash
from faults.internals import tier_file
from faults.manifest import Manifest, check_mount
from inprocess import assemble, serve, until
from inprocess import make_source as small_source
from mounting import force_unmount, is_mounted, mounted, status, wait_for

from fusefs.meta.ids import inode_of
from fusefs.readpath.revalidate import content_change
from fusefs.tiers.digest import BLOCK, BlockDigests

VICTIM = "train/c1/big.jpg"
SIZE = 3 * BLOCK + 100  # four digest blocks; the rewrite changes only block 1


def _identity(path: Path) -> tuple[int, int, int, int]:
    st = os.stat(path)
    return st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino


def _rewrite_middle_block(path: Path) -> bytes:
    """Block 1 rewritten in place, size kept, the mtime put back (as rsync -t or an object-store sync do)."""
    old = path.stat()
    with open(path, "r+b") as fh:
        block = os.pread(fh.fileno(), BLOCK, BLOCK)
        os.pwrite(fh.fileno(), bytes(b ^ 0xA5 for b in block), BLOCK)
    os.utime(path, ns=(old.st_atime_ns, old.st_mtime_ns))
    return path.read_bytes()


def _source(root: Path) -> Manifest:
    rng = random.Random(7)
    for c in range(2):
        d = root / "train" / f"c{c}"
        d.mkdir(parents=True)
        for i in range(12):
            (d / f"{i:02d}.jpg").write_bytes(rng.randbytes(2000 + 300 * i))
    (root / VICTIM).write_bytes(rng.randbytes(SIZE))
    return Manifest.of(root)


def test_content_change_finds_a_changed_middle_block_and_nothing_in_an_equal_file(tmp_path: Path) -> None:
    """The comparison itself, on plain files: a middle block, a size, an empty file, a FIFO."""
    path = tmp_path / "f"
    data = os.urandom(SIZE)
    path.write_bytes(data)
    recorded = [BlockDigests.of(data)]
    assert content_change(bytes(path), recorded) is None
    _rewrite_middle_block(path)
    assert content_change(bytes(path), recorded) == "content changed (block 1 of 4 differs from the cached copy)"
    path.write_bytes(data[:-1])
    assert "content changed (now" in (content_change(bytes(path), recorded) or "")
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    assert content_change(bytes(empty), [BlockDigests.of(b"")]) is None
    assert content_change(bytes(empty), [BlockDigests.of(b"x")]) is not None
    os.mkfifo(tmp_path / "fifo")  # opened without blocking, refused as not a regular file
    assert "regular file" in (content_change(bytes(tmp_path / "fifo"), recorded) or "")


def test_content_rounds_compare_pages_held_without_a_tier_copy_with_the_source(tmp_path: Path) -> None:
    """A file held only as kept pages has no recorded digests: a content round reads the pages back and
    compares them.  Pages of another version of the file than the source's (as a ctime-less source
    leaves after a rewrite) make it changed; pages equal to the source leave it served."""
    root = tmp_path / "src"
    files = small_source(root)
    m = assemble(
        root, files, tmp_path, overrides={"snapshot.revalidate_round_min_s": "1", "snapshot.identity": "content"}
    )
    rv, policy = m.rp.revalidator, m.rp.policy
    stale, fresh = "c1/f3.jpg", "c0/f2.jpg"

    async def body() -> None:
        for rel in (stale, fresh):
            assert (await m.read(rel))[0] == files[rel]
            entry = m.entry(rel)
            for tier in m.rp.tiers:
                tier.drop(entry)  # no tier copy left: only the pages the read left in the page cache
            assert entry in policy.kept
            # The stand-in kernel keeps only pushed pages; a real one keeps what the read pulled in.
            m.kernel.pages[inode_of(entry)] = files[rel] if rel == fresh else bytes(b ^ 1 for b in files[rel])
        checks = rv.content_checks
        await until(lambda: rv.content_checks >= checks + 2 and rv.rounds >= 2)
        assert rv.is_changed(m.entry(stale)) and rv.reason(m.entry(stale)).startswith("content changed")
        assert not rv.is_changed(m.entry(fresh))
        assert m.entry(stale) not in policy.kept  # dropped, and its pages invalidated

    serve(m, body, timeout=30)


@pytest.mark.mount
@pytest.mark.parametrize("identity", ["content", "stat"])
def test_a_same_size_rewrite_with_the_mtime_put_back_on_a_ctime_less_source(tmp_path: Path, identity: str) -> None:
    """content: the rewritten file reads as EIO within a round or so, its copy dropped; stat: the
    documented limitation (seerfs.yaml(5), snapshot.identity): the old bytes go on being served.  Either
    way every other file reads exactly as the source has it."""
    if shutil.which("bindfs") is None:
        pytest.skip("bindfs is not installed (tools/setup installs it)")
    backing, view = tmp_path / "backing", tmp_path / "view"
    manifest = _source(backing)
    view.mkdir()
    subprocess.run(["bindfs", "--ctime-from-mtime", str(backing), str(view)], check=True, timeout=30)
    try:
        cfg = tmp_path / "c.yaml"
        cfg.write_text(
            f"cache_dir: {tmp_path / 'cache'}\n"
            "datasets: [{root: train}]\n"
            f"tiers: [{{kind: directory, path: {tmp_path / 'ssd'}, bytes: 64MiB}}]\n"
            "prefetch: {lookahead_bytes: 32KiB}\n"  # no pages kept: second reads come from the tier
            f"snapshot: {{revalidate_round_min_s: 1, identity: {identity}}}\n"  # rounds of a second, not 300 s
        )
        with mounted(view, tmp_path / "mnt", "-c", str(cfg)) as mnt:
            first = check_mount(mnt, manifest)
            assert not first.wrong and not first.errors, first.summary()
            wait_for(
                lambda: (
                    sum(1 for p in (tmp_path / "ssd").rglob("*") if p.is_file() and p.name.isdigit())
                    == len(manifest.files)
                ),
                30,
                "every file copied into the directory tier",
            )
            entry = os.stat(mnt / VICTIM).st_ino - 1  # inode = snapshot entry + 1
            before = _identity(view / VICTIM)
            old = (view / VICTIM).read_bytes()
            new = _rewrite_middle_block(backing / VICTIM)
            # What makes this source hard: through the view, the file's identity did not change at all,
            # though its bytes did (a POSIX filesystem would show a new ctime).
            assert _identity(view / VICTIM) == before
            assert (view / VICTIM).read_bytes() == new != old and new[:BLOCK] == old[:BLOCK]
            rounds = status(mnt)["revalidation"]["rounds"]

            if identity == "content":
                outcome: dict[str, object] = {}

                def seen() -> bool:
                    try:
                        data = (mnt / VICTIM).read_bytes()
                    except OSError as exc:
                        outcome["errno"] = exc.errno
                        return True
                    assert data == old, "bytes of the rewritten version were served under the snapshot's"
                    return False

                wait_for(seen, 60, "the rewrite seen by a content round")
                doc = status(mnt)["revalidation"]
                assert outcome["errno"] == errno.EIO
                # Within one round: the one under way when the file was rewritten may have passed it already.
                assert doc["rounds"] <= rounds + 2, (rounds, doc["rounds"])
                assert doc["changed"][VICTIM].startswith("content changed (block 1 of 4"), doc["changed"]
                assert doc["content_checks"] > 0 and doc["content_bytes"] >= SIZE
                assert not tier_file(tmp_path / "ssd", entry).exists(), "the stale copy was kept"
                with pytest.raises(OSError) as again:  # and from then on
                    (mnt / VICTIM).read_bytes()
                assert again.value.errno == errno.EIO
            else:
                # Two whole rounds after the rewrite (each stat'ed every cached file), nothing was seen.
                wait_for(lambda: status(mnt)["revalidation"]["rounds"] >= rounds + 2, 60, "two more rounds")
                doc = status(mnt)["revalidation"]
                assert doc["changed"] == {} and doc["content_checks"] == 0
                data = (mnt / VICTIM).read_bytes()
                assert xxhash.xxh3_64_intdigest(data) == manifest.files[VICTIM][1], "not the old bytes"
            others = [rel for rel in manifest.files if rel != VICTIM]
            rest = check_mount(mnt, manifest, others)
            assert not rest.wrong and not rest.errors, rest.summary()
    finally:
        subprocess.run(["fusermount3", "-u", str(view)], capture_output=True, timeout=30)
        if is_mounted(view):
            force_unmount(view)
