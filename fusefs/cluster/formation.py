"""Forming the daemon group: who the peers are, their data ports, and the shared job token.

Three ways, one daemon per node (DESIGN 3):
* MPI (``mpirun``/``srun ... seerfs mount --fg``): mpi4py allgathers every daemon's address, data
  port and inputs digest, rank 0 broadcasts a fresh random token, and MPI is finalised before
  serving (no fork after MPI_Init; a dead peer must not abort the others through MPI).
* A rendezvous directory on the shared filesystem (works from a root Slurm prolog without MPI):
  every daemon publishes an address file; the token is created once, atomically, in a token file.
* A static peer list in the config, the same on every node; the token comes from a token file.
A daemon alone is a group of one.

Every member publishes an *inputs digest* (the planning config and the snapshot's content): nodes
that disagree would plan different placements, so under MPI a mismatch is an error on every node,
and with a rendezvous directory a disagreeing node is left out and named in status.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import hmac
import json
import os
import secrets
import socket
import struct
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from fusefs.config import Config
from fusefs.errors import GroupError

TOKEN_BYTES = 32
_SIOCGIFADDR = 0x8915
MPI_ENV = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "PMI_RANK", "MPI_LOCALNRANKS")


@dataclass(frozen=True)
class Member:
    index: int  # position in the group (not the training node, which is detected from opens)
    host: str
    port: int
    label: str  # hostname-pid: who it is, for people
    inputs: str = ""  # inputs digest the member announced


@dataclass
class Group:
    mode: str  # alone | mpi | rendezvous | static
    me: int
    members: list[Member]
    token: bytes
    inputs: str
    state: str = "ready"  # forming | ready
    expect: int = 1
    excluded: dict[str, str] = field(default_factory=dict)  # label -> why it was left out

    def status(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "state": self.state,
            "me": self.me,
            "size": len(self.members),
            "expect": self.expect,
            "inputs_digest": self.inputs,
            "token_fingerprint": hashlib.sha256(b"seerfs-token-id" + self.token).hexdigest()[:16],
            "excluded": dict(self.excluded),
        }


# --------------------------------------------------------------------------- addresses


def bind_address(bind: str) -> str:
    """An IP address, or the IPv4 address of a network interface name (``ib0``, ``eth0``, ``lo``)."""
    try:
        socket.inet_pton(socket.AF_INET, bind)
        return bind
    except OSError:
        pass
    with contextlib.suppress(OSError):
        socket.inet_pton(socket.AF_INET6, bind)
        return bind
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            packed = fcntl.ioctl(s.fileno(), _SIOCGIFADDR, struct.pack("256s", bind[:15].encode()))
        return socket.inet_ntoa(packed[20:24])
    except OSError:
        raise GroupError(
            f"peers.bind: {bind!r} is neither an IP address nor an interface with an IPv4 address"
        ) from None


def listen_socket(host: str, port: int) -> socket.socket:
    """The data port, bound and listening before anything is announced."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise GroupError(f"peers: cannot bind the data port {host}:{port}: {exc.strerror}") from None
    sock.listen(128)
    return sock


def label() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


def detect_mode(cfg: Config) -> str:
    mode = cfg.peers.discovery
    if mode != "auto":
        return mode
    size = next((os.environ[k] for k in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE") if k in os.environ), None)
    if (size is not None and size.isdigit() and int(size) > 1) or "PMIX_RANK" in os.environ:
        return "mpi"
    if cfg.peers.rendezvous_dir:
        return "rendezvous"
    if cfg.peers.static:
        return "static"
    return "none"


def under_mpi() -> bool:
    return any(k in os.environ for k in MPI_ENV)


MPI_EXTRA = "pip install 'seerfs[mpi]' (mpi4py, built against the Open MPI that launches the job)"


def mpi_unavailable(cfg: Config) -> str | None:
    """Why MPI formation cannot run in this installation, or None when mpi4py is there.

    Looked up without importing ``mpi4py.MPI``, which would initialise MPI in the calling process.
    mpi4py is an optional extra: a node alone, a rendezvous directory or a static list never need it.
    """
    import importlib.util

    if importlib.util.find_spec("mpi4py") is not None:
        return None
    why = "peers.discovery is mpi" if cfg.peers.discovery == "mpi" else "launched by mpirun/srun"
    return f"{why}, but MPI group formation needs mpi4py, which is not installed: {MPI_EXTRA}"


# --------------------------------------------------------------------------- forming


def alone(host: str, port: int, inputs: str) -> Group:
    return Group("alone", 0, [Member(0, host, port, label(), inputs)], secrets.token_bytes(TOKEN_BYTES), inputs)


def form_mpi(host: str, port: int, inputs: str) -> Group:
    """Blocking, before the event loop: allgather addresses and digests, broadcast the token."""
    try:
        from mpi4py import MPI
    except ImportError as exc:
        raise GroupError(f"MPI group formation needs mpi4py ({exc}): {MPI_EXTRA}") from None
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    token = comm.bcast(secrets.token_bytes(TOKEN_BYTES) if rank == 0 else None, root=0)
    infos = comm.allgather((host, port, label(), inputs))
    comm.Barrier()
    MPI.Finalize()  # nothing else needs MPI: peers talk over TCP, so a dead node cannot abort the job
    members = [Member(i, h, p, lab, dig) for i, (h, p, lab, dig) in enumerate(infos)]
    differ = [m for m in members if m.inputs != inputs]
    if differ:
        names = ", ".join(f"rank {m.index} ({m.label})" for m in differ[:5])
        raise GroupError(f"nodes disagree on the config or the dataset snapshot: {names} differ from rank {rank}")
    return Group("mpi", rank, members, token, inputs, expect=size)


def _resolve(name: str) -> str:
    try:
        return socket.gethostbyname(name)
    except OSError:
        return name


def form_static(cfg: Config, host: str, port: int, inputs: str) -> Group:
    if cfg.peers.port == 0:
        raise GroupError("peers.port: static discovery needs a fixed data port, the one this node has in peers.static")
    members = []
    me = -1
    for i, item in enumerate(cfg.peers.static):
        h, _, p = item.rpartition(":")
        members.append(Member(i, h, int(p), item))
        if int(p) == port and _resolve(h) == host:
            me = i
    if me < 0:
        raise GroupError(f"peers.static: this daemon's address {host}:{port} is not in the list")
    token = read_or_create_token(Path(os.path.expanduser(cfg.peers.token_file or "")) if cfg.peers.token_file else None)
    return Group("static", me, members, token, inputs, expect=len(members))


def read_or_create_token(path: Path | None) -> bytes:
    """The job token from ``path``, created atomically by whichever daemon comes first."""
    if path is None:
        raise GroupError("peers.token_file: needed to share a job token without MPI")
    for _ in range(100):
        try:
            text = path.read_text().strip()
            if text:
                token = bytes.fromhex(text)
                if len(token) >= 16:
                    return token
                raise GroupError(f"peers.token_file: {path} holds a token shorter than 16 bytes")
        except FileNotFoundError:
            tmp = path.with_name(f".{path.name}.{label()}")
            try:
                tmp.write_text(secrets.token_bytes(TOKEN_BYTES).hex() + "\n")
                tmp.chmod(0o600)
                with contextlib.suppress(FileExistsError):
                    os.link(tmp, path)  # atomic: exactly one daemon's token wins
            except OSError as exc:
                raise GroupError(f"peers.token_file: cannot create {path}: {exc.strerror}") from None
            finally:
                with contextlib.suppress(OSError):
                    tmp.unlink()
        except ValueError:
            raise GroupError(f"peers.token_file: {path} does not hold a hex token") from None
        except OSError as exc:
            raise GroupError(f"peers.token_file: cannot read {path}: {exc.strerror}") from None
        time.sleep(0.01)
    raise GroupError(f"peers.token_file: {path} stays empty")


class Rendezvous:
    """Address files in a shared directory; the member list grows as daemons arrive.

    Files name the token by a fingerprint, so a directory reused across jobs never mixes them;
    a daemon removes its file when it stops (a crashed one's stays and is marked down by health).
    """

    def __init__(self, cfg: Config, host: str, port: int, inputs: str) -> None:
        assert cfg.peers.rendezvous_dir is not None
        self.dir = Path(os.path.expanduser(cfg.peers.rendezvous_dir))
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise GroupError(f"peers.rendezvous_dir: {self.dir}: {exc.strerror}") from None
        token_path = Path(os.path.expanduser(cfg.peers.token_file)) if cfg.peers.token_file else self.dir / "token"
        token = read_or_create_token(token_path)
        self.fingerprint = hmac.new(token, b"seerfs-rendezvous", "sha256").hexdigest()[:16]
        self.me = Member(-1, host, port, label(), inputs)
        self.file = self.dir / f"node-{self.me.label}.json"
        tmp = self.file.with_suffix(".tmp")
        tmp.write_text(json.dumps({**asdict(self.me), "job": self.fingerprint}))
        os.replace(tmp, self.file)
        self.group = Group("rendezvous", 0, [self.me], token, inputs, state="forming", expect=max(1, cfg.peers.expect))
        self.scan()

    def scan(self) -> bool:
        """Re-read the directory; True when the member list changed."""
        found: dict[str, Member] = {}
        excluded: dict[str, str] = {}
        for path in sorted(self.dir.glob("node-*.json")):
            try:
                info = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            if info.get("job") != self.fingerprint:
                continue
            if info.get("inputs") != self.me.inputs:
                excluded[info.get("label", path.name)] = "disagrees on the config or the dataset snapshot"
                continue
            found[info["label"]] = Member(-1, info["host"], int(info["port"]), info["label"], info["inputs"])
        ordered = sorted(found.values(), key=lambda m: m.label)
        members = [Member(i, m.host, m.port, m.label, m.inputs) for i, m in enumerate(ordered)]
        if not any(m.label == self.me.label for m in members):  # our own file went missing: keep counting us
            members = [
                Member(i, m.host, m.port, m.label, m.inputs)
                for i, m in enumerate(sorted([*ordered, self.me], key=lambda m: m.label))
            ]
        changed = members != self.group.members
        self.group.members = members
        self.group.me = next(m.index for m in members if m.label == self.me.label)
        self.group.excluded = excluded
        if len(members) >= self.group.expect:
            self.group.state = "ready"
        return changed

    def leave(self) -> None:
        with contextlib.suppress(OSError):
            self.file.unlink()
