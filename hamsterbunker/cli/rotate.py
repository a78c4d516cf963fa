"""``hb rotate-secret begin | commit | finish``: the command line of
``hamsterbunker.rotation``."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from ..core.errors import ConfigError
from ..records import check_name
from ..rotation import Rotation
from ..sealing.keyring import Keyring
from ..stores.base import Refusal
from .args import Subcommands, add_command, seconds, store_url
from .context import opened_store

__all__ = ["add_rotate_parser", "rotate_secret"]

DEFAULT_TIMEOUT_S = 60.0

ROTATE_HELP = """\
Rotate the cluster's secret without stopping the agent, in three steps, each
refused (exit 1, nothing changed) until it is safe; each may be run again:

  begin   every live node must already hold the new secret (restart them one by
          one with the new secret first and the old one after it); the cluster
          then seals with the new key, and this waits until every live node does
  commit  re-seals every retained checkpoint under the new key
  finish  drops the old key: nodes holding only the old secret are refused

Give this command both secrets, the new one first: HB_SECRET=new and
HB_SECRET_PREVIOUS=old, or a secret file with the new one on its first line.

exit status: 0 done; 1 refused (nothing changed) or the store failed; 2 a usage
mistake or secrets that do not open the cluster."""


def add_rotate_parser(sub: Subcommands, secret_help: str) -> None:
    parser = add_command(
        sub,
        "rotate-secret",
        "rotate the cluster's secret online (begin, commit, finish)",
        ROTATE_HELP,
    )
    parser.add_argument("step", choices=("begin", "commit", "finish"))
    parser.add_argument("--store", help="store URL (default: $HB_STORE)")
    parser.add_argument("--agent-id", required=True)
    parser.add_argument("--secret-file", type=Path, help=secret_help)
    parser.add_argument(
        "--timeout",
        type=seconds,
        default=DEFAULT_TIMEOUT_S,
        metavar="S",
        help="how long begin and commit wait for every live node to seal with the new key "
        f"(default: {DEFAULT_TIMEOUT_S:g}; at least 9 lease TTLs: a node reads the cluster "
        "record every 4)",
    )


def rotate_secret(args: argparse.Namespace, read_keyring: Callable[[], Keyring]) -> int:
    agent = check_name("agent id", args.agent_id)
    url = store_url(args)
    keyring = read_keyring()
    with opened_store(url) as store:
        if Refusal.KEY_ROTATION in store.report().refuses:  # said before anything is read
            raise ConfigError(
                f"store {store.url} does not rotate keys: rotation rewrites records every "
                "node shares, which this store cannot do (a syncdir:// store: a synced "
                "folder keeps one of two copies of a rewritten file); nothing was changed"
            )
        rotation = Rotation(store, agent, keyring, say=lambda line: print(line, flush=True))
        if args.step == "begin":
            rotation.begin(args.timeout)
        elif args.step == "commit":
            rotation.commit(args.timeout)
        else:
            rotation.finish()
    return 0
