"""No path a local user can redirect: the root daemon's writes and a tier's deletions stay where they belong.

The attack, as run by hand before the fix: an unprivileged user plants a symlink at the name a root
daemon is given as cache_dir, a tier path, the rendezvous directory or the log's directory, in /tmp
(sticky) or in a group-writable directory that is not sticky, pointing at a directory only root can
read (the victim); with ``fs.protected_symlinks=0`` root followed it, created ``log/ plans/
snapshots/`` there, and a tier deleted a root-owned file named like an entry (``05/5``).  Here the
user is real (useradd, removed afterwards), plants with its own uid, and the sysctl is set to 0 for
the module and restored.  Each case proves, from outside seerfs: exit status 3 with seerfs's own
one-line message naming the path and the rule (not a kernel EACCES), and the victim listed before
and after (names, modes, owners, contents) unchanged.  A root-owned admin symlink still mounts.

The tier's ownership rule (a marker, written only into an empty directory or one holding a valid
seerfs index) is tested on DirectoryTier directly, and through a real mount for a foreign file.
"""

from __future__ import annotations

import hashlib
import json
import os
import pwd
import re
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
from mounting import force_unmount, is_mounted, mounted, seerfs, status
from test_cli_errors import one_line_error

from fusefs.errors import ConfigError, ExitCode
from fusefs.meta.identity import SourceId
from fusefs.tiers import DirectoryTier
from fusefs.tiers.index import INDEX_NAME
from fusefs.tiers.layout import LOCK_NAME, MARKER_NAME, file_path
from fusefs.trust import UntrustedPath, trusted_dir

PROTECTED_SYMLINKS = Path("/proc/sys/fs/protected_symlinks")
NOBODY = 65534
FP = "fingerprint-a"


def listing(root: Path) -> list[tuple[str, int, int, str]]:
    """Everything under ``root`` (itself included): name, mode, owner, and content digest or link target."""
    out = []
    for path in [root, *root.rglob("*")]:
        st = os.lstat(path)
        if stat.S_ISREG(st.st_mode):
            what = hashlib.sha256(path.read_bytes()).hexdigest()
        elif stat.S_ISLNK(st.st_mode):
            what = os.readlink(path)
        else:
            what = ""
        out.append((str(path.relative_to(root)), st.st_mode, st.st_uid, what))
    return sorted(out)


def make_victim(path: Path) -> Path:
    """A root-only directory holding a root file named like a tier entry (05/5) and a secret."""
    path.mkdir(mode=0o700)
    (path / "05").mkdir(mode=0o700)
    (path / "05" / "5").write_bytes(b"root's file, named like a tier entry")
    (path / "secret").write_bytes(b"root's secret")
    os.chmod(path / "secret", 0o600)
    return path


@pytest.fixture
def source(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    (src / "c").mkdir(parents=True)
    for i in range(3):
        (src / "c" / f"{i}.bin").write_bytes(os.urandom(3000 + i))
    return src


# --------------------------------------------------------------------------- the chain walk itself


def test_missing_components_are_made_0700_one_by_one(tmp_path: Path) -> None:
    """cache_dir's default (~/.cache/seerfs) is often missing: every component made is 0700 and ours,
    whatever the umask."""
    old = os.umask(0)
    try:
        made = trusted_dir(tmp_path / "a" / "b" / "c", "cache_dir")
    finally:
        os.umask(old)
    assert made == tmp_path / "a" / "b" / "c"
    for p in (tmp_path / "a", tmp_path / "a" / "b", made):
        st = os.lstat(p)
        assert stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o700 and st.st_uid == os.geteuid(), p


def test_a_symlink_of_root_or_this_user_is_followed_and_its_target_checked(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(real)
    assert trusted_dir(tmp_path / "link", "cache_dir") == real
    loose = tmp_path / "loose"
    loose.mkdir()
    os.chmod(loose, 0o777)
    (tmp_path / "to-loose").symlink_to(loose)
    with pytest.raises(UntrustedPath, match=r"to-loose: .*/loose is writable by other users \(mode 0777\)"):
        trusted_dir(tmp_path / "to-loose", "cache_dir")


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a symlink and a directory to another uid")
def test_another_users_symlink_or_directory_on_the_way_is_refused(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    link = tmp_path / "link"
    link.symlink_to(real)
    os.lchown(link, NOBODY, NOBODY)
    with pytest.raises(UntrustedPath, match=rf"cache_dir {link}/sub: {link} is a symlink owned by uid {NOBODY}"):
        trusted_dir(link / "sub", "cache_dir")
    assert not (real / "sub").exists()  # refused before anything was made behind the link
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o755)
    os.chown(theirs, NOBODY, NOBODY)
    with pytest.raises(UntrustedPath, match=rf"{theirs} is owned by uid {NOBODY}, not by root or this user"):
        trusted_dir(theirs / "cache", "cache_dir")
    assert not (theirs / "cache").exists()


# --------------------------------------------------------------------------- the tier's ownership rule


def _src(data: bytes) -> SourceId:
    return SourceId(len(data), 1, 1, 1)


def _fill(root: Path, entries: dict[int, bytes]) -> None:
    async def main() -> None:
        tier = DirectoryTier(0, root, 16 << 20, 2, FP)
        for e, data in entries.items():
            assert await tier.put(e, data, _src(data))
        await tier.close()

    trio.run(main)


def test_an_empty_directory_is_marked_with_the_uid_and_a_tier_id(tmp_path: Path) -> None:
    root = tmp_path / "tier"
    tier = DirectoryTier(0, root, 16 << 20, 2, FP)
    try:
        doc = json.loads((root / MARKER_NAME).read_text())
        assert tier.marker is not None and doc["uid"] == os.geteuid() and doc["tier"] == tier.marker.tier
        assert stat.S_IMODE(os.lstat(root / MARKER_NAME).st_mode) == 0o600
    finally:
        tier.abandon()
    again = DirectoryTier(0, root, 16 << 20, 2, FP)  # the same tier: the id is kept
    assert again.marker is not None and again.marker.tier == doc["tier"]
    again.abandon()


def test_a_cache_from_before_markers_is_marked_and_resumes_warm(tmp_path: Path) -> None:
    """Existing caches keep working: an index whose checksum holds, without a marker, gets one."""
    root = tmp_path / "tier"
    _fill(root, {1: b"a" * 100, 2: b"b" * 5000})
    (root / MARKER_NAME).unlink()
    tier = DirectoryTier(0, root, 16 << 20, 2, FP)
    try:
        assert tier.opened is not None and tier.opened["warm"] and sorted(tier.entries()) == [1, 2]
        assert json.loads((root / MARKER_NAME).read_text())["uid"] == os.geteuid()
    finally:
        tier.abandon()


@pytest.mark.parametrize("case", ["foreign file", "damaged index", "another uid's marker"])
def test_a_directory_that_is_not_a_tier_of_ours_is_refused_and_left_as_it_was(tmp_path: Path, case: str) -> None:
    """Before: any directory was taken, seerfs.lock created in it, and entry-named files not in the
    index removed.  Now nothing is created or removed: the listing is the same after the refusal."""
    root = tmp_path / "tier"
    if case == "foreign file":
        make_victim(root)
        expected = r"is not empty and holds no seerfs-tier\.json nor a valid seerfs index \(no index\)"
    elif case == "damaged index":
        _fill(root, {1: b"a" * 100})
        (root / MARKER_NAME).unlink()
        raw = bytearray((root / INDEX_NAME).read_bytes())
        raw[len(raw) // 2] ^= 0xFF
        (root / INDEX_NAME).write_bytes(bytes(raw))
        expected = r"holds no seerfs-tier\.json nor a valid seerfs index \(index"
    else:
        root.mkdir()
        (root / MARKER_NAME).write_text(json.dumps({"seerfs": "seerfs directory tier", "uid": 4242, "tier": "x"}))
        (root / "05").mkdir()
        (root / "05" / "5").write_bytes(b"theirs")
        expected = r"seerfs-tier\.json says it is the tier of uid 4242, not of this user"
    before = listing(root)
    with pytest.raises(ConfigError, match=rf"^tiers\.0\.path: {re.escape(str(root))}.*{expected}"):
        DirectoryTier(0, root, 16 << 20, 2, FP)
    assert listing(root) == before
    assert not (root / LOCK_NAME).exists() or case == "damaged index"


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a file to another uid")
def test_an_entry_named_file_of_another_uid_in_our_tier_is_refused_and_kept(tmp_path: Path) -> None:
    root = tmp_path / "tier"
    _fill(root, {1: b"a" * 100})
    theirs = Path(file_path(root, 261))  # not in the index: before, removed as an orphan on open
    theirs.write_bytes(b"not seerfs's")
    os.chown(theirs, NOBODY, NOBODY)
    before = listing(root)
    rule = rf"^tiers\.0\.path: {re.escape(str(theirs))} is owned by uid {NOBODY}, not by this daemon"
    with pytest.raises(ConfigError, match=rule):
        DirectoryTier(0, root, 16 << 20, 2, "another-fingerprint")  # a cold start would remove all of ours
    assert listing(root) == before


# --------------------------------------------------------------------------- planted by a real user


def _unavailable() -> str | None:
    if os.geteuid() != 0:
        return "needs root: the daemon under attack runs as root, and useradd"
    for tool in ("useradd", "userdel", "ln"):
        if shutil.which(tool) is None:
            return f"{tool} not found"
    return None


@pytest.fixture(scope="module")
def attacker() -> Iterator[pwd.struct_passwd]:
    """An unprivileged local user, with its own group; removed afterwards."""
    reason = _unavailable()
    if reason is not None:
        pytest.skip(reason)
    name = f"seerfs-a{os.getpid() % 100000}"
    cmd = ["useradd", "--system", "--user-group", "--no-create-home", "--home-dir", "/nonexistent", name]
    res = subprocess.run([*cmd, "--shell", "/bin/false"], capture_output=True, text=True, check=False)
    if res.returncode != 0:
        pytest.skip(f"useradd failed: {res.stderr.strip()}")
    try:
        yield pwd.getpwnam(name)
    finally:
        subprocess.run(["userdel", name], capture_output=True, check=False)


@pytest.fixture(scope="module")
def unprotected_symlinks() -> Iterator[None]:
    """``fs.protected_symlinks=0`` for the module (the machine the attack was found on), restored after."""
    before = PROTECTED_SYMLINKS.read_text().strip()
    try:
        PROTECTED_SYMLINKS.write_text("0")
    except OSError as exc:
        if before != "0":
            pytest.skip(f"fs.protected_symlinks is {before} and cannot be set to 0 here ({exc.strerror})")
    assert PROTECTED_SYMLINKS.read_text().strip() == "0"
    try:
        yield
    finally:
        if before != "0":
            PROTECTED_SYMLINKS.write_text(before)
            assert PROTECTED_SYMLINKS.read_text().strip() == before


def plant(user: pwd.struct_passwd, target: Path, link: Path) -> None:
    """``ln -s target link`` run as ``user`` (its own uid and group only)."""
    subprocess.run(
        ["ln", "-s", str(target), str(link)], user=user.pw_uid, group=user.pw_gid, extra_groups=[], check=True
    )
    assert os.lstat(link).st_uid == user.pw_uid


@pytest.fixture
def shared_dirs(attacker: pwd.struct_passwd) -> Iterator[dict[str, Path]]:
    """Where the user can plant: /tmp itself (sticky), and a directory of root's that the user's group
    may write, not sticky; both removed afterwards (the planted links with them)."""
    group_writable = Path(tempfile.mkdtemp(prefix="seerfs-shared-", dir="/tmp"))
    os.chown(group_writable, 0, attacker.pw_gid)
    os.chmod(group_writable, 0o775)
    try:
        yield {"sticky": Path("/tmp"), "group-writable": group_writable}
    finally:
        for p in Path("/tmp").glob(f"seerfs-plant-{os.getpid()}-*"):
            p.unlink()
        shutil.rmtree(group_writable, ignore_errors=True)


SETTINGS = {
    "cache_dir": ("cache_dir", "cache_dir={link}"),
    "tier": ("tiers.0.path", "cache_dir={cache},tiers.0.kind=directory,tiers.0.path={link},tiers.0.bytes=1M"),
    "rendezvous": (
        "peers.rendezvous_dir",
        "cache_dir={cache},peers.discovery=rendezvous,peers.rendezvous_dir={link},peers.expect=1",
    ),
    "log": ("log_file", "cache_dir={cache},log_file={link}/seerfs.log"),
}


@pytest.mark.mount
@pytest.mark.parametrize("place", ["sticky", "group-writable"])
@pytest.mark.parametrize("setting", list(SETTINGS))
def test_a_symlink_planted_by_another_user_is_refused_and_the_victim_untouched(
    attacker: pwd.struct_passwd,
    unprotected_symlinks: None,
    shared_dirs: dict[str, Path],
    source: Path,
    mountpoint: Path,
    tmp_path: Path,
    place: str,
    setting: str,
) -> None:
    victim = make_victim(tmp_path / "victim")
    where = shared_dirs[place]
    link = where / (f"seerfs-plant-{os.getpid()}-{setting}" if place == "sticky" else setting)
    plant(attacker, victim, link)
    name, template = SETTINGS[setting]
    opts = template.format(link=link, cache=tmp_path / "cache")
    before = listing(victim)
    res = seerfs("mount", str(source), str(mountpoint), "-o", opts)
    try:
        if place == "sticky":
            rule = f"{name} {link} is a symlink owned by uid {attacker.pw_uid}; only root's or this user's are followed"
        else:
            rule = f"{name} {link}: {where} is writable by its group and not sticky (mode 0775)"
        one_line_error(res, ExitCode.CONFIG, rule)
        assert "Permission denied" not in res.stderr  # seerfs's own check, not the kernel's
        assert not is_mounted(mountpoint)
    finally:
        if is_mounted(mountpoint):
            seerfs("umount", str(mountpoint))
            force_unmount(mountpoint)
    assert listing(victim) == before


@pytest.mark.mount
def test_a_group_writable_cache_dir_is_refused_before_a_member_can_swap_log(
    attacker: pwd.struct_passwd, unprotected_symlinks: None, source: Path, mountpoint: Path, tmp_path: Path
) -> None:
    """Before: cache_dir 0770 was accepted, a group member replaced log/ by a symlink, and the root
    daemon wrote its log into the directory it pointed at."""
    victim = make_victim(tmp_path / "victim")
    cache = Path(tempfile.mkdtemp(prefix="seerfs-gcache-", dir="/tmp"))
    try:
        os.chown(cache, 0, attacker.pw_gid)
        os.chmod(cache, 0o770)
        plant(attacker, victim, cache / "log")
        before = listing(victim)
        res = seerfs("mount", str(source), str(mountpoint), "-o", f"cache_dir={cache}")
        one_line_error(res, ExitCode.CONFIG, f"cache_dir {cache} is writable by its group (mode 0770)")
        assert not is_mounted(mountpoint)
        assert listing(victim) == before
        assert sorted(p.name for p in cache.iterdir()) == ["log"]  # nothing made in the refused directory
    finally:
        force_unmount(mountpoint)
        shutil.rmtree(cache, ignore_errors=True)


@pytest.mark.mount
@pytest.mark.parametrize("case", ["not a tier", "another uid's entry"])
def test_a_tier_directory_holding_a_foreign_file_refuses_the_mount_and_keeps_it(
    attacker: pwd.struct_passwd, source: Path, mountpoint: Path, tmp_path: Path, case: str
) -> None:
    """Through the real daemon (the tier opens after the fork; its error comes back through the
    readiness pipe): exit 3, one line, and the foreign file still there, same content, after the
    mount attempt and an umount attempt."""
    tier = tmp_path / "tier"
    opts = f"cache_dir={tmp_path / 'cache'},tiers.0.kind=directory,tiers.0.path={tier},tiers.0.bytes=4M"
    if case == "not a tier":
        make_victim(tier)
        foreign = tier / "05" / "5"
        rule = f"tiers.0.path: {tier} is not empty and holds no {MARKER_NAME} nor a valid seerfs index"
    else:
        with mounted(source, mountpoint, "-o", opts) as mp:  # an empty directory: marked, used
            assert (mp / "c" / "1.bin").read_bytes() == (source / "c" / "1.bin").read_bytes()
            assert status(mp)["pid"] > 0
        assert json.loads((tier / MARKER_NAME).read_text())["uid"] == 0
        foreign = Path(file_path(tier, 261))
        foreign.write_bytes(b"the other user's bytes")
        os.chown(foreign, attacker.pw_uid, attacker.pw_gid)
        rule = f"tiers.0.path: {foreign} is owned by uid {attacker.pw_uid}, not by this daemon's user"
    content = foreign.read_bytes()
    before = listing(tier)
    try:
        one_line_error(seerfs("mount", str(source), str(mountpoint), "-o", opts), ExitCode.CONFIG, rule)
        assert not is_mounted(mountpoint)
        assert seerfs("umount", str(mountpoint)).returncode == ExitCode.NOT_MOUNTED
    finally:
        force_unmount(mountpoint)
    assert foreign.read_bytes() == content and os.lstat(foreign).st_uid in (0, attacker.pw_uid)
    assert listing(tier) == before


@pytest.mark.mount
@pytest.mark.skipif(os.geteuid() != 0, reason="an admin's symlink is root's")
def test_a_root_owned_admin_symlink_still_mounts(source: Path, mountpoint: Path, tmp_path: Path) -> None:
    """/scratch -> /local/nvme, made by root: followed for cache_dir and a tier, whose directories
    seerfs makes 0700 at the target."""
    real_cache, real_tier = tmp_path / "nvme-cache", tmp_path / "nvme-tier"
    links = [Path(f"/tmp/seerfs-admin-{os.getpid()}-{n}") for n in ("cache", "tier")]
    for link, real in zip(links, (real_cache, real_tier), strict=True):
        link.symlink_to(real)  # the targets do not exist yet: seerfs makes them
    try:
        opts = f"cache_dir={links[0]},tiers.0.kind=directory,tiers.0.path={links[1]},tiers.0.bytes=4M"
        with mounted(source, mountpoint, "-o", opts) as mp:
            for f in sorted((source / "c").iterdir()):
                assert (mp / "c" / f.name).read_bytes() == f.read_bytes()
        for d in (real_cache, real_cache / "log", real_cache / "plans", real_cache / "snapshots", real_tier):
            st = os.lstat(d)
            assert stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o700, d
        assert (real_tier / MARKER_NAME).is_file()
    finally:
        for link in links:
            link.unlink()
