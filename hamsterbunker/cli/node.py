"""``hb run`` and ``hb init``: a node's flags, from the command line or a config file."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from ..agent.step import load_agent
from ..core.errors import ConfigError
from ..core.logs import configure_logging, log_level
from ..node.notify import Notifier
from ..ops.config import NodeConfig, load_instance, systemd_directory
from ..ops.provision import STATE_DIRECTORY  # where the unit lets a node write
from ..sealing.keyring import read_keyring
from ..stores import check_store_url, redacted_url
from .context import warn

__all__ = ["DEMO_AGENT", "NODE_FLAGS", "init", "run"]

# The demo counter: what `hb init` runs when no --agent is given.
DEMO_AGENT = "hamsterbunker.demo:CounterAgent"


# The node flags that a config file can set instead (``hb run --instance``).
NODE_FLAGS = (
    "store",
    "agent",
    "agent_id",
    "node_id",
    "region",
    "tick_ms",
    "lease_ttl_ms",
    "sync_delay_ms",
    "stop_grace_ms",
    "step_retry_ms",
    "step_retry_max_ms",
    "max_step_failures",
    "http",
    "hot_standby",
)


def node_config(args: argparse.Namespace, **defaults: str) -> NodeConfig:
    """The node flags as a NodeConfig; flags not given take NodeConfig's defaults."""
    given = {key: getattr(args, key) for key in NODE_FLAGS if getattr(args, key) is not None}
    given = defaults | given
    if "store" not in given and os.environ.get("HB_STORE"):
        given["store"] = os.environ["HB_STORE"]
    for key in ("store", "agent"):
        if key not in given:
            raise ConfigError(f"--{key} is required (or use --instance NAME)")
    return NodeConfig(**given)


def run(args: argparse.Namespace) -> int:
    from ..runtime import Runtime

    notifier = Notifier.from_environment()  # first: hides systemd's variables from the agent
    if args.instance is not None:
        clashing = [key for key in NODE_FLAGS if getattr(args, key) is not None]
        if clashing:
            flag = "--" + clashing[0].replace("_", "-")
            raise ConfigError(f"{flag} cannot be combined with --instance: set it in the file")
        config = load_instance(args.instance)
    else:
        config = node_config(args)
        config.check_sync_delay()  # a config file's is checked as it is read
    level = args.log_level or config.log_level
    if level is not None:
        configure_logging(log_level(level))
    secret = read_keyring(args.secret_file)
    state_dir = args.state_dir or systemd_directory("STATE_DIRECTORY")
    create_store = args.create_store or config.may_create_store()
    if config.agents:
        from .host import run_host

        run_host(config, secret, notifier, history=args.history, state_dir=state_dir,
                 create_store=create_store)  # fmt: skip
        return 0
    timing, step_retry = config.timing, config.step_retry
    agent = load_agent(config.agent)
    # Runtime checks ids before it opens the store (and creates it, if create_store).
    node = Runtime(
        node_id=config.node_id,
        region=config.region,
        store=config.store,
        agent=agent,
        agent_id=config.agent_id,
        secret=secret,
        timing=timing,
        history=args.history,
        notifier=notifier,
        state_dir=state_dir,
        stop_grace_ms=config.stop_grace_ms,
        step_retry=step_retry,
        http=config.http,
        sync_delay_ms=config.sync_delay_ms,
        create_store=create_store,
        hot_standby=config.hot_standby,
    )
    node.run()
    return 0


def init(args: argparse.Namespace) -> int:
    from ..ops.provision import choose_store, provision

    given = args.store or os.environ.get("HB_STORE")
    store = choose_store(args.name, given, local_only=args.local_only)
    config = node_config(args, store=store, agent=DEMO_AGENT)
    store_dir = check_store_url(config.store)  # before anything is written
    # Absolute, so that the printed scp command means the same on the other node.
    done = provision(args.name, config, args.config_dir.absolute(), force=args.force)
    print(f"wrote {done.config_path}")
    if args.agent is None:
        warn(
            f"hb init: no --agent given: {args.name} runs the demo counter ({DEMO_AGENT}). "
            f"For your own agent: hb init {args.name} --agent MODULE:ATTR --force (or edit "
            f"agent = in {done.config_path})"
        )
    if done.new_secret:
        print(f"wrote {done.secret_path} (a new random secret, readable by its owner only)")
    else:
        print(f"kept the existing secret {done.secret_path}")
    if done.creates_store:
        print(
            f"a new cluster: this node creates its store {redacted_url(config.store)} at its "
            f"first start (create_store_on in {done.config_path.name}); nodes given this "
            "secret join it and create none"
        )
    print(_next_steps(args.name, done.secret_path, store_dir, local_only=args.local_only))
    return 0


def _next_steps(name: str, secret_path: Path, store_dir: str | None, *, local_only: bool) -> str:
    if local_only:
        steps = f"""
Next step (a cluster of this one machine only):
  start the node now and at every boot:
       systemctl enable --now hamsterbunker@{name}"""
    else:
        steps = f"""
Next steps:
  1. Give every other node of this cluster the same secret, readable by root only:
       scp -p {secret_path} root@OTHER-NODE:{secret_path}
     and run `hb init {name} --store URL` there with the same store URL and its own
     --region and --node-id (it keeps that secret).
  2. On each node, start the node now and at every boot:
       systemctl enable --now hamsterbunker@{name}"""
    if store_dir is not None and not Path(os.path.normpath(store_dir)).is_relative_to(
        STATE_DIRECTORY
    ):
        steps += f"""
  The store {store_dir} lies outside {STATE_DIRECTORY}, which is all the unit may write:
  allow it with `systemctl edit hamsterbunker@{name}` and these two lines:
       [Service]
       ReadWritePaths={store_dir}
  and make it owned by the hamsterbunker user (the same UID on every node sharing it)."""
    return steps
