"""Seed precedence: which seed a group of daemons settles on when a write and a discovery race.

Pure: :class:`SeedState` objects stand for the daemons, and a note between them is what
``PeerGroup.my_note`` sends and ``PeerGroup._absorb`` does with it (``[value, generation, writer]``,
checked by ``parse_note``, then ``SeedState.set(value, "peer", generation, writer)``).  The rule
under test: a seed written on any node after a search began wins over that search's result, on
every node, whatever the node indices; the result still replaces the seed it was searching under.
"""

from __future__ import annotations

import json

import pytest

from fusefs.cluster.peergroup import parse_note
from fusefs.planning.seed import SeedState


def group(n: int) -> list[SeedState]:
    return [SeedState(me=k) for k in range(n)]


def tell(src: SeedState, dst: SeedState) -> None:
    """One state note from ``src`` to ``dst``, through the wire format and its checks."""
    if src.origin == "assumed":
        return
    seed = [src.value, src.generation, src.writer]
    body = json.dumps({"l": "n", "a": "h:1", "node": None, "plan": None, "plan_seed": None, "seed": seed})
    got = parse_note(body.encode(), nodes=3).seed
    assert got is not None
    dst.set(got[0], "peer", generation=got[1], writer=got[2])


def settle(nodes: list[SeedState]) -> None:
    """Every node tells every other, twice over: what two state rounds do."""
    for _ in range(2):
        for src in nodes:
            for dst in nodes:
                if src is not dst:
                    tell(src, dst)


def held(nodes: list[SeedState]) -> list[tuple[int, str]]:
    return [(s.value, s.origin) for s in nodes]


@pytest.mark.parametrize(("writer", "finder"), [(0, 2), (2, 0), (1, 2)])
@pytest.mark.parametrize("before", [None, 99], ids=["nothing-written-before", "a-wrong-seed-written-before"])
def test_a_write_wins_over_a_search_result_that_had_not_heard_of_it(
    writer: int, finder: int, before: int | None
) -> None:
    """The race: every node holds the same seed (the sampler default, or
    99 written on node 1); node ``finder`` searches under it.  Node ``writer`` writes 17; before
    17's note reaches the finder, its search ends and it adopts 5 as discovered and spreads it.
    Whatever the node indices, the group settles on 17: the write came after the search began."""
    nodes = group(3)
    if before is not None:
        nodes[1].set(before, "written")
        settle(nodes)
    nodes[writer].set(17, "written")
    nodes[finder].set(5, "discovered")  # its search never heard of 17
    settle(nodes)
    assert held(nodes) == [(17, "written" if k == writer else "peer") for k in range(3)]


def test_a_discovered_seed_still_replaces_the_seed_it_was_searched_under_on_every_node() -> None:
    """Writes win only over results of searches that began before them: a match found because the
    written 99 does not fit the opens replaces 99 everywhere, whoever wrote 99."""
    for wrote, found in ((0, 2), (2, 0)):
        nodes = group(3)
        nodes[wrote].set(99, "written")
        settle(nodes)
        nodes[found].set(5, "discovered")
        settle(nodes)
        assert held(nodes) == [(5, "discovered" if k == found else "peer") for k in range(3)]


def test_a_write_made_after_hearing_of_a_discovered_seed_replaces_it() -> None:
    """A later write wins over a discovered seed on every node, as it does on the node that found it."""
    nodes = group(3)
    nodes[2].set(5, "discovered")
    settle(nodes)
    nodes[0].set(17, "written")
    settle(nodes)
    assert held(nodes) == [(17, "written"), (17, "peer"), (17, "peer")]


def test_a_search_result_is_adopted_only_under_the_seed_it_searched_for() -> None:
    """The finding node itself: a search asked for under one seed (generation, writer) finishes after
    a newer seed arrived (written here, or a peer's note): its result is refused and the newer seed
    stays; under an unchanged seed it is adopted."""
    here = SeedState(me=1)
    here.set(99, "written")
    since = here.version()
    here.set(17, "peer", generation=here.generation + 1, writer=0)
    assert not here.set(5, "discovered", since=since)
    assert (here.value, here.origin) == (17, "peer")
    here.set(18, "written")
    assert not here.set(5, "discovered", since=since)
    assert (here.value, here.origin) == (18, "written")
    assert here.set(5, "discovered", since=here.version())
    assert (here.value, here.origin) == (5, "discovered")


def test_rewriting_the_same_value_elsewhere_is_still_one_seed() -> None:
    """Concurrent writes (no discovery) still settle on one (value, generation) everywhere."""
    nodes = group(3)
    nodes[1].set(21, "written")
    settle(nodes)
    nodes[0].set(30, "written")
    nodes[2].set(31, "written")
    settle(nodes)
    assert len({(s.value, s.generation, s.writer) for s in nodes}) == 1
    assert nodes[0].value == 31  # same round: the higher writer index decides, as before
