"""``hb``: run a node, set one up, run the local survival demo, show a cluster's status,
hand work to an agent (``hb submit``, in ``hamsterbunker.cli.submit``), move or hold the
lease (``hb switchover``, ``pause``, ``resume``, ``history``: ``hamsterbunker.cli.control``).

User mistakes (a bad flag, URL, agent path or secret) print one line naming
the problem and exit 2, with no traceback; so does a bare ``hb``, with the help
on stderr (no command given is a mistake a script should notice). ``hb submit --wait --timeout`` that
runs out exits 124 (EXIT_TIMEOUT).
"""

from __future__ import annotations

import argparse
import faulthandler
import sys
from pathlib import Path
from typing import Any, NoReturn

from .. import __version__
from ..core.errors import (
    ConfigError,
    ControlRefused,
    HamsterbunkerError,
    NoUsableCheckpoint,
    SealError,
    StoreError,
    StoreUnsafe,
)
from ..core.logs import configure_logging, stderr_is_journal
from ..core.timing import (
    DEFAULT_LEASE_TTL_MS,
    DEFAULT_TICK_MS,
    LeaseTiming,
)
from ..sealing.keyring import Keyring, read_keyring
from . import control as cli_control
from .args import confirmed, not_on_syncdir, positive_int, store_url
from .chain import add_choose_chain_parser, choose_chain
from .context import opened_store, store_sealer
from .control import add_control_parsers
from .forget import add_forget_parser, forget
from .migrate import add_migrate_parser, migrate_store
from .node import add_init_parser, add_run_parser, init, run
from .rotate import add_rotate_parser, rotate_secret
from .status import add_status_parser
from .submit import EXIT_TIMEOUT, add_submit_parser, submit

__all__ = ["EXIT_TIMEOUT", "main"]


EXIT_FAILURE = 1
EXIT_USAGE = 2
# The node refused to resume (no checkpoint authenticates, or the store went
# back in time): restarting cannot fix that, a person has to look.
EXIT_REFUSED = 3

SECRET_HELP = """\
the network secret (at least 8 characters) is taken from, in this order:
  1. the environment variable HB_SECRET (and HB_SECRET_PREVIOUS while the secret
     is rotated: see hb rotate-secret)
  2. the file named by --secret-file (one secret a line, newest first)
  3. $CREDENTIALS_DIRECTORY/secret (systemd LoadCredential=secret:...), the same
Never pass it on the command line: every user can read that."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="hb",
        description="HamsterBunker: keep an agent alive across machines.",
        epilog="Without a command, hb prints this help on stderr and exits 2.",
    )
    parser.add_argument("--version", action="version", version=f"hb {__version__}")
    # Not required: a bare `hb` gets this help, not an argparse error (main).
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    add_run_parser(sub, SECRET_HELP)
    add_init_parser(sub)

    _add_demo_parser(sub)
    _add_accept_loss_parser(sub)
    add_status_parser(sub)

    add_submit_parser(sub, SECRET_HELP)
    add_forget_parser(sub, SECRET_HELP)
    add_control_parsers(sub, SECRET_HELP)
    add_rotate_parser(sub, "file holding the secrets, one a line, newest first")
    add_choose_chain_parser(sub, SECRET_HELP)
    add_migrate_parser(sub, SECRET_HELP)
    return parser


def _add_demo_parser(sub: Any) -> None:
    demo = sub.add_parser("demo", help="the local three-node survival demo")
    demo.add_argument("--kills", type=positive_int, default=1, help="kill the active node N times")
    demo.add_argument("--store", help="store URL (default: a temporary directory)")
    demo.add_argument("--tick-ms", type=positive_int, help=f"default: {DEFAULT_TICK_MS}")
    demo.add_argument("--lease-ttl-ms", type=positive_int, help=f"default: {DEFAULT_LEASE_TTL_MS}")


def _add_accept_loss_parser(sub: Any) -> None:
    accept = sub.add_parser(
        "accept-loss",
        help="accept a loss the nodes refuse to resume behind (stop every node first)",
        description="Give up checkpoints that are gone or damaged (or, with --to-seq, newer than "
        "N) and let nodes resume from the newest authenticated checkpoint at or below N. "
        "Prints what is given up and asks first.",
        epilog=SECRET_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    accept.add_argument("--store", help="store URL (default: $HB_STORE)")
    accept.add_argument("--agent-id", required=True)
    accept.add_argument(
        "--to-seq",
        type=positive_int,
        metavar="N",
        help="resume from the newest authenticated checkpoint at or below seq N "
        "(default: the newest that authenticates)",
    )
    accept.add_argument("--yes", action="store_true", help="do not ask")
    accept.add_argument("--secret-file", type=Path, help="file holding the network secret")


def read_secret(secret_file: Path | None) -> Keyring:
    """The secrets from HB_SECRET (+ HB_SECRET_PREVIOUS), --secret-file, or the systemd
    credential, in that order: one, or several while the secret rotates (newest first)."""
    return read_keyring(secret_file)


def _cmd_demo(args: argparse.Namespace) -> int:
    from ..demo import DemoFailed, run_demo

    try:
        run_demo(
            kills=args.kills,
            store_url=args.store,
            timing=_demo_timing(args),
            out=lambda line: print(line, flush=True),
        )
    except DemoFailed as exc:
        _print_error(str(exc))
        return EXIT_FAILURE
    return 0


def _demo_timing(args: argparse.Namespace) -> LeaseTiming:
    given = {key: getattr(args, key) for key in ("tick_ms", "lease_ttl_ms")}
    return LeaseTiming(**{key: value for key, value in given.items() if value is not None})


def _cmd_status(args: argparse.Namespace) -> int:
    from .status import status  # exit 0 healthy, 1 degraded, 2 cannot tell

    return status(args)


def _cmd_submit(args: argparse.Namespace) -> int:
    # The secret is read after the flags and the payload are checked.
    return submit(args, lambda: read_secret(args.secret_file))


def _cmd_forget(args: argparse.Namespace) -> int:
    return forget(args, lambda: read_secret(args.secret_file))


def _cmd_switchover(args: argparse.Namespace) -> int:
    return cli_control.switchover(args, lambda: read_secret(args.secret_file))


def _cmd_pause(args: argparse.Namespace) -> int:
    return cli_control.pause(args, lambda: read_secret(args.secret_file))


def _cmd_rotate_secret(args: argparse.Namespace) -> int:
    secret_file = None if args.secret_file is None else Path(args.secret_file)
    return rotate_secret(args, lambda: read_secret(secret_file))


def _cmd_migrate_store(args: argparse.Namespace) -> int:
    return migrate_store(args, lambda: read_secret(args.secret_file))


def _cmd_choose_chain(args: argparse.Namespace) -> int:
    return choose_chain(args, lambda: read_secret(args.secret_file))


def _cmd_accept_loss(args: argparse.Namespace) -> int:
    from ..lease.acceptance import accept_loss, plan_loss
    from ..records import check_name

    agent_id = check_name("agent id", args.agent_id)
    url = not_on_syncdir(
        store_url(args),
        "accepting a loss",
        "; to go on from a checkpoint behind a lost one there, use hb choose-chain",
    )
    secret = read_secret(args.secret_file)
    with opened_store(url) as store:
        sealer = store_sealer(store, secret)
        plan = plan_loss(store, sealer, agent_id, args.to_seq)
        print(plan.describe())
        if not args.yes and not confirmed("Give these up? Type yes to go on: "):
            print("nothing changed", file=sys.stderr)
            return EXIT_FAILURE
        acceptance = accept_loss(store, sealer, plan)
    print(
        f"accepted ({acceptance.id}): nodes started now resume from seq {plan.resume.seq}; "
        "start them again"
    )
    return 0


def _print_error(line: str) -> None:
    # Under journald, <3> files the line as an error, so `journalctl -p err` shows it.
    prefix = "<3>" if stderr_is_journal() else ""
    print(prefix + line, file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    parser = _build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    configure_logging()
    # A hung node killed by systemd's watchdog (SIGABRT) leaves every thread's
    # stack in the journal.
    faulthandler.enable()
    commands = {
        "run": run,
        "init": init,
        "demo": _cmd_demo,
        "status": _cmd_status,
        "accept-loss": _cmd_accept_loss,
        "submit": _cmd_submit,
        "forget": _cmd_forget,
        "switchover": _cmd_switchover,
        "pause": _cmd_pause,
        "resume": _cmd_pause,
        "history": cli_control.history,
        "rotate-secret": _cmd_rotate_secret,
        "choose-chain": _cmd_choose_chain,
        "migrate-store": _cmd_migrate_store,
    }
    try:
        return commands[args.command](args)
    except (ConfigError, SealError, StoreUnsafe) as exc:
        # A user mistake: a bad URL, agent, secret or store location.
        _print_error(f"hb {args.command}: error: {exc}")
        return EXIT_USAGE
    except ControlRefused as exc:  # asked at the wrong time: nothing was changed
        _print_error(f"hb {args.command}: refused: {exc}")
        return EXIT_FAILURE
    except NoUsableCheckpoint as exc:
        _print_error(f"hb {args.command}: refused: {exc}")
        return EXIT_REFUSED
    except (StoreError, HamsterbunkerError) as exc:
        _print_error(f"hb {args.command}: failed: {exc}")
        return EXIT_FAILURE
    except KeyboardInterrupt:
        return 130
