"""What the monitor shows at 80×24, 120×40 and 200×60: nothing that matters is cut.

The cluster is records written here into a file store (no node processes): a
lease held for a minute, three fresh heartbeats, three takeovers and a hundred
routine steps. Every check reads the rendered screen, not the widgets' data.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from hamsterbunker_tui.app import MonitorApp
from hamsterbunker_tui.eventlog import HANG, EventLog, event_line
from hamsterbunker_tui.nodes import COLUMNS, NodesTable
from hamsterbunker_tui.panels import LeasePanel, Timeline, timeline_line
from textual.pilot import Pilot
from textual.widget import Widget

from hamsterbunker import FileStore
from hamsterbunker.records import Event, Heartbeat, LeaseRecord

from .screen import screen_text, until, widget_text

Check = Callable[[MonitorApp, Pilot[None]], Awaitable[None]]
AGENT = "laid-out"
SIZES = [(80, 24), (200, 60)]
# node -> (role, epoch, seq, region) as the heartbeats say
NODES = {
    "hbnk-1": ("standby", 3, 40, "eu-central"),
    "hbnk-2": ("active", 3, 41, "us-east"),
    "hbnk-3": ("standby", 2, 12, "ap-south"),
}


def write_cluster(
    root: Path, *, steps: int = 100, effects: tuple[tuple[str, str], ...] = ()
) -> FileStore:
    """effects: those of the active node's step in flight."""
    store = FileStore(root)
    now = time.time()
    store.cas_lease(AGENT, None, LeaseRecord("hbnk-2", "us-east", "s", 3, ttl_ms=60_000))
    for node, (role, epoch, seq, region) in NODES.items():
        store.put_heartbeat(AGENT, Heartbeat(
            node=node, region=region, host="elsewhere", pid=100, role=role, epoch=epoch,
            seq=seq, leader="hbnk-2", time=now, beats=1,
            effects=effects if role == "active" else (),
        ))  # fmt: skip
    n = {node: 0 for node in NODES}

    def event(node: str, kind: str, at: float, epoch: int, seq: int = 0, **detail: object) -> None:
        n[node] += 1
        store.append_event(AGENT, Event(node, n[node], kind, at, epoch, seq, dict(detail)))

    event("hbnk-1", "lease.acquired", now - 60, 1, via="empty")
    event("hbnk-1", "agent.started", now - 59.9, 1)
    event("hbnk-1", "checkpoint.published", now - 50, 1, seq=10)
    event("hbnk-3", "lease.acquired", now - 48, 2, via="expired")
    event("hbnk-3", "agent.resumed", now - 47.9, 2, seq=10)
    event("hbnk-3", "checkpoint.published", now - 40, 2, seq=12)
    event("hbnk-2", "lease.acquired", now - 38, 3, via="expired")
    event("hbnk-2", "agent.resumed", now - 37.9, 3, seq=12)
    for i in range(steps):
        event("hbnk-2", "agent.step", now - 30 + i * 0.2, 3, seq=13 + i, step_seq=13 + i)
    return store


def flat(text: str) -> str:
    return " ".join(text.split())


def row_on_screen(app: MonitorApp, node: str) -> str:
    """The screen line of node's row in the nodes table."""
    table = app.query_one(NodesTable)
    lines = screen_text(app).splitlines()[table.region.y : table.region.bottom]
    return next((line for line in lines if f" {node} " in line), "")


def rows_on_screen(widget: Widget) -> list[str]:
    """The screen lines inside widget's border and scrollbars, as shown (not joined)."""
    region = widget.scrollable_content_region
    lines = screen_text(widget.app).splitlines()[region.y : region.bottom]
    return [line[region.x : region.right] for line in lines]


def run(root: Path, size: tuple[int, int], check: Check) -> None:
    async def scenario() -> None:
        app = MonitorApp(FileStore(root, create=False), AGENT)
        async with app.run_test(size=size) as pilot:
            await until(pilot, "three takeovers", lambda: len(app.model.timeline()) == 3)
            await pilot.pause(0.2)
            await check(app, pilot)

    asyncio.run(scenario())


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_nothing_important_is_cut(tmp_path: Path, size: tuple[int, int]) -> None:
    write_cluster(tmp_path / "store")

    async def check(app: MonitorApp, pilot: Pilot[None]) -> None:
        # Every takeover line, whole (wrapped if need be, never cut); on a short screen the
        # newest (the older ones scroll).
        shown = flat(widget_text(app.query_one(Timeline)))
        takeovers = app.model.timeline()
        for takeover in takeovers if size[1] >= 30 else takeovers[-1:]:
            assert flat(timeline_line(takeover).plain) in shown, shown
        assert "hbnk-3 → hbnk-2 expired" in shown
        # Each node's row: name, role, epoch and seq, on one line.
        for node, (role, epoch, seq, _) in NODES.items():
            line = row_on_screen(app, node)
            assert re.search(rf"\b{node}\s+{role}\s+{epoch}\s+{seq}\b", line), line
        # The leader.
        lease = flat(widget_text(app.query_one(LeasePanel)))
        assert "holder hbnk-2 (us-east)" in lease and "epoch 3" in lease
        # The event log has room, and a long line wraps instead of being cut.
        log = app.query_one(EventLog)
        assert log.content_region.width >= min(60, size[0] - 10)
        note = "SIGKILL hbnk-2 (pid 4242); it restarts in 2 s and rejoins as a standby"
        log.note(note)
        await pilot.pause(0.2)
        assert note in flat(widget_text(log))

    run(tmp_path / "store", size, check)


def test_the_filter_key_cycles_all_warnings_and_each_node(tmp_path: Path) -> None:
    write_cluster(tmp_path / "store", steps=10)

    async def check(app: MonitorApp, pilot: Pilot[None]) -> None:
        log = app.query_one(EventLog)
        await until(pilot, "the steps in the log", lambda: "agent.step" in log.lines_text())
        assert log.border_title == "events · all"
        await pilot.press("f")
        assert log.border_title == "events · warnings and takeovers"
        text = log.lines_text()
        assert "agent.step" not in text and "checkpoint.published" not in text
        assert text.count("lease.acquired") == 3
        await pilot.press("f")
        assert log.border_title == "events · node hbnk-1"
        nodes = {line.split()[1] for line in log.lines_text().splitlines() if line.strip()}
        assert nodes == {"hbnk-1"}
        for title in ("events · node hbnk-2", "events · node hbnk-3", "events · all"):
            await pilot.press("f")
            assert log.border_title == title
        assert "agent.step" in log.lines_text()

    run(tmp_path / "store", (120, 40), check)


def test_the_event_log_scrolls_and_stays_where_the_reader_is(tmp_path: Path) -> None:
    store = write_cluster(tmp_path / "store", steps=150)

    async def check(app: MonitorApp, pilot: Pilot[None]) -> None:
        log = app.query_one(EventLog)
        await until(pilot, "a log taller than its pane", lambda: log.max_scroll_y > 10)
        await until(pilot, "the log at its end", lambda: log.is_vertical_scroll_end)
        await pilot.press("pageup")
        await until(pilot, "scrolled up", lambda: not log.is_vertical_scroll_end)
        assert not log.following
        reading = log.scroll_y
        # A warning arrives (written at once): the reader is not thrown to the bottom.
        store.append_event(AGENT, Event("hbnk-1", 99, "store.warning", time.time(), 3))
        await until(pilot, "the warning in the log", lambda: "store.warning" in log.lines_text())
        await pilot.pause(0.2)
        assert log.scroll_y == reading
        await pilot.press("end")
        await until(pilot, "back at the end", lambda: log.is_vertical_scroll_end)
        assert log.following

    run(tmp_path / "store", (100, 30), check)


def test_a_lease_whose_holder_died_long_ago_reads_expired_from_the_first_look(
    tmp_path: Path,
) -> None:
    """Aged by the holder's last heartbeat, not by when the monitor started."""
    store = FileStore(tmp_path / "store")
    store.cas_lease(AGENT, None, LeaseRecord("gone-1", "eu", "s", 4, ttl_ms=2000))
    store.put_heartbeat(AGENT, Heartbeat(
        node="gone-1", region="eu", host="elsewhere", pid=100, role="active", epoch=4,
        seq=9, leader="gone-1", time=time.time() - 40, beats=7,
    ))  # fmt: skip

    async def scenario() -> None:
        app = MonitorApp(FileStore(tmp_path / "store", create=False), AGENT)
        async with app.run_test(size=(80, 24)) as pilot:
            lease = app.query_one(LeasePanel)
            await until(pilot, "the lease", lambda: "epoch 4" in widget_text(lease))
            text = widget_text(lease)
            match = re.search(r"expired (\d+) s ago", text)
            assert match is not None and 35 <= int(match.group(1)) <= 60, text
            await until(
                pilot,
                "its holder's row, offline",
                lambda: re.search(r"\bgone-1\s+offline\b", row_on_screen(app, "gone-1")),
            )

    asyncio.run(scenario())


# Longer than the event log is wide at 80 and at 120 columns.
LONG_WARNING = {
    "error": "the store took 2.6 s to answer a lease read, more than half the lease TTL;"
    " look at the network between this node and the store"
}


@pytest.mark.parametrize("size", [(80, 24), (120, 40)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_every_column_eight_event_lines_and_the_quit_key_show(
    tmp_path: Path, size: tuple[int, int]
) -> None:
    """The size of a default terminal, and a common one: the nodes table has every column
    (labels and cells shortened, never cut off at the edge), the log at least eight lines,
    an event longer than the log wraps whole, and the footer shows every key, q too."""
    store = write_cluster(tmp_path / "store", effects=(("search", "done"), ("llm.call", "running")))
    warning = Event("hbnk-2", 999, "store.warning", time.time(), 3, 112, LONG_WARNING)
    store.append_event(AGENT, warning)

    async def check(app: MonitorApp, pilot: Pilot[None]) -> None:
        log = app.query_one(EventLog)
        await until(pilot, "the warning in the log", lambda: "store.warning" in log.lines_text())
        await until(pilot, "every row", lambda: all(row_on_screen(app, node) for node in NODES))
        table = app.query_one(NodesTable)
        assert table.compact == (size[0] < 100)
        assert table.max_scroll_x == 0  # nothing off to the side
        header = rows_on_screen(table)[0]
        assert header.split() == [
            word
            for _, label, short in COLUMNS
            for word in (short if table.compact else label).split()
        ], header
        for node, (_, _, _, region) in NODES.items():
            cells = table.row_text(node)
            assert (cells["region"], cells["host"]) == (region, "elsewhere")  # whole
            shown = [re.escape(cell) for cell in cells.values() if cell]
            assert re.search(r"\s+".join(shown), row_on_screen(app, node)), row_on_screen(app, node)
        # The step in flight: whole, or its start and an ellipsis.
        step = table.row_text("hbnk-2")["effects"]
        whole = "llm.call running" if table.compact else "search done · llm.call running"
        assert step == whole or (step.endswith("…") and whole.startswith(step[:-1])), step

        rows = rows_on_screen(log)
        assert len(rows) >= 8 and all(row.strip() for row in rows), rows
        text = flat(" ".join(rows))
        line = event_line(warning).plain
        assert flat(line) in text, text  # whole: nothing cut at the edge, nothing dropped
        first = next(i for i, row in enumerate(rows) if "store.warning" in row)
        assert len(line) > log.scrollable_content_region.width  # so it wrapped:
        below = rows[first + 1]  # its next row goes on under the node column
        assert below.startswith(" " * HANG) and below[HANG] != " ", rows
        # (Textual builds the footer anew when a key is enabled or disabled: wait for it.)
        await until(pilot, "the footer", lambda: "q quit" in screen_text(app).splitlines()[-1])
        footer = screen_text(app).splitlines()[-1]
        for key, action in (("k", "kill"), ("s", "switchover"), ("p", "pause"),
                            ("f", "filter"), ("q", "quit")):  # fmt: skip
            assert f"{key} {action}" in footer, footer
        lease = flat(widget_text(app.query_one(LeasePanel)))
        assert "holder hbnk-2 (us-east) epoch 3 renewed" in lease, lease
        timeline = app.query_one(Timeline)
        assert timeline.border_title == "takeovers · 3"
        newest = flat(timeline_line(app.model.timeline()[-1]).plain)
        assert newest in flat(widget_text(timeline))

    run(tmp_path / "store", size, check)
