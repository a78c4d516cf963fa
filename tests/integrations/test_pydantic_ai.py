"""PydanticAI runs journaled (hamsterbunker.integrations.pydantic_ai), in-process on a MemoryStore.

Node "a" runs a step that runs a PydanticAI agent and parks inside a model request or
a tool call; it is stopped with no grace, as a crash would leave it; node "b" takes
over and replays the step. The model is a ``FunctionModel`` that counts its calls per
node, as the tools do, so what the replay called again is counted, not guessed.
Killed processes: tests/integrations/test_pydantic_ai_kill.py.
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
from fastmcp import FastMCP
from pydantic_ai import Agent
from pydantic_ai.mcp import MCPToolset
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from hamsterbunker import EffectInterrupted, LeaseTiming, Runtime, current_step
from hamsterbunker.integrations.pydantic_ai import JournaledAgent, dump_messages, load_messages
from hamsterbunker.testing import MemoryStore
from tests.support import wait_until
from tests.support.agents import AGENT, SECRET, Recorder

TIMING = LeaseTiming(tick_ms=50, lease_ttl_ms=1500)  # room for a loaded machine
WAIT_S = 20.0


def node() -> str:
    step = current_step()
    return "outside" if step is None else step.node


def requests_answered(messages: list[ModelMessage]) -> int:
    return sum(1 for message in messages if message.kind == "response")


class World:
    """The model and the tools: counts each real call by node; parks node a where asked."""

    def __init__(self, park_at: str) -> None:
        self.calls: Counter[str] = Counter()
        self.park_at = park_at
        self.parked = threading.Event()
        self.running = self.most_running = 0  # tool calls at once

    async def _maybe_park(self, what: str) -> None:
        self.calls[f"{what}@{node()}"] += 1
        if what == self.park_at and node() == "a":
            self.parked.set()
            await asyncio.sleep(3600)  # cancelled when the node stops

    async def _tool(self, what: str) -> None:
        self.running += 1
        self.most_running = max(self.most_running, self.running)
        try:
            await asyncio.sleep(0.01)  # room for another call to start, were they parallel
            await self._maybe_park(what)
        finally:
            self.running -= 1

    async def model(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        n = requests_answered(messages)
        await self._maybe_park(f"request{n}")
        if n < 2:  # two rounds of two tool calls, then the answer
            return ModelResponse(
                parts=[
                    ToolCallPart("lookup", {"q": f"x{n}"}),
                    ToolCallPart("send", {"to": f"y{n}"}),
                ]
            )
        return ModelResponse(parts=[TextPart(f"done after {n} requests")])

    def agent(self) -> Agent[None, str]:
        agent = Agent(FunctionModel(self.model), name="assistant")

        @agent.tool_plain
        async def lookup(q: str) -> str:
            await self._tool(f"lookup:{q}")
            return q.upper()

        @agent.tool_plain
        async def send(to: str) -> str:
            await self._tool(f"send:{to}")
            return f"sent to {to}"

        return agent


class Assistant:
    """Runs one journaled PydanticAI run per step while prompts are left, keeping the history."""

    id = AGENT

    def __init__(self, journaled: JournaledAgent[None], prompts: list[str]) -> None:
        self.journaled = journaled
        self.prompts = prompts
        self.outcomes: list[tuple[str, str]] = []  # (node, output or the error's type)
        self.idle = threading.Event()

    def init(self) -> dict[str, Any]:
        return {"done": 0, "history": [], "outputs": []}

    async def step(self, state: dict[str, Any]) -> dict[str, Any]:
        if state["done"] >= len(self.prompts):
            self.idle.set()
            await asyncio.sleep(0.05)
            return state
        history = load_messages(state["history"])
        try:
            result = await self.journaled.run(self.prompts[state["done"]], message_history=history)
        except EffectInterrupted as exc:
            self.outcomes.append((node(), type(exc).__name__))
            raise
        self.outcomes.append((node(), result.output))
        return {
            "done": state["done"] + 1,
            "history": dump_messages(result.all_messages()),
            "outputs": [*state["outputs"], result.output],
        }


class Nodes:
    def __init__(self) -> None:
        self.store = MemoryStore()
        self.events = Recorder()
        self.made: list[Runtime] = []

    def start(self, node_id: str, agent: Any) -> Runtime:
        runtime = Runtime(node_id=node_id, region="r", store=self.store, agent=agent,
                          secret=SECRET, timing=TIMING, on_event=self.events,
                          stop_grace_ms=0)  # fmt: skip
        self.made.append(runtime)
        runtime.start()
        return runtime


@pytest.fixture
def nodes() -> Iterator[Nodes]:
    made = Nodes()
    yield made
    for runtime in made.made:
        runtime.stop()


def crash_a_then_b_takes_over(
    nodes: Nodes, world: World, make: Callable[[], Assistant]
) -> Assistant:
    nodes.start("a", make())
    assert world.parked.wait(WAIT_S), "node a never reached the point to park at"
    nodes.made[0].stop()
    b = make()
    nodes.start("b", b)
    return b


def test_the_replay_returns_recorded_requests_and_tool_results_and_calls_only_the_one_in_flight(
    nodes: Nodes,
) -> None:
    world = World(park_at="request2")
    journaled = JournaledAgent(world.agent())
    b = crash_a_then_b_takes_over(nodes, world, lambda: Assistant(journaled, ["go"]))
    assert b.idle.wait(WAIT_S), f"node b never finished: {b.outcomes}"
    assert b.outcomes == [("b", "done after 2 requests")]
    # Only the request a was in the middle of. (On a loaded machine a may lose its lease
    # mid-step and run the step again in a later term: a's own counts may be above one.)
    on_b = {what: count for what, count in world.calls.items() if what.endswith("@b")}
    assert on_b == {"request2@b": 1}, world.calls
    on_a = {what for what in world.calls if what.endswith("@a")}
    assert on_a == {
        "request0@a", "request1@a", "request2@a",
        "lookup:x0@a", "send:y0@a", "lookup:x1@a", "send:y1@a",
    }  # fmt: skip


def test_tool_calls_run_one_at_a_time_in_a_step_so_a_replay_numbers_them_the_same(
    nodes: Nodes,
) -> None:
    """Effects are numbered in call order: a response's two tool calls run one after the
    other in a step (in parallel outside one), and the replay finds each under its number."""
    world = World(park_at="send:y1")
    journaled = JournaledAgent(world.agent())
    b = crash_a_then_b_takes_over(nodes, world, lambda: Assistant(journaled, ["go"]))
    assert b.idle.wait(WAIT_S), f"node b never finished: {b.outcomes}"
    assert world.most_running == 1
    assert {what for what in world.calls if what.endswith("@b")} == {"send:y1@b", "request2@b"}
    outside = World(park_at="never")
    asyncio.run(JournaledAgent(outside.agent()).run("go"))
    assert outside.most_running == 2


def test_an_interrupted_tool_cut_by_a_crash_is_never_called_again(nodes: Nodes) -> None:
    """Declared in interrupted_tools, a call cut by the crash is reported, not repeated."""
    world = World(park_at="send:y0")
    journaled = JournaledAgent(world.agent(), interrupted_tools=("send",))
    b = crash_a_then_b_takes_over(nodes, world, lambda: Assistant(journaled, ["go"]))
    wait_until(lambda: ("b", "EffectInterrupted") in b.outcomes, "b's run to be interrupted")
    assert world.calls["send:y0@a"] == 1 and world.calls["send:y0@b"] == 0
    assert world.calls["lookup:x0@b"] == 0 and world.calls["request0@b"] == 0


def test_a_safe_tool_cut_by_a_crash_is_called_again(nodes: Nodes) -> None:
    """Not declared interrupted: the call in flight runs again (at least once)."""
    world = World(park_at="send:y0")
    journaled = JournaledAgent(world.agent())
    b = crash_a_then_b_takes_over(nodes, world, lambda: Assistant(journaled, ["go"]))
    assert b.idle.wait(WAIT_S), f"node b never finished: {b.outcomes}"
    assert world.calls["send:y0@b"] == 1 and world.calls["request0@b"] == 0


def test_the_history_lives_in_the_checkpoint_and_the_next_leader_goes_on_from_it(
    nodes: Nodes,
) -> None:
    """a publishes the first prompt's run and is cut in the second; b restores the history
    from the checkpoint: its model's first request sees the first run's three answers."""
    world = World(park_at="request3")
    journaled = JournaledAgent(world.agent())
    b = crash_a_then_b_takes_over(nodes, world, lambda: Assistant(journaled, ["first", "second"]))
    assert b.idle.wait(WAIT_S), f"node b never finished: {b.outcomes}"
    assert b.outcomes == [("b", "done after 3 requests")]
    assert {what for what in world.calls if what.endswith("@b")} == {"request3@b"}
    state = nodes.store.list_checkpoints(AGENT)
    assert state and state[0].seq >= 2


def test_a_streamed_run_is_journaled_whole(nodes: Nodes) -> None:
    calls: Counter[str] = Counter()
    parked = threading.Event()

    async def stream(messages: list[ModelMessage], info: AgentInfo) -> AsyncIterator[str]:
        calls[node()] += 1
        yield "hello "
        if node() == "a":
            parked.set()
            await asyncio.sleep(3600)
        yield "world"

    journaled = JournaledAgent(Agent(FunctionModel(stream_function=stream), name="streamer"))
    texts: list[tuple[str, str]] = []
    done = threading.Event()

    class Streamer:
        id = AGENT

        def init(self) -> dict[str, Any]:
            return {"text": ""}

        async def step(self, state: dict[str, Any]) -> dict[str, Any]:
            if state["text"]:
                done.set()
                await asyncio.sleep(0.05)
                return state
            async with journaled.run_stream("hi") as streamed:
                text = "".join([piece async for piece in streamed.stream_text(delta=True)])
            texts.append((node(), text))
            return {"text": text}

    nodes.start("a", Streamer())
    assert parked.wait(WAIT_S)
    nodes.made[0].stop()
    nodes.start("b", Streamer())
    assert done.wait(WAIT_S)
    assert texts == [("b", "hello world")]
    assert calls["b"] == 1  # the stream cut mid-way on a was never recorded


def test_an_mcp_toolsets_calls_are_journaled(nodes: Nodes) -> None:
    """An MCP server's tool (FastMCP, in this process) called once; the replay reuses it."""
    calls: Counter[str] = Counter()
    parked = threading.Event()
    server = FastMCP("calculator")

    @server.tool
    def add(a: int, b: int) -> int:
        calls[f"add {a} {b}"] += 1
        return a + b

    async def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        calls[f"request{requests_answered(messages)}@{node()}"] += 1
        if requests_answered(messages) == 0:
            return ModelResponse(parts=[ToolCallPart("add", {"a": 2, "b": 3})])
        if node() == "a":
            parked.set()
            await asyncio.sleep(3600)
        return ModelResponse(parts=[TextPart(f"the sum is {messages[-1].parts[0].content}")])

    tools = MCPToolset(server, id="calculator")
    journaled = JournaledAgent(Agent(FunctionModel(model), name="mcp", toolsets=[tools]))
    answers: list[str] = []
    answered = threading.Event()

    class Calculator:
        id = AGENT

        def init(self) -> dict[str, Any]:
            return {"answer": ""}

        async def step(self, state: dict[str, Any]) -> dict[str, Any]:
            if state["answer"]:
                answered.set()
                await asyncio.sleep(0.05)
                return state
            answers.append((await journaled.run("2 + 3?")).output)
            return {"answer": answers[-1]}

    nodes.start("a", Calculator())
    assert parked.wait(WAIT_S)
    nodes.made[0].stop()
    nodes.start("b", Calculator())
    assert answered.wait(WAIT_S)
    assert answers == ["the sum is 5"]
    assert calls["add 2 3"] == 1
    assert (calls["request0@b"], calls["request1@b"]) == (0, 1)


def test_outside_a_step_the_agent_runs_as_it_would_without_the_journal() -> None:
    world = World(park_at="never")
    result = asyncio.run(JournaledAgent(world.agent()).run("go"))
    assert result.output == "done after 2 requests"
    assert sum(world.calls.values()) == 7


def test_an_agent_without_a_name_is_refused() -> None:
    with pytest.raises(ValueError, match="needs a name"):
        JournaledAgent(Agent(FunctionModel(World("never").model)))
