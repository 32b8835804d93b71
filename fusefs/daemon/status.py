"""The ``.control/status`` document: sections contributed by each component, in a fixed order.

Field names and units are documented in seerfs-control(7); components add sections, never rename.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from fusefs import __version__

Section = Callable[[], dict[str, Any]]


class StatusBoard:
    def __init__(self, source: str, mountpoint: str) -> None:
        self.source = source
        self.mountpoint = mountpoint
        self.started = time.time()
        self.state = "starting"
        self.sections: dict[str, Section] = {}

    def add(self, name: str, section: Section) -> None:
        self.sections[name] = section

    def __call__(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "version": __version__,
            "state": self.state,
            "pid": os.getpid(),
            "source": self.source,
            "mountpoint": self.mountpoint,
            "started_at": round(self.started, 3),
            "uptime_s": round(time.time() - self.started, 3),
        }
        for name, section in self.sections.items():
            doc[name] = section()
        return doc
