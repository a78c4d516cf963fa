"""The monitor app: composition, the polling worker, the kill switch.

One worker loops: wait for the store's watch hint or the poll interval,
read the store in a thread, feed the model, show its views. The watch only
hints (it may miss changes, or be absent), and the timer keeps heartbeat ages
ticking. Hints that arrive while a poll runs become one more poll, never a
queue of them, and the screen never waits on the store.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from typing import ClassVar

from textual import on, work
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal
from textual.widgets import Button, Footer, Header
from textual.worker import Worker

from hamsterbunker.errors import HamsterbunkerError
from hamsterbunker.local import LocalCluster
from hamsterbunker.stores import Store

from .confirm import ConfirmKill
from .demo import DemoNodes
from .eventlog import EventLog
from .model import ClusterModel, KillTarget, kill_target
from .nodes import NodesTable
from .panels import KillPanel, LeasePanel, ProgressPanel, StoreBanner, Timeline
from .polling import Reading, read_store

__all__ = ["MonitorApp"]

WATCH_RETRY_S = 1.0


class MonitorApp(App[None]):
    CSS_PATH = "app.tcss"
    TITLE = "hb-tui"
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("k", "kill", "kill active node"),
        Binding("q", "quit", "quit"),
    ]

    def __init__(
        self,
        store: Store,
        agent_id: str,
        demo: LocalCluster | None = None,
        poll_interval: float = 0.5,
    ) -> None:
        super().__init__()
        self.store = store
        self.agent_id = agent_id
        self.demo = DemoNodes(demo) if demo is not None else None
        self.poll_interval = poll_interval
        self.model = ClusterModel(agent_id)
        self.polls = 0  # completed polls, failed ones included
        self.store_error: str | None = None  # why the last poll failed; None if it worked
        self._tail = store.tail(agent_id)
        self._hint = asyncio.Event()
        self._target = KillTarget(None, None, "no active node")
        self._watcher: Worker[None] | None = None
        self._sigterm_handled = False

    def compose(self) -> ComposeResult:
        yield Header()
        yield StoreBanner(id="banner")
        with Horizontal(id="top"):
            yield LeasePanel(self.agent_id, id="lease")
            yield ProgressPanel(id="progress")
            yield KillPanel(id="kill")
        yield NodesTable(id="nodes")
        with Horizontal(id="bottom"):
            yield Timeline(id="timeline")
            yield EventLog(id="events")
        yield Footer()

    def on_mount(self) -> None:
        mode = " · demo: k kills the active node" if self.demo else ""
        self.sub_title = f"agent {self.agent_id} · {self.store.url}{mode}"
        # SIGTERM (a closed terminal, a service manager) quits like q does, so that
        # hb-tui --demo still stops its nodes and removes its temporary store.
        with contextlib.suppress(NotImplementedError, RuntimeError):  # not the main thread
            asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, self.exit)
            self._sigterm_handled = True
        for warning in self.store.warnings:
            self.notify(warning, severity="warning", timeout=15)
        self._poll_loop()

    def on_unmount(self) -> None:
        if self._sigterm_handled:
            asyncio.get_running_loop().remove_signal_handler(signal.SIGTERM)

    # -- polling -----------------------------------------------------------------

    @work(exclusive=True, group="poll")
    async def _poll_loop(self) -> None:
        while True:
            # Cleared before the poll: a hint arriving during it means one more poll.
            self._hint.clear()
            await self._poll_once()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._hint.wait(), self.poll_interval)

    async def _poll_once(self) -> None:
        try:
            if self.demo is not None and self.demo.pending():
                await self._restart_demo_nodes()
            try:
                reading = await asyncio.to_thread(read_store, self.store, self._tail, self.agent_id)
            except (HamsterbunkerError, OSError) as exc:
                if self.is_running:
                    self._store_lost(str(exc))
            else:
                # A poll that ends while the app shuts down finds its widgets gone.
                if self.is_running:
                    self._store_read(reading)
        finally:
            self.polls += 1

    def _store_read(self, reading: Reading) -> None:
        self.model.update(
            reading.events,
            reading.heartbeats,
            reading.lease,
            reading.checkpoints,
            now=reading.now,
            wall=reading.wall,
            lease_error=reading.lease_error,
        )
        if self.store_error is not None:
            self.store_error = None
            self.query_one(StoreBanner).clear()
            self.query_one(EventLog).note("the store is readable again")
        self._ensure_watch()
        self._show()

    def _store_lost(self, reason: str) -> None:
        """Say so and keep the last data on screen; the loop keeps retrying on its timer."""
        if self.store_error is None:
            self.query_one(EventLog).note(f"cannot read the store: {reason}")
        self.store_error = reason
        self.query_one(StoreBanner).show_error(reason)
        # A watch on a vanished directory sees nothing of the one put in its place;
        # it is started afresh once reads work again.
        self._stop_watch()

    def _show(self) -> None:
        model = self.model
        self.query_one(NodesTable).show(model.nodes())
        self.query_one(LeasePanel).show(model.lease_view(), model.lease_error)
        self.query_one(ProgressPanel).show(model.progress())
        self.query_one(Timeline).show(model.timeline())
        self.query_one(EventLog).show_new(model.events, model.events_seen)
        target = kill_target(model)
        self.query_one(KillPanel).show(target)
        if target != self._target:
            self._target = target
            self.refresh_bindings()

    # -- the watch hint ----------------------------------------------------------

    def _ensure_watch(self) -> None:
        if self._watcher is None or self._watcher.is_finished:
            self._watcher = self.run_worker(self._watch(), group="watch", exclusive=True)

    def _stop_watch(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
            self._watcher = None

    async def _watch(self) -> None:
        while True:
            try:
                async for _ in self.store.watch(self.agent_id):
                    self._hint.set()
            except Exception as exc:
                # Only a hint: without it the timer still polls, so note and go on.
                self.log.warning(f"store watch stopped: {exc!r}")
            await asyncio.sleep(WATCH_RETRY_S)

    # -- the kill switch ---------------------------------------------------------

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "kill":
            return True if self._target.pid is not None else None  # None: shown, greyed out
        return True

    @on(Button.Pressed, "#kill-button")
    def _kill_pressed(self) -> None:
        self.action_kill()

    def action_kill(self) -> None:
        target = kill_target(self.model)
        if target.node is None or target.pid is None:
            self.notify(f"cannot kill: {target.reason}", severity="warning")
            return
        if self.demo is not None:
            self._kill_demo_node(target)
        else:
            self.push_screen(ConfirmKill(target), lambda yes: self._kill_confirmed(target, yes))

    def _kill_confirmed(self, target: KillTarget, yes: bool | None) -> None:
        if not yes or target.pid is None:
            return
        # The answer may have taken a while: kill only what is still the active node.
        if kill_target(self.model).pid != target.pid:
            self.notify(f"not killed: {target.node} is no longer the active node here")
            return
        try:
            os.kill(target.pid, signal.SIGKILL)
        except ProcessLookupError:
            self.notify(f"{target.node} (pid {target.pid}) had exited already")
            return
        except PermissionError:
            self.notify(f"not allowed to kill pid {target.pid}", severity="error")
            return
        self.query_one(EventLog).note(f"SIGKILL {target.node} (pid {target.pid})")
        self._hint.set()

    @work(group="kill", exclusive=True)
    async def _kill_demo_node(self, target: KillTarget) -> None:
        assert self.demo is not None and target.node is not None and target.pid is not None
        if not self.demo.owns(target.node, target.pid):
            self.notify(f"{target.node} (pid {target.pid}) is not a process of this demo")
            return
        region = next((n.region for n in self.model.nodes() if n.node == target.node), "")
        await asyncio.to_thread(self.demo.kill, target.node, region)
        if not self.is_running:
            return
        self.query_one(EventLog).note(
            f"SIGKILL {target.node} (pid {target.pid}); "
            f"it restarts in {self.demo.restart_after_s:.0f} s and rejoins as a standby"
        )
        self._hint.set()

    async def _restart_demo_nodes(self) -> None:
        assert self.demo is not None
        try:
            started = await asyncio.to_thread(self.demo.restart_due)
            notes = [f"restarted {node} (pid {pid})" for node, pid in started]
        except OSError as exc:
            notes = [f"could not restart a demo node: {exc}"]
        if self.is_running:
            for note in notes:
                self.query_one(EventLog).note(note)
