"""A store URL as it may be shown: printed, logged, served by ``/status``, kept in a file.

``redacted_url`` is the one place that decides what of a URL is a secret. A URL
carries credentials in its userinfo (``user:password@``, or a lone token as in
``https://TOKEN@host``), in its query (redis-py takes ``password=`` and the
``ssl_password=`` of an encrypted key file; other clients take tokens), and
possibly in its fragment. Query options are shown only when known to name no
secret (a key prefix, a timeout, the path of a certificate): any other value is
masked, so a credential option added later is hidden without a change here.
"""

from __future__ import annotations

from urllib.parse import SplitResult, unquote_plus, urlsplit

__all__ = ["MASK", "redacted_url"]

MASK = "***"

# Options whose values are shown, per scheme: none of them is a credential. The
# Redis ones are redis-py's URL options (its URL_QUERY_ARGUMENT_PARSERS), our
# prefix and the TLS file paths; the etcd ones are all that parse_etcd_url takes.
_REDIS_OPTIONS = frozenset({
    "prefix", "db", "socket_timeout", "socket_connect_timeout", "socket_read_size",
    "socket_keepalive", "retry_on_timeout", "retry_on_error", "max_connections",
    "health_check_interval", "timeout", "protocol", "legacy_responses", "client_name",
    "ssl_check_hostname", "ssl_cert_reqs", "ssl_include_verify_flags",
    "ssl_exclude_verify_flags", "ssl_min_version", "ssl_certfile", "ssl_keyfile",
    "ssl_ca_certs", "ssl_ca_path",
})  # fmt: skip
_ETCD_OPTIONS = frozenset({"ca", "cert", "key", "timeout"})
# Our table and timeout, and the libpq options that name no secret (sslpassword,
# password and passfile stay masked).
_POSTGRES_OPTIONS = frozenset({
    "table", "timeout", "connect_timeout", "application_name", "target_session_attrs",
    "sslmode", "sslrootcert", "sslcert", "sslkey", "sslcrl", "sslcrldir", "sslnegotiation",
    "keepalives", "keepalives_idle", "keepalives_interval", "keepalives_count",
    "tcp_user_timeout", "load_balance_hosts",
})  # fmt: skip
_SHOWN_OPTIONS = {
    "redis": _REDIS_OPTIONS,
    "rediss": _REDIS_OPTIONS,
    "etcd": _ETCD_OPTIONS,
    "etcds": _ETCD_OPTIONS,
    "postgresql": _POSTGRES_OPTIONS,
    "postgres": _POSTGRES_OPTIONS,
}
# Schemes whose authority is empty or "localhost": an "@" after it is part of a path.
_LOCAL_SCHEMES = frozenset({"file", "syncdir"})


def redacted_url(url: str) -> str:
    """url without any credential it carries: userinfo, query values not known to be
    harmless, and fragment are shown as ``***``; scheme, hosts, ports and path stay.

    A password is masked and its user name kept (``user:***@host``); a userinfo
    without a password may be a token, and is masked whole (``***@host``).
    """
    try:
        parts = urlsplit(url)
    except ValueError:
        return "(a URL that does not parse)"
    scheme = parts.scheme.lower()
    after_scheme = url[len(parts.scheme) + 1 :] if parts.scheme else url
    shown = (f"{scheme}:" if scheme else "") + ("//" if after_scheme.startswith("//") else "")
    shown += _shown_location(parts, local=scheme in _LOCAL_SCHEMES)
    if parts.query:
        shown += "?" + _masked_query(parts.query, _SHOWN_OPTIONS.get(scheme, frozenset()))
    if parts.fragment:
        shown += "#" + MASK
    return shown


def _shown_location(parts: SplitResult, *, local: bool) -> str:
    """The authority and path of a URL, its userinfo masked."""
    if local:  # "@" can only end a userinfo in the authority: in the path it is a file name's
        userinfo, at, host = parts.netloc.rpartition("@")
        return (_masked_userinfo(userinfo) + at + host if at else parts.netloc) + parts.path
    # The last "@" before the query ends a userinfo whose "/" was not percent-encoded
    # (urlsplit cuts the authority at that "/").
    userinfo, at, rest = (parts.netloc + parts.path).rpartition("@")
    if at:
        return _masked_userinfo(userinfo) + at + rest
    if "@" in parts.query + parts.fragment:
        # A "?" or "#" of a password not percent-encoded ends the authority early: what
        # remains of it may be the start of that password.
        return MASK
    return parts.netloc + parts.path


def _masked_userinfo(userinfo: str) -> str:
    user, colon, _password = userinfo.partition(":")
    return f"{user}:{MASK}" if colon else MASK


def _masked_query(query: str, shown: frozenset[str]) -> str:
    """Each ``name=value`` of query with its value masked unless name is in shown; an item
    without "=" (which could be a token on its own) masked whole."""
    items = []
    for item in query.split("&"):
        name, equals, _value = item.partition("=")
        if unquote_plus(name) in shown:
            items.append(item)
        elif equals:
            items.append(f"{name}={MASK}")
        elif item:
            items.append(MASK)
        else:
            items.append(item)
    return "&".join(items)
