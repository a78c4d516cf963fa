"""A LangGraph graph run in a step (hamsterbunker.integrations.langgraph), in-process on a
MemoryStore: node "a" is stopped with no grace while a graph node is in flight (as a crash
leaves it), node "b" takes over and replays the step. Each graph node counts its calls per
HamsterBunker node, so a completed graph node that ran again shows. A few run the graph
outside a step (compared with LangGraph's own checkpointer), and the example runs offline.
"""

from __future__ import annotations

import ast
import asyncio
import operator
import os
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest
from langchain_core.messages import AIMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.types import Command, RetryPolicy, Send, interrupt

from hamsterbunker import Client, LeaseTiming, Runtime, current_effect, current_step
from hamsterbunker.integrations.langgraph import GraphAgent, JournaledGraph
from hamsterbunker.testing import MemoryStore
from tests.support import wait_until
from tests.support.agents import AGENT, SECRET, Recorder

# A patient lease (renew deadline 1.2 s): a loaded machine must not cut a step short, or
# it would be replayed without a crash. (Node a's stop hands the lease over at once.)
TIMING = LeaseTiming(tick_ms=50, lease_ttl_ms=2000)
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
WAIT_S = 20.0


class GraphState(TypedDict, total=False):
    topic: str
    log: Annotated[list[str], operator.add]
    approved: str


class Calls:
    """The graph nodes' functions: count calls per (HamsterBunker node, graph node); park
    (never return) on node "a" in the graph nodes named in park."""

    def __init__(self, park: set[str] | None = None) -> None:
        self.count: Counter[tuple[str, str]] = Counter()
        self.keys: dict[tuple[str, str], str | None] = {}  # the effect's idempotency key
        self.park = park or set()
        self.parked = threading.Event()
        self.work_s = 0.0  # how long each call works (overlapping calls show in peak)
        self.running = self.peak = 0
        self._lock = threading.Lock()

    def count_call(self, graph_node: str) -> str:
        step = current_step()
        where = step.node if step is not None else "-"
        effect = current_effect()
        with self._lock:
            self.count[(where, graph_node)] += 1
            self.keys[(where, graph_node)] = effect.key if effect is not None else None
        return where

    async def enter(self, graph_node: str) -> None:
        where = self.count_call(graph_node)
        if where == "a" and graph_node in self.park:
            self.parked.set()
            await asyncio.sleep(3600)  # cancelled when node a stops
        with self._lock:
            self.running += 1
            self.peak = max(self.peak, self.running)
        await asyncio.sleep(self.work_s)
        with self._lock:
            self.running -= 1

    def on(self, node: str) -> dict[str, int]:
        return {graph_node: n for (where, graph_node), n in self.count.items() if where == node}

    def node(self, name: str) -> Any:
        async def run(state: GraphState) -> dict[str, Any]:
            await self.enter(name)
            return {"log": [name]}

        return run

    def sync_node(self, name: str) -> Any:
        """A plain function (LangGraph runs it in a thread): counted, never parked."""

        def run(state: GraphState) -> dict[str, Any]:
            self.count_call(name)
            return {"log": [name]}

        return run


class Nodes:
    def __init__(self) -> None:
        self.store = MemoryStore()
        self.events = Recorder()
        self.made: list[Runtime] = []

    def start(self, node_id: str, agent: Any) -> Runtime:
        node = Runtime(node_id=node_id, region="r", store=self.store, agent=agent, secret=SECRET,
                       timing=TIMING, on_event=self.events, stop_grace_ms=0)  # fmt: skip
        self.made.append(node)
        node.start()
        return node

    def crash_a_and_start_b(self, agent: Any, calls: Calls) -> None:
        wait_until(calls.parked.is_set, "node a's graph to park in a node")
        self.made[0].stop()
        self.start("b", agent)


@pytest.fixture
def nodes() -> Iterator[Nodes]:
    made = Nodes()
    yield made
    for node in made.made:
        node.stop()


class OneRun:
    """Runs the graph once, in its first step; keeps what each step returned."""

    id = AGENT

    def __init__(self, graph: JournaledGraph) -> None:
        self.graph = graph
        self.outputs: list[Any] = []
        self.interrupts: list[list[Any]] = []  # each run's interrupt values

    def init(self) -> dict[str, Any]:
        return {"graph": None, "output": None}

    async def step(self, state: dict[str, Any]) -> dict[str, Any]:
        ctx = current_step()
        assert ctx is not None
        if state["output"] is not None:
            await ctx.wait_for_inbox(WAIT_S)  # idle: nothing more to do
            return state
        run = await self.graph.run(state["graph"], {"topic": "owls", "log": []})
        self.outputs.append(run.output)
        self.interrupts.append([i.value for i in run.interrupts])
        return {"graph": run.saved, "output": run.output}


def linear(calls: Calls, *names: str, sync: tuple[str, ...] = ()) -> Any:
    """START -> names... -> END; the nodes in sync are plain functions."""
    builder = StateGraph(GraphState)
    previous = START
    for name in names:
        builder.add_node(name, calls.sync_node(name) if name in sync else calls.node(name))
        builder.add_edge(previous, name)
        previous = name
    builder.add_edge(previous, END)
    return builder.compile()


def test_a_failover_mid_graph_reruns_only_the_node_in_flight(nodes: Nodes) -> None:
    """plan and research (a plain function) completed on a, write was in flight: b calls
    only write."""
    calls = Calls(park={"write"})
    agent = OneRun(JournaledGraph(linear(calls, "plan", "research", "write", sync=("research",))))
    nodes.start("a", agent)
    nodes.crash_a_and_start_b(agent, calls)
    nodes.events.wait("checkpoint.published", "b", timeout=WAIT_S)
    assert calls.on("a") == {"plan": 1, "research": 1, "write": 1}
    assert calls.on("b") == {"write": 1}, "b ran a graph node that had completed on a"
    assert agent.outputs[-1] == {"topic": "owls", "log": ["plan", "research", "write"]}
    replayed = nodes.events.wait("effect.replayed", "b")
    assert replayed.detail["reused"] == 2
    # Inside a node, current_effect().key: the same on the run cut off and on its replay.
    assert calls.keys[("a", "write")] is not None
    assert calls.keys[("b", "write")] == calls.keys[("a", "write")]
    assert calls.keys[("a", "plan")] != calls.keys[("a", "write")]


def test_parallel_branches_run_one_at_a_time_and_are_not_run_again(nodes: Nodes) -> None:
    """Two branches of one superstep run one after the other (effects are numbered in call
    order: LangGraph's order of tasks, whatever its callbacks await), journaled, so a replay
    calls neither again."""
    calls = Calls(park={"join"})
    calls.work_s = 0.05
    builder = StateGraph(GraphState)
    for name in ("left", "right", "join"):
        builder.add_node(name, calls.node(name))
    builder.add_edge(START, "left")
    builder.add_edge(START, "right")
    builder.add_edge(["left", "right"], "join")
    builder.add_edge("join", END)
    agent = OneRun(JournaledGraph(builder.compile()))
    nodes.start("a", agent)
    nodes.crash_a_and_start_b(agent, calls)
    nodes.events.wait("checkpoint.published", "b", timeout=WAIT_S)
    assert calls.on("a") == {"left": 1, "right": 1, "join": 1}
    assert calls.on("b") == {"join": 1}
    assert calls.peak == 1, "two graph nodes ran at once"
    assert sorted(agent.outputs[-1]["log"][:2]) == ["left", "right"]
    assert agent.outputs[-1]["log"][2] == "join"
    assert not nodes.events.of("agent.failing"), "the replay failed (an effect mismatch?)"


def test_a_fan_out_by_send_is_not_run_again(nodes: Nodes) -> None:
    """Send runs one node once per item in a superstep: the same node, the same superstep,
    journaled in LangGraph's order of the sends, so a replay reuses each one's output."""
    calls = Calls(park={"reduce"})

    async def worker(item: dict[str, Any]) -> dict[str, Any]:
        await calls.enter(f"worker-{item['n']}")
        return {"log": [f"item {item['n']}"]}

    def fan_out(state: GraphState) -> list[Send]:
        return [Send("worker", {"n": n}) for n in (1, 2, 3)]

    builder = StateGraph(GraphState)
    builder.add_node("plan", calls.node("plan"))
    builder.add_node("worker", worker)
    builder.add_node("reduce", calls.node("reduce"))
    builder.add_edge(START, "plan")
    builder.add_conditional_edges("plan", fan_out, ["worker"])
    builder.add_edge("worker", "reduce")
    builder.add_edge("reduce", END)
    agent = OneRun(JournaledGraph(builder.compile()))
    nodes.start("a", agent)
    nodes.crash_a_and_start_b(agent, calls)
    nodes.events.wait("checkpoint.published", "b", timeout=WAIT_S)
    assert calls.on("a") == {"plan": 1, "worker-1": 1, "worker-2": 1, "worker-3": 1, "reduce": 1}
    assert calls.on("b") == {"reduce": 1}
    assert agent.outputs[-1]["log"] == ["plan", "item 1", "item 2", "item 3", "reduce"]


def test_messages_come_back_from_the_journal_as_messages(nodes: Nodes) -> None:
    """A node's output that is not JSON (LangChain messages) is journaled by LangGraph's
    serializer: b's replay gets the model's AIMessage back, not a dict, and the reply gives
    the conversation as JSON."""
    calls = Calls(park={"check"})

    async def model(state: MessagesState) -> dict[str, Any]:
        await calls.enter("model")
        return {"messages": [AIMessage(f"echo {state['messages'][-1].content}", id="m1")]}

    async def check(state: MessagesState) -> dict[str, Any]:
        await calls.enter("check")
        last = state["messages"][-1]
        assert isinstance(last, AIMessage), type(last)
        return {"messages": [AIMessage(f"checked: {last.content}", id="m2")]}

    builder = StateGraph(MessagesState)
    builder.add_node("model", model)
    builder.add_node("check", check)
    builder.add_edge(START, "model")
    builder.add_edge("model", "check")
    builder.add_edge("check", END)
    agent = GraphAgent(AGENT, builder.compile())
    nodes.start("a", agent)
    with Client(nodes.store, SECRET) as client:
        client.submit(AGENT, {"messages": [{"role": "user", "content": "hi"}]}, request_id="q")
        nodes.crash_a_and_start_b(agent, calls)
        reply = client.result(AGENT, "q", timeout=WAIT_S)
    assert calls.on("b") == {"check": 1}
    said = [(m["type"], m["content"]) for m in reply["output"]["messages"]]
    assert said == [("human", "hi"), ("ai", "echo hi"), ("ai", "checked: echo hi")]


def review_graph(calls: Calls) -> Any:
    """draft -> approve (asks a human: interrupt) -> publish."""

    async def approve(state: GraphState) -> dict[str, Any]:
        await calls.enter("approve")
        answer = interrupt({"question": f"publish the draft about {state['topic']}?"})
        return {"log": ["approve"], "approved": answer}

    builder = StateGraph(GraphState)
    builder.add_node("draft", calls.node("draft"))
    builder.add_node("approve", approve)
    builder.add_node("publish", calls.node("publish"))
    builder.add_edge(START, "draft")
    builder.add_edge("draft", "approve")
    builder.add_edge("approve", "publish")
    builder.add_edge("publish", END)
    return builder.compile()


def ask(nodes: Nodes) -> dict[str, Any]:
    """Submit a topic; the graph's question comes back as the reply."""
    with Client(nodes.store, SECRET) as client:
        client.submit(AGENT, {"topic": "owls", "log": []}, request_id="topic-1")
        reply = client.result(AGENT, "topic-1", timeout=WAIT_S)
    [waiting] = reply["interrupts"]
    assert waiting["value"] == {"question": "publish the draft about owls?"}
    return reply  # type: ignore[no-any-return]


def test_an_interrupt_is_answered_by_a_submission(nodes: Nodes) -> None:
    """The graph waits on interrupt() across steps (its checkpoint in the agent's state); the
    next submission resumes it with Command(resume=payload) and gets the graph's output."""
    calls = Calls()
    nodes.start("a", GraphAgent(AGENT, review_graph(calls)))
    ask(nodes)
    assert calls.on("a") == {"draft": 1, "approve": 1}
    with Client(nodes.store, SECRET) as client:
        client.submit(AGENT, "yes, go", request_id="answer-1")
        reply = client.result(AGENT, "answer-1", timeout=WAIT_S)
    assert reply == {"output": {"topic": "owls", "log": ["draft", "approve", "publish"],
                                "approved": "yes, go"}}  # fmt: skip
    # LangGraph runs an interrupted node again on resume; draft ran once.
    assert calls.on("a") == {"draft": 1, "approve": 2, "publish": 1}


def test_a_failover_after_the_answer_does_not_ask_again(nodes: Nodes) -> None:
    """a resumes the graph with the answer and dies in publish: b replays the answered
    approve node from the journal (never calls it), runs publish and replies."""
    calls = Calls(park={"publish"})
    agent = GraphAgent(AGENT, review_graph(calls))
    nodes.start("a", agent)
    ask(nodes)
    with Client(nodes.store, SECRET) as client:
        client.submit(AGENT, "yes", request_id="answer-1")
        nodes.crash_a_and_start_b(agent, calls)
        reply = client.result(AGENT, "answer-1", timeout=WAIT_S)
    assert reply["output"]["approved"] == "yes"
    assert reply["output"]["log"] == ["draft", "approve", "publish"]
    assert calls.on("a") == {"draft": 1, "approve": 2, "publish": 1}
    assert calls.on("b") == {"publish": 1}, "b ran a graph node that had completed on a"


def test_the_first_node_cut_off_runs_again_on_the_next_leader(nodes: Nodes) -> None:
    """A kill before the first node completes leaves nothing journaled: b runs it again."""
    calls = Calls(park={"plan"})
    agent = OneRun(JournaledGraph(linear(calls, "plan", "write")))
    nodes.start("a", agent)
    nodes.crash_a_and_start_b(agent, calls)
    nodes.events.wait("checkpoint.published", "b", timeout=WAIT_S)
    assert calls.on("b") == {"plan": 1, "write": 1}
    assert agent.outputs[-1]["log"] == ["plan", "write"]


def test_outside_a_step_the_graph_runs_unjournaled() -> None:
    """No step, no journal: the graph runs as LangGraph runs it, interrupts included."""
    calls = Calls()
    graph = JournaledGraph(review_graph(calls))
    first = asyncio.run(graph.run(None, {"topic": "owls", "log": []}))
    assert first.waiting and first.saved is not None
    done = asyncio.run(graph.run(first.saved, Command(resume="ok")))
    assert not done.waiting
    assert done.output["log"] == ["draft", "approve", "publish"]
    assert calls.on("-") == {"draft": 1, "approve": 2, "publish": 1}


def test_an_interrupt_inside_a_subgraph_resumes_as_langgraph_resumes_it() -> None:
    """A subgraph that interrupts keeps its own checkpoint while the graph waits: the saved
    state restores it, so the resume runs what LangGraph's own checkpointer runs (not the
    subgraph's completed node again) and ends with the same output."""

    def build(calls: list[str]) -> Any:
        def node(name: str, ask: bool = False) -> Any:
            def run(state: GraphState) -> dict[str, Any]:
                calls.append(name)
                return {"log": [f"{name}:{interrupt('sure?')}" if ask else name]}

            return run

        inner = StateGraph(GraphState)
        inner.add_node("inner", node("inner"))
        inner.add_node("ask", node("ask", ask=True))
        inner.add_edge(START, "inner")
        inner.add_edge("inner", "ask")
        inner.add_edge("ask", END)
        outer = StateGraph(GraphState)
        outer.add_node("before", node("before"))
        outer.add_node("sub", inner.compile())
        outer.add_edge(START, "before")
        outer.add_edge("before", "sub")
        outer.add_edge("sub", END)
        return outer

    ours: list[str] = []
    graph = JournaledGraph(build(ours).compile())
    waiting = asyncio.run(graph.run(None, {"log": []}))
    assert [i.value for i in waiting.interrupts] == ["sure?"]
    done = asyncio.run(graph.run(waiting.saved, Command(resume="yes")))

    theirs: list[str] = []
    plain = build(theirs).compile(checkpointer=InMemorySaver())
    config: Any = {"configurable": {"thread_id": "t"}}
    asyncio.run(plain.ainvoke({"log": []}, config))
    expected = asyncio.run(plain.ainvoke(Command(resume="yes"), config))
    assert ours == theirs == ["before", "inner", "ask", "ask"]
    assert done.output == expected and not done.waiting


def test_unknown_nodes_are_refused() -> None:
    with pytest.raises(ValueError, match="nowhere"):
        JournaledGraph(review_graph(Calls()), interrupted_nodes=["nowhere"])
    with pytest.raises(ValueError, match="nowhere"):
        JournaledGraph(review_graph(Calls()), own_effects=["nowhere"])


class RunThenPark(OneRun):
    """OneRun, but node a never publishes the step in which the graph ran."""

    def __init__(self, graph: JournaledGraph, calls: Calls) -> None:
        super().__init__(graph)
        self.calls = calls

    async def step(self, state: dict[str, Any]) -> dict[str, Any]:
        state = await super().step(state)
        ctx = current_step()
        if ctx is not None and ctx.node == "a":
            self.calls.parked.set()
            await asyncio.sleep(3600)
        return state


def test_a_replay_of_a_node_that_interrupted_asks_the_same_question(nodes: Nodes) -> None:
    """a ran draft and approve, which interrupted, but never published: b reuses draft and
    runs approve again up to its interrupt() (as LangGraph's resume does), so the graph it
    publishes waits on the same question, with this run's interrupt id."""
    calls = Calls()
    agent = RunThenPark(JournaledGraph(review_graph(calls)), calls)
    nodes.start("a", agent)
    nodes.crash_a_and_start_b(agent, calls)
    nodes.events.wait("checkpoint.published", "b", timeout=WAIT_S)
    assert calls.on("a") == {"draft": 1, "approve": 1}
    assert calls.on("b") == {"approve": 1}
    assert agent.outputs[-1]["log"] == ["draft"]
    assert agent.interrupts[-1] == [{"question": "publish the draft about owls?"}]


@pytest.mark.parametrize("retried", [False, True], ids=["no-retry-policy", "retry-any-error"])
def test_an_interrupted_node_cut_off_is_not_run_again(nodes: Nodes, retried: bool) -> None:
    """A node declared interrupted that a crash cut off may or may not have happened: b
    neither runs it nor what completed before it, and replies that its fate is unknown; a
    RetryPolicy that retries any error does not retry EffectInterrupted into a new call."""
    calls = Calls(park={"send"})
    builder = StateGraph(GraphState)
    retry = RetryPolicy(max_attempts=3, initial_interval=0.01, retry_on=Exception)
    builder.add_node("plan", calls.node("plan"))
    builder.add_node("send", calls.node("send"), retry_policy=retry if retried else None)
    builder.add_edge(START, "plan")
    builder.add_edge("plan", "send")
    builder.add_edge("send", END)
    graph = JournaledGraph(builder.compile(), interrupted_nodes=["send"])
    agent = GraphAgent(AGENT, graph)
    nodes.start("a", agent)
    with Client(nodes.store, SECRET) as client:
        client.submit(AGENT, {"log": []}, request_id="task-1")
        nodes.crash_a_and_start_b(agent, calls)
        reply = client.result(AGENT, "task-1", timeout=WAIT_S)
    assert reply == {"unknown": "graph/send#2"}
    assert calls.on("a") == {"plan": 1, "send": 1}
    assert calls.on("b") == {}


def test_a_node_retried_by_its_policy_is_not_run_again(nodes: Nodes) -> None:
    """A RetryPolicy's attempts are journaled in order, the failed one as EffectFailed: a
    replay decides the same, reuses both, and calls the node no more."""
    calls = Calls(park={"write"})
    failures = [ConnectionError("flaky network")]

    async def fetch(state: GraphState) -> dict[str, Any]:
        await calls.enter("fetch")
        if failures:
            raise failures.pop()
        return {"log": ["fetched"]}

    builder = StateGraph(GraphState)
    retry = RetryPolicy(max_attempts=3, initial_interval=0.01, jitter=False)
    builder.add_node("fetch", fetch, retry_policy=retry)
    builder.add_node("write", calls.node("write"))
    builder.add_edge(START, "fetch")
    builder.add_edge("fetch", "write")
    builder.add_edge("write", END)
    agent = OneRun(JournaledGraph(builder.compile()))
    nodes.start("a", agent)
    nodes.crash_a_and_start_b(agent, calls)
    nodes.events.wait("checkpoint.published", "b", timeout=WAIT_S)
    assert calls.on("a") == {"fetch": 2, "write": 1}
    assert calls.on("b") == {"write": 1}
    assert agent.outputs[-1]["log"] == ["fetched", "write"]


def test_a_node_with_its_own_effects_runs_again_with_them_replayed(nodes: Nodes) -> None:
    """own_effects: the node is not one effect; its calls are, so a replay runs the node
    again and its completed call comes from the journal."""
    calls = Calls(park={"write"})
    real: Counter[str] = Counter()

    async def research(state: GraphState) -> dict[str, Any]:
        await calls.enter("research")
        ctx = current_step()
        assert ctx is not None

        def search(topic: str) -> str:
            real[topic] += 1
            return f"facts about {topic}"

        return {"log": [await ctx.effect("search", search, state["topic"])]}

    builder = StateGraph(GraphState)
    builder.add_node("plan", calls.node("plan"))
    builder.add_node("research", research)
    builder.add_node("write", calls.node("write"))
    builder.add_edge(START, "plan")
    builder.add_edge("plan", "research")
    builder.add_edge("research", "write")
    builder.add_edge("write", END)
    agent = OneRun(JournaledGraph(builder.compile(), own_effects=["research"]))
    nodes.start("a", agent)
    nodes.crash_a_and_start_b(agent, calls)
    nodes.events.wait("checkpoint.published", "b", timeout=WAIT_S)
    assert calls.on("b") == {"research": 1, "write": 1}
    assert real == {"owls": 1}, "the node's own effect was called again"
    assert agent.outputs[-1]["log"] == ["plan", "facts about owls", "write"]


def test_the_example_runs_offline() -> None:
    """examples/langgraph_graph.py: one node runs plan, research and the answered approve,
    the other, after the first is stopped mid-write, only write."""
    env = {**os.environ, "LANGGRAPH_WORK_S": "0.3",
           "PYTHONPATH": os.pathsep.join([str(EXAMPLES), *sys.path])}  # fmt: skip
    done = subprocess.run([sys.executable, str(EXAMPLES / "langgraph_graph.py")], env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    answered = [ln for ln in done.stdout.splitlines() if ln.startswith("answered: ")]
    assert answered, done.stdout
    log = ast.literal_eval(answered[0].removeprefix("answered: "))["output"]["log"]
    names = [entry.split("@") for entry in log]
    assert [name for name, _node in names] == ["plan", "research", "approve", "write"]
    first, second = names[0][1], names[3][1]
    assert first != second and all(node == first for _name, node in names[:3]), log
