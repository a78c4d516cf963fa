"""``hb forget NODE --agent-id ID``: drop a dead node's heartbeat and events from the view
(``Store.forget_node``), refused while the node is seen live or holds the lease."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from dataclasses import dataclass

from ..core.errors import ConfigError, CorruptRecord
from ..core.timing import DEFAULT_LEASE_TTL_MS
from ..ops.status import printable
from ..ops.status_text import duration
from ..records import Event, Heartbeat, check_name
from ..sealing.keyring import Secret
from ..stores import Store
from .args import confirmed, not_on_syncdir, store_url
from .context import EXIT_FAILURE, known_agent, opened_store, store_sealer, warn
from .liveness import live_node, watch_window

__all__ = ["forget"]


@dataclass(frozen=True)
class _Seen:
    """What the store holds of the node: its heartbeat and its events."""

    heartbeat: Heartbeat | None
    events: list[Event]


def forget(
    args: argparse.Namespace,
    read_secret: Callable[[], Secret],
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Run ``hb forget``; the exit status (usage mistakes and store errors raise)."""
    if args.agent is not None:
        if args.node is not None or args.agent_id is not None:
            raise ConfigError("--agent ID forgets a whole agent: give no NODE and no --agent-id")
        return _forget_agent(args, read_secret, clock, sleep)
    if args.node is None or args.agent_id is None:
        raise ConfigError("give NODE and --agent-id ID (a node), or --agent ID (a whole agent)")
    agent = check_name("agent id", args.agent_id)
    node = check_name("node id", args.node)
    url = not_on_syncdir(store_url(args), "forgetting a node")
    secret = read_secret()
    with opened_store(url) as store:
        store_sealer(store, secret)  # WrongSecret before anything is read or changed
        return _forget(store, agent, node, clock, sleep)


def _forget(
    store: Store,
    agent: str,
    node: str,
    clock: Callable[[], float],
    sleep: Callable[[float], None],
) -> int:
    tail = store.tail(agent)
    first = tail.read()
    seen = _Seen(_beat_of(first.heartbeats, node), [e for e in first.events if e.node == node])
    if seen.heartbeat is None and not seen.events:
        return _say(f"no heartbeat or events of node {node} (agent {agent}) in {store.url}")
    holding, ttl_s = _lease_of(store, agent, node)
    if holding is not None:
        return _refused(holding)
    started = clock()
    live = live_node(tail, first, watch_window(ttl_s), clock, sleep, node=node)
    if live is not None:
        return _refused(
            f"node {node} of agent {agent} is live: its heartbeat or events changed "
            f"{duration(live[1])} into watching, as seen from here; "
            "stop it first (nothing changed)"
        )
    holding, _ttl = _lease_of(store, agent, node)  # it may have taken the lease meanwhile
    if holding is not None:
        return _refused(holding)
    store.forget_node(agent, node)
    print(f"forgot node {node} of agent {agent}: {_dropped(seen)}; "
          f"unchanged for {duration(clock() - started)}, as seen from here")  # fmt: skip
    return 0


def _forget_agent(
    args: argparse.Namespace,
    read_secret: Callable[[], Secret],
    clock: Callable[[], float],
    sleep: Callable[[float], None],
) -> int:
    """``hb forget --agent ID``: every record of the agent, once no node of it is seen live."""
    agent = check_name("agent id", args.agent)
    url = not_on_syncdir(store_url(args), "forgetting an agent")
    secret = read_secret()
    with opened_store(url) as store:
        store_sealer(store, secret)  # WrongSecret before anything is read or changed
        known_agent(store, agent)
        try:
            lease = store.read_lease(agent)
        except CorruptRecord:  # removed with the rest; watched for the default TTL
            lease = None
        ttl_s = (DEFAULT_LEASE_TTL_MS if lease is None else lease.ttl_ms) / 1000
        tail = store.tail(agent)
        live = live_node(tail, tail.read(), watch_window(ttl_s), clock, sleep)
        if live is not None:
            return _refused(
                f"node {live[0]} of agent {agent} is live: its heartbeat or events changed "
                f"{duration(live[1])} into watching, as seen from here; stop every node of "
                "it first (nothing changed)"
            )
        checkpoints = store.list_checkpoints(agent)
        newest = f", the newest seq {checkpoints[0].seq}" if checkpoints else ""
        print(f"agent {agent}: every record of it goes: {len(checkpoints)} checkpoints{newest}, "
              f"{len(store.read_inbox(agent))} submissions waiting, the heartbeats and events "
              f"of {len(store.list_heartbeats(agent))} nodes, the lease")  # fmt: skip
        if not confirmed(args, "Forget the agent? Type yes to go on: "):
            return EXIT_FAILURE
        store.forget_agent(agent)
    print(f"forgot agent {agent}")
    return 0


def _beat_of(heartbeats: list[Heartbeat], node: str) -> Heartbeat | None:
    return next((beat for beat in heartbeats if beat.node == node), None)


def _lease_of(store: Store, agent: str, node: str) -> tuple[str | None, float]:
    """(why node may not be forgotten because of the lease, or None; the lease's TTL in s)."""
    try:
        lease = store.read_lease(agent)
    except CorruptRecord as exc:
        return f"the lease record of agent {agent} is unreadable ({printable(str(exc))}): "\
            f"cannot tell whether node {node} holds it (nothing changed)", 0.0  # fmt: skip
    if lease is None:
        return None, DEFAULT_LEASE_TTL_MS / 1000
    if lease.holder == node:
        return (
            f"node {node} holds the lease of agent {agent} (epoch {lease.epoch}): a node is "
            "forgotten only once another has taken over (nothing changed)",
            0.0,
        )
    return None, lease.ttl_ms / 1000


def _dropped(seen: _Seen) -> str:
    parts = []
    beat = seen.heartbeat
    if beat is not None:
        parts.append(
            f"its heartbeat (host {printable(beat.host)}, pid {beat.pid}, last role "
            f"{printable(beat.role)}, epoch {beat.epoch})"
        )
    if seen.events:
        numbers = [e.n for e in seen.events]
        count = len(numbers)
        parts.append(f"{count} event{'s' if count != 1 else ''} (#{min(numbers)}..#{max(numbers)})")
    return " and ".join(parts)


def _refused(reason: str) -> int:
    return _say(f"refused: {reason}")


def _say(line: str) -> int:
    warn(f"hb forget: {line}")
    return EXIT_FAILURE
