"""mount(8)'s option syntax: ``-o KEY=VAL,...`` strings split into a config file, overrides and ignored options.

mount.fuse3 hands ``seerfs SOURCE MOUNTPOINT -o OPTS`` the options of an fstab line or of ``mount
-o`` as they are, generic ones (``rw``, ``noauto``, ...) included; ``seerfs`` takes the same ``-o``
on every subcommand that reads a config.  This is command-line syntax, so it lives in the CLI:
:mod:`fusefs.config` only applies the resulting dotted ``KEY=VAL`` overrides (:func:`fusefs.config.load`).
"""

from __future__ import annotations

from fusefs.errors import ConfigError

GENERIC_MOUNT_OPTIONS = frozenset(
    [
        "rw",
        "ro",
        "dev",
        "nodev",
        "suid",
        "nosuid",
        "exec",
        "noexec",
        "auto",
        "noauto",
        "user",
        "nouser",
        "users",
        "owner",
        "group",
        "defaults",
        "async",
        "sync",
        "atime",
        "noatime",
        "diratime",
        "nodiratime",
        "relatime",
        "norelatime",
        "strictatime",
        "lazytime",
        "nolazytime",
        "_netdev",
        "nofail",
        "silent",
        "loud",
        "nomand",
        "mand",
        "iversion",
        "noiversion",
    ]
)
"""Options mount(8)/mount.fuse3 may pass along; they mean nothing to seerfs and are ignored."""


def parse_mount_options(opts: list[str]) -> tuple[str | None, dict[str, str], list[str]]:
    """Split ``-o`` strings into (config file, key=value overrides, ignored generic options)."""
    config_file: str | None = None
    overrides: dict[str, str] = {}
    ignored: list[str] = []
    for chunk in opts:
        for item in chunk.split(","):
            item = item.strip()
            if not item:
                continue
            key, sep, value = item.partition("=")
            if key == "config" and sep:
                config_file = value
            elif key == "allow_other" and not sep:
                overrides["allow_other"] = "true"
            elif key in GENERIC_MOUNT_OPTIONS and not sep:
                ignored.append(key)
            elif not sep:
                raise ConfigError(f"-o {item}: expected key=value (e.g. job.epochs=3) or config=FILE")
            else:
                overrides[key] = value
    return config_file, overrides, ignored
