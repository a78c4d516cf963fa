"""The records kept in a store, and their strict JSON forms, the same on every backend: the
cluster record (``cluster``), the lease record (``lease``), heartbeats, events and checkpoint
descriptions (``node``), parsed strictly (``parsing``); ``lineage`` orders a synced folder's.
"""

from .cluster import MAX_CLUSTER_KEYS, ClusterRecord, KeyEntry
from .lease import MAX_CONTROL_CHARS, MAX_HISTORY, LeaseRecord, Takeover
from .node import (
    MAX_SHOWN_EFFECTS,
    MAX_SHOWN_ERROR,
    MAX_SHOWN_NAME,
    CheckpointInfo,
    Event,
    Heartbeat,
)
from .parsing import PROCESS_SESSION, check_name, check_record_name, parse_json

__all__ = [
    "MAX_CLUSTER_KEYS",
    "MAX_CONTROL_CHARS",
    "MAX_HISTORY",
    "MAX_SHOWN_EFFECTS",
    "MAX_SHOWN_ERROR",
    "MAX_SHOWN_NAME",
    "PROCESS_SESSION",
    "CheckpointInfo",
    "ClusterRecord",
    "Event",
    "Heartbeat",
    "KeyEntry",
    "LeaseRecord",
    "Takeover",
    "check_name",
    "check_record_name",
    "parse_json",
]
