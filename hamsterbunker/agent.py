"""The agent API: an object with ``id``, ``init()`` and ``step(state)``.

``step`` may be ``async def``. State is a JSON-serialisable dict. While a step
runs, ``current_step()`` tells it the epoch and sequence number it runs under,
so it can make its own side effects idempotent (a step that crashed may run
again; exactly-once side effects are not promised).
"""

from __future__ import annotations

import importlib
from collections.abc import Awaitable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from .errors import ConfigError

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
