"""Whether a node of an agent is live, as a command that must not run beside one judges it
(``hb forget``, ``hb accept-loss``): its heartbeat and events watched from here, on this
machine's own clock, for one lease TTL, never comparing clocks across machines."""

from __future__ import annotations

import math
from collections.abc import Callable

from ..lease.observe import MAX_WATCH_S, POLL_S
from ..stores.tail import Tail, TailRead

__all__ = ["MIN_WATCH_S", "live_node", "watch_window"]

# The least a node is watched, whatever TTL a lease record says (it is not authenticated).
MIN_WATCH_S = 0.5


def watch_window(ttl_s: float) -> float:
    """How long to watch for a lease of ttl_s seconds."""
    return min(max(ttl_s, MIN_WATCH_S), MAX_WATCH_S)


def live_node(
    tail: Tail,
    first: TailRead,
    window_s: float,
    clock: Callable[[], float],
    sleep: Callable[[float], None],
    node: str | None = None,
) -> tuple[str, float] | None:
    """The first node (node alone, if given) whose heartbeat changed from first's (written,
    or removed) or that wrote an event while watched for window_s, and how many seconds into
    the watch; None if none did."""
    beats = {beat.node: beat for beat in first.heartbeats}
    started = clock()
    for _ in range(math.ceil(window_s / POLL_S) + 1):  # bounded even if the clock stands still
        left = started + window_s - clock()
        if left <= 0:
            break
        sleep(min(POLL_S, left))
        now = tail.read()
        current = {beat.node: beat for beat in now.heartbeats}
        changed = [
            name for name in beats.keys() | current.keys() if beats.get(name) != current.get(name)
        ]
        for found in [*changed, *(event.node for event in now.events)]:
            if node is None or found == node:
                return found, clock() - started
    return None
