"""``hb-tui``: the live monitor, on a store URL, on an instance's config file, or on a demo.

User mistakes (a bad URL, a missing config file, a bad agent id, Textual not
installed) print one line and exit 2, with no traceback, as ``hb`` does. The
monitor only reads the store, and never needs the secret.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from hamsterbunker.agent.step import load_agent
from hamsterbunker.cli.context import known_agent
from hamsterbunker.core.errors import ConfigError, HamsterbunkerError, StoreUnsafe
from hamsterbunker.ops.config import load_instance
from hamsterbunker.records import check_name
from hamsterbunker.sealing.keyring import Secret
from hamsterbunker.stores import Store, open_store

if TYPE_CHECKING:
    from .app import MonitorApp

__all__ = ["main"]

EXIT_FAILURE = 1
EXIT_USAGE = 2


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="hb-tui",
        description="Live monitor of a HamsterBunker cluster: nodes, lease, takeovers, events.",
        epilog="Keys: k kills the active node (if it runs on this machine), s switches over, "
        "p pauses or resumes (these two need the secret), f filters the events, q quits.",
    )
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--store", metavar="URL", help="store URL, e.g. file:///srv/hamsterbunker")
    where.add_argument(
        "--instance",
        metavar="NAME",
        help="read the store and agent id from NAME.toml, the config of hb run --instance NAME",
    )
    where.add_argument(
        "--demo",
        action="store_true",
        help="start the local three-node demo, watch it, and stop it on exit",
    )
    parser.add_argument(
        "--agent-id", help="the agent to watch (required with --store; overrides --instance's)"
    )
    parser.add_argument(
        "--secret-file",
        type=Path,
        metavar="PATH",
        help="the cluster secret, for the s (switchover) and p (pause) keys; or HB_SECRET. "
        "Watching needs no secret",
    )
    return parser


@dataclass(frozen=True)
class _Target:
    store_url: str
    agent_id: str
    sync_delay_ms: int | None = None  # a syncdir store's, as the instance config states it


def _target(args: argparse.Namespace) -> _Target:
    """Where to look, from the flags or the instance's config file; ConfigError if unclear."""
    if args.store is not None:
        if args.agent_id is None:
            raise ConfigError("--agent-id is required with --store")
        return _Target(args.store, check_name("agent id", args.agent_id))
    config = load_instance(args.instance)
    agent_id = args.agent_id or config.agent_id
    if agent_id is None:
        # The file leaves the id to the agent object, as hb run does.
        try:
            agent_id = load_agent(config.agent).id
        except ConfigError as exc:
            raise ConfigError(f"{exc}; or pass --agent-id") from None
    return _Target(config.store, check_name("agent id", agent_id), config.sync_delay_ms)


def _secret(secret_file: Path | None) -> Secret | None:
    """The secret as hb reads it; None if none is given (a given one that fails is an error)."""
    from hamsterbunker.cli.main import read_secret

    given = secret_file is not None or bool(os.environ.get("HB_SECRET"))
    try:
        return read_secret(secret_file)
    except ConfigError:
        if given:
            raise  # given, and unusable: the user's mistake, said in one line
        return None


def _import_app() -> type[MonitorApp]:
    try:
        from .app import MonitorApp
    except ImportError as exc:
        if exc.name is not None and exc.name.split(".")[0] in ("textual", "rich"):
            raise ConfigError(
                "hb-tui needs Textual, which is not installed: pip install 'hamsterbunker[tui]'"
            ) from None
        raise
    return MonitorApp


def _run(args: argparse.Namespace) -> int:
    if args.demo and args.agent_id is not None:
        raise ConfigError("--agent-id cannot be combined with --demo (it watches the counter)")
    monitor_app = _import_app()  # before anything starts: no demo nodes for nothing
    if not args.demo:
        target = _target(args)
        secret = _secret(args.secret_file)
        # A reader: on a syncdir:// store it needs no node id and writes nothing, as hb
        # status; the sync delay is only shown, and known only from an instance config.
        store: Store = open_store(
            target.store_url, create=False, sync_delay_ms=target.sync_delay_ms
        )
        if args.agent_id is not None:  # typed here: a typo must not show an empty monitor
            known_agent(store, target.agent_id)
        app = monitor_app(store, target.agent_id, secret=secret)
        app.run()
        return app.return_code or 0

    from .demo import DEMO_AGENT_ID, prepare_demo

    run = prepare_demo()  # the nodes are started by the app, once its screen is up
    try:
        app = monitor_app(open_store(run.store_url), DEMO_AGENT_ID, demo=run.cluster)
        app.run()
        return app.return_code or 0
    finally:
        print("hb-tui: stopping the demo nodes", file=sys.stderr)
        run.stop()


def main(argv: list[str] | None = None) -> int:
    args = _build_parser().parse_args(argv)
    try:
        return _run(args)
    except (ConfigError, StoreUnsafe) as exc:
        print(f"hb-tui: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except HamsterbunkerError as exc:
        print(f"hb-tui: failed: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    except KeyboardInterrupt:
        return 130
