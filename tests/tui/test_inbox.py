"""The inbox in hb-tui: the active node's row says how many submissions wait and the oldest's age,
and the inbox.* events have their colours in the event log.

The depth and the oldest's submit time come from the active node's heartbeat;
the age is aged on the monitor's own clock once seen (the time is the
submitter's: display only). No other row shows an inbox.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from pathlib import Path

from hamsterbunker_tui.app import MonitorApp
from hamsterbunker_tui.eventlog import TYPE_STYLES, event_line
from hamsterbunker_tui.model import ClusterModel, NodeView
from hamsterbunker_tui.nodes import INBOX_LATE_S, NodesTable, inbox_cell, node_cells

from hamsterbunker import FileStore
from hamsterbunker.records import Event, Heartbeat, LeaseRecord

from .screen import screen_text, until

AGENT = "watched"
SIZE = (160, 30)


def beat(
    node: str, role: str, depth: int = 0, oldest: float | None = None, n: int = 1
) -> Heartbeat:
    return Heartbeat(node=node, region="eu", host="elsewhere.example", pid=4242, role=role,
                     epoch=1, seq=7, leader="n1", time=time.time(), beats=n,
                     inbox_depth=depth, inbox_oldest=oldest)  # fmt: skip


def view(role: str = "active", depth: int = 0, age: float | None = None) -> NodeView:
    return NodeView("n1", "eu", "h", 1, role, 0.2, 1, 7, "fresh", (), depth, age)


def test_inbox_cell_says_how_many_wait_and_since_when() -> None:
    assert inbox_cell(view(depth=3, age=12.7)).plain == "3 waiting · 12 s"
    assert inbox_cell(view(depth=1, age=0.4)).plain == "1 waiting · 0 s"
    assert inbox_cell(view(depth=2, age=185)).plain == "2 waiting · 3 m 05 s"
    assert inbox_cell(view(depth=2, age=1e300)).plain == "2 waiting · > 9999 d"
    assert inbox_cell(view(depth=0)).plain == "empty"
    # A paused leader reads no inbox: its heartbeat's depth is from before the pause.
    assert inbox_cell(replace(view(depth=0), paused=True)).plain == "not read while paused"
    assert inbox_cell(view(role="standby", depth=5, age=3)).plain == ""
    assert inbox_cell(view(role="offline", depth=5, age=3)).plain == ""
    # Waiting long is yellow; a fresh one is not.
    late = inbox_cell(view(depth=1, age=INBOX_LATE_S + 1))
    assert [late.plain[s.start : s.end] for s in late.spans if s.style == "yellow"] == ["1 m 01 s"]
    fresh = inbox_cell(view(depth=1, age=5))
    assert not [s for s in fresh.spans if s.style == "yellow"]
    assert node_cells(view(depth=3, age=12))["inbox"].plain == "3 waiting · 12 s"


def test_the_model_ages_the_oldest_on_its_own_clock_and_only_for_the_active_node() -> None:
    """First sight ages it by the submitter's clock; then the monitor's monotonic clock; a
    new oldest (the old one consumed) is aged by its own time; a standby shows none."""
    model = ClusterModel(AGENT)
    lease = LeaseRecord("n1", "eu", "s1", epoch=1, ttl_ms=60_000)
    wall = 1_000_000.0
    beats = [beat("n1", "active", 3, wall - 12), beat("n2", "standby", 4, wall - 50)]
    model.update([], beats, lease, [], now=100.0, wall=wall)
    shown = {v.node: (v.inbox_depth, v.inbox_age_s) for v in model.nodes()}
    assert shown == {"n1": (3, 12.0), "n2": (0, None)}

    # 5 s later on the monitor's clock, its wall clock stepped back an hour: still 17 s.
    model.update([], beats, lease, [], now=105.0, wall=wall - 3600)
    assert {v.node: v.inbox_age_s for v in model.nodes()}["n1"] == 17.0

    # The oldest was consumed: the next oldest was submitted 4 s ago (wall clock).
    beats = [beat("n1", "active", 2, wall + 1, n=2), beats[1]]
    model.update([], beats, lease, [], now=106.0, wall=wall + 5)
    assert {v.node: (v.inbox_depth, v.inbox_age_s) for v in model.nodes()}["n1"] == (2, 4.0)

    # A submitter's clock far ahead of ours: 0, not a negative age.
    beats = [beat("n1", "active", 1, wall + 1e6, n=3)]
    model.update([], beats, lease, [], now=107.0, wall=wall + 6)
    assert {v.node: v.inbox_age_s for v in model.nodes()}["n1"] == 0.0

    # Emptied; then the node went quiet long past the TTL (offline): no inbox on its row.
    model.update([], [beat("n1", "active", n=4)], lease, [], now=108.0, wall=wall + 7)
    assert {v.node: (v.inbox_depth, v.inbox_age_s) for v in model.nodes()}["n1"] == (0, None)
    quiet = beat("n1", "active", 9, wall, n=5)
    model.update([], [quiet], lease, [], now=109.0, wall=wall + 8)
    model.update([], [quiet], lease, [], now=300.0, wall=wall + 8)
    n1 = {v.node: v for v in model.nodes()}["n1"]
    assert (n1.role, n1.inbox_depth, n1.inbox_age_s) == ("offline", 0, None)


def test_inbox_events_have_their_colours() -> None:
    """Admitted and consumed stand apart from the routine step events; a rejected one (it did
    not authenticate) is red, given-up numbers yellow."""
    styles = {kind: TYPE_STYLES[kind] for kind in TYPE_STYLES if kind.startswith("inbox.")}
    assert styles == {
        "inbox.admitted": "blue",
        "inbox.consumed": "green",
        "inbox.rejected": "red",
        "inbox.gave_up": "yellow",
    }
    event = Event("n1", 3, "inbox.consumed", time.time(), 1, 7, {"numbers": [1, 2]})
    line = event_line(event)
    assert [line.plain[s.start : s.end].strip() for s in line.spans if s.style == "green"] == [
        "inbox.consumed"
    ]
    assert "numbers=[1, 2]" in line.plain


def test_the_active_row_shows_its_inbox_and_the_log_its_events(tmp_path: Path) -> None:
    """Pilot: the active row follows the heartbeat (3 waiting, then empty), the standby's row
    shows nothing, and an inbox.admitted event appears in the log."""
    store = FileStore(tmp_path / "store")
    store.cas_lease(AGENT, None, LeaseRecord("n1", "eu", "s1", epoch=1, ttl_ms=60_000))
    store.put_heartbeat(AGENT, beat("n1", "active", 3, time.time() - 12))
    store.put_heartbeat(AGENT, beat("n2", "standby", 7, time.time() - 99))
    detail = {"number": 3, "request_id": "q-3"}
    store.append_event(AGENT, Event("n1", 1, "inbox.admitted", time.time(), 1, 7, detail))

    async def scenario() -> None:
        app = MonitorApp(FileStore(store.root, create=False), AGENT, poll_interval=0.1)
        async with app.run_test(size=SIZE) as pilot:
            table = app.query_one(NodesTable)

            def cell(node: str) -> str:
                return table.get_cell(node, "inbox").plain

            await until(pilot, "both rows", lambda: table.row_count == 2 and cell("n1"))
            assert cell("n1").startswith("3 waiting · 1"), cell("n1")  # 12 s, maybe 13
            assert cell("n2") == ""
            await until(pilot, "the inbox on screen", lambda: "3 waiting" in screen_text(app))
            text = screen_text(app)
            header = next(x for x in text.splitlines() if "step in flight" in x)
            assert header.split()[8:12] == ["pid", "inbox", "step", "in"], header
            row = next(x for x in text.splitlines() if x.startswith("│ n1 "))
            assert "3 waiting · 1" in row, row
            await until(pilot, "the event in the log", lambda: "q-3" in screen_text(app))
            assert "inbox.admitted" in screen_text(app)

            store.put_heartbeat(AGENT, beat("n1", "active", n=2))  # all consumed
            await until(pilot, "an empty inbox", lambda: cell("n1") == "empty")
            await until(pilot, "it on screen", lambda: "3 waiting" not in screen_text(app))

    asyncio.run(scenario())
