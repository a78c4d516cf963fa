"""How an etcd store URL becomes clients of its members (``parse_etcd_url``, one HTTP client
per endpoint, the next member after a failure) and their errors at the store boundary."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, cast
from urllib.parse import parse_qsl, unquote

import requests
from etcd3gw.client import Etcd3Client
from etcd3gw.exceptions import ConnectionFailedError, ConnectionTimeoutError, Etcd3Exception

from ...core.errors import StoreError, StoreUnavailable
from .._tls import error_in
from .network import check_file, check_tls_files, connection_error, split_url
from .network import url_error as bad

__all__ = ["EtcdConnection", "EtcdTarget", "Op", "grpc_error", "parse_etcd_url"]

Op = dict[str, Any]  # a compare, request or answer of etcd's JSON gateway

DEFAULT_PORT = 2379
DEFAULT_TIMEOUT_S = 5.0
# gRPC status codes that mean "not now" rather than "never" (DEADLINE_EXCEEDED,
# RESOURCE_EXHAUSTED, UNAVAILABLE).
_TRANSIENT_CODES = {4, 8, 14}


@dataclass(frozen=True)
class EtcdTarget:
    """What a store URL names: endpoints, key prefix, TLS files and the request timeout."""

    endpoints: tuple[tuple[str, int], ...]
    prefix: str
    tls: bool = False
    ca: str | None = None
    cert: str | None = None
    key: str | None = None
    timeout: float = DEFAULT_TIMEOUT_S


def parse_etcd_url(url: str) -> EtcdTarget:
    """Parse ``etcd[s]://host:port[,host:port...]/prefix[?options]``; ConfigError if bad."""
    unparsable = "not a URL (an unmatched [ or ], or characters a host cannot hold)"
    parts = split_url(url, ("etcd", "etcds"), unparsable)
    # Also in the path: a password whose "/" is not percent-encoded ends the authority early.
    if "@" in parts.netloc + parts.path:
        raise bad(url, "etcd user names and passwords are not supported; use etcds:// with a "
                  "client certificate")  # fmt: skip
    endpoints = tuple(_endpoint(url, item) for item in parts.netloc.split(","))
    prefix = "/" + unquote(parts.path).strip("/")
    if prefix == "/":
        raise bad(url, "an etcd URL needs a key prefix: etcd://host:2379/prefix")
    options = dict(parse_qsl(parts.query, keep_blank_values=True, strict_parsing=False))
    unknown = ", ".join(sorted(set(options) - {"ca", "cert", "key", "timeout"}))
    if unknown:
        raise bad(url, f"unknown option(s) {unknown}; known: ca, cert, key, timeout")
    tls = parts.scheme == "etcds"
    ca, cert, key = (options.get(name) or None for name in ("ca", "cert", "key"))
    if not tls and (ca or cert or key):
        raise bad(url, "ca, cert and key are TLS options: use etcds://")
    if bool(cert) != bool(key):
        raise bad(url, "a client certificate needs both cert and key")
    for name, path in (("ca", ca), ("cert", cert), ("key", key)):
        if path is not None:
            check_file(url, name, path)
    check_tls_files(url, ("ca", ca), ("cert", cert), ("key", key))
    try:
        timeout = float(options.get("timeout", DEFAULT_TIMEOUT_S))
    except ValueError as exc:
        raise bad(url, f"timeout must be a number of seconds, not {options['timeout']!r}") from exc
    if not 0 < timeout <= 600:
        raise bad(url, "timeout must be above 0 and at most 600 seconds")
    return EtcdTarget(endpoints, prefix, tls, ca, cert, key, timeout)


def _endpoint(url: str, item: str) -> tuple[str, int]:
    """One ``host[:port]`` or ``[ipv6][:port]`` of the URL; the port defaults to 2379."""
    if item.startswith("["):
        host, _, rest = item[1:].partition("]")
        port = rest.removeprefix(":")
        well_formed = rest == "" or rest.startswith(":")
    else:
        host, _, port = item.partition(":")
        well_formed = ":" not in port  # a bare IPv6 address needs brackets
    if not host or not well_formed:
        raise bad(url, f"endpoint {item!r} is not host:port")
    if not port:
        return host, DEFAULT_PORT
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise bad(url, f"endpoint {item!r} has a bad port")
    return host, int(port)


class _Session(requests.Session):
    """A requests session with a default timeout: etcd3gw's watch request sets none."""

    def __init__(self, timeout: tuple[float, float]) -> None:
        super().__init__()
        self.default_timeout = timeout

    def request(self, *args: Any, **kwargs: Any) -> requests.Response:
        if kwargs.get("timeout") is None:
            kwargs["timeout"] = self.default_timeout
        return super().request(*args, **kwargs)


class EtcdConnection:
    """Clients of every endpoint a store URL names; calls go to one, the next after a failure."""

    def __init__(self, target: EtcdTarget) -> None:
        self.target = target
        self._clients = [self.client(i) for i in range(len(target.endpoints))]
        self._names = [f"{host}:{port}" for host, port in target.endpoints]
        self.current = 0  # the endpoint calls go to

    def client(self, index: int, read_timeout: float | None = None) -> Etcd3Client:
        """A client of one endpoint with its own HTTP session (TLS files applied)."""
        target = self.target
        host, port = target.endpoints[index]
        session = _Session((target.timeout, read_timeout or target.timeout))
        # The URL says how to reach etcd: proxies and CA bundles named in the
        # environment (which requests would let override ``ca``) do not apply.
        session.trust_env = False
        if target.ca is not None:
            session.verify = target.ca
        if target.cert is not None and target.key is not None:
            session.cert = (target.cert, target.key)
        return Etcd3Client(
            host=host,
            port=port,
            protocol="https" if target.tls else "http",
            timeout=target.timeout,
            api_path="/v3/",  # etcd 3.4 or newer; spares a discovery request
            session=session,
        )

    @property
    def kv(self) -> Etcd3Client:
        """The client of the endpoint calls go to now."""
        return self._clients[self.current]

    def next_endpoint(self, failed: int) -> None:
        """After a failure of endpoint failed, send the next calls to the next one (round robin)."""
        if self.current == failed:  # not yet moved on by another thread's failure
            self.current = (failed + 1) % len(self._clients)

    def _unreachable(self, exc: Exception) -> str:
        """Why an endpoint could not be reached."""
        refused = error_in(exc, OSError, lambda e: e.errno is not None)
        if refused is not None and refused.errno is not None:
            # requests' own text buries this under its connection pool's repr.
            return f"cannot connect: {os.strerror(refused.errno)}"
        detail = exc.detail_text if isinstance(exc, Etcd3Exception) else None
        return str(detail or exc)

    def all_endpoints(self) -> str:
        """Every endpoint, as host:port separated by commas (for messages)."""
        return ",".join(self._names)

    def txn(self, compare: list[Op], success: list[Op], failure: list[Op] | None = None) -> Op:
        txn = {"compare": compare, "success": success, "failure": failure or []}
        return cast(Op, self.kv.transaction(txn))

    @contextmanager
    def errors_translated(self, what: str) -> Iterator[None]:
        """etcd3gw's and requests' errors raised inside as store errors; after a member that
        cannot be reached or answers "not now" (StoreUnavailable), the next endpoint."""
        used = self.current
        where = f"etcd store {what} ({self._names[used]})"
        try:
            yield
        except (ConnectionFailedError, ConnectionTimeoutError, requests.RequestException) as exc:
            self.next_endpoint(used)
            ca, cert = ("ca", self.target.ca), ("cert", self.target.cert)
            raise connection_error(where, exc, self._unreachable(exc), ca=ca, cert=cert) from exc
        except Etcd3Exception as exc:
            code, message = grpc_error(exc)
            if code in _TRANSIENT_CODES:
                self.next_endpoint(used)
                raise StoreUnavailable(f"{where}: {message}") from exc
            raise StoreError(f"{where}: {message}") from exc

    def close(self) -> None:
        for client in self._clients:
            client.session.close()


def grpc_error(exc: Etcd3Exception) -> tuple[int | None, str]:
    """The gRPC code and message in a gateway error, as far as they can be read."""
    try:
        body = json.loads(exc.detail_text or "")
        return int(body.get("code")), str(body.get("message") or body.get("error"))
    except (TypeError, ValueError, AttributeError):
        return None, exc.detail_text or str(exc) or type(exc).__name__
