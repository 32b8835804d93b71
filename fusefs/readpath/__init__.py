"""A dataset file's bytes on their way to a reader: choosing the source at open, the fetcher (tiers,
in flight, peer, PFS), the PFS reader, the staging window's kernel calls, the read counters, and
prefetching: its decisions in :mod:`.policy` (pure), their execution in :mod:`.prefetch`.
"""
