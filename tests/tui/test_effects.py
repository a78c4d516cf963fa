"""The journaled effects of the step in flight, on the active node's row of the nodes table.

The active node's heartbeat carries (name, state) for each effect of the step
it is running; the monitor shows the newest few on that node's row, coloured
by state, and nothing on any other row.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from pathlib import Path

from hamsterbunker_tui.app import MonitorApp
from hamsterbunker_tui.model import ClusterModel, NodeView
from hamsterbunker_tui.nodes import EFFECT_STYLES, NodesTable, effects_cell, node_cells

from hamsterbunker import FileStore
from hamsterbunker.records import Heartbeat, LeaseRecord

from .screen import screen_text, until

AGENT = "watched"
SIZE = (150, 30)


def beat(node: str, role: str, effects: tuple[tuple[str, str], ...] = (), n: int = 1) -> Heartbeat:
    return Heartbeat(node=node, region="eu", host="elsewhere.example", pid=4242, role=role,
                     epoch=1, seq=7, leader="n1", time=time.time(), beats=n,
                     effects=effects)  # fmt: skip


def test_effects_cell_shows_the_newest_effects_with_their_states_coloured() -> None:
    assert effects_cell(()).plain == ""
    cell = effects_cell((("search", "reused"), ("llm.call", "running")))
    assert cell.plain == "search reused · llm.call running"
    styles = {cell.plain[span.start : span.end]: span.style for span in cell.spans}
    assert styles["reused"] == EFFECT_STYLES["reused"]
    assert styles["running"] == EFFECT_STYLES["running"]
    many = (*((f"e{i}", "done") for i in range(6)), ("e6", "failed"))
    assert effects_cell(many).plain == "+4 · e4 done · e5 done · e6 failed"


def test_only_an_active_node_shows_effects() -> None:
    """A standby's heartbeat has none; an active node that went quiet (dead) shows none."""
    model = ClusterModel(AGENT)
    lease = LeaseRecord("n1", "eu", "s1", epoch=1, ttl_ms=2000)
    effects = (("tally", "done"),)
    beats = [beat("n1", "active", effects), beat("n2", "standby", effects)]
    model.update([], beats, lease, [], now=100.0, wall=time.time())
    shown = {view.node: view.effects for view in model.nodes()}
    assert shown == {"n1": effects, "n2": ()}
    model.update([], beats, lease, [], now=110.0, wall=time.time())  # n1 silent for 10 s
    assert {view.node: (view.role, view.effects) for view in model.nodes()}["n1"] == (
        "offline",
        (),
    )
    view = NodeView("n1", "eu", "h", 1, "active", 0.2, 1, 7, "fresh", effects)
    assert node_cells(view)["effects"].plain == "tally done"
    assert node_cells(replace(view, effects=()))["effects"].plain == ""


def test_the_active_row_shows_the_effects_of_its_step_in_flight(tmp_path: Path) -> None:
    """The row of the active node follows its heartbeat: a running effect, then the next step's
    reused one; the standby's row stays empty."""
    store = FileStore(tmp_path / "store")
    store.cas_lease(AGENT, None, LeaseRecord("n1", "eu", "s1", epoch=1, ttl_ms=60_000))
    store.put_heartbeat(AGENT, beat("n1", "active", (("search", "done"), ("llm", "running"))))
    store.put_heartbeat(AGENT, beat("n2", "standby"))

    async def scenario() -> None:
        app = MonitorApp(FileStore(store.root, create=False), AGENT, poll_interval=0.1)
        async with app.run_test(size=SIZE) as pilot:
            table = app.query_one(NodesTable)

            def row(node: str) -> str:
                return table.get_cell(node, "effects").plain

            await until(
                pilot, "n1's effects on its row", lambda: table.row_count == 2 and row("n1")
            )
            assert row("n1") == "search done · llm running"
            assert row("n2") == ""
            await until(pilot, "the row on screen", lambda: "llm running" in screen_text(app))
            line = next(x for x in screen_text(app).splitlines() if x.startswith("│ n1 "))
            cells = line.split()
            assert cells[1:5] == ["n1", "active", "1", "7"]  # node, role, epoch, seq
            # The heartbeat's age ("<1 s", or "1 s" on a loaded machine), then where it runs.
            age = cells[5:7] if cells[5] != "<" else cells[6:8]
            assert age[1] == "s" and int(age[0]) <= 2, line
            rest = cells[7:10] if cells[5] != "<" else cells[8:11]
            assert rest == ["eu", "elsewhere.example", "4242"], line
            assert line.rstrip(" │").endswith("search done · llm running"), line
            assert "step in flight" in screen_text(app)

            store.put_heartbeat(AGENT, beat("n1", "active", (("search", "reused"),), n=2))
            await until(
                pilot,
                "the next heartbeat's effects",
                lambda: row("n1") != "search done · llm running",
            )
            assert row("n1") == "search reused"
            await until(pilot, "the new row on screen", lambda: "search reused" in screen_text(app))

            store.put_heartbeat(AGENT, beat("n1", "active", (), n=3))  # between steps
            await until(pilot, "an empty effects cell", lambda: row("n1") == "")

    asyncio.run(scenario())
