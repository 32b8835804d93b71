"""The running group: serving our cached files to peers, keeping state and seeds in step.

Fetching from peers is the client half's (:mod:`fusefs.cluster.peerclients`), built before the
read path whose fetcher asks through it; this serving half is built after the read path, with its
fetcher, executor and staging, and with the client half, whose views it updates as notes arrive.

* Serving: a peer asks by (dataset, index, plan digest); we answer from our local tiers only (never
  the PFS): ok, not-yet (we are fetching it), not-owned, or bad-request (another plan, or an index
  outside the snapshot).  No path ever comes from the wire.
* State: every couple of seconds each daemon tells every peer its training node (detected from
  opens: torchrun hands out node ranks in any order), its plan digest and its seed, and learns
  theirs.  A seed written on any node reaches all: the highest (generation, writer) wins.  A write
  outranks a seed discovered under the same seed (the generation's parity is the origin:
  :func:`fusefs.planning.seed.next_generation`), so a write wins over a search result that raced
  it, whatever the node indices, and the note needs no field for the origin.  A peer's note is
  input like any other: every field is checked as local input would be (a seed in torch's range,
  a node of this job, a hex digest...), and a note that fails is logged (rate-limited), counted and
  ignored whole.
* Membership: peers are told apart by their member key (label, host, port), never by their index
  in the group (:mod:`fusefs.cluster.peerclients`).  A member that left is dropped, one that joins
  (a restarted daemon, at its old address or a new one) gets a fresh client and is asked for its
  files as soon as it tells us its node and plan.

Concurrency rules: everything here runs on the trio thread; the notes handler is synchronous (it
only reads and updates small dicts), and fetches are bounded by the peer client's own deadline.
Rendezvous directory reads run in a worker thread (a shared filesystem can be slow) and are
applied on the trio thread.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from typing import Annotated, Any, Literal, TypedDict

import trio

from fusefs.cluster.formation import Group, GroupStatus, Member, Rendezvous
from fusefs.cluster.peer_client import PeerClient, PeerDown, PeerLinkStatus
from fusefs.cluster.peer_server import PeerServer, Provision, ServerStatus
from fusefs.cluster.peerclients import MemberKey, PeerClients, PeerView
from fusefs.cluster.protocol import FileId, Get
from fusefs.config import Config
from fusefs.planning.seed import SeedState, valid_seed
from fusefs.readpath.counters import ReadCounters
from fusefs.readpath.fetcher import Fetcher, Sources
from fusefs.readpath.prefetch import Prefetcher
from fusefs.readpath.staging import Staging
from placement.owners import member_seed
from placement.statusfields import counter, gauge, info, state, text
from placement.tree import KIND_FILE

log = logging.getLogger(__name__)

STATE_INTERVAL = 2.0  # seconds between state notes to each peer
_NOTE_KEYS = frozenset({"l", "a", "node", "plan", "plan_seed", "seed"})
_HEX = re.compile(r"[0-9a-f]{1,128}")
_LABEL = re.compile(r"[\x21-\x7e]{1,255}")
_MAX_GENERATION = (1 << 62) - 1
_MAX_WRITER = (1 << 31) - 1
_LOG_FIRST = 10
_LOG_EVERY = 1000


class BadNote(ValueError):
    """A peer's note that this daemon would not accept as local input."""


@dataclass(frozen=True)
class StateNote:
    """A peer's state note, every field checked."""

    label: str
    address: str
    node: int | None
    plan: str | None
    plan_seed: int | None
    seed: tuple[int, int, int] | None  # value, generation, writer


def _int(value: object) -> bool:
    return type(value) is int  # not bool, not float


def parse_note(body: bytes, nodes: int) -> StateNote:
    """Check a peer's note like local input: the seed as .control/seed would, the node against this
    job's node count, the digest as hex, the sender as a printable label and a host:port."""
    try:
        note = json.loads(body)
    except (ValueError, RecursionError) as exc:  # RecursionError: deeply nested JSON
        raise BadNote(f"not JSON ({type(exc).__name__})") from None
    if not isinstance(note, dict):
        raise BadNote("not a JSON object")
    if set(note) != _NOTE_KEYS:
        raise BadNote(f"fields {sorted(map(str, note))[:8]}, expected {sorted(_NOTE_KEYS)}")
    label, address = note["l"], note["a"]
    if not isinstance(label, str) or not _LABEL.fullmatch(label):
        raise BadNote("label is not printable text of 1..255 characters")
    host, sep, port = address.rpartition(":") if isinstance(address, str) else ("", "", "")
    if not sep or not host or len(address) > 300 or not port.isdigit() or not 0 < int(port) <= 65535:
        raise BadNote(f"address {str(address)[:40]!r} is not host:port")
    node = note["node"]
    if node is not None and not (_int(node) and 0 <= node < nodes):
        raise BadNote(f"node {str(node)[:40]} is outside this job's 0..{nodes - 1}")
    plan = note["plan"]
    if plan is not None and not (isinstance(plan, str) and _HEX.fullmatch(plan)):
        raise BadNote("plan digest is not hex")
    plan_seed = note["plan_seed"]
    if plan_seed is not None and not valid_seed(plan_seed):
        raise BadNote(f"plan seed {str(plan_seed)[:40]} is outside torch's range")
    seed = note["seed"]
    if seed is not None:
        if not (isinstance(seed, list) and len(seed) == 3):
            raise BadNote("seed is not [value, generation, writer]")
        value, generation, writer = seed
        if not valid_seed(value):
            raise BadNote(f"seed {str(value)[:40]} is outside torch's range [-2**63, 2**64-1]")
        if not (_int(generation) and 1 <= generation <= _MAX_GENERATION):
            raise BadNote(f"seed generation {str(generation)[:40]} is out of range")
        if not (_int(writer) and 0 <= writer <= _MAX_WRITER):
            raise BadNote(f"seed writer {str(writer)[:40]} is out of range")
        seed = (value, generation, writer)
    return StateNote(label, address, node, plan, plan_seed, seed)


class _Member(TypedDict):
    index: Annotated[int, text("its index in the group (indices shift as members come and go)")]
    address: Annotated[str, info("its data address host:port (the one this node's client talks to)")]
    label: Annotated[str, text("hostname-pid-nonce: one daemon's lifetime; the peer label of its metrics")]


class SelfMemberStatus(_Member):
    """This daemon's own entry:"""

    state: Annotated[Literal["self"], state("self")]
    node: Annotated[int | None, gauge("the training node this node serves, detected from opens (null: not yet)")]


class PeerMemberStatus(_Member, PeerLinkStatus):
    """Every other member's entry:"""

    node: Annotated[int | None, gauge("the training node it announced (null: not yet)")]
    plan: Annotated[str | None, info("the digest of its current plan, or null")]
    plan_mismatch: Annotated[bool, gauge("its plan differs from this node's for the same seed")]


class PeeredGroupStatus(GroupStatus):
    """With peers (mpi, rendezvous or static discovery), also:"""

    members: Annotated[
        list[SelfMemberStatus | PeerMemberStatus],
        text(
            "per member; members are told apart by label and address, never by index",
            label="peer",
            key="label",
            metric="peer",
        ),
    ]
    server: Annotated[ServerStatus, text("the data port this node serves its peers on")]
    plan_mismatches: Annotated[list[int], text("indices of members planning differently for the same seed")]
    notes_refused: Annotated[
        int, counter("peer state notes ignored because a field failed the checks local input gets")
    ]
    notes_unknown: Annotated[int, counter("notes from no current member")]
    held_asks: Annotated[
        int,
        counter(
            "requests, just before a PFS read, for a copy a member may hold from an earlier regime (a plan "
            "followed before, or the group rule): that member read the file from the PFS then"
        ),
    ]
    held_hits: Annotated[int, counter("of those, answered with the file: PFS reads saved")]
    last_bad_note: Annotated[str | None, text("why the last note was ignored, or null")]
    removed_stale: Annotated[
        list[str],
        text(
            "labels of rendezvous entries this daemon removed as stale when it joined: entries of its own "
            "host whose port refused connections or was its own (a predecessor that crashed)"
        ),
    ]


class PeerGroup:
    def __init__(
        self,
        group: Group,
        cfg: Config,
        peers: PeerClients,
        prefetcher: Prefetcher,
        fetcher: Fetcher,
        staging: Staging,
        seed: SeedState,
        counters: ReadCounters,
        rendezvous: Rendezvous | None = None,
    ) -> None:
        """``peers``: the client half, built before the read path (its fetcher asks through it)."""
        self.group = group
        self.cfg = cfg
        self.peers = peers
        self.prefetcher = prefetcher
        self.fetcher = fetcher
        self.staging = staging
        self.seed = seed
        self.counters = counters
        self.rendezvous = rendezvous
        p = cfg.peers
        self.server = PeerServer(
            group.token,
            self.provide,
            notes=self.on_note,
            max_connections=p.server_connections,
            memory=int(p.server_memory),
            connection_memory=int(p.server_connection_memory),
            # A member's client gives up a whole request (connect and handshake included) after
            # peers.timeout: a connection still unauthenticated by then is nobody's we wait for.
            handshake_timeout=max(1.0, p.timeout),
        )
        self.nodes = max(1, cfg.job.world_size // cfg.job.ranks_per_node)
        self.notes_refused = 0
        self.notes_unknown = 0  # well-formed notes from no current member (not yet scanned, or gone)
        self._telling_down: set[MemberKey] = set()  # down members a note is on its way to (_tell_all)
        self.last_bad_note = ""
        # Answer before the asker gives up: it then still has time for its PFS fallback.
        self.answer_within = max(0.05, cfg.peers.timeout * 0.8)
        self._rescan = False
        self._woken = trio.Event()  # the note may be due early: the view changed, or a rescan is asked
        self._group_changed()

    @property
    def me(self) -> Member:
        return self.group.members[self.group.me]

    def _group_changed(self) -> None:
        """The seed's writer index and the policy follow the member list (the clients follow it in
        PeerClients.sync: at their construction, and before this on each change)."""
        self.seed.me = self.group.me
        # The group rule's owners follow the members (a hash over their keys: order does not matter).
        seeds = tuple(member_seed("{}@{}:{}".format(*m.key)) for m in self.group.members)
        self.prefetcher.group_changed(seeds, self.group.me)

    # ------------------------------------------------------------------ serving

    def identity(self, entry: int) -> FileId:
        """This node's snapshot identity of ``entry``: what a peer request and reply name."""
        return self.peers.identity(entry)

    async def provide(self, get: Get) -> Provision:
        if not get.digest:
            return await self._provide_file(get)
        dataset, index = get.dataset, get.index
        plan = self.prefetcher.plan
        if plan is None:
            return Provision("not_yet", reason="no plan yet")
        if get.digest != bytes.fromhex(plan.digest):
            # The asker saw this node announce a plan it has since replaced (a seed written or found
            # here a moment ago; the asker learns it from the next note): not a bad request.  The
            # index means nothing here now, the file's identity still does: answered from a copy
            # held now, or at once not at all (the asker goes on to other holders, then the PFS).
            # Not waiting for a PFS read under way: the asker's whole window comes at the switch,
            # and waiting on this node's reads timed its requests out and marked this node down.
            return await self._provide_file(get, held_only=True, wait=False)
        if not 0 <= dataset < len(plan.catalogs) or not 0 <= index < len(plan.catalogs[dataset]):
            return Provision("bad_request", reason=f"no file {index} in dataset {dataset}")
        entry = int(plan.entry_of(int(plan.offsets[dataset]) + index))
        if not 0 <= entry < len(self.fetcher.snapshot.tree):
            return Provision("mismatch", reason=f"index {index} maps to no entry here ({entry})")
        mine = self.identity(entry)
        if mine != get.file:  # checked before any byte is read: a damaged plan refuses, never serves
            return Provision("mismatch", reason=f"index {index} is {mine} here", file=mine)
        return await self._answer(entry, mine, by_plan=True)

    async def _provide_file(self, get: Get, *, held_only: bool = False, wait: bool = True) -> Provision:
        """A request naming the file alone (an asker following the group rule, or asking for a copy
        held from an earlier regime): its snapshot identity must be this node's for that entry, a
        regular file, before anything is read.  ``held_only``: as if the request said so;
        ``wait``: False answers from copies held now only (see :meth:`_answer`)."""
        entry = get.file.entry
        tree = self.fetcher.snapshot.tree
        if not 0 <= entry < len(tree) or int(tree.kind[entry]) != KIND_FILE:
            return Provision("bad_request", reason=f"entry {entry} is no file here")
        mine = self.identity(entry)
        if mine != get.file:
            return Provision("mismatch", reason=f"entry {entry} is {mine} here", file=mine)
        return await self._answer(entry, mine, by_plan=False, held_only=held_only or get.held_only, wait=wait)

    async def _answer(
        self, entry: int, mine: FileId, by_plan: bool, held_only: bool = False, wait: bool = True
    ) -> Provision:
        """A local copy (tiers, staged bytes, pages in the page cache), a fetch in flight, or (as the
        file's one owner, the policy decides) a PFS read now.  ``held_only``: never start a read,
        and wait only for one that reads the PFS already (a fetch waiting on peers may be waiting
        on the asker: see protocol.HELD_ONLY); with ``wait`` False, not even for that."""
        local = await self.fetcher.from_tiers(entry)
        if local is not None:
            return Provision("ok", local.data, file=mine)
        staged = self.staging.files.get(entry)
        if staged is not None and staged.data is not None:
            return Provision("ok", staged.data, file=mine)
        pages = await self.fetcher.from_pages(entry)
        if pages is not None:
            return Provision("ok", pages, file=mine)
        job = self.fetcher.joinable(entry) or self.fetcher.inflight.get(entry)
        if held_only and (job is None or not job.reading_pfs or not wait):
            return Provision("not_owned", reason="not held here")
        if job is None:
            read = self.prefetcher.peer_asked(entry, mine.size, by_plan)
            if read is None:
                return Provision("not_owned")
            keep = None if read.keep_in is None else self.fetcher.tiers[read.keep_in]
            # The owner reads the PFS; keeping no copy, it remembers the bytes a moment (fetcher.py).
            job = self.fetcher.start(entry, Sources.PAGES | Sources.PFS, keep, why="peer", remember=keep is None)
        with trio.move_on_after(self.answer_within):
            try:
                return Provision("ok", await job.wait(), file=mine)
            except Exception as exc:  # the asker falls back to the PFS and meets the same error there
                return Provision("not_yet", reason=f"fetch failed: {exc}")
        return Provision("not_yet", reason="still fetching")

    # ------------------------------------------------------------------ state and seeds

    def _announced(self) -> tuple[str | None, int | None]:
        """This node's plan digest and training node as its note tells them (the node also while only
        presumed: peers can ask before our first opens confirm it, and a wrong guess only costs them a
        not-owned answer and a PFS read).  Peers must learn a change at once (see :meth:`run`)."""
        plan, view = self.prefetcher.plan, self.prefetcher.view
        node = view.node if view.state in ("tracking", "presumed") else None
        return (plan.digest if plan is not None else None, node)

    def my_note(self) -> bytes:
        plan = self.prefetcher.plan
        seed = self.seed
        me = self.me
        digest, node = self._announced()
        if digest is not None and node is not None:
            self.peers.plan_node(digest, node, me.key)
        return json.dumps(
            {
                "l": me.label,
                "a": me.address,
                "node": node,
                "plan": digest,
                "plan_seed": plan.seed if plan is not None else None,
                "seed": [seed.value, seed.generation, seed.writer] if seed.origin != "assumed" else None,
            }
        ).encode()

    def on_note(self, body: bytes) -> bytes:
        self._absorb(body, None)
        return self.my_note()

    def _refuse_note(self, why: str) -> None:
        self.notes_refused += 1
        self.last_bad_note = why
        if self.notes_refused <= _LOG_FIRST or self.notes_refused % _LOG_EVERY == 0:
            log.warning("ignored a peer note: %s (%d ignored so far)", why, self.notes_refused)

    def _absorb(self, body: bytes, expect: MemberKey | None) -> None:
        """Take in a peer's note; ``expect``: the member we asked (its answer must come from it)."""
        try:
            note = parse_note(body, self.nodes)
        except BadNote as exc:
            self._refuse_note(str(exc))
            return
        host, _, port = note.address.rpartition(":")
        key = (note.label, host, int(port))
        if expect is not None and key != expect:
            # The address we asked is answered by another daemon: the entry we hold is stale.
            self._refuse_note(f"{expect[1]}:{expect[2]} answered as {note.label} at {note.address}")
            self._rescan = self.rendezvous is not None
            self.wake()
            return
        view = self.peers.views.get(key)
        client = self.peers.clients.get(key)
        if view is None or client is None:
            self.notes_unknown += 1
            self._rescan = self.rendezvous is not None  # one we have not scanned yet: look again soon
            self.wake()
            return
        client.heard_from()
        view.node = note.node
        view.plan = note.plan
        if note.plan is not None and note.node is not None:
            self.peers.plan_node(note.plan, note.node, key)
        view.plan_seed = note.plan_seed
        view.heard = trio.current_time()
        if note.seed is not None:
            view.seed = note.seed
            # By (generation, writer) alone: next_generation already ranks a write above a discovery it raced.
            self.seed.set(note.seed[0], "peer", generation=note.seed[1], writer=note.seed[2])
        mine = self.prefetcher.plan
        # Digests are comparable only between plans for the same seed: right after a new seed, a
        # peer still serving its previous plan is behind, not configured differently.
        if (
            mine is not None
            and view.plan is not None
            and view.plan != mine.digest
            and view.plan_seed == mine.seed == self.seed.value
        ):
            if key not in self.peers.digest_mismatch:
                log.error(
                    "peer %s plans %s for the same seed, this node %s: config or dataset differ",
                    note.label,
                    view.plan,
                    mine.digest,
                )
            self.peers.digest_mismatch[key] = view.plan
        else:
            self.peers.digest_mismatch.pop(key, None)

    def wake(self) -> None:
        """The view changed (the read path's ``on_view_change`` hook): the note may be due early."""
        self._woken.set()

    def seed_changed(self, seed: SeedState) -> None:
        """A seed adopted (one of ``SeedState.listeners``, through the daemon): spread it now."""
        if seed.origin in ("written", "discovered") and self._nursery is not None:
            self._nursery.start_soon(self._tell_all)  # spread it now, not at the next state round

    async def _tell_all(self) -> None:
        """Tell every member this node's state.  A member marked down is told too (an answered note
        marks it up: PeerClient.note), but in the background, one note at a time: a hung one must
        not hold up this round's notes to the others."""
        async with trio.open_nursery() as nursery:
            for key, client in list(self.peers.clients.items()):
                if client.state != "down":
                    nursery.start_soon(self._tell, key, client)
                elif key not in self._telling_down and self._nursery is not None:
                    self._telling_down.add(key)
                    self._nursery.start_soon(self._tell_down, key, client)

    async def _tell_down(self, key: MemberKey, client: PeerClient) -> None:
        try:
            await self._tell(key, client)
        finally:
            self._telling_down.discard(key)

    async def _tell(self, key: MemberKey, client: PeerClient) -> None:
        try:
            answer = await client.note(self.my_note())
        except PeerDown:
            return
        if answer and self.peers.clients.get(key) is client:  # still a member when the answer came
            self._absorb(answer, key)

    _nursery: trio.Nursery | None = None

    async def run(self, sock: Any) -> None:
        """Serve the data port, keep state in step, and (rendezvous) follow who joins."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            await nursery.start(self._serve, sock)
            while True:
                self._rescan = False
                if self.rendezvous is not None:
                    await self._follow_rendezvous(self.rendezvous)
                told = self._announced()
                await self._tell_all()
                with trio.move_on_after(STATE_INTERVAL):
                    rescan_from = trio.current_time() + 0.5  # at most two rescans a second, however many notes ask
                    while True:
                        # Woken, not polled (a poll every 0.1 s cost each daemon 10 timer wakeups a
                        # second, all job long): by the prefetcher when its view changed, or by a note
                        # from an unknown member.
                        await self._woken.wait()
                        self._woken = trio.Event()
                        # A new plan or training node here: tell the peers now, not at the next round.
                        # Until they know, they cannot ask this node as the plan's owner and read the
                        # PFS themselves (two nodes read 1.1-1.2x the dataset in the second after a
                        # plan change).
                        if self._announced() != told:
                            break
                        if self._rescan:  # a note from an unknown member
                            await trio.sleep_until(rescan_from)
                            break

    async def _follow_rendezvous(self, rendezvous: Rendezvous) -> None:
        """Re-read the directory (in a worker thread: a shared filesystem can be slow), follow it."""
        entries = await trio.to_thread.run_sync(rendezvous.read)
        if rendezvous.apply(entries):
            self.peers.sync()
            self._group_changed()
            log.info(
                "group now: %s (this daemon is member %d)",
                ", ".join(f"{m.label}@{m.address}" for m in self.group.members),
                self.group.me,
            )

    async def _serve(self, sock: Any, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        host = self.group.members[self.group.me].host
        await self.server.serve(host, 0, sock=sock, task_status=task_status)

    async def close(self) -> None:
        for client in self.peers.clients.values():
            await client.aclose()
        if self.rendezvous is not None:
            self.rendezvous.leave()

    def status(self) -> PeeredGroupStatus:
        members: list[SelfMemberStatus | PeerMemberStatus] = []
        mismatched = []
        for i, m in enumerate(self.group.members):
            if i == self.group.me:
                members.append(
                    {
                        "index": i,
                        "address": m.address,
                        "label": m.label,
                        "state": "self",
                        "node": self.prefetcher.view.node,
                    }
                )
                continue
            client = self.peers.clients.get(m.key)
            if client is None:  # clients follow the member list on this thread (PeerClients.sync): never
                continue
            view = self.peers.views.get(m.key, PeerView())
            if m.key in self.peers.digest_mismatch:
                mismatched.append(i)
            members.append(
                {
                    "index": i,
                    "address": m.address,  # the member's, and so its client's
                    "label": m.label,
                    "node": view.node,
                    "plan": view.plan,
                    "plan_mismatch": m.key in self.peers.digest_mismatch,
                    **client.status(),
                }
            )
        return {
            **self.group.status(),
            "members": members,
            "server": self.server.status(),
            "plan_mismatches": mismatched,
            "notes_refused": self.notes_refused,
            "notes_unknown": self.notes_unknown,
            "held_asks": self.peers.held_asks,
            "held_hits": self.peers.held_hits,
            "last_bad_note": self.last_bad_note or None,
            "removed_stale": list(self.rendezvous.removed) if self.rendezvous is not None else [],
        }
