"""The monitor on a ``syncdir://`` store: its own panel, as ``hb status`` shows it.

Nodes are real ``Runtime`` objects, each on a folder of its own (a machine's
copy of the synced folder); ``tests.support.syncdir`` plays the sync tool. The
monitor reads one machine's copy as ``hb-tui --store syncdir://…`` opens it (a
reader: no node id, writes nothing), headless with ``run_test()``. Every wait
is bounded and on a condition.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import hamsterbunker_tui.polling as polling
import pytest
from hamsterbunker_tui.app import MonitorApp
from hamsterbunker_tui.cli import main
from hamsterbunker_tui.nodes import NodesTable
from hamsterbunker_tui.panels import StoreBanner
from hamsterbunker_tui.syncdir import SyncDirPanel

from hamsterbunker import FileStore
from hamsterbunker.core.timing import LeaseTiming
from hamsterbunker.ops.status import syncdir_shown
from hamsterbunker.records import Event, Heartbeat
from hamsterbunker.runtime import Runtime
from hamsterbunker.stores import Store, open_store
from hamsterbunker.stores.backends.file import FileBackend
from hamsterbunker.stores.layer import RecordStore
from hamsterbunker.stores.layer.keys import AgentKeys
from hamsterbunker.stores.syncdir import SyncDirStore
from tests.support import wait_until
from tests.support.agents import AGENT, SECRET, AsyncAgent, Recorder
from tests.support.raw_store import RawRecords, file_key
from tests.support.syncdir import Sync, SyncPump

from .screen import screen_text, until

SIZE = (150, 50)
# A TTL well above 2 x (tick + sync delay): on a loaded machine (make test's workers)
# a leader's renewals must not look still for a TTL once the sync heals, or a second
# takeover keeps a second segment aside.
TIMING = LeaseTiming(tick_ms=100, lease_ttl_ms=2000)
SYNC_DELAY_MS = 100
WAIT_S = 30.0


class PacedAgent(AsyncAgent):
    """Steps every 20 ms: chains grow at a pace a test can follow."""

    async def step(self, state: dict[str, Any]) -> dict[str, Any]:
        await asyncio.sleep(0.02)
        return await super().step(state)


class Nodes:
    """Runtimes on a Sync's folders, one folder per node; all stopped at the end."""

    def __init__(self, tmp_path: Path) -> None:
        self.sync = Sync(tmp_path, delay_ms=SYNC_DELAY_MS)
        self.events = Recorder()
        self.runtimes: dict[str, Runtime] = {}

    def start(self, node: str) -> Runtime:
        runtime = Runtime(
            node_id=node,
            region="r1",
            store=self.sync.open(node),
            agent=PacedAgent(),
            secret=SECRET,
            timing=TIMING,
            on_event=self.events,
            stop_grace_ms=0,
        )
        self.runtimes[node] = runtime
        runtime.start()
        wait_until(runtime.ready.is_set, f"{node} online", WAIT_S)
        return runtime

    def reader(self, node: str, sync_delay_ms: int | None = None) -> Store:
        """node's machine's copy, opened as hb-tui opens it."""
        url = f"syncdir://{self.sync.root(node)}"
        return open_store(url, create=False, sync_delay_ms=sync_delay_ms)

    def published(self, node: str, past: int) -> bool:
        runtime = self.runtimes[node]
        return runtime.leading and runtime.seq > past

    def close(self) -> None:
        for runtime in self.runtimes.values():
            with contextlib.suppress(BaseException):
                runtime.stop(timeout=20)


@pytest.fixture
def nodes(tmp_path: Path) -> Iterator[Nodes]:
    made = Nodes(tmp_path)
    try:
        yield made
    finally:
        made.close()


def panel_text(app: MonitorApp) -> str:
    panels = app.query(SyncDirPanel)
    return panels.first().plain if panels else ""


def test_the_panel_shows_the_mode_the_delay_and_the_chain_of_a_node_that_stepped(
    nodes: Nodes,
) -> None:
    """On a syncdir store the monitor works as on any store and adds its panel: the mode,
    the stated sync delay, and the chain node A's term wrote (epoch, seq range, count)."""
    a = nodes.start("A")
    epoch_a = nodes.events.wait("lease.acquired", "A", timeout=WAIT_S).epoch
    wait_until(lambda: nodes.published("A", 3), "A publishing", WAIT_S)

    async def scenario() -> None:
        app = MonitorApp(nodes.reader("A", SYNC_DELAY_MS), AGENT)
        async with app.run_test(size=SIZE) as pilot:
            chain = re.compile(r"A {2}epoch (\d+) {2}seq (\d+)\.\.(\d+) {2}\((\d+) checkpoints\)")
            await until(pilot, "A's chain in the panel", lambda: chain.search(panel_text(app)))
            text = panel_text(app)
            assert "mode: syncdir (no mutual exclusion: divergence is detected and kept aside)" in (
                text
            )
            assert f"sync delay: {SYNC_DELAY_MS} ms (as configured)" in text
            assert "kept aside: none reported" in text
            assert "sync-tool files: none" in text and "problems: none" in text
            found = chain.search(text)
            assert found is not None
            epoch, low, high, count = map(int, found.groups())
            assert epoch == epoch_a and low <= high <= a.seq and 1 <= count <= high - low + 1
            # On screen, not only in the widget.
            await until(pilot, "the panel on screen", lambda: "mode: syncdir" in screen_text(app))
            assert not app.query_one(SyncDirPanel).has_class("-diverged")
            # And as on any store: the node in the table, the lease, the progress.
            table = app.query_one(NodesTable)
            await until(pilot, "A active", lambda: table.roles() == {"A": "active"})
            await until(pilot, "the lease", lambda: "holder  A" in screen_text(app))
            assert not app.query_one(StoreBanner).shown

    asyncio.run(scenario())


def test_two_leaders_in_a_partition_show_the_losers_chain_as_kept_aside(nodes: Nodes) -> None:
    """A and B lead at once while the sync is cut; once it heals, the store.diverged the nodes
    report shows in the panel as kept aside (term, seq range, winner, fork, who reported
    it), in the warning style."""
    a = nodes.start("A")
    epoch_a = nodes.events.wait("lease.acquired", "A", timeout=WAIT_S).epoch
    wait_until(lambda: nodes.published("A", 3), "A publishing", WAIT_S)
    nodes.sync.copy("A", "B")  # the last sync before the cut
    fork = a.seq
    b = nodes.start("B")  # sees A's claim never change: takes the lease after a TTL
    epoch_b = nodes.events.wait("lease.acquired", "B", timeout=WAIT_S).epoch
    wait_until(lambda: nodes.published("B", fork + 3), "B publishing", WAIT_S)
    assert a.leading and b.leading  # both lead: what a synced folder cannot prevent

    async def scenario() -> None:
        app = MonitorApp(nodes.reader("B"), AGENT)
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, "B's chain", lambda: f"B  epoch {epoch_b}" in panel_text(app))
            assert "kept aside: none reported" in panel_text(app)
            assert "sync delay: not known here" in panel_text(app)
            with SyncPump(nodes.sync, "A", "B"):
                await until(
                    pilot,
                    "the segment kept aside, reported by both",
                    lambda: (
                        "reported by A, B" in panel_text(app)
                        or "reported by B, A" in panel_text(app)
                    ),
                    timeout=WAIT_S,
                )
            text = panel_text(app)
            assert "kept aside: 1 (store.diverged)" in text
            assert re.search(
                rf"term {epoch_a}@A seq \d+\.\.\d+ \(\d+\) · winner {epoch_b}@B · "
                rf"forked at seq \d+ of term {epoch_a}@A",
                text,
            )
            panel = app.query_one(SyncDirPanel)
            assert panel.has_class("-diverged")
            assert panel.border_title == "syncdir · 1 kept aside"
            # Both chains are listed: A's term and B's.
            assert f"A  epoch {epoch_a}" in text and f"B  epoch {epoch_b}" in text
            # Narrow, one line says it, and the takeovers and events keep their place.
            await pilot.resize_terminal(80, 24)
            await until(
                pilot,
                "the summary line",
                lambda: f"1 kept aside (term {epoch_a}@A, winner {epoch_b}@B)" in screen_text(app),
            )
            assert "takeovers" in screen_text(app) and "events" in screen_text(app)

    asyncio.run(scenario())


def test_on_a_file_store_there_is_no_panel_and_the_report_is_not_read_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another store has no syncdir panel, and after the first poll finds it is not a
    syncdir store, the polls do not ask for the report again."""
    calls: list[Store] = []

    def counted(store: Store, agent: str | None) -> Any:
        calls.append(store)
        return syncdir_shown(store, agent)

    monkeypatch.setattr(polling, "syncdir_shown", counted, raising=False)
    store = FileStore(tmp_path / "store")
    beat = Heartbeat(node="n1", region="eu", host="elsewhere.example", pid=4242, role="standby",
                     epoch=0, seq=0, leader=None, time=time.time(), beats=1)  # fmt: skip
    store.put_heartbeat(AGENT, beat)

    async def scenario() -> None:
        app = MonitorApp(FileStore(store.root, create=False), AGENT, poll_interval=0.1)
        async with app.run_test(size=SIZE) as pilot:
            table = app.query_one(NodesTable)
            await until(pilot, "n1", lambda: table.roles() == {"n1": "standby"})
            polls = app.polls
            await until(pilot, "three more polls", lambda: app.polls >= polls + 3)
            assert not app.query(SyncDirPanel)
            assert "syncdir" not in screen_text(app)
            assert len(calls) == 1

    asyncio.run(scenario())


def test_junk_in_a_node_subtree_and_sync_tool_files_are_shown_without_a_crash(
    nodes: Nodes,
) -> None:
    """Whatever lands in the folder (a file where a node's subtree should be, junk records
    in a subtree, a sync tool's conflict copies, a forged store.diverged) is listed as a
    problem, a sync-tool file or an escaped segment, and the monitor goes on polling."""
    nodes.start("A")
    wait_until(lambda: nodes.published("A", 3), "A publishing", WAIT_S)
    root = nodes.sync.root("A")
    (root / "nodes" / "stray").write_bytes(b"not a subtree")
    (root / "nodes" / "bad name!").mkdir()
    keys = AgentKeys(AGENT)
    z = RawRecords(FileBackend(root / "nodes" / "Z", in_synced_folder=True), owned=True)
    z.put_heartbeat(AGENT, "Z", b"\x00\xff{not json")
    z.plant(keys.ckpt + "ckpt-junk.hbc", b"junk")
    z.put_lease(AGENT, b"[" * 60_000)
    conflict = "lease.sync-conflict-20260101-120000-ABCDEFG"
    file_key(root / "nodes" / "A", keys.lease).with_name(conflict).write_bytes(b"{}")
    (root / "cluster.sync-conflict-20260101-120000-ABCDEFG.json").write_bytes(b"{}")
    # A store.diverged event anyone could write (events are not authenticated): in Z's
    # subtree, as Z's store writes one.
    forged: dict[str, object] = {
        "term": "9@Z\x1b[2J\n",
        "winner": ["x"] * 10_000,
        "from_seq": None,
        "count": {},
    }
    event = Event("Z", 1, "store.diverged", time.time(), 9, 0, forged)
    RecordStore(z.backend).append_event(AGENT, event)
    z.close()

    async def scenario() -> None:
        app = MonitorApp(nodes.reader("A"), AGENT)
        async with app.run_test(size=SIZE) as pilot:

            def shown() -> bool:
                text = panel_text(app)
                return "sync-tool files: 2" in text and "stray" in text and "bad name!" in text

            await until(pilot, "the sync-tool files and the problems", shown)
            text = panel_text(app)
            assert conflict in text and "cluster.sync-conflict" in text
            assert "(never read as ours)" in text
            assert "is not a directory" in text
            # The forged segment is shown, escaped and cut short.
            await until(
                pilot, "the forged segment", lambda: "term 9@Z\\x1b[2J\\n" in panel_text(app)
            )
            assert max(len(line) for line in panel_text(app).splitlines()) < 1000
            table = app.query_one(NodesTable)
            await until(pilot, "A active", lambda: table.roles().get("A") == "active")
            polls = app.polls
            await until(pilot, "three more polls", lambda: app.polls >= polls + 3)
            assert app.is_running

    asyncio.run(scenario())


def test_hb_tui_opens_a_syncdir_store_as_a_reader_with_the_instances_sync_delay(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """hb-tui --store syncdir://… opens the folder without a node id (it writes nothing);
    with --instance it is told the config's sync delay, which the panel shows."""
    sync = Sync(tmp_path)
    made = sync.open("A")  # a folder a node made, which holds the agent's records
    made.put_heartbeat(AGENT, Heartbeat(node="A", region="r", host="h", pid=1, role="standby",
                                        epoch=0, seq=0, leader=None, time=time.time()))  # fmt: skip
    made.close()
    url = f"syncdir://{sync.root('A')}"
    opened: list[Store] = []
    monkeypatch.setattr(MonitorApp, "run", lambda self, **_: opened.append(self.store))

    assert main(["--store", url, "--agent-id", AGENT]) == 0
    monkeypatch.setenv("CONFIGURATION_DIRECTORY", str(tmp_path))
    (tmp_path / "one.toml").write_text(
        f'store = "{url}"\nagent = "mypkg:Agent"\nagent_id = "{AGENT}"\nnode_id = "A"\n'
        "sync_delay_ms = 1000\nlease_ttl_ms = 3000\n"
    )
    assert main(["--instance", "one"]) == 0
    assert len(opened) == 2
    delays = []
    for store in opened:
        assert isinstance(store, SyncDirStore) and store.node == ""  # a reader: no node id
        delays.append(store.sync_delay_ms)
    assert delays == [0, 1000]  # 0: not stated
