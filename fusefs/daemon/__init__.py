"""The daemon process: mount checks, daemonising and readiness, assembling the components of one
mount, runtime records, and the status document.  See ARCHITECTURE.md for the task and thread map.
"""
