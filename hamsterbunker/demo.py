"""The local survival demo (``hb demo``): three real node processes on a temporary file
store run a counter agent; the active node is SIGKILLed, and the demo checks from outside
that a standby resumed from the last accepted checkpoint, reused the effects recorded in
the journal, and ran no effect twice whose outcome had been recorded.
"""

from __future__ import annotations

import asyncio
import collections
import json
import os
import random
import secrets
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from .agent.effects import current_effect, effect_key
from .agent.step import current_step
from .core.errors import ConfigError, HamsterbunkerError, StoreError, Tampered
from .core.timing import DEFAULT_TIMING, LeaseTiming
from .ops.local import LocalCluster, NodeSpec
from .records import CheckpointInfo, Event, LeaseRecord
from .sealing import EffectAt, Sealer
from .stores import Store, open_store

__all__ = ["CounterAgent", "DemoFailed", "run_demo"]

NODES = (
    NodeSpec("hbnk-1", "eu-central"),
    NodeSpec("hbnk-2", "us-east"),
    NodeSpec("hbnk-3", "ap-south"),
)
T = TypeVar("T")
# Where the pretend tool call logs its real executions (set by the demo for its nodes).
CALL_LOG_ENV = "HB_DEMO_CALL_LOG"
EFFECT_NAME = "tally"
# A step: the tool call takes TOOL_S, then the step works on for REST_S (a quarter second
# in all), so a kill lands mid-effect or after a completed one about as often.
TOOL_S, REST_S = 0.10, 0.15


async def _tally(count: int) -> int:
    """The pretend tool call: log this real execution by its idempotency key, take a moment."""
    effect = current_effect()
    path = os.environ.get(CALL_LOG_ENV)
    if path and effect is not None:
        line = {"key": effect.key, "seq": effect.seq, "index": effect.index, "pid": os.getpid()}
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, (json.dumps(line) + "\n").encode())  # one write: whole lines only
        finally:
            os.close(fd)
    await asyncio.sleep(TOOL_S)
    return count + 1


class CounterAgent:
    """Counts up by one every quarter second: the smallest agent worth keeping alive.

    Each step asks a pretend tool for the next number, as a journaled effect: a
    replay of the step after a crash gets the recorded answer instead of asking again.
    """

    id = "counter"

    def init(self) -> dict[str, Any]:
        return {"count": 0}

    async def step(self, state: dict[str, Any]) -> dict[str, Any]:
        step = current_step()
        if step is None:  # not run by a node: nothing to journal in
            await asyncio.sleep(TOOL_S + REST_S)
            return {**state, "count": state["count"] + 1}
        count = await step.effect(EFFECT_NAME, _tally, int(state["count"]))
        await asyncio.sleep(REST_S)
        return {**state, "count": count}


class DemoFailed(HamsterbunkerError):
    """The agent did not survive: it did not resume, or resumed behind its checkpoint."""


def _wait_for(what: str, probe: Callable[[], T | None], timeout: float) -> T:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = probe()
        except StoreError:
            value = None  # a record mid-write or not there yet: look again
        if value is not None:
            return value
        time.sleep(0.05)
    raise DemoFailed(f"timed out after {timeout:.0f} s waiting for {what}")


class _Watcher:
    """Reads the demo's store from the outside, with the secret, like an operator would."""

    def __init__(self, store: Store, secret: str, agent: str) -> None:
        self.store, self.secret, self.agent = store, secret, agent
        self._sealer: Sealer | None = None
        self._cursors: dict[str, int] = {}
        self.seen: list[Event] = []  # every event read, in the order read

    def sealer(self) -> Sealer:
        if self._sealer is None:
            cluster = _wait_for("the cluster record", self.store.read_cluster, 20)
            self._sealer = Sealer(self.secret, cluster)
        return self._sealer

    def latest(self) -> tuple[int, int, int] | None:
        """(seq, epoch, count) of the newest checkpoint, or None."""
        for info in self.store.list_checkpoints(self.agent):
            try:
                return info.seq, info.epoch, self._count(info)
            except StoreError:
                continue  # pruned while we looked
        return None

    def count_at(self, seq: int) -> int | None:
        listed = self.store.list_checkpoints(self.agent)
        return next((self._count(info) for info in listed if info.seq == seq), None)

    def _count(self, info: CheckpointInfo) -> int:
        blob = self.store.read_checkpoint(self.agent, info)
        return int(self.sealer().open(blob, self.agent, info.epoch, info.seq)["count"])

    def new_events(self) -> list[Event]:
        events = self.store.read_events(self.agent, self._cursors)
        for event in events:
            self._cursors[event.node] = max(self._cursors.get(event.node, 0), event.n)
        self.seen.extend(events)
        return events

    def recorded(self, seq: int) -> set[str]:
        """The idempotency keys of step seq's effects whose outcome the journal holds."""
        sealer, keys = self.sealer(), set()
        for (index, kind), blob in self.store.read_effects(self.agent, seq).items():
            if kind != "outcome":
                continue
            try:
                opened = sealer.open_effect(blob, EffectAt(self.agent, seq, index, kind))
            except Tampered:
                continue  # not a record the nodes would reuse either
            keys.add(effect_key(sealer.cluster.salt, self.agent, seq, index, opened.name))
        return keys

    def reused(self, node: str, epoch: int, seq: int) -> int | None:
        """How many recorded effects of step seq node reported reusing (effect.replayed)."""
        counts = [
            int(e.detail.get("reused", 0))
            for e in self.seen
            if e.type == "effect.replayed"
            and (e.node, e.epoch, e.detail.get("step_seq")) == (node, epoch, seq)
        ]
        return max(counts) if counts else None


class _CallLog:
    """The pretend tool's log of real executions: what ran, counted by idempotency key."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.may_repeat: set[str] = set()  # started, never recorded, before a kill

    def calls(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        lines = self.path.read_text().splitlines()
        return [json.loads(line) for line in lines if line.endswith("}")]

    def keys_of(self, seq: int) -> set[str]:
        return {str(call["key"]) for call in self.calls() if call["seq"] == seq}

    def check(self, recorded: set[str], unfinished: set[str]) -> int:
        """Fail if a key ran twice that may not have; how many of unfinished ran again."""
        counts = collections.Counter(str(call["key"]) for call in self.calls())
        twice = {key for key, n in counts.items() if n > 1}
        for key in sorted(twice - self.may_repeat):
            seq = next(call["seq"] for call in self.calls() if call["key"] == key)
            what = "its outcome had been recorded" if key in recorded else "it had completed"
            raise DemoFailed(
                f"✗ RAN TWICE — the effect of step {seq} (key {key}) was executed "
                f"{counts[key]} times, though {what}"
            )
        return len(twice & unfinished)


def run_demo(
    kills: int = 1,
    store_url: str | None = None,
    timing: LeaseTiming = DEFAULT_TIMING,
    out: Callable[[str], None] = print,
) -> None:
    """Run the demo; raise DemoFailed if the agent does not survive every kill."""
    if store_url is not None:
        given = open_store(store_url)
        try:
            if given.read_cluster() is not None:
                # store.url, not store_url: a Redis password is shown as ***.
                raise ConfigError(
                    f"store {given.url} is in use already: the demo needs an empty store"
                )
        finally:
            given.close()
    workdir = Path(tempfile.mkdtemp(prefix="hb-demo-"))
    store_url = store_url or (workdir / "store").as_uri()
    secret = secrets.token_urlsafe(24)
    calls = _CallLog(workdir / "tool-calls.jsonl")
    cluster = LocalCluster(
        store_url=store_url,
        secret=secret,
        agent="hamsterbunker.demo:CounterAgent",
        log_dir=workdir / "logs",
        timing=timing,
        env={CALL_LOG_ENV: str(calls.path)},
    )
    regions = {spec.node: spec.region for spec in NODES}
    store = open_store(store_url)
    watcher = _Watcher(store, secret, CounterAgent.id)
    ok = False
    ttl, tick = timing.lease_ttl_ms, timing.tick_ms
    out(f"HamsterBunker demo · store {store.url} · lease TTL {ttl} ms · tick {tick} ms")
    try:
        for spec in NODES:
            cluster.start(spec)
            out(f"  started {spec.node} ({spec.region}) · pid {cluster.pid(spec.node)}")
        for _ in range(kills):
            _one_kill(cluster, watcher, calls, store, regions, out)
        out("✓ SURVIVED — agent resumed from checkpoint, 0 state loss.")
        ok = True
    finally:
        cluster.stop_all()
        store.close()
        if ok:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            out(f"  node logs kept in {workdir / 'logs'}, tool calls in {calls.path}")


def _one_kill(
    cluster: LocalCluster,
    watcher: _Watcher,
    calls: _CallLog,
    store: Store,
    regions: dict[str, str],
    out: Callable[[str], None],
) -> None:
    agent = CounterAgent.id
    before = watcher.latest()
    start_seq = before[0] if before else 0
    # Let the agent visibly advance under the current leader before pulling the plug.
    _wait_for("the agent to advance", lambda: _advanced(watcher, start_seq + 4), 30)
    lease = _wait_for("a lease holder", lambda: _held(store, agent), 10)
    active = lease.holder
    assert active is not None
    latest = watcher.latest()
    assert latest is not None
    out(f"active node: {active} ({regions[active]}) · agent at count={latest[2]}")
    watcher.new_events()  # everything up to now is history
    # Somewhere in a step, not always just after a checkpoint: mid-effect, or after one.
    time.sleep(random.uniform(0, TOOL_S + REST_S))
    out(f"!! killing active node {active} (SIGKILL) — the server is gone")
    killed_at = time.monotonic()
    cluster.kill(active)
    # The dead node can publish no more: this is the last accepted checkpoint.
    last = watcher.latest()
    assert last is not None
    # ... and the journal of the step it had in flight is all it will ever be: an effect
    # recorded there must be reused, one started but not recorded may run again.
    in_flight = last[0] + 1
    recorded = watcher.recorded(in_flight)
    unfinished = calls.keys_of(in_flight) - recorded
    calls.may_repeat |= unfinished
    resumed = _wait_for(
        "a standby to resume",
        lambda: _resumed(watcher, active, lease.epoch),
        6 * lease.ttl_ms / 1000 + 10,
    )
    took = time.monotonic() - killed_at
    count = watcher.count_at(int(resumed.detail["from_seq"]))
    out(
        f"  ↳ {resumed.node} ({regions[resumed.node]}) RESUMED at count="
        f"{count if count is not None else '?'} · epoch {resumed.epoch} · {took:.2f} s after the kill"
    )
    from_seq = int(resumed.detail["from_seq"])
    if from_seq < last[0]:
        raise DemoFailed(
            f"✗ LOST STATE — resumed from checkpoint {from_seq}, but {last[0]} had been accepted"
        )
    if count is not None and count != last[2]:
        raise DemoFailed(f"✗ resumed at count={count}, but the last checkpoint said {last[2]}")
    _wait_for(
        "the agent to advance after the takeover", lambda: _advanced(watcher, from_seq + 1), 10
    )
    _report_effects(watcher, calls, resumed, in_flight, (recorded, unfinished), out)
    cluster.start(next(spec for spec in NODES if spec.node == active))  # it rejoins as a standby


def _report_effects(
    watcher: _Watcher,
    calls: _CallLog,
    resumed: Event,
    seq: int,
    journal: tuple[set[str], set[str]],
    out: Callable[[str], None],
) -> None:
    """The new leader's replay of the step in flight at the kill: what it reused, and
    whether any effect ran twice that must not have. journal: the keys of the step's
    effects recorded at the kill, and of those started but not recorded."""
    recorded, unfinished = journal

    def reported() -> int | None:
        watcher.new_events()
        return watcher.reused(resumed.node, resumed.epoch, seq)

    rerun = calls.check(recorded, unfinished)  # the step was published: it ran what it ran
    reused = 0
    if recorded:
        try:
            reused = _wait_for("the new leader's effect.replayed event", reported, 10)
        except DemoFailed:
            raise DemoFailed(
                f"✗ {len(recorded)} effect(s) of step {seq} were recorded before the kill, "
                f"but {resumed.node} reported reusing none"
            ) from None
    else:
        reused = reported() or 0
    if reused < len(recorded):
        raise DemoFailed(
            f"✗ {len(recorded)} effect(s) of step {seq} were recorded before the kill, "
            f"but {resumed.node} reused {reused}"
        )
    out(
        f"  ↳ effects: {reused} reused from the journal · {rerun} unfinished re-run"
        " · no completed effect ran twice"
    )


def _advanced(watcher: _Watcher, seq: int) -> bool | None:
    latest = watcher.latest()
    return True if latest is not None and latest[0] >= seq else None


def _held(store: Store, agent: str) -> LeaseRecord | None:
    lease = store.read_lease(agent)
    return lease if lease is not None and lease.holder is not None else None


def _resumed(watcher: _Watcher, killed: str, old_epoch: int) -> Event | None:
    for event in watcher.new_events():
        if event.type == "agent.resumed" and event.node != killed and event.epoch > old_epoch:
            return event
        if event.type == "agent.started" and event.epoch > old_epoch:
            raise DemoFailed(f"✗ {event.node} started the agent over from init() after the kill")
    return None
