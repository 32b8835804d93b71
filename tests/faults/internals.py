"""Every import of seerfs internals the fault suite needs, in one place.

The fault suite drives seerfs through its CLI and the filesystem; the few things it must take from
the product (the peer wire format, to speak it with a real token, and the directory tier's file
layout, to damage one cached copy) are imported here only, so a move of the product's modules
changes this file and nothing else.
"""

from __future__ import annotations

from pathlib import Path

from fusefs.cluster.auth import client_proof, new_nonce
from fusefs.cluster.protocol import (
    CHALLENGE_LEN,
    FRAME_HEADER,
    MAX_BLOCK_SIZE,
    VERDICT_LEN,
    VERSION,
    Challenge,
    Hello,
    Kind,
    Note,
    Reply,
    decode_message,
    frame_header,
    parse_frame_header,
)
from fusefs.tiers.layout import file_path

__all__ = [
    "CHALLENGE_LEN",
    "FRAME_HEADER",
    "MAX_BLOCK_SIZE",
    "VERDICT_LEN",
    "VERSION",
    "Challenge",
    "Hello",
    "Kind",
    "Note",
    "Reply",
    "client_proof",
    "decode_message",
    "frame_header",
    "new_nonce",
    "parse_frame_header",
    "tier_file",
]


def tier_file(tier_dir: Path, entry: int) -> Path:
    """Where a directory tier keeps its copy of snapshot entry ``entry``."""
    return Path(file_path(tier_dir, entry))
