"""With allow_other, other users see exactly what the source lets them see, and never write .control."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from mounting import mounted

pytestmark = pytest.mark.mount

NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]


@pytest.fixture
def public_dir() -> Iterator[Path]:
    """A world-traversable directory (pytest's tmp dirs are 0700, so another user could not reach them)."""
    d = Path(tempfile.mkdtemp(prefix="seerfs-perm-"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def as_nobody(*cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*NOBODY, *cmd], capture_output=True, text=True, timeout=30)


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root and setpriv")
def test_other_user_is_bound_by_source_permissions(public_dir: Path, cache_dir: Path) -> None:
    src = public_dir / "src"
    (src / "cls").mkdir(parents=True)
    (src / "cls" / "public.jpg").write_bytes(b"anyone may read")
    (src / "cls" / "public.jpg").chmod(0o644)
    (src / "cls" / "secret.jpg").write_bytes(b"root only")
    (src / "cls" / "secret.jpg").chmod(0o600)
    mp = public_dir / "mnt"
    with mounted(src, mp, "-o", "allow_other=true", cache_dir=cache_dir):
        ok = as_nobody("cat", str(mp / "cls" / "public.jpg"))
        assert ok.returncode == 0 and ok.stdout == "anyone may read"  # allow_other works at all
        denied = as_nobody("cat", str(mp / "cls" / "secret.jpg"))
        assert denied.returncode != 0 and "Permission denied" in denied.stderr
        seed_write = as_nobody("sh", "-c", f"echo 5 > {mp}/.control/seed")
        assert seed_write.returncode != 0 and "Permission denied" in seed_write.stderr
        assert as_nobody("cat", str(mp / ".control" / "seed")).stdout == "0\n"  # reading is fine
        assert (mp / ".control" / "seed").read_text() == "0\n"


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root and setpriv")
def test_control_owner_hands_the_seed_to_one_other_user(public_dir: Path, cache_dir: Path) -> None:
    """A root mount for a job (Slurm prolog): control_owner's user writes the seed, nobody else but root."""
    src = public_dir / "src"
    (src / "cls").mkdir(parents=True)
    (src / "cls" / "a.jpg").write_bytes(b"x")
    mp = public_dir / "mnt"
    with mounted(src, mp, "-o", "allow_other=true,control_owner=65534", cache_dir=cache_dir):
        owner = as_nobody("sh", "-c", f"echo 5 > {mp}/.control/seed")
        assert owner.returncode == 0, owner.stderr
        assert (mp / ".control" / "seed").read_text() == "5\n"
        other = subprocess.run(
            ["setpriv", "--reuid=65533", "--regid=65533", "--clear-groups", "sh", "-c", f"echo 6 > {mp}/.control/seed"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert other.returncode != 0 and "Permission denied" in other.stderr
        (mp / ".control" / "seed").write_text("7\n")  # root still may
        assert as_nobody("cat", str(mp / ".control" / "seed")).stdout == "7\n"
