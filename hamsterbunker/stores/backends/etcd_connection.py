"""How an etcd store URL becomes clients of its members, and what their errors mean.

The URL's checks (parse_etcd_url: ConfigError before anything connects), one
HTTP client per endpoint with the TLS files applied, the round robin that sends
the next call to the next member after a failure, and etcd3gw's and requests'
errors translated at the store boundary (errors_translated), a refused TLS
handshake in words.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, cast
from urllib.parse import parse_qsl, unquote, urlsplit

import requests
from etcd3gw.client import Etcd3Client
from etcd3gw.exceptions import ConnectionFailedError, ConnectionTimeoutError, Etcd3Exception

from ...core.errors import ConfigError, StoreError, StoreUnavailable
from .._tls import describe_tls_failure, error_in, tls_error_in, tls_files_problem
from ..urls import redacted_url

__all__ = [
    "DEFAULT_PORT",
    "DEFAULT_TIMEOUT_S",
    "EtcdConnection",
    "EtcdTarget",
    "grpc_error",
    "parse_etcd_url",
    "too_large",
]

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

    def bad(why: str) -> ConfigError:
        return ConfigError(f"store URL {redacted_url(url)!r}: {why}")

    try:
        parts = urlsplit(url)
    except ValueError:  # not quoted: its words can hold the URL's authority
        raise bad("not a URL (an unmatched [ or ], or characters a host cannot hold)") from None
    if parts.scheme not in ("etcd", "etcds"):
        raise bad("not an etcd:// or etcds:// URL")
    # Also in the path: a password whose "/" is not percent-encoded ends the authority early.
    if "@" in parts.netloc + parts.path:
        raise bad("etcd user names and passwords are not supported; use etcds:// with a "
                  "client certificate")  # fmt: skip
    endpoints = tuple(_endpoint(url, item) for item in parts.netloc.split(","))
    prefix = "/" + unquote(parts.path).strip("/")
    if prefix == "/":
        raise bad("an etcd URL needs a key prefix: etcd://host:2379/prefix")
    options = dict(parse_qsl(parts.query, keep_blank_values=True, strict_parsing=False))
    unknown = set(options) - {"ca", "cert", "key", "timeout"}
    if unknown:
        raise bad(f"unknown option(s) {', '.join(sorted(unknown))}; known: ca, cert, key, timeout")
    tls = parts.scheme == "etcds"
    files = {name: options.get(name) or None for name in ("ca", "cert", "key")}
    if not tls and any(files.values()):
        raise bad("ca, cert and key are TLS options: use etcds://")
    if bool(files["cert"]) != bool(files["key"]):
        raise bad("a client certificate needs both cert and key")
    for name, path in files.items():
        if path is not None and not os.path.isfile(path):
            raise bad(f"{name} file {path} does not exist")
    problem = tls_files_problem(
        ca=("ca", files["ca"]), cert=("cert", files["cert"]), key=("key", files["key"])
    )
    if problem is not None:
        raise bad(problem)
    try:
        timeout = float(options.get("timeout", DEFAULT_TIMEOUT_S))
    except ValueError as exc:
        raise bad(f"timeout must be a number of seconds, not {options['timeout']!r}") from exc
    if not 0 < timeout <= 600:
        raise bad("timeout must be above 0 and at most 600 seconds")
    return EtcdTarget(endpoints, prefix, tls, files["ca"], files["cert"], files["key"], timeout)


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
        raise ConfigError(f"store URL {redacted_url(url)!r}: endpoint {item!r} is not host:port")
    if not port:
        return host, DEFAULT_PORT
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"store URL {redacted_url(url)!r}: endpoint {item!r} has a bad port")
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
        """Why an endpoint could not be reached: a TLS refusal in words, else the error."""
        tls = tls_error_in(exc)
        if tls is not None:
            target = self.target
            return describe_tls_failure(
                tls,
                ca=target.ca,
                ca_option="ca",
                cert=target.cert,
                cert_option="cert",
            )
        refused = error_in(exc, OSError, lambda e: e.errno is not None)
        if refused is not None and refused.errno is not None:
            # requests' own text buries this under its connection pool's repr.
            return f"cannot connect: {os.strerror(refused.errno)}"
        detail = exc.detail_text if isinstance(exc, Etcd3Exception) else None
        return str(detail or exc)

    def _endpoint_text(self, index: int) -> str:
        host, port = self.target.endpoints[index]
        return f"{host}:{port}"

    def all_endpoints(self) -> str:
        """Every endpoint, as host:port separated by commas (for messages)."""
        return ",".join(map(self._endpoint_text, range(len(self._clients))))

    def txn(
        self,
        compare: list[dict[str, Any]],
        success: list[dict[str, Any]],
        failure: list[dict[str, Any]] | None = None,
    ) -> dict[str, Any]:
        txn = {"compare": compare, "success": success, "failure": failure or []}
        return cast(dict[str, Any], self.kv.transaction(txn))

    @contextmanager
    def errors_translated(self, what: str) -> Iterator[None]:
        """Translate etcd3gw's and requests' errors raised inside, keeping the reason.

        A member that cannot be reached, or answers "not now", is a
        StoreUnavailable, and the next call goes to the next endpoint.
        """
        used = self.current
        where = f"etcd store {what} ({self._endpoint_text(used)})"
        try:
            yield
        except (ConnectionFailedError, ConnectionTimeoutError, requests.RequestException) as exc:
            self.next_endpoint(used)
            # Certificates that do not match are a setting to fix, not an outage to wait out.
            refused = StoreError if tls_error_in(exc) is not None else StoreUnavailable
            raise refused(f"{where}: {self._unreachable(exc)}") from exc
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


def too_large(exc: Etcd3Exception) -> bool:
    """Whether etcd refused a request for its size (``--max-request-bytes``)."""
    _code, message = grpc_error(exc)
    return "request is too large" in message or "larger than max" in message
