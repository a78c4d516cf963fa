"""The clock lease decisions are timed on (DESIGN.md invariant 2): CLOCK_BOOTTIME on Linux,
which never goes back and counts suspend; only its differences are used.
"""

from __future__ import annotations

import threading
import time
from typing import Protocol

__all__ = ["SUSPEND_AWARE", "Clock", "FakeClock", "MonotonicClock"]

# CLOCK_BOOTTIME is Linux's; elsewhere the monotonic clock is the best there is.
SUSPEND_AWARE = hasattr(time, "CLOCK_BOOTTIME")
_CLOCK_ID = getattr(time, "CLOCK_BOOTTIME", time.CLOCK_MONOTONIC)


class Clock(Protocol):
    def monotonic(self) -> float:
        """Seconds on a clock that never goes back and counts suspend; only differences mean
        anything."""


class MonotonicClock:
    """The local clock that never goes back: CLOCK_BOOTTIME where there is one."""

    def monotonic(self) -> float:
        return time.clock_gettime(_CLOCK_ID)


class FakeClock:
    """A clock that moves only when a test says so."""

    def __init__(self, start: float = 1000.0) -> None:
        self._now = start
        self._lock = threading.Lock()

    def monotonic(self) -> float:
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._now += seconds
