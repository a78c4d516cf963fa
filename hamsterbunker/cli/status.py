"""``hb status``: a cluster's status, and a health check by its exit code (0 healthy, 1
degraded, 2 cannot tell); the lease's liveness is watched from here
(``hamsterbunker.lease.observe``). Without an agent id: the store's only agent in full, or
one line per agent."""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict
from typing import Any

from ..core.errors import ConfigError, StoreError, StoreUnsafe
from ..core.timing import DEFAULT_TICK_MS
from ..lease.observe import LIVE, MAX_WATCH_S, NOT_WATCHED, UNKNOWN, LeaseObserver, Observed
from ..ops.config import NodeConfig, load_instance
from ..ops.status import printable, snapshot, syncdir_shown
from ..ops.status_text import duration, render, syncdir_lines, table
from ..records import check_name
from ..stores import Store
from .args import store_url
from .context import known_agent, opened_store, warn

__all__ = ["status"]

EXIT_HEALTHY, EXIT_DEGRADED, EXIT_ERROR = 0, 1, 2


def status(args: argparse.Namespace) -> int:
    config = _instance(args)
    url = config.store if config else store_url(args, ", or use --instance NAME")
    agent = args.agent_id or (config.agent_id if config else None)
    if agent is not None:
        check_name("agent id", agent)
    tick_s = (config.tick_ms if config else DEFAULT_TICK_MS) / 1000
    limit_s = MAX_WATCH_S if args.observe_ms is None else args.observe_ms / 1000
    try:
        # A reader: on a syncdir:// store it writes nothing and needs no node id; the sync
        # delay is shown if the instance config states it.
        sync_delay_ms = config.sync_delay_ms if config else None
        with opened_store(url, sync_delay_ms=sync_delay_ms) as store:
            return _looks(args, store, agent, LeaseObserver(store, limit_s=limit_s), tick_s)
    except StoreUnsafe:
        raise  # a user mistake: hb's own line, exit 2
    except StoreError as exc:
        # Not "degraded" (1): the store did not answer, so status cannot tell.
        warn(f"hb status: failed: {exc}")
        return EXIT_ERROR


def _instance(args: argparse.Namespace) -> NodeConfig | None:
    if args.instance is None:
        return None
    if args.store is not None:
        raise ConfigError("--store cannot be combined with --instance: it is in the file")
    return load_instance(args.instance)


def _looks(
    args: argparse.Namespace, store: Store, agent: str | None, observer: LeaseObserver, tick: float
) -> int:
    agents = _agents(store, agent)
    refreshes = 0
    while True:
        code, text = _one(store, agents, observer, as_json=args.json)
        if args.watch and not args.json and sys.stdout.isatty():
            text = "\x1b[H\x1b[2J" + text  # a screen, refreshed in place
        print(text, flush=True)
        refreshes += 1
        if not args.watch or (args.count is not None and refreshes >= args.count):
            return code
        time.sleep(tick)
        if not args.json and not sys.stdout.isatty():
            print(flush=True)


def _agents(store: Store, agent: str | None) -> list[str]:
    """The agents to show: the one asked for, if the store holds it, else the store's."""
    if agent is not None:
        return [known_agent(store, agent)]
    held = store.list_agents()
    if not held:
        raise ConfigError(f"store {store.url} holds no agents yet (no node has run there)")
    return held


def _one(
    store: Store, agents: list[str], observer: LeaseObserver, as_json: bool
) -> tuple[int, str]:
    """(exit code, text) of one look: one agent in full, or one line per agent."""
    if len(agents) == 1:
        found = snapshot(store, agents[0], observer)
        return found.exit_code, found.to_json() if as_json else render(found)
    observed = observer.observe(agents)
    rows = [_row(store, agent, observed[agent]) for agent in agents]
    code = EXIT_DEGRADED if any(row["problems"] for row in rows) else EXIT_HEALTHY
    syncdir = syncdir_shown(store, None)  # a syncdir:// store's own report; None otherwise
    if as_json:
        doc = {"store": store.url, "agents": rows, "exit_code": code}
        if syncdir is not None:
            doc["syncdir"] = asdict(syncdir)
        return code, json.dumps(doc, indent=2, sort_keys=True)
    lines = [f"store {store.url} · {len(agents)} agents"]
    lines += table([("AGENT", "LEADER", "LEASE", "HEALTH")] + [
        (row["agent"], row["leader"] or "-", row["lease"], "; ".join(row["problems"]) or "healthy")
        for row in rows
    ])  # fmt: skip
    if syncdir is not None:
        lines += syncdir_lines(syncdir, agent=False)
    return code, "\n".join(lines)


def _row(store: Store, agent: str, seen: Observed) -> dict[str, Any]:
    live, lease = seen.liveness, seen.lease
    problems = []
    if seen.lease_error is not None:
        problems.append("lease record unreadable")
    elif live.state not in (LIVE, UNKNOWN, NOT_WATCHED):
        problems.append(f"no live leader (lease {live.state})")
    failing = [b.node for b in store.list_heartbeats(agent) if b.failing]
    problems += [
        f"{printable(node)} failing" for node in failing if node == (lease and lease.holder)
    ]
    state = live.state
    if live.state == LIVE and live.changed_s_ago is not None:
        state += f" (changed {duration(live.changed_s_ago)} ago, as seen from here)"
    holder = lease.holder if lease else None
    return {
        "agent": agent,
        "leader": printable(holder) if holder else None,
        "epoch": lease.epoch if lease else None,
        "lease": state,
        "liveness": asdict(live),
        "problems": problems,
    }
