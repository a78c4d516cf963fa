"""Which checkpoints carry an agent on, and which are kept aside: the lineage of terms on a
synced folder (``docs/syncdir.md``, "Chains, lineage and divergence"), the same answer on
every node. The inputs must be authenticated already: this module only orders them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

__all__ = [
    "Aside",
    "ChainChoice",
    "CheckpointRef",
    "Lineage",
    "TermId",
    "TermStart",
    "applicable_choice",
    "lineage",
]


@dataclass(frozen=True, order=True)
class TermId:
    """A term: an epoch and the node that led it. Ordered as the winner is chosen."""

    epoch: int
    node: str

    def __str__(self) -> str:
        return f"{self.epoch}@{self.node}"


@dataclass(frozen=True, order=True)
class CheckpointRef:
    """One checkpoint: the term whose chain holds it, and its seq."""

    term: TermId
    seq: int


@dataclass(frozen=True)
class TermStart:
    """What a term's record says: the term, and the checkpoint it restored from (None:
    it began with the agent's initial state)."""

    term: TermId
    base: CheckpointRef | None


@dataclass(frozen=True, order=True)
class ChainChoice:
    """An operator's choice, made while the term after won: the next term goes on from base."""

    after: TermId
    base: CheckpointRef


@dataclass(frozen=True)
class Aside:
    """A run of one term's checkpoints that the lineage does not continue."""

    term: TermId
    seqs: tuple[int, ...]  # ascending
    # The last checkpoint the branch shares with the lineage, as far as is known: the
    # seq the successor restored from (a lineage term), else the term's own base.
    forked_at: CheckpointRef | None

    def describe(self) -> str:
        span = f"{self.seqs[0]}" if len(self.seqs) == 1 else f"{self.seqs[0]}..{self.seqs[-1]}"
        return f"term {self.term}: seq {span} ({len(self.seqs)} checkpoints)"


@dataclass(frozen=True)
class Lineage:
    """The answer: the winning term, the checkpoints that carry the agent on, newest
    first (restore takes the first that opens), and those kept aside."""

    winner: TermId | None
    carried: tuple[CheckpointRef, ...] = ()
    aside: tuple[Aside, ...] = ()
    # Checkpoints of terms whose record is not here (yet): a sync tool may bring a
    # term's checkpoints before its record. Neither carried nor, yet, aside.
    unplaced: tuple[Aside, ...] = ()
    # The checkpoint an operator chose to go on from, if a choice was applied.
    chosen: CheckpointRef | None = None

    @property
    def diverged(self) -> bool:
        return bool(self.aside)


def applicable_choice(choices: Iterable[ChainChoice], winner: TermId | None) -> ChainChoice | None:
    """The choice that applies while winner wins: one made after it (an older one was
    spent or overtaken). Of several (made on different machines), the one naming the
    newest checkpoint, the same on every node."""
    return max((choice for choice in choices if choice.after == winner), default=None)


def lineage(
    starts: Iterable[TermStart],
    chains: Mapping[TermId, Iterable[int]],
    chosen: CheckpointRef | None = None,
) -> Lineage:
    """The lineage of the terms that starts describes, over the checkpoints chains holds;
    with chosen, the lineage that goes on from that checkpoint instead (a choice). A term
    with checkpoints but no record is unplaced; a base its chain no longer holds still marks
    the fork; a cycle in the bases (a forger's) ends the walk."""
    by_term: dict[TermId, TermStart] = {}
    # One record per term is all a node writes; of two (a forger's), the same one on every node.
    for record in sorted(starts, key=lambda s: (s.term, s.base is None, s.base)):
        by_term.setdefault(record.term, record)
    held = {term: sorted(set(seqs)) for term, seqs in chains.items()}
    if not by_term:
        alone = (Aside(term, tuple(seqs), None) for term, seqs in sorted(held.items()) if seqs)
        return Lineage(None, unplaced=tuple(alone))
    winner = max(by_term)
    carried: list[CheckpointRef] = []
    reach: dict[TermId, int | None] = {}  # how far each lineage term is carried (None: all)
    term: TermId | None = winner if chosen is None else chosen.term
    upto: int | None = None if chosen is None else chosen.seq
    while term is not None and term not in reach:
        reach[term] = upto
        carried.extend(
            CheckpointRef(term, seq) for seq in held.get(term, ()) if upto is None or seq <= upto
        )
        start = by_term.get(term)
        base = start.base if start is not None else None
        term, upto = (base.term, base.seq) if base is not None else (None, None)
    carried.sort(key=lambda ref: (ref.seq, ref.term), reverse=True)
    aside: list[Aside] = []
    unplaced: list[Aside] = []
    for term, seqs in sorted(held.items()):
        if term in reach:  # a lineage term: what is past the seq its successor restored from
            limit = reach[term]
            if limit is not None and seqs and seqs[-1] > limit:
                left = tuple(seq for seq in seqs if seq > limit)
                aside.append(Aside(term, left, CheckpointRef(term, limit)))
        elif term in by_term and seqs:  # a branch the lineage does not continue
            aside.append(Aside(term, tuple(seqs), by_term[term].base))
        elif seqs:
            unplaced.append(Aside(term, tuple(seqs), None))
    return Lineage(winner, tuple(carried), tuple(aside), tuple(unplaced), chosen)
