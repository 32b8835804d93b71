"""A dataset file's bytes on their way to a reader: choosing the source at open, the fetcher (tiers,
in flight, peer, PFS), the PFS reader, the staging window, the prefetcher and the read counters.
"""
