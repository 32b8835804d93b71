"""User-facing errors and the documented exit codes (man seerfs(1), EXIT STATUS).

Anything a user can cause is raised as a :class:`SeerfsError` subclass and reported by the CLI as
one line, never a traceback.
"""

from __future__ import annotations

import os
from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0
    INTERNAL = 1  # a bug: the message names the log file
    USAGE = 2  # bad command line (argparse)
    CONFIG = 3  # bad configuration file, -o override or option value
    SOURCE = 4  # SOURCE missing, not a directory or unreadable
    MOUNTPOINT = 5  # MOUNTPOINT missing, not a directory, not empty or already mounted
    FUSE = 6  # FUSE unusable: no /dev/fuse, no fusermount3, allow_other refused
    TIMEOUT = 7  # wait/umount gave up after --timeout
    BUSY = 8  # umount: the mount is in use (the holders are named)
    NOT_MOUNTED = 9  # no seerfs mount at that path
    GROUP = 10  # the daemon group could not form or disagrees (config/plan digests)
    DEAD = 11  # the mount is there but its daemon is gone (ENOTCONN): run umount


EXIT_MEANINGS = {
    ExitCode.OK: "success",
    ExitCode.INTERNAL: "internal error (a bug); the message names the daemon log",
    ExitCode.USAGE: "bad command line",
    ExitCode.CONFIG: "bad configuration file, -o override, or a directory seerfs writes that is unusable, full, "
    "or that another user could write or redirect (NOTES), or a tier directory seerfs did not make; or memory "
    "bytes set that the memory cgroup cannot hold",
    ExitCode.SOURCE: "SOURCE missing, not a directory or unreadable",
    ExitCode.MOUNTPOINT: "MOUNTPOINT missing, not a directory, not empty or already mounted",
    ExitCode.FUSE: "FUSE unusable: no /dev/fuse, no fusermount3, or allow_other refused",
    ExitCode.TIMEOUT: "gave up waiting (--timeout)",
    ExitCode.BUSY: "umount: the mount is in use; the holding processes are named",
    ExitCode.NOT_MOUNTED: "no seerfs mount at that path",
    ExitCode.GROUP: "the daemon group could not form, or nodes disagree on config or plan",
    ExitCode.DEAD: "the mount's daemon is gone (transport endpoint is not connected); 'seerfs umount' cleans up",
}


class SeerfsError(Exception):
    code: ExitCode = ExitCode.INTERNAL

    def __init__(self, message: str, code: ExitCode | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code


class ConfigError(SeerfsError):
    code = ExitCode.CONFIG


class SourceError(SeerfsError):
    code = ExitCode.SOURCE


class MountpointError(SeerfsError):
    code = ExitCode.MOUNTPOINT


class FuseUnavailable(SeerfsError):
    code = ExitCode.FUSE


class TimeoutExpired(SeerfsError):
    code = ExitCode.TIMEOUT


class BusyError(SeerfsError):
    code = ExitCode.BUSY


class NotMounted(SeerfsError):
    code = ExitCode.NOT_MOUNTED


class GroupError(SeerfsError):
    code = ExitCode.GROUP


class DeadMount(SeerfsError):
    code = ExitCode.DEAD


class FsError(OSError):
    """A filesystem request fails with ``errno``: what the FUSE front answers the kernel.

    Only this class is a reply; any other exception escaping a handler is a bug, and the front
    treats it as the binding does (pyfuse3 ends its main loop, so the mount, on it).  Lives here,
    not in :mod:`fusefs.fuse`, because the read path below that layer raises it too.
    """

    errno: int  # always set: the constructor takes it

    def __init__(self, code: int) -> None:
        super().__init__(code, os.strerror(code))
