"""``hb run`` and ``hb init``: a node's flags, from the command line or a config file."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from ..agent.step import load_agent
from ..core.errors import ConfigError
from ..core.http_address import http_address_arg
from ..core.logs import LOG_LEVELS, configure_logging, log_level
from ..core.timing import (
    DEFAULT_LEASE_TTL_MS,
    DEFAULT_MAX_STEP_FAILURES,
    DEFAULT_STEP_RETRY_MAX_MS,
    DEFAULT_STEP_RETRY_MS,
    DEFAULT_STOP_GRACE_MS,
    DEFAULT_TICK_MS,
)
from ..node.notify import Notifier
from ..ops.config import DEFAULT_CONFIG_DIR, NodeConfig, load_instance, systemd_directory
from ..ops.provision import STATE_DIRECTORY  # where the unit lets a node write
from ..sealing.keyring import read_keyring
from ..stores import check_store_url, redacted_url
from .args import Subcommands, add_command, positive_int, whole_number
from .context import warn

__all__ = ["DEMO_AGENT", "NODE_FLAGS", "add_node_flags", "init", "run"]

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
)


def add_node_flags(parser: argparse.ArgumentParser) -> None:
    # Defaults are None so that a flag given alongside --instance can be told apart.
    parser.add_argument(
        "--store",
        help="store URL, e.g. file:///srv/hamsterbunker (default: $HB_STORE, which keeps "
        "a password in the URL off the command line, where every user can read it)",
    )
    parser.add_argument("--agent", metavar="MODULE:ATTR", help="the agent to run")
    parser.add_argument("--agent-id", help="agent id (default: the agent object's id)")
    parser.add_argument("--node-id", help="default: the host name")
    parser.add_argument("--region", help="where this node runs (default: local)")
    parser.add_argument("--tick-ms", type=positive_int, help=f"default: {DEFAULT_TICK_MS}")
    parser.add_argument(
        "--lease-ttl-ms", type=positive_int, help=f"default: {DEFAULT_LEASE_TTL_MS}"
    )
    parser.add_argument(
        "--sync-delay-ms",
        type=positive_int,
        help="with a syncdir:// store (and required there): the longest the sync tool takes "
        "to bring a file to the other machines; the lease TTL must be at least "
        "2 × (tick + this)",
    )
    parser.add_argument(
        "--stop-grace-ms",
        type=whole_number,
        help="how long a stop (SIGTERM) lets the step in flight finish and be published "
        f"before it is cancelled; keep it below the unit's TimeoutStopSec "
        f"(default: {DEFAULT_STOP_GRACE_MS})",
    )
    parser.add_argument(
        "--step-retry-ms",
        type=positive_int,
        help="a step that raised is retried after this long, doubling (±20%% jitter) up to "
        f"--step-retry-max-ms (default: {DEFAULT_STEP_RETRY_MS})",
    )
    parser.add_argument(
        "--step-retry-max-ms",
        type=positive_int,
        help=f"the longest wait between retries of a failing step (default: "
        f"{DEFAULT_STEP_RETRY_MAX_MS})",
    )
    parser.add_argument(
        "--max-step-failures",
        type=whole_number,
        metavar="N",
        help="after N failed steps in a row, hand the lease to another node and hold off "
        f"taking it back for --step-retry-max-ms; 0: never (default: {DEFAULT_MAX_STEP_FAILURES})",
    )
    parser.add_argument(
        "--http",
        type=http_address_arg,
        metavar="HOST:PORT",
        help="serve /metrics (Prometheus), /health, /leader and /status there, e.g. "
        "127.0.0.1:9100 (default: off)",
    )


def add_run_parser(sub: Subcommands, secret_help: str) -> None:
    run = add_command(
        sub,
        "run",
        "run one node of a cluster",
        "Run one node, configured by --instance NAME (a config file) or by flags.",
        secret_help,
    )
    run.add_argument(
        "--instance",
        metavar="NAME",
        help=f"read the config of instance NAME from {DEFAULT_CONFIG_DIR}/NAME.toml "
        "(or $CONFIGURATION_DIRECTORY/NAME.toml); no node flags may be given with it",
    )
    add_node_flags(run)
    run.add_argument(
        "--create-store",
        action="store_true",
        help="create the store if it does not exist yet (no node has run on it): for the "
        "first node of a new cluster. Without it a store is only created by the node whose "
        "config hb init wrote with a new secret (create_store_on); any other refuses, so "
        "that a mistyped URL does not start the agent over in a new, empty store",
    )
    run.add_argument("--secret-file", type=Path, help="file holding the network secret")
    run.add_argument(
        "--state-dir",
        type=Path,
        metavar="DIR",
        help="where the node remembers the store's highest epoch and seq across its restarts, "
        "to notice a store that went back in time while it was down "
        "(default: $STATE_DIRECTORY, which systemd sets; none without it)",
    )
    run.add_argument(
        "--history",
        type=Path,
        metavar="FILE",
        help="append a JSON line per lease and checkpoint operation (for fault analysis; "
        "check it with python -m hamsterbunker.ops.checker FILE); with several [[agents]], "
        "one file per agent, FILE.AGENT_ID",
    )
    run.add_argument(
        "--log-level",
        choices=LOG_LEVELS,
        type=str.lower,
        help="the least important events logged: debug adds every step and message; "
        "warning keeps what needs a look (default: the config's log_level, or info)",
    )


def add_init_parser(sub: Subcommands) -> None:
    init = sub.add_parser(
        "init",
        help="write the config and secret of a node run by hamsterbunker@NAME.service",
    )
    init.add_argument("name", metavar="NAME", help="the instance name (hamsterbunker@NAME)")
    add_node_flags(init)
    init.add_argument(
        "--local-only",
        action="store_true",
        help=f"a cluster of this one machine, on the store file://{STATE_DIRECTORY}/NAME "
        "(without it, --store is required: every node of a cluster must share one store)",
    )
    init.add_argument(
        "--config-dir",
        type=Path,
        default=DEFAULT_CONFIG_DIR,
        help=f"where to write NAME.toml and NAME.secret (default: {DEFAULT_CONFIG_DIR})",
    )
    init.add_argument("--force", action="store_true", help="replace an existing NAME.toml")


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
