"""The node's side of systemd beyond ``hamsterbunker.node.notify``: watchdog pings and STATUS= text.

The ping is withheld while a pass of the lease loop is stuck (a store call
that never returns), so that systemd restarts a node that no longer keeps
its lease; the status line says what the node is doing, for ``systemctl status``.
"""

from __future__ import annotations

import asyncio
import logging

from ..core.clock import Clock
from ..lease import LeaseKeeper
from .notify import Notifier
from .state import Standing

__all__ = ["Watchdog", "status_text"]

log = logging.getLogger("hamsterbunker")


class Watchdog:
    """Pings WATCHDOG=1 every half WATCHDOG_USEC while the lease loop makes progress."""

    def __init__(self, notifier: Notifier, clock: Clock, node_id: str) -> None:
        self._notifier, self._clock, self._node_id = notifier, clock, node_id
        # When the current pass of the lease loop began; None while it sleeps.
        self._pass_started: float | None = None

    def pass_began(self) -> float:
        """Note that a pass of the lease loop began; returns the time it began."""
        self._pass_started = now = self._clock.monotonic()
        return now

    def pass_ended(self) -> None:
        self._pass_started = None

    async def run(self) -> None:
        """Ping until cancelled, but only while no pass has run longer than the ping interval:
        a stalled or blocked loop gets the node killed and restarted by systemd.
        """
        interval = self._notifier.watchdog_interval
        if interval is None:
            return
        while True:
            started = self._pass_started
            if started is None or self._clock.monotonic() - started < interval:
                self._notifier.watchdog()
            else:
                log.error(
                    "%s: the lease loop has made no progress for %.1f s; "
                    "withholding the watchdog ping",
                    self._node_id,
                    self._clock.monotonic() - started,
                )
            await asyncio.sleep(interval)


def status_text(standing: Standing, keeper: LeaseKeeper) -> str:
    """One line saying the role, e.g. ``standby · leader hbnk-2 (us-east) · epoch 3``."""
    held, observed = keeper.held, keeper.observed
    if held is not None:
        step = f"step {standing.seq}" if standing.restored else "restoring"
        paused = " · paused" if standing.paused else ""
        return f"active · epoch {held.epoch}{paused} · {step}"
    if standing.role in ("starting", "stopping"):
        return standing.role
    if observed is not None and observed.holder is not None:
        leader = f"leader {observed.holder} ({observed.region})"
    else:
        leader = "no leader"
    paused = " · paused" if standing.paused else ""
    return f"{standing.role} · {leader} · epoch {standing.epoch_seen}{paused}"
