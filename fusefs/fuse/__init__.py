"""The kernel-facing layer: the FUSE handlers (kept thin, binding-free), the front seam and the pyfuse3
front, entry attributes and the hidden ``.control`` directory.  Handlers delegate to
:mod:`fusefs.readpath` and never block.
"""
