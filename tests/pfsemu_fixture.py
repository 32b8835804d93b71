"""An emulated contended PFS for tests: ``emulated_pfs`` fixture and ``running_pfsemu`` context manager.

Tests that need a shared slow filesystem underneath (seerfs over a "PFS", end-to-end, multi-node,
"the PFS was read once") start tools/pfsemu over a directory and read PFS traffic from the
emulator's own counters, never from seerfs::

    from pfsemu_fixture import emulated_pfs, requires_fuse, running_pfsemu  # noqa: F401  (fixture)

    def test_x(emulated_pfs):  # noqa: F811  (serves an empty dir: fill emulated_pfs.backing first)
        (emulated_pfs.backing / "a").write_bytes(b"x" * 10)
        emulated_pfs.reset()
        data = (emulated_pfs.mountpoint / "a").read_bytes()
        assert emulated_pfs.counters().files["a"].bytes == 10

    with running_pfsemu(src, curve="1:200", open_latency_ms=0) as emu:   # own parameters
        ... emu.mountpoint ..., emu.counters().bytes, emu.counters().pids[pid]

The API (all defined in the package tools/pfsemu/, documented there):

* ``running_pfsemu(backing, mountpoint=None, *, curve=None, open_latency_ms=None,
  read_latency_ms=None, meta_latency_ms=None, active_window_ms=None, extra_args=(),
  ready_timeout_s=20.0) -> ContextManager[RunningEmulator]``: starts ``pfsemu serve --fg`` on a
  fresh mountpoint, waits (with a deadline) until it is mounted and answers, and always stops and
  unmounts it (SIGTERM, then ``fusermount3 -u -z``, then SIGKILL) on exit.
* ``RunningEmulator``: ``.backing``, ``.mountpoint``, ``.control`` (socket path), ``.process``,
  ``.client`` (:class:`PfsemuClient`), ``.counters(files=True) -> PfsStats``,
  ``.reset() -> PfsStats`` (counters before zeroing), ``.log_text()``.
* ``PfsStats``: ``opens``, ``reads``, ``bytes``, ``open_errors``, ``meta_ops``,
  ``files: {relpath: Counts}``, ``pids: {tgid: (comm, Counts)}``, ``comms: {comm: Counts}``,
  ``reads_by_gamma``, ``active_readers``, ``open_handles``, ``cpu_s``, ``config``,
  ``describe_config()``, ``raw``.  ``Counts`` has ``opens``, ``reads``, ``bytes``.
* ``PfsemuClient(control_socket)``: the same ``stats()``/``reset()`` for an emulator started
  elsewhere (e.g. by ``tools/pfsemu serve``).

Files are served with direct_io, so every byte a reader gets is counted exactly once.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tools.pfsemu import Counts, PfsemuClient, PfsStats, RunningEmulator, fuse_unavailable_reason
from tools.pfsemu import running as running_pfsemu

__all__ = [
    "Counts",
    "PfsStats",
    "PfsemuClient",
    "RunningEmulator",
    "emulated_pfs",
    "requires_fuse",
    "running_pfsemu",
]

_REASON = fuse_unavailable_reason()

requires_fuse = pytest.mark.skipif(_REASON is not None, reason=f"needs FUSE: {_REASON}")


@pytest.fixture
def emulated_pfs(tmp_path: Path) -> Iterator[RunningEmulator]:
    """An emulator with the default parameters serving the empty directory ``tmp_path/"pfs"``."""
    if _REASON is not None:
        pytest.skip(f"needs FUSE: {_REASON}")
    backing = tmp_path / "pfs"
    backing.mkdir()
    with running_pfsemu(backing) as emu:
        yield emu
