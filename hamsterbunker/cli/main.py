"""``hb``: the commands' dispatch (their parser: ``parsers``).

User mistakes (a bad flag, URL, agent path or secret) print one line naming
the problem and exit 2, with no traceback; so does a bare ``hb``, with the help
on stderr (no command given is a mistake a script should notice).
"""

from __future__ import annotations

import argparse
import faulthandler
import importlib
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path

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
from ..core.timing import LeaseTiming
from ..sealing.keyring import Keyring, read_keyring
from .context import EXIT_FAILURE, EXIT_REFUSED, EXIT_TIMEOUT, EXIT_USAGE, warn
from .parsers import build_parser

__all__ = ["EXIT_TIMEOUT", "main", "read_secret"]

# Each command's module and function, imported only when the command runs: `hb` pays for
# what one command needs, not for them all. A secret command is handed a reader of the
# secret, so that it is read after its flags are checked.
_COMMANDS: dict[str, str] = {
    "run": "node:run",
    "init": "node:init",
    "status": "status:status",
    "history": "history:history",
}
_SECRET_COMMANDS: dict[str, str] = {
    "accept-loss": "acceptance:accept_loss",
    "submit": "submit:submit",
    "forget": "forget:forget",
    "switchover": "control:switchover",
    "pause": "control:pause",
    "resume": "control:pause",
    "rotate-secret": "rotate:rotate_secret",
    "choose-chain": "chain:choose_chain",
    "migrate-store": "migrate:migrate_store",
}


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


def _dispatch(args: argparse.Namespace) -> int:
    if args.command == "demo":
        return _demo(args)
    if args.command in _COMMANDS:
        return _command(_COMMANDS[args.command])(args)
    command = _command(_SECRET_COMMANDS[args.command])
    return command(args, lambda: read_secret(args.secret_file))


def _command(where: str) -> Callable[..., int]:
    """The function named by "module:function" in this package."""
    module, name = where.split(":")
    function: Callable[..., int] = getattr(importlib.import_module(f".{module}", __package__), name)
    return function


def main(argv: list[str] | None = None) -> int:
    parser = build_parser(_named_command(sys.argv[1:] if argv is None else argv))
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


def _named_command(argv: list[str]) -> str | None:
    """The command argv names: its first word that is not a flag (hb's own take no value)."""
    return next((word for word in argv if not word.startswith("-")), None)


def _reader_gone() -> int:
    """The reader of our output went (``hb status | head``): end quietly, as Unix tools do,
    with what a shell shows for a command a SIGPIPE ended."""
    # What is still buffered for stdout would fail again at exit, with a traceback.
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 128 + signal.SIGPIPE
