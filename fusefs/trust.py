"""Trusted paths: a directory seerfs writes in is checked from / down before anything is made in it.

Why: the daemon often runs as root, and cache_dir, the tier paths, the rendezvous directory and the
log directory come from a config file.  If another local user can change any directory on such a
path, they can swap a component for a symlink and send the daemon's writes (and a directory tier's
deletions) into a directory of their choosing, root's own for instance; ``fs.protected_symlinks``
does not cover a non-sticky shared directory, and distributions differ on it anyway.  So, as sshd's
StrictModes and systemd-tmpfiles do, every component from / down must be

- a directory owned by root or by the daemon's user, not writable by group or others unless it is
  sticky: others cannot rename or remove what is not theirs in a sticky directory (/tmp), and the
  next component must be root's or this user's like any other;
- or a symlink owned by root or by the daemon's user (an admin's /scratch -> /local/nvme keeps
  working), whose target is then checked the same way;

and the final directory must not be writable by group or others at all.  Once the chain holds no
other user can swap a component, so what seerfs then creates inside it is made by mkdir (which
never follows a symlink at its last component) or opened with O_NOFOLLOW, and checked with lstat
(:func:`private_subdir`).  Missing components are made one at a time, mode 0700, each checked
like the others once made (another user may have won the race to the name in a sticky directory).

Every failure is one line naming the path and the rule, exit status 3 (``ExitCode.CONFIG``).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from pathlib import Path

from fusefs.errors import ConfigError

MAX_SYMLINKS = 40
"""Symlinks followed on one path before giving up, as the kernel does (ELOOP)."""


class UntrustedPath(ConfigError):
    """A path another local user could redirect: one line, exit status 3."""


def trusted_uids() -> tuple[int, int]:
    return (0, os.geteuid())


def _writers(mode: int) -> str | None:
    """Who besides the owner may write a directory of ``mode``: 'other users', 'its group' or None."""
    if mode & stat.S_IWOTH:
        return "other users"
    if mode & stat.S_IWGRP:
        return "its group"
    return None


def trusted_dir(path: str | os.PathLike[str], what: str, *, create: bool = True) -> Path:
    """Check ``path`` from / down (see the module's rules) and return it with every symlink resolved.

    A missing component is made (mode 0700) when ``create``; otherwise the walk stops there and
    the existing part alone is checked.  ``what`` names the setting in the message
    (``cache_dir``, ``tiers.0.path``...).  Raises :class:`UntrustedPath`.
    """
    shown = os.fspath(path)
    # Not normalised: ".." after a symlink goes up from its target, as the kernel does.
    full = os.path.join(os.getcwd(), os.path.expanduser(shown))

    def fail(component: str, rule: str) -> UntrustedPath:
        if component in (full, os.path.normpath(full)):
            return UntrustedPath(f"{what} {shown} {rule}")
        return UntrustedPath(f"{what} {shown}: {component} {rule}")

    uids = trusted_uids()
    todo = [p for p in reversed(full.split("/")) if p]
    resolved = "/"
    st = os.lstat("/")
    if st.st_uid not in uids:
        raise fail("/", f"is owned by uid {st.st_uid}, not by root or this user")
    links = 0
    while todo:
        part = todo.pop()
        if part in ("", "."):
            continue
        if part == "..":
            resolved = os.path.dirname(resolved)
            st = os.lstat(resolved)
            continue
        here = os.path.join(resolved, part)
        try:
            st = os.lstat(here)
        except FileNotFoundError:
            if not create:
                return Path(os.path.join(here, *reversed(todo)))
            try:
                os.mkdir(here, 0o700)
            except FileExistsError:
                pass  # made meanwhile (another daemon of this user, or someone else: checked below)
            except OSError as exc:
                raise fail(here, f"cannot be created ({exc.strerror})") from None
            try:
                st = os.lstat(here)
            except OSError as exc:
                raise fail(here, f"cannot be checked ({exc.strerror})") from None
        except OSError as exc:
            raise fail(here, f"cannot be checked ({exc.strerror})") from None
        if stat.S_ISLNK(st.st_mode):
            if st.st_uid not in uids:
                raise fail(here, f"is a symlink owned by uid {st.st_uid}; only root's or this user's are followed")
            links += 1
            if links > MAX_SYMLINKS:
                raise fail(here, f"has more than {MAX_SYMLINKS} symlinks on its way")
            target = os.readlink(here)
            if target.startswith("/"):
                resolved = "/"
            todo.extend(p for p in reversed(target.split("/")) if p)
            continue
        if not stat.S_ISDIR(st.st_mode):
            raise fail(here, "is not a directory")
        if st.st_uid not in uids:
            raise fail(here, f"is owned by uid {st.st_uid}, not by root or this user")
        writers = _writers(st.st_mode)
        if writers is not None and todo and not st.st_mode & stat.S_ISVTX:
            raise fail(
                here,
                f"is writable by {writers} and not sticky (mode {stat.S_IMODE(st.st_mode):04o}): "
                "they could swap what is inside it",
            )
        resolved = here
    writers = _writers(st.st_mode)
    if writers is not None:
        raise fail(
            resolved,
            f"is writable by {writers} (mode {stat.S_IMODE(st.st_mode):04o}); seerfs writes only in a "
            "directory no other user can write",
        )
    return Path(resolved)


def private_subdir(path: str | os.PathLike[str]) -> Path:
    """Make directory ``path`` (mode 0700) inside a directory already trusted, or accept the one there
    when it is a real directory (not a symlink), this user's, and not writable by group or others.

    For what seerfs makes below a trusted directory (a directory tier's fan-out directories):
    only this user can have put something at that name, so an OSError (ELOOP, ENOTDIR, EPERM) is
    enough, for callers that already handle one."""
    p = Path(path)
    with contextlib.suppress(FileExistsError):
        os.mkdir(p, 0o700)
    st = os.lstat(p)
    if stat.S_ISLNK(st.st_mode):
        raise OSError(errno.ELOOP, "a symlink where seerfs keeps a directory", str(p))
    if not stat.S_ISDIR(st.st_mode):
        raise OSError(errno.ENOTDIR, "not a directory", str(p))
    if st.st_uid != os.geteuid() or _writers(st.st_mode) is not None:
        why = f"owned by uid {st.st_uid} or writable by others (mode {stat.S_IMODE(st.st_mode):04o})"
        raise OSError(errno.EPERM, why, str(p))
    return p


def read_file_itself(path: str | os.PathLike[str], limit: int) -> tuple[os.stat_result, bytes | None]:
    """The status of the file at ``path`` and its first ``limit`` bytes, or None for them when it is
    not a regular file.  Opened with O_NOFOLLOW (a symlink at the name is ELOOP, never read through)
    and O_NONBLOCK (a FIFO planted there cannot hang the daemon): for the small files seerfs reads
    back from a trusted directory (the job token, a tier's marker)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
    with open(fd, "rb") as fh:
        st = os.fstat(fd)
        return st, fh.read(limit) if stat.S_ISREG(st.st_mode) else None
