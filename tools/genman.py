"""Generate the man pages from the argparse parsers, the config schema and the status types.

man/seerfs.1 and man/seerfs-tools.7 come from the parsers, man/seerfs.yaml.5 from the config schema,
man/seerfs-control.7's status fields and metrics from the status TypedDicts (fusefs/daemon/status.py
and the sections it names), and so does the metric list in README.md between its ``metrics`` markers.
Why generated: commands, options, exit codes, config keys, status fields and metrics then cannot
drift between ``--help``, ``seerfs config --defaults``, ``.control/status``, the metrics endpoint and
the docs; tests/test_docs.py fails when a committed page is stale (run ``tools/genman`` to refresh).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import sys
from pathlib import Path
from typing import Any, get_type_hints

from fusefs import __version__, config
from fusefs.cli.main import build_parser as seerfs_parser
from fusefs.daemon import schema
from fusefs.daemon.status import DaemonStatus, StartingStatus, StatusDocument, StatusSections
from fusefs.errors import EXIT_MEANINGS, ExitCode

REPO = Path(__file__).resolve().parent.parent
MAN = REPO / "man"
README = REPO / "README.md"
DATE = "2026-11-22"


def esc(text: str) -> str:
    """Escape for roff: backslashes, leading dots/quotes, hyphens in option names."""
    text = text.replace("\\", "\\e").replace("-", "\\-")
    return "\\&" + text if text[:1] in (".", "'") else text


def documented_actions(p: argparse.ArgumentParser) -> list[argparse.Action]:
    """What a user can pass: not --help, not the subcommand list, not internal options hidden from --help."""
    return [
        a
        for a in p._actions
        if not isinstance(a, argparse._HelpAction | argparse._SubParsersAction) and a.help != argparse.SUPPRESS
    ]


def _usage(name: str, p: argparse.ArgumentParser) -> str:
    usage = p.format_usage().strip().removeprefix("usage: ")
    return " ".join(usage.split())


def _positional_lines(p: argparse.ArgumentParser) -> list[str]:
    lines: list[str] = []
    for a in documented_actions(p):
        if not a.option_strings:
            lines += [".TP", f".I {esc(str(a.metavar or a.dest))}", esc(str(a.help or ""))]
    return lines


def _option_lines(p: argparse.ArgumentParser) -> list[str]:
    lines: list[str] = []
    for a in documented_actions(p):
        if not a.option_strings:
            continue
        names = ", ".join(a.option_strings)
        if a.nargs != 0:
            names += f" {a.metavar if isinstance(a.metavar, str) else a.dest.upper()}"
        lines += [".TP", f".B {esc(names)}", esc(str(a.help or ""))]
    return lines


def seerfs_1() -> str:
    parser = seerfs_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    out = [
        f'.TH SEERFS 1 "{DATE}" "seerfs {__version__}" "User Commands"',
        ".SH NAME",
        "seerfs \\- clairvoyant per\\-node FUSE cache for deep\\-learning datasets",
        ".SH SYNOPSIS",
    ]
    for name, p in sub.choices.items():
        out += [".nf", esc(_usage(name, p)), ".fi"]
    out += [
        ".nf",
        esc("seerfs SOURCE MOUNTPOINT -o OPTIONS") + "    (as run by mount(8) and fstab)",
        ".fi",
        ".SH DESCRIPTION",
        "seerfs mounts a dataset directory that lives on a shared parallel filesystem (the PFS) on a "
        "per\\-node mountpoint and shows its tree unchanged and read\\-only.  Training code is not "
        "modified: it points torchvision ImageFolder at the mountpoint.  The job writes its sampler's "
        "shuffle seed to",
        ".IR MOUNTPOINT /.control/seed ;",
        "from it the placement planner knows which node reads which file in which epoch, prefetches "
        "files ahead of use into local tiers (RAM, local disk) and serves every read from the fastest "
        "of local cache, a peer node and the PFS.",
        ".PP",
        "The directory tree is read once at mount (the metadata snapshot) and persisted in the cache "
        "directory; a later mount of an unchanged source reuses it.",
        ".SS Source changes",
        esc(SOURCE_CHANGES),
        ".PP",
        esc(PERSISTED),
        ".SH COMMANDS",
    ]
    for name, p in sub.choices.items():
        helptext = next((c.help for c in sub._choices_actions if c.dest == name), "") or ""
        out += [".SS " + esc(name), esc(_usage(name, p)), ".PP", esc(p.description or helptext)]
        out += _positional_lines(p) + _option_lines(p)
    out += [
        ".SH MOUNT(8) AND FSTAB",
        "mount.fuse3 runs",
        ".B seerfs SOURCE MOUNTPOINT \\-o OPTIONS",
        "for filesystems of type",
        ".BR fuse.seerfs .",
        "Generic options (rw, ro, dev, nodev, suid, nosuid, exec, noexec, auto, noauto, user, _netdev, "
        "nofail, defaults, atime options) are ignored;",
        ".B config=FILE",
        "names the configuration and",
        ".B key=value",
        "overrides a configuration key.  mount(8) clears PATH before it runs the helper, so mount.fuse3's "
        "/bin/sh looks for",
        ".B seerfs",
        "only in /usr/local/sbin, /usr/local/bin, /usr/sbin, /usr/bin, /sbin and /bin: link the installed "
        "console script there (e.g. /usr/local/bin/seerfs \\-> /opt/seerfs/bin/seerfs), or name it by its "
        "absolute path with type",
        ".B fuse",
        "and",
        ".IR HELPER # SOURCE .",
        "Example fstab lines, one of each:",
        ".PP",
        ".nf",
        esc("/lustre/imagenet  /tmp/imagenet  fuse.seerfs  noauto,config=/etc/seerfs.yaml  0 0"),
        esc("/opt/seerfs/bin/seerfs#/lustre/imagenet  /tmp/imagenet  fuse  noauto,config=/etc/seerfs.yaml  0 0"),
        ".fi",
        ".SH ORDINARY USERS",
        "Any user may mount: the mount goes through the setuid",
        ".BR fusermount3 ,",
        "which needs read\\-write access to /dev/fuse for that user (mode 0666, as the fuse3 package's udev "
        "rule sets).",
        ".B allow_other",
        "needs",
        ".B user_allow_other",
        "in /etc/fuse.conf.  The cache directory defaults to ~/.cache/seerfs of the user (set HOME, or",
        ".BR cache_dir ),",
        "the runtime records to $XDG_RUNTIME_DIR/seerfs or /tmp/seerfs\\-UID.",
        ".SH EXIT STATUS",
    ]
    for code in ExitCode:
        out += [".TP", f".B {int(code)}", esc(EXIT_MEANINGS[code])]
    out += [
        ".SH FILES",
        ".TP",
        ".I CACHE_DIR/snapshots/",
        "persisted metadata snapshots, one per source (cache_dir defaults to ~/.cache/seerfs)",
        ".TP",
        ".I CACHE_DIR/log/",
        "daemon logs, one per mountpoint",
        ".TP",
        ".I /run/seerfs/",
        "per\\-mount runtime records (pid, source) used by umount, and the start record (the walk's "
        "progress) that wait and status read before the mount answers; $XDG_RUNTIME_DIR/seerfs or "
        "/tmp/seerfs\\-UID for other users",
        ".SH EXAMPLES",
        "Slurm job: one daemon per node for the whole job, then training, then the epilogue:",
        ".PP",
        ".nf",
        esc("N=$SLURM_NNODES"),
        esc("srun --overlap --mpi=pmix -N $N -n $N seerfs mount --fg /lustre/imagenet /tmp/imagenet -c seerfs.yaml &"),
        esc("srun -N $N -n $N seerfs wait /tmp/imagenet"),
        esc("echo 0 > /tmp/imagenet/.control/seed"),
        esc("srun python train.py --data /tmp/imagenet/train"),
        esc("srun -N $N -n $N seerfs umount /tmp/imagenet"),
        ".fi",
        ".SH SEE ALSO",
        ".BR seerfs.yaml (5),",
        ".BR seerfs\\-control (7),",
        ".BR mount.fuse3 (8),",
        ".BR fusermount3 (1)",
    ]
    return "\n".join(out) + "\n"


def _type_text(tp: Any) -> str:
    return config._type_name(tp)


def _default_text(value: Any, tp: Any) -> str:
    if dataclasses.is_dataclass(value):
        return ""
    if isinstance(value, list) and value and dataclasses.is_dataclass(value[0]):
        return ""
    return config._scalar(value, tp)


def _keys(cls: Any, obj: Any, prefix: str, out: list[str]) -> None:
    hints = get_type_hints(cls)
    for f in dataclasses.fields(cls):
        key = f"{prefix}{f.name}"
        tp = hints[f.name]
        value = getattr(obj, f.name)
        default = _default_text(value, tp)
        out += [".TP", f".B {key}", esc(f.metadata.get("doc", "")) + "."]
        if default:
            out += [".br", f"Type: {esc(_type_text(tp))}; default: {esc(default)}."]
        if dataclasses.is_dataclass(tp):
            _keys(tp, value, f"{key}.", out)
        elif isinstance(value, list) and value and dataclasses.is_dataclass(value[0]):
            item_cls: Any = type(value[0])
            out += [".br", f"A list; each item has the keys below (default: {len(value)} item(s))."]
            _keys(item_cls, item_cls(), f"{key}[].", out)


WHICH_SEED = (
    (
        "distributed",
        "DistributedSampler's seed argument (default 0).  PyTorch's ImageNet example passes none: write 0, "
        "not its --seed.  Lightning injects DistributedSampler(seed=S) with S from seed_everything(S) "
        "(the PL_GLOBAL_SEED environment variable); 0 when seed_everything was never called.",
    ),
    ("random", "S of DataLoader(shuffle=True, generator=torch.Generator().manual_seed(S))."),
    (
        "accelerate",
        "with use_seedable_sampler=True: DataLoaderConfiguration's data_seed if given, else set_seed's value "
        "(torch.random.initial_seed() at prepare()).",
    ),
    (
        "accelerate_default",
        "rank 0's loader.synchronized_generator.initial_seed() after prepare() (a 64-bit number drawn from the "
        "global RNG: set_seed's value does not decide it; print it and write it), or G's seed with "
        "loader_generator when the DataLoader was given generator=G.",
    ),
    (
        "torchdata_random",
        "loader.sampler.generator.initial_seed(), or S when the StatefulDataLoader was given "
        "generator=torch.Generator().manual_seed(S) (with loader_generator).",
    ),
    ("sequential, list", "no seed: the order does not depend on one."),
)
"""The WHICH SEED TO WRITE section of seerfs.yaml(5), by datasets[].sampler.kind."""


def seerfs_yaml_5() -> str:
    out = [
        f'.TH SEERFS.YAML 5 "{DATE}" "seerfs {__version__}" "File Formats"',
        ".SH NAME",
        "seerfs.yaml \\- configuration of a seerfs mount and of the job that reads it",
        ".SH DESCRIPTION",
        "A YAML mapping given with",
        ".B seerfs mount \\-c FILE",
        "(or",
        ".B \\-o config=FILE",
        "from "
        "mount(8)).  Every key is optional.  Every node of a job uses the same file: which training ranks "
        "a node hosts, and the epoch a resumed job is at, are inferred from the files it opens, never "
        "configured per node.  Keys are given below with their dotted names;",
        ".B \\-o key=value",
        "overrides any of them (list items by index, e.g.",
        ".BR tiers.0.bytes=8G ).",
        "An unknown key or a bad value is an error naming the key and what was expected (exit status 3).",
        ".PP",
        "Byte sizes accept plain integers or a number with a unit: K, M, G, T, KiB, MiB, GiB, TiB (binary) "
        "or KB, MB, GB, TB (decimal).  Throughput tables map a count (readers or threads) to MB/s and are "
        "interpolated linearly between their points.",
        ".PP",
        ".B seerfs config \\-\\-defaults",
        "prints every key with its default; the effective configuration of a running mount is in",
        ".IR MOUNTPOINT /.control/config .",
        ".SH KEYS",
    ]
    _keys(config.Config, config.Config(), "", out)
    rate = config.Config().snapshot.revalidate_per_s
    min_round = config.Config().snapshot.revalidate_round_min_s
    files = 1_281_167
    out += [
        ".SH WHICH SEED TO WRITE",
        "The number to write to",
        ".IR MOUNTPOINT /.control/seed",
        "for each",
        ".BR datasets[].sampler.kind ;",
        "with nothing written, or a wrong number, the daemon searches for it from the first opens "
        "(seerfs\\-control(7), SEED DISCOVERY):",
        *[line for kind, what in WHICH_SEED for line in (".TP", f".I {esc(kind)}", esc(what))],
        ".SH SOURCE CHANGES",
        esc(SOURCE_CHANGES),
        ".PP",
        esc(
            f"The staleness bound is one round: cached files / snapshot.revalidate_per_s, and at least "
            f"snapshot.revalidate_round_min_s ({min_round:g} s by default, as long as rclone mount's "
            "--dir-cache-time: a few thousand cached files are not stat'ed every few seconds for the "
            "whole job, each stat a metadata request to the PFS).  "
            f"At the default {rate:g} stats per second per node, a node holding all {files:,} files of "
            f"ImageNet's training set checks each once every {files / rate:,.0f} s "
            f"({files / rate / 60:.1f} minutes); in a group of N nodes each file is checked by its owner, "
            f"so about {files / rate:,.0f}/N s and at least {min_round:g} s.  A replica held "
            "by a node that does not own the file waits N-1 such rounds and one round of everything that node "
            f"holds: with 4 nodes each holding all {files:,} files, {3 * files / 4 / rate:,.0f} + "
            f"{files / rate:,.0f} = {(3 * files / 4 + files) / rate:,.0f} s.  A PFS client's "
            "own attribute cache adds to the bound: over NFS mounted with actimeo=60 a change becomes "
            "visible to stat up to 60 s later.  The rounds cost the PFS at most rate x nodes stats per second, and "
            "(cached files / revalidate_round_min_s) per node where that is less: a group holding all of "
            f"ImageNet's training set sends its metadata server at most about {files / min_round:,.0f} stats per "
            "second for the owners' checks however many nodes it has, plus 1/N of that for each further copy "
            "of a file."
        ),
        ".SH CACHE INTEGRITY AND CRASHES",
        esc(PERSISTED),
        ".PP",
        esc(CRASHES),
        ".SH EXAMPLE",
        "ImageNet with validation after every epoch, two nodes with four ranks each:",
        ".PP",
        ".nf",
        *[esc(line) for line in EXAMPLE.strip().splitlines()],
        ".fi",
        ".SH SEE ALSO",
        ".BR seerfs (1),",
        ".BR seerfs\\-control (7)",
    ]
    return "\n".join(out) + "\n"


SOURCE_CHANGES = (
    "seerfs never serves a byte that is not the source file's at the snapshot's version, and never mixes "
    "versions within one read.  Every cached copy (memory and directory tiers, a peer's copy, pages pushed "
    "into the page cache) records its source's identity: size, mtime, ctime and inode number.  After every "
    "mount a copy is served only once a stat of its source in that mount matched (these stats run ahead "
    "of the readers in predicted order, for copies the next open reads: not for a file whose pages are "
    "cached for it, which is checked before anything reads its copy); pages pushed from a peer's bytes "
    "rest on that peer's check, a peer serving only copies checked in its own mount; while mounted, every "
    "cached file's source is stat'ed again once per round (snapshot.revalidate_per_s, rounds of at least "
    "snapshot.revalidate_round_min_s).  In a group each file is rechecked by its owner every round, and "
    "a replica another node holds by that node every N-th round (N nodes): its bound is N-1 rounds of "
    "that node's own files plus one round of all its cached files (revalidation.replica_bound_seconds).  "
    "An open stats a file only the first time in a mount, so these rounds are the bounds.  "
    "A file read from the source is checked on its own descriptor "
    "before and after the read, and after every range of a large file: a change fails the read with EIO. "
    "Once a change is seen, opens of the file fail with EIO (the tree keeps the snapshot's sizes), its "
    "copies are dropped, its page cache is invalidated, status names it (reads.stale_files, "
    "revalidation.changed), and a remount or seerfs mount --rescan serves the new content.  A source file "
    "replaced by a FIFO, socket or device reads as EIO with a status note; it never blocks the reader.  "
    "A change made after a file's last check can be served from a copy until the next round sees it."
)
PERSISTED = (
    "Everything seerfs persists carries a format version and a digest over every array and file its "
    "loader reads: the snapshot (CACHE_DIR/snapshots), plans (CACHE_DIR/plans) and each directory tier's "
    "index and journal.  One written by another format, or failing its digest, is refused with a log line "
    "and a status note (snapshot.reason, plan.cache_refused, tiers[].opened.reason) and walked or planned "
    "again, as on a cold start.  Every tier copy is also checked against its block digests on each read; a "
    "damaged copy (or a FIFO or device in its place) is dropped, fetched again and may be cached again.  Once "
    "mounted, a full cache directory or tier filesystem never stops the daemon: the write fails with a log "
    "line and a status note, and reads keep being served."
)
CRASHES = (
    "Directory tiers are crash-consistent: each copy's journal record is written before the copy takes its "
    "final name, so after kill -9 (or an OOM kill) at any moment the next mount keeps every copy that was "
    "complete.  fsync policy: journal records are written without fsync, which survives the daemon's death "
    "but not a power loss or kernel crash (the journal's tail may then be lost, costing warmth, never "
    "correctness: every read is verified); the index is written to a temporary file, fsynced and renamed at "
    "most every 30 s and whenever a journal file is half full; data files are written back with "
    "sync_file_range.  The journal (two files of budget/2048 bytes, 16 KiB to 64 MiB) and a reserve for the "
    "next index write are preallocated and charged to the tier's budget, so a full tier filesystem cannot "
    "stop the journal or the index.  Index, journal and reserve files are mode 0600."
)

EXAMPLE = """
cache_dir: /local/seerfs
datasets:
  - root: train
    layout: imagefolder
    sampler: {kind: distributed, shuffle: true}
  - root: val
    follows: train
    sampler: {kind: distributed, shuffle: false}
job: {world_size: 8, ranks_per_node: 4, epochs: 90, batch_size: 256, num_workers: 8}
tiers:
  - {kind: memory, bytes: 64GiB, threads: 8}
  - {kind: directory, path: /local/ssd/seerfs, bytes: 800GiB, threads: 4}
peers: {discovery: mpi, bind: ib0}
"""

CONTROL_HEAD = r"""
.SH NAME
seerfs\-control \- the .control directory of a seerfs mount: seed, status, config
.SH DESCRIPTION
Every seerfs mount has a directory
.I MOUNTPOINT/.control
that is reachable by name but never listed by the mount root's readdir: a listed
.B .control
directory would become class 0 of torchvision's ImageFolder and shift every label.
.B os.listdir
and
.B os.scandir
of the mount root therefore show exactly the source's entries (a
.B .control
entry of the source itself is shadowed and hidden).
.PP
Only the mounting user and root may write the control files (or, instead of the mounting user, the
uid named by
.B control_owner
in
.BR seerfs.yaml (5):
a root Slurm prolog names the job's user); everyone who can use the mount may read them.
.SH FILES
.TP
.B seed
The sampler's shuffle seed, as a decimal integer: the
.I seed
argument of
.B DistributedSampler
(default 0), or the seed of the
.B torch.Generator
given to a DataLoader with
.BR shuffle=True .
It is not the script's
.BR torch.manual_seed ,
which does not change DistributedSampler's order.
Write it with
.B echo 42 > MOUNTPOINT/.control/seed
(a trailing newline and surrounding blanks are fine; the range is
\-2**63 .. 2**64\-1, as torch accepts).
Anything else fails the
.BR write (2)
with
.B EINVAL
(bash prints "Invalid argument"), keeps the previous seed, and puts the reason in the
.B seed.last_error
field of the status.
The seed is the whole text written through one open file, at most 256 bytes: a write that would
end past that (a long text, or a write at a large offset), an append to the current seed, or a
truncate to any size but 0 is refused the same way, and a seed split over several writes is taken
once its text so far is a seed.
Until a seed is written the daemon assumes the sampler default 0
.RB ( origin " is " assumed ).
Reading the file returns the current seed and a newline.
.TP
.B status
A JSON document describing the mount, rendered afresh at every open (the file is opened with
direct_io, so
.B cat
always sees whole, current text).
.B seerfs status
renders it for a person.
.TP
.B config
The effective configuration (YAML) the daemon runs with, after
.B \-o
overrides: the format of
.BR seerfs.yaml (5).
"""

_KIND_TEXT = {"counter": "counter", "gauge": "gauge", "state": "state", "info": "info", "text": ""}


def _field_lines(items: list[schema.Documented]) -> list[str]:
    out: list[str] = []
    variant = ""
    for item in items:
        if item.variant != variant:
            variant = item.variant
            if variant:
                out += [".TP", f"\\fI{esc(variant)}\\fR"]
        f = item.spec
        what = schema.type_text(f.tp)
        kind = _KIND_TEXT[f.meta.kind] if f.meta.export else ""
        unit = schema.infer_unit(f.name, f.meta) if f.meta.kind in ("counter", "gauge") else ""
        tags = ", ".join(t for t in (what, kind, unit) if t)
        metric = _metric_of().get(item.path)
        shown = f" Metric: \\%{esc(metric)}." if metric else ""
        out += [".TP", f".B {esc(item.path)}", f"({esc(tags)}) {esc(f.meta.doc)}.{shown}"]
    return out


@functools.cache
def _metric_of() -> dict[str, str]:
    """Status field path -> the metric that mirrors it (as the man page writes both)."""
    out: dict[str, str] = {}
    for spec in schema.metric_specs(StatusDocument).values():
        if spec.type == "info":
            section = spec.path.partition("{")[0] if "{" in spec.path else ""
            for name in spec.info:
                out[f"{section}.{name}" if section else name] = spec.exposed
            continue
        out[spec.path] = spec.exposed
        if spec.labels and spec.path.endswith("." + spec.labels[-1].upper()):  # a mapping of numbers
            out[spec.path.rpartition(".")[0]] = spec.exposed
    return out


def status_lines() -> list[str]:
    """STATUS FIELDS, START RECORD and METRICS of seerfs-control(7), from the status types."""
    done: set[object] = set()
    items = list(schema.walk(StatusDocument, done=done))
    out = [
        ".SH STATUS FIELDS",
        "Sizes are in bytes, times in seconds, timestamps in seconds since the epoch, unless a field says "
        "otherwise.  Each field shows its type and, for numbers, whether it is a counter (only grows while "
        "the daemon lives), a gauge, a state or an info (a string exported as a metric label); a path "
        "such as tiers[].files names a field of every item of a list, and reads.by_source.SOURCE.files "
        "one of every entry of an object.  Later versions add fields; existing names and units do not "
        "change.  A test checks that a mount's document has exactly these fields.",
    ]
    run: list[schema.Documented] = []
    for item in items:
        if item.depth == 0 and item.path in StatusSections.__annotations__:
            out += _field_lines(run)
            run = []
            doc = item.spec.meta.doc
            out += [".SS " + esc(item.path), esc(doc[:1].upper() + doc[1:]) + "."]
        else:
            run.append(item)
    out += _field_lines(run)
    start = [i for i in schema.walk(StartingStatus, done=done) if i.path not in DaemonStatus.__annotations__]
    out += [
        ".SH START RECORD",
        esc(" ".join((StartingStatus.__doc__ or "").split())) + ":",
        *_field_lines(start),
        ".PP",
        "Each of its progress tasks has the fields of progress.TASK above.",
    ]
    out += metrics_lines()
    return out


def metrics_lines() -> list[str]:
    out = [
        ".SH METRICS",
        "With",
        ".B metrics.enabled",
        "(seerfs.yaml(5)), the daemon serves every metric below at",
        ".BI http:// ADDRESS : PORT /metrics",
        "(metrics.bind, default 127.0.0.1; metrics.port, default "
        f"{config.Config().metrics.port}, 0 for any free port: the bound one is status metrics.port) in the "
        "Prometheus text format, or OpenMetrics when the scraper asks for it.  Each metric mirrors the "
        "status field named after it, at the moment of the scrape: a scrape renders the status document on "
        "the daemon's event loop, as a read of .control/status does, and answers 503 if that takes over "
        "5 s.  Names are seerfs_ and the field's path, with the unit (_bytes, _seconds, _ratio) and "
        "_total for counters; a list or object of sections gives its items a label (tier, peer, source, "
        "task, dataset); a state field is a state set (1 for the current state, labelled with the metric's "
        "name); the info fields of a section are the labels of its _info metric.  Metrics of a null field "
        "(a cursor before the first plan, a tier without a journal) have no sample.",
    ]
    for spec in schema.metric_specs(StatusDocument).values():
        labels = list(spec.labels) + ([spec.name] if spec.type == "stateset" else [])
        name = spec.exposed + ("{" + ",".join(labels) + "}" if labels else "")
        what = {"stateset": f"state set of {', '.join(spec.states)}", "info": "info"}.get(spec.type, spec.type)
        out += [".TP", f".B {esc(name)}", f"{esc(what)}; status {esc(spec.path)}: {esc(spec.doc)}."]
    return out


SEED_DISCOVERY = r"""
.SH SEED DISCOVERY
Users get the seed wrong or do not know it: the ImageNet example of PyTorch passes no seed to its
DistributedSampler (0 is right, not its \-\-seed flag); Lightning seeds its sampler from
.B seed_everything
(the
.B PL_GLOBAL_SEED
environment variable); accelerate uses
.BR set_seed 's
value or
.BR data_seed .
So when nothing was written, or when the lead dataset's opens do not fit the plan of a written seed
(the cursor's mismatch), the daemon searches for the seed in a separate process at low priority
(nice 10 for the likely seeds, nice 19 for the rest of the range) that never runs in the FUSE loop.
Torch seeds its generator with the low 32 bits of the seed, a DistributedSampler's order in epoch e
depends only on seed + e, and people pick small seeds, so the search tries, in order: common seeds
(0, 1, 42, 1234, 3407, ...), 0..65535, the common seeds plus 1..999 (a job resumed in a later
epoch), every date YYYYMMDD of 1970..2099 plus 0..999, then the rest of 0..2**24\-1
.RB ( seed_discovery.limit ).
It starts once the node opened two batches per local rank of the lead dataset and compares exactly
those.  A match is accepted only when the chance that any wrong candidate of the whole plan fits
as well is below the cursor's false\-lock chance (1e\-6); it is then planned and used as if it had
been written
.RB ( seed.origin " discovered)."
A seed written (here or on a peer) while the search runs stops it, and a match is dropped when a
newer seed came after the search was asked for
.RB ( discovery.superseded ):
a discovered seed never replaces a seed written after its search began, and in a group a write
outranks a seed discovered under the same previous seed, whichever node found it
.RB ( seed.generation ).
Nor is a written seed judged on opens from before it was written (a job may change its sampler's
seed mid\-run): each seed written here or on a peer starts a new recording of opens, and a match
that the written seed reproduces in one of its plan's epochs (found as seed + e) leaves it in use.
A written seed that matches the opens is used and no search runs.  Limits:
.IP \(bu 2
a DataLoader that shuffles without a generator
.RB ( shuffle=True ", " generator=None )
draws a fresh 64\-bit seed from the global RNG every epoch: not searchable (and not predictable:
pass it a seeded generator and write that seed);
.IP \(bu 2
a seed outside the range (a random 64\-bit one, say) is not found: write it, or raise
.BR seed_discovery.limit ;
.IP \(bu 2
accelerate's default sampler is not searchable:
.B prepare_data_loader
gives a shuffling DataLoader's RandomSampler a generator seeded with a 64\-bit draw from the global
RNG (unless
.BR use_seedable_sampler )
and shards its batches across processes; give the job a DistributedSampler and write its seed;
.IP \(bu 2
a seeded shuffling DataLoader is found only from its epoch 0; a DistributedSampler from the start of
any epoch, but not from the middle of one (a job resumed mid\-epoch);
.IP \(bu 2
only the sampler kind the configuration names for the lead dataset is searched, and the search runs
on the mount's first opens, or the first ones after the last seed written: a second job started
later on the same mount with another seed is searched again only if it writes a seed.
.PP
Only seeds are found, not a wrong configuration: a job whose world size, ranks per node or batch
size differ from
.B job
in
.BR seerfs.yaml (5)
is not found even with the right seed.
"""
"""The SEED DISCOVERY section of seerfs-control(7): what the search tries and its limits."""


def seerfs_control_7() -> str:
    out = [
        f'.TH SEERFS\\-CONTROL 7 "{DATE}" "seerfs {__version__}" "Miscellaneous"',
        *CONTROL_HEAD.strip("\n").splitlines(),
        *status_lines(),
        *SEED_DISCOVERY.strip("\n").splitlines(),
        ".SH EXAMPLES",
        ".nf",
        "echo 0 > /tmp/imagenet/.control/seed",
        "cat /tmp/imagenet/.control/status | python3 \\-m json.tool",
        "seerfs status /tmp/imagenet",
        "curl \\-s http://127.0.0.1:" + str(config.Config().metrics.port) + "/metrics | grep ^seerfs_reads",
        ".fi",
        ".SH SEE ALSO",
        ".BR seerfs (1),",
        ".BR seerfs.yaml (5)",
    ]
    return "\n".join(out) + "\n"


README_BEGIN = "<!-- metrics: generated by tools/genman from the status types -->"
README_END = "<!-- end of metrics -->"


def readme_metrics() -> str:
    """The README's metric list: every metric name, by status section (details in seerfs-control(7))."""
    groups: dict[str, list[str]] = {}
    for spec in schema.metric_specs(StatusDocument).values():
        section = spec.path.split(".")[0].split("[")[0].split("{")[0]
        if section not in StatusSections.__annotations__:
            section = "daemon"
        labels = "{" + ",".join(spec.labels) + "}" if spec.labels else ""
        groups.setdefault(section, []).append(f"`{spec.exposed}{labels}`")
    lines = [f"- {name}: " + ", ".join(names) for name, names in groups.items()]
    return "\n".join([README_BEGIN, *lines, README_END])


def readme_text() -> str:
    """README.md with its metric list regenerated."""
    text = README.read_text()
    begin, end = text.find(README_BEGIN), text.find(README_END)
    if begin < 0 or end < begin:
        raise SystemExit(f"genman: README.md lacks the lines {README_BEGIN!r} and {README_END!r}")
    return text[:begin] + readme_metrics() + text[end + len(README_END) :]


TOOLS = (
    "bench_train",
    "bench_ceiling",
    "bench_nodes",
    "bench_prefetch",
    "bench_mount",
    "bench_plan",
    "bench_streams",
    "bench_seedsearch",
    "bench_tiers",
    "bench_peers",
    "bench_pfsemu",
    "simulate",
    "pfsemu",
    "mkdataset",
    "genman",
)
"""The programs under tools/ that take options (tools/demo passes its own to bench_train)."""


def tool_parsers() -> dict[str, argparse.ArgumentParser]:
    """Each tool's parser, and each subcommand's as "tool sub": what --help, the page and README show."""
    import importlib

    out: dict[str, argparse.ArgumentParser] = {}
    for name in TOOLS:
        parser: argparse.ArgumentParser = importlib.import_module(f"tools.{name}").build_parser()
        out[name] = parser
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub, p in action.choices.items():
                    out[f"{name} {sub}"] = p
    return out


def _first_paragraph(text: str | None) -> str:
    return " ".join((text or "").strip().split("\n\n")[0].split())


def seerfs_tools_7() -> str:
    out = [
        f'.TH SEERFS\\-TOOLS 7 "{DATE}" "seerfs {__version__}" "Miscellaneous"',
        ".SH NAME",
        "seerfs\\-tools \\- the benchmarks, emulator and generators under tools/ in the seerfs repository",
        ".SH DESCRIPTION",
        "Every program runs from the repository root as",
        ".BI tools/ NAME",
        "and uses the project's .venv (made by tools/setup).",
        ".B tools/demo",
        "runs tools/bench_train at a one\\-minute size; any bench_train option given to it overrides that size.",
        "Each program's",
        ".B \\-\\-help",
        "prints the text below; tools/RESULTS.md has the measured tables and the exact commands.",
    ]
    for name, p in tool_parsers().items():
        usage = " ".join(p.format_usage().strip().removeprefix("usage: ").split())
        out += [
            ".SH " + esc("tools/" + name),
            ".nf",
            esc("tools/" + usage),
            ".fi",
            ".PP",
            esc(_first_paragraph(p.description)),
        ]
        out += _positional_lines(p) + _option_lines(p)
    out += [".SH SEE ALSO", ".BR seerfs (1),", ".BR seerfs.yaml (5),", ".BR seerfs\\-control (7)"]
    return "\n".join(out) + "\n"


PAGES = {
    "seerfs.1": seerfs_1,
    "seerfs.yaml.5": seerfs_yaml_5,
    "seerfs-control.7": seerfs_control_7,
    "seerfs-tools.7": seerfs_tools_7,
}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="genman", description="Regenerate the man pages under man/ from the parsers.")
    p.add_argument("--check", action="store_true", help="exit 1 if a committed page is stale, write nothing")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    stale = []
    outputs = {MAN / name: make for name, make in PAGES.items()} | {README: readme_text}
    for path, make in outputs.items():
        text = make()
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(path.name)
        else:
            path.write_text(text)
    if stale:
        print(f"genman: stale: {', '.join(stale)} (run tools/genman)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
