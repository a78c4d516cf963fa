"""Telling a lease record's change of term from a mere renewal, for ``watch(terms_only=True)``
(a standby's ticks see renewals anyway; a release, a takeover or a request must wake it).
"""

from __future__ import annotations

from ..core.errors import CorruptRecord
from ..records import LeaseRecord

__all__ = ["TermChanges"]


class TermChanges:
    """Remembers the last term seen; says whether a new lease value changes it. A record
    gone or unreadable is a term of its own, each unreadable value another."""

    def __init__(self) -> None:
        self._last: str | bytes | None = b""  # never a term: the first value is a change

    def changed(self, data: bytes | None) -> bool:
        """Whether data (the lease record's bytes, None when it is gone) is another term."""
        term: str | bytes | None
        try:
            term = None if data is None else LeaseRecord.from_json(data).term()
        except CorruptRecord:
            term = b"?" + (data or b"")
        changed = term != self._last
        self._last = term
        return changed
