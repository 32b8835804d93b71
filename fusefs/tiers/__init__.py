"""Local storage tiers of the daemon: a memory tier and directory tiers with hard byte budgets.

The prefetcher and the read path use tiers through the :class:`Tier` protocol; ``build_tiers``
makes them from ``config.tiers`` (fastest first).  Memory tiers charge one shared
:class:`Budget`, which the page-cache staging window charges too.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path

from fusefs.config import TierConfig
from fusefs.errors import ConfigError
from fusefs.tiers.base import Tier, TierCounters
from fusefs.tiers.budget import Budget
from fusefs.tiers.digest import BLOCK, BlockDigests, block_count
from fusefs.tiers.directory import NAME_BYTES, DirectoryTier
from fusefs.tiers.layout import disk_usage
from fusefs.tiers.memory import MEMORY_ENTRY_OVERHEAD, MemoryTier

__all__ = [
    "BLOCK",
    "MEMORY_ENTRY_OVERHEAD",
    "NAME_BYTES",
    "BlockDigests",
    "Budget",
    "DirectoryTier",
    "MemoryTier",
    "Tier",
    "TierCounters",
    "block_count",
    "build_tiers",
    "disk_usage",
    "memory_budget",
    "tier_path",
]


def memory_budget(cfg_tiers: Sequence[TierConfig], reclaim: Callable[[int], int] | None = None) -> Budget:
    """The RAM budget: the bytes of all memory tiers (staging charges it as well); ``reclaim``: as
    :class:`Budget` takes it."""
    return Budget(sum(t.bytes for t in cfg_tiers if t.kind == "memory"), "memory", reclaim)


def tier_path(cfg: TierConfig, cache_dir: Path) -> Path:
    """A directory tier's path (:meth:`fusefs.config.TierConfig.directory`)."""
    return cfg.directory(cache_dir)


def build_tiers(
    cfg_tiers: Sequence[TierConfig],
    memory_budget: Budget,
    fingerprint: str,
    cache_dir: Path,
    on_drop: Callable[[int, int], None] | None = None,
) -> list[Tier]:
    """Open every configured tier (directory tiers resume warm when ``fingerprint`` matches);
    ``on_drop``: told (entry, tier index) of every copy a tier forgets (the policy's port).

    Raises ConfigError (one line) when a directory cannot be used; nothing stays open then.
    """
    paths: dict[Path, int] = {}
    for i, cfg in enumerate(cfg_tiers):
        if cfg.kind != "directory":
            continue
        real = Path(os.path.realpath(tier_path(cfg, cache_dir)))
        for other, j in paths.items():
            if real == other or real in other.parents or other in real.parents:
                raise ConfigError(f"tiers.{i}.path: {real} overlaps tiers.{j}.path ({other})")
        paths[real] = i
    tiers: list[Tier] = []
    try:
        for i, cfg in enumerate(cfg_tiers):
            if cfg.kind == "memory":
                tiers.append(MemoryTier(i, memory_budget, cfg.threads, on_drop=on_drop))
            else:
                path = tier_path(cfg, cache_dir)
                tiers.append(DirectoryTier(i, path, cfg.bytes, cfg.threads, fingerprint, on_drop=on_drop))
    except BaseException:
        for t in tiers:
            if isinstance(t, DirectoryTier):
                t.abandon()
        raise
    return tiers
