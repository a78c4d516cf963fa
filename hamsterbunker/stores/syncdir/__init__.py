"""The syncdir store: a synced folder in which each node writes only its own subtree."""

from .store import GUARANTEES, MAX_SYNC_DELAY_MS, SyncDirStore, check_sync_delay_bounds

__all__ = ["GUARANTEES", "MAX_SYNC_DELAY_MS", "SyncDirStore", "check_sync_delay_bounds"]
