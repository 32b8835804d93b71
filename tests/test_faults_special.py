"""Special files in place of source files after the walk: a UNIX socket and a character device (the
FIFO case is in test_integrity_source.py).  The snapshot says regular file; a read must fail with
EIO at once (never block, never serve the device's bytes) and the daemon keep serving the rest."""

from __future__ import annotations

import os
import socket
import stat
from pathlib import Path

import pytest
from faults import procs
from faults.manifest import check_mount
from mounting import mounted, status
from test_faults_between_mounts import make_tree

pytestmark = [pytest.mark.mount, pytest.mark.faults]


def test_a_socket_or_device_in_place_of_a_source_file_reads_as_eio_and_never_blocks(tmp_path: Path) -> None:
    src, cfg, manifest = make_tree(tmp_path)
    rels = sorted(manifest.files)
    sock_rel, dev_rel, fine = rels[0], rels[1], rels[2]
    with mounted(src, tmp_path / "mnt", "-c", str(cfg)) as mnt:
        (src / sock_rel).unlink()
        server = socket.socket(socket.AF_UNIX)
        server.bind(str(src / sock_rel))
        (src / dev_rel).unlink()
        os.mknod(src / dev_rel, stat.S_IFCHR | 0o644, os.makedev(1, 5))  # /dev/zero: endless zeros
        try:
            got = {rel: procs.bounded_read(mnt / rel, 5) for rel in (sock_rel, dev_rel)}
        finally:
            server.close()
        report = check_mount(mnt, manifest, [fine])
        doc = status(mnt)
    for rel, outcome in got.items():
        assert outcome.state == "error" and outcome.error == "EIO", (rel, outcome.state, outcome.error, outcome.wchan)
    assert report.ok == [fine], report.summary()
    assert set(doc["reads"]["stale_files"]) >= {sock_rel, dev_rel}, doc["reads"]["stale_files"]
