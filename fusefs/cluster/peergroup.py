"""The running group: serving our cached files to peers, fetching theirs, keeping seeds in step.

* Serving: a peer asks by (dataset, index, plan digest); we answer from our local tiers only (never
  the PFS): ok, not-yet (we are fetching it), not-owned, or bad-request (another plan, or an index
  outside the snapshot).  No path ever comes from the wire.
* Fetching: a file this node does not hold is asked of its owner (the plan's primary owner).  The
  owner is the one node that reads it from the PFS: when asked for a file it is meant to hold but
  has not fetched yet (its fill is behind, or it is in flight), it fetches it now and answers once
  it has it, within the peer timeout.  So the PFS is read once per file, in epoch 0 too, whoever
  reads it first.  Any non-answer falls back to the PFS at once; a peer that stops answering is
  marked down by its client and skipped until a probe finds it back.
* State: every couple of seconds each daemon tells every peer its training node (detected from
  opens: torchrun hands out node ranks in any order), its plan digest and its seed, and learns
  theirs.  A seed written on any node reaches all: the highest (generation, writer) wins.

Concurrency rules: everything here runs on the trio thread; the notes handler is synchronous (it
only reads and updates small dicts), and fetches are bounded by the peer client's own deadline.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

import trio

from fusefs.cluster.formation import Group, Rendezvous
from fusefs.cluster.peer_client import PeerClient, PeerDown
from fusefs.cluster.peer_server import PeerServer, Provision
from fusefs.config import Config
from fusefs.planning.seed import SeedState
from fusefs.readpath.counters import ReadCounters
from fusefs.readpath.fetcher import Fetcher
from fusefs.readpath.prefetch import Prefetcher
from fusefs.readpath.staging import Staging

log = logging.getLogger(__name__)

STATE_INTERVAL = 2.0  # seconds between state notes to each peer


@dataclass
class PeerView:
    """What a peer last told us."""

    node: int | None = None
    plan: str | None = None
    plan_seed: int | None = None  # the seed that plan was made for
    seed: tuple[int, int, int] | None = None  # value, generation, writer
    heard: float = 0.0


class PeerGroup:
    def __init__(
        self,
        group: Group,
        cfg: Config,
        prefetcher: Prefetcher,
        fetcher: Fetcher,
        staging: Staging,
        seed: SeedState,
        counters: ReadCounters,
        rendezvous: Rendezvous | None = None,
    ) -> None:
        self.group = group
        self.cfg = cfg
        self.prefetcher = prefetcher
        self.fetcher = fetcher
        self.staging = staging
        self.seed = seed
        self.counters = counters
        self.rendezvous = rendezvous
        self.server = PeerServer(group.token, self.provide, notes=self.on_note)
        self.clients: dict[int, PeerClient] = {}
        self.views: dict[int, PeerView] = {}
        self.digest_mismatch: dict[int, str] = {}
        # Answer before the asker gives up: it then still has time for its PFS fallback.
        self.answer_within = max(0.05, cfg.peers.timeout * 0.8)
        self._sync_clients()
        seed.me = group.me
        seed.listeners.append(self._seed_changed)
        fetcher.peer_fetch = self.fetch

    def _sync_clients(self) -> None:
        p = self.cfg.peers
        for m in self.group.members:
            if m.index == self.group.me or m.index in self.clients:
                continue
            self.clients[m.index] = PeerClient(
                m.index,
                m.host,
                m.port,
                self.group.token,
                timeout=p.timeout,
                max_requests=p.max_requests,
                down_after=p.down_after,
                retry_down_after=p.retry_down_after,
            )
            self.views.setdefault(m.index, PeerView())

    # ------------------------------------------------------------------ serving

    async def provide(self, dataset: int, index: int, digest: bytes) -> Provision:
        plan = self.prefetcher.plan
        if plan is None:
            return Provision("not_yet", reason="no plan yet")
        if digest != bytes.fromhex(plan.digest):
            return Provision("bad_request", reason=f"plan digest mismatch (this node plans {plan.digest})")
        if not 0 <= dataset < len(plan.catalogs) or not 0 <= index < len(plan.catalogs[dataset]):
            return Provision("bad_request", reason=f"no file {index} in dataset {dataset}")
        entry = int(plan.entry_of(int(plan.offsets[dataset]) + index))
        local = await self.fetcher.from_tiers(entry)
        if local is not None:
            return Provision("ok", local.data)
        staged = self.staging.files.get(entry)
        if staged is not None and staged.data is not None:
            return Provision("ok", staged.data)
        job = self.fetcher.inflight.get(entry)
        if job is None:
            tier = self.prefetcher.planned_tier_for(entry)
            if tier is None:
                return Provision("not_owned")
            job = self.fetcher.start(entry, keep_in=tier, use_peer=False, why="peer")  # the owner reads the PFS
        with trio.move_on_after(self.answer_within):
            try:
                return Provision("ok", await job.wait())
            except Exception as exc:  # the asker falls back to the PFS and meets the same error there
                return Provision("not_yet", reason=f"fetch failed: {exc}")
        return Provision("not_yet", reason="still fetching")

    # ------------------------------------------------------------------ fetching

    def member_of(self, node: int) -> int | None:
        for member, view in self.views.items():
            if view.node == node:
                return member
        return None

    async def fetch(self, entry: int) -> bytes | None:
        """The entry from its owner, or None: go to the PFS now (never waits past the peer timeout)."""
        plan, view = self.prefetcher.plan, self.prefetcher.view
        if plan is None or not self.clients or view.node is None:
            return None
        gid = int(self.prefetcher.entry_gid[entry]) if entry < self.prefetcher.entry_gid.shape[0] else -1
        if gid < 0:
            return None
        owner = int(plan.owner()[gid])
        if owner < 0 or owner == view.node:
            return None
        member = self.member_of(owner)
        if member is None:
            return None
        client = self.clients.get(member)
        if client is None or self.views[member].plan != plan.digest:
            return None
        dataset, index = plan.dataset_of(gid)
        try:
            return await client.fetch(
                dataset, index, bytes.fromhex(plan.digest), expect_size=int(self.fetcher.snapshot.tree.size[entry])
            )
        except PeerDown:
            return None

    # ------------------------------------------------------------------ state and seeds

    def my_note(self) -> bytes:
        plan = self.prefetcher.plan
        seed = self.seed
        return json.dumps(
            {
                "m": self.group.me,
                # Also the presumed node: peers can ask before our first opens confirm it (a wrong guess
                # only costs them a not-owned answer and a PFS read).
                "node": self.prefetcher.view.node if self.prefetcher.view.state in ("tracking", "presumed") else None,
                "plan": plan.digest if plan is not None else None,
                "plan_seed": plan.seed if plan is not None else None,
                "seed": [seed.value, seed.generation, seed.writer] if seed.origin != "assumed" else None,
            }
        ).encode()

    def on_note(self, body: bytes) -> bytes:
        self._absorb(body)
        return self.my_note()

    def _absorb(self, body: bytes) -> None:
        try:
            note = json.loads(body)
            member = int(note["m"])
        except (ValueError, KeyError, TypeError):
            log.warning("ignored a malformed peer note")
            return
        view = self.views.setdefault(member, PeerView())
        view.node = note.get("node") if isinstance(note.get("node"), int) else None
        view.plan = note.get("plan")
        view.heard = trio.current_time()
        seed = note.get("seed")
        if isinstance(seed, list) and len(seed) == 3:
            view.seed = (int(seed[0]), int(seed[1]), int(seed[2]))
            self.seed.set(view.seed[0], "peer", generation=view.seed[1], writer=view.seed[2])
        plan_seed = note.get("plan_seed")
        view.plan_seed = plan_seed if isinstance(plan_seed, int) else None
        mine = self.prefetcher.plan
        # Digests are comparable only between plans for the same seed: right after a new seed, a
        # peer still serving its previous plan is behind, not configured differently.
        if (
            mine is not None
            and view.plan is not None
            and view.plan != mine.digest
            and view.plan_seed == mine.seed == self.seed.value
        ):
            if member not in self.digest_mismatch:
                log.error(
                    "peer %d plans %s for the same seed, this node %s: config or dataset differ",
                    member,
                    view.plan,
                    mine.digest,
                )
            self.digest_mismatch[member] = view.plan
        else:
            self.digest_mismatch.pop(member, None)

    def _seed_changed(self, seed: SeedState) -> None:
        if seed.origin == "written" and self._nursery is not None:
            self._nursery.start_soon(self._tell_all)  # spread it now, not at the next state round

    async def _tell_all(self) -> None:
        async with trio.open_nursery() as nursery:
            for member, client in list(self.clients.items()):
                nursery.start_soon(self._tell, member, client)

    async def _tell(self, member: int, client: PeerClient) -> None:
        try:
            answer = await client.note(self.my_note())
        except PeerDown:
            return
        if answer:
            self._absorb(answer)

    _nursery: trio.Nursery | None = None

    async def run(self, sock: Any) -> None:
        """Serve the data port, keep state in step, and (rendezvous) follow who joins."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            await nursery.start(self._serve, sock)
            while True:
                if self.rendezvous is not None and self.rendezvous.scan():
                    self._sync_clients()
                await self._tell_all()
                await trio.sleep(STATE_INTERVAL)

    async def _serve(self, sock: Any, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        host = self.group.members[self.group.me].host
        await self.server.serve(host, 0, sock=sock, task_status=task_status)

    async def close(self) -> None:
        for client in self.clients.values():
            await client.aclose()
        if self.rendezvous is not None:
            self.rendezvous.leave()

    def status(self) -> dict[str, Any]:
        members = []
        for m in self.group.members:
            entry: dict[str, Any] = {"index": m.index, "address": f"{m.host}:{m.port}", "label": m.label}
            if m.index == self.group.me:
                entry.update(state="self", node=self.prefetcher.view.node)
            else:
                view = self.views.get(m.index, PeerView())
                client = self.clients.get(m.index)
                entry.update(node=view.node, plan=view.plan, plan_mismatch=m.index in self.digest_mismatch)
                if client is not None:
                    entry.update(client.status())
                    entry["node"] = view.node
            members.append(entry)
        return {
            **self.group.status(),
            "members": members,
            "server": self.server.status(),
            "plan_mismatches": sorted(self.digest_mismatch),
        }
