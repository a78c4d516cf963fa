"""What a term goes on from (``Progress``), and why a restore did not resume (``restore``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..agent.inbox import ConsumedMarks
from ..agent.step import State
from ..core.errors import HamsterbunkerError, StoreError
from ..records.lineage import TermId

__all__ = ["BehindTheSync", "LeaseBehind", "Progress"]


@dataclass
class Progress:
    """The state the next step starts from, and the highest seq already in the store."""

    state: State
    seq: int
    resumed: bool = True  # False: started from init()
    epoch: int = 0  # the epoch of the checkpoint at seq (0: none)
    accepted_loss: str = ""  # the id of a loss acceptance honoured by this restore
    # The agent's consumed submissions as of that checkpoint (sealed in it).
    marks: ConsumedMarks = field(default_factory=ConsumedMarks)
    # On a store that keeps chains, after a restore: the terms that may have run step
    # seq + 1 from this checkpoint, whose effect journals its replay reads (in their
    # nodes' chains: ``LineageRead.built_on``). Empty on any other store.
    journals: tuple[TermId, ...] = ()


class BehindTheSync(StoreError):
    """On a synced folder: a checkpoint this node saw announced is not here. The sync may
    still bring it (a partition), so the term tries again rather than stop the node."""


class LeaseBehind(HamsterbunkerError):
    """The lease record is behind an authenticated checkpoint: take the lease again, above it."""
