"""The monitor app: composition, the polling worker, the kill switch.

One worker loops: read the store in a thread, feed the model, show its views,
then wait. A poll is due after the slow timer (1 s; 2 s while the cluster is
calm; 0.5 s after a flood of events), or at once when the lease changed hands
(a takeover, a switchover). The lease is looked at on the store's watch hint,
which covers the lease record only (a renewal costs one lease read, not a poll),
or every LEASE_CHECK_S for a file store, whose watch costs more than that. Hints
that arrive while a read runs are not queued behind it. A poll for every change
of the store, with its repaint, was what kept the monitor busy while nobody
looked (see benchmarks/tui_idle.py). The screen never waits on the store, and a
widget is repainted only when what it shows changed.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from typing import ClassVar

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal
from textual.widgets import Button, Footer, Header
from textual.worker import Worker

from hamsterbunker.core.errors import HamsterbunkerError
from hamsterbunker.ops.local import LocalCluster
from hamsterbunker.sealing.keyring import Secret
from hamsterbunker.stores import Store

from .confirm import ConfirmKill
from .control_keys import ControlKeys
from .controls import Controller
from .demo import DemoCounter, DemoNodes
from .eventlog import EventLog
from .filters import next_filter
from .killing import KillTarget, kill_target
from .model import ClusterModel
from .nodes import NodesTable
from .panels import KillPanel, LeasePanel, ProgressPanel, StoreBanner, Timeline
from .polling import Reading, SyncDirPoll, read_store
from .syncdir import show_syncdir

__all__ = ["MonitorApp"]

WATCH_RETRY_S = 1.0
POLL_S = 1.0  # the slow timer: ages shown in whole seconds need no more
LEASE_CHECK_S = 0.5  # an unwatched store's lease is read this often, for takeovers
CALM_POLL_S = 2.0  # the slow timer while the cluster is calm (see _calm)
BUSY_EVENTS = 100  # a poll that took in this many events is followed by another soon
MIN_POLL_S = 0.5  # the store's wake-ups are taken at most this often


class MonitorApp(ControlKeys):
    CSS_PATH = "app.tcss"
    TITLE = "hb-tui"
    # Short words: the footer shows every key, q too, at 80 columns.
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("k", "kill", "kill active"),
        Binding("s", "switchover", "switchover"),
        Binding("p", "pause", "pause/resume"),
        Binding("f", "filter", "filter"),
        Binding("q", "quit", "quit"),
    ]
    # Under 150 columns the takeovers go above the events, not beside them; under 120
    # columns or 30 rows the kill button goes, and under 30 rows the panels give up their
    # bottom borders (app.tcss).
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (120, "-medium"), (150, "-wide")]  # noqa: RUF012
    VERTICAL_BREAKPOINTS = [(0, "-short"), (30, "-tall")]  # noqa: RUF012
    AUTO_FOCUS = "#events"  # the arrow and page keys scroll the event log at once

    def __init__(
        self,
        store: Store,
        agent_id: str,
        demo: LocalCluster | None = None,
        poll_interval: float = POLL_S,
        min_poll_interval: float = MIN_POLL_S,
        secret: Secret | None = None,
        watch: bool | None = None,  # use the store's watch; default: if it is cheap
    ) -> None:
        super().__init__()
        self.store = store
        self.agent_id = agent_id
        self.demo = DemoNodes(demo) if demo is not None else None
        self.counter = DemoCounter(store, demo.secret) if demo is not None else None
        if secret is None and demo is not None:
            secret = demo.secret  # the demo made it
        self.controller = Controller(store, agent_id, secret)
        self.poll_interval = poll_interval
        self.min_poll_interval = min(min_poll_interval, poll_interval)
        # A file store's watch is a watchfiles thread that wakes on every write in the
        # agent's directory: measured, it cost more (about 1.3 % of a core on the cluster
        # of benchmarks/tui_idle.py) than reading the lease every LEASE_CHECK_S does. A
        # syncdir store's watch is one such thread per node subtree. Such a store says
        # its watch is not cheap.
        self.watched = store.report().cheap_watch if watch is None else watch
        self.calm_poll_interval = max(poll_interval, min(CALM_POLL_S, 2 * poll_interval))
        self.count: int | None = None  # the demo's counter, once a checkpoint is opened
        self.model = ClusterModel(agent_id)
        self.polls = 0  # completed polls, failed ones included
        self.store_error: str | None = None  # why the last poll failed; None if it worked
        self._tail = store.tail(agent_id)
        self._syncdir = SyncDirPoll()  # a syncdir store's own report, now and then
        self._hint = asyncio.Event()
        self._poll_now = False
        self._last_events = 0  # how many events the last poll took in
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
        self._show()  # what is known at once, before the store is read
        if self.demo is not None:
            self._start_demo()
        else:
            self._poll_loop()

    def on_unmount(self) -> None:
        if self._sigterm_handled:
            asyncio.get_running_loop().remove_signal_handler(signal.SIGTERM)

    @work(group="demo", exclusive=True)
    async def _start_demo(self) -> None:
        """Start the demo's nodes once the screen is up, and show them at once as starting."""
        assert self.demo is not None
        self.query_one(EventLog).note("starting the three demo nodes…")
        try:
            await asyncio.to_thread(self.demo.start_missing)
        except OSError as exc:
            self.query_one(EventLog).note(f"could not start a demo node: {exc}")
        if not self.is_running:
            return
        started = []
        for node, region, pid in self.demo.running():
            self.model.expect(node, region, pid)
            started.append(f"{node} (pid {pid})")
        self.query_one(EventLog).note(f"demo nodes running: {', '.join(started)}")
        self._show()
        self._poll_loop()

    # -- polling -----------------------------------------------------------------

    @work(exclusive=True, group="poll")
    async def _poll_loop(self) -> None:
        while True:
            # Cleared before the poll: a hint arriving during it is looked at after it.
            self._hint.clear()
            started = time.monotonic()
            await self._poll_once()
            await self._wait_for_news(started + self._next_poll_in())
            # A burst of changes (a takeover writes several records) is one poll.
            await asyncio.sleep(max(0.0, started + self.min_poll_interval - time.monotonic()))

    def _next_poll_in(self) -> float:
        """Seconds from one poll's start to the next, the store's news aside."""
        if self._last_events >= BUSY_EVENTS:
            return self.min_poll_interval  # a flood of events: keep up with it
        return self.calm_poll_interval if self._calm() else self.poll_interval

    def _calm(self) -> bool:
        """A held lease renewed in time and every node fresh: the slow timer may be slower.

        Nothing on screen then changes but the routine lines and cells, which are shown
        every ROUTINE_S anyway, and a takeover wakes the monitor through the watch.
        """
        view = self.model.lease_view()
        return (
            self.store_error is None
            and view is not None
            and view.renewed_s is not None
            and view.renewed_s <= view.ttl_s / 2
            and all(node.health == "fresh" for node in self.model.nodes())
        )

    async def _wait_for_news(self, deadline: float) -> None:
        """Until the slow timer is due, or the lease changed hands, or a key asked.

        The watch covers the lease record only, and wakes on every renewal; a
        renewal changes nothing on screen, so a wake-up costs one lease read, and
        the whole store is read only when the holder or the epoch moved.
        """
        while (rest := deadline - time.monotonic()) > 0:
            try:
                await asyncio.wait_for(
                    self._hint.wait(), rest if self.watched else min(rest, LEASE_CHECK_S)
                )
            except TimeoutError:
                if self.watched or deadline <= time.monotonic():
                    return
                # Unwatched: look at the lease now and then instead.
            self._hint.clear()
            if self._poll_now or await self._lease_moved():
                self._poll_now = False
                return

    async def _lease_moved(self) -> bool:
        try:
            lease = await asyncio.to_thread(self.store.read_lease, self.agent_id)
        except Exception:
            return True  # let the poll find out, and say so
        shown = self.model.lease
        if lease is None or shown is None:
            return lease is not shown
        return (lease.holder, lease.epoch) != (shown.holder, shown.epoch)

    def _nudge(self) -> None:
        """Poll now (after a kill, say): the store changed because of us."""
        self._poll_now = True
        self._hint.set()

    async def _poll_once(self) -> None:
        try:
            if self.demo is not None and self.demo.pending():
                await self._restart_demo_nodes()
            try:
                reading = await asyncio.to_thread(
                    read_store, self.store, self._tail, self.agent_id, self._syncdir
                )
                if self.counter is not None:
                    newest = reading.checkpoints[0] if reading.checkpoints else None
                    self.count = await asyncio.to_thread(self.counter.read, newest)
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
        self._last_events = len(reading.events)
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
        if reading.syncdir is not None:
            show_syncdir(self, reading.syncdir)

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
        self.query_one(ProgressPanel).show(model.progress(), self.count)
        self.query_one(Timeline).show(model.timeline())
        log = self.query_one(EventLog)
        for node in model.drain_forgotten():
            log.forget(node)
        log.show_new(model.events, model.events_seen)
        target = kill_target(model)
        self.query_one(KillPanel).show(target)
        if target != self._target:
            self._target = target
            self.refresh_bindings()

    def action_filter(self) -> None:
        log = self.query_one(EventLog)
        log.set_filter(next_filter(log.filter, [view.node for view in self.model.nodes()]))

    # -- the watch hint ----------------------------------------------------------

    def _ensure_watch(self) -> None:
        if not self.watched:
            return
        if self._watcher is None or self._watcher.is_finished:
            self._watcher = self.run_worker(self._watch(), group="watch", exclusive=True)

    def _stop_watch(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
            self._watcher = None

    async def _watch(self) -> None:
        while True:
            try:
                async for _ in self.store.watch(self.agent_id, lease_only=True):
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
        self._nudge()

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
        self._nudge()

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
