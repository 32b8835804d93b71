"""The kernel-facing layer: pyfuse3 Operations (kept thin), entry attributes and the hidden
``.control`` directory.  Handlers delegate to :mod:`fusefs.readpath` and never block.
"""
