"""In-process test agents and an event recorder, for tests that run Runtime objects."""

from __future__ import annotations

import asyncio
import copy
import threading
import time
from collections.abc import Callable
from typing import Any

from hamsterbunker.agent.step import StepContext, current_step
from hamsterbunker.records import Event

from . import wait_until

SECRET = "correct-horse-battery-staple"
AGENT = "a"


class Recorder:
    """A thread-safe on_event handler: keeps every event with its local monotonic arrival time."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._items: list[tuple[float, Event]] = []

    def __call__(self, event: Event) -> None:
        with self._lock:
            self._items.append((time.monotonic(), event))

    def timed(self, kind: str | None = None, node: str | None = None) -> list[tuple[float, Event]]:
        with self._lock:
            items = list(self._items)
        return [
            (t, e)
            for t, e in items
            if (kind is None or e.type == kind) and (node is None or e.node == node)
        ]

    def of(self, kind: str | None = None, node: str | None = None) -> list[Event]:
        return [e for _, e in self.timed(kind, node)]

    def types(self, node: str | None = None) -> list[str]:
        return [e.type for e in self.of(node=node)]

    def wait(
        self,
        kind: str,
        node: str | None = None,
        where: Callable[[Event], bool] = lambda e: True,
        timeout: float = 15.0,
    ) -> Event:
        began = time.monotonic()
        found = wait_until(
            lambda: [e for e in self.of(kind, node) if where(e)],
            lambda: (
                f"event {kind} from {node or 'any node'} (seen by then: {self.summary()}; "
                f"during the wait: {self.timeline(began)})"
            ),
            timeout,
        )
        return found[0]  # type: ignore[no-any-return]

    def summary(self) -> str:
        return ", ".join(f"{e.node}:{e.type}" for e in self.of())

    def timeline(self, since: float, most: int = 40) -> str:
        """The events that came after since (monotonic), with their times from it: the newest
        most, steps and publishes counted, not listed (what a failed wait shows)."""
        lines, routine = [], 0
        for at, e in self.timed():
            if at < since:
                continue
            if e.type in ("agent.step", "checkpoint.published"):
                routine += 1
                continue
            lines.append(f"+{at - since:.2f}s {e.node}:{e.type} epoch {e.epoch} seq {e.seq}")
        return "; ".join([*lines[-most:], f"{routine} steps and publishes"])


class CountingAgent:
    """Counts its steps; records the context, input and outcome of each; can park, slow or fail.

    * ``park_from``: steps with seq >= park_from wait until ``release`` is set;
    * ``slow``: seq -> seconds that step takes;
    * ``fail_once``: seqs whose first attempt changes its state, then raises.
    """

    def __init__(
        self,
        agent_id: str = AGENT,
        *,
        park_from: int | None = None,
        slow: dict[int, float] | None = None,
        fail_once: tuple[int, ...] = (),
        extra: dict[str, Any] | None = None,
    ) -> None:
        self.id = agent_id
        self.park_from = park_from
        self.slow = dict(slow or {})
        self.fail_once = set(fail_once)
        self.extra = dict(extra or {})
        self.release = threading.Event()
        self._lock = threading.Lock()
        self.init_calls = 0
        self.init_contexts: list[StepContext | None] = []
        self.entered: list[tuple[StepContext, dict[str, Any]]] = []
        self.returned: list[StepContext] = []
        self.cancelled: list[StepContext] = []

    def init(self) -> dict[str, Any]:
        with self._lock:
            self.init_calls += 1
            self.init_contexts.append(current_step())
        return {"n": 0, "effects": [], **self.extra}

    def _enter(self, state: dict[str, Any]) -> StepContext:
        context = current_step()
        assert context is not None, "current_step() is None inside a step"
        with self._lock:
            self.entered.append((context, copy.deepcopy(state)))
        return context

    def _parks(self, context: StepContext) -> bool:
        return self.park_from is not None and context.seq >= self.park_from

    def _finish(self, context: StepContext, state: dict[str, Any]) -> dict[str, Any]:
        if context.seq in self.fail_once:
            self.fail_once.discard(context.seq)
            state["effects"].append(f"failed-{context.seq}")  # must never be published
            raise RuntimeError(f"step {context.seq} fails once")
        state["n"] += 1
        state["effects"].append(context.seq)
        with self._lock:
            self.returned.append(context)
        return state

    def entered_ctx(self) -> list[StepContext]:
        with self._lock:
            return [c for c, _ in self.entered]

    def entered_seqs(self) -> list[int]:
        with self._lock:
            return [c.seq for c, _ in self.entered]

    def returned_seqs(self) -> list[int]:
        with self._lock:
            return [c.seq for c in self.returned]


class AsyncAgent(CountingAgent):
    async def step(self, state: dict[str, Any]) -> dict[str, Any]:
        context = self._enter(state)
        try:
            if context.seq in self.slow:
                await asyncio.sleep(self.slow[context.seq])
            if self._parks(context):
                while not self.release.is_set():
                    await asyncio.sleep(0.01)
        except asyncio.CancelledError:
            with self._lock:
                self.cancelled.append(context)
            raise
        return self._finish(context, state)


class SyncAgent(CountingAgent):
    def step(self, state: dict[str, Any]) -> dict[str, Any]:
        context = self._enter(state)
        if context.seq in self.slow:
            time.sleep(self.slow[context.seq])
        if self._parks(context):
            self.release.wait(30)
        return self._finish(context, state)
