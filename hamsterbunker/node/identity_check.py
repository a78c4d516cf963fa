"""A node refuses to start under a node id that another live process is using.

Another process's heartbeat of the same id blocks the start only if it moves while
watched on this node's clock for about a lease TTL (docs/design.md, "The node").
"""

from __future__ import annotations

import asyncio
import logging
import math

from ..core.clock import Clock
from ..core.errors import ConfigError, StoreError
from ..core.timing import LeaseTiming
from ..records import PROCESS_SESSION, Heartbeat
from ..stores import Store
from .calls import NodeCalls

__all__ = ["DuplicateNodeId", "check_node_id_free"]

log = logging.getLogger("hamsterbunker.node")

# How the heartbeat of another process is told apart from a copy of the same one.
_Mark = tuple[str, str, int, int]


class DuplicateNodeId(ConfigError):
    """Another live process is beating under this node id: this one refuses to start."""


def _mark(heartbeat: Heartbeat) -> _Mark:
    return (heartbeat.session, heartbeat.host, heartbeat.pid, heartbeat.beats)


def _refusal(node: str, agent: str, heartbeat: Heartbeat) -> DuplicateNodeId:
    return DuplicateNodeId(
        f"node id {node!r} is already in use for agent {agent!r} by a live node on host "
        f"{heartbeat.host!r} (pid {heartbeat.pid}): give each node its own --node-id "
        "(the default, the host name, repeats on cloned machines and containers)"
    )


async def check_node_id_free(
    store: Store,
    agent: str,
    node: str,
    *,
    timing: LeaseTiming,
    clock: Clock,
    calls: NodeCalls,
) -> None:
    """Raise DuplicateNodeId if another process's heartbeat of ``node`` moves within
    about a lease TTL (at least three ticks); return at once if there is none. A store
    error only means nothing was learned from that read.
    """

    async def current() -> Heartbeat | None:
        try:
            beats = await calls.io(store.list_heartbeats, agent)
        except StoreError as exc:
            log.debug("%s: heartbeats not read for the node-id check: %s", node, exc)
            return None
        for heartbeat in beats:
            if heartbeat.node == node and heartbeat.session != PROCESS_SESSION:
                return heartbeat
        return None

    first = await current()
    if first is None:
        return
    window = max(timing.lease_ttl_s, 3 * timing.tick_s)
    poll = max(0.02, min(timing.tick_s / 2, 0.5))
    log.info(
        "%s: a heartbeat of this node id from host %s (pid %d) is in the store: "
        "watching it for %.1f s to tell whether that node is live",
        node, first.host, first.pid, window,
    )  # fmt: skip
    deadline = clock.monotonic() + window
    for _ in range(math.ceil(window / poll) + 1):  # bounded even if the clock stands still
        if clock.monotonic() >= deadline:
            break
        await asyncio.sleep(min(poll, deadline - clock.monotonic()))
        seen = await current()
        if seen is not None and _mark(seen) != _mark(first):
            raise _refusal(node, agent, seen)
    log.info("%s: the heartbeat of this node id did not move: a stale one, overwritten", node)
