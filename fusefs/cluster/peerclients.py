"""The group's client half: a client per member, what each last told us, and fetching from them.

Built before the read path (its fetcher asks peers through it) with nothing of the read path but
the policy's port: the executor that drives it hands itself in on each fetch (``owners``) to say
who owns a file now, and the clients' health goes back through the port.  The serving half
(:class:`fusefs.cluster.peergroup.PeerGroup`, built after the read path) updates the views as
notes arrive and asks for :meth:`PeerClients.sync` when the member list changed.

* Fetching: a file this node does not hold is asked of its owner.  The owner is the one node that
  reads it from the PFS: when asked for a file it is meant to hold but has not fetched yet (its
  fill is behind, or it is in flight), it fetches it now and answers once it has it, within the
  peer timeout.  So the PFS is read once per file, in epoch 0 too, whoever reads it first.  While
  this node predicts, the owner is the plan's primary owner (a training node) and the request
  names the plan; otherwise (no trusted seed, a wrong one, a sampler the planner does not model)
  it is the group rule's owner (:mod:`placement.owners`: a hash of the entry over the members,
  the same on every node without any plan) and the request names the file alone (its snapshot
  identity, which every member shares).  Any non-answer falls back to the PFS at once; a peer
  that stops answering is marked down by its client and skipped until a probe finds it back, and
  the read policy is told (its fills skip a down owner's files until it is up again).
* Membership: peers are told apart by their member key (label, host, port), never by their index
  in the group, which shifts as members come and go (rendezvous).  Clients and views follow the
  member list by key, so a client always talks to the address of the member it is shown with.
  Requests for a training node go to the member that answers for it: up, and heard from last.

Concurrency rules: everything here runs on the trio thread; fetches are bounded by the peer
client's own deadline.  A client's health change (a fetch's or a note's outcome) is reported
through the port between awaits, never inside a policy step (no step awaits), so it is one step
of its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

from fusefs.cluster.formation import Group, Member
from fusefs.cluster.peer_client import PeerClient, PeerDown, PeerState
from fusefs.cluster.protocol import FileId
from fusefs.config import Config
from fusefs.meta.snapshot import Snapshot
from fusefs.readpath import contract
from fusefs.readpath.policy import Holder, RuleHolder
from fusefs.readpath.port import PolicyPort
from fusefs.readpath.prefetch import Prefetcher

_PLANS_REMEMBERED = 8  # plans whose training-node -> member map is kept (for the holders of past plans)

MemberKey = tuple[str, str, int]


@dataclass
class PeerView:
    """What a peer last told us."""

    node: int | None = None
    plan: str | None = None
    plan_seed: int | None = None  # the seed that plan was made for
    seed: tuple[int, int, int] | None = None  # value, generation, writer
    heard: float = 0.0


class PeerClients:
    def __init__(self, group: Group, cfg: Config, snapshot: Snapshot, port: PolicyPort) -> None:
        """``port``: the policy's port, told when a client marks its member down or up again."""
        self.group = group
        self.cfg = cfg
        self.snapshot = snapshot
        self.port = port
        self.clients: dict[MemberKey, PeerClient] = {}
        self.views: dict[MemberKey, PeerView] = {}
        self.digest_mismatch: dict[MemberKey, str] = {}
        self.held_asks = 0
        self.held_hits = 0
        self._plan_nodes: dict[str, dict[int, MemberKey]] = {}  # plan digest -> training node -> member
        self.sync()

    @property
    def me(self) -> Member:
        return self.group.members[self.group.me]

    def sync(self) -> None:
        """Make clients and views follow the member list, by key (see the module docstring)."""
        p = self.cfg.peers
        wanted = {m.key: m for i, m in enumerate(self.group.members) if i != self.group.me}
        for key in [k for k in self.clients if k not in wanted]:
            self.clients.pop(key).close_now()
            self.views.pop(key, None)
            self.digest_mismatch.pop(key, None)
        for key, m in wanted.items():
            client = self.clients.get(key)
            if client is None:
                self.clients[key] = PeerClient(
                    m.index,
                    m.host,
                    m.port,
                    self.group.token,
                    timeout=p.timeout,
                    max_requests=p.max_requests,
                    down_after=p.down_after,
                    retry_down_after=p.retry_down_after,
                    on_state=partial(self._health, key),  # by key: the client keeps it while the index shifts
                )
                self.views[key] = PeerView()
            else:
                client.node = m.index  # its index may have shifted; the address never does

    def _health(self, key: MemberKey, state: PeerState) -> None:
        """A client marked its peer down or found it up again: the policy's fills follow (by training node)."""
        view = self.views.get(key)
        if view is None or view.node is None:
            return
        self.port.report(contract.PeerDown(view.node) if state == "down" else contract.PeerUp(view.node))

    def identity(self, entry: int) -> FileId:
        """This node's snapshot identity of ``entry``: what a peer request and reply name."""
        tree = self.snapshot.tree
        return FileId(entry, int(tree.size[entry]), int(tree.mtime_ns[entry]))

    def member_of(self, node: int) -> MemberKey | None:
        """The member answering for training node ``node``: up before down, then heard from last
        (a dead member's stale view must never win over its restarted successor's)."""
        best: tuple[bool, float] | None = None
        chosen: MemberKey | None = None
        for key, view in self.views.items():
            client = self.clients.get(key)
            if view.node != node or client is None:
                continue
            rank = (client.state == "up", view.heard)
            if best is None or rank > best:
                best, chosen = rank, key
        return chosen

    async def fetch(self, entry: int, *, owner: bool, holders: bool, owners: Prefetcher) -> bytes | None:
        """The entry from a peer, or None: read the PFS now (never waits past the peer timeout per ask).

        ``owner``: ask its current owner, which reads it from the PFS if it does not hold it: the
        plan's owner while this node predicts, the group rule's otherwise (module docstring).
        ``holders``: then, this node being about to read the PFS itself, ask each member that may
        hold a copy from an earlier regime for a copy it holds now
        (:meth:`~fusefs.readpath.policy.ReadPolicy.holders`): a regime change never costs a second
        PFS read of a file some member still holds.  ``owners``: the executor asking, whose plan,
        view and policy say who that owner and those members are now."""
        if not self.clients:
            return None
        asked: MemberKey | None = None
        if owner:
            target = self._owner_request(entry, owners)
            if target is not None:
                asked, dataset, index, digest = target
                data = await self._ask(asked, entry, dataset, index, digest)
                if data is not None:
                    return data
        if holders:
            return await self._from_holders(entry, asked, owners)
        return None

    def _owner_request(self, entry: int, owners: Prefetcher) -> tuple[MemberKey, int, int, bytes] | None:
        """The member to ask for ``entry`` as its owner now, with the request's dataset, index and
        plan digest (0, 0, empty: a request naming the file alone, by the group rule); None when
        this node is the owner.

        While this node predicts, the plan's owner, when that member announces this plan; a plan
        owner this node is, reads it itself.  A plan owner not (yet) on this plan is in another
        regime: it planned later (a seed found or written a moment ago), or its readers refuted the
        plan.  It then follows the group rule, and so does this request: both nodes name the same
        reader, the rule's owner, and the file is read once."""
        plan, view = owners.plan, owners.view
        if owners.mode == "predicting" and plan is not None and view.node is not None:
            gid = int(owners.entry_gid[entry]) if entry < owners.entry_gid.shape[0] else -1
            node = int(plan.owner()[gid]) if gid >= 0 else -1
            if node == view.node:
                return None
            key = self.member_of(node) if node >= 0 else None
            if key is not None and self.views[key].plan == plan.digest:
                dataset, index = plan.dataset_of(gid)
                return key, dataset, index, bytes.fromhex(plan.digest)
        member = owners.reactive_owner(entry)
        members = self.group.members
        if member is None or not 0 <= member < len(members) or member == self.group.me:
            return None
        return members[member].key, 0, 0, b""

    async def _ask(
        self, key: MemberKey, entry: int, dataset: int, index: int, digest: bytes, *, held_only: bool = False
    ) -> bytes | None:
        client = self.clients.get(key)
        if client is None:
            return None
        try:
            return await client.fetch(dataset, index, digest, self.identity(entry), held_only=held_only)
        except PeerDown:
            return None

    async def _from_holders(self, entry: int, asked: MemberKey | None, owners: Prefetcher) -> bytes | None:
        """A copy of ``entry`` from a member that may hold it from an earlier regime, or None."""
        tried = {self.me.key}
        if asked is not None:
            tried.add(asked)
        for hint in owners.holders(entry):
            key = self._holder_key(hint)
            if key is None or key in tried:
                continue
            tried.add(key)
            client = self.clients.get(key)
            if client is None or client.state == "down":
                continue
            self.held_asks += 1
            data = await self._ask(key, entry, 0, 0, b"", held_only=True)
            if data is not None:
                self.held_hits += 1
                return data
        return None

    def _holder_key(self, hint: Holder) -> MemberKey | None:
        if isinstance(hint, RuleHolder):
            members = self.group.members
            return members[hint.member].key if 0 <= hint.member < len(members) else None
        return self._plan_nodes.get(hint.digest, {}).get(hint.node)

    def plan_node(self, digest: str, node: int, key: MemberKey) -> None:
        """Remember that ``key`` was training node ``node`` under plan ``digest`` (for :meth:`_holder_key`:
        a member keeps what it read under a plan after it stopped announcing that plan)."""
        nodes = self._plan_nodes.pop(digest, None) or {}
        nodes[node] = key
        self._plan_nodes[digest] = nodes  # most recent last
        while len(self._plan_nodes) > _PLANS_REMEMBERED:
            del self._plan_nodes[next(iter(self._plan_nodes))]
