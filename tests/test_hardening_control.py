"""Hostile writes to ``.control``: every one fails with a one-line reason and the daemon keeps serving.

Each test names the fault it injects and checks that it was really hit (the write's errno and the
reason status gives), then that the same daemon still answers and serves the source's bytes.
Memory is read from the daemon's own ``/proc/PID/status`` (VmHWM, the peak resident set), never
from seerfs.
"""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from mounting import mounted, status

from fusefs.planning.seed import parse_seed

pytestmark = pytest.mark.mount

MiB = 1 << 20


@pytest.fixture
def mount(tmp_path: Path, mountpoint: Path, cache_dir: Path) -> Iterator[Path]:
    src = tmp_path / "src"
    (src / "cls").mkdir(parents=True)
    (src / "cls" / "a.bin").write_bytes(os.urandom(70_000))
    with mounted(src, mountpoint, cache_dir=cache_dir):
        yield mountpoint


def still_serving(mnt: Path, pid: int) -> None:
    """The same daemon answers status and serves the source's bytes (nothing restarted it)."""
    doc = status(mnt)
    assert doc["pid"] == pid and doc["state"] == "serving"
    assert (mnt / "cls" / "a.bin").read_bytes() == (Path(doc["source"]) / "cls" / "a.bin").read_bytes()


def vm_hwm(pid: int) -> int:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def write_einval(path: Path, data: bytes, *, flags: int = os.O_WRONLY | os.O_TRUNC, offset: int | None = None) -> None:
    fd = os.open(path, flags)
    try:
        with pytest.raises(OSError) as exc:
            if offset is None:
                os.write(fd, data)
            else:
                os.pwrite(fd, data, offset)
        assert exc.value.errno == errno.EINVAL, exc.value
    finally:
        os.close(fd)


def last_error(mnt: Path) -> str:
    return str(status(mnt)["seed"]["last_error"])


def test_parse_seed_refuses_any_length_without_converting_it() -> None:
    """Python refuses int() of more than 4,300 digits with a plain ValueError; parse_seed must turn
    every length into its own one-line SeedSyntaxError (the daemon only catches that)."""
    from fusefs.planning.seed import SeedSyntaxError

    for text in (b"9" * 4301, b"1" * 100_000, b"-" + b"0" * 5000 + b"1", b" " * 10 + b"9" * 21):
        with pytest.raises(SeedSyntaxError) as exc:
            parse_seed(text)
        assert len(str(exc.value).splitlines()) == 1 and len(str(exc.value)) < 200
    assert parse_seed(b"0" * 30 + b"42\n") == 42  # leading zeros are still a seed
    assert parse_seed(str(2**64 - 1).encode()) == 2**64 - 1
    assert parse_seed(str(-(2**63)).encode()) == -(2**63)
    with pytest.raises(SeedSyntaxError):
        parse_seed(str(2**64).encode())
    with pytest.raises(SeedSyntaxError):
        parse_seed("٣".encode())  # a Unicode digit is not ASCII


def test_a_seed_of_thousands_of_digits_is_einval_and_the_daemon_keeps_serving(mount: Path) -> None:
    pid = status(mount)["pid"]
    seed = mount / ".control" / "seed"
    write_einval(seed, b"7" * 5000 + b"\n")  # one write, above Python's 4,300-digit limit
    assert "(at most 256)" in last_error(mount)
    write_einval(seed, b"9" * 200 + b"\n")  # within the text bound: refused by range
    assert "outside torch's range" in last_error(mount)
    still_serving(mount, pid)
    seed.write_text("11\n")
    assert status(mount)["seed"]["value"] == 11 and status(mount)["seed"]["last_error"] is None


def test_a_pwrite_at_a_large_offset_allocates_nothing(mount: Path) -> None:
    """Before: the handle's buffer was padded with NULs up to the offset (about 3x the offset in
    peak memory).  Now the end of the write is checked first."""
    pid = status(mount)["pid"]
    seed = mount / ".control" / "seed"
    before = vm_hwm(pid)
    write_einval(seed, b"5", flags=os.O_WRONLY, offset=256 * MiB)
    grew = vm_hwm(pid) - before
    assert grew < 16 * MiB, f"daemon peak RSS grew {grew / MiB:.0f} MiB for one pwrite"
    assert "would end at byte" in last_error(mount)
    still_serving(mount, pid)
    assert seed.read_text() == "0\n"


def test_every_other_control_abuse_is_refused_and_the_daemon_keeps_serving(mount: Path) -> None:
    pid = status(mount)["pid"]
    ctl = mount / ".control"
    seed = ctl / "seed"
    seed.write_text("3\n")
    # Writes to status and config: refused at open.
    for name in ("status", "config"):
        for flags in (os.O_WRONLY, os.O_RDWR, os.O_WRONLY | os.O_APPEND, os.O_WRONLY | os.O_TRUNC):
            with pytest.raises(PermissionError):
                os.open(ctl / name, flags)
        with pytest.raises(OSError):
            os.truncate(ctl / name, 0)
    # O_APPEND: "3\n" then "5\n" is not one seed.
    write_einval(seed, b"5\n", flags=os.O_WRONLY | os.O_APPEND)
    assert "decimal integer" in last_error(mount)
    # truncate to anything but 0.
    with pytest.raises(OSError) as exc:
        os.truncate(seed, 7)
    assert exc.value.errno == errno.EINVAL and "truncated to 7" in last_error(mount)
    # A huge write in one call (the kernel splits it; the first piece already fails).
    write_einval(seed, b"1" * (8 * MiB))
    # Non-ASCII, negative and out-of-range values, NULs, nothing at all.
    for bad, why in (
        ("٤٢\n".encode(), "non-ASCII"),
        (b"\xff\xfe", "non-ASCII"),
        (str(-(2**63) - 1).encode(), "outside"),
        (str(2**64).encode(), "outside"),
        (b"4\x002", "decimal integer"),
        (b"  \n", "got nothing"),
        (b"0x10", "decimal integer"),
    ):
        write_einval(seed, bad)
        assert why in last_error(mount), (bad, last_error(mount))
    assert status(mount)["seed"]["value"] == 3  # none of it changed the seed
    seed.write_text(f"{-(2**63)}\n")  # the extremes are seeds
    assert status(mount)["seed"]["value"] == -(2**63)
    # A seed split over several write() calls on one handle is the whole text so far.
    fd = os.open(seed, os.O_WRONLY | os.O_TRUNC)
    try:
        for piece in (b"1", b"2", b"3\n"):
            os.write(fd, piece)
    finally:
        os.close(fd)
    assert status(mount)["seed"]["value"] == 123
    # ftruncate on an open handle empties its text: the next write is a fresh seed, not "9" + "23".
    fd = os.open(seed, os.O_RDWR)
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, b"9\n", 0)
    finally:
        os.close(fd)
    assert status(mount)["seed"]["value"] == 9
    # Many concurrent writers: every write either lands or fails cleanly, the daemon stays up.
    errors: list[BaseException] = []

    def writer(k: int) -> None:
        try:
            for i in range(20):
                fd = os.open(seed, os.O_WRONLY | os.O_TRUNC)
                try:
                    os.write(fd, b"x" if (i + k) % 3 == 0 else f"{k * 1000 + i}\n".encode())
                except OSError as exc:
                    assert exc.errno == errno.EINVAL
                finally:
                    os.close(fd)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(k,)) for k in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors[:3]
    assert 0 <= status(mount)["seed"]["value"] < 16_000
    still_serving(mount, pid)
