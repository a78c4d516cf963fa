"""TLS files and failures of the network stores, in words.

redis-py and requests report a refused TLS handshake as a connection error
wrapping OpenSSL's text (``tlsv1 alert decrypt error``): ``describe_tls_failure``
says what it means (the server's certificate not trusted, or the client's
refused or missing). ``tls_files_problem`` loads the files a URL names before
any connection, so that a file that cannot work is a ConfigError at start.
"""

from __future__ import annotations

import os
import re
import ssl
from collections.abc import Callable
from typing import TypeVar

__all__ = ["TlsOption", "describe_tls_failure", "error_in", "tls_error_in", "tls_files_problem"]

E = TypeVar("E", bound=BaseException)
# A file a URL names: (the URL option that names it, its path or None).
TlsOption = tuple[str, str | None]

# OpenSSL's alert names when the peer sent an alert: "[SSL: TLSV1_ALERT_UNKNOWN_CA] ...".
_ALERT = ("TLSV1_ALERT_", "TLSV13_ALERT_", "SSLV3_ALERT_")


def tls_files_problem(
    *,
    ca: TlsOption = ("ca", None),
    cert: TlsOption = ("cert", None),
    key: TlsOption = ("key", None),
    password: str | None = None,
) -> str | None:
    """Why the CA file (or directory), client certificate and key cannot be used, or None: a
    file that is not PEM, a key not the certificate's, an encrypted key without its password."""
    (ca_option, ca_path), (cert_option, cert_path), (key_option, key_path) = ca, cert, key
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    if ca_path is not None:
        try:
            if os.path.isdir(ca_path):
                context.load_verify_locations(capath=ca_path)
            else:
                context.load_verify_locations(cafile=ca_path)
        except (ssl.SSLError, OSError, ValueError) as exc:
            return f"{ca_option} {ca_path} holds no usable CA certificate ({_load_error(exc)})"
    if cert_path is not None:
        try:
            # Never OpenSSL's interactive prompt for an encrypted key: no password is "".
            context.load_cert_chain(cert_path, key_path, password=lambda: password or "")
        except (ssl.SSLError, OSError, ValueError) as exc:
            pair = f"{cert_option} {cert_path}" + (
                f" and {key_option} {key_path}" if key_path else ""
            )
            return (
                f"{pair} are not a usable client certificate and key ({_load_error(exc)}): "
                "both must be PEM, the key must match the certificate, and an encrypted key "
                "needs its password"
            )
    return None


def _load_error(exc: BaseException) -> str:
    return _openssl_text(exc) if isinstance(exc, ssl.SSLError) else str(exc)


def tls_error_in(exc: BaseException) -> ssl.SSLError | None:
    """The ssl.SSLError somewhere under exc (causes, contexts, wrapped arguments), or None."""
    return error_in(exc, ssl.SSLError)


def error_in(
    exc: BaseException, kind: type[E], where: Callable[[E], bool] = lambda _: True
) -> E | None:
    """The first error of kind (for which where holds) under exc: causes, contexts, arguments."""
    pending: list[object] = [exc]
    seen: set[int] = set()
    while pending:
        item = pending.pop(0)
        if not isinstance(item, BaseException) or id(item) in seen:
            continue
        seen.add(id(item))
        if isinstance(item, kind) and where(item):
            return item
        # requests and urllib3 keep the underlying error as an argument
        # (MaxRetryError(..., reason=SSLError(ssl.SSLError)), not only as a cause.
        pending += [item.__cause__, item.__context__, getattr(item, "reason", None), *item.args]
    return None


def _openssl_text(error: ssl.SSLError) -> str:
    """OpenSSL's words without the bracketed code and the C source location."""
    if isinstance(error, ssl.SSLCertVerificationError) and error.verify_message:
        return str(error.verify_message)
    text = str(error.args[1]) if len(error.args) > 1 else str(error)
    text = re.sub(r"^\[SSL(: [A-Z0-9_]+)?\]\s*", "", text)
    return re.sub(r"\s*\(_ssl\.c:\d+\)$", "", text).strip() or type(error).__name__


def describe_tls_failure(error: ssl.SSLError, *, ca: TlsOption, cert: TlsOption) -> str:
    """One line saying why a TLS connection failed and what to check (the caller names the server)."""
    (ca_option, ca_path), (cert_option, cert_path) = ca, cert
    why = _openssl_text(error)
    reason = error.reason or ""
    if isinstance(error, ssl.SSLCertVerificationError):
        trusted = f"the CA file {ca_option}={ca_path}" if ca_path else "the system's CAs"
        return (
            f"TLS handshake failed: the server's certificate is not trusted ({why}); "
            f"check that {trusted} signed it"
        )
    refused = reason.startswith(_ALERT) or isinstance(
        error, ssl.SSLEOFError | ssl.SSLZeroReturnError
    )
    if not refused:
        return f"TLS connection failed ({why})"
    if isinstance(error, ssl.SSLEOFError | ssl.SSLZeroReturnError):
        # The server hung up without saying why: what it most often means, as a guess.
        if cert_path is None:
            return (
                f"TLS handshake refused: the server closed the connection ({why}); it may "
                f"require a client certificate ({cert_option}=FILE), or not speak TLS on this port"
            )
        return (
            f"TLS handshake refused: the server closed the connection ({why}); it probably did "
            f"not accept the client certificate {cert_option}={cert_path}: check that a CA the "
            "server trusts signed it, and that the port speaks TLS"
        )
    if "CERTIFICATE_REQUIRED" in reason or cert_path is None:
        return (
            f"TLS handshake refused by the server ({why}): it requires a client "
            f"certificate; name one with {cert_option}=FILE"
        )
    return (
        f"TLS handshake refused by the server ({why}): it did not accept the client "
        f"certificate {cert_option}={cert_path}; check that a CA the server trusts signed it"
    )
