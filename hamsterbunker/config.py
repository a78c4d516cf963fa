"""A node's configuration file: ``/etc/hamsterbunker/NAME.toml`` for instance NAME.

``hb run --instance NAME`` reads it (from ``$CONFIGURATION_DIRECTORY`` when
systemd sets it); ``hb init NAME`` writes it. Unknown keys and wrong types are
errors naming the key and the file, so a typo never silently becomes a
default. The secret never lives here: it comes from the unit's credential.
"""

from __future__ import annotations

import os
import socket
import tomllib
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from .errors import ConfigError
from .http_address import parse_http_address
from .logs import log_level
from .records import check_name
from .timing import (
    DEFAULT_LEASE_TTL_MS,
    DEFAULT_STOP_GRACE_MS,
    DEFAULT_TICK_MS,
    LeaseTiming,
    StepRetry,
    check_stop_grace,
)

__all__ = ["DEFAULT_CONFIG_DIR", "NodeConfig", "config_dir", "load_instance"]

DEFAULT_CONFIG_DIR = Path("/etc/hamsterbunker")


@dataclass(frozen=True)
class NodeConfig:
    """What one node runs: the keys of the TOML file, with their defaults."""

    store: str
    agent: str  # module:attribute
    agent_id: str | None = None  # default: the agent object's id
    node_id: str = field(default_factory=socket.gethostname)
    region: str = "local"
    tick_ms: int = DEFAULT_TICK_MS
    lease_ttl_ms: int = DEFAULT_LEASE_TTL_MS
    # How long a stop lets the step in flight finish and be published.
    stop_grace_ms: int = DEFAULT_STOP_GRACE_MS
    # A failing step's retries (None: StepRetry's defaults, 1 s doubling to 60 s, 10 tries).
    step_retry_ms: int | None = None
    step_retry_max_ms: int | None = None
    max_step_failures: int | None = None  # 0: never hand the lease over
    # debug, info, warning or error (default: info); hb run --log-level overrides it.
    log_level: str | None = None
    # HOST:PORT of /metrics, /health, /leader and /status (default: none served).
    http: str | None = None

    @property
    def timing(self) -> LeaseTiming:
        """The lease timing these keys give (ConfigError if it cannot keep one leader)."""
        return LeaseTiming(tick_ms=self.tick_ms, lease_ttl_ms=self.lease_ttl_ms)

    @property
    def step_retry(self) -> StepRetry:
        """How a failing step is retried (ConfigError if the keys make no sense together)."""
        given = {"first_ms": self.step_retry_ms, "max_ms": self.step_retry_max_ms,
                 "max_failures": self.max_step_failures}  # fmt: skip
        return StepRetry(**{key: value for key, value in given.items() if value is not None})

    def to_toml_dict(self) -> dict[str, Any]:
        """The keys to write (TOML has no null: an unset agent_id is left out)."""
        return {key: value for key, value in asdict(self).items() if value is not None}


_REQUIRED = ("store", "agent")
_TYPES: dict[str, type] = {
    "store": str,
    "agent": str,
    "agent_id": str,
    "node_id": str,
    "region": str,
    "tick_ms": int,
    "lease_ttl_ms": int,
    "stop_grace_ms": int,
    "step_retry_ms": int,
    "step_retry_max_ms": int,
    "max_step_failures": int,
    "log_level": str,
    "http": str,
}
_MAY_BE_ZERO = {"stop_grace_ms", "max_step_failures"}
assert set(_TYPES) == {f.name for f in fields(NodeConfig)}


def config_dir() -> Path:
    """``$CONFIGURATION_DIRECTORY`` (set by systemd's ConfigurationDirectory=) or /etc/hamsterbunker."""
    configured = os.environ.get("CONFIGURATION_DIRECTORY", "")
    # Several ConfigurationDirectory= entries arrive joined by ':'; ours is the first.
    first = configured.split(":")[0]
    return Path(first) if first else DEFAULT_CONFIG_DIR


def instance_path(name: str, directory: Path | None = None) -> Path:
    check_name("instance name", name)
    return (directory or config_dir()) / f"{name}.toml"


def load_instance(name: str, directory: Path | None = None) -> NodeConfig:
    """Read and check the config of instance ``name``."""
    path = instance_path(name, directory)
    try:
        with path.open("rb") as file:
            document = tomllib.load(file)
    except FileNotFoundError:
        raise ConfigError(
            f"config file {path} does not exist (create it with: hb init {name} --store URL)"
        ) from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
    except OSError as exc:
        raise ConfigError(f"config file {path} cannot be read: {exc.strerror}") from None
    return parse_config(document, path)


def parse_config(document: dict[str, Any], path: Path) -> NodeConfig:
    if "secret" in document:
        raise ConfigError(
            f"{path}: key 'secret' does not belong in the config file (anyone who can read "
            "it would have the secret); the unit passes it with LoadCredential=secret:..."
        )
    unknown = sorted(set(document) - set(_TYPES))
    if unknown:
        raise ConfigError(f"{path}: unknown key {unknown[0]!r}; the keys are: {', '.join(_TYPES)}")
    for key in _REQUIRED:
        if key not in document:
            raise ConfigError(f"{path}: key {key!r} is missing")
    for key, value in document.items():
        expected = _TYPES[key]
        # TOML booleans are Python bools, which are ints: refuse them as numbers.
        if not isinstance(value, expected) or isinstance(value, bool):
            raise ConfigError(
                f"{path}: key {key!r} must be {_describe(expected)}, not {_toml_type(value)}"
            )
        if isinstance(value, int) and (value < 0 or (value == 0 and key not in _MAY_BE_ZERO)):
            raise ConfigError(f"{path}: key {key!r} must be above 0, not {value}")
    config = NodeConfig(**document)
    for kind, value in (("agent_id", config.agent_id), ("node_id", config.node_id)):
        if value is not None:
            try:
                check_name(kind, value)
            except ConfigError as exc:
                raise ConfigError(f"{path}: key {kind!r}: {exc}") from None
    try:
        config.timing  # noqa: B018 (made to be checked: tick_ms and lease_ttl_ms together)
        check_stop_grace(config.stop_grace_ms)
        config.step_retry  # noqa: B018 (made to be checked: the retry keys together)
        if config.log_level is not None:
            log_level(config.log_level)
        if config.http is not None:
            parse_http_address(config.http)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    return config


def _describe(kind: type) -> str:
    return "a string" if kind is str else "a whole number"


def _toml_type(value: Any) -> str:
    names = {bool: "a boolean", int: "a whole number", float: "a decimal number"}
    names |= {str: "a string", list: "an array", dict: "a table"}
    return names.get(type(value), type(value).__name__)
