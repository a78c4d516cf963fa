"""``hb run`` for a config with several ``[[agents]]``: one process keeps them all."""

from __future__ import annotations

from pathlib import Path

from ..agent.step import load_agent
from ..core.errors import ConfigError
from ..node.cluster import check_folder_store
from ..node.host import Host, HostNotifier, check_distinct
from ..node.notify import Notifier
from ..ops.config import NodeConfig
from ..runtime import Runtime
from ..sealing.keyring import Keyring
from ..stores import open_store

__all__ = ["run_host"]


def run_host(
    config: NodeConfig,
    secret: Keyring,
    notifier: Notifier,
    *,
    history: Path | None,
    state_dir: Path | None,
    create_store: bool,
) -> None:
    """Run every agent of config's [[agents]] in this process, on one store client, until
    a stop signal. With a history, each agent's goes to HISTORY.AGENT_ID. create_store:
    make the store if it does not exist yet (else ConfigError, nothing written)."""
    if config.http is not None:
        raise ConfigError(
            "http cannot be set with several [[agents]]: the endpoints describe one agent's "
            "node; run the agents that need them as nodes of their own"
        )
    agents = [load_agent(hosted.agent) for hosted in config.hosted()]
    if not create_store:
        check_folder_store(config.store)  # before opening it to write makes its folder
    # On a syncdir:// store this process writes its node's own subtree, for every agent.
    store = open_store(config.store, node=config.node_id, sync_delay_ms=config.sync_delay_ms)
    try:
        ids = [
            hosted.agent_id or agent.id
            for hosted, agent in zip(config.hosted(), agents, strict=True)
        ]
        check_distinct(ids)  # before any agent's node is made
        gathered = HostNotifier(notifier, ids)
        runtimes = [
            Runtime(
                node_id=config.node_id,
                region=config.region,
                store=store,
                agent=agent,
                agent_id=agent_id,
                secret=secret,
                timing=config.timing,
                history=None if history is None else f"{history}.{agent_id}",
                notifier=gathered.for_agent(agent_id),
                state_dir=state_dir,
                stop_grace_ms=config.stop_grace_ms,
                step_retry=config.step_retry,
                log_agent=True,
                create_store=create_store,
                hot_standby=config.hot_standby,
            )
            for agent, agent_id in zip(agents, ids, strict=True)
        ]
        Host(runtimes, gathered).run()
    finally:
        store.close()
