"""A PydanticAI run journaled against the same run unjournaled, side by side, in one step."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from hamsterbunker import FileStore, LeaseTiming, Runtime
from hamsterbunker.integrations.pydantic_ai import JournaledAgent

from .common import SECRET, BenchmarkError, Check, Result, Table, ms, percentile, temp_dir

NAME = "integrations"
TITLE = "PydanticAI: a journaled run against the same run unjournaled (file store)"
ROUNDS, QUICK_ROUNDS = 60, 10
REQUESTS, TOOLS_PER_REQUEST = 3, 2  # a run: 3 model requests, 2 tool calls after each of 2
UNITS = REQUESTS + TOOLS_PER_REQUEST * (REQUESTS - 1)  # journaled calls per run: 7
TARGET_MS = 2.0  # (the issue) per journaled call, on the file store
WAIT_S = 300.0

METHOD = f"""\
One in-process node (`Runtime`, the file store in a temporary directory on this
machine's disk, default timing) leads an agent whose step, each round, runs the same
PydanticAI agent twice on the node's event loop, in alternating order: once plain
(`agent.run`) and once through `JournaledAgent.run`. The model is a `FunctionModel`
that answers at once: {REQUESTS} model requests per run, the first {REQUESTS - 1} each
asking for {TOOLS_PER_REQUEST} tool calls (instant tools), so a journaled run makes
{UNITS} journaled calls, each a sealed, fenced store write. The overhead per journaled
call is (journaled run − plain run) / {UNITS}, per round; {ROUNDS} rounds ({QUICK_ROUNDS}
with `--quick`). The step's checkpoint publish is not in either time.
"""


def _model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    answered = sum(1 for message in messages if message.kind == "response")
    if answered < REQUESTS - 1:
        calls = [ToolCallPart("lookup", {"q": f"{answered}-{i}"}) for i in range(TOOLS_PER_REQUEST)]
        return ModelResponse(parts=calls)
    return ModelResponse(parts=[TextPart("done")])


def _agent() -> Agent[None, str]:
    agent = Agent(FunctionModel(_model), name="bench")

    @agent.tool_plain
    def lookup(q: str) -> str:
        return q.upper()

    return agent


class _Bench:
    id = "pydantic-bench"

    def __init__(self, rounds: int) -> None:
        self.agent = _agent()
        self.journaled = JournaledAgent(self.agent)
        self.rounds = rounds
        self.times: list[tuple[float, float]] = []  # (plain, journaled) seconds
        self.done = threading.Event()

    def init(self) -> dict[str, Any]:
        return {"round": 0}

    async def step(self, state: dict[str, Any]) -> dict[str, Any]:
        if state["round"] >= self.rounds:
            self.done.set()
            await asyncio.sleep(0.05)
            return state
        plain = journaled = 0.0
        for which in (0, 1) if state["round"] % 2 else (1, 0):
            started = time.perf_counter()
            if which:
                await self.journaled.run("go")
                journaled = time.perf_counter() - started
            else:
                await self.agent.run("go")
                plain = time.perf_counter() - started
        self.times.append((plain, journaled))
        return {"round": state["round"] + 1}


def run(quick: bool) -> Result:
    rounds = QUICK_ROUNDS if quick else ROUNDS
    bench = _Bench(rounds)
    with temp_dir("integrations") as work:
        node = Runtime(node_id="bench-1", region="local", store=FileStore(work / "store"),
                       agent=bench, secret=SECRET, timing=LeaseTiming())  # fmt: skip
        node.start()
        try:
            if not bench.done.wait(WAIT_S):
                raise BenchmarkError(f"only {len(bench.times)} of {rounds} rounds ran")
        finally:
            node.stop()
    plain = [p for p, _ in bench.times]
    journaled = [j for _, j in bench.times]
    per_call = [(j - p) / UNITS for p, j in bench.times]
    row = [
        [name, ms(percentile(v, 50)), ms(percentile(v, 99))]
        for name, v in (
            ("plain run (agent.run)", plain),
            (f"journaled run ({UNITS} journaled calls)", journaled),
            ("overhead per journaled call", per_call),
        )
    ]
    table = Table("One run, side by side in the same step", ["", "p50", "p99"], row)
    p50 = percentile(per_call, 50)
    check = Check(
        "overhead per journaled call, p50 (file store)",
        ms(p50),
        f"≤ {TARGET_MS:.0f} ms",
        p50 * 1000 <= TARGET_MS,
    )
    notes = [f"{len(bench.times)} rounds. DBOS's DBOSAgent on PostgreSQL is not measured here yet."]
    return Result(NAME, TITLE, METHOD, [table], [check], notes)
