"""``hb``: run a node, run the local survival demo, show a cluster's status.

User mistakes (a bad flag, URL, agent path or secret) print one line naming
the problem and exit 2, with no traceback.
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
import sys
from pathlib import Path
from typing import NoReturn

from .agent import load_agent
from .errors import ConfigError, HamsterbunkerError, SealError, StoreError, StoreUnsafe
from .sealing import check_secret
from .stores import open_store

__all__ = ["main"]

EXIT_FAILURE = 1
EXIT_USAGE = 2

SECRET_HELP = """\
the network secret (at least 8 characters) is taken from, in this order:
  1. the environment variable HB_SECRET
  2. the file named by --secret-file
  3. $CREDENTIALS_DIRECTORY/secret (systemd LoadCredential=secret:...)
Never pass it on the command line: every user can read that."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be above 0")
    return value


def _build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="hb", description="HamsterBunker: keep an agent alive across machines.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    run = sub.add_parser(
        "run",
        help="run one node of a cluster",
        epilog=SECRET_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    run.add_argument("--store", required=True, help="store URL, e.g. file:///srv/hamsterbunker")
    run.add_argument("--agent", required=True, metavar="MODULE:ATTR", help="the agent to run")
    run.add_argument("--agent-id", help="agent id (default: the agent object's id)")
    run.add_argument("--node-id", default=socket.gethostname(), help="default: the host name")
    run.add_argument("--region", default="local", help="where this node runs (default: local)")
    run.add_argument("--tick-ms", type=_positive_int, default=400)
    run.add_argument("--lease-ttl-ms", type=_positive_int, default=2000)
    run.add_argument("--secret-file", type=Path, help="file holding the network secret")
    run.add_argument(
        "--history",
        type=Path,
        metavar="FILE",
        help="append a JSON line per lease and checkpoint operation (for fault analysis; "
        "check it with python -m hamsterbunker.checker FILE)",
    )

    demo = sub.add_parser("demo", help="the local three-node survival demo")
    demo.add_argument("--kills", type=_positive_int, default=1, help="kill the active node N times")
    demo.add_argument("--store", help="store URL (default: a temporary directory)")
    demo.add_argument("--tick-ms", type=_positive_int, default=400)
    demo.add_argument("--lease-ttl-ms", type=_positive_int, default=2000)

    status = sub.add_parser("status", help="show lease, nodes and checkpoints of an agent")
    status.add_argument("--store", required=True, help="store URL")
    status.add_argument("--agent-id", required=True)
    status.add_argument("--json", action="store_true", help="print JSON")
    return parser


def read_secret(secret_file: Path | None) -> str:
    """The secret from HB_SECRET, --secret-file, or the systemd credential, in that order."""
    if os.environ.get("HB_SECRET"):
        return check_secret(os.environ["HB_SECRET"])
    candidates = [secret_file] if secret_file else []
    if os.environ.get("CREDENTIALS_DIRECTORY"):
        candidates.append(Path(os.environ["CREDENTIALS_DIRECTORY"]) / "secret")
    for path in candidates:
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            if path is secret_file:
                raise ConfigError(f"secret file {path} does not exist") from None
            continue
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"secret file {path} cannot be read: {exc}") from exc
        return check_secret(text.rstrip("\r\n"))
    raise ConfigError("no secret given: set HB_SECRET, pass --secret-file, or use LoadCredential")


def _cmd_run(args: argparse.Namespace) -> int:
    from .runtime import Runtime

    secret = read_secret(args.secret_file)
    agent = load_agent(args.agent)
    # Runtime checks ids and timing before it opens (and may create) the store.
    node = Runtime(
        node_id=args.node_id,
        region=args.region,
        store=args.store,
        agent=agent,
        agent_id=args.agent_id,
        secret=secret,
        tick_ms=args.tick_ms,
        lease_ttl_ms=args.lease_ttl_ms,
        history=args.history,
    )
    node.run()
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from .demo import DemoFailed, run_demo

    try:
        run_demo(
            kills=args.kills,
            store_url=args.store,
            tick_ms=args.tick_ms,
            lease_ttl_ms=args.lease_ttl_ms,
            out=lambda line: print(line, flush=True),
        )
    except DemoFailed as exc:
        print(exc, file=sys.stderr)
        return EXIT_FAILURE
    return 0


def _cmd_status(args: argparse.Namespace) -> int:
    from .records import check_name
    from .status import render, snapshot

    agent_id = check_name("agent id", args.agent_id)
    status = snapshot(open_store(args.store, create=False), agent_id)
    print(status.to_json() if args.json else render(status))
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    logging.getLogger("watchfiles").setLevel(logging.WARNING)
    commands = {"run": _cmd_run, "demo": _cmd_demo, "status": _cmd_status}
    try:
        return commands[args.command](args)
    except (ConfigError, SealError, StoreUnsafe) as exc:
        # A user mistake: a bad URL, agent, secret or store location.
        print(f"hb {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except (StoreError, HamsterbunkerError) as exc:
        print(f"hb {args.command}: failed: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    except KeyboardInterrupt:
        return 130
