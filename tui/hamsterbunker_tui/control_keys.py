"""The s (switchover) and p (pause/resume) keys of the monitor: ask, then call the library.

A base class of ``MonitorApp``, apart so that app.py keeps to polling and showing.
The screens and the library calls are in controls.py.
"""

from __future__ import annotations

import asyncio

from textual import work
from textual.app import App
from textual.notifications import SeverityLevel

from hamsterbunker.core.errors import ControlRefused, HamsterbunkerError

from .controls import ANY_STANDBY, NO_SECRET, ChooseTarget, Confirm, Controller, live_standbys
from .eventlog import EventLog
from .model import ClusterModel

__all__ = ["ControlKeys"]


class ControlKeys(App[None]):
    """Needs, from the app: the model, the controller, the agent id, and _nudge()."""

    model: ClusterModel
    controller: Controller
    agent_id: str

    def _nudge(self) -> None:
        raise NotImplementedError

    def action_switchover(self) -> None:
        if not self.controller.enabled:
            self._say(f"switchover {NO_SECRET}")
            return
        active = self.model.active_node()
        standbys = live_standbys(self.model)
        if active is None or not standbys:
            why = "no active node" if active is None else "no live standby"
            self._say(f"cannot switch over: {why}")
            return
        self.push_screen(ChooseTarget(active.node, standbys), self._switchover_chosen)

    def _say(self, message: str, severity: SeverityLevel = "warning") -> None:
        """In the log (it stays) and as a notification (it is seen)."""
        self.query_one(EventLog).note(message)
        self.notify(message, severity=severity, timeout=10)

    def _switchover_chosen(self, target: str | None) -> None:
        if target is not None:
            to = None if target == ANY_STANDBY else target
            self._request(f"switchover to {to or 'the freshest live standby'}", to)

    def action_pause(self) -> None:
        if not self.controller.enabled:
            self._say(f"pause and resume {NO_SECRET}")
            return
        view = self.model.lease_view()
        paused = view is not None and view.paused
        if paused:
            question = f"Resume agent {self.agent_id}?"
            detail = "Its leader steps again."
        else:
            question = f"Pause agent {self.agent_id}?"
            detail = "The leader keeps its lease and heartbeats but does not step."
        yes = "resume" if paused else "pause"

        def answered(answer: bool | None) -> None:
            if answer:
                self._request(yes, None, paused=not paused)

        self.push_screen(Confirm(question, detail, yes), answered)

    @work(group="control", exclusive=True, exit_on_error=False)
    async def _request(self, what: str, target: str | None, paused: bool | None = None) -> None:
        """Ask the library in a thread; say what came of it in the log and a notification."""
        log = self.query_one(EventLog)
        log.note(f"asked: {what}")
        try:
            if paused is None:
                to = await asyncio.to_thread(self.controller.switchover, target)
                done = f"switchover asked: the lease goes to {to}"
            else:
                await asyncio.to_thread(self.controller.set_paused, paused)
                done = "pause asked" if paused else "resume asked"
        except ControlRefused as exc:
            self._say(f"refused: {exc}")
            return
        except (HamsterbunkerError, OSError) as exc:
            self._say(f"{what} failed: {exc}", "error")
            return
        self._say(done, "information")
        self._nudge()
