"""What the network backends (Redis, etcd, PostgreSQL) share: the checks their URLs have in
common (ConfigError before anything connects, never quoting a credential), and a failed
connection in words."""

from __future__ import annotations

import os
from urllib.parse import SplitResult, parse_qsl, urlsplit

from ...core.errors import ConfigError, StoreError, StoreUnavailable
from .._tls import TlsOption, describe_tls_failure, tls_error_in, tls_files_problem
from ..urls import redacted_url

__all__ = [
    "UNENCODED",
    "check_file",
    "check_tls_files",
    "connection_error",
    "query_of",
    "split_url",
    "url_error",
]

UNENCODED = 'a "/", "?", "#" or "@" in a user name or password must be percent-encoded'


def url_error(url: str, why: str) -> ConfigError:
    """A ConfigError saying why url is refused, naming it as it may be shown."""
    return ConfigError(f"store URL {redacted_url(url)!r}: {why}")


def split_url(
    url: str, schemes: tuple[str, str], unparsable: str, port: bool = False
) -> SplitResult:
    """url's parts; ConfigError (unparsable: why) if it does not parse, or its port when port
    is true, and if its scheme is not one of schemes."""
    try:
        parts = urlsplit(url)
        if port:
            parts.port  # noqa: B018 (raises ValueError for a port that is not a number)
    except ValueError:  # not quoted: its words can hold the URL's authority
        raise url_error(url, unparsable) from None
    if parts.scheme not in schemes:
        article = "an" if schemes[0][0] in "aeiou" else "a"
        raise url_error(url, f"not {article} {schemes[0]}:// or {schemes[1]}:// URL")
    return parts


def query_of(url: str, parts: SplitResult) -> list[tuple[str, str]]:
    """The query's items; ConfigError for an "@" after the host: a "/", "?" or "#" of a
    password not percent-encoded ends the authority early (never quoted back)."""
    query = parse_qsl(parts.query, keep_blank_values=True)
    if "@" in parts.path + parts.fragment or any("@" in key for key, _value in query):
        raise url_error(url, f"an @ after the host ({UNENCODED})")
    return query


def check_file(url: str, option: str, path: str, directory: bool = False) -> None:
    """ConfigError unless the file (or directory) an option names exists: one clear line at
    start rather than "No such file" at every connection."""
    kind, exists = ("directory", os.path.isdir) if directory else ("file", os.path.isfile)
    if not exists(path):
        raise url_error(url, f"{option} {kind} {path} does not exist")


def check_tls_files(
    url: str, ca: TlsOption, cert: TlsOption, key: TlsOption, password: str | None = None
) -> None:
    """ConfigError if the CA, client certificate and key the URL names cannot be used."""
    problem = tls_files_problem(ca=ca, cert=cert, key=key, password=password)
    if problem is not None:
        raise url_error(url, problem)


def connection_error(
    where: str, exc: BaseException, reason: str, *, ca: TlsOption, cert: TlsOption
) -> StoreError:
    """StoreUnavailable(reason) for a server not reached; for a refused TLS handshake, a
    StoreError saying which certificate was not accepted: a setting to fix, not an outage
    to wait out (a node starting would wait for it for ever)."""
    tls = tls_error_in(exc)
    if tls is None:
        return StoreUnavailable(f"{where}: {reason}")
    return StoreError(f"{where}: {describe_tls_failure(tls, ca=ca, cert=cert)}")
