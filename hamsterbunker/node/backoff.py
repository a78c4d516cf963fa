"""A failing step's retries: exponential backoff with jitter, and when to hand the lease over.

A success resets the count; the count and the last error go into heartbeats.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from dataclasses import dataclass

from ..core.clock import Clock
from ..core.timing import StepRetry
from ..records import MAX_SHOWN_ERROR

__all__ = ["Failing", "StepFailures", "describe", "pause_for"]


@dataclass(frozen=True)
class Failing:
    """The steps failing in a row now: how many, and the last error (type: message, short)."""

    count: int
    error: str


def describe(exc: BaseException) -> str:
    """An error as one short line: ``ValueError: the message``."""
    message = " ".join(str(exc).split())
    text = f"{type(exc).__name__}: {message}" if message else type(exc).__name__
    return text if len(text) <= MAX_SHOWN_ERROR else text[: MAX_SHOWN_ERROR - 1] + "…"


class StepFailures:
    """Consecutive step failures of one term, and the backoff they call for."""

    def __init__(self, retry: StepRetry, rand: Callable[[], float] = random.random) -> None:
        self._retry, self._rand = retry, rand
        self.now: Failing | None = None

    @property
    def count(self) -> int:
        return 0 if self.now is None else self.now.count

    def failed(self, exc: BaseException) -> float:
        """Note one more failure; the seconds to wait before the retry."""
        self.now = Failing(self.count + 1, describe(exc))
        return self.delay(self.now.count)

    def delay(self, count: int) -> float:
        """The wait after the count-th failure in a row: doubling, jittered, capped."""
        retry = self._retry
        base = retry.first_ms * 2.0 ** min(count - 1, 64)
        jittered = base * (1 + retry.jitter * (2 * self._rand() - 1))
        return min(retry.max_ms, jittered) / 1000

    def hand_over(self) -> bool:
        """Whether the failures in a row have reached the most the node tries before handing over."""
        most = self._retry.max_failures
        return most > 0 and self.count >= most

    def succeeded(self) -> None:
        self.now = None


async def pause_for(seconds: float, clock: Clock, tick_s: float, *ends: asyncio.Event) -> bool:
    """Wait that long on the node's clock; False at once if any of ends is set meanwhile."""
    until = clock.monotonic() + seconds
    while not any(end.is_set() for end in ends):
        remaining = until - clock.monotonic()
        if remaining <= 0:
            return True
        waiters = [asyncio.ensure_future(end.wait()) for end in ends]
        # A tick at most per wait: a clock that jumps (suspend, a test's) is seen soon.
        await asyncio.wait(
            waiters, timeout=min(remaining, tick_s), return_when=asyncio.FIRST_COMPLETED
        )
        for waiter in waiters:
            waiter.cancel()
    return False
