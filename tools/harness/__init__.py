"""What tests and benchmarks share to drive seerfs for real: mounts and their teardown (``mounts``),
jobs of reader ranks over a mount (``jobs``, ``train_reader``), groups of daemons as nodes
(``nodes``), torchvision on the CPU-only torch wheel (``torchvision_cpu``) and ``quantiles``.

Not fakes: everything here runs the real daemon, the real kernel mount and real readers.
"""
