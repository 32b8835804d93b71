"""Pure planning for seerfs: catalog, PyTorch sampler models, access streams, tiers, ownership, model.

Nothing here does I/O, uses trio or imports ``fusefs``: the inputs are plain arrays
(:class:`placement.tree.TreeArrays`) and a plain config mapping.
"""
