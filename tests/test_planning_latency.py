"""The FUSE loop stays responsive while the daemon plans ImageNet-1k scale (1.28M files, 90 epochs).

Slow: it makes a 1,281,000-file tree (hard links, ~20 s), walks it at mount and plans twice
(~25 s each on 2 cores).  Run with ``tools/run-tests -m slow``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tools.bench.prefetch import planning_latency

pytestmark = [pytest.mark.slow, pytest.mark.mount]


def test_p99_open_latency_while_planning_a_1_28m_file_catalog(tmp_path: Path) -> None:
    result = planning_latency(Path("/var/tmp/seerfs-bench-1281167"), tmp_path / "cache", tmp_path)
    assert result["opens"] > 1000, result
    assert result["p99_ms"] < 20.0, result
