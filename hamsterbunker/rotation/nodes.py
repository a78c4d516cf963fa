"""Which nodes are live (their heartbeat changes while watched), and which keys they hold
and seal with (``Heartbeat.keys``, ``Heartbeat.sealing``): what a rotation waits on.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from ..records import Heartbeat
from ..stores import Store

__all__ = ["KEYS_READ_TTLS", "LiveNode", "lease_ttl_s", "live_nodes", "wait_until_sealing"]

# How often a running node reads the cluster record to follow a rotation, in lease TTLs
# (hamsterbunker.node.keys); a wait for every node to follow allows for this and more.
KEYS_READ_TTLS = 4

# How often the watch reads the heartbeats: a few reads a second, for a second or two.
POLL_S = 0.1
# A node writes its heartbeat every half TTL at least: watched 1.5 TTLs, a live one shows.
WATCH_TTLS = 1.5
DEFAULT_TTL_S = 2.0


@dataclass(frozen=True)
class LiveNode:
    agent: str
    heartbeat: Heartbeat

    @property
    def name(self) -> str:
        return f"{self.heartbeat.node} (agent {self.agent})"


def lease_ttl_s(store: Store, agents: list[str]) -> float:
    """The longest lease TTL of agents (their lease records say), or the default."""
    ttls = [lease.ttl_ms / 1000 for agent in agents if (lease := store.read_lease(agent))]
    return max(ttls, default=DEFAULT_TTL_S)


def live_nodes(
    store: Store,
    agents: list[str],
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> list[LiveNode]:
    """The nodes of agents whose heartbeat changes while watched (1.5 lease TTLs at most),
    each with its newest heartbeat."""
    window = WATCH_TTLS * lease_ttl_s(store, agents)
    first = {
        (agent, hb.node): hb.change_key() for agent in agents for hb in store.list_heartbeats(agent)
    }
    live: dict[tuple[str, str], Heartbeat] = {}
    started = clock()
    while clock() - started < window:
        sleep(POLL_S)
        for agent in agents:
            for hb in store.list_heartbeats(agent):
                if first.get((agent, hb.node)) != hb.change_key():
                    live[(agent, hb.node)] = hb
        if len(live) == len(first) and set(live) >= set(first):
            break  # every node seen beating: no need to watch on
    return [LiveNode(agent, hb) for (agent, _node), hb in sorted(live.items())]


def wait_until_sealing(
    store: Store,
    nodes: list[LiveNode],
    key_id: str,
    timeout_s: float,
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> list[LiveNode]:
    """Wait until each of nodes seals with key_id, or is gone; the ones that do not yet.

    Waits at least long enough for a node to read the record twice, whatever timeout_s.
    """
    agents = sorted({node.agent for node in nodes})
    follow_s = (2 * KEYS_READ_TTLS + 1) * lease_ttl_s(store, agents) if nodes else 0.0
    deadline = clock() + max(timeout_s, follow_s)
    waiting = list(nodes)
    while waiting:
        beats = {
            (agent, hb.node): hb
            for agent in {node.agent for node in waiting}
            for hb in store.list_heartbeats(agent)
        }
        still = []
        for node in waiting:
            hb = beats.get((node.agent, node.heartbeat.node))
            if hb is not None and hb.sealing != key_id and hb.session == node.heartbeat.session:
                still.append(LiveNode(node.agent, hb))
        waiting = still
        if not waiting or clock() >= deadline:
            break
        sleep(POLL_S)
    return waiting
