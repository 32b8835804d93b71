"""Several seerfs daemons on this machine, each with its own mountpoint, cache and loopback address
(127.0.0.k+1), grouped through a rendezvous directory; any one can be killed and mounted again."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tools.harness.mounts import force_unmount, is_mounted, seerfs, status


@dataclass
class Nodes:
    source: Path
    work: Path
    n: int
    peers: dict[str, Any]
    sections: dict[str, Any] = field(default_factory=dict)  # top-level config sections, every node

    @property
    def rendezvous(self) -> Path:
        return self.work / "rendezvous"

    def dir(self, k: int) -> Path:
        return self.work / f"node{k}"

    def mnt(self, k: int) -> Path:
        return self.dir(k) / "mnt"

    def cache(self, k: int) -> Path:
        return self.dir(k) / "cache"

    def tier(self, k: int) -> Path:
        return self.dir(k) / "tier"

    @property
    def mnts(self) -> list[Path]:
        return [self.mnt(k) for k in range(self.n)]

    def host(self, k: int) -> str:
        """The loopback address node k binds its data port to."""
        return f"127.0.0.{k + 1}"

    def config(self, k: int) -> Path:
        """Node k's config: the same on every node but for paths and the bind address."""
        sections = yaml.safe_load(yaml.safe_dump(self.sections).replace("@TIER@", str(self.tier(k))))
        cfg = {
            "cache_dir": str(self.cache(k)),
            "datasets": [{"root": "train"}],
            "peers": {
                "discovery": "rendezvous",
                "rendezvous_dir": str(self.rendezvous),
                "expect": self.n,
                "bind": self.host(k),
                **self.peers,
            },
            **sections,
        }
        path = self.dir(k) / "seerfs.yaml"
        path.write_text(yaml.safe_dump(cfg))
        return path

    def mount(self, k: int) -> Path:
        self.mnt(k).mkdir(parents=True, exist_ok=True)
        seerfs("mount", str(self.source), str(self.mnt(k)), "-c", str(self.config(k)), check=True)
        return self.mnt(k)

    def wait(self, k: int, timeout: float = 60) -> None:
        seerfs("wait", str(self.mnt(k)), "--timeout", str(timeout), check=True, timeout=timeout + 30)

    def umount(self, k: int) -> None:
        if is_mounted(self.mnt(k)):
            seerfs("umount", str(self.mnt(k)), timeout=60)
        force_unmount(self.mnt(k))

    @contextlib.contextmanager
    def running(self) -> Iterator[list[Path]]:
        """Every node mounted and its group formed for the block; all unmounted after, in any case."""
        try:
            for k in range(self.n):
                self.mount(k)
            for k in range(self.n):
                self.wait(k)
            yield self.mnts
        finally:
            for k in range(self.n):
                self.umount(k)

    def self_address(self, k: int) -> tuple[str, str]:
        """(label, data address) node k announces for itself."""
        doc = status(self.mnt(k))["group"]
        me = next(m for m in doc["members"] if m.get("state") == "self")
        return str(me["label"]), f"{self.host(k)}:{doc['server']['port']}"


def members(mnt: Path) -> list[dict[str, Any]]:
    return list(status(mnt)["group"]["members"])
