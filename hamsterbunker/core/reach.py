"""How far a store's checkpoints are known to reach: a plain value, written into lease
records, kept in a node's memory and named by a loss acceptance.
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["Reach"]


class Reach(NamedTuple):
    """How far the store must reach: a checkpoint at seq or later, under epoch or later
    (an intact store's newest checkpoint is at or past every one it accepted, in both)."""

    seq: int = 0
    epoch: int = 0

    def union(self, other: Reach) -> Reach:
        return Reach(max(self.seq, other.seq), max(self.epoch, other.epoch))
