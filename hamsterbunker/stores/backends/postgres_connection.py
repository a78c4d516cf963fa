"""How a PostgreSQL store URL becomes connections: the URL's checks, and a deadline on every call.

libpq parses the URL here too, without its password (so that none of its messages
can quote it): a misspelt option is one ConfigError line at start. psycopg's
blocking calls take no timeout: ``DEADLINES`` shuts the socket of a call that
outlives the URL's timeout, so that a frozen server or a silent network fails it.
"""

from __future__ import annotations

import itertools
import math
import os
import re
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from urllib.parse import unquote, urlunsplit

import psycopg
from psycopg.rows import TupleRow

from .network import UNENCODED, check_tls_files, query_of, split_url
from .network import url_error as bad

__all__ = [
    "DEADLINES",
    "Connection",
    "PostgresTarget",
    "connect",
    "connect_async",
    "one_line",
    "parse_postgres_url",
]

DEFAULT_TABLE = "hamsterbunker"
DEFAULT_TIMEOUT_S = 5.0

# A table name that needs no quoting in psql, and fits a NOTIFY channel's 63 bytes.
_TABLE = re.compile(r"[a-z_][a-z0-9_]{0,62}")
_HOST_PORT = re.compile(r"(\[[0-9A-Fa-f:.]+\]|[^\[\]:]+)(:[0-9]{1,5})?")
_SSLMODES = ("disable", "allow", "prefer", "require", "verify-ca", "verify-full")
_FILES = ("sslrootcert", "sslcert", "sslkey")

Connection = psycopg.Connection[TupleRow]
AsyncConnection = psycopg.AsyncConnection[TupleRow]


@dataclass(frozen=True)
class PostgresTarget:
    """What a store URL names: what libpq gets, our table and the bound of every call."""

    conninfo: str  # with its password: never shown
    table: str = DEFAULT_TABLE
    timeout: float = DEFAULT_TIMEOUT_S


def one_line(exc: BaseException) -> str:
    """An error's message on one line (libpq's run over several)."""
    return " ".join(str(exc).split())


def parse_postgres_url(url: str) -> PostgresTarget:
    """Check url and split it into what libpq gets and our options; ConfigError if bad."""
    unparsable = f"not a URL ({UNENCODED}; an IPv6 address in [ ])"
    parts = split_url(url, ("postgresql", "postgres"), unparsable)
    options = dict(query_of(url, parts))
    if parts.fragment:
        raise bad(url, "a PostgreSQL URL has no #fragment")
    if re.search(r"%(?![0-9A-Fa-f]{2})", url):
        raise bad(url, 'a "%" must start a percent-encoding (%25 for a "%" itself)')
    userinfo, _at, hosts = parts.netloc.rpartition("@")
    for item in hosts.split(","):
        matched = _HOST_PORT.fullmatch(item)
        if not matched or (matched[2] and not 0 < int(matched[2][1:]) < 65536):
            raise bad(url, f"{item!r} is not host:port (postgresql://user@db.example:5432/name)")
    if "/" in unquote(parts.path).removeprefix("/"):
        raise bad(url, "the path is one database name (postgresql://host:5432/name)")
    table = options.pop("table", DEFAULT_TABLE)
    if not _TABLE.fullmatch(table):
        raise bad(url, f"table must be 1-63 lower-case letters, digits or _, not {table!r}")
    timeout_text = options.pop("timeout", str(DEFAULT_TIMEOUT_S))
    timeout = float(timeout_text) if re.fullmatch(r"[0-9]+(\.[0-9]*)?", timeout_text) else 0
    if not 0 < timeout <= 600:
        raise bad(url, f"timeout must be seconds, above 0 and at most 600, not {timeout_text!r}")
    _check_tls_options(url, options)
    # Our options out, the rest of the query as written (libpq reads no "+" as a space).
    ours = ("table", "timeout")
    rest = "&".join(i for i in parts.query.split("&") if unquote(i.partition("=")[0]) not in ours)
    conninfo = urlunsplit(parts._replace(query=rest))
    user, colon, _password = userinfo.partition(":")
    without_password = urlunsplit(parts._replace(
        netloc=f"{user}{':x' if colon else ''}@{hosts}" if userinfo else hosts, query=rest
    ))  # fmt: skip
    try:
        psycopg.conninfo.conninfo_to_dict(without_password)
    except psycopg.Error as exc:
        raise bad(url, one_line(exc)) from None
    # libpq waits for a connection for ever unless told otherwise (it takes whole seconds, >= 2).
    defaults: dict[str, str | int] = {
        "connect_timeout": max(2, math.ceil(timeout)),
        "application_name": "hamsterbunker",
    }
    conninfo = psycopg.conninfo.make_conninfo(
        conninfo, **{k: v for k, v in defaults.items() if k not in options}
    )
    return PostgresTarget(conninfo, table, timeout)


def _check_tls_options(url: str, options: dict[str, str]) -> None:
    """ConfigError for an sslmode libpq does not know, or TLS files that cannot be used."""
    if options.get("sslmode", "prefer") not in _SSLMODES:
        raise bad(url, f"sslmode must be one of {', '.join(_SSLMODES)}")
    for name in _FILES:
        path = options.get(name)
        if path and path != "system" and not os.path.exists(path):
            raise bad(url, f"{name} {path} does not exist")
    rootcert = options.get("sslrootcert")
    check_tls_files(
        url,
        ("sslrootcert", None if rootcert == "system" else rootcert),
        ("sslcert", options.get("sslcert")),
        ("sslkey", options.get("sslkey")),
        options.get("sslpassword"),
    )


def connect(target: PostgresTarget) -> Connection:
    """A connection whose transactions are SERIALIZABLE and commit synchronously, and
    which the server ends once it is left idle inside a transaction for the URL's timeout."""
    conn = psycopg.connect(target.conninfo, autocommit=True)
    try:
        conn.isolation_level = psycopg.IsolationLevel.SERIALIZABLE
        # No call of ours outlasts the timeout: a transaction idle that long is one whose
        # client was cut off, holding its rows' locks (docs/design.md).
        idle_ms = math.ceil(target.timeout * 1000)
        with DEADLINES.bound(conn.fileno(), target.timeout):
            conn.execute(
                "SET synchronous_commit TO on;"
                f" SET idle_in_transaction_session_timeout TO {idle_ms}"
            )
    except BaseException:
        conn.close()
        raise
    return conn


async def connect_async(target: PostgresTarget) -> AsyncConnection:
    """An asyncio connection (a watch's) that runs single statements."""
    return await psycopg.AsyncConnection.connect(target.conninfo, autocommit=True)


class _Deadlines:
    """Shuts the socket of a call that outlives its deadline: a wait on it returns and the
    call fails with OperationalError. One thread, started on first use, serves every
    connection of the process."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._calls: dict[int, tuple[float, int]] = {}  # call -> (deadline, socket fd)
        self._expired: set[int] = set()
        self._ids = itertools.count()
        self._thread: threading.Thread | None = None

    @contextmanager
    def bound(self, fd: int, seconds: float) -> Iterator[None]:
        """Bound what is done inside on the connection of socket fd to seconds."""
        call = next(self._ids)
        with self._changed:
            self._calls[call] = (time.monotonic() + seconds, fd)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="postgres-deadlines", daemon=True
                )
                self._thread.start()
            self._changed.notify()
        try:
            yield
        except psycopg.OperationalError as exc:
            with self._changed:
                expired = call in self._expired
            if expired:
                raise psycopg.OperationalError(f"no answer within {seconds:g} s") from exc
            raise
        finally:
            with self._changed:
                self._calls.pop(call, None)
                self._expired.discard(call)

    def _run(self) -> None:
        with self._changed:
            while True:
                now = time.monotonic()
                for call, (deadline, fd) in list(self._calls.items()):
                    if deadline <= now:
                        # Under the lock: the call has not ended, so fd is still its socket.
                        del self._calls[call]
                        self._expired.add(call)
                        _shut(fd)
                nearest = min((deadline for deadline, _fd in self._calls.values()), default=None)
                self._changed.wait(None if nearest is None else nearest - now)


def _shut(fd: int) -> None:
    """Shut a socket down for both directions: a wait on it returns, and its reads fail."""
    with suppress(OSError), socket.socket(fileno=os.dup(fd)) as sock:  # OSError: gone already
        sock.shutdown(socket.SHUT_RDWR)


DEADLINES = _Deadlines()
