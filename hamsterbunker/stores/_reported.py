"""Reporting each distinct problem with a store's contents once, not on every read (a
junk entry is seen by every listing), in a bounded memory; ``readable``, the one way a
heartbeat or event that does not parse is skipped.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Hashable, Iterable, Iterator
from typing import Protocol, TypeVar

from ..core.errors import CorruptRecord

__all__ = ["NodeRecord", "ReportedOnce", "readable"]

_MAX_REPORTED = 1024


class ReportedOnce:
    """Logs a warning for each distinct problem once (thread-safe); past a bound, at debug."""

    def __init__(self, log: logging.Logger) -> None:
        self._log = log
        self._seen: dict[Hashable, None] = {}  # in the order first reported
        self._lock = threading.Lock()

    def warn(self, key: Hashable, message: str, *args: object) -> None:
        """Log message % args at warning level, unless key was reported before."""
        with self._lock:
            if key in self._seen:
                return
            full = len(self._seen) >= _MAX_REPORTED
            if not full:
                self._seen[key] = None
        if full:
            self._log.debug(message, *args)
            return
        self._log.warning(message, *args)
        if len(self._seen) == _MAX_REPORTED:
            self._log.warning(
                "more than %d problems in the store: further ones are logged at debug level",
                _MAX_REPORTED,
            )

    def __call__(self, message: str) -> None:
        """Report message, the message being its own key."""
        self.warn(message, "%s", message)

    def listed(self) -> list[str]:
        """The keys reported at warning level so far, in order (the messages, for
        ``__call__``): what a report shows."""
        with self._lock:
            return [str(key) for key in self._seen]


class NodeRecord(Protocol):
    """A record kept per node: a heartbeat, an event."""

    @property
    def node(self) -> str: ...


Stored = TypeVar("Stored")
Parsed = TypeVar("Parsed", bound=NodeRecord)


def readable(
    items: Iterable[tuple[str, Stored]],
    parse: Callable[[Stored], Parsed | None],
    report: Callable[[str, Stored, Exception], object],
) -> Iterator[Parsed]:
    """The records among (node, stored form) items that parse and are that node's: one
    that does not parse (parse raises CorruptRecord) is handed to report and skipped;
    another node's, or None from parse (removed meanwhile), is skipped silently."""
    for node, stored in items:
        try:
            record = parse(stored)
        except CorruptRecord as exc:
            report(node, stored, exc)
            continue
        if record is not None and record.node == node:
            yield record
