"""A failing step on the active node's row of the nodes table (issue 16, point 3).

The active node's heartbeat carries how many steps failed in a row and the last
error; the monitor shows them in red in the step-in-flight cell, before the
effects, and nothing once a step succeeds or on any other row.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from hamsterbunker_tui.app import MonitorApp
from hamsterbunker_tui.model import ClusterModel, NodeView
from hamsterbunker_tui.nodes import FAILING_ERROR_SHOWN, NodesTable, step_cell

from hamsterbunker import FileStore
from hamsterbunker.records import Heartbeat, LeaseRecord

from .screen import screen_text, until

AGENT = "watched"
SIZE = (150, 30)
ERROR = "RuntimeError: the API said 500"


def beat(node: str, role: str, failing: int = 0, error: str = "", n: int = 1) -> Heartbeat:
    return Heartbeat(node=node, region="eu", host="h", pid=4242, role=role, epoch=1, seq=7,
                     leader="n1", time=time.time(), beats=n, failing=failing,
                     failing_error=error, effects=(("llm", "failed"),))  # fmt: skip


def view(failing: int, error: str = ERROR) -> NodeView:
    return NodeView("n1", "eu", "h", 1, "active", 0.2, 1, 7, "fresh", (), failing=failing,
                    failing_error=error)  # fmt: skip


def test_the_step_cell_says_how_many_steps_failed_and_the_last_error() -> None:
    assert step_cell(view(0)).plain == ""
    cell = step_cell(view(3))
    assert cell.plain == f"failing ×3 {ERROR}"
    assert cell.style == "bold red" and [str(span.style) for span in cell.spans] == ["red"]
    long = step_cell(view(12, "ValueError: " + "x" * 300)).plain
    assert long.startswith("failing ×12 ValueError: xxx") and long.endswith("…")
    assert len(long) == len("failing ×12 ") + FAILING_ERROR_SHOWN


def test_only_an_active_node_shows_its_failing_steps() -> None:
    model = ClusterModel(AGENT)
    lease = LeaseRecord("n1", "eu", "s1", epoch=1, ttl_ms=2000)
    beats = [beat("n1", "active", 4, ERROR), beat("n2", "standby", 2, ERROR)]
    model.update([], beats, lease, [], now=100.0, wall=time.time())
    shown = {v.node: (v.failing, v.failing_error) for v in model.nodes()}
    assert shown == {"n1": (4, ERROR), "n2": (0, "")}


def test_the_active_row_shows_the_failing_step_until_one_succeeds(tmp_path: Path) -> None:
    store = FileStore(tmp_path / "store")
    store.cas_lease(AGENT, None, LeaseRecord("n1", "eu", "s1", epoch=1, ttl_ms=60_000))
    store.put_heartbeat(AGENT, beat("n1", "active", 5, ERROR))
    store.put_heartbeat(AGENT, beat("n2", "standby"))

    async def scenario() -> None:
        app = MonitorApp(FileStore(store.root, create=False), AGENT, poll_interval=0.1)
        async with app.run_test(size=SIZE) as pilot:
            table = app.query_one(NodesTable)

            def row(node: str) -> str:
                return table.get_cell(node, "effects").plain

            await until(pilot, "n1's failing step", lambda: table.row_count == 2 and row("n1"))
            assert row("n1") == f"failing ×5 {ERROR} · llm failed"
            assert row("n2") == ""
            await until(pilot, "the row on screen", lambda: "failing ×5" in screen_text(app))

            store.put_heartbeat(AGENT, beat("n1", "active", n=2))  # a step succeeded
            await until(pilot, "the failing cleared", lambda: "failing" not in row("n1"))
            assert row("n1") == "llm failed"

    asyncio.run(scenario())
