"""Argument types the ``hb`` subcommands share: a bad number is one argparse error line."""

from __future__ import annotations

import argparse
import math
import os
import sys

from ..core.errors import ConfigError
from ..stores import is_syncdir_url

__all__ = ["confirmed", "not_on_syncdir", "positive_int", "seconds", "store_url", "whole_number"]


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


def store_url(args: argparse.Namespace) -> str:
    """The store URL from --store, else $HB_STORE (which keeps a password off the command line)."""
    url: str | None = args.store or os.environ.get("HB_STORE")
    if not url:
        raise ConfigError("--store is required (or set HB_STORE)")
    return url


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


def confirmed(question: str) -> bool:
    """Whether the operator answers yes to question (no terminal: no; --yes skips asking)."""
    try:
        return input(question).strip().lower() == "yes"
    except EOFError:
        print("\n(no answer: use --yes to go on without asking)", file=sys.stderr)
        return False
