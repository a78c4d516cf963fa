"""LangGraph graphs journaled and fenced: each node a graph runs inside a step is one of the
step's journaled effects, so a leader's replay after a kill skips the nodes that completed
and runs again only the one in flight.

    from hamsterbunker.integrations.langgraph import GraphAgent, JournaledGraph

    journaled = JournaledGraph(builder.compile())
    run = await journaled.run(state.get("graph"), {"topic": "owls"})  # inside a step
    state["graph"] = run.saved       # the graph's checkpoint, in the agent's (sealed) state

    agent = GraphAgent("writer", builder.compile())  # or: a whole agent fed by the inbox

The graph's state is a LangGraph checkpoint (an in-memory saver, for the run) that each run
restores from the agent's state and saves back into it; ``interrupt()`` leaves the graph
waiting there, and a later run resumes it with ``Command(resume=answer)``. Why it is built
this way, what is journaled and what it costs: docs/integrations.md ("LangGraph").
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from langchain_core.runnables import Runnable, RunnableConfig
from langgraph.checkpoint.base import CheckpointTuple
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.serde.base import SerializerProtocol
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.errors import GraphBubbleUp
from langgraph.pregel import Pregel
from langgraph.pregel._read import DEFAULT_BOUND
from langgraph.types import Command, Interrupt, RetryPolicy

from ..agent.effects import MAX_NAME_LENGTH
from ..agent.step import current_step
from ..core.errors import EffectError, EffectFailed, EffectInterrupted, HamsterbunkerError

__all__ = ["GraphAgent", "GraphRun", "JournaledGraph"]

# Node outputs and checkpoints hold what LangGraph's own checkpointers hold (messages,
# dataclasses, Commands...): LangGraph's serializer, its bytes in base64, is JSON.
Saved = list[str]  # [type, base64 bytes]: a value as LangGraph's serializer wrote it


def _encode(serde: SerializerProtocol, value: Any) -> Saved:
    kind, data = serde.dumps_typed(value)
    return [kind, base64.b64encode(data).decode("ascii")]


def _decode(serde: SerializerProtocol, saved: Saved) -> Any:
    kind, data = saved
    return serde.loads_typed((kind, base64.b64decode(data)))


def _effect_name(name: str) -> str:
    """name as an effect's name: a long one keeps its start and a digest of the whole."""
    if len(name) <= MAX_NAME_LENGTH:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:16]
    return f"{name[: MAX_NAME_LENGTH - 17]}~{digest}"


def _guarded(policies: Sequence[RetryPolicy] | None) -> tuple[RetryPolicy, ...] | None:
    """policies, never retrying what HamsterBunker raises to end the step (EffectInterrupted,
    StepLost, a store error...): a retry would call the node anew under the next number.
    EffectFailed is the node's own failure, for retry_on to judge."""
    if policies is None:
        return None

    def guard(policy: RetryPolicy) -> RetryPolicy:
        retry_on = policy.retry_on

        def judged(exc: Exception) -> bool:
            if isinstance(exc, HamsterbunkerError) and not isinstance(exc, EffectFailed):
                return False
            if isinstance(retry_on, Sequence):
                return isinstance(exc, tuple(retry_on))
            if isinstance(retry_on, type):
                return isinstance(exc, retry_on)
            return retry_on(exc)

        return policy._replace(retry_on=judged)

    return tuple(guard(policy) for policy in policies)


class _JournaledNode(Runnable[Any, Any]):
    """A node's own runnable (its function; LangGraph's writers and routers run after it),
    called as the running step's next effect: a replay returns its recorded output."""

    def __init__(
        self,
        graph: str,
        node: str,
        bound: Runnable[Any, Any],
        replay: str,
        serde: SerializerProtocol,
    ) -> None:
        self.graph, self.node, self.bound, self.replay = graph, node, bound, replay
        self.serde = serde

    def invoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        if current_step() is None:
            return self.bound.invoke(input, config, **kwargs)
        raise EffectError(f"node {self.node!r}: a journaled graph runs with ainvoke (run())")

    async def ainvoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        step = current_step()
        if step is None:  # outside a step: the graph runs as it would without this
            return await self.bound.ainvoke(input, config, **kwargs)
        bubbled: list[GraphBubbleUp] = []

        async def call() -> dict[str, Any]:
            try:
                output = await self.bound.ainvoke(input, config, **kwargs)
            except GraphBubbleUp as exc:  # interrupt(): the node did not complete
                bubbled.append(exc)
                return {"bubbled": type(exc).__name__}
            return {"output": _encode(self.serde, output)}

        superstep = (config or {}).get("metadata", {}).get("langgraph_step")
        name = _effect_name(f"{self.graph}/{self.node}#{superstep}")
        recorded = await step.effect(name, call, replay=self.replay)
        if "output" in recorded:
            return _decode(self.serde, recorded["output"])
        if bubbled:
            raise bubbled[0]
        # A replay of a node that interrupted: it runs again up to its interrupt(), as on
        # LangGraph's own resume, so the interrupt's id is this run's.
        return await self.bound.ainvoke(input, config, **kwargs)


@dataclass(frozen=True)
class GraphRun:
    """What a journaled run ended with."""

    output: Any  # the graph's output (its state's values, as ainvoke returns them)
    interrupts: tuple[Interrupt, ...]  # waiting on these; answer with run(saved, Command(...))
    saved: Saved | None  # the graph's checkpoint, JSON: keep it in the agent's state

    @property
    def waiting(self) -> bool:
        return bool(self.interrupts)


class JournaledGraph:
    """A compiled LangGraph graph whose runs inside a step journal each node (see the module).

    name: names the graph's effects (``NAME/NODE#SUPERSTEP``); give each graph of an agent
    its own. interrupted_nodes: nodes journaled ``replay="interrupted"`` (an intent first: a
    replay that cannot know whether the node ran raises ``EffectInterrupted`` out of run()
    instead of running it again); every other node is ``"safe"`` (run again if cut off).
    own_effects: nodes that journal their own calls (``current_step().effect``) and so are
    not one effect: a replay runs them again, their effects replayed. Any other node must
    not call effects (they would be numbered inside the node's, and a replay skips them).
    serde: how node outputs and the checkpoint are serialized (default: LangGraph's
    ``JsonPlusSerializer()``; give one with ``allowed_msgpack_modules`` for your types).
    """

    def __init__(
        self,
        graph: Pregel[Any, Any, Any, Any],
        *,
        name: str = "graph",
        interrupted_nodes: Iterable[str] = (),
        own_effects: Iterable[str] = (),
        thread_id: str = "hamsterbunker",
        serde: SerializerProtocol | None = None,
    ) -> None:
        self.serde = serde if serde is not None else JsonPlusSerializer()
        interrupted, own = frozenset(interrupted_nodes), frozenset(own_effects)
        if unknown := (interrupted | own) - set(graph.nodes):
            raise ValueError(f"nodes not in the graph: {sorted(unknown)}")
        if both := interrupted & own:
            raise ValueError(f"nodes with their own effects cannot be interrupted: {sorted(both)}")
        nodes = dict(graph.nodes)
        for node, spec in graph.nodes.items():
            if spec.bound is DEFAULT_BOUND:  # __start__ and the like run no code of the user's
                continue
            update: dict[str, Any] = {"retry_policy": _guarded(spec.retry_policy)}
            if node not in own:
                replay = "interrupted" if node in interrupted else "safe"
                update["bound"] = _JournaledNode(name, node, spec.bound, replay, self.serde)
            nodes[node] = spec.copy(update)
        self.name, self.thread_id = name, thread_id
        self._graph = graph.copy({"nodes": nodes, "retry_policy": _guarded(graph.retry_policy)})
        self._config: RunnableConfig = {
            "configurable": {"thread_id": thread_id},
            # Effects are numbered in call order: one node at a time, in LangGraph's order.
            "max_concurrency": 1,
        }

    async def run(self, saved: Saved | None, input: Any, **kwargs: Any) -> GraphRun:
        """Run the graph from its checkpoint saved (None: none yet) on input (a
        ``Command(resume=...)`` answers an interrupt); kwargs go to ``ainvoke``."""
        saver = self._restore(saved)
        graph = self._graph.copy({"checkpointer": saver})
        result = await graph.ainvoke(input, self._config, durability="exit", version="v2", **kwargs)
        return GraphRun(result.value, tuple(result.interrupts), self._dump(saver))

    def _restore(self, saved: Saved | None) -> InMemorySaver:
        saver = InMemorySaver(serde=self.serde)
        restored = _decode(self.serde, saved) if saved is not None else ()
        for ns, checkpoint, metadata, writes in restored:
            config: RunnableConfig = {
                "configurable": {"thread_id": self.thread_id, "checkpoint_ns": ns}
            }
            stored = saver.put(config, checkpoint, metadata, checkpoint["channel_versions"])
            by_task: dict[str, list[tuple[str, Any]]] = {}
            for task, channel, value in writes:
                by_task.setdefault(task, []).append((channel, value))
            for task, task_writes in by_task.items():
                saver.put_writes(stored, task_writes, task)
        return saver

    def _dump(self, saver: InMemorySaver) -> Saved | None:
        """The newest checkpoint of each namespace, with its pending writes; a subgraph's
        only while the graph waits on an interrupt (resuming it needs them)."""
        newest: dict[str, CheckpointTuple] = {}
        for found in saver.list({"configurable": {"thread_id": self.thread_id}}):
            newest.setdefault(found.config["configurable"].get("checkpoint_ns", ""), found)
        root = newest.get("")
        if root is None:
            return None
        waiting = any(channel == "__interrupt__" for _t, channel, _v in root.pending_writes or ())
        kept = [
            (ns, found.checkpoint, found.metadata, list(found.pending_writes or ()))
            for ns, found in newest.items()
            if ns == "" or waiting
        ]
        return _encode(self.serde, kept)


def _default_input(payload: Any) -> Any:
    return payload


def _as_json(value: Any) -> Any:
    """value as JSON: a Pydantic model (LangChain's messages) by its JSON dump, a dataclass
    as a dict, anything else unknown as its str()."""

    def default(obj: Any) -> Any:
        if callable(getattr(obj, "model_dump", None)):
            return obj.model_dump(mode="json")
        if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
            return dataclasses.asdict(obj)
        return str(obj)

    return json.loads(json.dumps(value, default=default))


def _default_reply(run: GraphRun) -> Any:
    if run.waiting:
        return {"interrupts": [{"id": i.id, "value": _as_json(i.value)} for i in run.interrupts]}
    return {"output": _as_json(run.output)}


class GraphAgent:
    """A HamsterBunker agent that runs a LangGraph graph on its inbox: each step takes the
    oldest submission and runs the graph on it (``make_input(payload)``), or, while the graph
    waits on an interrupt, resumes it with ``Command(resume=payload)``; the submission is
    consumed with ``make_reply(run)`` (default: ``{"interrupts": [{"id", "value"}]}`` while
    waiting, else ``{"output": ...}``, as JSON: messages by their JSON dump). One LangGraph
    thread per agent.

    A node of ``interrupted_nodes`` cut off by a crash may or may not have run: the
    submission is consumed with ``{"unknown": EFFECT NAME}`` and the graph left as it was
    before that run (still waiting, if it was).
    """

    def __init__(
        self,
        id: str,
        graph: Pregel[Any, Any, Any, Any] | JournaledGraph,
        *,
        make_input: Callable[[Any], Any] = _default_input,
        make_reply: Callable[[GraphRun], Any] = _default_reply,
        idle_timeout: float = 30.0,
    ) -> None:
        self.id = id
        self.graph = graph if isinstance(graph, JournaledGraph) else JournaledGraph(graph)
        self._make_input, self._make_reply = make_input, make_reply
        self._idle_timeout = idle_timeout

    def init(self) -> dict[str, Any]:
        return {"graph": None, "waiting": [], "runs": 0}

    async def step(self, state: dict[str, Any]) -> dict[str, Any]:
        ctx = current_step()
        if ctx is None:
            raise EffectError("GraphAgent.step runs in a step run by a node")
        inbox = await ctx.wait_for_inbox(self._idle_timeout)
        if not inbox:
            return state
        submission = inbox[0]
        waiting = bool(state["waiting"])
        graph_input = (
            Command(resume=submission.payload) if waiting else self._make_input(submission.payload)
        )
        try:
            run = await self.graph.run(state["graph"], graph_input)
        except EffectInterrupted as exc:
            ctx.consume(submission.number, reply={"unknown": exc.name})
            return {**state, "runs": state["runs"] + 1}
        ctx.consume(submission.number, reply=self._make_reply(run))
        return {
            "graph": run.saved,
            "waiting": [i.id for i in run.interrupts],  # the ids: the values may not be JSON
            "runs": state["runs"] + 1,
        }
