"""What the ``hb`` subcommands' parsers share: argument types (a bad number is one argparse
error line), the store's URL, the flags of a wait, and the operator's confirmation."""

from __future__ import annotations

import argparse
import math
import os
from typing import Any, TypeAlias

from ..core.errors import ConfigError
from ..records import check_name
from ..stores import is_syncdir_url
from .context import warn

__all__ = [
    "Subcommands",
    "add_command",
    "add_wait_flags",
    "agent_target",
    "confirmed",
    "not_on_syncdir",
    "positive_int",
    "seconds",
    "store_url",
    "whole_number",
]

# argparse's subparsers action, of whichever parser class.
Subcommands: TypeAlias = "argparse._SubParsersAction[Any]"


def add_command(
    sub: Subcommands, name: str, help: str, description: str, epilog: str | None = None
) -> argparse.ArgumentParser:
    """Add subcommand name, its description and epilog printed as written."""
    parser: argparse.ArgumentParser = sub.add_parser(
        name,
        help=help,
        description=description,
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    return parser


def add_wait_flags(parser: argparse.ArgumentParser, until: str, default_s: float) -> None:
    """--wait (until what) and --timeout S, default_s by default."""
    parser.add_argument("--wait", action="store_true", help=f"wait until {until}")
    parser.add_argument(
        "--timeout",
        type=seconds,
        default=default_s,
        metavar="S",
        help=f"with --wait: give up after S seconds (default: {default_s:g})",
    )


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None


def whole_number(text: str) -> int:
    """A whole number, 0 or more."""
    value = _int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must not be negative")
    return value


def positive_int(text: str) -> int:
    """A whole number above 0."""
    value = _int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be above 0")
    return value


def seconds(text: str) -> float:
    """A number of seconds above 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be a number of seconds above 0")
    return value


def store_url(args: argparse.Namespace, or_else: str = "") -> str:
    """The store URL from --store, else $HB_STORE (which keeps a password off the command
    line); or_else: another way to name it, for the error."""
    url: str | None = args.store or os.environ.get("HB_STORE")
    if not url:
        raise ConfigError(f"--store is required (or set HB_STORE{or_else})")
    return url


def agent_target(
    args: argparse.Namespace, writes: str | None = None, instead: str = ""
) -> tuple[str, str]:
    """The store's URL and the agent id; writes: what the command writes, refused on a
    syncdir:// store (nothing but a node writes there yet)."""
    agent = check_name("agent id", args.agent_id)
    url = store_url(args)
    if writes is not None:
        not_on_syncdir(url, writes, instead)
    return url, agent


def not_on_syncdir(url: str, what: str, instead: str = "") -> str:
    """url, unless it names a syncdir:// store, which takes no records from outside a
    running node yet (ConfigError saying so, and what to use instead if there is one)."""
    if is_syncdir_url(url):
        raise ConfigError(
            f"{what} is not possible on a syncdir:// store yet: only a running node writes "
            "there, into its own subtree (drop folders for requests from other machines are "
            f"part 3 of docs/syncdir.md, not built){instead}"
        )
    return url


def confirmed(args: argparse.Namespace, question: str) -> bool:
    """Whether to go on: --yes, or the operator answers yes to question (no terminal: no).
    Says that nothing changed if not."""
    if args.yes:
        return True
    try:
        if input(question).strip().lower() == "yes":
            return True
    except EOFError:
        warn("\n(no answer: use --yes to go on without asking)")
    warn("nothing changed")
    return False
