"""The effect journal of one leader's term: sealed records in the store, fenced by its lease.

``hamsterbunker.effects`` holds the rules of journaled effects; this part
seals each record (the associated data binds agent, step, number, kind and
name), writes it with ``Store.put_effect`` under the term's fence, and reads
a step's journal back for a replay, keeping only what authenticates as that
step's record and was written no earlier than the checkpoint the step builds
on (an older record belongs to a history that was given up).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from ..clock import Clock
from ..effects import Entry, StepEffects, effect_key
from ..errors import EffectError, Fenced, Tampered
from ..limits import EFFECT_KINDS, MAX_EFFECT_BYTES
from ..sealing import EffectAt, Sealer
from ..stores import Fence, Store
from .calls import NodeCalls
from .events import EventSink
from .state import Identity

__all__ = ["TermJournal"]

log = logging.getLogger("hamsterbunker")


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
    ) -> None:
        self._id, self._store, self._sealer, self._fence = identity, store, sealer, fence
        self._calls, self._sink, self._clock = calls, sink, clock
        self._salt = sealer.cluster.salt
        # The journal of the step being run (every attempt of it in this term shares it).
        self._seq = 0
        self._entries: dict[int, Entry] | None = None
        self._base_epoch = 0  # the epoch of the checkpoint the first step builds on

    def for_step(self, seq: int, base_epoch: int, *, first: bool) -> dict[int, Entry] | None:
        """The journal of step seq as this term knows it: None (read it from the store when
        first needed) for the term's first step, which may be a replay; empty for the later
        ones, whose records only this term can have written."""
        if seq != self._seq:
            self._seq, self._base_epoch = seq, base_epoch
            self._entries = None if first else {}
        return self._entries

    def keep(self, effects: StepEffects) -> None:
        """Keep what an attempt of the step learnt of its journal, for the next attempt."""
        if effects.seq == self._seq:
            self._entries = effects.entries

    # -- JournalIO --------------------------------------------------------------

    async def load(self, seq: int) -> dict[int, Entry]:
        stored = await self._calls.io(self._store.read_effects, self._id.agent, seq)
        entries: dict[int, Entry] = {}
        for (index, kind), blob in sorted(stored.items()):
            at = EffectAt(self._id.agent, seq, index, kind)
            try:
                opened = await self._calls.work(self._sealer.open_effect, blob, at)
                if not self._base_epoch <= opened.epoch <= self._fence.epoch:
                    raise Tampered(
                        f"written under epoch {opened.epoch}, outside {self._base_epoch}.."
                        f"{self._fence.epoch}: a record of a history given up"
                    )
            except Tampered as exc:
                self.emit("effect.rejected", step_seq=seq, index=index, record=kind, error=str(exc))
                continue
            payload = opened.payload
            entry = entries.get(index)
            if entry is None or entry.name != opened.name:
                entry = entries[index] = Entry(opened.name, str(payload.get("replay", "safe")))
            if kind == "intent":
                entry.intent = True
            else:
                entry.outcome = payload.get("outcome")
        return entries

    async def write(self, seq: int, index: int, kind: str, entry: Entry) -> None:
        assert kind in EFFECT_KINDS
        payload: dict[str, Any] = {"replay": entry.replay}
        if kind == "outcome":
            payload["outcome"] = entry.outcome
        at = EffectAt(self._id.agent, seq, index, kind, entry.name)
        blob = await self._calls.work(self._sealer.seal_effect, at, self._fence.epoch, payload)
        if len(blob) > MAX_EFFECT_BYTES:
            raise EffectError(
                f"effect {entry.name!r}: its {kind} is {len(blob)} bytes sealed, above the limit "
                f"of {MAX_EFFECT_BYTES} bytes: return a smaller result (it is not recorded)"
            )
        started = self._clock.monotonic()
        try:
            await self._calls.io(
                self._store.put_effect, self._id.agent, self._fence, seq, index, kind, blob
            )
        except Fenced as exc:
            # Said here, where it happens: the step that made the write may have been
            # given up already, and nobody would hear of it otherwise.
            self.history("effect_record", seq, started, "fenced", index=index, record=kind)
            self.emit("node.fenced", error=str(exc), step_seq=seq)
            raise

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
