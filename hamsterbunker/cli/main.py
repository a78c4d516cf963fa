"""``hb``: the parser and the commands' dispatch.

User mistakes (a bad flag, URL, agent path or secret) print one line naming
the problem and exit 2, with no traceback; so does a bare ``hb``, with the help
on stderr (no command given is a mistake a script should notice).
"""

from __future__ import annotations

import argparse
import faulthandler
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

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
from ..core.timing import DEFAULT_LEASE_TTL_MS, DEFAULT_TICK_MS, LeaseTiming
from ..sealing.keyring import Keyring, read_keyring
from .args import Subcommands, positive_int
from .chain import add_choose_chain_parser, choose_chain
from .context import EXIT_FAILURE, EXIT_REFUSED, EXIT_TIMEOUT, EXIT_USAGE, warn
from .control import (
    accept_loss,
    add_accept_loss_parser,
    add_control_parsers,
    history,
    pause,
    switchover,
)
from .forget import add_forget_parser, forget
from .migrate import add_migrate_parser, migrate_store
from .node import add_init_parser, add_run_parser, init, run
from .rotate import add_rotate_parser, rotate_secret
from .status import add_status_parser, status
from .submit import add_submit_parser, submit

__all__ = ["EXIT_TIMEOUT", "main", "read_secret"]

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
    add_accept_loss_parser(sub, SECRET_HELP)
    add_status_parser(sub)
    add_submit_parser(sub, SECRET_HELP)
    add_forget_parser(sub, SECRET_HELP)
    add_control_parsers(sub, SECRET_HELP)
    add_rotate_parser(sub, "file holding the secrets, one a line, newest first")
    add_choose_chain_parser(sub, SECRET_HELP)
    add_migrate_parser(sub, SECRET_HELP)
    return parser


def _add_demo_parser(sub: Subcommands) -> None:
    demo = sub.add_parser("demo", help="the local three-node survival demo")
    demo.add_argument("--kills", type=positive_int, default=1, help="kill the active node N times")
    demo.add_argument("--store", help="store URL (default: a temporary directory)")
    demo.add_argument("--tick-ms", type=positive_int, help=f"default: {DEFAULT_TICK_MS}")
    demo.add_argument("--lease-ttl-ms", type=positive_int, help=f"default: {DEFAULT_LEASE_TTL_MS}")


def read_secret(secret_file: Path | None) -> Keyring:
    """The secrets from HB_SECRET (+ HB_SECRET_PREVIOUS), --secret-file, or the systemd
    credential, in that order: one, or several while the secret rotates (newest first)."""
    return read_keyring(secret_file)


def _demo(args: argparse.Namespace) -> int:
    from ..demo import DemoFailed, run_demo

    given = {key: getattr(args, key) for key in ("tick_ms", "lease_ttl_ms")}
    timing = LeaseTiming(**{key: value for key, value in given.items() if value is not None})
    try:
        run_demo(kills=args.kills, store_url=args.store, timing=timing,
                 out=lambda line: print(line, flush=True))  # fmt: skip
    except DemoFailed as exc:
        _print_error(str(exc))
        return EXIT_FAILURE
    return 0


def _print_error(line: str) -> None:
    # Under journald, <3> files the line as an error, so `journalctl -p err` shows it.
    warn(("<3>" if stderr_is_journal() else "") + line)


_COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "run": run,
    "init": init,
    "demo": _demo,
    "status": status,
    "history": history,
}
# These take a reader of the secret, so that it is read after their flags are checked.
_SECRET_COMMANDS: dict[str, Callable[[argparse.Namespace, Callable[[], Keyring]], int]] = {
    "accept-loss": accept_loss,
    "submit": submit,
    "forget": forget,
    "switchover": switchover,
    "pause": pause,
    "resume": pause,
    "rotate-secret": rotate_secret,
    "choose-chain": choose_chain,
    "migrate-store": migrate_store,
}


def _dispatch(args: argparse.Namespace) -> int:
    if args.command in _COMMANDS:
        return _COMMANDS[args.command](args)
    return _SECRET_COMMANDS[args.command](args, lambda: read_secret(args.secret_file))


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
    try:
        code = _dispatch(args)
        sys.stdout.flush()  # here, so that a reader gone is seen below, not at exit
        return code
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
    except BrokenPipeError:
        return _reader_gone()


def _reader_gone() -> int:
    """The reader of our output went (``hb status | head``): end quietly, as Unix tools do,
    with what a shell shows for a command a SIGPIPE ended."""
    # What is still buffered for stdout would fail again at exit, with a traceback.
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 128 + signal.SIGPIPE
