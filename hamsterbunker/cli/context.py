"""What the ``hb`` commands share: their exit codes, their lines on stderr, and on an existing
store (never made anew: a mistyped URL must not make an empty store) its sealer."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

from ..core.errors import ConfigError
from ..records import ClusterRecord
from ..sealing import Sealer
from ..sealing.keyring import Keyring
from ..stores import Store, open_store
from ..stores.base import MAX_LISTED_AGENTS

__all__ = [
    "EXIT_FAILURE",
    "EXIT_REFUSED",
    "EXIT_TIMEOUT",
    "EXIT_USAGE",
    "holds",
    "known_agent",
    "opened_store",
    "sealer_deriving",
    "store_sealer",
    "warn",
]

Secret = str | Keyring

EXIT_FAILURE = 1  # refused (nothing changed), or a store that failed
EXIT_USAGE = 2  # a user mistake: a bad flag, URL, agent path or secret
# The node refused to resume (no checkpoint authenticates, or the store went
# back in time): restarting cannot fix that, a person has to look.
EXIT_REFUSED = 3
EXIT_TIMEOUT = 124  # hb submit or hb switchover --wait ran out (as timeout(1) exits)


def warn(line: str) -> None:
    """Print line on stderr."""
    print(line, file=sys.stderr, flush=True)


@contextmanager
def opened_store(url: str, **options: Any) -> Iterator[Store]:
    """The store at url, which must exist, closed once the command is done with it."""
    store = open_store(url, create=False, **options)
    try:
        yield store
    finally:
        store.close()


def store_sealer(store: Store, secret: Secret) -> Sealer:
    """The store's sealer for secret (WrongSecret before anything is read or changed);
    ConfigError if no node has made its cluster record."""
    return Sealer(secret, _cluster_record(store))


@contextmanager
def sealer_deriving(store: Store, secret: Secret) -> Iterator[Future[Sealer]]:
    """store_sealer's sealer, made in a thread: its key's derivation (scrypt, some 0.1 s,
    which frees the GIL) runs while the command loads and reads the store. A wrong secret
    is still what the command says, over anything else that went wrong meanwhile."""
    cluster = _cluster_record(store)
    with ThreadPoolExecutor(1, thread_name_prefix="hb-key") as pool:
        sealer = pool.submit(Sealer, secret, cluster)
        try:
            yield sealer
        finally:
            sealer.result()


def _cluster_record(store: Store) -> ClusterRecord:
    cluster = store.read_cluster()
    if cluster is None:
        raise ConfigError(f"store {store.url} has no cluster record: no node has run on it")
    return cluster


def known_agent(store: Store, agent: str) -> str:
    """agent, if the store holds records of it; else ConfigError naming the agents it does
    hold: a mistyped id must not make a new agent, nor a command succeed on nothing."""
    held = store.list_agents()
    # A listing stops at MAX_LISTED_AGENTS: past that, ask the agent's own records.
    capped = len(held) >= MAX_LISTED_AGENTS
    if agent in held or (capped and store.list_heartbeats(agent)):
        return agent
    raise ConfigError(f"store {store.url} holds no records of agent {agent!r}; {holds(held)}")


def holds(held: list[str]) -> str:
    """What agents a store holds, for a message."""
    if not held:
        return "it holds no agents"
    shown = ", ".join(held[:20]) + (f" and {len(held) - 20} more" if len(held) > 20 else "")
    return f"it holds: {shown}"
