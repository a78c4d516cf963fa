"""How the syncdir store merges what it reads of every node's subtree into one answer."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TypeVar

from ...records import CheckpointInfo
from .._reported import NodeRecord

__all__ = ["by_node", "merged_chains"]

R = TypeVar("R", bound=NodeRecord)


def by_node(found: Mapping[str, Sequence[R]], subtrees: set[str], own: str) -> dict[str, list[R]]:
    """Each node's records (heartbeats, events), from the records found in each subtree
    (subtree -> records), taken from one subtree: the node's own if it has one (subtrees:
    those there are), else own's (this store's node), else the first by name that holds any."""
    chosen: dict[str, tuple[int, list[R]]] = {}
    for subtree, records in found.items():
        grouped: dict[str, list[R]] = {}
        for record in records:
            grouped.setdefault(record.node, []).append(record)
        for node, held in grouped.items():
            rank = 0 if subtree == node else 1 if subtree == own else 2
            if node in subtrees and rank != 0:
                continue  # that node has its own subtree: only what it wrote counts
            if node not in chosen or rank < chosen[node][0]:
                chosen[node] = (rank, held)
    return {node: records for node, (_rank, records) in sorted(chosen.items())}


def merged_chains(chains: Mapping[str, list[CheckpointInfo]]) -> list[tuple[str, CheckpointInfo]]:
    """(node, checkpoint) of every chain (node -> its checkpoints), newest first by (seq,
    epoch); a (seq, epoch) that several chains hold, once: the highest node id's."""
    kept: dict[tuple[int, int], tuple[str, CheckpointInfo]] = {}
    for node, chain in sorted(chains.items(), reverse=True):
        for info in chain:
            kept.setdefault((info.seq, info.epoch), (node, info))
    return sorted(kept.values(), key=lambda kept: (kept[1].seq, kept[1].epoch), reverse=True)
