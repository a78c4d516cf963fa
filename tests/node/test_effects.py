"""Journaled effects in a running node (DESIGN.md invariant 8), in-process on a MemoryStore.

Node "a" runs a step that calls effects and then parks (or parks inside one);
it is stopped with no grace, so the step is cancelled as a crash would leave
it; node "b" takes over and replays the step. A ``Tool`` counts the real calls
per idempotency key. Process kills at each failpoint, on every backend, are in
tests/faults/test_effect_faults.py.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
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
from hamsterbunker.agent.effects import Entry, JournalIO, StepEffects
from hamsterbunker.core.errors import StepLost
from hamsterbunker.testing import MemoryStore
from tests.support import wait_until
from tests.support.agents import AGENT, SECRET, Recorder
from tests.support.raw_store import RawRecords

TIMING = LeaseTiming(tick_ms=50, lease_ttl_ms=300)
WAIT_S = 20.0


class Tool:
    """The outside world: counts calls per idempotency key; can hold node a's calls open."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()
        self.keys: list[tuple[str, str]] = []  # (node, key) in call order
        self.hold = False  # True: a call made on node "a" does not return
        self.release = threading.Event()  # lets held sync calls go at the end of the test
        self.failures_left = 0
        self._lock = threading.Lock()

    def _count(self) -> tuple[str, bool, bool]:
        effect, step = current_effect(), current_step()
        assert effect is not None and step is not None
        with self._lock:
            self.calls[effect.key] += 1
            self.keys.append((step.node, effect.key))
            fail = self.failures_left > 0
            self.failures_left -= fail
        return f"@{step.seq}", fail, self.hold and step.node == "a"

    def call(self, what: str) -> str:
        at, fail, held = self._count()
        if fail:
            raise ValueError(f"tool refused {what}")
        if held:
            self.release.wait(WAIT_S)  # a blocking call that hangs
        return what + at

    async def call_async(self, what: str) -> str:
        at, _fail, held = self._count()
        if held:
            await asyncio.sleep(3600)  # cancelled when the node stops
        return what + at


class Nodes:
    def __init__(self) -> None:
        self.store = MemoryStore()
        self.events = Recorder()
        self.made: list[Runtime] = []

    def start(self, node_id: str, agent: Any, **kwargs: Any) -> Runtime:
        node = Runtime(node_id=node_id, region="r", store=self.store, agent=agent, secret=SECRET,
                       timing=TIMING, on_event=self.events, **{"stop_grace_ms": 0, **kwargs})  # fmt: skip
        self.made.append(node)
        node.start()
        return node

    def crash_and_take_over(self, agent: Any, parked: Callable[[], bool]) -> Runtime:
        """Wait until a's step is parked, stop a with no grace, start b on the same agent."""
        wait_until(parked, "node a's step to park")
        self.made[0].stop()
        return self.start("b", agent)


@pytest.fixture
def nodes() -> Iterator[Nodes]:
    made = Nodes()
    yield made
    for node in made.made:
        node.stop()


class Steps:
    """An agent whose step is a coroutine given per test; the state keeps what steps saw."""

    id = AGENT

    def __init__(self, step: Callable[[dict[str, Any]], Any]) -> None:
        self._step = step
        self.parked = threading.Event()

    def init(self) -> dict[str, Any]:
        return {"seen": []}

    async def step(self, state: dict[str, Any]) -> dict[str, Any]:
        context = current_step()
        assert context is not None
        await self._step(state)
        if context.node == "a":  # a never finishes a step: it is stopped in the middle
            self.parked.set()
            await asyncio.sleep(3600)
        return state


def published_by_b(nodes: Nodes, seq: int = 1) -> None:
    nodes.events.wait("checkpoint.published", "b", where=lambda e: e.seq >= seq, timeout=WAIT_S)


def test_a_completed_effect_is_not_called_again_by_the_next_leader(nodes: Nodes) -> None:
    """The replay returns the recorded result without calling, and says how many it reused."""
    tool = Tool()

    async def step(state: dict[str, Any]) -> None:
        ctx = current_step()
        assert ctx is not None
        state["seen"].append(await ctx.effect("llm", tool.call, "prompt"))
        state["seen"].append(await ctx.effect("tool", tool.call_async, "search"))

    agent = Steps(step)
    nodes.start("a", agent)
    nodes.crash_and_take_over(agent, agent.parked.is_set)
    published_by_b(nodes)
    first_step_keys = [key for node, key in tool.keys if node == "a"]
    assert len(first_step_keys) == 2
    assert [tool.calls[key] for key in first_step_keys] == [1, 1]
    replayed = nodes.events.wait("effect.replayed", "b")
    assert (replayed.detail["step_seq"], replayed.detail["reused"]) == (1, 2)
    assert nodes.store.read_effects(AGENT, 1) == {}, "the journal outlived its checkpoint"


@pytest.mark.parametrize("blocking", [False, True], ids=["async-fn", "hanging-sync-fn"])
@pytest.mark.parametrize("replay", ["safe", "interrupted"])
def test_an_effect_cut_off_in_its_call_runs_again_only_if_safe(
    nodes: Nodes, replay: str, blocking: bool
) -> None:
    """Cut off in the call: a safe effect is called again (same key, one result seen); an
    interrupted one is not, and the replay raises EffectInterrupted in the step. A sync
    function that hangs keeps neither the stop nor the takeover waiting."""
    tool = Tool()
    tool.hold = True
    call = tool.call if blocking else tool.call_async

    async def step(state: dict[str, Any]) -> None:
        ctx = current_step()
        assert ctx is not None
        try:
            state["seen"].append(await ctx.effect("send", call, "mail", replay=replay))
        except EffectInterrupted as exc:
            state["seen"].append(f"interrupted {exc.name} {exc.seq} {exc.index}")

    agent = Steps(step)
    nodes.start("a", agent)
    wait_until(lambda: tool.keys, "the call to reach the tool")
    stopping = time.monotonic()
    nodes.made[0].stop()
    assert time.monotonic() - stopping < 5.0, "the stop waited for the effect's function"
    nodes.start("b", agent)
    published_by_b(nodes)
    [key] = {key for _node, key in tool.keys if _node == "a"}
    if replay == "safe":
        assert tool.calls[key] == 2, "a safe effect whose outcome is unknown runs again"
        assert ("b", key) in tool.keys, "the idempotency key changed on replay"
    else:
        assert tool.calls[key] == 1, "an interrupted effect ran twice"
        event = nodes.events.wait("effect.interrupted", "b")
        assert (event.detail["name"], event.detail["index"]) == ("send", 0)
    tool.release.set()


def test_an_interrupted_effect_whose_outcome_was_recorded_is_replayed(nodes: Nodes) -> None:
    """replay="interrupted" with a recorded outcome: the result comes back, nothing is raised."""
    tool = Tool()

    async def step(state: dict[str, Any]) -> None:
        ctx = current_step()
        assert ctx is not None
        state["seen"].append(await ctx.effect("pay", tool.call, "10 EUR", replay="interrupted"))

    agent = Steps(step)
    nodes.start("a", agent)
    nodes.crash_and_take_over(agent, agent.parked.is_set)
    published_by_b(nodes)
    assert sorted(tool.calls.values())[0] == 1 and nodes.events.of("effect.interrupted") == []


def test_a_recorded_failure_is_raised_again_without_calling(nodes: Nodes) -> None:
    """An effect that raised is recorded: the replay raises EffectFailed with its type and
    message, and does not call the function again."""
    tool = Tool()
    tool.failures_left = 1
    failures: list[tuple[str, str, str]] = []

    async def step(state: dict[str, Any]) -> None:
        ctx = current_step()
        assert ctx is not None
        try:
            await ctx.effect("fetch", tool.call, "page")
        except EffectFailed as exc:
            failures.append((ctx.node, exc.error_type, exc.message))

    agent = Steps(step)
    nodes.start("a", agent)
    nodes.crash_and_take_over(agent, agent.parked.is_set)
    published_by_b(nodes)
    refused = ("ValueError", "tool refused page")
    assert failures[:2] == [("a", *refused), ("b", *refused)]
    assert sum(count for key, count in tool.calls.items() if ("a", key) in tool.keys) == 1


def test_a_step_that_fails_on_an_effect_calls_it_again_when_retried(nodes: Nodes) -> None:
    """A failure the step does not handle fails the step; its retry calls the failed safe
    effect again (not stuck replaying the failure), and reuses the ones that succeeded."""
    tool = Tool()
    armed = threading.Event()

    async def step(state: dict[str, Any]) -> None:
        ctx = current_step()
        assert ctx is not None
        state["seen"].append(await ctx.effect("first", tool.call, "one"))
        if ctx.seq == 1 and not armed.is_set():
            armed.set()
            tool.failures_left = 1  # the first call of "second" fails, once
        state["seen"].append(await ctx.effect("second", tool.call, "two"))

    class Once(Steps):
        async def step(self, state: dict[str, Any]) -> dict[str, Any]:
            await self._step(state)
            return state

    nodes.start("a", Once(step))
    nodes.events.wait("checkpoint.published", "a", where=lambda e: e.seq >= 1, timeout=WAIT_S)
    failed = nodes.events.wait("agent.failing", "a")
    assert "EffectFailed" in failed.detail["error"]
    keys_of_step_1 = [key for _node, key in tool.keys[:3]]
    assert Counter(keys_of_step_1) == {keys_of_step_1[0]: 1, keys_of_step_1[1]: 2}


def test_an_effect_called_in_another_order_on_replay_is_a_mismatch(nodes: Nodes) -> None:
    """A replay that calls another effect where the journal has one raises EffectMismatch
    naming both, and the step is not published."""
    tool = Tool()

    async def step(state: dict[str, Any]) -> None:
        ctx = current_step()
        assert ctx is not None
        await ctx.effect("llm" if ctx.node == "a" else "search", tool.call, "x")

    agent = Steps(step)
    nodes.start("a", agent)
    nodes.crash_and_take_over(agent, agent.parked.is_set)
    failed = nodes.events.wait("agent.failing", "b")
    assert "EffectMismatch" in failed.detail["error"]
    assert "'search'" in failed.detail["error"] and "'llm'" in failed.detail["error"]
    assert [e for e in nodes.events.of("checkpoint.published", "b")] == []


@pytest.mark.parametrize(
    ("result", "words"),
    [
        ({1, 2}, "not JSON-serialisable"),
        (float("nan"), "not JSON-serialisable"),
        ("\ud800", "not JSON-serialisable"),
        ("x" * 600_000, "above the limit of 524288 bytes"),
    ],
    ids=["a-set", "nan", "lone-surrogate", "too-large"],
)
def test_a_result_that_cannot_be_recorded_is_refused_and_not_recorded(
    nodes: Nodes, result: Any, words: str
) -> None:
    """A result that cannot be recorded is an EffectError naming why; nothing is recorded,
    and the next effect of the step goes on as number 1."""
    seen: list[str] = []

    async def step(state: dict[str, Any]) -> None:
        ctx = current_step()
        assert ctx is not None
        try:
            await ctx.effect("odd", lambda: result)
        except Exception as exc:
            seen.append(f"{type(exc).__name__}: {exc}")
        await ctx.effect("next", lambda: "fine")

    agent = Steps(step)
    nodes.start("a", agent)
    wait_until(agent.parked.is_set, "the step to park")
    assert seen and seen[0].startswith("EffectError") and words in seen[0], seen
    assert set(nodes.store.read_effects(AGENT, 1)) == {(1, "outcome")}


def test_keys_differ_between_effects_and_steps(nodes: Nodes) -> None:
    """Each effect of each step has its own idempotency key."""
    tool = Tool()

    async def step(state: dict[str, Any]) -> None:
        ctx = current_step()
        assert ctx is not None
        await ctx.effect("x", tool.call, "1")
        await ctx.effect("x", tool.call, "2")

    class Runs(Steps):
        async def step(self, state: dict[str, Any]) -> dict[str, Any]:
            await self._step(state)
            return state

    nodes.start("a", Runs(step))
    nodes.events.wait("checkpoint.published", "a", where=lambda e: e.seq >= 3, timeout=WAIT_S)
    keys = [key for _node, key in tool.keys[:6]]
    assert len(set(keys)) == 6 and all(key.startswith("hb-") for key in keys)


class SyncSteps:
    """A sync agent: effect_sync from the step's thread."""

    id = AGENT

    def __init__(self, tool: Tool) -> None:
        self.tool = tool
        self.parked = threading.Event()

    def init(self) -> dict[str, Any]:
        return {"seen": []}

    def step(self, state: dict[str, Any]) -> dict[str, Any]:
        ctx = current_step()
        assert ctx is not None
        state["seen"].append(ctx.effect_sync("llm", self.tool.call, "sync"))
        if ctx.node == "a":
            self.parked.set()
            while not ctx.lost:
                time.sleep(0.01)
            ctx.check()
        return state


def test_a_sync_step_journals_with_effect_sync(nodes: Nodes) -> None:
    """effect_sync records the outcome from a sync step; the replay reuses it."""
    tool = Tool()
    agent = SyncSteps(tool)
    nodes.start("a", agent)
    nodes.crash_and_take_over(agent, agent.parked.is_set)
    published_by_b(nodes)
    replayed = nodes.events.wait("effect.replayed", "b")
    assert replayed.detail["reused"] == 1
    [(node, key)] = tool.keys[:1]
    assert node == "a" and tool.calls[key] == 1


def test_a_tampered_record_is_rejected_and_a_safe_effect_runs_again(nodes: Nodes) -> None:
    """A record that does not authenticate as that step's effect is reported and not used."""
    tool = Tool()

    async def step(state: dict[str, Any]) -> None:
        ctx = current_step()
        assert ctx is not None
        state["seen"].append(await ctx.effect("a0", tool.call, "0"))
        state["seen"].append(await ctx.effect("a1", tool.call, "1"))

    agent = Steps(step)
    nodes.start("a", agent)
    wait_until(agent.parked.is_set, "the step to park")
    nodes.made[0].stop()
    journal = nodes.store.read_effects(AGENT, 1)
    raw = RawRecords(nodes.store)
    raw.put_effect(AGENT, 1, 0, "outcome", journal[(1, "outcome")])  # moved
    raw.put_effect(AGENT, 1, 1, "outcome", b"HBEF junk")  # forged
    nodes.start("b", agent)
    published_by_b(nodes)
    rejected = nodes.events.of("effect.rejected", "b")
    assert sorted(e.detail["index"] for e in rejected) == [0, 1]
    assert nodes.events.of("effect.replayed", "b") == []
    keys_of_a = [key for node, key in tool.keys if node == "a"]
    assert [tool.calls[key] for key in keys_of_a] == [2, 2]


# -- the stop grace ------------------------------------------------------------------


class Timed:
    """Each step takes `seconds`; counts how often each seq was entered."""

    id = AGENT

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.entered: Counter[int] = Counter()
        self.in_step = threading.Event()

    def init(self) -> dict[str, Any]:
        return {"n": 0}

    async def step(self, state: dict[str, Any]) -> dict[str, Any]:
        ctx = current_step()
        assert ctx is not None
        self.entered[ctx.seq] += 1
        self.in_step.set()
        await asyncio.sleep(self.seconds)
        self.in_step.clear()
        return {"n": state["n"] + 1}


def test_a_stop_lets_the_step_in_flight_finish_and_publishes_it(nodes: Nodes) -> None:
    """Stopped mid-step, the node finishes the step within the grace and publishes it; the
    next leader goes on from it, repeating no step."""
    agent = Timed(0.4)
    node_a = nodes.start("a", agent, stop_grace_ms=5000)
    nodes.events.wait("checkpoint.published", "a", where=lambda e: e.seq >= 1, timeout=WAIT_S)
    wait_until(agent.in_step.is_set, "a step in flight")
    in_flight = max(agent.entered)
    node_a.stop()
    last = max(e.seq for e in nodes.events.of("checkpoint.published", "a"))
    assert last == in_flight, "the step in flight was not published before the stop"
    nodes.start("b", agent, stop_grace_ms=5000)
    published_by_b(nodes, in_flight + 1)
    assert all(count == 1 for count in agent.entered.values()), agent.entered


def test_a_step_past_the_grace_is_cancelled_and_not_published(nodes: Nodes) -> None:
    """A step that outlives the grace is cancelled; the stop still returns soon after."""
    agent = Timed(3600)
    node_a = nodes.start("a", agent, stop_grace_ms=300)
    wait_until(agent.in_step.is_set, "a step in flight")
    started = time.monotonic()
    node_a.stop()
    assert time.monotonic() - started < 5.0
    assert nodes.events.of("checkpoint.published", "a") == []
    yielded = nodes.events.wait("agent.yielded", "a")
    assert yielded.detail["step_seq"] == 1


# -- the rules, without a node -------------------------------------------------------


class FakeJournal:
    """A JournalIO in memory that records every write."""

    def __init__(self, stored: dict[int, Entry] | None = None) -> None:
        self.stored = stored or {}
        self.writes: list[tuple[int, str]] = []
        self.events: list[str] = []

    async def load(self, seq: int) -> dict[int, Entry]:
        return dict(self.stored)

    async def write(self, seq: int, index: int, kind: str, entry: Entry) -> None:
        self.writes.append((index, kind))

    def history(self, op: str, seq: int, started: float, outcome: str, **detail: Any) -> None:
        pass

    def emit(self, kind: str, **detail: Any) -> None:
        self.events.append(kind)

    def now(self) -> float:
        return time.monotonic()

    def key(self, seq: int, index: int, name: str) -> str:
        return f"{seq}/{index}/{name}"

    async def call_blocking(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)


def test_no_effect_starts_once_the_right_to_step_has_lapsed() -> None:
    """With the renew deadline passed, effect() raises StepLost: nothing called or written."""
    journal = FakeJournal()
    io: JournalIO = journal
    effects = StepEffects(1, io, {}, may_start=lambda: False)
    called: list[int] = []
    for replay in ("safe", "interrupted"):
        with pytest.raises(StepLost):
            asyncio.run(effects.run("x", called.append, (1,), {}, replay))
    assert called == [] and journal.writes == []


def test_an_interrupted_effect_writes_its_intent_before_it_is_called() -> None:
    """The intent is accepted before fn runs; the outcome after."""
    journal = FakeJournal()
    order: list[str] = []

    def fn() -> str:
        order.append(f"called after {journal.writes}")
        return "ok"

    effects = StepEffects(1, journal, {}, may_start=lambda: True)
    assert asyncio.run(effects.run("x", fn, (), {}, "interrupted")) == "ok"
    assert order == ["called after [(0, 'intent')]"]
    assert journal.writes == [(0, "intent"), (0, "outcome")]


def test_an_outcome_returned_after_the_step_was_given_up_is_not_recorded() -> None:
    """An abandoned step's effect that returns late records nothing: a retry may already have
    reported it interrupted, and every later replay must say the same."""
    journal = FakeJournal()
    given_up = threading.Event()

    def fn() -> str:
        given_up.set()  # the runtime gives the step up while fn runs
        return "late"

    effects = StepEffects(1, journal, {}, may_start=lambda: not given_up.is_set())
    with pytest.raises(StepLost):
        asyncio.run(effects.run("pay", fn, (), {}, "interrupted"))
    assert journal.writes == [(0, "intent")]
    assert effects.entries is not None and effects.entries[0].outcome is None


def test_bad_names_and_replay_modes_are_refused() -> None:
    """An empty or huge name, or an unknown replay mode, is a ValueError naming the problem."""
    effects = StepEffects(1, FakeJournal(), {}, may_start=lambda: True)
    for name, replay, words in (("", "safe", "name"), ("x" * 201, "safe", "name"),
                                ("x", "twice", "replay")):  # fmt: skip
        with pytest.raises(ValueError, match=words):
            asyncio.run(effects.run(name, lambda: 1, (), {}, replay))
