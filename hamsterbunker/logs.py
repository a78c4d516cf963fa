"""Logging to stderr, in the form journald understands when it is listening.

Under systemd, stderr is a stream to journald, which stamps every line with
its own time and reads a leading ``<N>`` as the line's syslog priority. So
when ``$JOURNAL_STREAM`` names our stderr, lines carry that prefix and no
timestamp of ours; anywhere else they carry a timestamp and a level name.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import TextIO

__all__ = ["configure_logging", "stderr_is_journal"]

# syslog priorities (sd-daemon.h): err 3, warning 4, info 6, debug 7.
_PRIORITIES = ((logging.CRITICAL, 2), (logging.ERROR, 3), (logging.WARNING, 4), (logging.INFO, 6))


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
    root.setLevel(level)
    logging.getLogger("watchfiles").setLevel(logging.WARNING)
