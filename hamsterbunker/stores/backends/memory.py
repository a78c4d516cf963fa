"""A backend in one process's memory: for tests, and for trying the runtime without a store.
Every client of one store is the same object; a commit holds one lock.
"""

from __future__ import annotations

import asyncio
import bisect
import threading
from collections.abc import AsyncIterator

from ...core.read_bounds import ReadBound
from ..backend import (
    Capability,
    DeleteRange,
    Get,
    Notice,
    Put,
    Scan,
    ScanResult,
    ScanTaker,
    TooLarge,
    Txn,
    TxnResult,
)
from ..base import StoreGuarantees

__all__ = ["GUARANTEES", "MemoryBackend"]

_WATCH_POLL_S = 0.02

GUARANTEES = StoreGuarantees(
    mutual_exclusion="a threading.Lock: real between threads of one process, none beyond it",
    durability="none: everything is lost when the process ends",
    across_hosts="none: one process only (share the same MemoryStore object)",
)


class MemoryBackend:
    """Keys to bytes in a dict, with the order a scan needs kept beside it."""

    guarantees = GUARANTEES
    capabilities = frozenset({Capability.ATOMIC_READS, Capability.CHEAP_WATCH})

    def __init__(self, url: str = "memory://") -> None:
        self.url = url
        self.warnings: list[str] = []
        self._lock = threading.Lock()
        self._values: dict[str, bytes] = {}
        self._keys: list[str] = []  # sorted
        self._revision = 0
        self._changed: dict[str, int] = {}  # key -> revision of its last change

    def get(self, key: str, max_bytes: int) -> bytes | TooLarge | None:
        with self._lock:
            return self._get(Get(key, max_bytes))

    def scan(self, prefix: str, bound: ReadBound, after: str = "") -> ScanResult:
        with self._lock:
            return self._scan(Scan(prefix, bound, after))

    def commit(self, txn: Txn) -> TxnResult:
        # Values are made before the lock: a blob's pieces may take a while.
        writes = [Put(w.key, bytes(w.value)) if isinstance(w, Put) else w for w in txn.all_writes]
        with self._lock:
            succeeded = all(self._values.get(c.key) == c.value for c in txn.compares)
            if succeeded:
                for write in writes:
                    self._write(write)
            reads = [self._get(r) if isinstance(r, Get) else self._scan(r) for r in txn.reads]
            return TxnResult(succeeded, reads)

    async def watch(self, prefix: str) -> AsyncIterator[Notice]:
        """Polled every 20 ms: a notice for each key under prefix changed since the last."""
        with self._lock:
            seen = self._revision
        while True:
            await asyncio.sleep(_WATCH_POLL_S)
            with self._lock:
                changed = sorted(
                    (rev, key)
                    for key, rev in self._changed.items()
                    if rev > seen and key.startswith(prefix)
                )
                seen = self._revision
                notices = [Notice(key, self._values.get(key)) for _rev, key in changed]
            for notice in notices:
                yield notice

    def check(self) -> None:
        """Nothing to check: the map is this object, there while anyone holds it."""

    def close(self) -> None:
        """Nothing to release: the map stays for other users of this object."""

    def _get(self, read: Get) -> bytes | TooLarge | None:
        value = self._values.get(read.key)
        if value is not None and len(value) > read.max_bytes:
            return TooLarge(read.key, len(value))
        return value

    def _scan(self, scan: Scan) -> ScanResult:
        if scan.after >= scan.prefix:
            start = bisect.bisect_right(self._keys, scan.after)
        else:
            start = bisect.bisect_left(self._keys, scan.prefix)
        taker = ScanTaker(scan.bound)
        for key in self._keys[start:]:
            if not key.startswith(scan.prefix):
                break
            if taker.full:
                return taker.result(more=True)
            taker.take(key, self._values[key])
        return taker.result()

    def _write(self, write: Put | DeleteRange) -> None:
        self._revision += 1
        if isinstance(write, Put):
            assert isinstance(write.value, bytes)
            if write.key not in self._values:
                bisect.insort(self._keys, write.key)
            self._values[write.key] = write.value
            self._changed[write.key] = self._revision
            return
        end = write.end
        lo = bisect.bisect_left(self._keys, write.start)
        hi = (
            bisect.bisect_right(self._keys, write.start)
            if end is None
            else bisect.bisect_left(self._keys, end)
        )
        for key in self._keys[lo:hi]:
            del self._values[key]
            self._changed[key] = self._revision
        del self._keys[lo:hi]
