"""Test-private ``sitecustomize`` for timm's real ``train.py`` (tests/test_clients_timm_train.py).

This directory is on ``PYTHONPATH`` only for that test's torchrun.  Python imports ``sitecustomize``
at start-up, before the script's first line; in a torchrun rank (``RANK`` set) of a run whose
harness set ``SEERFS_TIMM_TRAIN_OUT``, it installs :mod:`timm_train_hooks` (one CPU adaptation of
train.py's DDP call, and the harness's observation of bytes and epochs).  Anywhere else it does
nothing.
"""

import os
import sys

if os.environ.get("SEERFS_TIMM_TRAIN_OUT") and "RANK" in os.environ:
    sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/clients
    import timm_train_hooks

    timm_train_hooks.install()
