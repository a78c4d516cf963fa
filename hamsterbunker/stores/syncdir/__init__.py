"""The syncdir store: a synced folder in which each node writes only its own subtree."""

from .promises import GUARANTEES, MAX_SYNC_DELAY_MS, check_sync_delay_bounds
from .store import SyncDirStore

__all__ = ["GUARANTEES", "MAX_SYNC_DELAY_MS", "SyncDirStore", "check_sync_delay_bounds"]
