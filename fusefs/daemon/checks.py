"""Everything a user can get wrong about a mount, checked in the calling process before anything forks.

Each failure is one :class:`fusefs.errors.SeerfsError` with its documented exit code, so the error
is one line on the user's terminal instead of a line in a daemon log.
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
    for tier in cfg.tiers:
        if tier.kind == "directory" and tier.path:
            _check_writable_dir(Path(os.path.expanduser(tier.path)), "tier directory")
    _check_writable_dir(cfg.cache_path, "cache_dir")
    _check_free(cfg.cache_path, "cache_dir")
    if cfg.peers.rendezvous_dir:
        rendezvous = Path(os.path.expanduser(cfg.peers.rendezvous_dir))
        if rendezvous.is_dir():  # created private (0700) by the daemon when missing
            check_private_dir(rendezvous, "peers.rendezvous_dir")
    return MountRequest(os.path.abspath(src), mp, cfg, rescan)


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
    try:
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as exc:
        raise SeerfsError(f"{what} {path}: {exc.strerror}", ExitCode.CONFIG) from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise SeerfsError(f"{what} {path}: not writable", ExitCode.CONFIG)
    check_private_dir(path, what)


def check_private_dir(path: Path, what: str) -> None:
    """Refuse a directory another local user can write: they could swap cached bytes, plans, the
    job token or a rendezvous entry under the daemon (the sticky bit stops deletes, not creates)."""
    try:
        st = path.stat()
    except OSError as exc:
        raise SeerfsError(f"{what} {path}: {exc.strerror}", ExitCode.CONFIG) from None
    if st.st_mode & stat.S_IWOTH:
        raise SeerfsError(
            f"{what} {path}: writable by other users (mode {stat.S_IMODE(st.st_mode):04o}); use a private directory",
            ExitCode.CONFIG,
        )
    if st.st_uid not in (0, os.geteuid()):
        raise SeerfsError(f"{what} {path}: owned by uid {st.st_uid}, not by this user or root", ExitCode.CONFIG)


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
