"""The effect journal of one leader's term: sealed records in the store, fenced by its lease.

The rules of journaled effects are ``hamsterbunker.agent.effects``'; this part seals,
writes (``Store.put_effect`` under the term's fence) and reads back a step's journal,
in the order it was written (docs/design.md, "The node").
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..agent.effects import Entry, StepEffects, effect_key
from ..agent.intents import BegunIntent, IntentLog
from ..core.clock import Clock
from ..core.errors import EffectError, Fenced, Tampered
from ..core.limits import EFFECT_KINDS, MAX_EFFECT_BYTES, MAX_SEQ
from ..records.lineage import TermId
from ..sealing import EffectAt, OpenedEffect, Sealer
from ..stores import Chains, Fence, Store
from ..stores.base import TakenJournals
from .calls import NodeCalls
from .events import EventSink
from .state import Identity

__all__ = ["TermJournal"]

log = logging.getLogger("hamsterbunker")

# How many submission numbers a record's "shown" is read to (sealed, so never more than
# a step was shown: a bound on a reader, not a limit on steps).
MAX_SHOWN_NUMBERS = 4096


class TermJournal:
    """Reads and writes the effect journal for one term (one epoch, one fence)."""

    def __init__(
        self,
        identity: Identity,
        store: Store,
        sealer: Sealer,
        fence: Fence,
        calls: NodeCalls,
        sink: EventSink,
        clock: Clock,
        intents: IntentLog,
    ) -> None:
        """intents: the node's own memory of the intents it wrote (hamsterbunker.agent.intents)."""
        self._id, self._store, self._sealer, self._fence = identity, store, sealer, fence
        self._calls, self._sink, self._clock, self._intents = calls, sink, clock, intents
        self._salt = sealer.cluster.salt
        # The journal of the step being run (every attempt of it in this term shares it).
        self._seq = 0
        self._entries: dict[int, Entry] | None = None
        # The submission numbers shown to the runs of that step (StepInbox): each record
        # says them, so that a replay is shown the same ones.
        self.shown: set[int] = set()
        self._base_epoch = 0  # the epoch of the checkpoint the first step builds on
        # On a store with chains: the terms whose journals of the first step are read.
        self._journals: tuple[TermId, ...] = ()
        self._written = 0  # records written in this term, of every step
        self._attempt = 0  # runs of a step begun in this term, of every step
        # What the take of the lease read along, for the term's first read (RestoreRead).
        self.taken: TakenJournals | None = None

    def for_step(
        self, seq: int, base_epoch: int, *, first: bool, journals: tuple[TermId, ...] = ()
    ) -> dict[int, Entry] | None:
        """The journal of step seq as this term knows it: None (read it from the store when
        first needed) for the term's first step, which may be a replay; empty for the later
        ones, whose records only this term can have written. journals: on a store that
        keeps chains, the terms that built on the checkpoint the step builds on (the
        restore's ``Progress.journals``), whose records of the step a replay reads."""
        self._attempt += 1  # each call begins a run of the step
        if seq != self._seq:
            self._seq, self._base_epoch, self._journals = seq, base_epoch, journals
            self._entries = None if first else {}
            self.shown = set()
        return self._entries

    def keep(self, effects: StepEffects) -> None:
        """Keep what an attempt of the step learnt of its journal, for the next attempt."""
        if effects.seq == self._seq:
            self._entries = effects.entries

    # -- JournalIO --------------------------------------------------------------

    async def load(self, seq: int) -> dict[int, Entry]:
        chains = self._store.chains
        if chains is not None:
            found = await self._read_chains(chains, seq)
        else:
            found = await self._read(seq)
        found += self._lost_intents(seq, found)
        if seq == self._seq:
            self.shown.update(n for record in found for n in _numbers(record.opened.payload))
        entries: dict[int, Entry] = {}
        latest: dict[int, tuple[TermId, int]] = {}  # index -> the last run that wrote it
        for record in sorted(found):
            if _apply(entries, record.index, record.kind, record.opened):
                latest[record.index] = record.run
            else:
                latest[record.index] = max(latest[record.index], record.run)
        _mark_earlier_paths(entries, latest)
        return entries

    async def _read(self, seq: int) -> list[_Record]:
        """The authentic records of step seq written since the checkpoint it builds on."""
        taken, self.taken = self.taken, None
        stored = None if taken is None else taken.of(seq)
        if stored is None:
            stored = await self._calls.io(self._store.read_effects, self._id.agent, seq)
        return await self._opened(seq, "", stored)

    async def _read_chains(self, chains: Chains, seq: int) -> list[_Record]:
        """The records of step seq in the subtrees of the terms that built on the checkpoint
        it builds on, and this term's own records."""
        read = functools.partial(chains.read_chain_effects, self._id.agent)
        found: list[_Record] = []
        for node in sorted(self._chain_epochs()):
            found += await self._opened(seq, node, await self._calls.io(read, node, seq))
        return found

    async def _opened(
        self, seq: int, node: str, stored: dict[tuple[int, str], bytes]
    ) -> list[_Record]:
        """The records in stored that authenticate, of a term whose records may be read;
        node: the chain they were read from ("" on a store without chains)."""
        found: list[_Record] = []
        for (index, kind), blob in sorted(stored.items()):
            at = EffectAt(self._id.agent, seq, index, kind, node=node or None)
            try:
                opened = await self._calls.work(self._sealer.open_effect, blob, at)
                given_up = self._given_up(TermId(opened.epoch, node))
                if given_up:
                    raise Tampered(given_up)
            except Tampered as exc:
                where = {"node": node} if node else {}
                self.emit("effect.rejected", step_seq=seq, index=index, record=kind, **where,
                          error=str(exc))  # fmt: skip
                continue
            found.append(_Record.of(TermId(opened.epoch, node), index, kind, opened))
        return found

    def _chain_epochs(self) -> dict[str, set[int]]:
        """On a store with chains: by node, the epochs of the terms whose records may be read."""
        epochs: dict[str, set[int]] = {}
        for term in (*self._journals, TermId(self._fence.epoch, self._id.node)):
            epochs.setdefault(term.node, set()).add(term.epoch)
        return epochs

    def _given_up(self, term: TermId) -> str:
        """Why a record written by term belongs to a history given up; "" if it may be read."""
        if self._store.chains is not None:
            if term.epoch in self._chain_epochs().get(term.node, set()):
                return ""
            return (
                f"written under epoch {term.epoch} in the chain of node {term.node}, by no term "
                "that built on the checkpoint this step builds on: a record of a history given up"
            )
        if self._base_epoch <= term.epoch <= self._fence.epoch:
            return ""
        return (
            f"written under epoch {term.epoch}, outside {self._base_epoch}..{self._fence.epoch}: "
            "a record of a history given up"
        )

    def _lost_intents(self, seq: int, found: list[_Record]) -> list[_Record]:
        """The intents of step seq this node wrote that the store no longer holds (deleted,
        or a store that lost writes), as records: so that the effect reads as begun. One
        that a later intent at its number replaced in the store is not lost."""
        node = self._id.node if self._store.chains is not None else ""
        lost: list[_Record] = []
        for intent in self._intents.of_step(seq):
            term = TermId(intent.epoch, node)
            written = (term, intent.order)  # this intent, or a later one at its number:
            if self._given_up(term) or any(  # then the store holds what counts there
                r.kind == "intent" and r.index == intent.index and (r.term, r.order) >= written
                for r in found
            ):
                continue
            self.emit("effect.lost", step_seq=seq, index=intent.index, name=intent.name,
                      record="intent", epoch=intent.epoch)  # fmt: skip
            payload = {"replay": "interrupted", "order": intent.order, "attempt": intent.attempt}
            opened = OpenedEffect(intent.epoch, intent.name, payload)
            lost.append(_Record.of(term, intent.index, "intent", opened))
        return lost

    async def write(self, seq: int, index: int, kind: str, entry: Entry) -> None:
        assert kind in EFFECT_KINDS
        # The order of the write in this term: the records of an earlier attempt of the step
        # are read before a later attempt's, which take their place (see _Record).
        self._written += 1
        order = self._written
        payload: dict[str, Any] = {"replay": entry.replay, "order": order, "attempt": self._attempt}
        if seq == self._seq and self.shown:
            payload["shown"] = sorted(self.shown)
        if kind == "outcome":
            payload["outcome"] = entry.outcome
        # On a chained store the record names its node: a copy into another node's journal
        # does not open there (as a checkpoint copied into another chain).
        node = self._id.node if self._store.chains is not None else None
        at = EffectAt(self._id.agent, seq, index, kind, entry.name, node)
        started = self._clock.monotonic()
        try:
            await self._calls.io(self._seal_and_put, at, payload)
        except Fenced as exc:
            # Said here, where it happens: the step that made the write may have been
            # given up already, and nobody would hear of it otherwise.
            self.history("effect_record", seq, started, "fenced", index=index, record=kind)
            self.emit("node.fenced", epoch=self._fence.epoch, error=str(exc), step_seq=seq)
            raise
        await self._remember(seq, index, kind, entry.name, order)

    def _seal_and_put(self, at: EffectAt, payload: dict[str, Any]) -> None:
        """Seal one record and store it, in one hop to the store pool: an effect's record is
        small (at most MAX_EFFECT_BYTES), and a journaled call waits for both."""
        blob = self._sealer.seal_effect(at, self._fence.epoch, payload)
        if len(blob) > MAX_EFFECT_BYTES:
            raise EffectError(
                f"effect {at.name!r}: its {at.kind} is {len(blob)} bytes sealed, above the limit "
                f"of {MAX_EFFECT_BYTES} bytes: return a smaller result (it is not recorded)"
            )
        self._store.put_effect(at.agent, self._fence, at.seq, at.index, at.kind, blob)

    async def _remember(self, seq: int, index: int, kind: str, name: str, order: int) -> None:
        """Keep this node's own account of the intents it wrote, before the effect is called
        (an intent the store loses is still known here); a record of another name at the
        same number takes an intent's place there as in the store."""
        if kind == "intent":
            intent = BegunIntent(seq, index, name, self._fence.epoch, order, self._attempt)
            remember = functools.partial(self._intents.add, intent)
        elif self._intents.stale(seq, index, name):
            remember = functools.partial(self._intents.supersede, seq, index, name)
        else:
            return
        try:
            await self._calls.work(remember)
        except OSError as exc:
            raise EffectError(
                f"effect {name!r}: its {kind} is in the store, but cannot be kept in "
                f"{self._intents.path}: {exc} (the effect is not called)"
            ) from exc

    def history(self, op: str, seq: int, started: float, outcome: str, **detail: Any) -> None:
        self._sink.record(op, self._fence.epoch, seq, started, outcome, **detail)

    def emit(self, kind: str, **detail: Any) -> None:
        self._sink.emit(kind, **detail)

    def now(self) -> float:
        return self._clock.monotonic()

    def key(self, seq: int, index: int, name: str) -> str:
        return effect_key(self._salt, self._id.agent, seq, index, name)

    async def call_blocking(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return await self._calls.detached(fn, *args, **kwargs)


@dataclass(frozen=True, order=True)
class _Record:
    """One authentic record of a step's journal, ordered as it was written: a term's
    records in its order of writing, a later term's after an earlier one's.
    """

    term: TermId
    order: int  # 0 in records written before the order was kept: (index, kind) decides
    index: int
    kind: str
    opened: OpenedEffect = field(compare=False)
    attempt: int = field(compare=False, default=0)  # the run of the step in its term

    @classmethod
    def of(cls, term: TermId, index: int, kind: str, opened: OpenedEffect) -> _Record:
        order, attempt = _count(opened.payload, "order"), _count(opened.payload, "attempt")
        return cls(term, order, index, kind, opened, attempt)

    @property
    def run(self) -> tuple[TermId, int]:
        """The run of the step that wrote it: later runs compare greater."""
        return self.term, self.attempt


def _count(payload: Any, name: str) -> int:
    """A count from a record's payload; 0 if absent (records written before it was kept)."""
    value = payload.get(name, 0) if isinstance(payload, dict) else 0
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return 0  # sealed by a holder of the secret, so never: but not a crash
    return value


def _numbers(payload: Any) -> list[int]:
    """The submission numbers a record says its step's runs were shown ([] if none)."""
    value = payload.get("shown") if isinstance(payload, dict) else None
    if not isinstance(value, list):
        return []  # records written before they were kept
    return [n for n in value[:MAX_SHOWN_NUMBERS] if type(n) is int and 0 < n <= MAX_SEQ]


def _apply(entries: dict[int, Entry], index: int, kind: str, opened: OpenedEffect) -> bool:
    """Apply one authentic record, in write order, to the step's journal: an intent is a
    call begun afresh (what an earlier call at the number left is of a path given up); an
    outcome completes the call of its name, or takes the place of another name's. True if
    the record began the entry anew."""
    payload = opened.payload
    entry = entries.get(index)
    anew = kind == "intent" or entry is None or entry.name != opened.name
    if anew:
        entry = entries[index] = Entry(opened.name, str(payload.get("replay", "safe")))
    assert entry is not None
    if kind == "intent":
        entry.intent = True
    else:
        entry.outcome = payload.get("outcome")
    return anew


def _mark_earlier_paths(entries: dict[int, Entry], latest: dict[int, tuple[TermId, int]]) -> None:
    """Mark the entries written by an earlier run of the step than an entry before them
    (``Entry.earlier_path``): they may be another path's, and a replay writes over them
    where names differ instead of raising EffectMismatch.
    """
    newest: tuple[TermId, int] | None = None
    for index in sorted(entries):
        run = latest[index]
        entries[index].earlier_path = newest is not None and newest > run
        newest = run if newest is None else max(newest, run)
