"""The monitor's widgets alone: what they render from a view, and the event log's bounds."""

from __future__ import annotations

import asyncio
from dataclasses import replace

from hamsterbunker_tui.eventlog import HANG, MIN_WRITE, WRITE_PER_POLL, EventLog, event_line, hang
from hamsterbunker_tui.model import LeaseView, NodeView, ProgressView, Takeover
from hamsterbunker_tui.nodes import MIN_STEP_WIDTH, NodesTable, abbreviate, node_cells
from hamsterbunker_tui.panels import lease_text, progress_text, timeline_text
from rich.text import Text
from textual.app import App, ComposeResult
from textual.widgets.data_table import ColumnKey

from hamsterbunker.records import Event


def node(role: str = "standby", health: str = "fresh", age: float = 0.4) -> NodeView:
    return NodeView("hbnk-1", "eu-central", "box", 123, role, age, 2, 40, health)


def test_heartbeat_age_is_coloured_by_health() -> None:
    assert node_cells(node(health="fresh"))["heartbeat"].style == "green"
    late = node_cells(node(health="late", age=1.2))["heartbeat"]
    assert (late.plain, late.style) == ("1 s", "yellow")
    assert node_cells(node(role="offline", health="dead"))["heartbeat"].style == "bold red"
    assert node_cells(node(role="active"))["role"].style == "bold green"


def test_a_healthy_heartbeat_age_does_not_change_its_cell_between_polls() -> None:
    """Ages under a second read the same, so a table of healthy nodes repaints nothing."""
    cells = {node_cells(node(age=age))["heartbeat"].plain for age in (0.0, 0.4, 0.99)}
    assert cells == {"< 1 s"}
    assert node_cells(node(health="late", age=1.0))["heartbeat"].plain == "1 s"
    assert node_cells(node(health="dead", age=75.0))["heartbeat"].plain == "1 m 15 s"


def test_lease_text() -> None:
    held = lease_text(LeaseView("hbnk-2", "us-east", 3, 1.75, 0.25), "a").plain
    assert held == "holder  hbnk-2 (us-east)\nepoch 3\nrenewed < 1 s ago"
    late = lease_text(LeaseView("hbnk-2", "us-east", 3, 0.75, 1.25), "a").plain
    assert late.endswith("expires in 0.8 s")  # past half the TTL: every tenth counts
    expired = lease_text(LeaseView("hbnk-2", "us-east", 3, -35.5, 37.5), "a").plain
    assert expired.endswith("expired 35 s ago")
    released = lease_text(LeaseView(None, "", 4, None), "a").plain
    assert released == "holder  none (released)\nepoch 4"
    assert lease_text(None, "a").plain == "no lease record for agent 'a' yet"
    broken = lease_text(None, "a", "lease record nests deeper than 16 levels").plain
    assert broken == "unreadable: lease record nests deeper than 16 levels"


def test_event_line_of_odd_values_from_the_store() -> None:
    """Times no calendar holds, and a detail of 60,000 characters, cut to a readable line."""
    line = event_line(Event("n1", 1, "x.y", 1e300, detail={"huge": "x" * 60_000})).plain
    assert line.startswith("--:--:--.000 n1")
    assert line.endswith("x…") and len(line) < 400
    assert event_line(Event("n1", 2, "x.y", -1e300)).plain.startswith("--:--:--.000 n1")
    timeline = timeline_text([Takeover(9_999_999_999, "n1", None, "x", 1e300, None)]).plain
    assert timeline == "epoch 9999999999 --:--:--  n1  x"


def test_progress_text_shows_seq_age_and_size_only() -> None:
    text = progress_text(ProgressView(seq=42, epoch=2, age_s=0.3, size=2048)).plain
    assert text == "checkpoint seq 42 (epoch 2)\nage < 1 s · 2.0 KiB"
    demo = progress_text(ProgressView(seq=42, epoch=2, age_s=3.4, size=20), counter=41).plain
    assert demo == "counter 41\ncheckpoint seq 42 (epoch 2)\nage 3 s · 20 B"


def test_timeline_has_one_line_per_epoch_with_the_gap_once_known() -> None:
    first = Takeover(1, "hbnk-1", None, "empty", 1_700_000_000.0, None)
    second = Takeover(2, "hbnk-3", "hbnk-1", "expired", 1_700_000_004.0, 2004)
    lines = timeline_text([first, second]).plain.splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("epoch 1") and lines[0].endswith("hbnk-1  first lease")
    assert lines[1].startswith("epoch 2") and lines[1].endswith(
        "hbnk-1 → hbnk-3  expired  gap 2.004 s"
    )


def test_event_log_writes_at_most_a_screenful_per_poll() -> None:
    events = [Event("hbnk-1", n, "agent.step", 1_700_000_000.0 + n) for n in range(1, 501)]

    class LogApp(App[None]):
        def compose(self) -> ComposeResult:
            yield EventLog(id="log")

    async def scenario() -> None:
        app = LogApp()
        async with app.run_test(size=(120, 30)) as pilot:
            log = app.query_one(EventLog)
            log.show_new(events[:3], seen=3)  # the first lines: written at once
            log.show_new(events, seen=500)  # 497 new routine lines: they wait
            assert len(log.lines) == 3
            log.show_new(events, seen=500)  # nothing new: nothing written
            log.flush()  # what ROUTINE_FLUSH_S later does: the newest are written
            await pilot.pause()
            lines = [strip.text.rstrip() for strip in log.lines]
            written = log.screenful
            assert MIN_WRITE <= written <= min(WRITE_PER_POLL, 30)
            assert len(lines) == 3 + 1 + written
            assert lines[3] == f"… {497 - written} more events, not shown"
            assert lines[-1] == event_line(events[-1]).plain
            assert lines[4] == event_line(events[-written]).plain
            # One left out is one event, not "1 more events".
            more = [Event("hbnk-1", n, "agent.step", 1_700_000_000.0 + n)
                    for n in range(501, 502 + written)]  # fmt: skip
            log.show_new(more, seen=500 + len(more))  # a screenful and one more wait
            log.flush()
            await pilot.pause()
            assert "… 1 more event, not shown" in [s.text.rstrip() for s in log.lines]

    asyncio.run(scenario())


def test_a_long_line_wraps_whole_at_spaces_under_the_node_column() -> None:
    line = event_line(Event("hbnk-2", 1, "lease.acquired", 1_700_000_000.0, 13, 0,
                            {"from": "hbnk-1", "gap_ms": 2003, "via": "expired"}))  # fmt: skip
    rows = [row.plain for row in hang(line, 40)]
    assert len(rows) > 1 and all(len(row) <= 40 for row in rows), rows
    assert all(row.startswith(" " * HANG) and row[HANG] != " " for row in rows[1:]), rows
    assert " ".join(" ".join(rows).split()) == " ".join(line.plain.split())  # nothing lost
    assert "epoch 13" in " ".join(rows)  # broken at a space, not inside "13"
    assert [row.plain for row in hang(Text("x" * 50), 20)] == ["x" * 20, "x" * 20, "x" * 10]
    assert [row.plain for row in hang(line, 200)] == [line.plain]


def test_compact_cells_say_the_same_in_fewer_cells() -> None:
    effects = (("a", "done"), ("b", "running"))
    active = replace(node(role="active"), inbox_depth=3, inbox_age_s=12.7, failing=2,
                     failing_error="RuntimeError: boom", effects=effects)  # fmt: skip
    cells = {key: cell.plain for key, cell in node_cells(active, compact=True).items()}
    assert (cells["inbox"], cells["effects"]) == ("3 · 12 s", "failing ×2 · b running")
    paused = replace(node(role="active"), paused=True)
    assert node_cells(paused)["role"].plain == "active · paused"
    compact = node_cells(paused, compact=True)
    assert (compact["role"].plain, compact["inbox"].plain) == ("active", "paused")
    assert abbreviate(Text("eu-central"), 10).plain == "eu-central"
    assert abbreviate(Text("eu-central-1"), 10).plain == "eu-centra…"


def test_a_narrow_nodes_table_abbreviates_long_cells_instead_of_scrolling() -> None:
    host = "ip-10-0-12-34.eu-central-1.compute.internal"
    views = [
        replace(node(role="active"), node="eu-1", host=host, pid=4_194_303,
                effects=(("search", "done"), ("llm.call", "running"))),
        replace(node(), node="us-2", region="us-east-1", host=host, pid=4_194_302),
    ]  # fmt: skip

    class TableApp(App[None]):
        def compose(self) -> ComposeResult:
            yield NodesTable(id="nodes")

    async def scenario() -> None:
        app = TableApp()
        async with app.run_test(size=(80, 10)) as pilot:
            table = app.query_one(NodesTable)
            table.show(views)
            await pilot.pause()
            assert table.compact and table.max_scroll_x == 0
            row = table.row_text("eu-1")
            assert row["host"].endswith("…") and host.startswith(row["host"][:-1]), row
            shown = [row[key] for key in ("node", "role", "epoch", "seq", "pid")]
            assert shown == ["eu-1", "active", "2", "40", "4194303"], row
            step = row["effects"]  # the newest effect, shortened
            assert len(step) >= MIN_STEP_WIDTH and step.endswith("…"), row
            assert "llm.call running".startswith(step[:-1]), row
            await pilot.resize_terminal(200, 10)
            await pilot.pause()
            assert not table.compact and table.row_text("eu-1")["host"] == host
            assert table.columns[ColumnKey("effects")].label.plain == "step in flight"

    asyncio.run(scenario())
