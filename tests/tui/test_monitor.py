"""The monitor app against real file stores: real node processes, and records written here.

Each test drives ``MonitorApp`` headless with ``run_test()`` and asserts on
what the screen shows (the rendered text) and on widget state.
"""

from __future__ import annotations

import asyncio
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, cast

import pytest
from hamsterbunker_tui.app import MonitorApp
from hamsterbunker_tui.confirm import ConfirmKill
from hamsterbunker_tui.nodes import NodesTable
from hamsterbunker_tui.panels import KillPanel, StoreBanner

from hamsterbunker import FileStore
from hamsterbunker.core.timing import LeaseTiming
from hamsterbunker.demo import NODES
from hamsterbunker.ops.local import LocalCluster
from hamsterbunker.records import Event, Heartbeat, LeaseRecord
from hamsterbunker.stores import Store
from hamsterbunker.testing import MemoryStore
from tests.support import store_of

from .screen import screen_text, until, widget_text

SIZE = (150, 45)
AGENT = "watched"
# Fast but safe timing for the clusters: takeovers within about a second.
FAST = {"timing": LeaseTiming(tick_ms=200, lease_ttl_ms=1000)}


def write_active_node(store: FileStore, *, host: str, pid: int) -> None:
    """A lease held by node far-1 and its heartbeat, as a node on `host` would write them.

    The lease TTL is a minute so the heartbeat stays fresh without being rewritten.
    """
    lease = LeaseRecord(holder="far-1", region="us-west", session="s1", epoch=1, ttl_ms=60_000)
    store.cas_lease(AGENT, None, lease)
    beat = Heartbeat(
        node="far-1",
        region="us-west",
        host=host,
        pid=pid,
        role="active",
        epoch=1,
        seq=0,
        leader="far-1",
        time=time.time(),
        beats=1,
    )
    store.put_heartbeat(AGENT, beat)


def dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


# -- a real cluster ---------------------------------------------------------------


@pytest.mark.multiprocess
def test_shows_holder_epoch_and_roles_of_a_running_cluster(
    local_cluster: Callable[..., LocalCluster],
) -> None:
    cluster = local_cluster(**FAST)
    for spec in NODES:
        cluster.start(spec)
    store = store_of(cluster)

    async def scenario() -> None:
        app = MonitorApp(FileStore(store.root, create=False), "journal")
        async with app.run_test(size=SIZE) as pilot:
            table = app.query_one(NodesTable)

            def settled() -> bool:
                lease = store.read_lease("journal")  # the truth, read past the monitor
                if lease is None or lease.holder is None:
                    return False
                expected = {spec.node: "standby" for spec in NODES} | {lease.holder: "active"}
                text = screen_text(app)
                return (
                    table.roles() == expected
                    and f"holder  {lease.holder}" in text
                    and f"epoch {lease.epoch}" in text
                    and "checkpoint seq" in text
                )

            await until(pilot, "holder, epoch, roles and progress on screen", settled)
            lease = store.read_lease("journal")
            assert lease is not None and lease.holder is not None and lease.epoch == 1
            text = screen_text(app)
            assert "epoch 1" in text
            assert re.search(r"checkpoint seq \d+", text)
            assert "node.online" in text  # the event log

            # The kill switch names the holder's real process.
            kill = app.query_one(KillPanel)
            assert not kill.button.disabled
            assert str(kill.button.tooltip) == (
                f"kill {lease.holder} (pid {cluster.pid(lease.holder)})"
            )

            # Rows update in place: a cleared and rebuilt table would lose the cursor.
            table.move_cursor(row=2)
            polls = app.polls
            await until(pilot, "three more polls", lambda: app.polls >= polls + 3)
            assert table.cursor_row == 2
            assert table.row_count == 3

    asyncio.run(scenario())


@pytest.mark.multiprocess
def test_demo_kill_key_shows_the_takeover_and_the_node_rejoins(
    local_cluster: Callable[..., LocalCluster],
) -> None:
    cluster = local_cluster(agent="hamsterbunker.demo:CounterAgent", **FAST)
    for spec in NODES:
        cluster.start(spec)
    store = store_of(cluster)

    async def scenario() -> None:
        app = MonitorApp(FileStore(store.root, create=False), "counter", demo=cluster)
        async with app.run_test(size=SIZE) as pilot:
            kill = app.query_one(KillPanel)
            await until(
                pilot,
                "an active node that has published at epoch 1",
                lambda: (
                    not kill.button.disabled
                    and "epoch 1" in screen_text(app)
                    and re.search(
                        r"(checkpoint\.|agent\.step\+)published +epoch 1 ", screen_text(app)
                    )
                ),
            )
            old = app.model.active_node()
            assert old is not None
            await pilot.press("k")  # demo mode: no confirmation

            takeover = re.compile(
                rf"epoch 2 +\d\d:\d\d:\d\d +{old.node} → (hbnk-\d) +expired +gap \d+\.\d{{3}} s"
            )
            await until(
                pilot,
                "epoch 2 with a new holder and its timeline line",
                lambda: takeover.search(screen_text(app)),
            )
            match = takeover.search(screen_text(app))
            assert match is not None
            new = match[1]
            assert new != old.node
            text = screen_text(app)
            assert f"holder  {new}" in text
            assert f"SIGKILL {old.node} (pid {old.pid})" in text
            lease = store.read_lease("counter")
            assert lease is not None and (lease.holder, lease.epoch) == (new, 2)

            # A couple of seconds later the killed node is back, as a standby.
            table = app.query_one(NodesTable)
            await until(
                pilot,
                f"{old.node} to rejoin as a standby",
                lambda: table.roles().get(old.node) == "standby",
            )
            assert cluster.pid(old.node) != old.pid

    asyncio.run(scenario())


# -- the kill switch on records written here --------------------------------------


@pytest.mark.parametrize(
    ("host", "pid", "why"),
    [
        ("elsewhere.example", 4242, "far-1 runs on elsewhere.example, not on this machine"),
        (socket.gethostname(), None, "far-1's process {pid} is not running here"),
    ],
    ids=["remote-host", "dead-pid"],
)
def test_kill_switch_is_disabled_and_says_why(
    tmp_path: Path, host: str, pid: int | None, why: str
) -> None:
    pid = pid if pid is not None else dead_pid()
    why = "cannot kill: " + why.format(pid=pid)
    store = FileStore(tmp_path / "store")
    write_active_node(store, host=host, pid=pid)

    async def scenario() -> None:
        app = MonitorApp(FileStore(store.root, create=False), AGENT)
        async with app.run_test(size=SIZE) as pilot:
            kill = app.query_one(KillPanel)
            await until(pilot, "the reason on screen", lambda: why in widget_text(kill))
            assert "holder  far-1" in screen_text(app)
            assert kill.button.disabled
            assert str(kill.button.tooltip) == why
            await pilot.press("k")
            await pilot.pause(0.1)
            assert not isinstance(app.screen, ConfirmKill)  # nothing to confirm

    asyncio.run(scenario())


def test_kill_outside_the_demo_asks_once_then_sigkills(tmp_path: Path) -> None:
    # Its command line names hamsterbunker, as a node's does (the monitor checks).
    victim = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)", "hamsterbunker-test-node"]
    )
    try:
        store = FileStore(tmp_path / "store")
        write_active_node(store, host=socket.gethostname(), pid=victim.pid)

        async def scenario() -> None:
            app = MonitorApp(FileStore(store.root, create=False), AGENT)
            async with app.run_test(size=SIZE) as pilot:
                kill = app.query_one(KillPanel)
                await until(pilot, "the kill switch to enable", lambda: not kill.button.disabled)
                assert str(kill.button.tooltip) == f"kill far-1 (pid {victim.pid})"

                await pilot.press("k")
                await until(pilot, "the question", lambda: isinstance(app.screen, ConfirmKill))
                await pilot.press("n")
                await until(pilot, "the question to go", lambda: len(app.screen_stack) == 1)
                await pilot.pause(0.2)
                assert victim.poll() is None  # "n" kills nothing

                await pilot.click("#kill-button")
                await until(pilot, "the question", lambda: isinstance(app.screen, ConfirmKill))
                await pilot.press("y")
                await until(pilot, "the process to die", lambda: victim.poll() is not None)
                assert victim.returncode == -9

        asyncio.run(scenario())
    finally:
        victim.kill()
        victim.wait()


# -- a store that goes away -------------------------------------------------------


@pytest.mark.parametrize("comes_back_as", ["restored", "new-empty"])
def test_removed_store_shows_a_banner_until_it_is_readable_again(
    tmp_path: Path, comes_back_as: str
) -> None:
    root = tmp_path / "store"
    store = FileStore(root)
    write_active_node(store, host="elsewhere.example", pid=4242)
    backup = tmp_path / "backup"
    shutil.copytree(root, backup)

    async def scenario() -> None:
        app = MonitorApp(FileStore(root, create=False), AGENT)
        async with app.run_test(size=SIZE) as pilot:
            banner = app.query_one(StoreBanner)
            await until(pilot, "the holder", lambda: "holder  far-1" in screen_text(app))
            assert not banner.shown
            assert "store unreachable" not in screen_text(app)

            shutil.rmtree(root)
            await until(pilot, "the banner", lambda: "store unreachable" in screen_text(app))
            text = screen_text(app)
            assert str(root) in text  # says which store
            assert "holder  far-1" in text  # the last known data stays
            assert banner.shown and app.store_error is not None

            if comes_back_as == "restored":
                shutil.copytree(backup, root)
            else:
                root.mkdir()
            await until(pilot, "the banner to go", lambda: not banner.shown)
            await until(
                pilot,
                "the banner off the screen",
                lambda: "store unreachable" not in screen_text(app),
            )
            assert app.store_error is None

    asyncio.run(scenario())


def test_a_forgotten_dead_node_leaves_the_table_and_the_event_log(tmp_path: Path) -> None:
    """hb forget (Store.forget_node) of a dead node, while the monitor runs: its row and its
    event lines go; the other dead node stays listed, as offline."""
    store = FileStore(tmp_path / "store")
    lease = LeaseRecord(holder="far-1", region="us-west", session="s1", epoch=1, ttl_ms=1000)
    store.cas_lease(AGENT, None, lease)
    for n, node in enumerate(("far-1", "far-2"), start=1):
        role = "active" if node == "far-1" else "standby"
        beat = Heartbeat(node=node, region="us-west", host="elsewhere.example", pid=4000 + n,
                         role=role, epoch=1, seq=0, leader="far-1", time=time.time(), beats=1)  # fmt: skip
        store.put_heartbeat(AGENT, beat)
        said = Event(node=node, n=1, type="lease.renew_failed", time=time.time(), epoch=1,
                     detail={"error": f"said by {node}"})  # fmt: skip
        store.append_event(AGENT, said)

    def rows() -> str:
        return widget_text(app.query_one(NodesTable))

    async def scenario() -> None:
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, "both nodes dead", lambda: rows().count("offline") == 2)
            await until(pilot, "far-2's event", lambda: "said by far-2" in screen_text(app))
            store.forget_node(AGENT, "far-2")
            await until(pilot, "far-2 gone", lambda: "far-2" not in screen_text(app))
            assert "far-1" in rows() and "offline" in rows()
            assert "said by far-1" in screen_text(app)

    app = MonitorApp(FileStore(tmp_path / "store", create=False), AGENT)
    asyncio.run(scenario())


# -- polling: coalesced, never on the UI's loop ---------------------------------------


@pytest.mark.parametrize(("kind", "watched"), [("file", False), ("memory", True)])
def test_the_monitor_watches_a_store_whose_watch_is_cheap(
    tmp_path: Path, kind: str, watched: bool
) -> None:
    """The monitor keeps the store's watch open where the store says it is cheap (its
    report), and reads the lease every LEASE_CHECK_S of a file store instead."""
    store = FileStore(tmp_path / "store") if kind == "file" else MemoryStore()
    assert MonitorApp(store, AGENT).watched is watched
    assert MonitorApp(store, AGENT, watch=not watched).watched is not watched  # as asked


class GatedStore:
    """A file store whose lease reads wait at a gate, and whose watch hints in bursts."""

    def __init__(self, inner: FileStore) -> None:
        self.inner = inner
        self.gate = threading.Event()
        self.gate.set()
        self.burst = asyncio.Event()
        self.watching = False
        self.in_flight = 0
        self.most_in_flight = 0
        self._lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def read_lease(self, agent: str) -> LeaseRecord | None:
        with self._lock:
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            self.gate.wait(timeout=20)
            return self.inner.read_lease(agent)
        finally:
            with self._lock:
                self.in_flight -= 1

    async def watch(
        self, agent: str, *, lease_only: bool = False, terms_only: bool = False
    ) -> AsyncIterator[None]:
        self.watching = True
        while True:
            await self.burst.wait()
            self.burst.clear()
            for _ in range(50):
                yield None


def test_a_burst_of_hints_is_one_lease_read_and_a_poll_only_when_the_lease_moved(
    tmp_path: Path,
) -> None:
    """The watch wakes the monitor on every renewal: that costs a lease read, not a poll of
    the whole store; hints arriving while that read waits are not queued behind it."""
    inner = FileStore(tmp_path / "store")
    write_active_node(inner, host="elsewhere.example", pid=4242)
    store = GatedStore(inner)

    async def scenario() -> None:
        # A long timer: every poll here comes from a hint. The watch asked for: a file
        # store's is not cheap, and the monitor would leave it off by default.
        app = MonitorApp(cast(Store, store), AGENT, poll_interval=60, watch=True)
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, "the first poll and the watch", lambda: store.watching)
            await pilot.pause(0.2)
            polls = app.polls

            # 50 hints, the lease unchanged (renewals, say): no poll.
            store.burst.set()
            await pilot.pause(0.5)
            assert app.polls == polls

            store.gate.clear()
            store.burst.set()
            await until(pilot, "a lease read waiting on the store", lambda: store.in_flight == 1)
            store.burst.set()  # 50 more hints while that read waits
            started = time.monotonic()
            for _ in range(5):
                await pilot.pause(0.05)  # the screen's loop runs on meanwhile
            assert time.monotonic() - started < 2
            assert app.polls == polls

            # The lease moves while the read waits: one poll, for all the hints.
            lease = inner.read_lease(AGENT)
            assert lease is not None
            moved = LeaseRecord("far-2", "us-west", "s2", epoch=2, ttl_ms=60_000)
            inner.cas_lease(AGENT, lease.version, moved)
            store.gate.set()
            await until(pilot, "one poll", lambda: app.polls >= polls + 1)
            await pilot.pause(0.5)
            assert app.polls == polls + 1
            assert store.most_in_flight == 1
            assert app.model.lease is not None and app.model.lease.holder == "far-2"

    asyncio.run(scenario())
