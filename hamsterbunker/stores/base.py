"""The store contract: the few atomic operations the lease and fencing logic needs.

The lease logic lives above this contract (``hamsterbunker.lease``); a backend
only has to make each operation atomic as stated. One contract test suite
(``tests/contract``) runs against every backend.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from ..records import CheckpointInfo, ClusterRecord, Event, Heartbeat, LeaseRecord

__all__ = ["Fence", "Store", "StoreGuarantees"]


@dataclass(frozen=True)
class Fence:
    """The lease a writer believes it holds; the store compares it in the write's atomic step."""

    holder: str
    session: str
    epoch: int


@dataclass(frozen=True)
class StoreGuarantees:
    """What a backend promises, stated so users can judge it."""

    mutual_exclusion: str
    durability: str
    across_hosts: str


@runtime_checkable
class Store(Protocol):
    """A shared store. Every method is blocking; the runtime calls them from threads."""

    url: str
    guarantees: StoreGuarantees
    warnings: list[str]

    def read_cluster(self) -> ClusterRecord | None:
        """The cluster record, or None before the first node created it."""

    def create_cluster(self, record: ClusterRecord) -> ClusterRecord:
        """Store record unless one exists (atomically); return the record that is stored."""

    def read_lease(self, agent: str) -> LeaseRecord | None:
        """The agent's lease record as last written, or None if never written."""

    def cas_lease(self, agent: str, expected_version: int | None, new: LeaseRecord) -> LeaseRecord:
        """Write new only if the stored version is expected_version (None: no record yet).

        Atomic against every other cas_lease and put_checkpoint. Returns the
        stored record with its new version; raises LeaseConflict otherwise.
        """

    def put_checkpoint(self, agent: str, fence: Fence, seq: int, blob: bytes) -> CheckpointInfo:
        """Store a sealed checkpoint durably, only if fence matches the current lease.

        The fence check (holder, session and epoch equal the stored lease's) and
        the write are one atomic step. Raises Fenced if the lease moved on, and
        StoreError if seq is not above every stored checkpoint's. Keeps the
        newest few checkpoints and removes older ones.
        """

    def list_checkpoints(self, agent: str) -> list[CheckpointInfo]:
        """Retained checkpoints, newest (highest seq) first."""

    def read_checkpoint(self, agent: str, info: CheckpointInfo) -> bytes:
        """The sealed bytes of one retained checkpoint."""

    def put_heartbeat(self, agent: str, heartbeat: Heartbeat) -> None:
        """Replace this node's heartbeat."""

    def list_heartbeats(self, agent: str) -> list[Heartbeat]:
        """Every node's last heartbeat."""

    def remove_heartbeat(self, agent: str, node: str) -> None:
        """Drop a node's heartbeat (graceful stop). No error if absent."""

    def append_event(self, agent: str, event: Event) -> None:
        """Append to the event log of event.node. Each log is bounded; old events fall off."""

    def read_events(self, agent: str, after: Mapping[str, int] | None = None) -> list[Event]:
        """Events with n above after[node] (0 if absent), each node's in order."""

    def watch(self, agent: str, *, lease_only: bool = False) -> AsyncIterator[None]:
        """Yield whenever the agent's records may have changed: a hint, never proof.

        With lease_only, only changes of the lease record matter (a standby
        waiting for a release); a backend may then stay quiet about the rest.
        """

    def close(self) -> None:
        """Release what the store holds open."""
