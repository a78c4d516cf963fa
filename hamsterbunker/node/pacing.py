"""When the lease loop next reads the lease and writes its heartbeat.

A leader renews and beats every tick. A standby with a working watch reads when woken
and at least every two ticks, and beats every ``standby_period_s``; without one, or
facing a free or expired lease it could not take, it reads every tick
(docs/design.md, "The node").
"""

from __future__ import annotations

from ..core.clock import Clock
from ..core.timing import LeaseTiming
from ..lease import LeaseKeeper
from .state import Standing

__all__ = ["Pacing"]


class Pacing:
    """The read and heartbeat schedule of one run of the lease loop."""

    def __init__(
        self, keeper: LeaseKeeper, standing: Standing, timing: LeaseTiming, clock: Clock
    ) -> None:
        self._keeper, self._standing, self._timing, self._clock = keeper, standing, timing, clock
        self.watch_works = True  # until the watch ends: then a standby reads every tick
        self.last_read = float("-inf")  # when the last pass that read the lease began
        self._next_heartbeat = 0.0
        self._beat_role = ""  # the role the last heartbeat told

    def read_at(self) -> float:
        """When the next read of the lease (a leader's: renewal) is due, short of a wake-up."""
        keeper, tick = self._keeper, self._timing.tick_s
        record, expiry = keeper.observed, keeper.seconds_until_expiry()
        every_tick = (
            keeper.held is not None
            or not self.watch_works
            or record is None
            or record.holder is None  # free, or handed over: taken the moment it may be
            or expiry == 0
        )
        due = self.last_read + (tick if every_tick else 2 * tick)
        if expiry:
            due = min(due, self._clock.monotonic() + expiry + 0.001)
        return due

    def beat_due(self, pass_start: float) -> bool:
        """Whether the pass begun at pass_start writes the heartbeat (due, or the role
        changed since the last); if so, the next one is counted from pass_start.
        """
        role = self._standing.role
        if pass_start < self._next_heartbeat and role == self._beat_role:
            return False
        self._beat_role = role
        leading = self._keeper.held is not None
        period = self._timing.tick_s if leading else self._timing.standby_period_s
        self._next_heartbeat = pass_start + period
        return True

    def beat_held(self) -> None:
        """The heartbeat beat_due asked for was not written: the role is told when next due."""
        self._beat_role = ""

    def wake_at(self) -> float:
        """When the next pass is due: the next read or heartbeat, whichever is first."""
        return min(self._next_heartbeat, self.read_at())
