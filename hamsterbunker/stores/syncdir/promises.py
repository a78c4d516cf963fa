"""What a syncdir store promises, what it refuses, and the sync delay it is told."""

from __future__ import annotations

from ...core.errors import ConfigError
from ..base import Refusal, StoreGuarantees

__all__ = [
    "GUARANTEES",
    "MAX_SYNC_DELAY_MS",
    "REFUSES",
    "ROTATION_REFUSED",
    "check_sync_delay_bounds",
]

GUARANTEES = StoreGuarantees(
    mutual_exclusion="none: each node writes only its own files, and the lease is the winning "
    "claim among the copies a node holds; while the sync is cut, or slower than sync_delay_ms, "
    "two nodes can both lead (each on its own chain: docs/syncdir.md)",
    durability="as the file store on each machine's copy (file and directory fsync before a "
    "write is acknowledged); on the other machines once the sync tool has copied it",
    across_hosts="through the sync tool (Syncthing, Dropbox, rsync), within its sync delay",
)

MAX_SYNC_DELAY_MS = 3_600_000  # an hour: beyond it a failover would take longer still

# Declared in the store's report: key rotation (replace_cluster, every reseal_*), and
# forget_node of a node that writes a subtree of its own (its files are its alone).
REFUSES = frozenset({Refusal.KEY_ROTATION, Refusal.FORGET_OTHER_NODE, Refusal.FORGET_AGENT})
ROTATION_REFUSED = (
    "{what} is refused on a syncdir store: key rotation rewrites a record every node shares "
    "(the cluster record, or records sealed under the old key), and a synced folder cannot "
    "rewrite a shared file without the sync tool keeping one copy and renaming the other"
)


def check_sync_delay_bounds(sync_delay_ms: int) -> int:
    """sync_delay_ms if it is a whole number of ms in 1..MAX_SYNC_DELAY_MS, else ConfigError."""
    if type(sync_delay_ms) is not int or not 0 < sync_delay_ms <= MAX_SYNC_DELAY_MS:
        raise ConfigError(
            f"sync_delay_ms must be a whole number of milliseconds in 1..{MAX_SYNC_DELAY_MS} "
            f"(the longest the sync tool takes to bring a file), not {sync_delay_ms!r}"
        )
    return sync_delay_ms
