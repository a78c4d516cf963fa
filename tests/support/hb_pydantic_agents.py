"""A PydanticAI agent in a node, for tests that kill real node processes
(tests/integrations/test_pydantic_ai_kill.py).

On the nodes' PYTHONPATH (via conftest), imported by the node as ``hb_pydantic_agents``.
``PydanticTasks`` takes one inbox submission ({"task": i}) per step and runs a
``JournaledAgent`` on it: a ``FunctionModel`` whose answers depend only on the messages
asks for four tool calls over three model requests (two tools at once in the first),
one of them ``notify``, declared interrupted. Every real call of the model function
and of a tool appends a line to HB_TEST_PAI_JOURNAL when it starts and another when it
returns (``"phase": "start"`` / ``"end"``), and sleeps HB_TEST_PAI_CALL_S seconds
between, so kills land inside calls and the test counts the real calls from outside;
each line names the node and its epoch (the term the call was made in).
The test imports ``expected_output`` to know each reply.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
from typing import Any

from pydantic_ai import Agent, RunContext
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

from hamsterbunker import EffectInterrupted, current_step
from hamsterbunker.integrations.pydantic_ai import JournaledAgent, dump_messages, load_messages

__all__ = ["AGENT_NAME", "REQUESTS", "PydanticTasks", "expected_output"]

AGENT_NAME = "tasker"
REQUESTS = 3  # model requests per task


def _append_line(line: dict[str, Any]) -> None:
    """One JSON line in HB_TEST_PAI_JOURNAL, appended in one write (nodes share the file)."""
    path = os.environ.get("HB_TEST_PAI_JOURNAL")
    step = current_step()
    if not path:
        return
    line = {"node": step and step.node, "epoch": step and step.epoch, **line}
    data = (json.dumps(line, separators=(",", ":")) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


async def _call(kind: str, task: int, name: str, args: dict[str, Any]) -> None:
    """Log the start of a real call, take HB_TEST_PAI_CALL_S seconds (a kill lands here)."""
    _append_line({"phase": "start", "task": task, "kind": kind, "name": name, "args": args})
    await asyncio.sleep(float(os.environ.get("HB_TEST_PAI_CALL_S", "0.3")))


def _ended(kind: str, task: int, name: str, args: dict[str, Any]) -> None:
    _append_line({"phase": "end", "task": task, "kind": kind, "name": name, "args": args})


# -- the "world": three tools ---------------------------------------------------------


def lookup_value(key: str) -> str:
    return f"v{sum(key.encode()) % 97}"


async def lookup(ctx: RunContext[int], key: str) -> str:
    """Look a key up."""
    args = {"key": key}
    await _call("tool", ctx.deps, "lookup", args)
    _ended("tool", ctx.deps, "lookup", args)
    return lookup_value(key)


async def add(ctx: RunContext[int], a: int, b: int) -> int:
    """Add two numbers."""
    args = {"a": a, "b": b}
    await _call("tool", ctx.deps, "add", args)
    _ended("tool", ctx.deps, "add", args)
    return a + b


async def notify(ctx: RunContext[int], text: str) -> str:
    """Send a message (not to be sent twice: declared interrupted)."""
    args = {"text": text}
    await _call("tool", ctx.deps, "notify", args)
    _ended("tool", ctx.deps, "notify", args)
    return f"sent:{text}"


# -- the model: deterministic given the messages --------------------------------------


def _this_run(messages: list[ModelMessage]) -> tuple[int, list[ModelMessage]]:
    """The task of the run (its prompt, the last user prompt) and the messages since."""
    for i in range(len(messages) - 1, -1, -1):
        message = messages[i]
        if isinstance(message, ModelRequest):
            for part in message.parts:
                if isinstance(part, UserPromptPart) and isinstance(part.content, str):
                    found = re.fullmatch(r"task (\d+)", part.content)
                    if found:
                        return int(found.group(1)), messages[i:]
    raise ValueError("no task prompt in the messages")


def _returns(messages: list[ModelMessage]) -> dict[str, Any]:
    """The tool results of the run so far, by tool name (the latest of each)."""
    found: dict[str, Any] = {}
    for message in messages:
        if isinstance(message, ModelRequest):
            for part in message.parts:
                if isinstance(part, ToolReturnPart):
                    found[part.tool_name] = part.content
    return found


def plan(task: int, request: int, returns: dict[str, Any]) -> list[ToolCallPart] | str:
    """What the model answers to request number `request` of a task: tool calls, or the
    output."""
    if request == 0:
        return [
            ToolCallPart("lookup", {"key": f"item-{task}"}, tool_call_id=f"t{task}-lookup"),
            ToolCallPart("add", {"a": task, "b": 10}, tool_call_id=f"t{task}-add1"),
        ]
    if request == 1:
        text = f"task {task}: {returns['lookup']}+{returns['add']}"
        return [
            ToolCallPart("notify", {"text": text}, tool_call_id=f"t{task}-notify"),
            ToolCallPart("add", {"a": returns["add"], "b": 100}, tool_call_id=f"t{task}-add2"),
        ]
    return f"task {task} done: {returns['lookup']} {returns['add']} {returns['notify']}"


def expected_output(task: int) -> str:
    """The output of a task's run when nothing was interrupted."""
    value = lookup_value(f"item-{task}")
    text = f"task {task}: {value}+{task + 10}"
    return f"task {task} done: {value} {task + 110} sent:{text}"


async def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    task, run = _this_run(messages)
    request = sum(isinstance(m, ModelResponse) for m in run)
    args = {"messages": len(messages)}
    await _call("model", task, f"request-{request}", args)
    answer = plan(task, request, _returns(run))
    _ended("model", task, f"request-{request}", args)
    if isinstance(answer, str):
        return ModelResponse(parts=[TextPart(answer)])
    return ModelResponse(parts=list(answer))


def make_agent() -> JournaledAgent[int]:
    agent = Agent(FunctionModel(model), name=AGENT_NAME, deps_type=int, tools=[lookup, add, notify])
    return JournaledAgent(agent, interrupted_tools=("notify",))


class PydanticTasks:
    """Takes one submission ({"task": i}) per step and replies with its run's output:
    ``{"task": i, "output": ..., "node": ...}``; or, when a replay finds a ``notify`` cut
    by a kill (EffectInterrupted: it may or may not have been sent), with
    ``{"task": i, "unknown": "notify", "node": ...}`` and without running on (the message
    is not sent again). The state keeps the conversation (every finished run's messages,
    ``dump_messages``; the next run continues it) and the tasks answered, in order."""

    id = "pai"

    def __init__(self) -> None:
        self.journaled = make_agent()

    def init(self) -> dict[str, Any]:
        return {"messages": [], "answered": [], "unknown": []}

    async def step(self, state: dict[str, Any]) -> dict[str, Any]:
        ctx = current_step()
        assert ctx is not None
        shown = await ctx.wait_for_inbox(timeout=0.5)
        if not shown:
            return state
        submission = shown[0]
        task = int(submission.payload["task"])
        try:
            result = await self.journaled.run(
                f"task {task}", message_history=load_messages(state["messages"]), deps=task
            )
        except EffectInterrupted as exc:
            reply: dict[str, Any] = {"task": task, "unknown": "notify", "effect": exc.name}
            state["unknown"].append(task)
        else:
            reply = {"task": task, "output": result.output}
            state["messages"] = dump_messages(result.all_messages())
        ctx.consume(submission.number, reply={**reply, "node": ctx.node})
        state["answered"].append(task)
        return state
