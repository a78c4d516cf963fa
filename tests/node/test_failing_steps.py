"""A step that keeps raising (issue 16, point 3), in-process on a MemoryStore.

It is retried with exponential backoff and jitter, capped; each failure is one
``agent.failing`` event with the count and the last error, and the heartbeat
says so; a step that succeeds resets the count; after ``max_failures`` in a row
the node hands the lease over (``via=handoff``) and holds off taking it back.
The last test runs ``hb run`` as a real process and reads ``hb status``.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hamsterbunker import LeaseTiming, Runtime, current_step
from hamsterbunker.core.errors import ConfigError
from hamsterbunker.core.timing import StepRetry
from hamsterbunker.node.backoff import StepFailures, describe
from hamsterbunker.records import MAX_SHOWN_ERROR, Heartbeat
from hamsterbunker.testing import MemoryStore
from tests.support import SUPPORT_DIR, wait_until
from tests.support.agents import AGENT, SECRET, Recorder
from tests.support.cli import HB, hb_env, run_hb, wait_for

TIMING = LeaseTiming(tick_ms=50, lease_ttl_ms=300)
WAIT_S = 20.0


class Flaky:
    """Raises on the nodes in ``failing_on`` while ``failing`` is set; else counts a step."""

    id = AGENT

    def __init__(self, failing_on: tuple[str, ...] = ("a", "b")) -> None:
        self.failing = threading.Event()
        self.failing.set()
        self.failing_on = failing_on

    def init(self) -> dict[str, Any]:
        return {"n": 0}

    async def step(self, state: dict[str, Any]) -> dict[str, Any]:
        context = current_step()
        assert context is not None
        if self.failing.is_set() and context.node in self.failing_on:
            raise RuntimeError(f"the API said 500\nfor step {context.seq}")
        await asyncio.sleep(0.02)
        state["n"] += 1
        return state


class Nodes:
    def __init__(self) -> None:
        self.store = MemoryStore()
        self.events = Recorder()
        self.made: list[Runtime] = []

    def start(self, node_id: str, agent: Any, retry: StepRetry) -> Runtime:
        node = Runtime(node_id=node_id, region="r", store=self.store, agent=agent, secret=SECRET,
                       timing=TIMING, on_event=self.events, stop_grace_ms=0, step_retry=retry)  # fmt: skip
        self.made.append(node)
        node.start()
        return node

    def heartbeat(self, node: str) -> Heartbeat | None:
        return next((h for h in self.store.list_heartbeats(AGENT) if h.node == node), None)

    def failing_times(self, node: str) -> list[float]:
        return [t for t, _ in self.events.timed("agent.failing", node)]


@pytest.fixture
def nodes() -> Iterator[Nodes]:
    made = Nodes()
    yield made
    for node in made.made:
        node.stop()


def test_failing_steps_back_off_and_say_so_until_one_succeeds(nodes: Nodes) -> None:
    """The gaps between failures double (within the jitter) up to the cap; every failure
    is an agent.failing event with the count and the error, and the heartbeat shows it;
    a step that succeeds resets the count."""
    agent = Flaky()
    nodes.start("a", agent, StepRetry(first_ms=100, max_ms=450, max_failures=0))
    wait_until(lambda: len(nodes.failing_times("a")) >= 5, "five failures", WAIT_S)
    times = nodes.failing_times("a")[:5]
    gaps = [later - earlier for earlier, later in itertools.pairwise(times)]
    # 100, 200, 400 ms within ±20 %, then capped at 450 ms (the step itself adds a little).
    for gap, low, high in zip(gaps, (0.08, 0.16, 0.32, 0.36), (0.3, 0.45, 0.7, 0.7), strict=True):
        assert low <= gap <= high, gaps
    assert gaps[0] < gaps[1] < gaps[2], gaps
    events = nodes.events.of("agent.failing", "a")[:5]
    assert [e.detail["failures"] for e in events] == [1, 2, 3, 4, 5]
    assert {e.detail["step_seq"] for e in events} == {1}
    assert events[0].detail["error"] == "RuntimeError: the API said 500 for step 1"
    assert events[0].detail["error_type"] == "RuntimeError"
    assert 80 <= events[0].detail["retry_ms"] <= 120
    beat = wait_until(
        lambda: (h := nodes.heartbeat("a")) is not None and h.failing >= 5 and h,
        "a heartbeat showing the failures",
        WAIT_S,
    )
    assert beat.failing_error == "RuntimeError: the API said 500 for step 1"
    assert nodes.events.of("lease.given_up") == []  # max_failures=0: never hands over

    agent.failing.clear()
    nodes.events.wait("checkpoint.published", "a", timeout=WAIT_S)
    wait_until(
        lambda: (h := nodes.heartbeat("a")) is not None and h.failing == 0 and h.seq >= 1,
        "a heartbeat without failures",
        WAIT_S,
    )
    assert nodes.heartbeat("a").failing_error == ""  # type: ignore[union-attr]
    agent.failing.set()
    again = nodes.events.wait(
        "agent.failing", "a", where=lambda e: e.detail["step_seq"] > 1, timeout=WAIT_S
    )
    assert again.detail["failures"] == 1


def test_a_stop_cuts_the_backoff_short(nodes: Nodes) -> None:
    """A node waiting a long backoff stops at once, and releases the lease."""
    node = nodes.start("a", Flaky(), StepRetry(first_ms=30_000, max_ms=60_000))
    failed = nodes.events.wait("agent.failing", "a", timeout=WAIT_S)
    assert failed.detail["retry_ms"] >= 24_000
    started = time.monotonic()
    node.stop()
    assert time.monotonic() - started < 2.0  # not the shutdown budget (5 s), nor 30 s
    assert [e.detail.get("via") for e in nodes.events.of("lease.released", "a")] == [None]
    assert len(nodes.events.of("agent.failing", "a")) == 1


def test_after_max_failures_the_lease_is_handed_over_and_not_taken_back_at_once(
    nodes: Nodes,
) -> None:
    """After three failures in a row node a releases the lease (via=handoff); node b takes
    the released lease (via=handoff) and steps; a takes it back only after its hold-off (the backoff cap)."""
    retry = StepRetry(first_ms=50, max_ms=1_500, max_failures=3)
    agent = Flaky(failing_on=("a",))
    nodes.start("a", agent, retry)
    nodes.events.wait("lease.acquired", "a", timeout=WAIT_S)
    b = nodes.start("b", agent, retry)
    nodes.events.wait("node.online", "b", timeout=WAIT_S)

    given_up = nodes.events.wait("lease.given_up", "a", timeout=WAIT_S)
    assert given_up.detail["via"] == "handoff"
    assert "3 steps failed in a row" in given_up.detail["reason"]
    assert "RuntimeError: the API said 500" in given_up.detail["reason"]
    assert [e.detail["failures"] for e in nodes.events.of("agent.failing", "a")] == [1, 2, 3]
    nodes.events.wait("lease.released", "a", timeout=WAIT_S)  # emitted after given_up
    released_at, released = nodes.events.timed("lease.released", "a")[0]
    assert released.detail["via"] == "handoff"
    taken = nodes.events.wait("lease.acquired", "b", timeout=WAIT_S)
    assert taken.detail["via"] == "handoff"  # the released record says why: hb history too
    assert taken.detail["from"] == "a"
    nodes.events.wait("checkpoint.published", "b", timeout=WAIT_S)

    # b leaves at once: the lease is free, but a holds off for the backoff cap.
    b.stop()
    back = nodes.events.wait(
        "lease.acquired", "a", where=lambda e: e.epoch > given_up.epoch, timeout=WAIT_S
    )
    back_at = next(t for t, e in nodes.events.timed("lease.acquired", "a") if e is back)
    assert back_at - released_at >= 1.5 - 0.05


class FailingInit(Flaky):
    """Its init() raises on the nodes in failing_on while ``failing`` is set."""

    def init(self) -> dict[str, Any]:
        step = current_step()
        assert step is None  # init() runs before any step
        if self.failing.is_set() and self.node_of_init in self.failing_on:
            raise FileNotFoundError("no config file /etc/agent.toml")
        return super().init()

    node_of_init = "a"


def test_an_init_that_raises_is_one_line_backed_off_and_retried_until_it_succeeds(
    nodes: Nodes,
) -> None:
    """No traceback and no crash: each failure is one agent.failing line naming init() and
    the agent's error, retried with the step backoff; once init() succeeds the agent starts."""
    agent = FailingInit(failing_on=("a",))
    nodes.start("a", agent, StepRetry(first_ms=50, max_ms=200, max_failures=0))
    failing = nodes.events.wait("agent.failing", "a", where=lambda e: e.detail["failures"] >= 3,
                                timeout=WAIT_S)  # fmt: skip
    assert failing.detail["error"] == (
        "AgentInitFailed: init() raised FileNotFoundError: no config file /etc/agent.toml"
    )
    assert nodes.events.of("agent.started", "a") == nodes.events.of("node.offline", "a") == []
    agent.failing.clear()
    nodes.events.wait("agent.started", "a", timeout=WAIT_S)
    nodes.events.wait("checkpoint.published", "a", timeout=WAIT_S)


def test_an_init_that_keeps_raising_hands_the_lease_over_as_failing_steps_do(
    nodes: Nodes,
) -> None:
    """After max_failures init() failures a hands over; b, whose init() works, starts."""
    retry = StepRetry(first_ms=50, max_ms=1_500, max_failures=3)
    nodes.start("a", FailingInit(failing_on=("a",)), retry)
    nodes.events.wait("lease.acquired", "a", timeout=WAIT_S)
    b_agent = FailingInit(failing_on=("a",))
    b_agent.node_of_init = "b"
    nodes.start("b", b_agent, retry)
    given_up = nodes.events.wait("lease.given_up", "a", timeout=WAIT_S)
    assert given_up.detail["via"] == "handoff"
    assert "init() raised FileNotFoundError" in given_up.detail["reason"]
    nodes.events.wait("agent.started", "b", timeout=WAIT_S)
    nodes.events.wait("checkpoint.published", "b", timeout=WAIT_S)


class NotJson(Flaky):
    """Its step returns a state with a value that is not JSON while ``failing`` is set."""

    async def step(self, state: dict[str, Any]) -> dict[str, Any]:
        state = await super().step(state) if not self.failing.is_set() else dict(state)
        if self.failing.is_set():
            state["when"] = {"at": object()}
        return state


def test_a_state_that_is_not_json_is_a_failing_step_named_by_its_key_path(nodes: Nodes) -> None:
    """Not checkpoint.failed every tick and the lease given up and taken again for ever:
    each time one agent.failing line naming the value's key path, the step backoff, and
    after max_failures the lease handed over; a JSON state afterwards is published."""
    retry = StepRetry(first_ms=50, max_ms=1_500, max_failures=3)
    agent = NotJson(failing_on=("a",))
    nodes.start("a", agent, retry)
    given_up = nodes.events.wait("lease.given_up", "a", timeout=WAIT_S)
    assert given_up.detail["via"] == "handoff"
    failing = nodes.events.of("agent.failing", "a")
    assert [e.detail["failures"] for e in failing] == [1, 2, 3]
    assert (
        failing[0]
        .detail["error"]
        .startswith(
            "StateNotJson: agent state is not JSON-serialisable at state['when']['at'] "
            "(of type object)"
        )
    )
    assert nodes.events.of("checkpoint.failed", "a") == []
    agent.failing.clear()
    nodes.events.wait("checkpoint.published", "a", timeout=WAIT_S)


def test_step_failures_double_within_the_jitter_up_to_the_cap() -> None:
    retry = StepRetry(first_ms=1_000, max_ms=60_000, max_failures=10)
    low, high = StepFailures(retry, rand=lambda: 0.0), StepFailures(retry, rand=lambda: 1.0)
    assert [low.delay(n) for n in (1, 2, 3, 7, 8, 200)] == [0.8, 1.6, 3.2, 51.2, 60.0, 60.0]
    assert [high.delay(n) for n in (1, 2, 6, 7)] == [1.2, 2.4, 38.4, 60.0]
    for _ in range(9):
        low.failed(ValueError("x"))
    assert not low.hand_over()
    low.failed(ValueError("y"))
    assert low.hand_over() and low.now is not None and low.now.count == 10
    low.succeeded()
    assert low.count == 0 and not low.hand_over()
    never = StepFailures(StepRetry(max_failures=0))
    for _ in range(50):
        never.failed(ValueError("x"))
    assert not never.hand_over()


def test_an_error_is_shown_short_and_on_one_line() -> None:
    assert describe(KeyError("k")) == "KeyError: 'k'"
    assert describe(RuntimeError()) == "RuntimeError"
    long = describe(ValueError("x" * 1000))
    assert len(long) == MAX_SHOWN_ERROR and long.endswith("…")


@pytest.mark.parametrize(
    "kwargs",
    [
        {"first_ms": 0},
        {"first_ms": 2_000, "max_ms": 1_000},
        {"max_failures": -1},
        {"first_ms": 1.5},
        {"jitter": 1.0},
    ],
)
def test_step_retry_refuses_what_makes_no_sense(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        StepRetry(**kwargs)


def test_a_heartbeat_with_a_long_failing_error_is_refused() -> None:
    beat = Heartbeat("a", "r", "h", 1, "active", 1, 1, "a", 0.0, failing=2, failing_error="x")
    assert Heartbeat.from_json(beat.to_json()).failing == 2
    from hamsterbunker.core.errors import CorruptRecord

    bad = Heartbeat("a", "r", "h", 1, "active", 1, 1, "a", 0.0, failing_error="x" * 201)
    with pytest.raises(CorruptRecord):
        Heartbeat.from_json(bad.to_json())


@pytest.mark.multiprocess
def test_hb_status_shows_the_failing_step_of_a_running_node(tmp_path: Path) -> None:
    """hb run with an agent whose every step raises: hb status (text and --json) shows the
    failures in a row and the last error; the node logs one line per failure, no traceback."""
    store, log_path = tmp_path / "store", tmp_path / "node.log"
    command = [
        *HB, "run", "--create-store", "--store", store.as_uri(),
        "--agent", "hb_test_agents:FailingAgent",
        "--node-id", "n1", "--region", "test", "--tick-ms", "100", "--lease-ttl-ms", "600",
        "--step-retry-ms", "100", "--step-retry-max-ms", "200", "--max-step-failures", "0",
    ]  # fmt: skip
    env = hb_env(HB_SECRET="correct-horse-battery", PYTHONPATH=str(SUPPORT_DIR))
    with log_path.open("ab") as log:
        node = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT)  # fmt: skip
    args = ["status", "--store", store.as_uri(), "--agent-id", "failing"]

    def failing_line() -> str | None:
        shown = run_hb(args).stdout
        for line in shown.splitlines():
            if line.startswith("failing on n1: ") and " 1 step " not in line:
                return line
        return None

    try:
        line = wait_for("hb status to show the failing step", failing_line, 30)
        assert line.endswith("failed in a row, the last: RuntimeError: the API said 500"), line
        data = json.loads(run_hb([*args, "--json"]).stdout)
        (shown,) = [n for n in data["nodes"] if n["node"] == "n1"]
        assert shown["failing"] >= 2
        assert shown["failing_error"] == "RuntimeError: the API said 500"
    finally:
        node.send_signal(signal.SIGTERM)
        try:
            node.wait(timeout=15)
        except subprocess.TimeoutExpired:
            node.kill()
            node.wait(timeout=10)
    logged = log_path.read_text()
    assert "agent.failing" in logged and "the API said 500" in logged, logged
    assert "Traceback" not in logged, logged


def test_hb_status_shows_failing_steps_of_the_active_node_only(tmp_path: Path) -> None:
    from hamsterbunker import FileStore
    from hamsterbunker.ops.status import snapshot
    from hamsterbunker.ops.status_text import render
    from hamsterbunker.records import LeaseRecord

    store = FileStore(tmp_path / "store")
    store.cas_lease("x", None, LeaseRecord("n1", "eu", "s1", epoch=1, ttl_ms=60_000))
    for node, role in (("n1", "active"), ("n2", "standby")):
        store.put_heartbeat("x", Heartbeat(node, "eu", "h", 1, role, 1, 0, "n1", time.time(),
                                           failing=1, failing_error="KeyError: 'k'"))  # fmt: skip
    status = snapshot(store, "x")
    lines = [line for line in render(status).splitlines() if line.startswith("failing")]
    assert lines == ["failing on n1: 1 step failed in a row, the last: KeyError: 'k'"]
    shown = {n["node"]: n["failing"] for n in json.loads(status.to_json())["nodes"]}
    assert shown == {"n1": 1, "n2": 1}  # as each heartbeat says


def test_the_retry_keys_and_flags_are_read_and_checked(tmp_path: Path) -> None:
    from hamsterbunker.ops.config import parse_config

    keys = {"store": "file:///s", "agent": "m:a"}
    config = parse_config({**keys, "step_retry_ms": 50, "max_step_failures": 0}, tmp_path)
    assert config.step_retry == StepRetry(first_ms=50, max_failures=0)
    assert parse_config(keys, tmp_path).step_retry == StepRetry()
    with pytest.raises(ConfigError, match="first retry <= max retry"):
        parse_config({**keys, "step_retry_ms": 5_000, "step_retry_max_ms": 1_000}, tmp_path)
    result = run_hb(["run", "--store", (tmp_path / "s").as_uri(), "--agent", "m:a",
                     "--step-retry-ms", "5000", "--step-retry-max-ms", "1000"],
                    env=hb_env(HB_SECRET="correct-horse-battery"))  # fmt: skip
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "first retry <= max retry" in result.stderr


def test_the_backoff_is_timed_on_the_nodes_clock_and_ends_with_the_term() -> None:
    """pause_for waits on the node's clock (a FakeClock here, moved by hand), and returns
    False as soon as the term ends."""
    from hamsterbunker.core.clock import FakeClock
    from hamsterbunker.node.backoff import pause_for

    async def scenario() -> None:
        clock, ended = FakeClock(), asyncio.Event()
        waiting = asyncio.create_task(pause_for(30.0, clock, 0.01, ended))
        await asyncio.sleep(0.1)
        assert not waiting.done()  # 0.1 s of wall time is not 30 s of the node's clock
        clock.advance(30.0)
        assert await asyncio.wait_for(waiting, 5) is True
        cut = asyncio.create_task(pause_for(30.0, clock, 10.0, ended))
        await asyncio.sleep(0.01)
        ended.set()
        assert await asyncio.wait_for(cut, 5) is False

    asyncio.run(scenario())
