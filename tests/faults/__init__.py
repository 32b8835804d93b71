"""Fault-injection helpers: a manifest read from the source directly and a checker that reads
through a mount, ways to damage cached state, full filesystems, daemon kills, raw peer clients and
syscall traces.

Module map: ``manifest`` (Manifest, check_mount, equal_size_tree), ``damage`` (plan columns, tier
files, FIFOs), ``fs`` (small_tmpfs, fill), ``procs`` (daemon_pid, kill9, vm_hwm, bounded_read),
``peerwire`` (an authenticated raw connection, BLOCK frames, NOTEs), ``tracing`` (strace), and
``internals``: the only module that imports seerfs internals.
"""
