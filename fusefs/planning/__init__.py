"""The daemon's side of planning: the plan inputs every caller shares, the plan worker subprocess,
plan persistence, the plan manager and the sampler seed.  The planning itself is :mod:`placement`.
"""
