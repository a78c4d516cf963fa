"""A LangGraph graph as a HamsterBunker agent (docs/integrations.md ("LangGraph")), offline.

The graph writes a short piece on a topic: plan -> research -> approve -> write. Each node
"works" for a second (standing in for a model call) and notes which node ran it; approve
asks a human (``interrupt()``) and waits, across steps, for the answer from the inbox.

Run it as is: two nodes in this process on a temporary store; a topic is submitted, the
question comes back, the answer is submitted, and the leader is stopped with no grace (its
step cut off as a crash would leave it) while ``write`` runs. The other node takes over:
it reuses plan, research and approve from the journal and runs only ``write`` (the log
names the node that ran each).

    PYTHONPATH=examples .venv/bin/python examples/langgraph_graph.py

Or under ``hb run`` (``--agent langgraph_graph:Writer``), asked with ``hb submit``:

    hb submit --store URL --agent-id writer --wait --data '{"topic": "owls"}'
    hb submit --store URL --agent-id writer --wait --data '"yes"'
"""

from __future__ import annotations

import asyncio
import operator
import os
import tempfile
import time
from typing import Annotated, Any, TypedDict

from langgraph.graph import END, START, StateGraph
from langgraph.types import interrupt

from hamsterbunker import Client, FileStore, LeaseTiming, Runtime, current_step
from hamsterbunker.integrations.langgraph import GraphAgent

WORK_S = float(os.environ.get("LANGGRAPH_WORK_S", "1"))
writing: list[str] = []  # the node that runs write (the demo stops it then)


class Piece(TypedDict, total=False):
    topic: str
    log: Annotated[list[str], operator.add]
    approved: str


async def work(name: str) -> str:
    step = current_step()
    where = step.node if step is not None else "-"
    print(f"   {where} runs {name}")
    if name == "write":
        writing.append(where)
    await asyncio.sleep(WORK_S)  # a model call would go here
    return f"{name}@{where}"


async def plan(piece: Piece) -> dict[str, Any]:
    return {"log": [await work("plan")]}


async def research(piece: Piece) -> dict[str, Any]:
    return {"log": [await work("research")]}


async def approve(piece: Piece) -> dict[str, Any]:
    answer = interrupt({"question": f"write the piece on {piece['topic']}?"})
    return {"log": [await work("approve")], "approved": str(answer)}


async def write(piece: Piece) -> dict[str, Any]:
    return {"log": [await work("write")]}


def build_graph() -> Any:
    builder = StateGraph(Piece)
    builder.add_node("plan", plan)
    builder.add_node("research", research)
    builder.add_node("approve", approve)
    builder.add_node("write", write)
    builder.add_edge(START, "plan")
    builder.add_edge("plan", "research")
    builder.add_edge("research", "approve")
    builder.add_edge("approve", "write")
    builder.add_edge("write", END)
    return builder.compile()


class Writer(GraphAgent):
    def __init__(self) -> None:
        super().__init__("writer", build_graph())


def main() -> None:
    secret = "an-example-secret"
    with tempfile.TemporaryDirectory() as directory:
        store = FileStore(directory)
        timing = LeaseTiming(tick_ms=100, lease_ttl_ms=3000)  # the stop hands over at once
        agent = Writer()
        nodes = [
            Runtime(node_id=name, region="r", store=store, agent=agent, secret=secret,
                    timing=timing, stop_grace_ms=0)
            for name in ("node-a", "node-b")
        ]  # fmt: skip
        for node in nodes:
            node.start()
        with Client(store, secret) as client:
            client.submit("writer", {"topic": "owls", "log": []}, request_id="topic")
            print("asked:", client.result("writer", "topic", timeout=60))
            client.submit("writer", "yes", request_id="answer")
            deadline = time.monotonic() + 60
            while not writing and time.monotonic() < deadline:
                time.sleep(0.05)
            if not writing:
                raise SystemExit("the graph never reached write")
            print(f"!! stopping {writing[0]} with no grace while it writes (as a crash would)")
            next(node for node in nodes if node.node_id == writing[0]).stop()
            print("answered:", client.result("writer", "answer", timeout=60))
        for node in nodes:
            node.stop()


if __name__ == "__main__":
    main()
