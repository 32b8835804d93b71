"""Import torchvision on a CPU-only torch: the one place that works around its missing C extension.

torchvision 0.28's wheel ships a CUDA-built ``_C`` extension that cannot load against the CPU torch
2.13 wheel; at import it then registers fake kernels for ``torchvision::nms``/``qnms`` and fails
because the ops were never defined.  Defining the two op schemas first lets the import succeed;
ImageFolder and the datasets are pure Python and run unchanged.  Tests, the demo and benchmarks all
import torchvision through :func:`load`.
"""

from __future__ import annotations

import importlib
import types
from typing import Any

_LIBRARY: Any = None


def load() -> types.ModuleType:
    """Return the ``torchvision`` module, defining the missing ops once per process."""
    global _LIBRARY
    import torch

    if _LIBRARY is None:
        library: Any = torch.library  # torch.library is untyped
        try:
            lib = library.Library("torchvision", "DEF")
            lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
            lib.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
            _LIBRARY = lib
        except RuntimeError:
            # Already defined (torchvision's own extension loaded, or another copy of this module).
            _LIBRARY = False
    return importlib.import_module("torchvision")


def image_folder(root: str, **kwargs: Any) -> Any:
    """``torchvision.datasets.ImageFolder(root, **kwargs)`` via :func:`load`."""
    return load().datasets.ImageFolder(root, **kwargs)
