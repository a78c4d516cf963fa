"""A backend in one PostgreSQL table: ``postgresql://USER[:PASSWORD]@HOST:PORT/DB[?options]``.

Layout: one table, ``key text COLLATE "C" PRIMARY KEY, value bytea NOT NULL``, created
on first use; the C collation makes key order code point order, as the interface
wants. ``table=NAME`` (default ``hamsterbunker``) lets several clusters share one
database; ``timeout=SECONDS`` (default 5) bounds every call; every other option
(``sslmode``, ``sslrootcert``, ``target_session_attrs``, ...) is libpq's.

A commit is one SERIALIZABLE transaction: compares, writes in order, reads. Of two
commits that conflict PostgreSQL aborts one (a serialization failure or a
deadlock); it is tried again from the start, a bounded number of times.
synchronous_commit is on: a commit is in the write-ahead log on disk, and on every
synchronous standby, before it returns.

Reads are bounded in SQL: a value's size is measured (``octet_length``, from its
header) before it is sent, and a value over the bound's entry bytes, or past its
total, is never sent. A commit NOTIFYs each key it changed on a channel named as
the table; a watch LISTENs on a connection of its own.
"""

from __future__ import annotations

import asyncio
import logging
import random
import select
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import aclosing, contextmanager, suppress
from typing import Any

import psycopg
from psycopg import sql
from psycopg.pq import TransactionStatus
from psycopg.rows import TupleRow

from ...core.errors import StoreError, StoreUnavailable
from ...core.read_bounds import ReadBound
from ..backend import (
    MAX_KEY_CHARS,
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
    prefix_end,
)
from ..base import StoreGuarantees
from ..urls import redacted_url
from .postgres_connection import (
    DEADLINES,
    Connection,
    connect,
    connect_async,
    one_line,
    parse_postgres_url,
)

__all__ = ["PostgresBackend"]

log = logging.getLogger("hamsterbunker.stores.postgres")

GUARANTEES = StoreGuarantees(
    mutual_exclusion="one SERIALIZABLE PostgreSQL transaction per commit",
    durability="synchronous_commit on: in the server's write-ahead log on disk (and on its "
    "synchronous standbys) before a commit returns; the server must run with fsync on",
    across_hosts="every node reaches one primary; across regions, a primary with synchronous "
    "standbys (synchronous_standby_names), so that a failover loses no acknowledged commit",
)

_ATTEMPTS = 30  # a commit's tries while concurrent commits keep winning
_WATCH_POLL_S = 1.0  # a gap this often while a watch cannot listen
_WATCH_PING_S = 5.0  # a quiet watch asks the server this often whether it is still there

Cursor = psycopg.Cursor[TupleRow]
_CREATED_MEANWHILE = (
    psycopg.errors.DuplicateTable,
    psycopg.errors.DuplicateObject,
    psycopg.errors.UniqueViolation,
)


class PostgresBackend:
    """Keys to bytes in a PostgreSQL table, through a pool of connections of this client."""

    guarantees = GUARANTEES
    capabilities = frozenset({Capability.ATOMIC_READS, Capability.CHEAP_WATCH})

    def __init__(self, url: str) -> None:
        self._target = parse_postgres_url(url)
        self.url = redacted_url(url)
        self.warnings: list[str] = []
        self._timeout = self._target.timeout
        self._idle: list[Connection] = []
        self._lock = threading.Lock()
        self._closed = False
        self._table_made = False
        self._sql = _Statements(self._target.table)

    def get(self, key: str, max_bytes: int) -> bytes | TooLarge | None:
        with self._cursor("get") as cur:
            return self._get(cur, Get(key, max_bytes))

    def scan(self, prefix: str, bound: ReadBound, after: str = "") -> ScanResult:
        with self._cursor("scan") as cur:
            return self._scan(cur, Scan(prefix, bound, after))

    def commit(self, txn: Txn) -> TxnResult:
        # Values are made before the transaction: a blob's pieces are made once, and may
        # take a while.
        writes = [Put(w.key, bytes(w.value)) if isinstance(w, Put) else w for w in txn.all_writes]
        lost = (psycopg.errors.SerializationFailure, psycopg.errors.DeadlockDetected)
        with self._connection("commit") as conn:
            attempt = 1
            while True:
                try:
                    with DEADLINES.bound(conn.fileno(), self._timeout):
                        return self._commit_once(conn, txn, writes)
                except lost as exc:
                    if attempt == _ATTEMPTS:
                        raise StoreError(
                            f"postgres store commit ({self.url}): {attempt} tries lost to "
                            f"concurrent commits, nothing written ({one_line(exc)})"
                        ) from exc
                # Another commit won: try again after a random pause, so racers spread out.
                time.sleep(random.uniform(0, min(0.2, 0.002 * 2**attempt)))
                attempt += 1

    async def watch(self, prefix: str) -> AsyncIterator[Notice]:
        """LISTEN on a connection of the watch's own. A gap (Notice(None)) after each
        reconnection, and every poll interval while it cannot listen."""
        reconnected = False
        while True:
            try:
                conn = await connect_async(self._target)
            except psycopg.Error as exc:
                log.debug("postgres store %s: cannot listen (%s)", self.url, one_line(exc))
                yield Notice(None)
                await asyncio.sleep(_WATCH_POLL_S)
                reconnected = True
                continue
            try:
                with DEADLINES.bound(conn.fileno(), self._timeout):
                    await conn.execute(self._sql.listen)
                if reconnected:
                    yield Notice(None)  # what changed while nobody listened went unheard
                reconnected = True
                while True:
                    async with aclosing(conn.notifies(timeout=_WATCH_PING_S)) as heard:
                        async for notify in heard:
                            if not notify.payload or notify.payload.startswith(prefix):
                                yield Notice(notify.payload or None)
                    # Nothing heard for a while: a server gone silent fails this.
                    with DEADLINES.bound(conn.fileno(), self._timeout):
                        await conn.execute("SELECT 1")
            except psycopg.Error as exc:
                log.debug("postgres store %s: listening ended (%s)", self.url, one_line(exc))
            finally:
                await conn.close()

    def check(self) -> None:
        with self._cursor("check") as cur:
            cur.execute("SELECT 1")

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    # -- one transaction -------------------------------------------------------

    def _commit_once(
        self, conn: Connection, txn: Txn, writes: list[Put | DeleteRange]
    ) -> TxnResult:
        # A failed compare commits the transaction too, having written nothing: under
        # SERIALIZABLE, what a transaction read is only known consistent once it commits.
        with conn.transaction(), conn.cursor(binary=True) as cur:
            held = self._compares_hold(cur, txn)
            if held:
                for write in writes:
                    self._write(cur, write)
            reads = [
                self._get(cur, r) if isinstance(r, Get) else self._scan(cur, r) for r in txn.reads
            ]
        return TxnResult(held, reads)

    def _compares_hold(self, cur: Cursor, txn: Txn) -> bool:
        if not txn.compares:
            return True
        keys = [c.key for c in txn.compares]
        values = [c.value for c in txn.compares]
        row = cur.execute(self._sql.compare, {"keys": keys, "values": values}).fetchone()
        return row is not None and row[0] == 0

    def _write(self, cur: Cursor, write: Put | DeleteRange) -> None:
        if isinstance(write, Put):
            cur.execute(self._sql.put, {"key": write.key, "value": write.value})
        elif write.end is None:
            cur.execute(self._sql.delete_key, {"start": write.start})
        else:
            cur.execute(self._sql.delete_range, {"start": write.start, "end": write.end})

    def _get(self, cur: Cursor, read: Get) -> bytes | TooLarge | None:
        row = cur.execute(self._sql.get, {"key": read.key, "max": read.max_bytes}).fetchone()
        if row is None or row[0] is None:  # no row, or a NULL planted by a raw writer
            return None
        size, value = row
        return TooLarge(read.key, size) if value is None else bytes(value)

    def _scan(self, cur: Cursor, scan: Scan) -> ScanResult:
        bound = scan.bound
        rows = cur.execute(
            self._sql.scan,
            {"low": scan.prefix, "after": scan.after, "end": prefix_end(scan.prefix),
             "entry": bound.entry_bytes, "total": bound.total_bytes, "limit": bound.count + 1},
        ).fetchall()  # fmt: skip
        taker = ScanTaker(bound)
        for key, size, value in rows:
            if taker.full:
                return taker.result(more=True)
            if taker.left_out(key, size):
                continue
            if value is None:  # past the total bytes: the server did not send it
                return taker.result(more=True)
            taker.take(key, bytes(value))
        return taker.result()

    # -- connections -----------------------------------------------------------

    @contextmanager
    def _cursor(self, what: str) -> Iterator[Cursor]:
        """A cursor of a pooled connection for one statement outside a transaction, bounded."""
        with (
            self._connection(what) as conn,
            DEADLINES.bound(conn.fileno(), self._timeout),
            conn.cursor(binary=True) as cur,
        ):
            yield cur

    @contextmanager
    def _connection(self, what: str) -> Iterator[Connection]:
        """A connection of the pool, given back after; psycopg's errors translated."""
        try:
            conn = self._take()
            try:
                yield conn
            finally:
                self._give_back(conn)
        except psycopg.Error as exc:
            # A connection lost or refused, or a standby reached (25006): not there for now.
            unavailable = isinstance(exc, psycopg.OperationalError) or exc.sqlstate == "25006"
            error = StoreUnavailable if unavailable else StoreError
            raise error(f"postgres store {what} ({self.url}): {one_line(exc)}") from exc

    def _take(self) -> Connection:
        while True:
            with self._lock:
                idle = self._idle.pop() if self._idle else None
            if idle is None:
                break
            # Nothing is due on an idle connection: what it has to read is the server's
            # goodbye (a restart, a crash). Dropped now, it fails no call.
            waiting = select.poll()
            waiting.register(idle.fileno(), select.POLLIN)
            if not waiting.poll(0):
                return idle
            idle.close()
        conn = connect(self._target)
        if not self._table_made:
            try:
                # Another client may create it at the same moment: IF NOT EXISTS takes no
                # lock, and the loser hears of the table, its row type or their catalog rows.
                with DEADLINES.bound(conn.fileno(), self._timeout), suppress(*_CREATED_MEANWHILE):
                    conn.execute(self._sql.create)
            except BaseException:
                conn.close()
                raise
            self._table_made = True
        return conn

    def _give_back(self, conn: Connection) -> None:
        idle = not conn.closed and conn.info.transaction_status == TransactionStatus.IDLE
        with self._lock:
            if idle and not self._closed:
                self._idle.append(conn)
                return
        conn.close()


class _Statements:
    """The SQL of one table, composed once."""

    def __init__(self, table: str) -> None:
        names: dict[str, Any] = {
            "t": sql.Identifier(table),
            "channel": sql.Literal(table),
            "max_key": sql.Literal(MAX_KEY_CHARS),
        }

        def make(text: str) -> sql.Composed:
            return sql.SQL(text).format(**names)

        self.create = make(
            'CREATE TABLE IF NOT EXISTS {t} (key text COLLATE "C" PRIMARY KEY, value bytea NOT NULL)'
        )
        self.listen = make("LISTEN {t}")
        # A key no longer than a key may be is its own notice; one longer (planted) would
        # not fit NOTIFY's payload: an empty payload says "some key" instead.
        notify = (
            "SELECT count(pg_notify({channel},"
            " CASE WHEN octet_length(key) <= {max_key} THEN key ELSE '' END)) FROM changed"
        )
        self.put = make(
            "WITH changed AS (INSERT INTO {t} (key, value) VALUES (%(key)s, %(value)b)"
            " ON CONFLICT (key) DO UPDATE SET value = excluded.value RETURNING key) " + notify
        )
        self.delete_key = make(
            "WITH changed AS (DELETE FROM {t} WHERE key = %(start)s RETURNING key) " + notify
        )
        self.delete_range = make(
            "WITH changed AS (DELETE FROM {t} WHERE key >= %(start)s AND key < %(end)s"
            " RETURNING key) " + notify
        )
        # The compares that do not hold: a value other than the one expected, or one
        # where none was (NULL: absence).
        self.compare = make(
            "SELECT count(*) FROM unnest(%(keys)s::text[], %(values)s::bytea[]) AS c(key, value)"
            " LEFT JOIN {t} AS s ON s.key = c.key WHERE s.value IS DISTINCT FROM c.value"
        )
        self.get = make(
            "SELECT octet_length(value), CASE WHEN octet_length(value) <= %(max)s THEN value END"
            " FROM {t} WHERE key = %(key)s"
        )
        # In key order: each row's size, and its value only if within the entry bytes and
        # the running total of values taken so far. Keys longer than a key may be
        # (planted) are passed over: their rows could not keep to a read's bound.
        self.scan = make(
            "SELECT key, size, CASE WHEN size <= %(entry)s AND taken <= %(total)s THEN value END"
            " FROM (SELECT key, value, octet_length(value) AS size,"
            "  sum(CASE WHEN octet_length(value) <= %(entry)s THEN octet_length(value) ELSE 0 END)"
            "   OVER (ORDER BY key ROWS UNBOUNDED PRECEDING) AS taken"
            "  FROM {t} WHERE key >= %(low)s AND key > %(after)s AND key < %(end)s"
            "   AND value IS NOT NULL AND octet_length(key) <= {max_key}"
            "  ORDER BY key LIMIT %(limit)s) AS found ORDER BY key"
        )
