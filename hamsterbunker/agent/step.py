"""The agent API: an object with ``id``, ``init()`` and ``step(state)`` (maybe ``async``),
state a JSON-serialisable dict. While a step runs, ``current_step()`` gives its context: its
epoch and seq, its journaled effects and its inbox. An async step is cancelled when its node
may no longer publish it; a sync step, which nothing can cancel, should look at
``current_step().lost`` (or call ``check()``, which raises StepLost) and stop.
"""

from __future__ import annotations

import asyncio
import importlib
import threading
from collections.abc import Awaitable, Callable, Coroutine
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from ..core.errors import ConfigError, EffectError, HamsterbunkerError, InboxError, StepLost
from .effects import StepEffects
from .inbox import StepInbox, Submission

__all__ = ["Agent", "StepContext", "current_step", "load_agent"]

State = dict[str, Any]


@runtime_checkable
class Agent(Protocol):
    id: str

    def init(self) -> State: ...

    def step(self, state: State) -> State | Awaitable[State]: ...


@dataclass(frozen=True)
class StepContext:
    """What the running step runs under: publish will be fenced by this epoch."""

    agent: str
    node: str
    epoch: int
    seq: int  # the sequence number this step's checkpoint will carry
    # Whether the node may still publish this step (its lease held, within the renew
    # deadline); set by the runtime. Thread-safe: a sync step asks from its thread.
    may_publish: Callable[[], bool] = field(default=lambda: True, repr=False, compare=False)
    # Set by the runtime when it has given up on this step (cancelled or abandoned).
    abandoned: threading.Event = field(default_factory=threading.Event, repr=False, compare=False)
    # The step's effect journal, and the node's event loop it runs on; set by the runtime.
    effects: StepEffects | None = field(default=None, repr=False, compare=False)
    loop: asyncio.AbstractEventLoop | None = field(default=None, repr=False, compare=False)
    # The step's view of the agent's inbox; set by the runtime.
    mailbox: StepInbox | None = field(default=None, repr=False, compare=False)

    async def effect(
        self, name: str, fn: Callable[..., Any], /, *args: Any, replay: str = "safe", **kwargs: Any
    ) -> Any:
        """Call fn(*args, **kwargs), sync (in a thread) or async, as the step's next journaled
        effect; its result must be JSON-serialisable. A replay of the step returns the recorded
        result (or raises EffectFailed) without calling fn. replay="interrupted": never called
        twice; a replay that cannot know whether it ran raises EffectInterrupted."""
        if self.effects is None:
            raise EffectError("effects are journaled only in a step run by a node")
        return await self.effects.run(name, fn, args, kwargs, replay)

    def effect_sync(
        self, name: str, fn: Callable[..., Any], /, *args: Any, replay: str = "safe", **kwargs: Any
    ) -> Any:
        """effect() for a sync step: called from the step's thread, returns the result."""
        if self.effects is None or self.loop is None:
            raise EffectError("effects are journaled only in a step run by a node")
        work = self._effect_in_step(name, fn, args, kwargs, replay)
        return self._on_node_loop(work, "effect_sync", EffectError)

    async def _effect_in_step(
        self, name: str, fn: Callable[..., Any], args: Any, kwargs: Any, replay: str
    ) -> Any:
        _current.set(self)  # this task runs on the node's loop, in a context of its own
        assert self.effects is not None
        return await self.effects.run(name, fn, args, kwargs, replay)

    @property
    def inbox(self) -> list[Submission]:
        """The admitted submissions not yet consumed, oldest first, as of the step's start or
        its last wait_for_inbox: at most as many as the step may still consume (32 in all)."""
        return [] if self.mailbox is None else self.mailbox.shown()

    def consume(self, number: int, reply: Any = None) -> None:
        """Mark submission number consumed, with its reply (JSON, optional), both committed
        with this step's checkpoint. InboxError for a number not in ``inbox``."""
        if self.mailbox is None:
            raise InboxError("the inbox is read only in a step run by a node")
        self.mailbox.consume(number, reply)

    async def wait_for_inbox(self, timeout: float | None = None) -> list[Submission]:
        """The inbox, once it holds anything (woken by the store's watch), or [] after timeout
        seconds."""
        if self.mailbox is None:
            raise InboxError("the inbox is read only in a step run by a node")
        return await self.mailbox.wait(timeout)

    def wait_for_inbox_sync(self, timeout: float | None = None) -> list[Submission]:
        """wait_for_inbox() for a sync step: called from the step's thread."""
        if self.mailbox is None or self.loop is None:
            raise InboxError("the inbox is read only in a step run by a node")
        shown: list[Submission] = self._on_node_loop(
            self.mailbox.wait(timeout), "wait_for_inbox_sync", InboxError
        )
        return shown

    def _on_node_loop(
        self, work: Coroutine[Any, Any, Any], what: str, misuse: type[HamsterbunkerError]
    ) -> Any:
        """Run work on the node's event loop from a sync step's thread, and wait for it."""
        assert self.loop is not None
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self.loop:
            work.close()
            raise misuse(f"{what} is for sync steps: await its async form in an async step")
        try:
            future = asyncio.run_coroutine_threadsafe(work, self.loop)
        except RuntimeError:  # the node's event loop has closed: the node stopped
            work.close()
            raise StepLost(f"step {self.seq}: the node has stopped") from None
        return future.result()

    @property
    def lost(self) -> bool:
        """True once this step's result can no longer be published: stop working on it."""
        return self.abandoned.is_set() or not self.may_publish()

    def check(self) -> None:
        """Raise StepLost once this step's result can no longer be published."""
        if self.lost:
            raise StepLost(
                f"step {self.seq} of epoch {self.epoch} can no longer be published: "
                "the lease's renew deadline passed or the lease was lost"
            )


_current: ContextVar[StepContext | None] = ContextVar("hamsterbunker_step", default=None)


def current_step() -> StepContext | None:
    """The context of the step running in this task or thread, or None outside a step."""
    return _current.get()


def load_agent(spec: str) -> Agent:
    """Load ``module:attribute``; a class or factory is called with no arguments."""
    module_name, sep, attribute = spec.partition(":")
    if not sep or not module_name or not attribute:
        raise ConfigError(f"agent {spec!r}: expected module:attribute, e.g. mypkg.agents:Counter")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"agent {spec!r}: cannot import module {module_name!r}: {exc}") from exc
    target: Any = module
    for part in attribute.split("."):
        try:
            target = getattr(target, part)
        except AttributeError as exc:
            raise ConfigError(
                f"agent {spec!r}: module {module_name!r} has no {attribute!r}"
            ) from exc
    agent = target() if callable(target) and not _looks_like_agent(target) else target
    if not _looks_like_agent(agent):
        raise ConfigError(f"agent {spec!r}: needs an id, init() and step(state)")
    return agent  # type: ignore[no-any-return]


def _looks_like_agent(obj: Any) -> bool:
    return (
        not isinstance(obj, type)
        and isinstance(getattr(obj, "id", None), str)
        and callable(getattr(obj, "init", None))
        and callable(getattr(obj, "step", None))
    )
