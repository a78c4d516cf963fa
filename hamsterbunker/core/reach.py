"""How far a store's checkpoints are known to reach: a plain value.

The lease keeper writes it into lease records, a node's memory keeps it across
restarts, and a loss acceptance names where to resume; none of them needs the
others to say it.
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["Reach"]


class Reach(NamedTuple):
    """How far the store must reach: a checkpoint at seq or later, under epoch or later.

    An intact store's newest checkpoint is at or past every checkpoint it accepted in
    both: seqs rise, and epochs never fall, in store order.
    """

    seq: int = 0
    epoch: int = 0

    def union(self, other: Reach) -> Reach:
        return Reach(max(self.seq, other.seq), max(self.epoch, other.epoch))
