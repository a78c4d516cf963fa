"""Logging to stderr, in the form journald understands when it is listening.

When ``$JOURNAL_STREAM`` names our stderr, lines carry a ``<N>`` syslog priority prefix and
no timestamp of ours (journald stamps them); elsewhere a timestamp and a level name. The
level applies to hamsterbunker's own loggers; other libraries log at INFO and above.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import TextIO

from .errors import ConfigError

__all__ = ["LOG_LEVELS", "configure_logging", "log_level", "stderr_is_journal"]

# The names --log-level and the config key log_level take.
LOG_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}

# syslog priorities (sd-daemon.h): err 3, warning 4, info 6, debug 7.
_PRIORITIES = ((logging.CRITICAL, 2), (logging.ERROR, 3), (logging.WARNING, 4), (logging.INFO, 6))


def log_level(name: str) -> int:
    """The logging level named ``name`` (ConfigError naming the choices for another)."""
    try:
        return LOG_LEVELS[name.lower()]
    except KeyError:
        raise ConfigError(f"log level {name!r} is not one of {', '.join(LOG_LEVELS)}") from None


def stderr_is_journal(stream: TextIO | None = None) -> bool:
    """Whether ``stream`` (default: stderr) is the journald stream in $JOURNAL_STREAM."""
    expected = os.environ.get("JOURNAL_STREAM", "")
    device, _, inode = expected.partition(":")
    stream = sys.stderr if stream is None else stream
    try:
        stat = os.fstat(stream.fileno())
    except (OSError, ValueError):
        return False
    return f"{stat.st_dev}:{stat.st_ino}" == f"{device}:{inode}"


class JournalFormatter(logging.Formatter):
    """``<N>name: message``, the prefix repeated on every line of a traceback."""

    def __init__(self) -> None:
        super().__init__("%(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        priority = next((p for level, p in _PRIORITIES if record.levelno >= level), 7)
        return "\n".join(f"<{priority}>{line}" for line in super().format(record).splitlines())


def configure_logging(level: int = logging.INFO, stream: TextIO | None = None) -> None:
    stream = sys.stderr if stream is None else stream
    handler = logging.StreamHandler(stream)
    if stderr_is_journal(stream):
        handler.setFormatter(JournalFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    # At debug, only ours: other libraries' debug lines would drown them.
    root.setLevel(max(level, logging.INFO))
    logging.getLogger("hamsterbunker").setLevel(level if level < logging.INFO else logging.NOTSET)
    logging.getLogger("watchfiles").setLevel(logging.WARNING)
