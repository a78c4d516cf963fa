"""The monitor against a store holding whatever its writers put there.

Records in the store are not authenticated: anyone who can write the store can
put anything in it. A lease record that does not parse is shown as such (not
as a lost store) and everything else goes on; records that do parse but hold
odd values (far-off times, huge numbers, deep or huge event details) are shown
without a crash.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hamsterbunker_tui.app import MonitorApp
from hamsterbunker_tui.nodes import NodesTable
from hamsterbunker_tui.panels import KillPanel, LeasePanel, StoreBanner

from hamsterbunker import FileStore
from hamsterbunker.core.limits import MAX_EPOCH, MAX_SEQ
from hamsterbunker.records import Event, Heartbeat, LeaseRecord
from hamsterbunker.stores.layer.keys import AgentKeys

from .screen import screen_text, until, widget_text

SIZE = (150, 45)
AGENT = "watched"


def heartbeat(node: str, **fields: Any) -> Heartbeat:
    beat = Heartbeat(node=node, region="eu", host="elsewhere.example", pid=4242, role="active",
                     epoch=1, seq=0, leader=node, time=time.time(), beats=1)  # fmt: skip
    return replace(beat, **fields)


class LiveNodes:
    """Planted heartbeats that keep changing, as a live node's do: without a readable
    lease the monitor counts one that stood still for 2 s as dead, and on a loaded
    machine a poll can come later than that."""

    def __init__(self, store: FileStore) -> None:
        self.store = store
        self.nodes: dict[str, dict[str, Any]] = {}
        self.beats = 0

    def add(self, node: str, **fields: Any) -> None:
        self.nodes[node] = fields
        self.beat()

    def beat(self) -> bool:
        """Write every node's next heartbeat; True, so that a probe can beat first."""
        self.beats += 1
        for node, fields in self.nodes.items():
            self.store.put_heartbeat(AGENT, heartbeat(node, beats=self.beats, **fields))
        return True


def lease_path(store: FileStore) -> Path:
    """The file of the lease record (``stores.backends.file``: a key's file under kv/)."""
    return store.root / "kv" / AgentKeys(AGENT).lease


@pytest.mark.parametrize(
    "lease_json",
    [b'{"holder": "x", "epoch": Infinity}', b"[" * 60_000],
    ids=["infinity", "deep-nesting"],
)
def test_an_unreadable_lease_is_shown_in_the_lease_panel_and_polling_goes_on(
    tmp_path: Path, lease_json: bytes
) -> None:
    store = FileStore(tmp_path / "store")
    lease = LeaseRecord(holder="n1", region="eu", session="s1", epoch=1, ttl_ms=60_000)
    store.cas_lease(AGENT, None, lease)
    live = LiveNodes(store)
    live.add("n1")
    store.append_event(AGENT, Event("n1", 1, "node.online", time.time()))
    lease_path(store).write_bytes(lease_json)  # as any store writer can

    async def scenario() -> None:
        app = MonitorApp(FileStore(store.root, create=False), AGENT)
        async with app.run_test(size=SIZE) as pilot:
            panel = app.query_one(LeasePanel)
            table = app.query_one(NodesTable)
            await until(pilot, "the problem", lambda: "unreadable" in widget_text(panel))
            assert "lease record" in widget_text(panel)
            await until(
                pilot, "the node", lambda: live.beat() and table.roles() == {"n1": "active"}
            )
            await until(pilot, "the event", lambda: "node.online" in screen_text(app))
            assert not app.query_one(StoreBanner).shown
            assert "store unreachable" not in screen_text(app)
            assert app.store_error is None
            kill = app.query_one(KillPanel)
            assert "lease record is unreadable" in str(kill.button.tooltip)

            # Polling goes on: a new node and a new event show up.
            live.add("n2", role="standby")
            store.append_event(AGENT, Event("n2", 1, "node.standby", time.time()))
            await until(pilot, "n2", lambda: live.beat() and table.roles().get("n2") == "standby")
            await until(pilot, "n2's event", lambda: "node.standby" in screen_text(app))

            # Repaired: the lease is shown again.
            lease_path(store).write_bytes(lease.to_json())
            await until(pilot, "the holder", lambda: "holder n1" in widget_text(panel))
            assert "unreadable" not in widget_text(panel)

    asyncio.run(scenario())


def test_odd_but_readable_values_are_shown_without_a_crash(tmp_path: Path) -> None:
    """Far-off times, the largest epoch and seq, deep and huge event details."""
    store = FileStore(tmp_path / "store")
    lease = LeaseRecord(holder="far", region="eu", session="s1", epoch=MAX_EPOCH, ttl_ms=60_000)
    store.cas_lease(AGENT, None, lease)
    store.put_heartbeat(AGENT, heartbeat("far", epoch=MAX_EPOCH, seq=MAX_SEQ, time=-1e300))
    store.put_heartbeat(AGENT, heartbeat("future", role="standby", time=1e300))
    deep: object = "bottom"
    for _ in range(7):  # 16 levels in all with the event and its detail: the most allowed
        deep = {"d": [deep]}
    odd = [
        Event("far", 1, "lease.acquired", 1e300, epoch=MAX_EPOCH, seq=MAX_SEQ,
              detail={"via": {"nested": [1, 2]}}),
        Event("far", 2, "agent.resumed", -1e300, epoch=MAX_EPOCH),
        Event("far", 3, "checkpoint.published", 1e300, epoch=MAX_EPOCH - 1),
        Event("far", 4, "[bold red]markup[/", 0.0, detail={"deep": deep}),
        Event("far", 5, "node.offline", -1e300, detail={"huge": "x" * 60_000}),
        Event("far", 6, "odd.last", time.time(), detail={"ok": True}),
    ]  # fmt: skip
    for event in odd:
        store.append_event(AGENT, event)

    async def scenario() -> None:
        app = MonitorApp(FileStore(store.root, create=False), AGENT)
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, "the last event", lambda: "odd.last" in screen_text(app))
            # Shown as text, not read as markup.
            await until(pilot, "the markup", lambda: "[bold red]markup[/" in screen_text(app))
            nodes = app.query_one(NodesTable)
            await until(pilot, "the nodes", lambda: "> 9999 d" in widget_text(nodes))
            assert str(MAX_EPOCH) in widget_text(nodes)
            assert nodes.roles() == {"far": "offline", "future": "standby"}
            await until(pilot, "the takeover", lambda: "far  {'nested'" in screen_text(app))
            polls = app.polls
            await until(pilot, "more polls", lambda: app.polls >= polls + 2)
            assert app.is_running and app.store_error is None

    asyncio.run(scenario())
