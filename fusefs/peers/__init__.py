"""The data plane between seerfs daemons: an authenticated, framed TCP protocol over trio streams.

A daemon serves files from its local tiers with :class:`PeerServer` (asked only by dataset, file
index and plan digest) and fetches from each other daemon through one :class:`PeerClient`, which
bounds every fetch by the peer timeout and marks a peer that stops answering down (DESIGN 3,
seed 002: a dead or hung node never stops the others).  :mod:`.protocol` documents the wire format.
"""

from __future__ import annotations

from .client import PeerClient, PeerCounters, PeerDown, Received
from .protocol import DEFAULT_MAX_FILE_SIZE, MAX_BLOCK_SIZE, VERSION, ProtocolError, Status
from .server import PeerServer, Provider, Provision, ProvisionStatus

__all__ = [
    "DEFAULT_MAX_FILE_SIZE",
    "MAX_BLOCK_SIZE",
    "VERSION",
    "PeerClient",
    "PeerCounters",
    "PeerDown",
    "PeerServer",
    "ProtocolError",
    "Provider",
    "Provision",
    "ProvisionStatus",
    "Received",
    "Status",
]
