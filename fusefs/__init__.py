"""seerfs daemon: CLI, config, metadata snapshot, FUSE operations, control files, tiers, peers."""

__version__ = "0.1.0"
