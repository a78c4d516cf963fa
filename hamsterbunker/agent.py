"""The agent API: an object with ``id``, ``init()`` and ``step(state)``.

``step`` may be ``async def``. State is a JSON-serialisable dict. While a step
runs, ``current_step()`` tells it the epoch and sequence number it runs under,
so it can make its own side effects idempotent (a step that crashed may run
again; exactly-once side effects are not promised).

An async step is cancelled when its node may no longer publish it. A sync
step runs in a thread, which nothing can cancel: it should look at
``current_step().lost`` between pieces of work, or call
``current_step().check()``, which raises StepLost once the step's result can
no longer be published, so that it stops instead of running on into the next
leader's term.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from .errors import ConfigError, StepLost

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
