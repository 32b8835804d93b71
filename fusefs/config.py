"""The configuration schema: typed dataclasses that validate YAML, apply ``-o`` overrides and print defaults.

The dataclasses below are the single source of truth: ``seerfs config --defaults`` prints them with
their docs, ``man/seerfs.yaml.5`` documents the same keys (a test keeps them in step), and every
error names the dotted key and what was expected.  Later features extend the schema; keys are never
renamed.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import re
import types
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, NewType, Union, get_args, get_origin, get_type_hints

import yaml

from fusefs.errors import ConfigError
from placement.model import (
    DEFAULT_NETWORK,
    DEFAULT_OPEN_LATENCY,
    DEFAULT_PFS,
    DEFAULT_READ,
    DEFAULT_STAGING_THREADS,
    DEFAULT_TIER_THREADS,
    DEFAULT_WRITE,
)

ByteSize = NewType("ByteSize", int)
"""An integer byte count; YAML may give ``4GiB``, ``512M`` (binary) or ``2GB`` (decimal)."""

_BYTE_UNITS = {
    "": 1,
    "b": 1,
    "k": 1 << 10,
    "kib": 1 << 10,
    "kb": 10**3,
    "m": 1 << 20,
    "mib": 1 << 20,
    "mb": 10**6,
    "g": 1 << 30,
    "gib": 1 << 30,
    "gb": 10**9,
    "t": 1 << 40,
    "tib": 1 << 40,
    "tb": 10**12,
}
_BYTES_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def parse_bytes(value: object) -> int:
    """Parse a byte size (int, or a string with an optional unit); raises ValueError."""
    if isinstance(value, bool):
        raise ValueError("a byte size")
    if isinstance(value, int):
        if not 0 <= value <= _MAX_BYTES:
            raise ValueError("a non-negative byte size below 2**63")
        return value
    if isinstance(value, str):
        m = _BYTES_RE.match(value)
        if m and m.group(2).lower() in _BYTE_UNITS:
            n = float(m.group(1)) * _BYTE_UNITS[m.group(2).lower()]  # inf for a number of 400+ digits
            if not n <= _MAX_BYTES:
                raise ValueError("a non-negative byte size below 2**63")
            return int(n)
    raise ValueError("a byte size such as 1048576, 512MiB, 4G or 2GB")


_MAX_BYTES = (1 << 63) - 1


def _shown(value: object, limit: int = 60) -> str:
    """User input in a one-line error, bounded: a value can be thousands of characters long."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def format_bytes(n: int) -> str:
    for unit, scale in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale}{unit}"
    return str(n)


def doc(text: str, default: Any = dataclasses.MISSING, factory: Any = dataclasses.MISSING) -> Any:
    """A dataclass field carrying its documentation (printed by ``config --defaults``)."""
    if factory is not dataclasses.MISSING:
        return field(default_factory=factory, metadata={"doc": text})
    return field(default=default, metadata={"doc": text})


# --------------------------------------------------------------------------- schema


@dataclass(frozen=True)
class FuseSettings:
    entry_timeout: float = doc("seconds the kernel caches name lookups (the tree is immutable)", 86400.0)
    attr_timeout: float = doc("seconds the kernel caches attributes", 86400.0)
    read_ahead_kb: int = doc("read-ahead set on the mount's bdi; >128 allows 1 MiB read requests", 1024)
    front: Literal["native", "pyfuse3"] = doc(
        "the FUSE binding that serves the mount.  native: seerfs's own libfuse3 session, run by native threads, "
        "which answers opens of files whose pages are cached (and every ioctl, flush and forget) without Python "
        "and forwards everything else to the daemon; used where the extension was built (libfuse3-dev, pkg-config "
        "and a C compiler at install), else pyfuse3 with one INFO log line.  pyfuse3: every request through "
        "pyfuse3's trio loop (the reference).  Status section front names the one in use",
        "native",
    )
    no_open: Literal["off", "auto", "on"] = doc(
        "zero requests per open (native front, root only).  on: once serving, the native front marks the "
        "directories holding files with fanotify (one inode mark each) and answers OPEN with ENOSYS, after which "
        "the kernel sends no OPEN or RELEASE on the mount: "
        "a cached file is opened and read without the daemon, which sees each open and close, with its pid, through "
        "fanotify, and serves reads of pages not cached by inode.  Where fanotify is refused (no CAP_SYS_ADMIN) or "
        "the front is pyfuse3, a WARNING and opens stay requests.  auto: on where the daemon has CAP_SYS_ADMIN and "
        "the native front loaded.  In this mode an open cannot fail: a file whose source was seen changed fails "
        "its reads with EIO, and an open for writing succeeds, its writes failing with EROFS.  Status "
        "front.open_mode says which is in use",
        "off",
    )
    max_tasks: int = doc("most FUSE requests served concurrently (trio tasks of the front)", 64)
    whole_file_max: ByteSize = doc("files up to this size are read whole at open", ByteSize(4 << 20))
    # Readers' own opens, tier fills and the next epoch's lane; the staging window's PFS reads run
    # beside these, one thread per stage in flight (prefetch.max_in_flight, see PfsReader).
    io_threads: int = doc(
        "threads for blocking reads from the source by readers' opens, tier fills and the next epoch's files; "
        "the staging window reads beside them, one thread per stage in flight (prefetch.max_in_flight at most)",
        32,
    )


@dataclass(frozen=True)
class SnapshotSettings:
    walk_threads: int = doc("threads that walk the source at mount", 8)
    reuse: bool = doc("reuse the persisted snapshot when the source's fingerprint is unchanged", True)
    revalidate_per_s: float = doc(
        "stats per second per node that recheck the sources of cached files while mounted; each cached "
        "file is checked once per round (by its owner node in a group; replicas on other nodes every Nth "
        "round), so a change is seen within (cached files / rate) seconds: 1280 s for 1.28M files on one "
        "node at the default, 1280/N s on N nodes (a replica: N-1 such rounds plus one round of all the "
        "node holds), plus the PFS client's own attribute cache (e.g. NFS actimeo)",
        1000.0,
    )
    revalidate_round_min_s: float = doc(
        "shortest round in seconds: a round of fewer cached files than revalidate_per_s x this still takes "
        "this long, so a small cache is not stat'ed over and over (each stat is a PFS metadata request, and "
        "every node of the job makes them: a group's rounds send the PFS about (files cached in the group / this) "
        "stats per second once the rate no longer limits them) and spreads its stats evenly over this time; a change "
        "is seen within max(cached files / rate, this) seconds.  The default, five minutes, is rclone mount's "
        "--dir-cache-time",
        300.0,
    )
    identity: Literal["stat", "content"] = doc(
        "how a revalidation round tells that the source of a cached file changed.  stat: its identity (size, "
        "mtime, ctime, inode), one metadata request per file.  A rewrite that keeps the size and puts the mtime "
        "back (rsync -t, cp -p, touch -d) shows only in ctime, which a POSIX filesystem sets on every change "
        "and no user can set; sources that do not maintain ctime (object-store FUSE clients, bindfs "
        "--ctime-from-mtime) hide it, so with stat such a rewrite of a cached file is never seen and its "
        "copies serve the old bytes until a remount with --rescan.  content: each round also reads every "
        "cached file's source whole and compares it, block by block, with the digests its copy recorded (a "
        "mismatch is a change, as if stat had seen one).  Its PFS cost: every round reads the bytes of every "
        "file cached on the node once (in a group, of the files it owns, and its replicas every Nth round), "
        "i.e. (bytes cached) / (round seconds) per node: 100 GiB cached at the default 300 s floor is about "
        "340 MiB/s of PFS reads, for the whole job; raise revalidate_round_min_s to bound it.  The stat "
        "before a copy's first use after a mount stays a stat, so a change is seen within one round",
        "stat",
    )


@dataclass(frozen=True)
class SamplerConfig:
    kind: Literal[
        "distributed",
        "random",
        "sequential",
        "list",
        "accelerate",
        "accelerate_default",
        "torchdata_random",
        "ordered_distributed",
        "repeat_aug",
    ] = doc(
        "distributed: DistributedSampler (torchrun, Lightning's injected one); random: DataLoader(shuffle=True, "
        "generator seeded) in one process per rank; sequential: in index order (validation); list: the order "
        "in order_file; accelerate: accelerate's prepare() with use_seedable_sampler=True (whole batches dealt "
        "to the processes in turn; without shuffle: its evaluation loaders); accelerate_default: prepare() "
        "without it (one generator seeded at prepare(), running on across epochs); torchdata_random: torchdata "
        "StatefulDataLoader(shuffle=True) without a sampler; ordered_distributed: timm's OrderedDistributedSampler "
        "(its distributed validation loader: rank r reads r, r + world_size, ... of the dataset, padded from "
        "its start, no seed); repeat_aug: timm's RepeatAugSampler (train.py --aug-repeats under torchrun: "
        "seeded by the epoch alone, no seed).  Which seed to write for each: seerfs.yaml(5), "
        "WHICH SEED TO WRITE",
        "distributed",
    )
    shuffle: bool = doc("DistributedSampler(shuffle=...); accelerate: the DataLoader's shuffle", True)
    aug_repeats: float = doc("repeat_aug: timm's --aug-repeats (RepeatAugSampler's num_repeats)", 3.0)
    drop_last: bool = doc("DistributedSampler(drop_last=...): truncate instead of padding", False)
    persistent_workers: bool = doc(
        "random, accelerate_default, torchdata_random: DataLoader(persistent_workers=...)", False
    )
    even_batches: bool = doc(
        "accelerate, accelerate_default: DataLoaderConfiguration(even_batches=...): the last round of batches "
        "is completed from the epoch's first batches",
        True,
    )
    split_batches: bool = doc(
        "accelerate, accelerate_default: split_batches=True: every batch of the DataLoader is cut into one "
        "slice per process (the DataLoader's batch_size is job.batch_size x job.world_size)",
        False,
    )
    loader_generator: bool = doc(
        "accelerate_default, torchdata_random: the DataLoader was built with generator=G, the sampler's own "
        "(its workers' base seed is drawn from G too); write G's seed",
        False,
    )
    order_file: str | None = doc(
        "list: file of dataset indices in read order, one per line (relative names: in SOURCE)", None
    )


@dataclass(frozen=True)
class LoaderConfig:
    batch_size: int | None = doc(
        "this dataset's DataLoader batch size per rank (e.g. timm's --validation-batch-size); null: job.batch_size",
        None,
    )
    drop_last: bool | None = doc(
        "this dataset's DataLoader(drop_last=...), not the DistributedSampler's (sampler.drop_last): timm drops "
        "the last partial batch when training only; null: job.drop_last",
        None,
    )


@dataclass(frozen=True)
class DatasetConfig:
    root: str = doc("directory of the dataset inside the mount ('.' for the mount root)", ".")
    layout: Literal["imagefolder", "files", "list", "timm_folder"] | None = doc(
        "imagefolder: torchvision ImageFolder order; files: every file, sorted; list: list_file's order; "
        "timm_folder: timm's folder reader (whole tree walked, root files included, class = leaf directory "
        "name, samples in natural order of the full path: img_2 before img_10).  null (not given): planned as "
        "imagefolder until seed discovery finds the job reading another modelled order (imagefolder, "
        "timm_folder, files) with a likely seed; the plan then uses that order (status discovery.order)",
        None,
    )
    list_file: str | None = doc("list: file of paths relative to root, one per line (relative names: in SOURCE)", None)
    extensions: list[str] | None = doc(
        "file extensions kept (case-insensitive); default: ImageFolder's for imagefolder, timm's for "
        "timm_folder (.png .jpg .jpeg), all for files",
        None,
    )
    follows: str | None = doc(
        "root of the dataset after each epoch of which this one is read (validation), or null", None
    )
    every: int = doc("with follows: read after every Nth epoch", 1)
    sampler: SamplerConfig = doc("how the training code samples this dataset", factory=SamplerConfig)
    loader: LoaderConfig = doc(
        "how this dataset's DataLoader batches, where it differs from job.*", factory=LoaderConfig
    )


@dataclass(frozen=True)
class JobConfig:
    world_size: int = doc("number of training ranks in the job", 1)
    ranks_per_node: int = doc("training ranks on each node", 1)
    rank_order: Literal["contiguous", "round_robin"] = doc(
        "contiguous: node k hosts ranks k*R..k*R+R-1 (torchrun, srun); round_robin: rank r on node r%N",
        "contiguous",
    )
    epochs: int = doc("epochs the job trains", 1)
    batch_size: int = doc(
        "per-rank DataLoader batch size (what each rank gets per step: with accelerate's split_batches "
        "the DataLoader was built with this x world_size)",
        1,
    )
    drop_last: bool = doc("DataLoader(drop_last=...): the last partial batch is never read", False)
    num_workers: int = doc("DataLoader worker processes per rank", 0)
    prefetch_factor: int = doc("DataLoader prefetch_factor (batches per worker in flight)", 2)


ThroughputTable = dict[int, float]


DEFAULT_TIER_BYTES = 1 << 30
"""One default for every tier written without ``bytes`` (also the default tier list's): a tier of 0
bytes would cache nothing while looking configured."""


@dataclass(frozen=True)
class TierConfig:
    kind: Literal["memory", "directory"] = doc("memory: daemon RAM; directory: a local disk path", "memory")
    path: str | None = doc("directory tiers: where cached files live (created, owned by the daemon)", None)
    bytes: ByteSize = doc(
        "hard byte budget (memory tiers include the page cache the mount fills); a tier given without "
        "bytes gets this default.  Memory tiers must fit the daemon's memory cgroup (under Slurm the job's, "
        "shared with the training processes): without bytes a memory tier is sized down at mount to what the "
        "cgroup's limit leaves after its use and a reserve for the daemon and its workers (one WARNING line; "
        "status memory_cgroup), with bytes that cannot fit the mount fails (exit 3); while mounted the RAM "
        "budget is lowered when the cgroup runs short, and raised again up to bytes",
        ByteSize(DEFAULT_TIER_BYTES),
    )
    threads: int = doc("prefetch threads that fill this tier", DEFAULT_TIER_THREADS)
    read_mbps: ThroughputTable | None = doc("r_j(p): MB/s read with p threads; default from model", None)
    write_mbps: ThroughputTable | None = doc("w_j(p): MB/s written with p threads; default from model", None)

    def directory(self, cache_dir: Path) -> Path:
        """A directory tier's path: ``~`` expanded, relative paths inside ``cache_dir``.  Here, in the
        schema, so that ``seerfs mount``'s checks (which load no trio) and the tiers share the rule."""
        assert self.path is not None
        path = Path(os.path.expanduser(self.path))
        return path if path.is_absolute() else cache_dir / path


@dataclass(frozen=True)
class PrefetchConfig:
    lookahead_bytes: ByteSize = doc(
        "staging window: bytes of this node's upcoming reads kept ready", ByteSize(256 << 20)
    )
    threads: int = doc(
        "stages in flight the staging window starts with (and the performance model's staging threads, p_0)",
        DEFAULT_STAGING_THREADS,
    )
    max_in_flight: int = doc(
        "most stages in flight (PFS reads and page-cache pushes of the staging window).  The window starts "
        "with prefetch.threads and adds that many each time readers open a file whose stage is still in flight "
        "or not started while the limit held stages back (status prefetch.staging.caught_opens), and gives "
        "them back while it stays ahead; its bytes stay within lookahead_bytes whatever the limit.  A PFS whose "
        "opens take milliseconds serves about in-flight / open latency files a second: 256 stages of 10 ms "
        "opens, 25,600.  A value below threads: fixed at threads",
        256,
    )
    staging: Literal["page_cache", "memory"] = doc(
        "page_cache: push staged files into the kernel page cache (notify_store); memory: serve from RAM",
        "page_cache",
    )


@dataclass(frozen=True)
class PeersConfig:
    discovery: Literal["auto", "mpi", "rendezvous", "static", "none"] = doc(
        "auto: MPI when launched by mpirun/srun, else rendezvous_dir, else static, else alone", "auto"
    )
    bind: str = doc("address or interface name the data port binds to", "127.0.0.1")
    port: int = doc("data port (0: any free port)", 0)
    rendezvous_dir: str | None = doc("shared directory where daemons publish their addresses", None)
    static: list[str] = doc("fixed peer list, host:port per node, same order on every node", factory=list)
    expect: int = doc("nodes to wait for with rendezvous discovery (0: use static's length)", 0)
    join_timeout: float = doc("seconds to wait for the group to form", 120.0)
    timeout: float = doc(
        "seconds before an unanswered peer request falls back to the PFS; also how long the data port "
        "waits for a connection to prove the job token (at least 1 s)",
        2.0,
    )
    down_after: int = doc("consecutive failures before a peer is marked down", 2)
    retry_down_after: float = doc("seconds before a down peer is probed again", 10.0)
    token_file: str | None = doc(
        "rendezvous/static discovery: file holding the job token (created if missing; default "
        "RENDEZVOUS_DIR/token); MPI broadcasts a fresh one",
        None,
    )
    max_requests: int = doc("concurrent requests to one peer", 8)
    server_connections: int = doc(
        "peer connections this daemon serves at once (more are told busy); at most a quarter of them "
        "still proving the job token (a newer one closes the oldest)",
        256,
    )
    server_memory: ByteSize = doc(
        "file data all replies to peers may hold at once; a request that finds no room within 0.5 s "
        "is answered busy and its asker reads the PFS",
        ByteSize(512 << 20),
    )
    server_connection_memory: ByteSize = doc(
        "file data one peer connection may hold at once, so the largest file served to a peer (larger "
        "files are answered busy); a request itself is at most 1 KiB",
        ByteSize(256 << 20),
    )
    spread: bool = doc("assign every file an owner when aggregate storage allows", True)


@dataclass(frozen=True)
class MetricsConfig:
    enabled: bool = doc("serve Prometheus metrics (GET /metrics over HTTP), generated from the status document", False)
    bind: str = doc(
        "address or interface name the metrics endpoint binds to (anyone who can reach it reads the "
        "daemon's status: keep it on loopback or a management network)",
        "127.0.0.1",
    )
    port: int = doc("metrics port (0: any free port; status metrics.port shows the one bound)", 9477)


@dataclass(frozen=True)
class SeedDiscoveryConfig:
    enabled: bool = doc(
        "when no seed is written, or the seed in use does not match what the node opens, find the "
        "sampler's seed from the node's first opens (status section discovery, seerfs-control(7)); false: "
        "assume 0 and fall back to caching reactively when it is wrong",
        True,
    )
    limit: int = doc(
        "search the seeds 0..limit-1 (at most 2**32) after the likely ones (the common seeds, 0..65535, "
        "seed + epoch of the common seeds and every date YYYYMMDD), which are always tried; a seed beyond "
        "is not found: write it",
        1 << 24,
    )
    epoch_span: int = doc(
        "a DistributedSampler job resumed in epoch e shows seed + e: the common seeds and dates are also "
        "tried with e = 1..epoch_span-1",
        1000,
    )
    range_orders: Literal["configured", "all"] = doc(
        "which catalog orders are searched over the whole range 0..limit-1 after the likely seeds.  "
        "configured: only the lead dataset's layout when the config gives one (when it does not, every "
        "modelled order is tried with the likely seeds only, so a job reading an order seerfs does not model "
        "costs a second of CPU, not a minute); all: every modelled order tried (minutes of CPU per order at "
        "the default limit)",
        "configured",
    )


# The model's defaults live in placement.model (the planner falls back to them too); these
# factories hand each config a copy of its own.
def _default_pfs_table() -> ThroughputTable:
    return dict(DEFAULT_PFS)


def _default_memory_read() -> ThroughputTable:
    return dict(DEFAULT_READ["memory"])


def _default_memory_write() -> ThroughputTable:
    return dict(DEFAULT_WRITE["memory"])


def _default_disk_read() -> ThroughputTable:
    return dict(DEFAULT_READ["directory"])


def _default_disk_write() -> ThroughputTable:
    return dict(DEFAULT_WRITE["directory"])


@dataclass(frozen=True)
class DebugConfig:
    policy_log: int = doc(
        "steps of the read policy kept in its log (each event and the instructions it decided), shown in "
        "status section policy_log, where the steps naming one file tell why it was staged, kept, dropped "
        "or read again; 0: no log (a step then costs nothing more)",
        0,
    )
    validate: bool = doc(
        "check the read policy's bookkeeping after every step (a contradiction raises at once, in the step "
        "that made it); for tests and debugging: it costs a pass over every file the policy holds",
        False,
    )


@dataclass(frozen=True)
class ModelConfig:
    pfs_mbps: ThroughputTable = doc(
        "t(gamma): PFS aggregate random-read MB/s with gamma reading nodes", factory=_default_pfs_table
    )
    network_mbps: float = doc("b_c: node-to-node bandwidth in MB/s", DEFAULT_NETWORK)
    memory_read_mbps: ThroughputTable = doc("r(p) of memory tiers by threads", factory=_default_memory_read)
    memory_write_mbps: ThroughputTable = doc("w(p) of memory tiers by threads", factory=_default_memory_write)
    directory_read_mbps: ThroughputTable = doc("r(p) of directory tiers by threads", factory=_default_disk_read)
    directory_write_mbps: ThroughputTable = doc("w(p) of directory tiers by threads", factory=_default_disk_write)
    open_latency_s: float = doc("PFS per-file open latency in seconds", DEFAULT_OPEN_LATENCY)


def _default_datasets() -> list[DatasetConfig]:
    return [DatasetConfig()]


def _default_tiers() -> list[TierConfig]:
    return [TierConfig(kind="memory")]


@dataclass(frozen=True)
class Config:
    source: str | None = doc("the dataset directory on the PFS (the SOURCE argument overrides it)", None)
    cache_dir: str = doc("local directory for the persisted snapshot and logs", "~/.cache/seerfs")
    log_file: str | None = doc("daemon log (default: CACHE_DIR/log/<mount>.log)", None)
    log_level: Literal["debug", "info", "warning", "error"] = doc("daemon log level", "info")
    allow_other: bool = doc(
        "let other users use the mount (needs user_allow_other in /etc/fuse.conf unless mounting as root)",
        False,
    )
    control_owner: int | None = doc(
        "uid that owns .control and may write the seed besides root (default: the mounting user; "
        "a root Slurm prolog gives the job's user)",
        None,
    )
    fuse: FuseSettings = doc("kernel interface", factory=FuseSettings)
    snapshot: SnapshotSettings = doc("metadata snapshot", factory=SnapshotSettings)
    datasets: list[DatasetConfig] = doc("datasets inside the mount and how they are sampled", factory=_default_datasets)
    job: JobConfig = doc("the training job's shape, shared by every node", factory=JobConfig)
    tiers: list[TierConfig] = doc("local storage tiers, fastest first", factory=_default_tiers)
    prefetch: PrefetchConfig = doc("staging window", factory=PrefetchConfig)
    peers: PeersConfig = doc("the daemon group and its data plane", factory=PeersConfig)
    model: ModelConfig = doc("performance-model parameters (NoPFS section 4)", factory=ModelConfig)
    metrics: MetricsConfig = doc("the Prometheus endpoint (seerfs-control(7), METRICS)", factory=MetricsConfig)
    seed_discovery: SeedDiscoveryConfig = doc(
        "finding the sampler's seed from the first opens", factory=SeedDiscoveryConfig
    )
    debug: DebugConfig = doc("developer checks of the read path", factory=DebugConfig)

    def to_dict(self) -> dict[str, Any]:
        """Plain nested mapping (the form ``placement`` takes and ``.control/config`` shows)."""
        return dataclasses.asdict(self)

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False, default_flow_style=False)

    @property
    def cache_path(self) -> Path:
        return Path(os.path.expanduser(self.cache_dir))


# --------------------------------------------------------------------------- validation


def _type_name(tp: Any) -> str:
    if tp is ByteSize:
        return "a byte size such as 4GiB"
    origin = get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in get_args(tp))
    if origin in (Union, types.UnionType):
        inner = [a for a in get_args(tp) if a is not type(None)]
        return " or ".join(_type_name(a) for a in inner) + " or null"
    if origin is list:
        return f"a list of {_type_name(get_args(tp)[0])}s"
    if origin is dict:
        return "a mapping of integer to number"
    if dataclasses.is_dataclass(tp):
        return "a mapping"
    names = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}
    return names.get(tp, getattr(tp, "__name__", str(tp)))


def _convert(value: Any, tp: Any, key: str) -> Any:
    """Check ``value`` against annotation ``tp`` and return it in its Python form."""
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        args = get_args(tp)
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _convert(value, inner[0], key)
    if tp is ByteSize:
        try:
            return ByteSize(parse_bytes(value))
        except ValueError:
            raise ConfigError(f"{key}: expected {_type_name(tp)}, got {_shown(value)}") from None
    if origin is Literal:
        if isinstance(value, bool) and {"on", "off"} <= set(get_args(tp)):
            value = "on" if value else "off"  # YAML 1.1 reads a bare on/off as a boolean
        if value in get_args(tp):
            return value
        raise ConfigError(f"{key}: expected {_type_name(tp)}, got {_shown(value)}")
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(f"{key}: expected {_type_name(tp)}, got {_shown(value)}")
        (item_tp,) = get_args(tp)
        return [_convert(v, item_tp, f"{key}.{i}") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict) or not value:
            raise ConfigError(f"{key}: expected {_type_name(tp)} (e.g. {{1: 330, 8: 2870}}), got {_shown(value)}")
        out: dict[int, float] = {}
        for k, v in value.items():
            kk = _convert(k, int, f"{key}.{k}")
            vv = _convert(v, float, f"{key}.{k}")
            if kk < 1 or vv <= 0:
                raise ConfigError(f"{key}.{k}: expected a positive count and a positive throughput")
            out[kk] = vv
        return dict(sorted(out.items()))
    if dataclasses.is_dataclass(tp):
        if value is None:
            value = {}
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping, got {_shown(value)}")
        return build(tp, value, key)
    if tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif tp is float:
        if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
            return float(value)
    elif tp is str and isinstance(value, str):
        return value
    raise ConfigError(f"{key}: expected {_type_name(tp)}, got {_shown(value)}")


log = logging.getLogger(__name__)

REMOVED_KEYS: dict[str, tuple[str, tuple[object, ...]]] = {
    "prefetch.reactive": (
        "without a trusted plan the tiers always keep files read here by a static frequency set, within "
        "their byte budgets (see seerfs-control(7), prefetch.mode); delete the key",
        (True, "true"),
    ),
}
"""Keys older configs may set: what to do instead, and the values that asked for what seerfs now always
does.  Those are ignored with a warning (a file saved from an older ``seerfs config --defaults`` keeps
working); any other value is an error that says so, which beats 'unknown key'."""


def build(cls: Any, data: Mapping[str, Any], prefix: str = "") -> Any:
    """Build dataclass ``cls`` from a mapping, naming the full key of anything unknown or wrong."""
    hints = get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    for k in data:
        if k not in names:
            where = f"{prefix}." if prefix else ""
            if f"{where}{k}" in REMOVED_KEYS:
                why, harmless = REMOVED_KEYS[f"{where}{k}"]
                if any(type(data[k]) is type(h) and data[k] == h for h in harmless):  # exact: 1 is not True
                    log.warning("config: %s%s was removed and is ignored: %s", where, k, why)
                    continue
                raise ConfigError(f"{where}{k} was removed: {why}")
            raise ConfigError(f"{where}{k}: unknown key (expected one of: {', '.join(sorted(names))})")
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.name in data:
            key = f"{prefix}.{f.name}" if prefix else f.name
            kwargs[f.name] = _convert(data[f.name], hints[f.name], key)
    built = cls(**kwargs)
    object.__setattr__(built, "_given", frozenset(kwargs))  # read by given(); not a field of the schema
    return built


def given(section: object, key: str) -> bool:
    """Whether the YAML or an ``-o`` override set ``key`` of this config section, rather than its
    default applying.  A memory tier's ``bytes`` left out is sized to the daemon's memory cgroup, one
    given is a promise checked against it (``fusefs.daemon.memfit``).  A section made in code, or by
    ``dataclasses.replace``, counts as nothing given."""
    return key in getattr(section, "_given", ())


def _check_positive(key: str, value: float, allow_zero: bool = False) -> None:
    if value < 0 or (value == 0 and not allow_zero):
        raise ConfigError(f"{key}: expected a {'non-negative' if allow_zero else 'positive'} value, got {value}")


def check(cfg: Config) -> Config:
    """Cross-field checks the types alone cannot express."""
    for key, value in (
        ("fuse.entry_timeout", cfg.fuse.entry_timeout),
        ("fuse.attr_timeout", cfg.fuse.attr_timeout),
        ("peers.timeout", cfg.peers.timeout),
        ("peers.join_timeout", cfg.peers.join_timeout),
        ("peers.retry_down_after", cfg.peers.retry_down_after),
        ("model.network_mbps", cfg.model.network_mbps),
        ("snapshot.revalidate_per_s", cfg.snapshot.revalidate_per_s),
        ("snapshot.revalidate_round_min_s", cfg.snapshot.revalidate_round_min_s),
    ):
        _check_positive(key, value, allow_zero=key.startswith("fuse."))
    for key, ivalue in (
        ("fuse.read_ahead_kb", cfg.fuse.read_ahead_kb),
        ("fuse.max_tasks", cfg.fuse.max_tasks),
        ("fuse.io_threads", cfg.fuse.io_threads),
        ("snapshot.walk_threads", cfg.snapshot.walk_threads),
        ("job.world_size", cfg.job.world_size),
        ("job.ranks_per_node", cfg.job.ranks_per_node),
        ("job.epochs", cfg.job.epochs),
        ("job.batch_size", cfg.job.batch_size),
        ("job.prefetch_factor", cfg.job.prefetch_factor),
        ("prefetch.threads", cfg.prefetch.threads),
        ("prefetch.max_in_flight", cfg.prefetch.max_in_flight),
        ("peers.max_requests", cfg.peers.max_requests),
        ("peers.server_connections", cfg.peers.server_connections),
        ("peers.server_memory", cfg.peers.server_memory),
        ("peers.server_connection_memory", cfg.peers.server_connection_memory),
        ("peers.down_after", cfg.peers.down_after),
    ):
        _check_positive(key, ivalue)
    _check_positive("job.num_workers", cfg.job.num_workers, allow_zero=True)
    _check_positive("model.open_latency_s", cfg.model.open_latency_s, allow_zero=True)
    _check_positive("debug.policy_log", cfg.debug.policy_log, allow_zero=True)
    if cfg.job.world_size % cfg.job.ranks_per_node:
        raise ConfigError(
            f"job.ranks_per_node: expected a divisor of job.world_size ({cfg.job.world_size}), "
            f"got {cfg.job.ranks_per_node}"
        )
    if not 0 <= cfg.seed_discovery.limit <= 1 << 32:
        raise ConfigError(f"seed_discovery.limit: expected 0..4294967296 (2**32), got {cfg.seed_discovery.limit}")
    _check_positive("seed_discovery.epoch_span", cfg.seed_discovery.epoch_span)
    if cfg.control_owner is not None and cfg.control_owner < 0:
        raise ConfigError(f"control_owner: expected a uid (0 or more), got {cfg.control_owner}")
    if not 0 <= cfg.peers.port <= 65535:
        raise ConfigError(f"peers.port: expected 0..65535, got {cfg.peers.port}")
    if not 0 <= cfg.metrics.port <= 65535:
        raise ConfigError(f"metrics.port: expected 0..65535, got {cfg.metrics.port}")
    for i, item in enumerate(cfg.peers.static):
        host, sep, port = item.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) <= 65535:
            raise ConfigError(f"peers.static.{i}: expected host:port, got {item!r}")
    if cfg.peers.discovery == "rendezvous" and not cfg.peers.rendezvous_dir:
        raise ConfigError("peers.rendezvous_dir: expected a directory when peers.discovery is 'rendezvous'")
    if cfg.peers.discovery == "static" and not cfg.peers.static:
        raise ConfigError("peers.static: expected host:port entries when peers.discovery is 'static'")
    if cfg.peers.expect < 0:
        raise ConfigError(f"peers.expect: expected a non-negative count, got {cfg.peers.expect}")
    roots: set[str] = set()
    for i, ds in enumerate(cfg.datasets):
        key = f"datasets.{i}"
        norm = os.path.normpath(ds.root)
        if os.path.isabs(ds.root) or norm.startswith(".."):
            raise ConfigError(f"{key}.root: expected a path inside the mount, got {ds.root!r}")
        if norm in roots:
            raise ConfigError(f"{key}.root: {ds.root!r} is configured twice")
        roots.add(norm)
        if ds.layout == "list" and not ds.list_file:
            raise ConfigError(f"{key}.list_file: expected a file name when layout is 'list'")
        if ds.sampler.kind == "list" and not ds.sampler.order_file:
            raise ConfigError(f"{key}.sampler.order_file: expected a file name when sampler.kind is 'list'")
        _check_positive(f"{key}.every", ds.every)
        if ds.loader.batch_size is not None:
            _check_positive(f"{key}.loader.batch_size", ds.loader.batch_size)
    for i, ds in enumerate(cfg.datasets):
        if ds.follows is not None and os.path.normpath(ds.follows) not in roots:
            raise ConfigError(f"datasets.{i}.follows: expected the root of another dataset, got {ds.follows!r}")
    for i, tier in enumerate(cfg.tiers):
        key = f"tiers.{i}"
        if tier.kind == "directory" and not tier.path:
            raise ConfigError(f"{key}.path: expected a directory for a directory tier")
        if tier.kind == "memory" and tier.path:
            raise ConfigError(f"{key}.path: memory tiers take no path")
        _check_positive(f"{key}.threads", tier.threads)
        if tier.bytes <= 0:
            raise ConfigError(
                f"{key}.bytes: expected a positive size (a tier of 0 bytes caches nothing; leave the tier "
                f"out instead, or omit bytes for the default {format_bytes(DEFAULT_TIER_BYTES)})"
            )
    return cfg


# --------------------------------------------------------------------------- loading


def _set_fields(item: Any) -> dict[str, Any]:
    """A default list item as a mapping of the fields its factory set: ``-o tiers.0.threads=2`` gives
    that item's ``threads``, not also its default ``bytes`` (see :func:`given`)."""
    out = {}
    for f in dataclasses.fields(item):
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        value = getattr(item, f.name)
        if value != default:
            out[f.name] = _set_fields(value) if dataclasses.is_dataclass(value) else value
    return out


def _set_dotted(data: dict[str, Any], dotted: str, raw: str) -> None:
    try:
        value = yaml.safe_load(raw) if raw != "" else ""
    except (yaml.YAMLError, ValueError, RecursionError):  # ValueError: an integer of over 4,300 digits
        value = raw
    parts = dotted.split(".")
    node: Any = data
    defaults: Any = Config()
    for depth, part in enumerate(parts):
        last = depth == len(parts) - 1
        if isinstance(node, list):
            if not part.isdigit():
                raise ConfigError(f"-o {dotted}: expected a list index at {part!r}")
            idx = int(part)
            if idx > len(node):
                raise ConfigError(f"-o {dotted}: index {idx} is past the end of the list ({len(node)} items)")
            if idx == len(node):
                node.append({})
            if last:
                node[idx] = value
            else:
                node = node[idx]
            defaults = None
            continue
        if not isinstance(node, dict):
            raise ConfigError(f"-o {dotted}: {part!r} is not inside a mapping")
        if last:
            node[part] = value
            break
        if part not in node or node[part] is None:
            default_value = getattr(defaults, part, None) if defaults is not None else None
            if isinstance(default_value, list):
                node[part] = [
                    _set_fields(v) if dataclasses.is_dataclass(v) and not isinstance(v, type) else v
                    for v in default_value
                ]
            else:
                node[part] = {}
        defaults = getattr(defaults, part, None) if defaults is not None else None
        node = node[part]


def load(path: str | os.PathLike[str] | None = None, overrides: Mapping[str, str] | None = None) -> Config:
    """Load, override and validate a config; every problem raises ConfigError naming the key."""
    data: dict[str, Any] = {}
    if path is not None:
        try:
            text = Path(path).read_text()
        except OSError as exc:
            raise ConfigError(f"cannot read config {path}: {exc.strerror}") from None
        try:
            loaded = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" line {mark.line + 1}" if mark is not None else ""
            raise ConfigError(f"config {path}{where}: not valid YAML") from None
        except (ValueError, RecursionError) as exc:  # an integer of over 4,300 digits; nesting too deep
            raise ConfigError(f"config {path}: unreadable value ({type(exc).__name__})") from None
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"config {path}: expected a mapping at the top level")
        data = loaded
    for key, raw in (overrides or {}).items():
        _set_dotted(data, key, raw)
    return check(build(Config, data))


def defaults_yaml() -> str:
    """The default configuration as commented YAML (``seerfs config --defaults``)."""
    lines = ["# seerfs configuration: every key with its default (see seerfs.yaml(5))"]
    _emit(Config(), 0, lines)
    return "\n".join(lines) + "\n"


def _scalar(value: Any, tp: Any) -> str:
    if tp is ByteSize:
        return format_bytes(value)
    dumped = yaml.safe_dump(value, default_flow_style=True).strip()
    return dumped.removesuffix("\n...").removesuffix("...").strip()


def _emit(obj: Any, indent: int, lines: list[str]) -> None:
    pad = "  " * indent
    hints = get_type_hints(type(obj))
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        comment = f.metadata.get("doc", "")
        if dataclasses.is_dataclass(value):
            lines.append(f"{pad}{f.name}:  # {comment}")
            _emit(value, indent + 1, lines)
        elif isinstance(value, list) and value and dataclasses.is_dataclass(value[0]):
            lines.append(f"{pad}{f.name}:  # {comment}")
            for item in value:
                sub: list[str] = []
                _emit(item, 0, sub)
                for j, line in enumerate(sub):
                    lines.append(f"{pad}  {'- ' if j == 0 else '  '}{line}")
        else:
            lines.append(f"{pad}{f.name}: {_scalar(value, hints[f.name])}  # {comment}")


def all_keys(cls: Any = Config, prefix: str = "") -> list[str]:
    """Every dotted key of the schema (list items as ``name[]``); the docs test uses it."""
    keys: list[str] = []
    hints = get_type_hints(cls)
    for f in dataclasses.fields(cls):
        key = f"{prefix}{f.name}"
        keys.append(key)
        tp = hints[f.name]
        if get_origin(tp) is list and dataclasses.is_dataclass(get_args(tp)[0]):
            keys.extend(all_keys(get_args(tp)[0], f"{key}[]."))
        elif dataclasses.is_dataclass(tp):
            keys.extend(all_keys(tp, f"{key}."))
    return keys
