"""What every part of the record layer shares: its backend, its settings, bounded reads."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TypeVar

from ...core.errors import ConfigError, CorruptRecord, StoreError
from ...core.failpoints import failpoint, failpoints_within
from ...core.limits import INBOX_REPLIES_KEPT
from ...core.read_bounds import BoundedRead, ReadBound
from ...records import CheckpointInfo
from .._reported import ReportedOnce
from ..backend import Backend, Compare, Get, Put, ScanResult, TooLarge, Txn, TxnResult
from .keys import AgentKeys

__all__ = [
    "Layer",
    "Ledger",
    "Name",
    "Settings",
    "bounded_records",
    "count_of",
    "counts_of",
    "log",
    "must",
    "value_of",
]

log = logging.getLogger("hamsterbunker.stores")
K = TypeVar("K")


@dataclass(frozen=True)
class Settings:
    """How much a store keeps: checkpoints, events per node, consumed submissions."""

    keep_checkpoints: int = 5
    events_per_node: int = 1000
    keep_replies: int = INBOX_REPLIES_KEPT
    # Retention within each epoch, never replacing another epoch's checkpoint: a syncdir
    # subtree, where another term's may be a branch kept aside (docs/syncdir.md).
    per_epoch: bool = False

    def __post_init__(self) -> None:
        for name in ("keep_checkpoints", "events_per_node", "keep_replies"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be at least 1")


Name = tuple[int, str]  # a reply's (number, request id)


@dataclass
class Ledger:
    """The inbox's bookkeeping as this client's last consumption left it, under a fence.

    ``oldest`` is the smallest reply names stored, in order (all of them when
    ``complete``), each with its request id's record as it was left (None where
    not read, b"" where there is nothing to forget)."""

    fence: str
    kept: bytes
    consumed: bytes
    oldest: list[tuple[Name, bytes | None]]
    complete: bool


@dataclass
class Layer:
    """A backend, its settings, and what this client's last commits left, per agent: the
    guesses its next commits compare (docs/design.md, "One record layer ...")."""

    backend: Backend
    settings: Settings
    reported: ReportedOnce = field(default_factory=lambda: ReportedOnce(log))
    # Under the fence held: (its text, the seq of the last checkpoint or listing, the
    # checkpoints stored as of then).
    written: dict[str, tuple[str, int, list[CheckpointInfo]]] = field(default_factory=dict)
    # The inbox's last number, admissions and consumptions after the last admission.
    admissions: dict[str, list[bytes | TooLarge | None]] = field(default_factory=dict)
    # The last consumption's Ledger, and each pending submission's size inbox reads saw.
    ledgers: dict[str, Ledger] = field(default_factory=dict)
    shown: dict[str, dict[int, int]] = field(default_factory=dict)
    _indexed: set[str] = field(default_factory=set)  # agents this client listed (index)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def get(self, key: str, max_bytes: int, what: str) -> bytes | None:
        """key's value, or None; CorruptRecord, unread, if over max_bytes."""
        return value_of(self.backend.get(key, max_bytes), max_bytes, what)

    def commit(self, txn: Txn) -> TxnResult:
        return self.backend.commit(txn)

    def read(self, *reads: Get) -> list[bytes | TooLarge | None]:
        """Several keys read in one atomic step."""
        result = self.backend.commit(Txn(reads=reads))
        return [found for found in result.reads if not isinstance(found, ScanResult)]

    def reseal(self, key: str, old: bytes, new: bytes) -> bool:
        """key's value replaced with new in one commit, only if it is still old."""
        txn = Txn(compares=[Compare(key, bytes(old))], writes=[Put(key, bytes(new))])
        failpoint("reseal.before_commit")
        with failpoints_within("reseal"):
            return self.commit(txn).succeeded

    def forget_agent(self, agent: str) -> None:
        """After the agent's records are removed: what this client remembers of it goes."""
        with self._lock:
            self._indexed.discard(agent)
        self.written.pop(agent, None)

    def commit_indexed(self, keys: AgentKeys, txn: Txn) -> TxnResult:
        """Commit txn, which writes the agent's records, with the write that lists it
        (list_agents) once per client and agent. Unless it succeeded the index is
        forgotten, so that the next write makes it: every agent with records is listed
        (``stores.earlier`` relies on it)."""
        with self._lock:
            index = [] if keys.agent in self._indexed else [Put(keys.index, b"")]
            self._indexed.add(keys.agent)
        result = None
        try:
            result = self.commit(replace(txn, writes=[*txn.writes, *index]))
        finally:
            if result is None or not result.succeeded:
                with self._lock:
                    self._indexed.discard(keys.agent)
        return result


def bounded_records(
    layer: Layer,
    folder: str,
    bound: ReadBound,
    parse: Callable[[str], K | None],
    what: str,
    after: str = "",
) -> list[tuple[K, bytes]]:
    """The records in folder, by key, within bound: parse(name) names each (None: junk,
    reported and left out, taking no place of the bound's count)."""
    # Twice the count, and room for junk beside it: an entry left out still costs the scan.
    room = ReadBound(2 * bound.count + 16, bound.entry_bytes, bound.total_bytes)
    found = layer.backend.scan(folder, room, after=after)
    taken = BoundedRead[K](bound)
    for key, data in found.items:
        name = parse(key[len(folder) :])
        if name is None:
            layer.reported(f"leaving out {key}: not a name {what} has")
        elif not taken.offer(name, data) and taken.full:
            break
    for too_large in found.too_large:
        layer.reported(f"leaving out {too_large.key}: over {bound.entry_bytes} bytes")
    if found.more or taken.stopped:
        layer.reported(f"{what}: stopped reading at its bound")
    return taken.entries


def value_of(found: bytes | TooLarge | None, max_bytes: int, what: str) -> bytes | None:
    if isinstance(found, TooLarge):
        raise CorruptRecord(f"{what} is over the limit of {max_bytes} bytes")
    return found


def count_of(data: bytes | None, what: str) -> int:
    """A stored count (0 when absent); CorruptRecord for anything but ASCII digits."""
    if data is None:
        return 0
    if not data.isdigit() or len(data) > 20:
        raise CorruptRecord(f"{what} is not a number")
    return int(data)


def counts_of(data: bytes | None, what: str) -> tuple[int, int]:
    """A stored pair of counts, "a b" ((0, 0) when absent); CorruptRecord otherwise."""
    if data is None:
        return 0, 0
    parts = data.split(b" ")
    if len(parts) != 2:
        raise CorruptRecord(f"{what} is not two numbers")
    return count_of(parts[0], what), count_of(parts[1], what)


def must(result: TxnResult) -> TxnResult:
    """result, unless a commit with no compares failed (a backend bug)."""
    if not result.succeeded:
        raise StoreError("the store refused a write that compared nothing")
    return result
