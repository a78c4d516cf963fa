"""The backend interface: a durable map of keys to bytes with one atomic ``commit``, on
which the record layer (``stores.layer``) lays out every record; it knows no records.

Keys are ``/``-separated plain ASCII names (``key_problem``), sorted by code point, and
no key is another's folder (with ``a/b`` stored, ``a`` is never a key). Every read is
bounded where it is made: ``get`` by bytes, ``scan`` by a ``ReadBound``.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from ..core.blob import Blob
from ..core.read_bounds import BoundedRead, ReadBound
from .base import StoreGuarantees

__all__ = [
    "Backend",
    "Capability",
    "Compare",
    "DeleteRange",
    "Get",
    "Notice",
    "Put",
    "Scan",
    "ScanResult",
    "ScanTaker",
    "TooLarge",
    "Txn",
    "TxnResult",
    "key_problem",
    "prefix_end",
]

# One key segment: an agent or node id, a zero-padded number, a fixed word. Nothing else
# is a key, so no backend escapes anything and a file backend uses segments as names.
_SEGMENT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@+=-]{0,191}")
MAX_KEY_CHARS = 1024


def key_problem(key: str) -> str | None:
    """Why key is not a backend key, or None if it is one."""
    if not key or len(key) > MAX_KEY_CHARS:
        return f"a key must be 1 to {MAX_KEY_CHARS} characters"
    for segment in key.split("/"):
        if not _SEGMENT.fullmatch(segment):
            return f"key {key[:80]!r} has a segment that is not a name: {segment[:80]!r}"
    return None


def prefix_end(prefix: str) -> str:
    """The first key after every key that starts with prefix (prefix is non-empty ASCII)."""
    return prefix[:-1] + chr(ord(prefix[-1]) + 1)


class Capability:
    """What a backend can do beyond the interface's minimum (``Backend.capabilities``)."""

    # A commit's writes are in place for every reader at once (not a file backend's).
    ATOMIC_READS = "atomic-reads"
    # Notices carry the value a key changed to (a watcher spares a read).
    NOTICE_VALUES = "notice-values"
    # A watch costs a monitor less than polling a key (not a file backend's: a thread
    # woken by every write in a folder).
    CHEAP_WATCH = "cheap-watch"


@dataclass(frozen=True)
class TooLarge:
    """A value a bounded read left unread: it is over the bytes the read allows."""

    key: str
    size: int  # what the backend reported, or -1 where it only knows it is over


@dataclass(frozen=True)
class Compare:
    """A commit's precondition: key holds exactly value (None: key holds nothing)."""

    key: str
    value: bytes | None


@dataclass(frozen=True)
class Put:
    """Set key to value (bytes, or pieces made as they are written: ``hamsterbunker.core.blob``)."""

    key: str
    value: Blob


@dataclass(frozen=True)
class DeleteRange:
    """Remove every key k with start <= k < end (end None: key start alone)."""

    start: str
    end: str | None = None


@dataclass(frozen=True)
class Get:
    """A commit's read of one key, at most max_bytes of it (else TooLarge)."""

    key: str
    max_bytes: int


@dataclass(frozen=True)
class Scan:
    """A commit's read of the keys under prefix, after a key, within bound (see scan).

    A bound of 0 entry bytes reads names only: each key comes as an empty item or as
    TooLarge, whichever the backend finds cheaper (etcd fetches no value then)."""

    prefix: str
    bound: ReadBound
    after: str = ""


@dataclass(frozen=True)
class ScanResult:
    """What one bounded scan found, by key: the values taken, and what was not."""

    items: list[tuple[str, bytes]] = field(default_factory=list)
    too_large: list[TooLarge] = field(default_factory=list)  # over the bound's entry bytes
    more: bool = False  # the bound stopped the scan: read on after the last key taken

    @property
    def keys(self) -> list[str]:
        """Every key found: those taken, then those too large."""
        return [key for key, _value in self.items] + [each.key for each in self.too_large]


class ScanTaker:
    """What a backend's scan takes, key by key in key order, within its bound: for each
    key, stop if ``full``; report a value over the entry bytes with ``left_out``
    (measured before it is fetched, where the backend can); else ``take`` it."""

    def __init__(self, bound: ReadBound) -> None:
        self._read = BoundedRead[str](bound)
        self._too_large: list[TooLarge] = []
        self._more = False

    @property
    def full(self) -> bool:
        """Nothing more may be taken; a key found now means there is more."""
        read = self._read
        return read.stopped or len(read.entries) + len(self._too_large) >= read.bound.count

    def left_out(self, key: str, size: int) -> bool:
        """Whether a value of size bytes is over the entry bytes (then reported, unread)."""
        if not self._read.too_big(size):
            return False
        self._too_large.append(TooLarge(key, size))
        return True

    def take(self, key: str, value: bytes) -> None:
        if not self.left_out(key, len(value)):
            self._read.offer(key, value)

    def result(self, more: bool = False) -> ScanResult:
        """The scan's result; more: a key under the prefix was left after the last taken."""
        more = more or self._read.stopped
        return ScanResult(list(self._read.entries), list(self._too_large), more)


@dataclass(frozen=True)
class Txn:
    """One atomic step: if every compare holds, make the writes, in order; then the reads,
    which see the store as of the step. Durable before commit returns."""

    compares: Sequence[Compare] = ()
    writes: Sequence[Put | DeleteRange] = ()
    reads: Sequence[Get | Scan] = ()
    # Removals of what the writes make obsolete: with them where the backend can, else just
    # after (a crash may leave them for a later tidy-up: docs/design.md).
    tidy: Sequence[DeleteRange] = ()

    @property
    def all_writes(self) -> list[Put | DeleteRange]:
        """The writes, then the tidy-up: for a backend that makes both in one step."""
        return [*self.writes, *self.tidy]


@dataclass(frozen=True)
class TxnResult:
    """Whether the compares held, and the reads in the order asked."""

    succeeded: bool
    reads: list[bytes | TooLarge | ScanResult | None] = field(default_factory=list)


@dataclass(frozen=True)
class Notice:
    """A watch's hint that key may have changed; value is what it changed to, where the
    backend's notices carry it (None: a deletion, or read to know). key None: a gap,
    anything under the prefix may have changed."""

    key: str | None
    value: bytes | None = None


@runtime_checkable
class Backend(Protocol):
    """A durable, shared map of keys to bytes. Every method but watch is blocking."""

    url: str  # as it may be shown: no credential
    guarantees: StoreGuarantees
    capabilities: frozenset[str]
    warnings: list[str]  # what the backend, as configured, may lose (shown at start)

    def get(self, key: str, max_bytes: int) -> bytes | TooLarge | None:
        """The value of key (None if it has none), or TooLarge, unread, if over max_bytes."""

    def scan(self, prefix: str, bound: ReadBound, after: str = "") -> ScanResult:
        """The keys under prefix (``/``-terminated) that sort after after, in key order,
        within bound: a value over its entry bytes is in too_large, unread, and counts as
        an entry; ``more`` once the bound stopped the scan before the last key."""

    def commit(self, txn: Txn) -> TxnResult:
        """Make txn in one atomic, durable step (see Txn). StoreError if the backend
        cannot say whether it happened (the caller reads to know)."""

    def watch(self, prefix: str) -> AsyncIterator[Notice]:
        """Notices of changes under prefix, from now on, for as long as it is iterated:
        hints, never proof; a notice may come without a change, and a gap as key None."""

    def check(self) -> None:
        """StoreUnavailable unless the backend is there and answering."""

    def close(self) -> None:
        """Release what the backend holds open."""
