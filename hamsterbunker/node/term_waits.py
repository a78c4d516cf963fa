"""What a leader's term waits on: a pause, a renewal within the deadline, its step."""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Callable
from dataclasses import dataclass

from ..agent.step import State
from ..core.clock import Clock
from ..lease import LeaseKeeper
from .inbox import TermInbox
from .state import Signals, Standing

__all__ = ["Stall", "StepEnd", "TermWaits", "first"]


class Stall:
    """How long a term has failed to make progress, timed on the node's clock."""

    def __init__(self, clock: Clock, ttl_s: float) -> None:
        self._clock, self._ttl_s = clock, ttl_s
        self._since: float | None = None

    def for_a_ttl(self) -> bool:
        """Note one more failure; True once failures have gone on for a full lease TTL."""
        now = self._clock.monotonic()
        if self._since is None:
            self._since = now
        return now - self._since >= self._ttl_s

    def reset(self) -> None:
        self._since = None


class StepEnd(enum.Enum):
    DONE = "done"
    DEADLINE = "renew deadline passed during the step"
    LOST = "lease lost or node stopping"


@dataclass(frozen=True)
class TermWaits:
    """One term's waits; each returns early once the term ends (lost, stopping, leaving)."""

    lost: asyncio.Event  # the term's own end
    leaving: asyncio.Event  # a switchover or a rebase: finish the step as on a stop
    signals: Signals
    standing: Standing
    keeper: LeaseKeeper
    clock: Clock
    inbox: TermInbox
    grace: Callable[[], float]  # how long a stop lets the step in flight finish

    def over(self) -> bool:
        return self.lost.is_set() or self.signals.stopping.is_set() or self.leaving.is_set()

    async def until_unpaused(self) -> bool:
        """Wait while an operator has the agent paused; False if the term ends meanwhile."""
        changed = self.signals.control_changed
        while self.standing.paused:
            if self.over():
                return False
            changed.clear()
            await first(self.lost, self.signals.stopping, self.leaving, changed)
        return not self.over()

    async def until_may_step(self) -> bool:
        """Wait until a renewal within the deadline lets us step; False if the term ends."""
        renewed = self.signals.renewed
        while not self.keeper.may_step():
            if self.over():
                return False
            renewed.clear()
            await first(self.lost, self.signals.stopping, self.leaving, renewed)
        return not self.over()

    async def until_done_or_lost(self, step: asyncio.Task[State]) -> StepEnd:
        """Wait for the step; cancel it (async) or abandon it (sync) if it may not go on.

        A stop lets it finish within the grace (the node keeps the lease meanwhile), so
        that it is published and not repeated by the next leader (DESIGN.md invariant 6).
        """
        lost = asyncio.ensure_future(self.lost.wait())
        # A stop, or a switchover: the step in flight may finish within the grace.
        stopping = asyncio.ensure_future(first(self.signals.stopping, self.leaving))
        hurry = asyncio.ensure_future(self.signals.hurry.wait())  # a second stop signal
        finish_by: float | None = None  # once stopping: when the grace runs out
        try:
            while not step.done():
                now = self.clock.monotonic()
                remaining = self.keeper.seconds_until_deadline()
                if stopping.done() and finish_by is None:
                    finish_by = now + self.grace()
                    self.inbox.interrupt()  # a step waiting for work finishes now
                if lost.done() or hurry.done() or (finish_by is not None and now >= finish_by):
                    step.cancel()
                    return StepEnd.LOST
                if remaining <= 0:
                    step.cancel()
                    return StepEnd.DEADLINE
                # Timed to the renew deadline, so a hung renewal cannot keep us stepping.
                timeout = remaining if finish_by is None else min(remaining, finish_by - now)
                waiters = [step, lost, hurry] + ([stopping] if finish_by is None else [])
                await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            return StepEnd.DONE
        finally:
            for waiter in (lost, stopping, hurry):
                waiter.cancel()


async def first(*events: asyncio.Event) -> None:
    """Return once any of events is set."""
    waiters = [asyncio.ensure_future(event.wait()) for event in events]
    try:
        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()
