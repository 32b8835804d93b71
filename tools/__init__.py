"""Programs around seerfs, by role.

- ``bench/``: the benchmarks (``tools/bench/NAME``), their figures in RESULTS.md and results/;
- ``pfsemu/``: the emulated contended PFS that tests and benchmarks read through;
- ``harness/``: what tests and benchmarks share to mount, run jobs and form groups of nodes;
- ``slurm/``: the prolog and epilog a site installs;
- ``demo``, ``setup``, ``run-tests``, ``genman``, ``mkdataset`` (dataset generator), ``simulate`` and
  ``sim/`` (the NoPFS-style simulator): the rest, at the top.
"""
