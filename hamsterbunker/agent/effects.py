"""Journaled effects: what a step does to the world, recorded so that a replay never repeats it.

A step's effects (``current_step().effect``) are numbered in call order; each outcome (result,
or exception type and message) is sealed and written under the lease's fence before
``effect`` returns, and a replay on any node gets it back without calling ``fn``.
``replay="interrupted"`` writes an intent first: found alone, it raises ``EffectInterrupted``.
What earlier runs wrote past an effect called anew is another path's (``Entry.earlier_path``).
How records reach the store is a ``JournalIO`` (``hamsterbunker.node.journal``).
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import json
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Protocol

from ..core.errors import (
    EffectError,
    EffectFailed,
    EffectInterrupted,
    EffectMismatch,
    Fenced,
    StepLost,
)
from ..core.failpoints import failpoint
from ..core.limits import MAX_EFFECTS_PER_STEP

__all__ = [
    "REPLAYS",
    "EffectContext",
    "Entry",
    "JournalIO",
    "StepEffects",
    "current_effect",
    "effect_key",
]

REPLAYS = ("safe", "interrupted")
MAX_NAME_LENGTH = 200
# How much of an exception's message an outcome keeps.
MAX_ERROR_MESSAGE = 2000


@dataclass(frozen=True)
class EffectContext:
    """What the running effect's function can learn (``current_effect()``)."""

    name: str
    seq: int
    index: int
    replay: str
    # Stable idempotency key: the same on every run of this effect, on any node.
    key: str


_current: ContextVar[EffectContext | None] = ContextVar("hamsterbunker_effect", default=None)


def current_effect() -> EffectContext | None:
    """The effect whose function is running in this task or thread, or None outside one."""
    return _current.get()


def effect_key(cluster_salt: str, agent: str, seq: int, index: int, name: str) -> str:
    """The idempotency key of one effect: cluster, agent, step, number and name, hashed."""
    text = json.dumps([cluster_salt, agent, seq, index, name])
    return "hb-" + hashlib.sha256(text.encode()).hexdigest()[:32]


@dataclass
class Entry:
    """What the journal holds for one effect number of one step."""

    name: str
    replay: str
    intent: bool = False  # an intent record is stored (replay="interrupted")
    outcome: dict[str, Any] | None = None  # {"result": ...} or {"error": {"type", "message"}}
    written: bool = True  # False: the outcome is known here but its record not yet accepted
    # Written by an earlier run of the step than an effect before it, which took another
    # path from there: a call of another name here writes over it (hamsterbunker.node.journal).
    earlier_path: bool = False

    @property
    def failed(self) -> bool:
        return self.outcome is not None and "error" in self.outcome


class JournalIO(Protocol):
    """How a step's journal reaches the store (sealed, fenced by the term's lease)."""

    async def load(self, seq: int) -> dict[int, Entry]:
        """The authentic records of step seq, by effect number."""

    async def write(self, seq: int, index: int, kind: str, entry: Entry) -> None:
        """Write the entry's intent or outcome; Fenced if the lease moved on."""

    def history(self, op: str, seq: int, started: float, outcome: str, **detail: Any) -> None:
        """A history line for an effect (``hb run --history``)."""

    def emit(self, kind: str, **detail: Any) -> None:
        """An event."""

    def now(self) -> float:
        """The node's clock."""

    def key(self, seq: int, index: int, name: str) -> str:
        """The effect's idempotency key."""

    async def call_blocking(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Call a blocking fn in a thread that nothing waits for when the node stops."""


class StepEffects:
    """The effects of one run (attempt) of one step. ``entries``: the step's journal as this
    node knows it, shared by every attempt in this term; ``None`` until first needed."""

    def __init__(
        self,
        seq: int,
        io: JournalIO,
        entries: dict[int, Entry] | None,
        *,
        may_start: Callable[[], bool],
        rerun_failures: bool = False,
    ) -> None:
        self.seq, self._io, self.entries = seq, io, entries
        self._may_start = may_start
        # After the step itself failed, its retry calls failed "safe" effects again.
        self._rerun_failures = rerun_failures
        self._next = 0
        self.reused = 0
        self.shown: list[list[str]] = []  # (name, state) of each effect called, for heartbeats
        self._load_lock = asyncio.Lock()

    async def load(self) -> None:
        """Read the step's journal now, not at its first effect (StoreError if it fails)."""
        await self._journal()

    async def _journal(self) -> dict[int, Entry]:
        async with self._load_lock:
            if self.entries is None:
                self.entries = await self._io.load(self.seq)
        return self.entries

    def _show(self, index: int, name: str, state: str) -> None:
        while len(self.shown) <= index:
            self.shown.append(["", ""])
        self.shown[index] = [name, state]

    async def run(
        self, name: str, fn: Callable[..., Any], args: Any, kwargs: Any, replay: str
    ) -> Any:
        """Call fn once per step, journaled: see the module docstring."""
        if not isinstance(name, str) or not 0 < len(name) <= MAX_NAME_LENGTH:
            raise ValueError(f"an effect needs a name of 1 to {MAX_NAME_LENGTH} characters")
        if replay not in REPLAYS:
            raise ValueError(f"replay must be one of {', '.join(REPLAYS)}, not {replay!r}")
        index, self._next = self._next, self._next + 1
        if index >= MAX_EFFECTS_PER_STEP:
            raise EffectError(
                f"step {self.seq} called more than {MAX_EFFECTS_PER_STEP} journaled effects"
            )
        journal = await self._journal()
        entry = journal.get(index)
        if entry is not None and entry.name != name:
            if not entry.earlier_path:
                raise EffectMismatch(self.seq, index, entry.name, name)
            entry = None  # a path the failed run took, not this one: written over
        if entry is not None and self._rerun_failures and entry.failed and entry.replay == "safe":
            self._another_path_from(index, journal)
            entry = None
        if entry is not None:
            return await self._replay(index, entry)
        # Called anew where an earlier run may have gone on (its record here was cut off or
        # deleted): what that run wrote after this may be of another path.
        self._another_path_from(index, journal)
        return await self._call(index, name, fn, args, kwargs, replay)

    def _another_path_from(self, index: int, journal: dict[int, Entry]) -> None:
        """Mark what earlier runs recorded after index as of another path: written over where
        this run, or a later one, calls another name."""
        for later, entry in journal.items():
            if later > index:
                entry.earlier_path = True

    async def _replay(self, index: int, entry: Entry) -> Any:
        started = self._io.now()
        key = self._io.key(self.seq, index, entry.name)
        if entry.outcome is None:  # an intent alone: it may or may not have happened
            self._show(index, entry.name, "interrupted")
            self._io.emit("effect.interrupted", step_seq=self.seq, index=index, name=entry.name)
            self._io.history("effect", self.seq, started, "interrupted", index=index, key=key)
            raise EffectInterrupted(entry.name, self.seq, index)
        if not entry.written:  # known here from a run whose record did not land: write it now
            await self._io.write(self.seq, index, "outcome", entry)
            entry.written = True
        self.reused += 1
        self._show(index, entry.name, "reused")
        self._io.history(
            "effect", self.seq, started, "replayed", index=index, key=key,
            digest=_digest(entry.outcome),
        )  # fmt: skip
        return _result_of(entry)

    async def _call(
        self, index: int, name: str, fn: Callable[..., Any], args: Any, kwargs: Any, replay: str
    ) -> Any:
        if not self._may_start():
            raise StepLost(
                f"effect {name!r} of step {self.seq} not started: the lease's renew deadline "
                "passed or the lease was lost"
            )
        key = self._io.key(self.seq, index, name)
        entry = Entry(name, replay)
        if replay == "interrupted":
            await self._write_intent(index, entry)
        started = self._io.now()
        self._io.history("effect_start", self.seq, started, "started", index=index, key=key,
                         replay=replay)  # fmt: skip
        self._show(index, name, "running")
        context = EffectContext(name, self.seq, index, replay, key)
        outcome, cause = await self._invoke(context, fn, args, kwargs)
        failpoint("effect.after_call")
        if not self._may_start():
            # Given up while fn ran (an abandoned sync step): a retry beside it may already
            # have reported the effect interrupted, so its outcome is not recorded now.
            raise StepLost(
                f"effect {name!r} of step {self.seq} returned after its step was given up"
            )
        done = Entry(name, replay, intent=entry.intent, outcome=outcome, written=False)
        await self._record(index, entry, done)
        failpoint("effect.after_record")
        self._show(index, name, "done" if cause is None else "failed")
        self._io.history("effect", self.seq, started, "ok" if cause is None else "failed",
                         index=index, key=key, digest=_digest(outcome))  # fmt: skip
        if cause is not None:
            raise _result_error(done) from cause
        return outcome["result"]

    async def _write_intent(self, index: int, entry: Entry) -> None:
        """Write entry's intent before its effect is called; StepLost if the lease went
        meanwhile (the intent is kept: a replay reports the effect interrupted)."""
        assert self.entries is not None
        entry.intent = True
        failpoint("effect.before_intent")
        await self._io.write(self.seq, index, "intent", entry)
        failpoint("effect.after_intent")
        self.entries[index] = entry
        if not self._may_start():
            raise StepLost(f"effect {entry.name!r} of step {self.seq} not started: lease lost")

    async def _invoke(
        self, context: EffectContext, fn: Callable[..., Any], args: Any, kwargs: Any
    ) -> tuple[dict[str, Any], Exception | None]:
        """Call fn as the running effect: its outcome, and the exception it raised (None if
        it returned)."""
        token = _current.set(context)
        try:
            if inspect.iscoroutinefunction(fn):
                result = await fn(*args, **kwargs)
            else:
                result = await self._io.call_blocking(fn, *args, **kwargs)
                if inspect.isawaitable(result):
                    result = await result
            _check_serialisable(context.name, result)
            return {"result": result}, None
        except (EffectError, StepLost, Fenced):
            raise
        except Exception as exc:
            error = {"type": type(exc).__qualname__, "message": str(exc)[:MAX_ERROR_MESSAGE]}
            return {"error": error}, exc
        finally:
            _current.reset(token)

    async def _record(self, index: int, entry: Entry, done: Entry) -> None:
        """Write done, the outcome of entry's effect; an EffectError (it cannot be recorded:
        too large) leaves the journal as if the effect never returned."""
        assert self.entries is not None
        # Known here before the store has it: a retry of the step writes it, never calls again.
        # (No await since the caller's check: a retry on this loop sees this or the check failed.)
        self.entries[index] = done
        try:
            await self._io.write(self.seq, index, "outcome", done)
        except EffectError:
            if entry.intent:
                self.entries[index] = entry
            else:
                del self.entries[index]
            raise
        done.written = True


def _check_serialisable(name: str, result: Any) -> None:
    try:
        json.dumps(result, allow_nan=False, ensure_ascii=False).encode()
    except (TypeError, ValueError) as exc:  # UnicodeEncodeError (a lone surrogate) included
        raise EffectError(
            f"effect {name!r} returned a {type(result).__name__}, which is not "
            f"JSON-serialisable ({exc}): its result is not recorded"
        ) from None


def _digest(outcome: dict[str, Any] | None) -> str:
    """A short digest of an outcome, for the history checker to compare runs."""
    text = json.dumps(outcome, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _result_error(entry: Entry) -> EffectFailed:
    assert entry.outcome is not None
    error = entry.outcome["error"]
    return EffectFailed(entry.name, str(error.get("type")), str(error.get("message")))


def _result_of(entry: Entry) -> Any:
    assert entry.outcome is not None
    if "error" in entry.outcome:
        raise _result_error(entry)
    return entry.outcome.get("result")
