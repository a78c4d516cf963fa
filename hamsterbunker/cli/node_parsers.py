"""The flags of ``hb run`` and ``hb init`` (the ``hb`` parser adds them only when one of
them runs: their defaults come from the node's config)."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..core.http_address import http_address_arg
from ..core.logs import LOG_LEVELS
from ..core.timing import (
    DEFAULT_LEASE_TTL_MS,
    DEFAULT_MAX_STEP_FAILURES,
    DEFAULT_STEP_RETRY_MAX_MS,
    DEFAULT_STEP_RETRY_MS,
    DEFAULT_STOP_GRACE_MS,
    DEFAULT_TICK_MS,
)
from .args import Subcommands, add_command, positive_int, whole_number

__all__ = ["INIT_HELP", "RUN_HELP", "add_init_parser", "add_node_flags", "add_run_parser"]

RUN_HELP = "run one node of a cluster"
INIT_HELP = "write the config and secret of a node run by hamsterbunker@NAME.service"


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
    parser.add_argument(
        "--no-hot-standby",
        dest="hot_standby",
        action="store_const",
        const=False,
        help="as a standby, keep no copy of the newest checkpoint in memory (kept by "
        "default, so that a takeover reads none: off for states too large to hold twice)",
    )


def add_run_parser(sub: Subcommands, secret_help: str) -> None:
    from ..ops.config import DEFAULT_CONFIG_DIR

    run = add_command(
        sub,
        "run",
        RUN_HELP,
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
    from ..ops.config import DEFAULT_CONFIG_DIR
    from ..ops.provision import STATE_DIRECTORY  # where the unit lets a node write

    init = sub.add_parser("init", help=INIT_HELP)
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


# -- hb switchover, pause, resume, history, accept-loss --------------------------------------
