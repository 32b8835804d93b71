"""Builds the optional native FUSE front (``fusefs/fuse/_native.c``); everything else is in pyproject.toml.

The extension needs libfuse3's headers (Debian: libfuse3-dev), pkg-config and a C compiler, the same
as pyfuse3.  It is optional: without them the build goes on without it and the daemon serves
through the pyfuse3 front (``fuse.front``).
"""

from __future__ import annotations

import shlex
import subprocess

from setuptools import Extension, setup


def _pkg_config(*args: str) -> list[str]:
    try:
        out = subprocess.run(["pkg-config", *args, "fuse3"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return []
    return shlex.split(out)


setup(
    ext_modules=[
        Extension(
            "fusefs.fuse._native",
            ["fusefs/fuse/_native.c"],
            extra_compile_args=[
                *_pkg_config("--cflags"),
                "-O2",
                "-std=gnu11",
                "-Wall",
                "-Wno-missing-field-initializers",
            ],
            extra_link_args=_pkg_config("--libs") or ["-lfuse3", "-lpthread"],
            optional=True,
        )
    ]
)
