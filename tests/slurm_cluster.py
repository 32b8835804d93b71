"""A real Slurm cluster on this machine for tests: munged, slurmctld and slurmd as this process's children.

Debian's ``slurm-wlm`` and ``munge`` packages, unmodified, configured from scratch in a private
directory so nothing of the machine's own ``/etc/slurm`` or ``/etc/munge`` is read or changed:

* its own munge key and socket (``munged --socket=... --key-file=...``; slurm finds that socket through
  ``AuthInfo=socket=...``);
* its own ``slurm.conf`` (clients, slurmctld and slurmd are pointed at it by ``SLURM_CONF``) with free
  ports, state, spool and log files in the directory, the machine's real CPUs and memory as reported
  by ``slurmd -C``, one partition, ``KillWait`` small, ``Prolog``/``Epilog`` as the test asks;
* ``nodes=1`` runs one slurmd on the host.  ``nodes=2`` (or more) runs each slurmd in a network
  namespace of its own (``ip netns``, a veth pair on a bridge, its own 10.x address on an interface
  named ``slurmnet0`` on every node; slurmctld in node 0's) and a private mount namespace: Debian's
  slurmd is not built with ``--enable-multiple-slurmd``, so two slurmd on one host need two network
  stacks, and two nodes that
  each mount the dataset on the same path need two mount tables.  A mount made by a job on node k
  lives only in that node's mount namespace (see :meth:`SlurmCluster.fuse_mounts`); mounts of the
  host made before the cluster starts (the emulated PFS) are copied into every node.  Every node
  sees its own spool directory on one path, and PMIx keeps its files there (mpi.conf), not in the
  /tmp the nodes share here: ``srun --mpi=pmix`` across nodes works as on a cluster.
* ``cgroup=True``: TaskPlugin=task/cgroup with the given cgroup.conf, so ``--mem`` is a job's memory
  cgroup limit.

The job user of the prolog tests is :data:`JOB_USER` (``with job_user()`` creates it, then removes it).
``SEERFS_SLURM_KEEP=1`` keeps the directory (logs, job files) after teardown; ``SEERFS_SLURM_DEBUG=1``
logs step-level detail.

Usage::

    from slurm_cluster import SlurmCluster, requires_slurm, running_slurm, slurm_cluster  # noqa: F401

    def test_x(slurm_cluster: SlurmCluster) -> None:        # defaults: one node, no prolog
        job = slurm_cluster.sbatch(script, "-n2")
        info = slurm_cluster.wait_job(job, timeout=120)   # squeue's JSON record of the finished job
        assert info["job_state"] == "COMPLETED"

    with running_slurm(prolog=..., epilog=..., nodes=2, cgroup=True) as cluster:   # own settings
        ...

Every wait has a deadline; teardown cancels every job, waits for them to end (epilogues included),
stops the daemons (SIGTERM, then SIGKILL), kills any process still carrying the cluster's marker
variable (job steps that outlived slurmd: reported in :attr:`SlurmCluster.stragglers`), removes the
namespaces and the directory.  Tests skip with the reason when the binaries are missing, when not
root (slurmd must be), or when the daemons do not come up.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from fusefs import mountinfo
from fusefs.waiting import WaitTimeout, wait_until

__all__ = [
    "JOB_USER",
    "NODE_IFNAME",
    "TERMINAL_STATES",
    "SlurmCluster",
    "SlurmUnavailable",
    "job_user",
    "requires_slurm",
    "running_slurm",
    "slurm_cluster",
    "slurm_unavailable_reason",
]

BINARIES = ("munged", "munge", "slurmctld", "slurmd", "sbatch", "srun", "squeue", "scontrol", "scancel", "sinfo")
MARKER = "SEERFS_TEST_SLURM"  # in the environment of every daemon and job of a test cluster: teardown finds them
NODE_IFNAME = "slurmnet0"  # each node's interface in a multi-node cluster (its own network namespace)
JOB_USER = "seerfs-slurm-job"  # the unprivileged user jobs of the prolog test run as
TERMINAL_STATES = frozenset(
    {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL", "DEADLINE"}
)


class SlurmUnavailable(RuntimeError):
    """The daemons could not be started here; tests skip with this reason."""


def slurm_unavailable_reason() -> str | None:
    missing = [b for b in BINARIES if shutil.which(b) is None and not Path("/usr/sbin", b).exists()]
    if missing:
        return f"Slurm/munge binaries missing: {', '.join(missing)} (apt-get install slurm-wlm munge)"
    if os.geteuid() != 0:
        return "slurmd must run as root"
    return None


_REASON = slurm_unavailable_reason()
requires_slurm = pytest.mark.skipif(_REASON is not None, reason=f"needs Slurm: {_REASON}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def _which(name: str) -> str:
    return shutil.which(name) or str(Path("/usr/sbin", name))


@dataclass
class Node:
    name: str
    addr: str
    netns: str | None  # None: the host's network and mount namespaces
    proc: subprocess.Popen[bytes] | None = None


@dataclass
class SlurmCluster:
    root: Path  # 0755 directory holding everything: conf, munge, state, spool, logs
    conf: Path
    env: dict[str, str]  # SLURM_CONF and the marker; what client commands and jobs run with
    nodes: list[Node]
    kill_wait: int
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    stragglers: list[str] = field(default_factory=list)  # processes teardown had to kill: "pid comm"

    # ------------------------------------------------------------------ clients

    def run(
        self, *args: str, user: str | None = None, timeout: float = 60, check: bool = True, node: int | None = None
    ) -> subprocess.CompletedProcess[str]:
        """A Slurm client command (or anything) with the cluster's environment, as ``user`` if given.

        ``node`` runs it inside that node's namespaces (what a login shell on that node would see).
        """
        argv = list(args)
        if user is not None:
            argv = ["runuser", "-u", user, "--", *argv]
        if node is not None and self.nodes[node].netns is not None:
            argv = [*_enter(str(self.nodes[node].netns)), *argv]
        res = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=self.env, cwd=self.root)
        if check and res.returncode != 0:
            raise AssertionError(f"{' '.join(argv)} failed ({res.returncode}): {res.stderr.strip()}")
        return res

    def sbatch(self, script: Path, *options: str, user: str | None = None) -> int:
        res = self.run("sbatch", "--parsable", *options, str(script), user=user)
        return int(res.stdout.strip().split(";")[0])

    def job(self, job_id: int) -> dict[str, Any]:
        """squeue's JSON record of the job (completed jobs stay listed for MinJobAge)."""
        res = self.run("squeue", "--json", "--states=all", f"--jobs={job_id}")
        jobs = [j for j in json.loads(res.stdout)["jobs"] if j["job_id"] == job_id]
        if not jobs:
            raise AssertionError(f"job {job_id} unknown to slurmctld")
        record: dict[str, Any] = jobs[0]
        return record

    def wait_job(self, job_id: int, timeout: float, states: frozenset[str] = TERMINAL_STATES) -> dict[str, Any]:
        info: dict[str, Any] = {}

        def done() -> dict[str, Any] | None:
            nonlocal info
            info = self.job(job_id)
            if info["job_state"] == "PENDING" and info["state_reason"].startswith("JobHeld"):  # a failed prolog
                raise AssertionError(f"job {job_id} held ({info['state_reason']})\n" + self.log_tail())
            return info if info["job_state"] in states else None

        try:
            return wait_until(done, timeout, f"job {job_id}", max_delay=0.2)
        except WaitTimeout:
            raise AssertionError(
                f"job {job_id} still {info['job_state']} after {timeout}s (reason {info['state_reason']})\n"
                + self.log_tail()
            ) from None

    def steps(self, job_id: int) -> list[str]:
        """The job's running step ids (``N.batch``, ``N.0``, ...)."""
        res = self.run("squeue", "-h", "-s", f"--jobs={job_id}", "-o", "%i", check=False)
        return res.stdout.split()

    def node_states(self) -> dict[str, str]:
        res = self.run("sinfo", "-h", "-N", "-o", "%N %T", check=False)
        return dict(line.split() for line in res.stdout.splitlines() if len(line.split()) == 2)

    def log_tail(self, chars: int = 3000) -> str:
        parts = []
        for path in sorted((self.root / "log").glob("*")):
            with contextlib.suppress(OSError):
                parts.append(f"--- {path.name}\n{path.read_text(errors='replace')[-chars:]}")
        return "\n".join(parts)

    # ------------------------------------------------------------------ nodes

    def node_pid(self, index: int) -> int:
        """A process living in node ``index``'s namespaces (its slurmd)."""
        proc = self.nodes[index].proc
        assert proc is not None
        return proc.pid

    def fuse_mounts(self, index: int = 0) -> list[str]:
        """FUSE mountpoints in node ``index``'s mount namespace (the host's for a one-node cluster)."""
        path = f"/proc/{self.node_pid(index)}/mountinfo" if self.nodes[index].netns else "/proc/self/mountinfo"
        return [m.mountpoint for m in mountinfo.mounts(path) if m.fstype.startswith("fuse")]

    def marked_processes(self, exclude: Sequence[int] = ()) -> dict[int, str]:
        """pid -> "comm cmdline" of every process carrying this cluster's marker, daemons excluded."""
        daemons = {p.pid for p in self.procs.values()} | {n.proc.pid for n in self.nodes if n.proc}
        found = {}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            pid = int(entry.name)
            if pid in daemons or pid in exclude or pid == os.getpid():
                continue
            try:
                environ = (entry / "environ").read_bytes()
                if f"{MARKER}={self.root}".encode() not in environ.split(b"\0"):
                    continue
                cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
                found[pid] = f"{(entry / 'comm').read_text().strip()} {cmd}"
            except OSError:
                continue
        return found

    # ------------------------------------------------------------------ teardown

    def cancel_all(self, timeout: float) -> None:
        """scancel every job and wait until none is left running or completing (epilogues ran)."""
        res = self.run("squeue", "-h", "-o", "%i %T", check=False)
        active = [
            line.split()[0]
            for line in res.stdout.splitlines()
            if line.split()[1:] and line.split()[1] in ("RUNNING", "PENDING", "COMPLETING", "CONFIGURING", "SUSPENDED")
        ]
        if active:
            self.run("scancel", *active, check=False)

        def drained() -> bool:
            res = self.run("squeue", "-h", "-o", "%T", check=False)
            return res.returncode != 0 or not res.stdout.strip()

        with contextlib.suppress(WaitTimeout):  # best effort: the cluster is torn down next anyway
            wait_until(drained, timeout, "the queue to drain", max_delay=0.2)


def _write_munge(root: Path) -> tuple[Path, Path]:
    """Key in a 0700 directory; the socket's directory must be 0755 (munged checks, clients traverse it)."""
    munge = root / "munge"
    keydir = munge / "key"
    keydir.mkdir(parents=True)
    munge.chmod(0o755)
    keydir.chmod(0o700)
    key = keydir / "munge.key"
    key.write_bytes(secrets.token_bytes(1024))
    key.chmod(0o400)
    return key, munge / "munge.socket"


def _node_hardware() -> str:
    """The machine's real CPUs, sockets, cores and memory, as slurmd itself reports them."""
    out = subprocess.run([_which("slurmd"), "-C"], capture_output=True, text=True, timeout=30).stdout
    first = out.splitlines()[0] if out else ""
    keep = [
        w
        for w in first.split()
        if w.split("=")[0] in ("CPUs", "Boards", "SocketsPerBoard", "CoresPerSocket", "ThreadsPerCore", "RealMemory")
    ]
    if not keep:
        raise SlurmUnavailable(f"slurmd -C said nothing usable: {out!r}")
    return " ".join(keep)


def _slurm_conf(
    root: Path,
    socket_path: Path,
    nodes: list[Node],
    ctld_addr: str,
    *,
    prolog: Path | None,
    epilog: Path | None,
    kill_wait: int,
    cgroup: bool,
    extra: Sequence[str],
) -> str:
    hw = _node_hardware()
    debug = bool(os.environ.get("SEERFS_SLURM_DEBUG"))
    host = socket.gethostname()
    lines = [
        "ClusterName=seerfstest",
        f"SlurmctldHost={host}({ctld_addr})",
        f"SlurmctldPort={_free_port()}",
        f"SlurmdPort={_free_port()}",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={socket_path}",
        "SlurmUser=root",
        "SlurmdUser=root",
        f"StateSaveLocation={root}/state",
        f"SlurmdSpoolDir={root}/spool/{'node' if len(nodes) > 1 else nodes[0].name}",
        f"SlurmctldPidFile={root}/run/slurmctld.pid",
        f"SlurmdPidFile={root}/run/slurmd-%n.pid",
        f"SlurmctldLogFile={root}/log/slurmctld.log",
        f"SlurmdLogFile={root}/log/slurmd-%n.log",
        # SEERFS_SLURM_DEBUG=1: step-level detail in both daemons' logs (keep them with SEERFS_SLURM_KEEP=1).
        *(
            ["SlurmctldDebug=debug2", "SlurmdDebug=debug2", "DebugFlags=Steps"]
            if debug
            else ["SlurmctldDebug=info", "SlurmdDebug=info"]
        ),
        "MailProg=/bin/true",
        "MpiDefault=none",  # Debian's shipped default; a step asks for PMIx with --mpi=pmix
        "ProctrackType=proctrack/linuxproc",
        f"TaskPlugin={'task/cgroup' if cgroup else 'task/none'}",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core_Memory",  # memory is a consumable resource, as on most clusters
        "SchedulerType=sched/builtin",
        "ReturnToService=2",
        f"KillWait={kill_wait}",
        "InactiveLimit=0",
        "MinJobAge=600",
        "JobCompType=jobcomp/none",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "SlurmdTimeout=60",
        "MessageTimeout=20",
    ]
    if prolog is not None:
        lines += [f"Prolog={prolog}", "PrologFlags=Alloc"]  # at allocation, on every node of the job
    if epilog is not None:
        lines.append(f"Epilog={epilog}")
    lines += list(extra)
    for node in nodes:
        lines.append(f"NodeName={node.name} NodeAddr={node.addr} {hw} State=UNKNOWN")
    lines.append(f"PartitionName=debug Nodes={','.join(n.name for n in nodes)} Default=YES MaxTime=INFINITE State=UP")
    return "\n".join(lines) + "\n"


class _Netns:
    """A bridge with one network namespace per node on it: 10.N.M.1 the host, 10.N.M.(k+2) node k."""

    def __init__(self, count: int) -> None:
        tag = secrets.token_hex(2)
        self.prefix = f"sf{tag}"
        self.bridge = f"{self.prefix}br"
        self.subnet = f"10.{200 + int(tag[:1], 16)}.{int(tag[1:3], 16)}"
        self.host_addr = f"{self.subnet}.1"
        self.names = [f"{self.prefix}n{k}" for k in range(count)]
        self.created: list[list[str]] = []  # undo commands, run in reverse

    def _ip(self, *args: str) -> None:
        res = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
        if res.returncode != 0:
            raise SlurmUnavailable(f"ip {' '.join(args)}: {res.stderr.strip()}")

    def create(self) -> list[str]:
        self._ip("link", "add", self.bridge, "type", "bridge")
        self.created.append(["link", "del", self.bridge])
        self._ip("addr", "add", f"{self.host_addr}/24", "dev", self.bridge)
        self._ip("link", "set", self.bridge, "up")
        addrs = []
        for k, ns in enumerate(self.names):
            self._ip("netns", "add", ns)
            self.created.append(["netns", "del", ns])
            host_end, node_end = f"{self.prefix}h{k}", f"{self.prefix}c{k}"
            self._ip("link", "add", host_end, "type", "veth", "peer", "name", node_end)
            self.created.append(["link", "del", host_end])
            self._ip("link", "set", host_end, "master", self.bridge)
            self._ip("link", "set", host_end, "up")
            self._ip("link", "set", node_end, "netns", ns)
            # One name on every node, as clusters have (ib0): configs name it (peers.bind, GLOO_SOCKET_IFNAME).
            self._ip("-n", ns, "link", "set", node_end, "name", NODE_IFNAME)
            addr = f"{self.subnet}.{k + 2}"
            self._ip("-n", ns, "addr", "add", f"{addr}/24", "dev", NODE_IFNAME)
            self._ip("-n", ns, "link", "set", NODE_IFNAME, "up")
            self._ip("-n", ns, "link", "set", "lo", "up")
            addrs.append(addr)
        return addrs

    def destroy(self) -> None:
        for args in reversed(self.created):
            subprocess.run(["ip", *args], capture_output=True, timeout=30)
        self.created.clear()


def _enter(netns: str) -> list[str]:
    """Run in the node's network namespace and a mount namespace of its own (the node's mount table).

    Not ``ip netns exec``: it remounts /sys for the namespace, which hides /sys/fs/cgroup, and slurmd
    will not start without its cgroup plugin.  Propagation is slave: the host's mounts made before
    the node started (the emulated PFS) are there, the node's own mounts stay on the node.
    """
    return ["nsenter", f"--net=/run/netns/{netns}", "unshare", "--mount", "--propagation", "slave"]


def _node_spool(root: Path, node: str, argv: list[str]) -> list[str]:
    """slurmd with ``root/spool/node`` bound to its own ``root/spool/NODE`` inside the node's mount namespace.

    Each slurmd needs a spool directory of its own, but SlurmdSpoolDir's ``%n`` is not expanded by
    the mpi/pmix plugin, which then looks for its sockets under a literal ``%n``: one path for every
    node, holding each node's own directory, is what a real cluster's local /var/spool is.
    """
    script = 'mount --bind "$1" "$2" && shift 2 && exec "$@"'
    return ["sh", "-c", script, "sh", str(root / "spool" / node), str(root / "spool" / "node"), *argv]


def _start(argv: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        return subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, start_new_session=True
        )


def _stop(proc: subprocess.Popen[bytes], grace: float = 10) -> None:
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


def _wait(cond: Any, timeout: float, what: str, cluster: SlurmCluster) -> None:
    def done() -> bool:
        if cond():
            return True
        for name, proc in [*cluster.procs.items(), *((n.name, n.proc) for n in cluster.nodes if n.proc)]:
            if proc is not None and proc.poll() is not None:
                raise SlurmUnavailable(
                    f"{name} exited ({proc.returncode}) while waiting for {what}\n" + cluster.log_tail()
                )
        return False

    try:
        wait_until(done, timeout, what, max_delay=0.1)
    except WaitTimeout as exc:
        raise SlurmUnavailable(f"{exc}\n" + cluster.log_tail()) from None


def _remove_slurm_cgroups(names: set[str], timeout: float = 15) -> None:
    """task/cgroup leaves its slurm_NODE hierarchy behind: remove it, deepest first.

    A group can be removed only once its last process is gone; killed steps take a moment to exit.
    """

    def removed() -> bool:
        tops = [t for t in Path("/sys/fs/cgroup").glob("*/slurm*") if t.name in names]
        for top in tops:
            for sub in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
                with contextlib.suppress(OSError):
                    sub.rmdir()
            with contextlib.suppress(OSError):
                top.rmdir()
        return not any(t.exists() for t in tops)

    with contextlib.suppress(WaitTimeout):  # best effort, like the rmdirs themselves
        wait_until(removed, timeout, "the slurm cgroups to go", max_delay=0.2)


@contextlib.contextmanager
def job_user() -> Iterator[tuple[str, int]]:
    """An unprivileged user for jobs, (name, uid): created with useradd and removed after if it was not there.

    Also removes what torch leaves under /tmp for that user (its inductor cache directory).
    """
    import pwd

    created = False
    try:
        pw = pwd.getpwnam(JOB_USER)
    except KeyError:
        argv = ["useradd", "--system", "--no-create-home", "--shell", "/bin/bash", JOB_USER]
        res = subprocess.run(argv, capture_output=True, text=True, timeout=30)
        if res.returncode != 0:
            raise SlurmUnavailable(f"useradd {JOB_USER}: {res.stderr.strip()}") from None
        created = True
        pw = pwd.getpwnam(JOB_USER)
    try:
        yield pw.pw_name, pw.pw_uid
    finally:
        if created:
            shutil.rmtree(Path(tempfile.gettempdir()) / f"torchinductor_{JOB_USER}", ignore_errors=True)
            subprocess.run(["userdel", JOB_USER], capture_output=True, timeout=30)


@contextlib.contextmanager
def running_slurm(
    *,
    nodes: int = 1,
    prolog: Path | None = None,
    epilog: Path | None = None,
    kill_wait: int = 5,
    cgroup: bool = False,
    extra_conf: Sequence[str] = (),
    cgroup_conf: str | None = None,
    start_timeout: float = 60,
) -> Iterator[SlurmCluster]:
    """A running cluster for the block; raises :class:`SlurmUnavailable` when it cannot start.

    ``cgroup`` switches TaskPlugin to task/cgroup with ``cgroup_conf`` (written as cgroup.conf next to
    slurm.conf).
    """
    reason = slurm_unavailable_reason()
    if reason is not None:
        raise SlurmUnavailable(reason)
    # Not under pytest's 0700 tmp dirs: the job user must reach the munge socket and the job files.
    root = Path(tempfile.mkdtemp(prefix="seerfs-slurm-"))
    root.chmod(0o755)
    for d in ("state", "spool", "log", "run"):
        (root / d).mkdir()
    netns = _Netns(nodes) if nodes > 1 else None
    cluster: SlurmCluster | None = None
    try:
        if netns is not None:
            addrs = netns.create()
            node_list = [Node(f"n{k}", addrs[k], netns.names[k]) for k in range(nodes)]
            # slurmctld lives on node 0 (its network namespace), where batch scripts and their sruns
            # run: srun tells slurmctld it listens on 0.0.0.0, and slurmctld's "your step can start
            # now" reaches it only from the same network stack.  From the host's namespace that call
            # was refused, and an srun that asked while the previous step was completing slept
            # about 2 minutes before asking again.
            ctld_addr = addrs[0]
        else:
            node_list = [Node(socket.gethostname().split(".")[0], "127.0.0.1", None)]
            ctld_addr = "127.0.0.1"
        for node in node_list:
            (root / "spool" / node.name).mkdir()
        if netns is not None:
            (root / "spool" / "node").mkdir()
        key, sock = _write_munge(root)
        conf = root / "slurm.conf"
        conf.write_text(
            _slurm_conf(
                root,
                sock,
                node_list,
                ctld_addr,
                prolog=prolog,
                epilog=epilog,
                kill_wait=kill_wait,
                cgroup=cgroup,
                extra=extra_conf,
            )
        )
        if cgroup_conf is not None:
            (root / "cgroup.conf").write_text(cgroup_conf)
        if netns is not None:
            # PMIx's client directories default to /tmp, which the nodes here share: the node's own spool.
            (root / "mpi.conf").write_text(f"PMIxCliTmpDirBase={root}/spool/node\n")
        env = {**os.environ, "SLURM_CONF": str(conf), MARKER: str(root)}
        cluster = SlurmCluster(root, conf, env, node_list, kill_wait)
        m = root / "munge"
        cluster.procs["munged"] = _start(
            [
                _which("munged"),
                "-F",
                f"--socket={sock}",
                f"--key-file={key}",
                f"--pid-file={m}/munged.pid",
                f"--log-file={root}/log/munged.log",
                f"--seed-file={m}/key/seed",
            ],
            root / "log" / "munged.out",
            env,
        )
        _wait(lambda: sock.exists(), start_timeout, "the munge socket", cluster)
        ctld = [_which("slurmctld"), "-D", "-c", "-i", "-f", str(conf)]
        if netns is not None:
            ctld = ["nsenter", f"--net=/run/netns/{netns.names[0]}", *ctld]
        cluster.procs["slurmctld"] = _start(ctld, root / "log" / "slurmctld.out", env)
        _wait(
            lambda: "UP" in cluster.run("scontrol", "ping", check=False).stdout, start_timeout, "scontrol ping", cluster
        )
        for node in node_list:
            argv = [_which("slurmd"), "-D", "-N", node.name, "-f", str(conf)]
            if node.netns is not None:
                assert netns is not None
                argv = [*_enter(node.netns), *_node_spool(root, node.name, argv)]
            node.proc = _start(argv, root / "log" / f"slurmd-{node.name}.out", env)
        _wait(
            lambda: all(s == "idle" for s in cluster.node_states().values()) and len(cluster.node_states()) == nodes,
            start_timeout,
            "every node idle",
            cluster,
        )
        yield cluster
    finally:
        if cluster is not None:
            with contextlib.suppress(Exception):
                cluster.cancel_all(timeout=kill_wait + 30)
            for node in cluster.nodes:
                if node.proc is not None:
                    _stop(node.proc)
            for name in ("slurmctld",):
                if name in cluster.procs:
                    _stop(cluster.procs[name])
            # Steps and daemons that outlived slurmd (they are reparented away from it): ours by marker.
            left = cluster.marked_processes()
            for pid, what in left.items():
                cluster.stragglers.append(f"{pid} {what}")
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            if "munged" in cluster.procs:
                _stop(cluster.procs["munged"])
            if cgroup:
                _remove_slurm_cgroups({f"slurm_{n.name}" for n in cluster.nodes} | {"slurm"})
            for mp in [m.mountpoint for m in mountinfo.mounts()]:
                if mp.startswith(str(root) + "/"):
                    subprocess.run(["fusermount3", "-u", "-z", mp], capture_output=True, timeout=30)
        if netns is not None:
            netns.destroy()
        if not os.environ.get("SEERFS_SLURM_KEEP"):  # set it to keep the logs and job files for a post-mortem
            shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def slurm_cluster() -> Iterator[SlurmCluster]:
    """A one-node cluster with the defaults (no prolog, KillWait 5 s)."""
    if _REASON is not None:
        pytest.skip(f"needs Slurm: {_REASON}")
    try:
        with running_slurm() as cluster:
            yield cluster
    except SlurmUnavailable as exc:
        pytest.skip(f"Slurm daemons did not start: {exc}")
