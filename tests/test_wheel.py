"""The wheel and sdist as a user installs them: complete, and a working ``seerfs`` outside the checkout.

What the package must carry is listed from the checkout itself (every package and module under
fusefs/ and placement/, the py.typed markers, the man pages), not from setuptools' configuration.
The installed ``seerfs`` mounts a dataset, and every file read through the mount is compared with
the source's bytes read directly.  That the daemon and its plan worker run the installed code is
checked on the processes themselves (/proc/PID/cmdline names the venv's console script).
"""

from __future__ import annotations

import json
import os
import subprocess
import zipfile
from pathlib import Path

import pytest
from mounting import force_unmount, is_mounted, status, wait_for
from trees import tricky_tree
from wheelhouse import REPO, SYSTEM_PATH, Installed, in_private_mounts, private_mounts_unavailable

from tools.harness.jobs import free_port

pytestmark = pytest.mark.mount

MAN_IN_WHEEL = {"man1": ["seerfs.1"], "man5": ["seerfs.yaml.5"], "man7": ["seerfs-control.7"]}


def _package_files() -> list[str]:
    """Every module and py.typed of the two packages, as paths relative to the checkout."""
    return sorted(
        str(p.relative_to(REPO))
        for top in ("fusefs", "placement")
        for p in (REPO / top).rglob("*")
        if p.is_file() and (p.suffix == ".py" or p.name == "py.typed") and "__pycache__" not in p.parts
    )


def test_wheel_and_sdist_carry_every_package_and_data_file(installed_seerfs: Installed) -> None:
    inst = installed_seerfs
    files = _package_files()
    packages = {str(Path(f).parent) for f in files if f.endswith("__init__.py")}
    assert {"fusefs/cli", "fusefs/daemon", "fusefs/planning", "placement"} <= packages  # the listing saw the tree
    assert {"fusefs/py.typed", "placement/py.typed"} <= set(files)
    wheel = set(inst.wheel_names)
    assert not [f for f in files if f not in wheel], "missing from the wheel"
    assert not [n for n in wheel if n.startswith(("tests/", "tools/"))], "development code in the wheel"
    data = f"seerfs-{inst.version}.data/data/share/man"
    assert {f"{data}/{sec}/{page}" for sec, pages in MAN_IN_WHEEL.items() for page in pages} <= wheel
    meta = next(n for n in wheel if n.endswith(".dist-info/METADATA"))
    entry = next(n for n in wheel if n.endswith(".dist-info/entry_points.txt"))
    with zipfile.ZipFile(inst.wheel) as zf:
        metadata = zf.read(meta).decode()
        assert "seerfs = fusefs.cli:main" in zf.read(entry).decode()
    requires = [line for line in metadata.splitlines() if line.startswith("Requires-Dist: ")]
    mpi = [r for r in requires if "mpi4py" in r]
    assert mpi and all('extra == "mpi"' in r for r in mpi), requires  # optional: seerfs[mpi]
    assert "Provides-Extra: mpi" in metadata

    # The sdist is the whole source release: packages, man pages, tests and the tools they drive.
    prefix = f"seerfs-{inst.version}/"
    sdist = {n.removeprefix(prefix) for n in inst.sdist_names}
    tracked = files + [
        str(p.relative_to(REPO))
        for d in ("man", "tests", "tools")
        for p in (REPO / d).rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and not p.name.endswith(".pyc")
    ]
    assert not [f for f in tracked if f not in sdist], "missing from the sdist"
    assert {"pyproject.toml", "README.md", "MANIFEST.in"} <= sdist
    # The native front: its C source and build script in the sdist, the built extension and its
    # stub in the wheel (built from the sdist, where libfuse3-dev is installed, as tools/setup does).
    assert {"setup.py", "fusefs/fuse/_native.c", "fusefs/fuse/_native.pyi"} <= sdist
    assert "fusefs/fuse/_native.pyi" in wheel
    if _libfuse3_dev():
        assert [n for n in wheel if n.startswith("fusefs/fuse/_native.") and n.endswith(".so")], "no extension"


def _libfuse3_dev() -> bool:
    """Whether libfuse3's headers are here (pkg-config finds fuse3): the native front then builds."""
    try:
        return subprocess.run(["pkg-config", "--exists", "fuse3"], check=False).returncode == 0
    except OSError:
        return False


def _regular_files(root: Path) -> list[bytes]:
    out = []
    for dirpath, _dirs, names in os.walk(os.fsencode(root)):
        for name in names:
            full = os.path.join(dirpath, name)
            if os.path.isfile(full) and not os.path.islink(full):
                out.append(os.path.relpath(full, os.fsencode(root)))
    return sorted(out)


def _daemon_cmdline(mp: Path) -> list[str]:
    pid = status(mp)["pid"]
    with open(f"/proc/{pid}/cmdline", "rb") as fh:
        return [a.decode() for a in fh.read().split(b"\0") if a]


def test_installed_wheel_mounts_plans_and_unmounts_outside_the_checkout(installed_seerfs: Installed) -> None:
    inst = installed_seerfs
    # The venv imports the installed copy, not the checkout, and has no mpi4py.
    code = "import fusefs, placement, importlib.util as u; print(fusefs.__file__, placement.__file__)"
    code += "; print(u.find_spec('mpi4py'))"
    probe = subprocess.run(
        [str(inst.python), "-c", code],
        capture_output=True,
        text=True,
        env=inst.env(),
        cwd=inst.root / "work",
        check=True,
    )
    fusefs_file, placement_file, mpi = probe.stdout.split()
    site = str(inst.venv / "lib")
    assert fusefs_file.startswith(site) and placement_file.startswith(site) and mpi == "None", probe.stdout
    assert (inst.venv / "share" / "man" / "man1" / "seerfs.1").is_file()
    assert inst.run("--version").stdout.strip() == f"seerfs {inst.version}"

    src = tricky_tree(inst.root / "data" / "src", big_mb=2)
    cache, mp = inst.root / "data" / "cache", inst.root / "data" / "mnt"
    mp.mkdir()
    try:
        res = inst.run("mount", str(src), str(mp), "-o", f"cache_dir={cache}")
        assert res.returncode == 0, res.stderr
        cmdline = _daemon_cmdline(mp)
        assert cmdline[1] == str(inst.bin / "seerfs"), cmdline  # the daemon is the installed program
        rels = _regular_files(src)
        assert len(rels) >= 12
        for rel in rels:
            with (
                open(os.path.join(os.fsencode(src), rel), "rb") as a,
                open(os.path.join(os.fsencode(mp), rel), "rb") as b,
            ):
                assert a.read() == b.read(), rel
        human = inst.run("status", str(mp))
        assert human.returncode == 0 and "serving" in human.stdout, human.stderr
        # The plan worker is `sys.executable -m fusefs.planning.worker`: it must run from the wheel.
        res = inst.run("wait", "--plan", "--timeout", "60", str(mp))
        assert res.returncode == 0, res.stderr
        doc = json.loads(inst.run("status", "--json", str(mp)).stdout)
        assert doc["front"]["name"] == ("native" if _libfuse3_dev() else "pyfuse3")  # built from the sdist, loaded
        assert doc["plan"]["state"] == "ready" and doc["progress"]["plan"]["done"] > 0, doc["plan"]
        res = inst.run("plan", str(src), "-o", f"cache_dir={cache}", "--json")
        assert res.returncode == 0, res.stderr
        assert json.loads(res.stdout)["digest"] == doc["plan"]["digest"]  # same plan as the daemon's
        res = inst.run("umount", str(mp))
        assert res.returncode == 0 and not is_mounted(mp), res.stderr

        # mount.fuse3's form, `seerfs SOURCE MOUNTPOINT -o OPTS`, with a rendezvous directory: no mpi4py needed.
        rdv = inst.root / "data" / "rendezvous"
        rdv.mkdir()
        res = inst.run(str(src), str(mp), "-o", f"cache_dir={cache},noauto,peers.rendezvous_dir={rdv},peers.expect=1")
        assert res.returncode == 0, res.stderr
        assert inst.run("wait", "--timeout", "30", str(mp)).returncode == 0
        assert status(mp)["group"]["mode"] == "rendezvous"
        assert (mp / "cat" / "a.jpg").read_bytes() == (src / "cat" / "a.jpg").read_bytes()
        assert inst.run("umount", str(mp)).returncode == 0

        # mount(8) with no link anywhere: type `fuse` and the helper's absolute path before '#' (mount.fuse3
        # runs that path itself).  A static peer list: no mpi4py needed either.
        port = free_port()
        cfg = inst.root / "data" / "seerfs.yaml"
        token = inst.root / "data" / "token"
        cfg.write_text(
            f"cache_dir: {cache}\n"
            f"peers: {{static: ['127.0.0.1:{port}'], port: {port}, bind: 127.0.0.1, token_file: {token}}}\n"
        )
        res = subprocess.run(
            ["mount", "-t", "fuse", f"{inst.bin / 'seerfs'}#{src}", str(mp), "-o", f"config={cfg},noauto,nodev"],
            capture_output=True,
            text=True,
            timeout=120,
            env={**inst.env(), "PATH": SYSTEM_PATH},
            cwd=inst.root / "work",
            check=False,
        )
        assert res.returncode == 0, res.stderr
        assert _daemon_cmdline(mp)[1] == str(inst.bin / "seerfs")
        assert status(mp)["group"]["mode"] == "static"
        assert (mp / "dog" / "big.jpg").read_bytes() == (src / "dog" / "big.jpg").read_bytes()
        pid = status(mp)["pid"]
        assert subprocess.run(["umount", str(mp)], capture_output=True, check=False).returncode == 0
        wait_for(lambda: not os.path.exists(f"/proc/{pid}"), what="daemon exit after umount(8)")

        # MPI formation asked for without the extra: one line naming it, nothing mounted.
        res = inst.run("mount", str(src), str(mp), "--fg", "-o", f"cache_dir={cache},peers.discovery=mpi")
        assert res.returncode == 10 and not is_mounted(mp), res.stderr
        assert len(res.stderr.strip().splitlines()) == 1 and "seerfs[mpi]" in res.stderr, res.stderr
    finally:
        if is_mounted(mp):
            inst.run("umount", str(mp))
        force_unmount(mp)


@pytest.mark.skipif(private_mounts_unavailable() is not None, reason=f"{private_mounts_unavailable()}")
def test_mount8_finds_fuse_seerfs_helper_on_the_fixed_path_only(installed_seerfs: Installed) -> None:
    """mount(8) clears PATH for its helpers and mount.fuse3 runs `/bin/sh -c "seerfs ..."`, so `-t
    fuse.seerfs` finds seerfs only in sh's default PATH (/usr/local/sbin:/usr/local/bin:/usr/sbin:...),
    whatever the caller's PATH.  In a private mount namespace (the host's /usr/local/bin is untouched)
    an empty /usr/local/bin fails even with the venv on PATH; a link to the installed script works."""
    inst = installed_seerfs
    src = inst.root / "data" / "fixed-path"
    (src / "c").mkdir(parents=True)
    (src / "c" / "f.jpg").write_bytes(os.urandom(5000))
    mp = inst.root / "data" / "mnt-fixed-path"
    mp.mkdir()
    seerfs = inst.bin / "seerfs"
    script = f"""
for d in /usr/local/sbin /usr/local/bin; do mount -t tmpfs -o mode=755 seerfs-test "$d"; done
export PATH={inst.bin}:{SYSTEM_PATH}
trap 'fusermount3 -u -z {mp} 2>/dev/null || true' EXIT
if mount -t fuse.seerfs {src} {mp} -o noauto,cache_dir={inst.root}/data/cache-fixed 2>{inst.root}/work/err.txt; then
    echo "MOUNTED WITHOUT LINK"; exit 1
fi
echo "without link: $(cat {inst.root}/work/err.txt)"
ln -s {seerfs} /usr/local/bin/seerfs
mount -t fuse.seerfs {src} {mp} -o noauto,cache_dir={inst.root}/data/cache-fixed
cmp {mp}/c/f.jpg {src}/c/f.jpg && echo "BYTES OK"
pid=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['pid'])" {mp}/.control/status)
echo "daemon: $(tr '\\0' ' ' < /proc/$pid/cmdline)"
{seerfs} umount {mp} && echo "UNMOUNTED"
"""
    res = in_private_mounts(script, inst.root, env=inst.env())
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    assert "seerfs: not found" in out and "BYTES OK" in out and "UNMOUNTED" in out, out
    assert f"daemon: {inst.python} /usr/local/bin/seerfs {src} {mp}" in out, out  # the venv runs it
    assert not is_mounted(mp)
