"""seerfs run by an ordinary user: mount, read, status and umount with no root privilege at all.

The user is created for the test (useradd) and runs the seerfs installed from the wheel (the
installed_seerfs fixture's venv, made from a Python every user can run) through setpriv, with a
scrubbed environment.  A non-root FUSE mount goes through the setuid fusermount3, which opens
/dev/fuse as the user: where /dev/fuse is root-only (mode 0600, as in some containers) the test
runs in a private mount namespace whose /dev/fuse is a 0666 node of the same device, the mode the
fuse3 package's udev rule sets on an ordinary host; the host's device and mount table are untouched.
Bytes read through the mount are compared with hashes of the source computed by the test itself.
"""

from __future__ import annotations

import hashlib
import json
import os
import pwd
import shutil
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from wheelhouse import Installed, everyone_can_run, in_private_mounts, kill_started_under, private_mounts_unavailable

pytestmark = pytest.mark.mount


def _unavailable() -> str | None:
    if os.geteuid() != 0:
        return "needs root to create the test user (useradd)"
    for tool in ("useradd", "userdel", "setpriv", "fusermount3"):
        if shutil.which(tool) is None:
            return f"{tool} not found"
    fm = os.stat(shutil.which("fusermount3") or "")
    if fm.st_uid != 0 or not fm.st_mode & stat.S_ISUID:
        return "fusermount3 is not setuid root: no user can mount"
    return private_mounts_unavailable()


@pytest.fixture
def user(installed_seerfs: Installed) -> Iterator[pwd.struct_passwd]:
    """A system user with its home in the test's scratch directory; removed afterwards."""
    name = f"seerfs-t{os.getpid() % 100000}"
    home = installed_seerfs.root / f"home-{name}"
    res = subprocess.run(
        [
            "useradd",
            "--system",
            "--user-group",
            "--no-create-home",
            "--home-dir",
            str(home),
            "--shell",
            "/bin/sh",
            name,
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if res.returncode != 0:
        pytest.skip(f"useradd failed: {res.stderr.strip()}")
    pw = pwd.getpwnam(name)
    try:
        home.mkdir(mode=0o700)
        os.chown(home, pw.pw_uid, pw.pw_gid)
        yield pw
    finally:
        kill_started_under(home)
        subprocess.run(["userdel", name], capture_output=True, check=False)
        shutil.rmtree(f"/tmp/seerfs-{pw.pw_uid}", ignore_errors=True)  # its runtime dir (no XDG_RUNTIME_DIR)


@pytest.mark.skipif(_unavailable() is not None, reason=f"{_unavailable()}")
def test_ordinary_user_mounts_reads_and_unmounts(installed_seerfs: Installed, user: pwd.struct_passwd) -> None:
    inst = installed_seerfs
    if not everyone_can_run(str(inst.python)):
        pytest.skip(f"no Python {inst.python} that every user can run, to install seerfs for the user")
    home = Path(user.pw_dir)
    src = inst.root / "data" / f"src-{user.pw_name}"
    expected: dict[str, str] = {}
    for d in range(3):
        for f in range(4):
            p = src / f"class{d}" / f"img{f}.jpg"
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(os.urandom(1000 + 777 * f + d))
            expected[str(p.relative_to(src))] = hashlib.sha256(p.read_bytes()).hexdigest()
    secret = src / "class0" / "root-only.jpg"
    secret.write_bytes(b"not for the user")
    secret.chmod(0o600)
    mp = home / "mnt"
    reader = (
        "import hashlib, json, os, sys\n"
        "mp = sys.argv[1]; out = {}\n"
        "for d, _, names in os.walk(mp):\n"
        "    for n in names:\n"
        "        p = os.path.join(d, n)\n"
        "        try:\n"
        "            out[os.path.relpath(p, mp)] = hashlib.sha256(open(p, 'rb').read()).hexdigest()\n"
        "        except PermissionError:\n"
        "            out[os.path.relpath(p, mp)] = 'EACCES'\n"
        "print('HASHES ' + json.dumps(out))\n"
    )
    (inst.root / "work" / "reader.py").write_text(reader)
    script = f"""
if ! setpriv --reuid={user.pw_uid} --regid={user.pw_gid} --clear-groups sh -c 'exec 3<>/dev/fuse' 2>/dev/null; then
    mkdir -p {home}.dev
    mount -t tmpfs -o mode=755 seerfs-test {home}.dev
    mknod -m 666 {home}.dev/fuse c 10 229
    mount --bind {home}.dev/fuse /dev/fuse
    echo "DEVFUSE private 0666 node"
fi
as_user() {{
    setpriv --reuid={user.pw_uid} --regid={user.pw_gid} --clear-groups \\
        env -i HOME={home} PATH={inst.bin}:/usr/bin:/bin LANG=C.UTF-8 "$@"
}}
trap 'as_user fusermount3 -u -z {mp} 2>/dev/null || true' EXIT
as_user mkdir {mp}
as_user id -u
rc=0; as_user seerfs mount {src} {mp} -o allow_other=true 2>{home}.err || rc=$?
if [ $rc -eq 0 ]; then echo "ALLOW_OTHER MOUNTED"; exit 1; fi
echo "allow_other: $rc $(cat {home}.err)"
as_user seerfs mount {src} {mp}
as_user python {inst.root}/work/reader.py {mp}
echo "STATUS $(as_user seerfs status --json {mp} | tr -d '\\n')"
as_user seerfs umount {mp}
if grep -q " {mp} " /proc/self/mountinfo; then echo "STILL MOUNTED"; exit 1; fi
echo "UNMOUNTED"
ls {home}/.cache/seerfs/snapshots
stat -c 'RUNTIME %U %a' /tmp/seerfs-{user.pw_uid}
"""
    res = in_private_mounts(script, home, env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"})
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    lines = out.splitlines()
    assert str(user.pw_uid) in lines and user.pw_uid != 0, out  # every seerfs command ran as the user
    assert any("allow_other: 6 seerfs: allow_other needs 'user_allow_other'" in line for line in lines), out
    hashes = json.loads(next(line for line in lines if line.startswith("HASHES "))[7:])
    assert {k: v for k, v in hashes.items() if k in expected} == expected, out
    assert hashes["class0/root-only.jpg"] == "EACCES"  # the source's permissions hold through the mount
    doc = json.loads(next(line for line in lines if line.startswith("STATUS "))[7:])
    assert doc["state"] == "serving" and doc["snapshot"]["files"] == len(expected) + 1
    # The defaults for a user: the cache under ~/.cache/seerfs, the runtime records in /tmp/seerfs-UID.
    assert doc["progress"]["walk"]["state"] == "done"
    assert "UNMOUNTED" in lines and any(line.endswith(".npz") for line in lines), out
    assert f"RUNTIME {user.pw_name} 700" in lines, out
