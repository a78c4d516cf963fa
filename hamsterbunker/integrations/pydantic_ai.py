"""PydanticAI agents journaled and fenced: every model request and tool call of a run is
one of the step's journaled effects, so a leader's replay after a kill calls neither again.

    from hamsterbunker.integrations.pydantic_ai import JournaledAgent

    journaled = JournaledAgent(agent, interrupted_tools=("send_email",))
    result = await journaled.run(prompt, message_history=history)  # inside a step

Built on PydanticAI's public durable-execution interface (``pydantic_ai.durable_exec``),
as its Temporal, DBOS and Prefect engines are: the run is the durable container, each
request, tool call and tool listing a durable unit (here: an effect). Outside a step the
agent runs as it would without this. Why it is built this way: docs/integrations.md.
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from contextlib import AbstractContextManager, asynccontextmanager
from dataclasses import dataclass
from typing import Any, Generic, Literal

from pydantic_ai import Agent
from pydantic_ai.agent import AbstractAgent
from pydantic_ai.durable_exec import (
    JSON_CODEC,
    BaseDurabilityCapability,
    CallableOperationBackend,
    DurabilityEngineSpec,
    DurableOperationId,
    JournalOperationNamer,
    RoleBasedOperationConfig,
)
from pydantic_ai.messages import ModelMessage, ModelMessagesTypeAdapter
from pydantic_ai.result import StreamedRunResult
from pydantic_ai.run import AgentRunResult
from pydantic_ai.tools import AgentDepsT

from ..agent.effects import MAX_NAME_LENGTH
from ..agent.step import current_step
from ..core.errors import EffectError

__all__ = ["HamsterbunkerDurability", "JournaledAgent", "dump_messages", "load_messages"]

Replay = Literal["safe", "interrupted"]


def dump_messages(messages: Sequence[ModelMessage]) -> list[Any]:
    """A message history as JSON values, for the agent's state (PydanticAI's own format)."""
    dumped: list[Any] = ModelMessagesTypeAdapter.dump_python(list(messages), mode="json")
    return dumped


def load_messages(data: Iterable[Any]) -> list[ModelMessage]:
    """The message history dump_messages made."""
    return ModelMessagesTypeAdapter.validate_python(list(data))


class _EffectBackend(CallableOperationBackend[Replay]):
    """Runs each durable unit as the running step's next journaled effect."""

    async def execute(
        self,
        *,
        operation_id: DurableOperationId,
        name: str,
        body: Callable[[], Awaitable[object]],
        cache_key: tuple[object, ...],
        config: Replay,
    ) -> object:
        step = current_step()
        if step is None:  # in_durable_context said otherwise a moment ago: a caller's misuse
            raise EffectError(f"{name}: a journaled PydanticAI call outside a step")
        return await step.effect(_effect_name(name), body, replay=config)


def _effect_name(name: str) -> str:
    """name as an effect's name: a long one keeps its start and a digest of the whole."""
    if len(name) <= MAX_NAME_LENGTH:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:16]
    return f"{name[: MAX_NAME_LENGTH - 17]}~{digest}"


@dataclass(init=False, kw_only=True)
class HamsterbunkerDurability(BaseDurabilityCapability[AgentDepsT]):
    """The capability that journals a PydanticAI agent's requests and tool calls as the
    running step's effects (``Agent(..., capabilities=[HamsterbunkerDurability()])``).

    interrupted_tools: the tools whose calls are journaled ``replay="interrupted"`` (an
    intent first: a replay that cannot know whether the call ran raises
    ``EffectInterrupted`` instead of calling it again); every other unit is ``"safe"``.
    """

    engine_spec = DurabilityEngineSpec(
        engine_name="HamsterBunker",
        durable_unit_noun="effect",
        durable_container_noun="step",
        codec=JSON_CODEC,  # an effect's result is JSON
        wrapped_toolset_kinds=frozenset({"function", "mcp", "dynamic"}),
        toolset_lifecycles={
            "function": "enter-always",
            "mcp": "enter-in-durable-unit",  # effects run in the step's own process
            "dynamic": "enter-never",
        },
        journal_discovery=True,
        # Effects are numbered in call order: tool calls in parallel would number differently
        # on a replay.
        sequential_tools_in_durable_context=True,
    )

    def __init__(self, *, interrupted_tools: Iterable[str] = (), name: str | None = None) -> None:
        super().__init__(name=name)
        self._interrupted = frozenset(interrupted_tools)

    @property
    def in_durable_context(self) -> bool:
        return current_step() is not None

    def get_durable_operation_backend(self) -> _EffectBackend:
        def replay_of(operation_id: DurableOperationId, tool: object, tool_name: str) -> Replay:
            return "interrupted" if tool_name in self._interrupted else "safe"

        config = RoleBasedOperationConfig[Replay](
            model="safe", event="safe", capability="safe", tool="safe", resolve_tool=replay_of
        )
        return _EffectBackend(namer=JournalOperationNamer(self.name), config=config)


class JournaledAgent(Generic[AgentDepsT]):
    """A PydanticAI ``Agent`` whose runs inside a step are journaled (see the module)."""

    def __init__(
        self,
        agent: Agent[AgentDepsT, Any],
        *,
        interrupted_tools: Iterable[str] = (),
    ) -> None:
        if agent.name is None:
            raise ValueError(
                "a journaled agent needs a name (Agent(..., name=...)): it names its effects"
            )
        self.agent: AbstractAgent[AgentDepsT, Any] = agent
        self.durability = HamsterbunkerDurability[AgentDepsT](
            interrupted_tools=interrupted_tools, name=agent.name
        )

    async def run(
        self,
        prompt: str | None = None,
        *,
        message_history: Sequence[ModelMessage] | None = None,
        deps: AgentDepsT = None,  # type: ignore[assignment]
        **kwargs: Any,
    ) -> AgentRunResult[Any]:
        """agent.run(prompt, ...), journaled when called inside a step."""
        with self._journaled():
            return await self.agent.run(
                prompt, message_history=message_history, deps=deps, **kwargs
            )

    @asynccontextmanager
    async def run_stream(
        self,
        prompt: str | None = None,
        *,
        message_history: Sequence[ModelMessage] | None = None,
        deps: AgentDepsT = None,  # type: ignore[assignment]
        **kwargs: Any,
    ) -> AsyncIterator[StreamedRunResult[AgentDepsT, Any]]:
        """agent.run_stream(prompt, ...), journaled inside a step: each streamed model
        response is recorded whole, so the stream yields it at once once recorded."""
        with self._journaled():
            async with self.agent.run_stream(
                prompt, message_history=message_history, deps=deps, **kwargs
            ) as streamed:
                yield streamed

    def _journaled(self) -> AbstractContextManager[None]:
        """The agent with this durability added to its capabilities, for one run."""
        return self.agent.override(
            capabilities=[*self.agent.root_capability.capabilities, self.durability]
        )
