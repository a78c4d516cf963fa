"""The local survival demo: three nodes, a counter agent, SIGKILL the active node.

``hb demo`` starts three real node processes on a temporary file store, waits
for the counter to advance, kills the active node with SIGKILL and checks from
the outside that a standby resumed from the last accepted checkpoint.
"""

from __future__ import annotations

import asyncio
import secrets
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from .errors import ConfigError, HamsterbunkerError, StoreError
from .local import LocalCluster, NodeSpec
from .records import Event, LeaseRecord
from .sealing import Sealer
from .stores import Store, open_store
from .timing import DEFAULT_TIMING, LeaseTiming

__all__ = ["CounterAgent", "DemoFailed", "run_demo"]

NODES = (
    NodeSpec("hbnk-1", "eu-central"),
    NodeSpec("hbnk-2", "us-east"),
    NodeSpec("hbnk-3", "ap-south"),
)
T = TypeVar("T")


class CounterAgent:
    """Counts up by one every quarter second: the smallest agent worth keeping alive."""

    id = "counter"

    def init(self) -> dict[str, Any]:
        return {"count": 0}

    async def step(self, state: dict[str, Any]) -> dict[str, Any]:
        await asyncio.sleep(0.25)
        return {**state, "count": state["count"] + 1}


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

    def sealer(self) -> Sealer:
        if self._sealer is None:
            cluster = _wait_for("the cluster record", self.store.read_cluster, 20)
            self._sealer = Sealer(self.secret, cluster)
        return self._sealer

    def latest(self) -> tuple[int, int, int] | None:
        """(seq, epoch, count) of the newest checkpoint, or None."""
        for info in self.store.list_checkpoints(self.agent):
            try:
                blob = self.store.read_checkpoint(self.agent, info)
            except StoreError:
                continue  # pruned while we looked
            state = self.sealer().open(blob, self.agent, info.epoch, info.seq)
            return info.seq, info.epoch, int(state["count"])
        return None

    def count_at(self, seq: int) -> int | None:
        for info in self.store.list_checkpoints(self.agent):
            if info.seq == seq:
                blob = self.store.read_checkpoint(self.agent, info)
                return int(self.sealer().open(blob, self.agent, info.epoch, info.seq)["count"])
        return None

    def new_events(self) -> list[Event]:
        events = self.store.read_events(self.agent, self._cursors)
        for event in events:
            self._cursors[event.node] = max(self._cursors.get(event.node, 0), event.n)
        return events


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
    cluster = LocalCluster(
        store_url=store_url,
        secret=secret,
        agent="hamsterbunker.demo:CounterAgent",
        log_dir=workdir / "logs",
        timing=timing,
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
            _one_kill(cluster, watcher, store, regions, out)
        out("✓ SURVIVED — agent resumed from checkpoint, 0 state loss.")
        ok = True
    finally:
        cluster.stop_all()
        store.close()
        if ok:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            out(f"  node logs kept in {workdir / 'logs'}")


def _one_kill(
    cluster: LocalCluster,
    watcher: _Watcher,
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
    out(f"!! killing active node {active} (SIGKILL) — the server is gone")
    killed_at = time.monotonic()
    cluster.kill(active)
    # The dead node can publish no more: this is the last accepted checkpoint.
    last = watcher.latest()
    assert last is not None
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
    cluster.start(next(spec for spec in NODES if spec.node == active))  # it rejoins as a standby


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
