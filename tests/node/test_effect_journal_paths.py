"""A step's journal across retries that take another path, crashes and deletion, on every backend
(DESIGN.md invariants 8 and 11).

Node "a" runs a step whose first attempt fails after a fallback effect, and whose retry
takes another path and is cut off inside an ``interrupted`` effect (a stop with no grace
cancels the step as a crash would leave it). The next leader replays the step: it must
report the effect interrupted (``EffectInterrupted``), never call it again, and never
loop on an ``EffectMismatch``. A store writer who deletes the journal of a step whose
``interrupted`` effect completed must not make the node that ran it call it again
(``hamsterbunker.agent.intents``). Each test runs on the file, memory, Redis, etcd and
syncdir stores; a ``Tool`` counts the real calls per effect and step.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from hamsterbunker import (
    EffectFailed,
    EffectInterrupted,
    LeaseTiming,
    Runtime,
    current_effect,
    current_step,
)
from hamsterbunker.core.timing import StepRetry
from hamsterbunker.stores import Store, open_store
from hamsterbunker.stores.backends.file import FileBackend
from hamsterbunker.testing import MemoryStore
from tests.support import wait_until
from tests.support.agents import AGENT, SECRET, Recorder
from tests.support.raw_store import RawRecords, RawStore, raw_at
from tests.support.syncdir import Sync

TIMING = LeaseTiming(tick_ms=100, lease_ttl_ms=600)
SYNC_DELAY_MS = 100  # TTL 600 ms >= 2 x (tick 100 ms + 100 ms)
RETRY = StepRetry(first_ms=20, max_ms=100, max_failures=0)  # retried soon, never handed over
WAIT_S = 30.0
# A replay that fails this many times on the same step is stuck: the test stops waiting.
STUCK_AFTER = 3


class Backend:
    """One store of a backend, as each node opens it; how a node's writes reach another."""

    def __init__(self, name: str, tmp_path: Path) -> None:
        self.name = name
        self._opened: list[Store] = []
        self._sync: Sync | None = None
        self._memory: MemoryStore | None = None
        self._url = ""
        if name == "syncdir":
            self._sync = Sync(tmp_path, delay_ms=SYNC_DELAY_MS)
        elif name == "memory":
            self._memory = MemoryStore()
        elif name == "file":
            self._url = (tmp_path / "store").as_uri()
        elif name == "redis":
            from tests.support.redis_server import redis_url

            self._url = redis_url()
        else:
            from tests.support.etcd_server import etcd_url

            self._url = etcd_url()

    def open(self, node: str) -> Store:
        if self._memory is not None:
            return self._memory
        store: Store = self._sync.open(node) if self._sync else open_store(self._url)
        self._opened.append(store)
        return store

    def drop_effects(self, node: str, seq: int) -> None:
        """Delete the effect journal of step seq, as a store writer without the secret can
        (on a synced folder: in node's subtree, on node's machine)."""
        if self._memory is not None:
            assert self._memory.read_effects(AGENT, seq), f"no journal of step {seq}"
        raw = self._writer_of(node)
        try:
            raw.drop_effects(AGENT, seq)
        finally:
            raw.close()

    def spoil_effect(self, node: str, seq: int, index: int, kind: str) -> None:
        """Write junk over one record of step seq's journal, as a store writer without the
        secret can: the record no longer counts."""
        junk = b"not a sealed effect record"
        raw = self._writer_of(node)
        try:
            raw.put_effect(AGENT, seq, index, kind, junk)
        finally:
            raw.close()

    def _writer_of(self, node: str) -> RawStore:
        """The store as a writer without the secret writes it (on a synced folder: node's
        subtree, on node's machine)."""
        if self._memory is not None:
            return RawRecords(self._memory)
        if self._sync is not None:
            subtree = self._sync.root(node) / "nodes" / node
            return RawRecords(FileBackend(subtree, in_synced_folder=True), owned=True)
        return raw_at(self._url)

    def carry(self, node: str, to: str) -> None:
        """Bring what node wrote to the machine of node to (a synced folder's copy)."""
        if self._sync is not None:
            self._sync.copy(node, to)

    def close(self) -> None:
        for store in self._opened:
            with contextlib.suppress(Exception):
                store.close()


class Tool:
    """The outside world: counts calls per key; "search" fails once; node a's "act" hangs."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()
        self.search_failures = 1
        self.hold = True  # node a's "act" hangs
        self.acting = threading.Event()  # a's "act" has been called and hangs
        self._lock = threading.Lock()

    def _count(self) -> str:
        effect, step = current_effect(), current_step()
        assert effect is not None and step is not None
        with self._lock:
            self.calls[f"{effect.name}@{step.seq}"] += 1
        return step.node

    async def search(self) -> str:
        self._count()
        with self._lock:
            fail, self.search_failures = self.search_failures > 0, self.search_failures - 1
        if fail:
            raise ConnectionError("search is down")
        return "found"

    async def fallback(self) -> str:
        self._count()
        return "cached"

    async def act(self, on: str) -> str:
        if self._count() == "a" and self.hold:
            self.acting.set()
            await asyncio.sleep(3600)  # cut off by the stop, as by a crash
        return f"acted on {on}"


class Agent:
    """Step 1: search, or on its failure record a fallback and fail the step; then act
    (at most once). Later steps park. outcomes: (node, seq) -> what "act" gave."""

    id = AGENT

    def __init__(self, tool: Tool, replay: str = "interrupted", hiccups: int = 0) -> None:
        """hiccups: how many runs fail once the search has succeeded, before "act"."""
        self.tool, self.replay, self.hiccups = tool, replay, hiccups
        self.outcomes: dict[tuple[str, int], str] = {}

    def init(self) -> dict[str, Any]:
        return {"acted": []}

    async def step(self, state: dict[str, Any]) -> dict[str, Any]:
        ctx = current_step()
        assert ctx is not None
        if ctx.seq > 1:
            await asyncio.sleep(3600)  # nothing more to see: park until stopped
        try:
            found = await ctx.effect("search", self.tool.search)
        except EffectFailed:
            await ctx.effect("fallback", self.tool.fallback)
            raise RuntimeError("no search result: try the step again") from None
        if self.hiccups > 0:
            self.hiccups -= 1
            raise RuntimeError("a hiccup: try the step again")
        try:
            acted = await ctx.effect("act", self.tool.act, found, replay=self.replay)
        except EffectInterrupted:
            acted = "interrupted"
        self.outcomes[(ctx.node, ctx.seq)] = acted
        state["acted"].append(acted)
        return state


class Nodes:
    def __init__(self, backend: Backend, states: Path) -> None:
        self.backend = backend
        self.events = Recorder()
        self.runtimes: dict[str, Runtime] = {}  # the newest of each node
        self._made: list[Runtime] = []
        self._states = states

    def start(self, node: str, agent: Any) -> Runtime:
        """Start node, with a state directory of its own that outlives its restarts."""
        runtime = Runtime(node_id=node, region="r", store=self.backend.open(node), agent=agent,
                          secret=SECRET, timing=TIMING, on_event=self.events, stop_grace_ms=0,
                          step_retry=RETRY, state_dir=self._states / node)  # fmt: skip
        self.runtimes[node] = runtime
        self._made.append(runtime)
        runtime.start()
        return runtime

    def crash(self, node: str, cut_off: Callable[[], bool]) -> None:
        """Once cut_off() holds, stop node with no grace: its step never publishes."""
        wait_until(cut_off, f"node {node} to be cut off mid-step", WAIT_S)
        self.runtimes[node].stop(timeout=20)

    def published_or_stuck(self, node: str, seq: int) -> None:
        """Wait until node published seq, or failed the step STUCK_AFTER times."""

        def settled() -> bool:
            published = [e for e in self.events.of("checkpoint.published", node) if e.seq >= seq]
            return bool(published) or len(self.events.of("agent.failing", node)) >= STUCK_AFTER

        wait_until(settled, f"node {node} to publish step {seq} or to be stuck", WAIT_S)

    def close(self) -> None:
        for runtime in self._made:
            with contextlib.suppress(BaseException):
                runtime.stop(timeout=20)
        self.backend.close()


@pytest.fixture(params=["file", "memory", "redis", "etcd", "syncdir"])
def nodes(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Nodes]:
    made = Nodes(Backend(request.param, tmp_path), tmp_path / "state")
    try:
        yield made
    finally:
        made.close()


def test_a_retry_on_another_path_cut_off_in_an_interrupted_effect_replays_as_interrupted(
    nodes: Nodes,
) -> None:
    """After a failed attempt recorded a fallback as effect #1 and its retry was cut off in
    an interrupted effect #1, the next leader's replay raises EffectInterrupted (the later
    attempt's intent, not the earlier attempt's outcome, is what #1 holds) and publishes."""
    tool = Tool()
    agent = Agent(tool)
    nodes.start("a", agent)
    nodes.crash("a", tool.acting.is_set)
    failing = nodes.events.of("agent.failing", "a")
    assert failing and "no search result" in failing[0].detail["error"]  # the first attempt
    nodes.backend.carry("a", "b")
    nodes.start("b", agent)
    nodes.published_or_stuck("b", 1)
    errors = [e.detail["error"] for e in nodes.events.of("agent.failing", "b")]
    assert errors == []  # no EffectMismatch, not once
    assert agent.outcomes[("b", 1)] == "interrupted"
    assert tool.calls == {"search@1": 2, "fallback@1": 1, "act@1": 1}


def test_a_retry_on_another_path_cut_off_in_a_safe_effect_replays_and_calls_it_again(
    nodes: Nodes,
) -> None:
    """As above with a safe effect #1, which leaves no intent: the replay knows the earlier
    attempt's #1 as of a path given up (a retry rewrote #0 after it), calls the safe effect
    again and publishes, instead of raising EffectMismatch on every run."""
    tool = Tool()
    agent = Agent(tool, replay="safe")
    nodes.start("a", agent)
    nodes.crash("a", tool.acting.is_set)
    nodes.backend.carry("a", "b")
    nodes.start("b", agent)
    nodes.published_or_stuck("b", 1)
    errors = [e.detail["error"] for e in nodes.events.of("agent.failing", "b")]
    assert errors == []
    assert agent.outcomes[("b", 1)] == "acted on found"
    assert tool.calls == {"search@1": 2, "fallback@1": 1, "act@1": 2}


class ActsOnce:
    """Step 1 calls one interrupted effect; the first run parks after it (its outcome is
    recorded, the step not published). outcomes: (run, seq) -> what the effect gave."""

    id = AGENT

    def __init__(self) -> None:
        self.calls = 0
        self.recorded = threading.Event()  # the first run's effect returned and is recorded
        self.runs = 0
        self.outcomes: dict[tuple[int, int], str] = {}

    def init(self) -> dict[str, Any]:
        return {}

    async def act(self) -> str:
        self.calls += 1
        return "acted"

    async def step(self, state: dict[str, Any]) -> dict[str, Any]:
        ctx = current_step()
        assert ctx is not None
        if ctx.seq > 1:
            await asyncio.sleep(3600)  # nothing more to see: park until stopped
        self.runs += 1
        try:
            acted = await ctx.effect("act", self.act, replay="interrupted")
        except EffectInterrupted:
            acted = "interrupted"
        self.outcomes[(self.runs, ctx.seq)] = acted
        if self.runs == 1:
            self.recorded.set()  # effect() returned: its outcome is in the store
            await asyncio.sleep(3600)  # cut off by the stop before its checkpoint
        return state


def test_a_deleted_journal_does_not_make_the_node_that_began_an_effect_call_it_again(
    nodes: Nodes,
) -> None:
    """With the journal of a step deleted after its interrupted effect completed, the node
    that ran it replays the step on its restart with EffectInterrupted, and says so
    (effect.lost), instead of calling the effect again."""
    agent = ActsOnce()
    nodes.start("a", agent)
    nodes.crash("a", agent.recorded.is_set)
    assert agent.outcomes[(1, 1)] == "acted"
    nodes.backend.drop_effects("a", 1)
    nodes.start("a", agent)
    nodes.published_or_stuck("a", 1)
    assert agent.outcomes[(2, 1)] == "interrupted"
    assert agent.calls == 1
    lost = nodes.events.of("effect.lost", "a")
    assert [(e.detail["step_seq"], e.detail["index"], e.detail["name"]) for e in lost] == [
        (1, 0, "act")
    ]


def test_a_retry_after_a_retry_that_changed_path_follows_the_new_path_in_the_term(
    nodes: Nodes,
) -> None:
    """A run that called the failed effect #0 again and then failed before #1 leaves the
    first run's #1 as another path's: the next run in the term writes over it and
    publishes, instead of raising EffectMismatch on every run."""
    tool = Tool()
    agent = Agent(tool, replay="safe", hiccups=1)
    tool.hold = False
    nodes.start("a", agent)
    nodes.published_or_stuck("a", 1)
    errors = [e.detail["error"] for e in nodes.events.of("agent.failing", "a")]
    assert [error.split(":")[0] for error in errors] == ["RuntimeError", "RuntimeError"]
    assert agent.outcomes[("a", 1)] == "acted on found"
    assert tool.calls == {"search@1": 2, "fallback@1": 1, "act@1": 1}


class Picks:
    """Step 1 picks a plan with a safe effect (its answer differs at every call, as an LLM's
    may) and carries it out with another; the first run parks after both are recorded."""

    id = AGENT

    def __init__(self) -> None:
        self.picks = 0
        self.recorded = threading.Event()
        self.plans: list[str] = []

    def init(self) -> dict[str, Any]:
        return {}

    async def pick(self) -> str:
        self.picks += 1
        return "ab"[(self.picks - 1) % 2]

    async def carry_out(self, plan: str) -> str:
        self.plans.append(plan)
        return plan

    async def step(self, state: dict[str, Any]) -> dict[str, Any]:
        ctx = current_step()
        assert ctx is not None
        if ctx.seq > 1:
            await asyncio.sleep(3600)  # nothing more to see: park until stopped
        plan = await ctx.effect("pick", self.pick)
        state["plan"] = await ctx.effect(f"plan-{plan}", self.carry_out, plan)
        if not self.recorded.is_set():
            self.recorded.set()
            await asyncio.sleep(3600)  # cut off by the stop before its checkpoint
        return state


def test_a_safe_effects_record_lost_from_the_store_takes_the_replay_on_another_path(
    nodes: Nodes,
) -> None:
    """With the outcome of a step's first (safe) effect spoilt in the store, the replay calls
    it again, gets another answer and calls another second effect: the earlier run's second
    record is of a path given up and is written over, and the step publishes, instead of
    raising EffectMismatch on every run for ever."""
    agent = Picks()
    nodes.start("a", agent)
    nodes.crash("a", agent.recorded.is_set)
    nodes.backend.spoil_effect("a", 1, 0, "outcome")
    nodes.start("a", agent)
    nodes.published_or_stuck("a", 1)
    assert [e.detail["error"] for e in nodes.events.of("agent.failing", "a")] == []
    assert agent.picks == 2 and agent.plans == ["a", "b"]
