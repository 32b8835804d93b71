"""Generate the man pages from the argparse parsers, the config schema, the status types and the prose below.

man/seerfs.1 and man/seerfs-tools.7 come from the parsers, man/seerfs.yaml.5 from the config schema,
man/seerfs-control.7's status fields and metrics from the status TypedDicts (fusefs/daemon/status.py
and the sections it names).  Why generated: commands, options, exit codes, config keys, status
fields and metrics then cannot drift between ``--help``, ``seerfs config --defaults``,
``.control/status``, the metrics endpoint and the docs; tests/test_docs.py fails when a committed
page is stale (run ``tools/genman`` to refresh).  The reference prose no source type carries (the
daemon group, Slurm, mount(8), seed discovery, metrics, notes) is roff text in this module's
constants, so no page needs a hand edit; README.md stays a front page that links the pages.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import sys
import textwrap
from pathlib import Path
from typing import Any, get_type_hints

from fusefs import __version__, config
from fusefs.cli.main import build_parser as seerfs_parser
from fusefs.daemon import schema
from fusefs.daemon.status import DaemonStatus, StartingStatus, StatusDocument, StatusSections
from fusefs.errors import EXIT_MEANINGS, ExitCode

REPO = Path(__file__).resolve().parent.parent
MAN = REPO / "man"
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


def _roff(text: str) -> list[str]:
    """A roff source constant (below) as page lines."""
    return text.strip("\n").splitlines()


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
        *_roff(SNAPSHOT_TEXT),
        ".SS Source changes",
        esc(SOURCE_CHANGES),
        ".PP",
        esc(PERSISTED),
        *_roff(PROGRESS_TEXT),
        ".SH COMMANDS",
    ]
    for name, p in sub.choices.items():
        helptext = next((c.help for c in sub._choices_actions if c.dest == name), "") or ""
        out += [".SS " + esc(name), esc(_usage(name, p)), ".PP", esc(p.description or helptext)]
        out += _positional_lines(p) + _option_lines(p)
    out += [*_roff(GROUP_TEXT), *_roff(SLURM_TEXT), *_roff(FSTAB_TEXT), *_roff(ORDINARY_USERS_TEXT)]
    out += [".SH EXIT STATUS"]
    for code in ExitCode:
        out += [".TP", f".B {int(code)}", esc(EXIT_MEANINGS[code])]
    out += [
        *_roff(NOTES_TEXT),
        ".SH FILES",
        ".TP",
        ".I CACHE_DIR/snapshots/",
        "persisted metadata snapshots, one per source (cache_dir defaults to ~/.cache/seerfs)",
        ".TP",
        ".I CACHE_DIR/plans/",
        "plans, one directory per mountpoint, the newest four kept",
        ".TP",
        ".I CACHE_DIR/log/",
        "daemon logs, one per mountpoint",
        ".TP",
        ".I TIER_PATH/seerfs\\-tier.json",
        "a directory tier's marker (the daemon's uid and a tier id): the tier is seerfs's to change (NOTES)",
        ".TP",
        ".I /run/seerfs/",
        "per\\-mount runtime records (pid, source) used by umount, and the start record (the walk's "
        "progress) that wait and status read before the mount answers; $XDG_RUNTIME_DIR/seerfs or "
        "/tmp/seerfs\\-UID for other users",
        ".SH EXAMPLES",
        "Slurm job: one daemon per node for the whole job, then training, then the epilogue:",
        ".PP",
        ".nf",
        *[esc(line) for line in JOB_EXAMPLE.strip("\n").splitlines()],
        ".fi",
        ".SH SEE ALSO",
        ".BR seerfs.yaml (5),",
        ".BR seerfs\\-control (7),",
        ".BR mount.fuse3 (8),",
        ".BR fusermount3 (1)",
    ]
    return "\n".join(out) + "\n"


JOB_EXAMPLE = """
N=$SLURM_NNODES   # one daemon per node: -n too, or srun takes the job's task count from SLURM_NTASKS
srun --overlap --mpi=pmix -N $N -n $N seerfs mount --fg /lustre/imagenet /tmp/imagenet -c seerfs.yaml &
srun -N $N -n $N seerfs wait /tmp/imagenet                 # until every node's mount answers
echo 0 > /tmp/imagenet/.control/seed                       # the SAMPLER's seed (optional: found from the opens)
srun python train.py --data /tmp/imagenet/train            # unchanged ImageFolder + DistributedSampler
srun -N $N -n $N seerfs umount /tmp/imagenet               # epilogue
"""
"""The job script of seerfs(1) EXAMPLES: README.md's "How a job uses it" recipe (tests/test_docs.py
keeps the two equal)."""

SNAPSHOT_TEXT = r"""
.PP
The directory tree is walked once at mount (threads in parallel) into a compact metadata snapshot
(82 bytes per entry plus the names); lookups and listings never touch the PFS again.  The snapshot
is persisted under
.B cache_dir
and reused by a later mount when no directory of the source changed
.RB ( "\-\-rescan"
forces a walk).
"""
"""seerfs(1) DESCRIPTION: the snapshot."""

PROGRESS_TEXT = r"""
.SS Progress
Long work shows its progress: the walk of a large source (entries walked, entries per second, and
the time left when a persisted snapshot of the same source gives the expected count) in
.B seerfs mount
and
.BR "seerfs plan" ,
in
.B seerfs wait
(which reads the starting daemon's start record before the mount answers) and in
.BR "seerfs status" ;
the plan being built (phase, files, and the time left estimated from the last plan built for the
mountpoint) in
.B seerfs wait \-\-plan
and
.BR "seerfs status" .
On a terminal this is one refreshing line on stderr; otherwise one line at most every 10 s (a
.B \-\-fg
daemon logs it every 10 s).  The status field
.B progress
(seerfs\-control(7)) holds the numbers.
"""
"""seerfs(1) DESCRIPTION: progress of long work."""

GROUP_TEXT = r"""
.SH THE DAEMON GROUP
On several nodes the daemons of a job form a group: each file gets an owner that reads it from the
PFS once and serves it to the other nodes over TCP, so the PFS is read about once per job.  The
owner is the plan's while the seed's plan is followed, else a hash of the file over the members
(the group rule).  When that changes (a wrong seed refuted by the opens, the right seed found or
written later), the member about to read a file from the PFS first asks the members that read it
under the earlier plan or rule for a copy they still hold, in a tier, in RAM or in their page
cache (status group.held_asks and group.held_hits; prefetch.staging.read_backs), so a change of
seed never costs a second PFS read of a file some node still holds.
.PP
The group forms one of three ways, chosen by
.B peers.discovery
(default
.BR auto ,
which tries them in this order):
.TP
.B MPI
Launched by
.B srun \-\-overlap \-\-mpi=pmix \-N $N \-n $N seerfs mount \-\-fg ...
(srun hands its tasks PMI only with \-\-mpi=pmix or MpiDefault=pmix; Debian's default is none, and
then every daemon stays alone) or by
.BR "mpirun \-np NODES \-\-map\-by ppr:1:node seerfs mount \-\-fg ..." ;
the daemons allgather their data addresses, check that the configuration and plan inputs agree (a
mismatch is exit status 10 on every node) and share a fresh job token.  Under MPI the mount must
be
.B \-\-fg
(no fork after MPI_Init).  MPI needs the extra seerfs[mpi] (mpi4py, built against the MPI it will
run under); without it, a mount that asks for MPI fails with one line naming the extra.
.TP
.B rendezvous
.B peers.rendezvous_dir
on the shared filesystem and
.B peers.expect
nodes: each daemon publishes its address there (this works from a root Slurm prolog, without
MPI); the job token is
.B peers.token_file
(default RENDEZVOUS_DIR/token, created if missing).
.TP
.B static
.B peers.static
lists host:port per node, in the same order everywhere.
.PP
.B peers.bind
picks the address or interface the data port binds to.
.B seerfs wait
returns when the mount answers and its group has formed.  A seed written on any node reaches every
daemon: the latest write wins, by generation number, and wins over a seed discovered under the seed
it replaced (seerfs\-control(7), SEED DISCOVERY).
.PP
A peer that stops answering (crashed or hung) is marked down after
.B peers.down_after
consecutive failed requests (each bounded by
.BR peers.timeout )
and probed again after
.B peers.retry_down_after
seconds, or at once after a state note from it.  It is up again when a probe or a state note to it
is answered: notes, every 2 s, still go to a down peer, so two members that each marked the other
down after a stall they both lived through are up again within a round or two.  Its files come from
the PFS meanwhile, and no read waits longer than peers.timeout plus one PFS read.  A daemon killed
and mounted again on its node (rendezvous, at a new port or the same one, or static) rejoins the
group and serves its peers again within seconds; it removes the entry its crashed predecessor left
in the rendezvous directory.  Every request names the file it means (entry, size, mtime), so a
peer whose plan or snapshot disagrees refuses instead of sending another file's bytes.
.B seerfs status
shows the group, each peer's health and the reads per source on every node.
"""
"""seerfs(1) THE DAEMON GROUP: formation, owners, peers down and up."""

SLURM_TEXT = r"""
.SH SLURM
Slurm kills a step's processes when the step ends, so the daemon runs as a job\-long background
step
.RB ( "srun \-\-overlap ... \-\-fg &" ,
as in EXAMPLES) or from a root prolog.  As a step it shares the job's memory cgroup with the
training.  The daemon reads that cgroup (v2 memory.max, memory.current and memory.events, or v1)
at mount and every 2 s: where the memory tiers'
.B bytes
are not set, it sizes them (and the page cache the mount keeps) to what the limit leaves after
the cgroup's use at mount and its own processes (plan and seed\-search workers included), shrinks
them (pushed pages and memory copies first) when use nears the limit or high/oom events rise, and
grows them back when calm; one WARNING line and the status section memory_cgroup say what was
sized and why.  A
.B bytes
set in the configuration that the limit cannot hold is exit status 3 at mount.  Training grows
after the mount, so still ask
.B \-\-mem
for the training's own memory plus about 150 MB for the daemon.
.PP
To mount for the job from a root Slurm prolog instead (on each node, before the job starts;
unmounted by the epilog, also after scancel), use tools/slurm/prolog and tools/slurm/epilog of the
source distribution, whose comments say how to install them.  That mount is root's, with
.BR allow_other ,
and its control files belong to the job's user
.RB ( control_owner ),
so the job writes its seed as in EXAMPLES.
.PP
The seed that matters is the sampler's: DistributedSampler(seed=...) (default 0) or the seed of
the generator given to a shuffling DataLoader, not the script's torch.manual_seed
(seerfs.yaml(5), WHICH SEED TO WRITE).  Writing it is optional: without it, or with a wrong one,
the daemon finds it from the node's first opens (seerfs\-control(7), SEED DISCOVERY).
"""
"""seerfs(1) SLURM: the daemon as a job step or from a prolog, its memory, the seed to write."""

FSTAB_TEXT = r"""
.SH MOUNT(8) AND FSTAB
mount.fuse3 runs
.B /bin/sh \-c \(dqseerfs SOURCE MOUNTPOINT \-o OPTIONS\(dq
for filesystems of type
.BR fuse.seerfs ;
seerfs accepts that form.  Generic options (rw, ro, dev, nodev, suid, nosuid, exec, noexec, auto,
noauto, user, _netdev, nofail, defaults, atime options) are ignored;
.B config=FILE
names the configuration and
.B key=value
overrides a configuration key.  mount(8) clears PATH (and HOME) before it runs the helper
(util\-linux 2.38, even for root), so the shell looks for
.B seerfs
only in its default /usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin, whatever PATH
the caller has or a venv put first.  Two ways work with an installed seerfs:
.IP 1. 3
type
.BR fuse.seerfs ,
with the installed console script linked into /usr/local/bin;
.IP 2. 3
no link: type
.B fuse
and the helper's absolute path before '#' (mount.fuse3 runs that path).
.PP
.nf
ln \-s /opt/seerfs/bin/seerfs /usr/local/bin/seerfs                                        # 1.
mount \-t fuse.seerfs /lustre/imagenet /tmp/imagenet \-o config=/etc/seerfs.yaml
/lustre/imagenet  /tmp/imagenet  fuse.seerfs  noauto,config=/etc/seerfs.yaml  0 0       # its /etc/fstab line

mount \-t fuse '/opt/seerfs/bin/seerfs#/lustre/imagenet' /tmp/imagenet \-o config=/etc/seerfs.yaml   # 2.
/opt/seerfs/bin/seerfs#/lustre/imagenet  /tmp/imagenet  fuse  noauto,config=/etc/seerfs.yaml  0 0
.fi
.PP
Either way the mount shows as
.B fuse.seerfs
with the source as its device.  A system\-wide pip install that puts seerfs in /usr/local/bin
needs neither.
"""
"""seerfs(1) MOUNT(8) AND FSTAB."""

ORDINARY_USERS_TEXT = r"""
.SH ORDINARY USERS
No root is needed to mount, read, check status or unmount.  A non\-root mount goes through the
setuid
.B fusermount3
(package fuse3), which opens /dev/fuse as the user: the device must be read\-write for them, mode
0666 as the fuse3 package's udev rule sets on a host (some containers leave it 0600; seerfs then
says so).  The user needs write access to the mountpoint and read access to the source; the
source's permissions hold through the mount (default_permissions).
.B cache_dir
defaults to ~/.cache/seerfs of the user, so HOME must be theirs (setpriv keeps the caller's,
runuser \-u and su set it; or set
.BR cache_dir ),
and the runtime records go to $XDG_RUNTIME_DIR/seerfs or /tmp/seerfs\-UID.
.B allow_other
(other users, e.g. a job running as another account, read the mount) needs
.B user_allow_other
in /etc/fuse.conf; without it the mount fails with exit status 6.
"""
"""seerfs(1) ORDINARY USERS."""

NOTES_TEXT = r"""
.SH NOTES
.IP \(bu 2
Plans are built in a separate process at nice 10
.RB ( "python \-m fusefs.planning.worker" ),
never in the FUSE loop.  After each plan the daemon keeps one such worker started and waiting
(about 30 MB resident, idle), so a seed written as the job's ranks start costs the planning alone
(about 50 ms of CPU for 4,400 files) instead of a Python start and numpy's import (about 0.4 s of
CPU on the cores the ranks start on).  The next one starts 30 s after a plan made while the job
runs; the waiting one exits with its daemon, killed or not.  The seed search runs in a process of
its own too (seerfs\-control(7), SEED DISCOVERY).
.IP \(bu 2
Writes of any kind fail with EROFS;
.BR statfs (2)
reports the source's figures.
.IP \(bu 2
Symlinks are served as symlinks; links whose target leaves the tree are listed in status
(snapshot.external_symlinks) and logged: reads through them bypass seerfs.
.IP \(bu 2
.B default_permissions
is always on: with
.BR allow_other ,
nobody reads through the mount what the source denies them.
.IP \(bu 2
What seerfs writes is its user's alone: the job token, snapshots, plans, tier copies, logs and
rendezvous entries are created 0600 (directories 0700), and a token file other users can read is
refused at mount (exit status 3).
.IP \(bu 2
Trusted paths: the daemon often runs as root, so at mount every directory it creates or writes
(CACHE_DIR and its log, plans and snapshots, each directory tier, the log file's directory, the
rendezvous directory, the token file's directory) is checked from / down, as sshd's StrictModes
does.  Each component must be a directory, or a symlink, owned by root or the daemon's user, and
not writable by group or others unless sticky (/tmp); the last directory must not be writable by
group or others at all.  Missing directories are made 0700.  Otherwise one line names the path and
the rule, exit status 3: a symlink another user planted, or a group\-writable directory on the
way, could send the daemon's writes elsewhere.  An admin's root\-owned symlink
(/scratch \-> /local/nvme) is followed.  Files seerfs then creates there are opened with
O_NOFOLLOW.
.IP \(bu 2
A directory tier touches only what it made: it writes its marker (seerfs\-tier.json: the daemon's
uid and a tier id) only into an empty directory or one holding a seerfs index whose checksum holds
(a cache from an earlier build).  Any other directory, or an entry\-named file of another user in
a marked one, refuses the mount (exit status 3) with nothing created or removed; files of other
names are never touched.
.IP \(bu 2
.B seerfs mount \-\-timeout
bounds only the wait for the mount to answer: the daemon goes on after it.
"""
"""seerfs(1) NOTES: behaviour worth knowing that no option or key names."""


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
    ("sequential, list, ordered_distributed", "no seed: the order does not depend on one."),
    ("repeat_aug", "no seed: timm's RepeatAugSampler shuffles with the epoch as its seed."),
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
            "whole job, each stat a metadata request to the PFS; on the benchmark's host, 30 s rounds of two "
            "nodes over 4,400 cached files cost 3-5% of a training epoch, "
            "tools/results/2026-11-30-bench-train-night.md).  "
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
    "Once a change is seen, opens of the file fail with EIO (with fuse.no_open on, where the kernel opens "
    "files without asking the daemon, its reads fail with EIO instead; the tree keeps the snapshot's sizes), its "
    "copies are dropped, its page cache is invalidated, status names it (reads.stale_files, "
    "revalidation.changed), and a remount or seerfs mount --rescan serves the new content.  A source file "
    "replaced by a FIFO, socket or device reads as EIO with a status note; it never blocks the reader.  "
    "A change made after a file's last check can be served from a copy until the next round sees it.  "
    "These checks rest on ctime: a rewrite that keeps the size and puts the mtime back shows only there, so "
    "on a source that does not maintain ctime (object-store FUSE clients, bindfs --ctime-from-mtime) such a "
    "rewrite of a cached file is never seen and its copies serve the old bytes, unless snapshot.identity is "
    "content: then each round also compares every cached file's source bytes with its copy, at the cost of "
    "reading them from the PFS (seerfs.yaml(5))."
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
Reading the file returns the seed in use (written, found from the opens, or assumed) and a newline.
.TP
.B status
A JSON document describing the mount, rendered afresh at every open (the file is opened with
direct_io, so
.B cat
always sees whole, current text).  With
.B fuse.no_open
on, no open reaches the daemon: the document is rendered when the kernel asks the file's
attributes, at most once a second, so a read sees a whole document up to a second old; and since
an open cannot fail there, root's open of status or config for writing succeeds and its write
fails (EACCES).
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
        ".PP",
        "The endpoint is off by default: anyone who reaches the port reads the daemon's status.  A port that "
        "cannot be bound is a log line and a status note (metrics.error), never a failed mount.  A scrape's "
        "status snapshot is handed to the HTTP thread, which never reads the daemon's live state.  The "
        "prediction hit ratio is",
        ".BR seerfs_cursor_hit_ratio .",
        "Every metric, with the field it mirrors:",
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
.RB ( "python \-m fusefs.planning.search_worker" ,
nice 10 for the likely seeds, nice 19 for the rest of the range, killed when a seed is written or
the mount ends) that never runs in the FUSE loop.
Torch seeds its generator with the low 32 bits of the seed, a DistributedSampler's order in epoch e
depends only on seed + e, and people pick small seeds, so the search tries, in order: common seeds
(0, 1, 42, 1234, 3407, ...), 0..65535, the common seeds plus 1..999 (a job resumed in a later
epoch), every date YYYYMMDD of 1970..2099 plus 0..999 (all of these take under a second at ImageNet
scale), then the rest of 0..2**24\-1
.RB ( seed_discovery.limit ;
about 15 CPU seconds at ImageNet scale, which at nice 19 only uses idle CPU).
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
A written seed that matches the opens is used and no search runs.  A job first seen in epoch e of
a DistributedSampler is found as seed + e, which is what is planned: its epoch e + k reads like
epoch k of that value.
.PP
The sampler draws dataset indices; which file an index is depends on how the training code lists
its files.  When
.B datasets.N.layout
is given, the search tries that order only, over the whole range.  When it is not, the search tries
each modelled order with the likely seeds: ImageFolder's (torchvision, the PyTorch examples,
Lightning and accelerate scripts), timm's folder reader (natural sort of the paths: timm's
train.py, natsort\-ed file lists) and every file sorted by path
.RB ( "sorted(glob(...))" );
an order that lists the files exactly as an earlier one is tried once, and each order's search is
held to the false\-lock chance divided by the number of orders searched.  Every order is listed while
the search worker waits for opens, and their likely seeds are searched together, a chunk of each in
turn, so a common seed is found in milliseconds whichever order the job reads.  A match names its order
.RB ( discovery.order ),
and the plan then lists the lead dataset, and every dataset without a layout, in that order.  A
seed written with no layout given is checked the same way on its first opens.  When no modelled
order fits with a likely seed, the result says "no modelled order with a likely seed fits" and the
job is served exactly as without a seed (the reactive policy): a list the script shuffled itself,
or a seed outside the likely ones, costs about a second of CPU, not the whole range
.RB ( "seed_discovery.range_orders: all"
searches every order over the whole range).  The reason says what decides the order and what to
write.  accelerate's default sampler and torchdata's RandomSampler draw their order from a 64\-bit
seed taken from the global RNG, out of any search's reach: write the seed seerfs.yaml(5) names for
them (WHICH SEED TO WRITE).
.PP
The
.B discovery
section of the status shows what was found (or why not), from how many opens, with which
false\-match chance, after how many candidates and seconds;
.B seed_discovery
in
.BR seerfs.yaml (5)
turns the search off or changes its range.  What it cannot find (write the seed instead):
.IP \(bu 2
a DataLoader that shuffles without a generator
.RB ( shuffle=True ", " generator=None )
draws a fresh 64\-bit seed from the global RNG every epoch: not searchable (and not predictable:
pass it a seeded generator and write that seed);
.IP \(bu 2
a seed outside the range (a random 64\-bit one, say) is not found, and the job is cached reactively,
as without a seed: write it, or raise
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
        ".PP",
        "A mount with the metrics on any free port, and a scrape of the URL its status names:",
        ".PP",
        ".nf",
        esc("seerfs mount /lustre/imagenet /tmp/imagenet -c seerfs.yaml -o metrics.enabled=true,metrics.port=0"),
        esc(
            "curl -s \"$(python3 -c 'import json; "
            'print(json.load(open("/tmp/imagenet/.control/status"))["metrics"]["url"])\')"'
        ),
        ".fi",
        ".SH SEE ALSO",
        ".BR seerfs (1),",
        ".BR seerfs.yaml (5)",
    ]
    return "\n".join(out) + "\n"


TOOLS = (
    "bench/train",
    "bench/ceiling",
    "bench/nodes",
    "bench/prefetch",
    "bench/mount",
    "bench/plan",
    "bench/streams",
    "bench/seedsearch",
    "bench/tiers",
    "bench/peers",
    "bench/pfsemu",
    "simulate",
    "pfsemu",
    "mkdataset",
    "genman",
)
"""The programs under tools/ that take options, by path under tools/ (tools/demo passes its own to bench/train)."""

PACKAGES = frozenset({"pfsemu"})
"""Tools that are a package directory, not a launcher script: they run as ``python3 tools/NAME``."""


def tool_command(name: str) -> str:
    """How seerfs-tools(7) shows ``name`` being run from the repository root."""
    return f"python3 tools/{name}" if name.split()[0] in PACKAGES else f"tools/{name}"


def tool_parsers() -> dict[str, argparse.ArgumentParser]:
    """Each tool's parser, and each subcommand's as "tool sub": what --help and seerfs-tools(7) show."""
    import importlib

    out: dict[str, argparse.ArgumentParser] = {}
    for name in TOOLS:
        parser: argparse.ArgumentParser = importlib.import_module("tools." + name.replace("/", ".")).build_parser()
        out[name] = parser
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub, p in action.choices.items():
                    out[f"{name} {sub}"] = p
    return out


def description_lines(text: str | None) -> list[str]:
    """A parser's whole description (what --help prints above the options) as roff: paragraphs of
    prose filled, indented lines (tables, example commands) kept as they are."""
    out: list[str] = []
    for para in textwrap.dedent(text or "").strip().split("\n\n"):
        lines = para.splitlines()
        i = 0
        while i < len(lines):
            indented = lines[i].startswith(" ")
            j = i
            while j < len(lines) and lines[j].startswith(" ") == indented:
                j += 1
            if indented:
                out += [".nf", *[esc(line) for line in lines[i:j]], ".fi"]
            else:
                out.append(esc(" ".join(" ".join(lines[i:j]).split())))
            i = j
        out.append(".PP")
    return out[:-1]


TOOLS_HEAD = r"""
.SH NAME
seerfs\-tools \- the benchmarks, emulator and generators under tools/ in the seerfs repository
.SH DESCRIPTION
Every program runs from the repository root as
.BI tools/ NAME
(the emulator, a package directory, as
.BR "python3 tools/pfsemu" )
and uses the project's .venv when it exists (tools/setup makes it).  Each program's
.B \-\-help
prints the text of its section below; tools/RESULTS.md has each benchmark's current table and the
exact command, tools/results/ the earlier runs and the raw outputs.  The programs without options of their own:
.TP
.B tools/demo [BENCH_TRAIN OPTIONS]
The README's demo: tools/setup, then tools/bench/train at a small size (about 1.5 minutes once set
up; the first run's setup adds about 6): the lower bound, the PFS directly, copy\-then\-train
staging, rclone, seerfs without a seed and seerfs with the seed, then the seeded mount's
.B seerfs status
and a verdict line.  At this size only the PFS\-bytes targets are judged; the timing targets, set
for bench_train's default sizes, are shown without a verdict.  Any bench_train option given to it
overrides the demo's sizes.
.TP
.B tools/setup
Installs what the project needs on a Debian machine (apt packages, .venv with the package and its
extras, the dependency wheels in .whl/); idempotent.
.TP
.B tools/run-tests [PYTEST ARGUMENTS]
What CI runs: tools/setup, ruff, mypy, tools/genman \-\-check, then pytest without the slow tests
(CONTRIBUTING.md).
.TP
.B tools/slurm/prolog\fR, \fBtools/slurm/epilog
Mount for a job from a root Slurm prolog and unmount in the epilog (seerfs(1), SLURM); their
comments say how to install them.
"""
"""The head of seerfs-tools(7): how the programs run, and those that take no options of their own."""


def seerfs_tools_7() -> str:
    out = [f'.TH SEERFS\\-TOOLS 7 "{DATE}" "seerfs {__version__}" "Miscellaneous"', *_roff(TOOLS_HEAD)]
    for name, p in tool_parsers().items():
        usage = " ".join(p.format_usage().strip().removeprefix("usage: ").split())
        out += [".SH " + esc("tools/" + name), ".nf", esc(tool_command(usage)), ".fi"]
        if p.description:
            out += [".PP", *description_lines(p.description)]
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
    p = argparse.ArgumentParser(
        prog="genman",
        description="Regenerate man/seerfs.1, seerfs.yaml.5, seerfs-control.7 and seerfs-tools.7 from the parsers, "
        "the config schema and the status types (tests/test_docs.py fails when a committed page is stale).",
    )
    p.add_argument("--check", action="store_true", help="exit 1 if a committed page is stale, write nothing")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    stale = []
    for path, make in ((MAN / name, make) for name, make in PAGES.items()):
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
