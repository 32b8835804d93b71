"""The source tree's metadata: the walker and the numpy-column snapshot every lookup is served from,
and the ID spaces (entry, inode).
"""
