"""The etcd backend: ``etcd://host:port[,host:port...]/prefix`` (``etcds://`` for TLS).

Key K lives at the etcd key ``P/K`` under the URL's prefix P. A commit is one
etcd Txn; a watch follows ``P/prefix`` from the revision last seen
(``Follower``). How a Txn is made, how reads are bounded, etcd's request limits
and the earlier store's layout: docs/design.md, "Network backends".
"""

from __future__ import annotations

import asyncio
import base64
import collections
import contextlib
from bisect import bisect_left
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

from etcd3gw.exceptions import Etcd3Exception

from ...core.errors import StoreError, StoreUnavailable
from ...core.read_bounds import ReadBound
from ..backend import (
    Capability,
    Compare,
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
    prefix_end,
)
from ..base import StoreGuarantees
from ..urls import redacted_url
from .earlier import earlier_store
from .etcd_connection import EtcdConnection, Op, grpc_error, parse_etcd_url
from .etcd_watch import Follower

__all__ = ["EtcdBackend"]

GUARANTEES = StoreGuarantees(
    mutual_exclusion="one etcd txn per commit: its compares, writes and reads are decided "
    "together by Raft (linearizable), so etcd itself refuses a stale writer",
    durability="a commit is acknowledged once a majority of the etcd members has it in its "
    "fsynced log; a one-member etcd is only as durable as its one disk",
    across_hosts="yes: every node that reaches the cluster (etcds:// for mutual TLS); a 3- or "
    "5-member cluster keeps working while a minority of members is lost",
)

_PENDING_NOTICES = 1000  # notices waiting for a slow watcher; past this, one gap
_TXN_OPS = 128  # operations etcd takes in one txn by default (--max-txn-ops)
_PAGE_BYTES = 1024 * 1024  # the genuine values a scan page may fetch, at least
# What only the earlier etcd store named an agent's records (P/agents/A/<name>/...), and how
# many keys of P/agents/ are looked at for one (the first agent's checkpoints come first).
_EARLIER_FOLDERS = frozenset({"checkpoint-info", "checkpoints", "event-nodes", "heartbeats"})
_EARLIER_LOOKED = 1000


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _value(kv: Mapping[str, Any]) -> bytes:
    return base64.b64decode(kv.get("value", ""))  # the gateway omits an empty value


def _net_writes(writes: Sequence[Put | DeleteRange]) -> tuple[dict[str, bytes], list[DeleteRange]]:
    """What writes leave behind, as etcd takes it in one Txn: each key put once, and no
    delete-range holding a key put (cut around it). Blobs are made here, before any I/O."""
    puts: dict[str, bytes] = {}
    deletes: list[DeleteRange] = []
    for write in writes:
        if isinstance(write, Put):
            puts[write.key] = bytes(write.value)
            continue
        end = write.start + "\0" if write.end is None else write.end  # just after start
        for key in [k for k in puts if write.start <= k < end]:
            del puts[key]  # put, then deleted: as if never put
        deletes.append(write)
    put_keys = sorted(puts)
    cut: list[DeleteRange] = []
    for delete in deletes:
        if delete.end is None:
            if delete.start not in puts:
                cut.append(delete)
            continue
        start = delete.start
        for key in put_keys[bisect_left(put_keys, start) : bisect_left(put_keys, delete.end)]:
            if start < key:
                cut.append(DeleteRange(start, key))
            start = key + "\0"  # just after key: no key of the rules holds a NUL
        if start < delete.end:
            cut.append(DeleteRange(start, delete.end))
    return puts, cut


class EtcdBackend:
    """Keys to bytes in an etcd v3 cluster, under one key prefix."""

    guarantees = GUARANTEES
    capabilities = frozenset(
        {Capability.ATOMIC_READS, Capability.NOTICE_VALUES, Capability.CHEAP_WATCH}
    )

    def __init__(self, url: str) -> None:
        self.url = redacted_url(url)
        self.warnings: list[str] = []
        self.target = parse_etcd_url(url)
        self._connection = EtcdConnection(self.target)
        self._root = self.target.prefix.encode() + b"/"
        # etcd3gw takes a range's end as text, and encodes it as latin-1: so is it decoded.
        self._root_end = prefix_end(self._root.decode("latin-1"))
        self._followers: set[Follower] = set()
        self._earlier_looked = False

    def get(self, key: str, max_bytes: int) -> bytes | TooLarge | None:
        found = self._run(Txn(reads=[Get(key, max_bytes)]), "get").reads[0]
        assert not isinstance(found, ScanResult)
        return found

    def scan(self, prefix: str, bound: ReadBound, after: str = "") -> ScanResult:
        found = self._run(Txn(reads=[Scan(prefix, bound, after)]), "scan").reads[0]
        assert isinstance(found, ScanResult)
        return found

    def commit(self, txn: Txn) -> TxnResult:
        return self._run(txn, "commit")

    def _run(self, txn: Txn, what: str) -> TxnResult:
        puts, deletes = _net_writes(txn.all_writes)
        if not self._earlier_looked:
            self._refuse_an_earlier_store()
        writes = [
            {"request_put": {**self._range(k, None), "value": _b64(v)}} for k, v in puts.items()
        ]
        writes += [{"request_delete_range": self._range(d.start, d.end)} for d in deletes]
        reads = [self._read_range(read) for read in txn.reads]
        compares = [self._compare(compare) for compare in txn.compares]
        # The reads ride in the Txn while etcd takes that many operations; else they are
        # read right after it, at its revision: the same snapshot, one request more.
        in_txn = len(writes) + len(reads) <= _TXN_OPS
        inline = [{"request_range": read} for read in reads] if in_txn else []
        with self._connection.errors_translated(what):
            try:
                response = self._connection.txn(compares, writes + inline, inline)
            except Etcd3Exception as exc:
                self._refuse_over_limits(exc, puts, len(writes))
                raise
            succeeded = bool(response.get("succeeded"))
            revision = int(response["header"]["revision"])
            if in_txn:
                answers = response.get("responses", [])[len(writes) if succeeded else 0 :]
                found = [answer.get("response_range", {}) for answer in answers]
            else:
                found = self._ranges_at(reads, revision)
            pages = zip(txn.reads, found, strict=True)
            return TxnResult(succeeded, [self._read_result(r, p, revision) for r, p in pages])

    def _refuse_an_earlier_store(self) -> None:
        """ConfigError if the prefix has no index of agents and its first agent keys hold a
        name only the earlier etcd store wrote (one request, of keys only)."""
        index = self._range("index/", prefix_end("index/"), limit=1, keys_only=True)
        agents = self._range(
            "agents/", prefix_end("agents/"), limit=_EARLIER_LOOKED, keys_only=True
        )
        with self._connection.errors_translated("open"):
            listed, found = (page.get("kvs", []) for page in self._ranges_at([index, agents], 0))
        names = [] if listed else [self._key(kv) for kv in found]  # agents/A/<folder>/...
        earlier = [n for n in names if n.count("/") > 2 and n.split("/")[2] in _EARLIER_FOLDERS]
        if earlier:
            raise earlier_store(
                f"etcd store {self.url}", f"its key {self.target.prefix}/{earlier[0]}"
            )
        self._earlier_looked = True

    def _ranges_at(self, requests: list[Op], revision: int) -> list[Op]:
        """What range requests find at revision (0: the latest), _TXN_OPS a request."""
        found = []
        for first in range(0, len(requests), _TXN_OPS):
            batch = requests[first : first + _TXN_OPS]
            ops = [{"request_range": {**request, "revision": revision}} for request in batch]
            answers = self._connection.txn([], ops).get("responses", [])
            found += [answer.get("response_range", {}) for answer in answers]
        return found

    def _refuse_over_limits(self, exc: Etcd3Exception, puts: Mapping[str, bytes], ops: int) -> None:
        """A StoreError that says which of etcd's limits a commit passed, if it passed one."""
        message = grpc_error(exc)[1]
        if "request is too large" in message or "larger than max" in message:
            largest = max(map(len, puts.values()), default=0)
            raise StoreError(
                f"etcd store {self.url}: a commit writing {sum(map(len, puts.values()))} "
                f"bytes (its largest value {largest} bytes) was refused: {message}. etcd takes "
                "requests up to its --max-request-bytes (1.5 MiB by default): raise it on "
                "every member, or keep the values smaller"
            ) from exc
        if "too many operations" in message:
            raise StoreError(
                f"etcd store {self.url}: a commit of {ops} writes was refused: {message}. "
                f"etcd takes up to its --max-txn-ops ({_TXN_OPS} by default) in one txn: raise "
                "it on every member, or write less in one commit"
            ) from exc

    def _raw(self, key: str) -> bytes:
        """The etcd key of a backend key (surrogateescape: a planted key reads back as itself)."""
        return self._root + key.encode("utf-8", "surrogateescape")

    def _name(self, raw: bytes) -> str:
        """The backend key of an etcd key under the prefix."""
        return raw.removeprefix(self._root).decode("utf-8", "surrogateescape")

    def _key(self, kv: Mapping[str, Any]) -> str:
        return self._name(base64.b64decode(kv.get("key", "")))

    def _range(self, start: str, end: str | None, **options: Any) -> Op:
        """A range request (read or delete) of start alone, or of start up to end."""
        request = {"key": _b64(self._raw(start)), **options}
        if end is not None:
            request["range_end"] = _b64(self._raw(end))
        return request

    def _compare(self, compare: Compare) -> Op:
        key = _b64(self._raw(compare.key))
        if compare.value is None:
            return {"key": key, "target": "CREATE", "result": "EQUAL", "create_revision": 0}
        return {"key": key, "target": "VALUE", "result": "EQUAL", "value": _b64(compare.value)}

    def _read_range(self, read: Get | Scan) -> Op:
        if isinstance(read, Get):
            return self._range(read.key, None)
        return self._scan_page(read, read.after)

    def _scan_page(self, scan: Scan, after: str) -> Op:
        """A request of a scan's values after after: as many of entry_bytes as fit in
        total_bytes (or in _PAGE_BYTES, for small values, or names only: entry_bytes 0)."""
        start = after + "\0" if after >= scan.prefix else scan.prefix
        bound = scan.bound
        limit = min(bound.count, max(bound.total_bytes, _PAGE_BYTES) // max(1, bound.entry_bytes))
        names_only = {"keys_only": True} if bound.entry_bytes == 0 else {}
        # Past the prefix (an after beyond it), etcd finds nothing: start is above the end.
        return self._range(start, prefix_end(scan.prefix), limit=max(1, limit), **names_only)

    def _read_result(
        self, read: Get | Scan, found: Mapping[str, Any], revision: int
    ) -> bytes | TooLarge | ScanResult | None:
        if isinstance(read, Scan):
            return self._scan_pages(read, found, revision)
        kvs = found.get("kvs", [])
        if not kvs:
            return None
        value = _value(kvs[0])
        return TooLarge(read.key, len(value)) if len(value) > read.max_bytes else value

    def _scan_pages(self, scan: Scan, page: Mapping[str, Any], revision: int) -> ScanResult:
        """Take the first page's values, and read on at revision while the bound allows."""
        taker = ScanTaker(scan.bound)
        while True:
            kvs = page.get("kvs", [])
            for kv in kvs:
                if taker.full:
                    return taker.result(more=True)
                taker.take(self._key(kv), _value(kv))
            if not page.get("more"):
                return taker.result()
            if taker.full:
                return taker.result(more=True)
            [page] = self._ranges_at([self._scan_page(scan, self._key(kvs[-1]))], revision)

    async def watch(self, prefix: str) -> AsyncIterator[Notice]:
        """Notices from a thread that follows P/prefix (``Follower``), in the order etcd
        sent them; more than _PENDING_NOTICES unread collapse into one gap notice."""
        loop = asyncio.get_running_loop()
        pending: collections.deque[Notice] = collections.deque()
        arrived = asyncio.Event()

        def arrive(notice: Notice) -> None:
            if len(pending) >= _PENDING_NOTICES:
                pending.clear()
                notice = Notice(None)
            pending.append(notice)
            arrived.set()

        def tell(notice: Notice) -> None:
            with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits any more
                loop.call_soon_threadsafe(arrive, notice)

        end = self._raw(prefix_end(prefix))
        follower = Follower(self._connection, self._raw(prefix), end, self._name, tell)
        self._followers.add(follower)
        follower.start()
        try:
            while True:
                await arrived.wait()
                arrived.clear()
                while pending:
                    yield pending.popleft()
        finally:
            follower.stop()
            self._followers.discard(follower)

    def check(self) -> None:
        """StoreUnavailable, naming every endpoint, unless one answers a linearizable read
        (so a member cut off from its quorum does not count)."""
        reasons = []
        for _endpoint in self.target.endpoints:
            try:
                with self._connection.errors_translated("check"):
                    self._connection.kv.get(self._root, range_end=self._root_end, count_only=True)
                return
            except StoreUnavailable as exc:  # the next endpoint is tried
                reasons.append(str(exc))
        raise StoreUnavailable(
            f"no etcd endpoint of {self.url} answers ({self._connection.all_endpoints()}): "
            + "; ".join(reasons)
        )

    def close(self) -> None:
        """Stop every watch of this backend and close its connections."""
        for follower in list(self._followers):
            follower.stop()
        self._connection.close()
