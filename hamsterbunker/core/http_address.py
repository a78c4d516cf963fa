"""``HOST:PORT`` of a node's HTTP endpoints (``hb run --http``, config key ``http``).

Checked where it is given (argparse, the config file), so a typo is one line
and exit 2 before the node starts; binding it is the endpoints' own check.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from .errors import ConfigError

__all__ = ["HttpAddress", "http_address_arg", "parse_http_address"]


@dataclass(frozen=True)
class HttpAddress:
    host: str  # "" listens on every address
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def parse_http_address(text: str) -> HttpAddress:
    """``127.0.0.1:9100``, ``[::1]:9100``, ``localhost:9100`` or ``:9100`` (every address)."""
    host, colon, port = text.rpartition(":")
    if not colon or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"{text!r} is not HOST:PORT with a port from 1 to 65535 "
                          "(e.g. 127.0.0.1:9100, [::1]:9100, :9100 for every address)")  # fmt: skip
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if any(c.isspace() or c in "[]/" for c in host) or (":" in host and not text.startswith("[")):
        raise ConfigError(f"{text!r}: the host {host!r} is not a host name or address "
                          "(an IPv6 address goes in brackets: [::1]:9100)")  # fmt: skip
    return HttpAddress(host, int(port))


def http_address_arg(text: str) -> str:
    """``--http``'s argparse type: the address as given, once it parses."""
    try:
        parse_http_address(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text
