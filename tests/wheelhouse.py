"""seerfs as a user gets it: the sdist built from this checkout, the wheel built from that sdist, and
the wheel installed into a clean venv outside the checkout (``installed_seerfs`` fixture).

Why from the sdist: a wheel that builds from the unpacked sdist proves the sdist carries everything
the build needs.  The venv gets its dependencies from ``.whl/`` (wheels tools/setup built at the
versions the development venv runs) with no index and no pip configuration, so the install needs no
network and cannot pick anything up from the checkout.  Commands run with a scrubbed environment
(no PYTHONPATH), from a directory outside the checkout.

The venv is made from a Python every user can run (the development venv's own interpreter may live
under /root, which other users cannot enter), so the non-root test can use the same install.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent
WHEELS = REPO / ".whl"
SYSTEM_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
"""PATH without /usr/local/bin: a seerfs found there (a link into some checkout) must not count."""


def _build(hook: str, source: Path, out: Path) -> Path:
    """Run setuptools' PEP 517 hook (what pip and build call) in ``source``; returns the built file."""
    code = f"from setuptools import build_meta as b; print(b.{hook}({str(out)!r}))"
    res = subprocess.run(
        [sys.executable, "-c", code], cwd=source, capture_output=True, text=True, timeout=300, check=False
    )
    if res.returncode != 0:
        raise AssertionError(f"{hook} in {source} failed:\n{res.stderr[-3000:]}")
    return out / res.stdout.strip().splitlines()[-1]


def clean_copy(dest: Path) -> Path:
    """The checkout without what .gitignore names (venvs, caches, build outputs, a stale egg-info).

    setuptools adds every file an existing ``*.egg-info/SOURCES.txt`` lists to a new sdist, so an
    sdist built in a used checkout could carry files MANIFEST.in no longer names; building from this
    copy, the sdist holds exactly what the source tree and MANIFEST.in give.
    """
    patterns = [".git"]
    for line in (REPO / ".gitignore").read_text().splitlines():
        line = line.strip().strip("/")
        if line and not line.startswith("#"):
            patterns.append(line)
    shutil.copytree(REPO, dest, ignore=shutil.ignore_patterns(*patterns), symlinks=True)
    return dest


def everyone_can_run(path: str) -> bool:
    """Every directory above ``path`` is searchable by others and the file itself executable by them."""
    real = Path(os.path.realpath(path))
    if not real.is_file() or not real.stat().st_mode & stat.S_IXOTH:
        return False
    return all(p.stat().st_mode & stat.S_IXOTH for p in real.parents)


def interpreter() -> str:
    """A CPython of this minor version that every user can run, else this venv's own base interpreter."""
    base = os.path.realpath(getattr(sys, "_base_executable", sys.executable))
    want = f"{sys.version_info.major}.{sys.version_info.minor}"
    for candidate in (base, f"/usr/bin/python{want}", f"/usr/local/bin/python{want}"):
        if not everyone_can_run(candidate):
            continue
        res = subprocess.run(
            [candidate, "-c", "import sys, venv; print('%d.%d' % sys.version_info[:2])"],
            capture_output=True,
            text=True,
            check=False,
        )
        if res.returncode == 0 and res.stdout.strip() == want:
            return candidate
    return base


@dataclass
class Installed:
    """seerfs installed from its wheel into ``venv``; ``root`` is a world-readable scratch directory."""

    root: Path
    venv: Path
    sdist: Path
    wheel: Path
    version: str
    sdist_names: list[str] = field(default_factory=list)
    wheel_names: list[str] = field(default_factory=list)

    @property
    def bin(self) -> Path:
        return self.venv / "bin"

    @property
    def python(self) -> Path:
        return self.bin / "python"

    def env(self, **extra: str) -> dict[str, str]:
        """What a user's shell with the venv on PATH has; nothing that points into the checkout."""
        return {
            "PATH": f"{self.bin}:{SYSTEM_PATH}",
            "HOME": str(self.root / "home"),
            "LANG": "C.UTF-8",
            **extra,
        }

    def run(self, *args: str, timeout: float = 120, **kw: Any) -> subprocess.CompletedProcess[str]:
        """``seerfs ARGS`` from the installed console script, run from outside the checkout."""
        return subprocess.run(
            [str(self.bin / "seerfs"), *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=self.env(),
            cwd=self.root / "work",
            check=False,
            **kw,
        )


def private_mounts_unavailable() -> str | None:
    """Why a private mount namespace cannot be had here (the tests that need one skip), or None."""
    if os.geteuid() != 0:
        return "needs root to create a private mount namespace"
    try:
        res = subprocess.run(
            ["unshare", "--mount", "--propagation", "private", "true"], capture_output=True, timeout=30
        )
    except OSError as exc:
        return f"unshare: {exc.strerror}"
    return None if res.returncode == 0 else f"unshare --mount failed: {res.stderr.decode(errors='replace').strip()}"


def in_private_mounts(
    script: str, marker: Path, env: dict[str, str], timeout: float = 180
) -> subprocess.CompletedProcess[str]:
    """Run bash ``script`` as root in a private mount namespace: what it mounts (a tmpfs over
    /usr/local/bin, a FUSE mount) exists only there, so the host's directories and mount table never
    change, and the namespace, with any mount left in it, ends with its last process.

    Afterwards, processes still running whose command line names ``marker`` (the test's own scratch
    directory: only what the test started) are killed, so a failed script leaves no daemon behind.
    """
    try:
        return subprocess.run(
            ["unshare", "--mount", "--propagation", "private", "bash", "-euo", "pipefail", "-c", script],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
            cwd=marker,
            check=False,
        )
    finally:
        kill_started_under(marker)


def kill_started_under(marker: Path) -> None:
    """SIGKILL the processes whose command line names ``marker`` (by pid, each one checked)."""
    needle = str(marker).encode()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            if needle in (proc / "cmdline").read_bytes():
                os.kill(int(proc.name), 9)
        except OSError:
            continue


@pytest.fixture(scope="session")
def installed_seerfs() -> Iterator[Installed]:
    if not (WHEELS / "STAMP").is_file():
        pytest.skip(f"no dependency wheels in {WHEELS}: run tools/setup (it builds them)")
    root = Path(tempfile.mkdtemp(prefix="seerfs-wheel-"))
    try:
        root.chmod(0o755)
        for d in ("dist", "home", "work"):
            (root / d).mkdir()
        sdist = _build("build_sdist", clean_copy(root / "checkout"), root / "dist")
        with tarfile.open(sdist) as tar:
            sdist_names = tar.getnames()
            tar.extractall(root / "src", filter="data")
        unpacked = next((root / "src").iterdir())
        wheel = _build("build_wheel", unpacked, root / "dist")
        with zipfile.ZipFile(wheel) as zf:
            wheel_names = zf.namelist()
        venv = root / "venv"
        subprocess.run([interpreter(), "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
        pip_env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "PYTHON"))}
        pip_env["PIP_CONFIG_FILE"] = os.devnull  # no find-links or index from a pip.conf
        pip = [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "--disable-pip-version-check"]
        res = subprocess.run(
            [*pip, "install", "--no-index", "--find-links", str(WHEELS), "--no-compile", "-q", str(wheel)],
            capture_output=True,
            text=True,
            timeout=300,
            env=pip_env,
            cwd=root,
            check=False,
        )
        assert res.returncode == 0, f"pip install of {wheel.name} failed:\n{res.stderr[-3000:]}"
        version = wheel.name.split("-")[1]
        yield Installed(root, venv, sdist, wheel, version, sdist_names, wheel_names)
    finally:
        shutil.rmtree(root, ignore_errors=True)
