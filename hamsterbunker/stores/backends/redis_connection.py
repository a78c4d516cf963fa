"""How a Redis store URL becomes redis-py clients: the URL's checks (``parse_redis_url``), the
options every client of a store shares, the server's persistence settings in words, and
redis-py's errors translated at the store boundary (``errors_translated``)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import redis
import redis.asyncio
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.retry import Retry

from ...core.errors import ConfigError, StoreError
from ...records import check_name
from .._tls import TlsOption
from ..urls import redacted_url
from .network import UNENCODED, check_file, check_tls_files, connection_error, query_of, split_url
from .network import url_error as bad

__all__ = ["DEFAULT_PREFIX", "DEFAULT_TIMEOUT_S", "RedisConnection", "parse_redis_url"]

log = logging.getLogger("hamsterbunker.stores.redis")

DEFAULT_PREFIX = "hamsterbunker"
DEFAULT_TIMEOUT_S = 2.0

_TLS_FILES = (
    "ssl_certfile",
    "ssl_keyfile",
    "ssl_ca_certs",
    "ssl_ca_path",
)  # ssl_ca_path: a directory


def parse_redis_url(url: str) -> tuple[str, str]:
    """Split a store URL into the URL redis-py gets and our key prefix; ConfigError if bad."""
    parts = split_url(url, ("redis", "rediss"), f"no valid host and port ({UNENCODED})", port=True)
    query = query_of(url, parts)
    if not parts.hostname:
        raise bad(url, "a Redis URL needs a host (redis://host:6379/0)")
    db = parts.path.strip("/")
    if db and not db.isdigit():
        raise bad(url, f"the path is the database number, not {db!r}")
    tls_options = sorted({key for key, _value in query if key.startswith("ssl_")})
    if parts.scheme == "redis" and tls_options:
        raise bad(url, f"{', '.join(tls_options)} are TLS options: use rediss://")
    for key, value in query:
        if key in _TLS_FILES:
            check_file(url, key, value, directory=key == "ssl_ca_path")
    options = dict(query)
    check_tls_files(url, *_tls_files(options), password=options.get("ssl_password"))
    prefixes = [value for key, value in query if key == "prefix"]
    prefix = check_name("Redis key prefix", prefixes[-1] if prefixes else DEFAULT_PREFIX)
    rest = urlencode([(key, value) for key, value in query if key != "prefix"])
    return urlunsplit(parts._replace(query=rest)), prefix


def _tls_files(options: dict[str, str]) -> tuple[TlsOption, TlsOption, TlsOption]:
    """The CA (file or directory), client certificate and key that the URL's options name."""
    ca_option = "ssl_ca_path" if "ssl_ca_path" in options else "ssl_ca_certs"
    return (
        (ca_option, options.get(ca_option)),
        ("ssl_certfile", options.get("ssl_certfile")),
        ("ssl_keyfile", options.get("ssl_keyfile")),
    )


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
        # No retries of redis-py's own: a write retried after an unanswered try could apply twice.
        self.options: dict[str, Any] = {"retry": Retry(NoBackoff(), 0)}
        query = dict(parse_qsl(parts.query))  # as redis-py reads it: blank values dropped
        for option in ("socket_timeout", "socket_connect_timeout"):
            if option not in query:
                self.options[option] = DEFAULT_TIMEOUT_S
        self._ca, self._cert, _key = _tls_files(query)

    def client(self) -> redis.Redis:
        """A blocking client; ConfigError for options redis-py does not take."""
        try:
            # One client serves a process: past the pool's size a call waits for a connection,
            # as long as a reply may take, rather than fail (redis-py's own pool refuses).
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
        options = {**self.options, "retry": AsyncRetry(NoBackoff(), 0)}  # no retries: as above
        return redis.asyncio.from_url(self.client_url, **options)

    @contextmanager
    def errors_translated(self, what: str) -> Iterator[None]:
        """redis-py's errors raised inside as store errors naming the call and the server."""
        try:
            yield
        except redis.RedisError as exc:
            where = f"redis store {what} ({self.server})"
            if isinstance(exc, redis.AuthenticationError | redis.exceptions.AuthorizationError):
                raise StoreError(f"{where}: refused: {exc}") from exc
            if isinstance(exc, redis.ConnectionError | redis.TimeoutError | redis.ReadOnlyError):
                # ReadOnlyError: we reached a replica (a failover in progress).
                raise connection_error(where, exc, str(exc), ca=self._ca, cert=self._cert) from exc
            raise StoreError(f"{where}: {exc}") from exc

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
