"""hb-tui --demo: the screen is up before the nodes are, shows them at once, then the counter."""

from __future__ import annotations

import asyncio
import re

import pytest
from hamsterbunker_tui.app import MonitorApp
from hamsterbunker_tui.demo import DEMO_AGENT_ID, prepare_demo
from hamsterbunker_tui.nodes import NodesTable
from hamsterbunker_tui.panels import ProgressPanel

from hamsterbunker.core.timing import LeaseTiming
from hamsterbunker.demo import NODES
from hamsterbunker.stores import open_store

from .screen import until, widget_text


@pytest.mark.multiprocess
def test_the_demo_shows_its_nodes_at_once_and_then_the_counter() -> None:
    run = prepare_demo(LeaseTiming(tick_ms=200, lease_ttl_ms=1000))
    try:

        async def scenario() -> None:
            app = MonitorApp(open_store(run.store_url), DEMO_AGENT_ID, demo=run.cluster)
            async with app.run_test(size=(120, 40)) as pilot:
                table = app.query_one(NodesTable)
                # Before any node has written a heartbeat: the three rows, as starting.
                await until(pilot, "the three nodes listed", lambda: table.row_count == 3)
                # Listed from the processes just started, not from heartbeats: a node
                # takes about a second to start and write one.
                assert len(app.model.heartbeats) < 3
                roles = table.roles()
                assert set(roles) == {spec.node for spec in NODES}
                assert "starting" in roles.values()
                # Then the counter of the newest checkpoint, opened with the demo's secret.
                progress = app.query_one(ProgressPanel)
                await until(
                    pilot,
                    "the counter",
                    lambda: re.search(r"counter \d+", widget_text(progress)),
                    timeout=30,
                )
                await until(
                    pilot,
                    "one active node",
                    lambda: sorted(table.roles().values()) == ["active", "standby", "standby"],
                    timeout=30,
                )

        asyncio.run(scenario())
    finally:
        run.stop()
