"""What to keep when the access stream cannot be predicted (no seed, wrong seed, unmodelled sampler).

Plain LRU is the wrong answer for epoch-wise shuffles: the files read at the end of one epoch are
evicted just before the next epoch wants them (Lee and Bahn, "A Study on Improvement of Buffer Cache
Performance for File I/O in Deep Learning", JIIBC 2024; ``tools/simulate --lru-trace`` shows it).
Without clairvoyance every file's next read is equally likely to come anywhere in the next epoch,
so *any* fixed set of files gives the same hit rate (capacity / dataset) and churning only costs
fetches.  The policy:

* admit a file on its first read while a tier has room (fastest tier first);
* once full, keep the set static: a newcomer replaces the resident with the fewest reads only when
  it leads it by at least two reads.  Mid-epoch, counts differ by one merely by where in the epoch
  each file fell, so a lead of one would churn at every epoch; real frequency differences (a node
  reads a Binomial(E, 1/N) share of each file, NoPFS 3.1) grow past that.  The victim is the
  resident whose next use is estimated furthest away: fewest reads, then the most recently read
  (just consumed, so not needed again this epoch).
* a resident the caller pins (``on_read``'s ``pinned``) never makes way: in a group, a copy this
  node read from the PFS may be the group's only one (fusefs/readpath/policy.py).

Pure bookkeeping: the daemon performs the decisions.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Decision:
    tier: int | None  # admit into this tier, or None
    evict: tuple[tuple[int, int], ...] = ()  # (tier, entry) to drop first


@dataclass
class _Tier:
    capacity: int
    used: int = 0
    members: dict[int, int] = field(default_factory=dict)  # entry -> size
    by_reads: dict[int, set[int]] = field(default_factory=dict)  # read count -> members with it

    def add(self, entry: int, size: int, reads: int) -> None:
        self.members[entry] = size
        self.used += size
        self.by_reads.setdefault(reads, set()).add(entry)

    def remove(self, entry: int, reads: int) -> None:
        self.used -= self.members.pop(entry)
        self._unbucket(entry, reads)

    def reread(self, entry: int, old: int) -> None:
        self._unbucket(entry, old)
        self.by_reads.setdefault(old + 1, set()).add(entry)

    def _unbucket(self, entry: int, reads: int) -> None:
        bucket = self.by_reads[reads]
        bucket.discard(entry)
        if not bucket:
            del self.by_reads[reads]


class StaticFrequencySet:
    def __init__(self, capacities: list[int]) -> None:
        self.tiers = [_Tier(c) for c in capacities]
        self.reads: dict[int, int] = {}
        self.last_read: dict[int, int] = {}
        self.clock = 0
        self.where: dict[int, int] = {}  # entry -> tier

    def on_read(self, entry: int, size: int, pinned: Callable[[int], bool] | None = None) -> Decision:
        """A read of ``entry``: admit it, or not; ``pinned`` residents are never chosen to make way."""
        self.clock += 1
        old = self.reads.get(entry, 0)
        self.reads[entry] = old + 1
        self.last_read[entry] = self.clock
        if entry in self.where:
            self.tiers[self.where[entry]].reread(entry, old)
            return Decision(None)
        for t, tier in enumerate(self.tiers):
            if tier.used + size <= tier.capacity:
                return Decision(t)
        return self._replace(entry, size, pinned)

    def _replace(self, entry: int, size: int, pinned: Callable[[int], bool] | None) -> Decision:
        count = self.reads[entry]
        for t in range(len(self.tiers) - 1, -1, -1):  # displace from the slowest tier first
            tier = self.tiers[t]
            if size > tier.capacity:
                continue
            freed, chosen = tier.capacity - tier.used, []
            for reads in sorted(tier.by_reads):
                if reads + 1 >= count or freed >= size:
                    break  # only residents two reads behind make way (see the module docstring)
                # Furthest estimated next use first: the most recently read of the least read.
                for victim in sorted(tier.by_reads[reads], key=lambda e: -self.last_read.get(e, 0)):
                    if freed >= size:
                        break
                    if pinned is not None and pinned(victim):
                        continue
                    chosen.append(victim)
                    freed += tier.members[victim]
            if freed >= size and chosen:
                return Decision(t, tuple((t, v) for v in chosen))
        return Decision(None)

    def admitted(self, entry: int, tier: int, size: int) -> None:
        """The daemon stored ``entry`` in ``tier``."""
        self.tiers[tier].add(entry, size, self.reads.get(entry, 0))
        self.where[entry] = tier

    def dropped(self, entry: int) -> None:
        t = self.where.pop(entry, None)
        if t is not None:
            self.tiers[t].remove(entry, self.reads.get(entry, 0))
