"""The benchmarks: each prints a table of ratios side by side in one run and judges its targets.

Each runs as ``tools/bench/NAME`` (a launcher) or ``python -m tools.bench.NAME``; seerfs-tools(7)
lists their options and tools/RESULTS.md their current figures.  ``floorfs`` (the least a pyfuse3
filesystem does, the reference row), ``procstat`` and ``options`` are shared by the benchmarks only.
"""
