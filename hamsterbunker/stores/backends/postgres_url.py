"""How a PostgreSQL store URL becomes what libpq connects with: checked before any connection.

``postgresql://USER[:PASSWORD]@HOST[:PORT][,HOST[:PORT]...]/DB[?options]`` (or
``postgres://``). Our options, ``table`` and ``timeout``, are taken out; the rest
are libpq's, and libpq parses the URL here too (without its password, so that
none of its messages can quote it), so a misspelt option is one ConfigError line
at start rather than a failure at every connection.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import parse_qsl, unquote, urlsplit, urlunsplit

import psycopg

from ...errors import ConfigError
from .._tls import tls_files_problem
from ..urls import redacted_url

__all__ = ["DEFAULT_TABLE", "DEFAULT_TIMEOUT_S", "PostgresTarget", "one_line", "parse_postgres_url"]

DEFAULT_TABLE = "hamsterbunker"
DEFAULT_TIMEOUT_S = 5.0

# A table name that needs no quoting in psql, and fits a NOTIFY channel's 63 bytes.
_TABLE = re.compile(r"[a-z_][a-z0-9_]{0,62}")
_HOST_PORT = re.compile(r"(\[[0-9A-Fa-f:.]+\]|[^\[\]:]+)(:[0-9]{1,5})?")
_SSLMODES = ("disable", "allow", "prefer", "require", "verify-ca", "verify-full")
_FILES = ("sslrootcert", "sslcert", "sslkey", "sslcrl", "sslcrldir")


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

    def bad(why: str) -> ConfigError:
        return ConfigError(f"store URL {redacted_url(url)!r}: {why}")

    unencoded = 'a "/", "?", "#" or "@" in a user name or password must be percent-encoded'
    try:
        parts = urlsplit(url)
    except ValueError:  # not quoted: its words can hold the URL's authority
        raise bad(f"not a URL ({unencoded}; an IPv6 address in [ ])") from None
    if parts.scheme not in ("postgresql", "postgres"):
        raise bad("not a postgresql:// or postgres:// URL")
    query = parse_qsl(parts.query, keep_blank_values=True)
    if "@" in parts.path + parts.fragment or any("@" in key for key, _value in query):
        raise bad(f"an @ after the host ({unencoded})")
    if parts.fragment:
        raise bad("a PostgreSQL URL has no #fragment")
    if re.search(r"%(?![0-9A-Fa-f]{2})", url):
        raise bad('a "%" must start a percent-encoding (%25 for a "%" itself)')
    userinfo, _at, hosts = parts.netloc.rpartition("@")
    for item in hosts.split(","):
        matched = _HOST_PORT.fullmatch(item)
        if not matched or (matched[2] and not 0 < int(matched[2][1:]) < 65536):
            raise bad(f"{item!r} is not host:port (postgresql://user@db.example:5432/name)")
    if "/" in unquote(parts.path).removeprefix("/"):
        raise bad("the path is one database name (postgresql://host:5432/name)")
    options = dict(query)
    table = options.pop("table", DEFAULT_TABLE)
    if not _TABLE.fullmatch(table):
        raise bad(f"table must be 1-63 lower-case letters, digits or _, not {table!r}")
    timeout = _timeout(options.pop("timeout", None), bad)
    if options.get("sslmode", "prefer") not in _SSLMODES:
        raise bad(f"sslmode must be one of {', '.join(_SSLMODES)}")
    for name in _FILES:
        path = options.get(name)
        if path and path != "system" and not os.path.exists(path):
            raise bad(f"{name} {path} does not exist")
    rootcert = options.get("sslrootcert")
    problem = tls_files_problem(
        ca=("sslrootcert", None if rootcert == "system" else rootcert),
        cert=("sslcert", options.get("sslcert")),
        key=("sslkey", options.get("sslkey")),
        password=options.get("sslpassword"),
    )
    if problem is not None:
        raise bad(problem)
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
        raise bad(one_line(exc)) from None
    # libpq waits for a connection for ever unless told otherwise (it takes whole seconds, >= 2).
    defaults: dict[str, str | int] = {
        "connect_timeout": max(2, math.ceil(timeout)),
        "application_name": "hamsterbunker",
    }
    conninfo = psycopg.conninfo.make_conninfo(
        conninfo, **{k: v for k, v in defaults.items() if k not in options}
    )
    return PostgresTarget(conninfo, table, timeout)


def _timeout(text: str | None, bad: Callable[[str], ConfigError]) -> float:
    if text is None:
        return DEFAULT_TIMEOUT_S
    try:
        timeout = float(text)
    except ValueError:
        timeout = math.nan
    if not 0 < timeout <= 600:
        raise bad(f"timeout must be a number of seconds above 0 and at most 600, not {text!r}")
    return timeout
