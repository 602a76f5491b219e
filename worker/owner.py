"""Who holds an item: `host:pid` of the process running it, and whether that process is gone.

Light on purpose (the standard library only): the CLI's quick commands use it to find
`applespec run` jobs whose process died without importing the engine.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path


def worker_name() -> str:
    """`host:pid` of this process: the owner of the leases it takes, recorded on the items it
    starts and in their metrics."""
    return f"{socket.gethostname()}:{os.getpid()}"


def owner_is_dead(owner: str) -> bool:
    """Whether the lease owner `host:pid` surely no longer runs: a process of this host
    that does not exist (or is a zombie). Another host's process is never presumed dead;
    its lease runs out instead.

    A pool process killed outright has its chunk redelivered at once; this lets the next
    process take over its items without waiting for the lease to expire. Host names must
    be unique per process namespace (as Celery's node names assume).
    """
    host, _, pid = owner.rpartition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except (PermissionError, OverflowError):
        return False
    try:  # Linux: a zombie is dead, only not yet reaped
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return False
