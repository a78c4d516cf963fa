"""The lineage as this node sees it, on a store that keeps chains (``Store.chains``).

``read`` (in a thread) reads the term records that authenticate, the chains and the
operator's chain choices (``hb choose-chain``); ``report`` (on the event loop) says
each kept-aside segment once per process (``store.diverged``) and each record that
does not authenticate (``term_record.rejected``).
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable
from dataclasses import dataclass

from ..core.errors import CorruptRecord, StoreError, Tampered
from ..records import CheckpointInfo
from ..records.lineage import (
    Aside,
    ChainChoice,
    CheckpointRef,
    Lineage,
    TermId,
    TermStart,
    applicable_choice,
    lineage,
)
from ..sealing import Sealer
from ..sealing.term_records import open_chain_choice, open_term_start, seal_term_start
from ..stores import Chains
from .calls import NodeCalls

__all__ = ["DivergenceCheck", "LineageRead", "LineageView"]

# How many kept-aside segments and rejected records one process remembers having
# reported: beyond that (only a forger could make so many) each is reported again.
_MAX_REMEMBERED = 4096


@dataclass(frozen=True)
class LineageRead:
    """One reading of the lineage, and where each listed checkpoint is kept."""

    lineage: Lineage
    # Every listed checkpoint: its place in the lineage's terms -> (node, as listed).
    where: dict[CheckpointRef, tuple[str, CheckpointInfo]]
    rejected: tuple[tuple[TermId, str, str], ...] = ()  # (term, error, digest of its bytes)
    # Whether the winning term began from a checkpoint (its record's base), not init().
    winner_based: bool = False
    # Every term record that authenticates.
    starts: tuple[TermStart, ...] = ()
    # The operator's choice that applies while the winning term wins (applied to lineage
    # if the read was asked to: then lineage.chosen is its base).
    choice: ChainChoice | None = None

    def carried(self) -> list[tuple[str, CheckpointInfo]]:
        """The checkpoints that carry the agent on, as (node, info), newest first."""
        return [self.where[ref] for ref in self.lineage.carried if ref in self.where]

    def built_on(self, base: CheckpointRef | None) -> tuple[TermId, ...]:
        """The terms whose journals a replay of the step after base reads (None: after init()),
        oldest first: base's own term, and every term whose record names base as its start.
        """
        terms = {start.term for start in self.starts if start.base == base}
        if base is not None:
            terms.add(base.term)
        return tuple(sorted(terms))


def describe_ref(ref: CheckpointRef | None) -> str | None:
    """A checkpoint as events name it: ``seq S of term E@N``; None for none."""
    return None if ref is None else f"seq {ref.seq} of term {ref.term}"


class LineageView:
    """Reads and reports one agent's lineage for this node (see the module)."""

    def __init__(
        self,
        store: Chains,
        sealer: Sealer,
        agent_id: str,
        node_id: str,
        *,
        emit: Callable[..., None],
    ) -> None:
        self._store, self._sealer = store, sealer
        self._agent_id, self._node_id = agent_id, node_id
        self._emit = emit
        self._reported: set[tuple[TermId, object]] = set()  # (term, forked_at)
        self._rejected: set[tuple[TermId, object]] = set()  # (term, digest of its bytes)

    @property
    def store(self) -> Chains:
        return self._store

    @property
    def node_id(self) -> str:
        """This node: the node whose chain its own checkpoints are in (and sealed for)."""
        return self._node_id

    # -- in a thread ------------------------------------------------------------------

    def read(self, *, apply_choice: bool = False) -> LineageRead:
        """Every term record (authenticated) and every chain, and the lineage they make;
        apply_choice: the lineage an applicable chain choice goes on from, if there is one."""
        starts: list[TermStart] = []
        rejected: list[tuple[TermId, str, str]] = []
        for (epoch, node), data in sorted(self._store.read_term_starts(self._agent_id).items()):
            term = TermId(epoch, node)
            try:
                starts.append(open_term_start(self._sealer, data, self._agent_id, term))
            except (Tampered, CorruptRecord) as exc:
                rejected.append((term, str(exc), hashlib.sha256(data).hexdigest()))
        choices: list[ChainChoice] = []
        for (epoch, node), data in sorted(self._store.read_chain_choices(self._agent_id).items()):
            try:
                choices.append(open_chain_choice(self._sealer, data, self._agent_id, epoch))
            except (Tampered, CorruptRecord) as exc:
                error = f"chain choice: {exc}"
                rejected.append((TermId(epoch, node), error, hashlib.sha256(data).hexdigest()))
        where: dict[CheckpointRef, tuple[str, CheckpointInfo]] = {}
        held: dict[TermId, list[int]] = {}
        for node, chain in self._store.list_chains(self._agent_id).items():
            for info in chain:
                term = TermId(info.epoch, node)
                where[CheckpointRef(term, info.seq)] = (node, info)
                held.setdefault(term, []).append(info.seq)
        found = lineage(starts, held)
        choice = applicable_choice(choices, found.winner)
        if apply_choice and choice is not None:
            found = lineage(starts, held, choice.base)
        based = any(start.term == found.winner and start.base is not None for start in starts)
        return LineageRead(found, where, tuple(rejected), based, tuple(starts), choice)

    def write_start(self, epoch: int, base: CheckpointRef | None) -> None:
        """This node's record of its term at epoch, which began from base (None: init())."""
        start = TermStart(TermId(epoch, self._node_id), base)
        self._store.put_term_start(
            self._agent_id, epoch, seal_term_start(self._sealer, self._agent_id, start)
        )

    def read_checkpoint(self, node: str, info: CheckpointInfo) -> bytes:
        """The bytes of info in node's chain: open them as node's (``Sealer.open_checkpoint``'s
        node), so that one copied there from another node's chain does not authenticate."""
        return self._store.read_chain_checkpoint(self._agent_id, node, info)

    def own_chain(self) -> list[CheckpointInfo]:
        """This node's own chain of the agent's checkpoints, newest first."""
        return self._store.list_chains(self._agent_id).get(self._node_id, [])

    # -- on the event loop ------------------------------------------------------------

    def report(self, read: LineageRead) -> None:
        """Emit term_record.rejected and store.diverged for what was not reported yet."""
        for term, error, digest in read.rejected:
            if self._first_time(self._rejected, (term, digest)):
                self._emit("term_record.rejected", term=str(term), error=error)
        found = read.lineage
        if found.chosen is not None:
            return  # as it will be once the chosen term begins: reported by the next read
        for segment in found.aside:
            if self._first_time(self._reported, (segment.term, segment.forked_at)):
                self._emit("store.diverged", **diverged_fields(found.winner, segment))

    @staticmethod
    def _first_time(seen: set[tuple[TermId, object]], key: tuple[TermId, object]) -> bool:
        if key in seen:
            return False
        if len(seen) >= _MAX_REMEMBERED:
            seen.clear()
        seen.add(key)
        return True


def diverged_fields(winner: TermId | None, segment: Aside) -> dict[str, object]:
    """The fields of a store.diverged event for one kept-aside segment."""
    return {
        "winner": None if winner is None else str(winner),
        "term": str(segment.term),
        "node": segment.term.node,
        "from_seq": segment.seqs[0],
        "to_seq": segment.seqs[-1],
        "count": len(segment.seqs),
        "forked_at": describe_ref(segment.forked_at),
        "aside": segment.describe(),
    }


class DivergenceCheck:
    """Reads the lineage every period_s and reports what it has not reported yet, on
    leaders and standbys alike; a store error skips the round. A chain choice that applies
    is handed to on_choice.
    """

    def __init__(
        self,
        view: LineageView,
        calls: NodeCalls,
        *,
        period_s: float,
        on_choice: Callable[[ChainChoice], None] | None = None,
    ) -> None:
        self._view, self._calls, self._period_s = view, calls, period_s
        self._on_choice = on_choice

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self._period_s)
            await self.check()

    async def check(self) -> LineageRead | None:
        """One round: the lineage read and reported, or None if the store failed."""
        try:
            read = await self._calls.io(self._view.read)
        except StoreError:
            return None  # the next round tries again; the node loop reports store errors
        self._view.report(read)
        if read.choice is not None and self._on_choice is not None:
            self._on_choice(read.choice)
        return read
