"""How a Redis store URL becomes redis-py clients, and what the server says back.

The URL's checks (parse_redis_url: ConfigError before anything connects), the
connection options every client of a store shares, a refused TLS handshake and
the server's persistence settings in words, and redis-py's errors translated at
the store boundary (errors_translated).
"""

from __future__ import annotations

import logging
import os
import ssl
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import redis
import redis.asyncio
from redis.backoff import NoBackoff
from redis.retry import Retry

from ...core.errors import ConfigError, StoreError, StoreUnavailable
from ...records import check_name
from .._tls import describe_tls_failure, tls_error_in, tls_files_problem
from ..urls import redacted_url

__all__ = ["DEFAULT_PREFIX", "DEFAULT_TIMEOUT_S", "RedisConnection", "parse_redis_url"]

log = logging.getLogger("hamsterbunker.stores.redis")

DEFAULT_PREFIX = "hamsterbunker"
DEFAULT_TIMEOUT_S = 2.0

# The redis-py options that name files: checked at parse time, so a wrong path
# is one clear line at start rather than "Error 2 connecting ... No such file".
_TLS_FILES = {
    "ssl_certfile": "file",
    "ssl_keyfile": "file",
    "ssl_ca_certs": "file",
    "ssl_ca_path": "directory",
}


def parse_redis_url(url: str) -> tuple[str, str]:
    """Split a store URL into the URL redis-py gets and our key prefix; ConfigError if bad."""
    shown = redacted_url(url)
    # A "/", "?" or "#" of a password not percent-encoded ends the authority early and puts
    # the rest of the password in the path, query or fragment: never quoted back.
    unencoded = 'a "/", "?", "#" or "@" in a user name or password must be percent-encoded'
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 (raises ValueError for a port that is not a number)
    except ValueError:
        raise ConfigError(f"store URL {shown!r}: no valid host and port ({unencoded})") from None
    if parts.scheme not in ("redis", "rediss"):
        raise ConfigError(f"store URL {shown!r}: not a redis:// or rediss:// URL")
    query = parse_qsl(parts.query, keep_blank_values=True)
    if "@" in parts.path + parts.fragment or any("@" in key for key, _value in query):
        raise ConfigError(f"store URL {shown!r}: an @ after the host ({unencoded})")
    if not parts.hostname:
        raise ConfigError(f"store URL {shown!r}: a Redis URL needs a host (redis://host:6379/0)")
    db = parts.path.strip("/")
    if db and not db.isdigit():
        raise ConfigError(f"store URL {shown!r}: the path is the database number, not {db!r}")
    tls_options = sorted({key for key, _value in query if key.startswith("ssl_")})
    if parts.scheme == "redis" and tls_options:
        raise ConfigError(
            f"store URL {shown!r}: {', '.join(tls_options)} are TLS options: use rediss://"
        )
    for key, value in query:
        kind = _TLS_FILES.get(key)
        if kind == "file" and not os.path.isfile(value):
            raise ConfigError(f"store URL {shown!r}: {key} file {value} does not exist")
        if kind == "directory" and not os.path.isdir(value):
            raise ConfigError(f"store URL {shown!r}: {key} directory {value} does not exist")
    options = dict(query)
    problem = tls_files_problem(
        ca=("ssl_ca_path", options["ssl_ca_path"])
        if "ssl_ca_path" in options
        else ("ssl_ca_certs", options.get("ssl_ca_certs")),
        cert=("ssl_certfile", options.get("ssl_certfile")),
        key=("ssl_keyfile", options.get("ssl_keyfile")),
        password=options.get("ssl_password"),
    )
    if problem is not None:
        raise ConfigError(f"store URL {shown!r}: {problem}")
    prefixes = [value for key, value in query if key == "prefix"]
    prefix = check_name("Redis key prefix", prefixes[-1] if prefixes else DEFAULT_PREFIX)
    rest = urlencode([(key, value) for key, value in query if key != "prefix"])
    return urlunsplit(parts._replace(query=rest)), prefix


# Connections one blocking client keeps open at most (its calls wait for one past that).
MAX_CONNECTIONS = 64


class RedisConnection:
    """What a store URL names: the server, the key prefix and the options of every client."""

    def __init__(self, url: str) -> None:
        self.client_url, self.prefix = parse_redis_url(url)
        self.url = redacted_url(url)
        parts = urlsplit(self.client_url)
        host = parts.hostname or ""
        self.server = (
            f"[{host}]:{parts.port or 6379}" if ":" in host else f"{host}:{parts.port or 6379}"
        )
        # redis-py's own retries are off: a write retried after an unanswered
        # first try could apply twice.
        self.options: dict[str, Any] = {"retry": Retry(NoBackoff(), 0)}
        self._query = dict(parse_qsl(parts.query))
        for option in ("socket_timeout", "socket_connect_timeout"):
            if option not in self._query:
                self.options[option] = DEFAULT_TIMEOUT_S

    def client(self) -> redis.Redis:
        """A blocking client; ConfigError for options redis-py does not take."""
        try:
            # One client serves every agent of a process (and each agent's store threads):
            # past the pool's size a call waits for a connection, as long as a reply may
            # take, rather than fail (redis-py's own pool refuses past 100).
            pool = redis.BlockingConnectionPool.from_url(
                self.client_url,
                **{"max_connections": MAX_CONNECTIONS, **self.options},
                timeout=self.options.get("socket_timeout", DEFAULT_TIMEOUT_S),
            )
            client = redis.Redis(connection_pool=pool)
            client.auto_close_connection_pool = True
            # Connections are made lazily; making one object (no I/O) checks the
            # options now, so a misspelt one is a ConfigError at start, not later.
            client.connection_pool.make_connection()
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"store URL {self.url!r}: {exc}") from exc
        return client

    def async_client(self) -> redis.asyncio.Redis:
        """An asyncio client (the watch's pub/sub), with the same options."""
        return redis.asyncio.from_url(self.client_url, **self.options)

    @contextmanager
    def errors_translated(self, what: str) -> Iterator[None]:
        """Translate redis-py's errors raised inside into store errors, keeping the reason.

        The message names the call and the server; a refused TLS handshake says
        which side's certificate was not accepted, in words rather than OpenSSL's.
        """
        try:
            yield
        except redis.RedisError as exc:
            where = f"redis store {what} ({self.server})"
            if isinstance(exc, redis.AuthenticationError | redis.exceptions.AuthorizationError):
                raise StoreError(f"{where}: refused: {exc}") from exc
            if isinstance(exc, redis.ConnectionError | redis.TimeoutError | redis.ReadOnlyError):
                # ReadOnlyError: we reached a replica (a failover in progress).
                tls = tls_error_in(exc)
                if tls is not None:
                    # Certificates that do not match are a setting to fix, not an outage
                    # to wait out (a node starting would wait for it for ever).
                    raise StoreError(f"{where}: {self.describe_tls(tls)}") from exc
                raise StoreUnavailable(f"{where}: {exc}") from exc
            raise StoreError(f"{where}: {exc}") from exc

    def describe_tls(self, error: ssl.SSLError) -> str:
        """What a TLS failure of a connection to this server means, in one line."""
        options = self._query
        return describe_tls_failure(
            error,
            ca=options.get("ssl_ca_certs") or options.get("ssl_ca_path"),
            ca_option="ssl_ca_path" if "ssl_ca_path" in options else "ssl_ca_certs",
            cert=options.get("ssl_certfile"),
            cert_option="ssl_certfile",
        )

    def persistence_warnings(self, client: redis.Redis) -> list[str]:
        """Warn when the server's settings can lose acknowledged checkpoints (best effort)."""
        try:
            settings: dict[str, str] = {}
            for name in ("appendonly", "appendfsync", "maxmemory-policy"):
                settings.update({_text(k): _text(v) for k, v in client.config_get(name).items()})
        except redis.ResponseError as exc:  # CONFIG is often disabled on managed Redis
            return [
                f"Redis store {self.url}: cannot read the server's persistence settings ({exc}); "
                "make sure it runs with appendonly yes and appendfsync always"
            ]
        except redis.RedisError as exc:  # unreachable now; the nodes will say so soon enough
            log.debug("redis store %s: persistence not checked: %s", self.url, exc)
            return []
        warnings = []
        if settings.get("appendonly") != "yes":
            warnings.append(
                f"Redis store {self.url}: appendonly is off, so a restart of Redis loses every "
                "lease and checkpoint written since its last snapshot. Set appendonly yes and "
                "appendfsync always."
            )
        elif settings.get("appendfsync") != "always":
            warnings.append(
                f"Redis store {self.url}: appendfsync is {settings.get('appendfsync')}, so a "
                "crash of the machine can lose acknowledged checkpoints. Set appendfsync always."
            )
        if settings.get("maxmemory-policy", "").startswith("allkeys-"):
            warnings.append(
                f"Redis store {self.url}: maxmemory-policy {settings['maxmemory-policy']} may "
                "evict leases and checkpoints. Use noeviction."
            )
        return warnings


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
