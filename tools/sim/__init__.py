"""NoPFS-style I/O simulator (NoPFS section 6) on placement's performance model and planner.

Modules: :mod:`tools.sim.system` (the machine, the four scenarios and their scaling),
:mod:`tools.sim.engine` (the staging-buffer pipeline and PFS contention),
:mod:`tools.sim.policies` (where each policy reads each sample from),
:mod:`tools.sim.trace` (LRU under shuffling: cache hit rates on an epoch-wise shuffled trace),
:mod:`tools.sim.report` (table, JSON, PNG).  The command line is ``tools/simulate``.
"""
