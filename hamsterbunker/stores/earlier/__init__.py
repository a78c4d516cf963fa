"""Stores an earlier version wrote, in the hand-written stores' layouts: refused, never read.

This version keeps every record in the record layer's layout (``stores.layer.keys``)
on a backend. A store an earlier version wrote (``stores.file``, ``stores.redis``,
``stores.etcd``) holds the same records elsewhere: at the directory's root beside
no ``kv/``, under Redis keys ``P:...`` beside the backend's ``{P}:...``, under the
etcd prefix by names of its own and with no index of agents. Read by this
version it would look empty, and a
node would start its agents afresh: silent loss of their state. So each backend
looks for the earlier layout's marker before its first read and refuses the store;
``hb migrate-store`` (``stores.migrate``) copies it into this version's layout.
"""

from __future__ import annotations

from typing import Protocol

from ...errors import ConfigError
from ...records import CheckpointInfo, ClusterRecord, Heartbeat, LeaseRecord
from ..base import AdmissionState

__all__ = ["SourceStore", "earlier_store"]


class SourceStore(Protocol):
    """What ``hb migrate-store`` reads from a store an earlier version wrote: the contract's
    reads, bounded as the contract bounds them, and the request ids its inbox keeps. A
    reader of each earlier layout (``earlier.file``, ``earlier.redis``, ``earlier.etcd``)
    only reads."""

    url: str

    def read_cluster(self) -> ClusterRecord | None: ...
    def list_agents(self) -> list[str]: ...
    def read_lease(self, agent: str) -> LeaseRecord | None: ...
    def list_heartbeats(self, agent: str) -> list[Heartbeat]: ...
    def list_checkpoints(self, agent: str) -> list[CheckpointInfo]: ...
    def read_checkpoint(self, agent: str, info: CheckpointInfo) -> bytes: ...
    def read_effects(self, agent: str, seq: int) -> dict[tuple[int, str], bytes]: ...
    def read_acceptance(self, agent: str) -> bytes | None: ...
    def read_inbox(self, agent: str, after: int = 0) -> list[tuple[int, bytes]]: ...
    def read_admission(self, agent: str, request_id: str) -> AdmissionState | None: ...
    def request_ids(self, agent: str, most: int) -> list[str]: ...
    def close(self) -> None: ...


def earlier_store(store: str, found: str) -> ConfigError:
    """The one-line refusal of store (as it may be shown), in which found is the marker."""
    return ConfigError(
        f"{store} was written by an earlier version of HamsterBunker ({found}), in a layout "
        "this version does not read: stop its nodes and copy it into a new, empty store "
        "(another directory, prefix or database) with `hb migrate-store --from URL --to "
        "NEW-URL`, then start this version's nodes on that one"
    )
