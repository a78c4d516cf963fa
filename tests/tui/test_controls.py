"""The s (switchover) and p (pause/resume) keys: asked first, refused without the secret,
and carried out by the library on a real cluster."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from hamsterbunker_tui.app import MonitorApp
from hamsterbunker_tui.controls import ChooseTarget, Confirm
from hamsterbunker_tui.eventlog import EventLog
from hamsterbunker_tui.nodes import NodesTable
from hamsterbunker_tui.panels import LeasePanel, Timeline

from hamsterbunker import FileStore
from hamsterbunker.core.timing import LeaseTiming
from hamsterbunker.demo import NODES
from hamsterbunker.ops.local import LocalCluster
from hamsterbunker.records import Heartbeat, LeaseRecord
from tests.support import store_of

from .screen import screen_text, until, widget_text

SIZE = (150, 45)
FAST = {"timing": LeaseTiming(tick_ms=200, lease_ttl_ms=1000)}


def test_without_the_secret_the_keys_say_so_and_change_nothing(tmp_path: Path) -> None:
    store = FileStore(tmp_path / "store")
    store.cas_lease("a", None, LeaseRecord("n1", "eu", "s", 1, ttl_ms=60_000))
    for node, role in (("n1", "active"), ("n2", "standby")):
        store.put_heartbeat("a", Heartbeat(
            node=node, region="eu", host="elsewhere", pid=1, role=role, epoch=1, seq=0,
            leader="n1", time=time.time(), beats=1,
        ))  # fmt: skip
    before = store.read_lease("a")

    async def scenario() -> None:
        app = MonitorApp(FileStore(store.root, create=False), "a")
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, "two rows", lambda: app.query_one(NodesTable).row_count == 2)
            log = app.query_one(EventLog)

            def said(words: str) -> bool:
                return words in " ".join(log.lines_text().split())

            await pilot.press("s")
            await until(pilot, "the reason", lambda: said("switchover needs the cluster secret"))
            assert not isinstance(app.screen, ChooseTarget)
            await pilot.press("p")
            await until(pilot, "the reason", lambda: said("pause and resume needs the cluster"))
            assert not isinstance(app.screen, Confirm)

    asyncio.run(scenario())
    assert store.read_lease("a") == before


@pytest.mark.multiprocess
def test_switchover_to_a_chosen_standby_then_pause_and_resume(
    local_cluster: Callable[..., LocalCluster],
) -> None:
    cluster = local_cluster(**FAST)
    for spec in NODES:
        cluster.start(spec)
    store = store_of(cluster)

    async def scenario() -> None:
        app = MonitorApp(FileStore(store.root, create=False), "journal", secret=cluster.secret)
        async with app.run_test(size=SIZE) as pilot:
            table = app.query_one(NodesTable)
            await until(
                pilot,
                "a leader and two live standbys",
                lambda: sorted(table.roles().values()) == ["active", "standby", "standby"],
                timeout=30,
            )
            leader = app.model.active_node()
            assert leader is not None
            await pilot.press("s")
            await until(pilot, "the choice", lambda: isinstance(app.screen, ChooseTarget))
            chooser = app.screen
            assert isinstance(chooser, ChooseTarget)
            target = chooser.standbys[0]
            assert leader.node not in chooser.standbys
            await pilot.press("enter")  # the first option: that standby by name
            await until(
                pilot,
                f"{target} to hold the lease, by switchover",
                lambda: (
                    (lease := store.read_lease("journal")) is not None
                    and lease.holder == target
                    and "switchover" in widget_text(app.query_one(Timeline))
                ),
                timeout=30,
            )
            assert f"{leader.node} → {target}" in widget_text(app.query_one(Timeline))

            # Pause: asked first; n keeps it running.
            lease_panel = app.query_one(LeasePanel)
            await pilot.press("p")
            await until(pilot, "the question", lambda: isinstance(app.screen, Confirm))
            assert "Pause agent journal?" in screen_text(app)
            await pilot.press("n")
            await pilot.pause(1.0)
            assert "paused" not in widget_text(lease_panel)
            await pilot.press("p")
            await until(pilot, "the question", lambda: isinstance(app.screen, Confirm))
            await pilot.press("y")
            await until(
                pilot, "paused shown", lambda: "paused" in widget_text(lease_panel), timeout=30
            )
            await until(pilot, "paused on the row", lambda: "active · paused" in screen_text(app))
            await pilot.press("p")
            await until(pilot, "the question", lambda: isinstance(app.screen, Confirm))
            assert "Resume agent journal?" in screen_text(app)
            await pilot.press("y")
            await until(
                pilot, "paused gone", lambda: "paused" not in widget_text(lease_panel), timeout=30
            )

    asyncio.run(scenario())
