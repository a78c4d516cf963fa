"""A LangGraph graph in a node, for tests that kill real node processes
(tests/integrations/test_langgraph_kill.py).

On the nodes' PYTHONPATH (via conftest), imported by the node as ``hb_langgraph_agents``.
``GraphTasks`` is a ``GraphAgent``: each step takes one inbox submission and runs the graph
plan -> research -> [approve] -> write on it ({"task": i, "ask": bool, "done": []}, one
LangGraph thread: what a task does not give, an earlier one left); a task that asks
passes through approve, which asks (``interrupt()``) and waits for the next submission.
Every real call of a node appends a line to HB_TEST_LG_JOURNAL when it starts and another
when it returns (``"phase": "start"`` / ``"end"``), and sleeps HB_TEST_LG_CALL_S seconds
between, so kills land inside nodes and the test counts the real calls from outside.
"""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any, TypedDict

from langgraph.graph import END, START, StateGraph
from langgraph.types import interrupt

from hamsterbunker import current_step
from hamsterbunker.integrations.langgraph import GraphAgent

__all__ = ["NODES", "GraphTasks", "expected_output"]

NODES = ("plan", "research", "write")  # every task's; approve too when it asks


class Task(TypedDict, total=False):
    task: int
    ask: bool
    done: list[str]  # no reducer: each task's input starts it anew
    approved: str


def _append_line(line: dict[str, Any]) -> None:
    """One JSON line in HB_TEST_LG_JOURNAL, appended in one write (nodes share the file)."""
    path = os.environ.get("HB_TEST_LG_JOURNAL")
    if not path:
        return
    step = current_step()
    line = {"node": step.node if step else None, **line}
    data = (json.dumps(line, separators=(",", ":")) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


async def _work(task: Task, name: str) -> dict[str, Any]:
    """A real call: logged when it starts and ends, HB_TEST_LG_CALL_S seconds (a kill lands
    here)."""
    _append_line({"phase": "start", "task": task["task"], "name": name})
    await asyncio.sleep(float(os.environ.get("HB_TEST_LG_CALL_S", "0.3")))
    _append_line({"phase": "end", "task": task["task"], "name": name})
    return {"done": [*task.get("done", []), name]}


async def plan(task: Task) -> dict[str, Any]:
    return await _work(task, "plan")


async def research(task: Task) -> dict[str, Any]:
    return await _work(task, "research")


async def approve(task: Task) -> dict[str, Any]:
    answer = interrupt({"question": f"write task {task['task']}?"})
    return {**await _work(task, "approve"), "approved": str(answer)}


async def write(task: Task) -> dict[str, Any]:
    return await _work(task, "write")


def _after_research(task: Task) -> str:
    return "approve" if task.get("ask") else "write"


def build_graph() -> Any:
    builder = StateGraph(Task)
    builder.add_node("plan", plan)
    builder.add_node("research", research)
    builder.add_node("approve", approve)
    builder.add_node("write", write)
    builder.add_edge(START, "plan")
    builder.add_edge("plan", "research")
    builder.add_conditional_edges("research", _after_research, ["approve", "write"])
    builder.add_edge("approve", "write")
    builder.add_edge("write", END)
    return builder.compile()


def expected_output(task: int, approved: str | None = None) -> dict[str, Any]:
    """The reply's output of a task (approved: the answer of a task that asked)."""
    if approved is None:
        return {"task": task, "ask": False, "done": list(NODES)}
    return {"task": task, "ask": True, "done": ["plan", "research", "approve", "write"],
            "approved": approved}  # fmt: skip


class GraphTasks(GraphAgent):
    def __init__(self) -> None:
        super().__init__("graph-tasks", build_graph(), idle_timeout=5.0)
