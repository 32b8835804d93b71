"""Everything a user can get wrong about a mount, checked in the calling process before anything forks.

Each failure is one :class:`fusefs.errors.SeerfsError` with its documented exit code, so the error
is one line on the user's terminal instead of a line in a daemon log.  Every directory the daemon
will write is checked here from / down (:mod:`fusefs.trust`), so no other local user can redirect it.
"""

from __future__ import annotations

import os
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path

from fusefs import mountinfo
from fusefs.config import Config
from fusefs.errors import ExitCode, FuseUnavailable, MountpointError, SeerfsError, SourceError
from fusefs.trust import trusted_dir


@dataclass(frozen=True)
class MountRequest:
    source: str
    mountpoint: str
    config: Config
    rescan: bool = False

    @property
    def log_file(self) -> Path:
        if self.config.log_file:
            return Path(os.path.expanduser(self.config.log_file))
        import xxhash

        tag = xxhash.xxh64_hexdigest(self.mountpoint.encode())[:12]
        name = os.path.basename(self.mountpoint.rstrip("/")) or "root"
        return self.config.cache_path / "log" / f"{name}-{tag}.log"


def check_request(source: str | None, mountpoint: str, cfg: Config, rescan: bool = False) -> MountRequest:
    """Everything a user can get wrong about a mount, each as one clear error."""
    src = source or cfg.source
    if not src:
        raise SourceError("no SOURCE given (argument or 'source:' in the config)")
    if not os.path.exists(src):
        raise SourceError(f"source {src}: no such directory")
    if not os.path.isdir(src):
        raise SourceError(f"source {src}: not a directory")
    if not os.access(src, os.R_OK | os.X_OK):
        raise SourceError(f"source {src}: permission denied")
    mp = mountinfo.normalize(mountpoint)
    existing = mountinfo.find(mp)
    if existing is not None:
        hint = "; run 'seerfs umount' first" if existing.fstype == mountinfo.FSTYPE else ""
        raise MountpointError(f"mountpoint {mp}: already mounted ({existing.fstype}){hint}")
    if not os.path.isdir(mp):
        raise MountpointError(f"mountpoint {mp}: {'not a directory' if os.path.exists(mp) else 'no such directory'}")
    try:
        if os.listdir(mp):
            raise MountpointError(f"mountpoint {mp}: not empty")
    except PermissionError:
        raise MountpointError(f"mountpoint {mp}: permission denied") from None
    if os.path.realpath(src) == os.path.realpath(mp):
        raise MountpointError(f"mountpoint {mp}: is the source itself")
    try:
        fd = os.open("/dev/fuse", os.O_RDWR)
        os.close(fd)
    except OSError as exc:
        hint = "load the fuse module or give the container the device"
        if os.geteuid() != 0 and isinstance(exc, PermissionError):
            hint = "a non-root mount needs read-write access to it: mode 0666, as the fuse3 package's udev rule sets"
        raise FuseUnavailable(f"/dev/fuse: {exc.strerror} ({hint})") from None
    if os.geteuid() != 0:
        _check_fusermount()
    if cfg.allow_other and os.geteuid() != 0 and not _user_allow_other():
        raise FuseUnavailable("allow_other needs 'user_allow_other' in /etc/fuse.conf (or mount as root)")
    check_written_dirs(cfg)
    return MountRequest(os.path.abspath(src), mp, cfg, rescan)


def check_written_dirs(cfg: Config) -> None:
    """Every directory the daemon will create or write, trusted from / down (:mod:`fusefs.trust`),
    made (0700) where missing: cache_dir and its subdirectories, each directory tier, the log's
    directory, and the rendezvous directory and the token file's directory where formation uses them."""
    from fusefs.cluster.formation import detect_mode

    _check_writable_dir(cfg.cache_path, "cache_dir")
    _check_free(cfg.cache_path, "cache_dir")
    for sub in CACHE_SUBDIRS:
        if sub != "log" or not cfg.log_file:
            trusted_dir(cfg.cache_path / sub, "cache_dir")
    for i, tier in enumerate(cfg.tiers):
        if tier.kind == "directory" and tier.path:
            _check_writable_dir(tier.directory(cfg.cache_path), f"tiers.{i}.path")
    if cfg.log_file:
        _check_writable_dir(Path(os.path.expanduser(cfg.log_file)).parent, "log_file")
    mode = detect_mode(cfg)
    if cfg.peers.rendezvous_dir and mode == "rendezvous":
        _check_writable_dir(Path(os.path.expanduser(cfg.peers.rendezvous_dir)), "peers.rendezvous_dir")
    if cfg.peers.token_file and mode in ("rendezvous", "static"):
        trusted_dir(Path(os.path.expanduser(cfg.peers.token_file)).parent, "peers.token_file", create=False)


CACHE_SUBDIRS = ("log", "plans", "snapshots")
"""What the daemon makes inside cache_dir: the default log's directory, plans, persisted snapshots."""


def _check_fusermount() -> None:
    """A non-root mount goes through fusermount3, which must be setuid root to call mount(2)."""
    exe = shutil.which("fusermount3") or "/usr/bin/fusermount3"
    try:
        st = os.stat(exe)
    except OSError:
        raise FuseUnavailable("fusermount3 not found: a non-root mount needs it (install the fuse3 package)") from None
    if st.st_uid != 0 or not st.st_mode & stat.S_ISUID:
        raise FuseUnavailable(f"{exe} is not setuid root: a non-root mount needs it (chmod u+s, owned by root)")


def _user_allow_other() -> bool:
    try:
        with open("/etc/fuse.conf") as fh:
            return any(line.strip() == "user_allow_other" for line in fh)
    except OSError:
        return False


MIN_CACHE_FREE = 1 << 20
"""Free bytes cache_dir needs at mount: the log, the persisted snapshot and the first plan (a full
cache_dir is the user's to fix, one line and exit status 3, not a startup failure)."""


def _check_writable_dir(path: Path, what: str) -> None:
    """``path`` trusted from / down (made if missing) and writable by this user."""
    trusted_dir(path, what)
    if not os.access(path, os.W_OK | os.X_OK):
        raise SeerfsError(f"{what} {path}: not writable", ExitCode.CONFIG)


def _check_free(path: Path, what: str) -> None:
    try:
        st = os.statvfs(path)
    except OSError as exc:
        raise SeerfsError(f"{what} {path}: {exc.strerror}", ExitCode.CONFIG) from None
    free = st.f_bavail * st.f_frsize
    if free < MIN_CACHE_FREE:
        raise SeerfsError(
            f"{what} {path}: full ({free // 1024} KiB free, at least {MIN_CACHE_FREE >> 20} MiB needed)",
            ExitCode.CONFIG,
        )
