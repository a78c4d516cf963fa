"""The chain operations of a store that keeps one chain of checkpoints per node (a synced
folder, ``docs/syncdir.md``), taken from ``Store.chains``. Not runtime-checkable: callers
ask the store, not its type.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from ..records import CheckpointInfo, LeaseRecord

__all__ = ["Chains"]


class Chains(Protocol):
    """A store's checkpoints kept per node, with term records beside them."""

    # The longest the sync takes to bring a file from another machine, as stated.
    sync_delay_ms: int

    def list_chains(self, agent: str) -> dict[str, list[CheckpointInfo]]:
        """Each node's chain of the agent's checkpoints (node -> newest first)."""
        ...

    def read_chain_checkpoint(self, agent: str, node: str, info: CheckpointInfo) -> bytes:
        """The sealed bytes of checkpoint info in node's chain (StoreError if it is gone)."""
        ...

    def read_chain_effects(self, agent: str, node: str, seq: int) -> dict[tuple[int, str], bytes]:
        """The effect journal of step seq as node's subtree keeps it, unopened: (index, kind)
        -> bytes ({} if node has none here); unreadable records skipped and reported."""
        ...

    def check_claims_with(self, agent: str, problem: Callable[[LeaseRecord], str | None]) -> None:
        """Leave out of agent's lease, from now on, every claim problem names a problem of
        (its proof does not open): else a claim forged at a high epoch would win for good."""
        ...

    def put_term_start(self, agent: str, epoch: int, data: bytes) -> None:
        """Write this node's (signed) record of its term at epoch, once: the same bytes
        again are a no-op, other bytes a StoreError."""
        ...

    def read_term_starts(self, agent: str) -> dict[tuple[int, str], bytes]:
        """Every node's term records, unopened: (epoch, node) -> bytes, taken from where
        each record is kept (never from its bytes); unreadable ones skipped and reported."""
        ...

    def put_chain_choice(self, agent: str, epoch: int, data: bytes) -> None:
        """Write this node's (signed) choice of the chain to go on from, made while the
        term of epoch won (``hb choose-chain``), once: other bytes, a StoreError."""
        ...

    def read_chain_choices(self, agent: str) -> dict[tuple[int, str], bytes]:
        """Every node's chain choices, unopened: (epoch, node) -> bytes, placed as term
        records are; unreadable ones skipped and reported."""
        ...
