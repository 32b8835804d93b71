"""Forming the daemon group: who the peers are, their data ports, and the shared job token.

Three ways, one daemon per node (seerfs(1), THE DAEMON GROUP):
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
import errno
import fcntl
import hashlib
import hmac
import json
import logging
import os
import secrets
import socket
import struct
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Annotated, Literal, TypedDict

from fusefs.config import Config
from fusefs.errors import ExitCode, GroupError, SeerfsError
from fusefs.trust import read_file_itself, trusted_dir
from placement.statusfields import gauge, info, state, text

log = logging.getLogger(__name__)

TOKEN_BYTES = 32
_SIOCGIFADDR = 0x8915
MPI_ENV = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "PMI_RANK", "MPI_LOCALNRANKS")


@dataclass(frozen=True)
class Member:
    index: int  # position in the group (not the training node, which is detected from opens)
    host: str
    port: int
    label: str  # hostname-pid-nonce: who it is, for people; unique to one daemon's lifetime
    inputs: str = ""  # inputs digest the member announced
    hostname: str = ""

    @property
    def key(self) -> tuple[str, str, int]:
        """Who this member is across membership changes: indices shift when members come and go,
        and an address can pass to a restarted daemon, so peers are told apart by all three."""
        return (self.label, self.host, self.port)

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


GroupMode = Literal["alone", "mpi", "rendezvous", "static"]
GroupState = Literal["forming", "ready"]


class GroupStatus(TypedDict):
    """Status section ``group``: the daemon group this node belongs to."""

    mode: Annotated[GroupMode, state("alone, mpi, rendezvous or static: how the group formed")]
    state: Annotated[GroupState, state("forming while a rendezvous group waits for peers.expect members; ready")]
    me: Annotated[int, gauge("this daemon's index in the group (the training node it serves is detected from opens)")]
    size: Annotated[int, gauge("members now")]
    expect: Annotated[int, gauge("members expected")]
    inputs_digest: Annotated[
        str, info("digest of the planning configuration and the dataset snapshot; members must agree")
    ]
    token_fingerprint: Annotated[str, info("identifies the job token without revealing it")]
    excluded: Annotated[dict[str, str], text("rendezvous members left out (by label), with why")]


@dataclass
class Group:
    mode: GroupMode
    me: int
    members: list[Member]
    token: bytes
    inputs: str
    state: GroupState = "ready"
    expect: int = 1
    excluded: dict[str, str] = field(default_factory=dict)  # label -> why it was left out

    def status(self) -> GroupStatus:
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


_LABEL: tuple[int, str] | None = None


def label() -> str:
    """``hostname-pid-nonce``: the nonce tells a restarted daemon from its predecessor even when
    the pid repeats (containers start every daemon with the same pid)."""
    global _LABEL
    if _LABEL is None or _LABEL[0] != os.getpid():  # computed again in a forked daemon
        _LABEL = (os.getpid(), f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(2)}")
    return _LABEL[1]


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


def write_private(path: Path, data: bytes) -> None:
    """Write ``path`` atomically, readable by this user only from its first byte.

    The file is born 0600 (O_CREAT|O_EXCL with that mode on a fresh temporary name), never
    created with the default mode and narrowed afterwards: another local user watching the
    directory could open it in between and keep the descriptor.  Then renamed over ``path``.
    """
    tmp = path.with_name(f".{path.name}.{label()}.{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def _read_token_file(path: Path) -> tuple[str, os.stat_result]:
    """The token file's text and status, opened with O_NOFOLLOW: a symlink at its name is refused,
    never read through (its directory is trusted at mount: :mod:`fusefs.trust`)."""
    try:
        st, raw = read_file_itself(path, 1 << 16)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise SeerfsError(
                f"peers.token_file: {path} is a symlink; seerfs reads only the file itself", ExitCode.CONFIG
            ) from None
        raise
    if raw is None:
        raise SeerfsError(f"peers.token_file: {path} is not a regular file", ExitCode.CONFIG)
    return raw.decode(errors="replace"), st


def _check_private_file(path: Path, st: os.stat_result) -> None:
    """Refuse a token others can read or write: anyone holding it can serve this job wrong bytes."""
    if st.st_mode & 0o077:
        raise SeerfsError(
            f"peers.token_file: {path} is open to other users (mode {st.st_mode & 0o777:04o}); chmod 600 it",
            ExitCode.CONFIG,
        )


def read_or_create_token(path: Path | None) -> bytes:
    """The job token from ``path``, created atomically by whichever daemon comes first.

    Created under a temporary name with mode 0600 and O_EXCL, written whole, then hard-linked to
    ``path``: link fails when another daemon's token is already there (exactly one wins, and a
    reader never sees a half-written token), and the file is never readable by others.
    """
    if path is None:
        raise GroupError("peers.token_file: needed to share a job token without MPI")
    for _ in range(100):
        try:
            raw, st = _read_token_file(path)
            _check_private_file(path, st)
            text = raw.strip()
            if text:
                token = bytes.fromhex(text)
                if len(token) >= 16:
                    return token
                raise GroupError(f"peers.token_file: {path} holds a token shorter than 16 bytes")
        except FileNotFoundError:
            tmp = path.with_name(f".{path.name}.{label()}.{secrets.token_hex(4)}")
            try:
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
                try:
                    os.write(fd, (secrets.token_bytes(TOKEN_BYTES).hex() + "\n").encode())
                finally:
                    os.close(fd)
                with contextlib.suppress(FileExistsError):
                    os.link(tmp, path)  # atomic: exactly one daemon's token wins
            except OSError as exc:
                raise GroupError(f"peers.token_file: cannot create {path}: {exc.strerror}") from None
            finally:
                with contextlib.suppress(OSError):
                    tmp.unlink()
            continue
        except ValueError:
            raise GroupError(f"peers.token_file: {path} does not hold a hex token") from None
        except OSError as exc:
            raise GroupError(f"peers.token_file: cannot read {path}: {exc.strerror}") from None
        time.sleep(0.01)
    raise GroupError(f"peers.token_file: {path} stays empty")


def _sort_key(m: Member) -> tuple[str, bytes, str]:
    """Rendezvous order: by host name, then address, then label.  A daemon restarted on the same
    node takes the place (and so the index, its first guess of its training node) it had."""
    try:
        packed = socket.inet_pton(socket.AF_INET6 if ":" in m.host else socket.AF_INET, m.host)
    except OSError:
        packed = m.host.encode()
    return (m.hostname, packed, m.label)


def _refuses(host: str, port: int, timeout: float = 0.5) -> bool:
    """True when nothing listens at host:port (the daemon that published it is gone); False when
    something answers or we cannot tell (a timeout: hung, or unreachable)."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return False
    except ConnectionRefusedError:
        return True
    except OSError:
        return False


class Rendezvous:
    """Address files in a shared directory; the member list grows as daemons arrive.

    Files name the token by a fingerprint, so a directory reused across jobs never mixes them;
    a daemon removes its file when it stops.  A crashed daemon's file stays (its member is marked
    down by health, and requests go to the live member that answers for its training node) until a
    daemon joins on its host: that one removes the entries of its host whose port refuses
    connections or is its own, so a restarted daemon never counts its predecessor and takes its
    place and index.
    """

    def __init__(self, cfg: Config, host: str, port: int, inputs: str) -> None:
        assert cfg.peers.rendezvous_dir is not None
        self.dir = Path(os.path.expanduser(cfg.peers.rendezvous_dir))
        trusted_dir(self.dir, "peers.rendezvous_dir")  # made 0700 if missing; see fusefs.trust
        token_path = Path(os.path.expanduser(cfg.peers.token_file)) if cfg.peers.token_file else self.dir / "token"
        token = read_or_create_token(token_path)
        self.fingerprint = hmac.new(token, b"seerfs-rendezvous", "sha256").hexdigest()[:16]
        self.me = Member(-1, host, port, label(), inputs, socket.gethostname())
        self.file = self.dir / f"node-{self.me.label}.json"
        self.removed: list[str] = []  # labels of stale entries this daemon removed (status)
        self.publish()
        self.group = Group("rendezvous", 0, [self.me], token, inputs, state="forming", expect=max(1, cfg.peers.expect))
        self.apply(self.read(probe_local=True))

    def publish(self) -> None:
        write_private(self.file, json.dumps({**asdict(self.me), "job": self.fingerprint}).encode())

    def read(self, probe_local: bool = False) -> tuple[list[Member], dict[str, str]]:
        """The directory's entries for this job (blocking file I/O: call it from a thread).

        ``probe_local``: remove entries of this host that are certainly stale first (the address is
        ours now, or its port refuses connections), so a restarted daemon never counts its own
        predecessor and takes its index.
        """
        found: dict[str, Member] = {}
        excluded: dict[str, str] = {}
        mine = False
        for path in sorted(self.dir.glob("node-*.json")):
            try:
                info = json.loads(path.read_text())
                member = Member(
                    -1,
                    str(info["host"]),
                    int(info["port"]),
                    str(info["label"]),
                    str(info["inputs"]),
                    str(info.get("hostname", "")),
                )
            except (OSError, ValueError, KeyError, TypeError):
                continue  # half-written by a crash, or not ours: never a reason to stop
            if info.get("job") != self.fingerprint:
                continue
            if member.label == self.me.label:
                mine = True
                continue
            if member.host == self.me.host and (
                member.port == self.me.port or (probe_local and _refuses(member.host, member.port))
            ):
                self._remove(path, member.label, "its address is this daemon's or refuses connections")
                continue
            if member.inputs != self.me.inputs:
                excluded[member.label] = "disagrees on the config or the dataset snapshot"
                continue
            found[member.label] = member
        if not mine:  # our own file went missing (removed by mistake): publish it again
            with contextlib.suppress(OSError):
                self.publish()
        ordered = sorted([*found.values(), self.me], key=_sort_key)
        members = [Member(i, m.host, m.port, m.label, m.inputs, m.hostname) for i, m in enumerate(ordered)]
        return members, excluded

    def apply(self, entries: tuple[list[Member], dict[str, str]]) -> bool:
        """Adopt what :meth:`read` found; True when the member list changed."""
        members, excluded = entries
        changed = members != self.group.members
        self.group.members = members
        self.group.me = next(m.index for m in members if m.label == self.me.label)
        self.group.excluded = excluded
        if len(members) >= self.group.expect:
            self.group.state = "ready"
        return changed

    def scan(self) -> bool:
        """Re-read the directory (blocking); True when the member list changed."""
        return self.apply(self.read())

    def _remove(self, path: Path, who: str, why: str) -> None:
        try:
            path.unlink()
        except OSError:
            return
        self.removed.append(who)
        del self.removed[:-20]
        log.warning("rendezvous: removed the stale entry of %s (%s)", who, why)

    def leave(self) -> None:
        with contextlib.suppress(OSError):
            self.file.unlink()
