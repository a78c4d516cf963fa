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

from ..core.errors import ConfigError
from ..core.http_address import parse_http_address
from ..core.logs import log_level
from ..core.timing import (
    DEFAULT_LEASE_TTL_MS,
    DEFAULT_STOP_GRACE_MS,
    DEFAULT_TICK_MS,
    LeaseTiming,
    StepRetry,
    check_stop_grace,
    check_sync_delay,
)
from ..records import check_name
from ..stores import is_syncdir_url, redacted_url, syncdir_store_path

__all__ = [
    "DEFAULT_CONFIG_DIR",
    "HostedAgent",
    "NodeConfig",
    "config_dir",
    "load_instance",
    "systemd_directory",
]

DEFAULT_CONFIG_DIR = Path("/etc/hamsterbunker")
# The most agents one node process keeps ([[agents]]).
MAX_HOSTED_AGENTS = 1000


@dataclass(frozen=True)
class HostedAgent:
    """One agent a node process keeps: an entry of ``[[agents]]`` (or the top-level keys)."""

    agent: str  # module:attribute
    agent_id: str | None = None  # default: the agent object's id


@dataclass(frozen=True)
class NodeConfig:
    """What one node runs: the keys of the TOML file, with their defaults."""

    store: str
    agent: str = ""  # module:attribute ("" when [[agents]] names several)
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
    # Several agents kept by this one process ([[agents]]), in place of agent and agent_id.
    agents: tuple[HostedAgent, ...] = ()
    # The longest the sync tool takes to bring a file to the other machines: required for
    # a syncdir:// store (the TTL must be at least 2 × (tick + it)), refused for any other.
    # (This and the next last, so that NodeConfig's positional fields stay as they were.)
    sync_delay_ms: int | None = None
    # The host whose node may make the store at its first start: hb init writes it when it
    # makes a new secret (a new cluster). A copy of this file on another host makes nothing.
    create_store_on: str | None = None
    # As a standby, keep a copy of the newest checkpoint in memory, fetched as the leader
    # publishes, so that a takeover reads none (off: for states too large to hold twice).
    hot_standby: bool = True

    def may_create_store(self) -> bool:
        """Whether this host's node may make the store, as hb init recorded (create_store_on)."""
        return self.create_store_on == socket.gethostname()

    def hosted(self) -> tuple[HostedAgent, ...]:
        """The agents this node process keeps: [[agents]], or the one of agent and agent_id."""
        return self.agents or (HostedAgent(self.agent, self.agent_id),)

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

    def check_sync_delay(self) -> int | None:
        """sync_delay_ms checked against the store and the timing: None for a store that
        is not syncdir://; ConfigError if missing, misplaced or too long for the TTL."""
        if not is_syncdir_url(self.store):
            if self.sync_delay_ms is not None:
                raise ConfigError(
                    f"sync_delay_ms only applies to a syncdir:// store (the store is "
                    f"{redacted_url(self.store)!r}): remove it"
                )
            return None
        syncdir_store_path(self.store)  # an absolute path, no query: before anything else
        if self.sync_delay_ms is None:
            raise ConfigError(
                "a syncdir:// store needs sync_delay_ms, the longest the sync tool takes to "
                "bring a file to the other machines: set it (sync_delay_ms = 10000 in the "
                "config file, or hb run --sync-delay-ms 10000), with lease_ttl_ms at least "
                "2 × (tick_ms + sync_delay_ms)"
            )
        return check_sync_delay(self.timing, self.sync_delay_ms)

    def to_toml_dict(self) -> dict[str, Any]:
        """The keys to write (TOML has no null: an unset agent_id is left out)."""
        written = {key: value for key, value in asdict(self).items() if value not in (None, "")}
        if self.agents:
            written["agents"] = [
                {key: value for key, value in asdict(entry).items() if value is not None}
                for entry in self.agents
            ]
        else:
            del written["agents"]
        return written


_REQUIRED = ("store", "agent")
_TYPES: dict[str, type] = {
    "store": str,
    "agent": str,
    "agent_id": str,
    "node_id": str,
    "region": str,
    "tick_ms": int,
    "lease_ttl_ms": int,
    "sync_delay_ms": int,
    "stop_grace_ms": int,
    "step_retry_ms": int,
    "step_retry_max_ms": int,
    "max_step_failures": int,
    "log_level": str,
    "http": str,
    "agents": list,
    "create_store_on": str,
    "hot_standby": bool,
}
KEYS = tuple(_TYPES)  # every key a node's config file may hold, in the order shown
_MAY_BE_ZERO = {"stop_grace_ms", "max_step_failures"}
assert set(_TYPES) == {f.name for f in fields(NodeConfig)}


def systemd_directory(variable: str) -> Path | None:
    """The first directory systemd named in $variable (several arrive joined by ':')."""
    first = os.environ.get(variable, "").split(":")[0]
    return Path(first) if first else None


def config_dir() -> Path:
    """``$CONFIGURATION_DIRECTORY`` (set by systemd's ConfigurationDirectory=) or /etc/hamsterbunker."""
    return systemd_directory("CONFIGURATION_DIRECTORY") or DEFAULT_CONFIG_DIR


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
        if key not in document and not (key == "agent" and "agents" in document):
            raise ConfigError(f"{path}: key {key!r} is missing")
    for key, value in document.items():
        expected = _TYPES[key]
        # TOML booleans are Python bools, which are ints: refuse them as numbers.
        if not isinstance(value, expected) or (isinstance(value, bool) and expected is not bool):
            raise ConfigError(
                f"{path}: key {key!r} must be {_describe(expected)}, not {_toml_type(value)}"
            )
        if type(value) is int and (value < 0 or (value == 0 and key not in _MAY_BE_ZERO)):
            raise ConfigError(f"{path}: key {key!r} must be above 0, not {value}")
    if "agents" in document:
        document = {**document, "agents": _hosted_agents(document, path)}
    config = NodeConfig(**document)
    for kind, value in (("agent_id", config.agent_id), ("node_id", config.node_id)):
        if value is not None:
            try:
                check_name(kind, value)
            except ConfigError as exc:
                raise ConfigError(f"{path}: key {kind!r}: {exc}") from None
    try:
        config.timing  # noqa: B018 (made to be checked: tick_ms and lease_ttl_ms together)
        config.check_sync_delay()
        check_stop_grace(config.stop_grace_ms)
        config.step_retry  # noqa: B018 (made to be checked: the retry keys together)
        if config.log_level is not None:
            log_level(config.log_level)
        if config.http is not None:
            parse_http_address(config.http)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    return config


def _hosted_agents(document: dict[str, Any], path: Path) -> tuple[HostedAgent, ...]:
    """The [[agents]] tables, checked: each an agent and, optionally, its agent_id."""
    for key in ("agent", "agent_id"):
        if key in document:
            raise ConfigError(f"{path}: key {key!r} cannot be given beside [[agents]]: "
                              "name each agent in its own [[agents]] table")  # fmt: skip
    entries = document["agents"]
    if not entries or len(entries) > MAX_HOSTED_AGENTS:
        raise ConfigError(f"{path}: [[agents]] must name 1 to {MAX_HOSTED_AGENTS} agents")
    hosted = []
    for number, entry in enumerate(entries, 1):
        where = f"{path}: [[agents]] entry {number}"
        if not isinstance(entry, dict):
            raise ConfigError(f"{where} must be a table, not {_toml_type(entry)}")
        unknown = sorted(set(entry) - {"agent", "agent_id"})
        if unknown:
            raise ConfigError(f"{where}: unknown key {unknown[0]!r}; the keys are: agent, agent_id")
        for key in ("agent", "agent_id"):
            if key in entry and not isinstance(entry[key], str):
                raise ConfigError(f"{where}: key {key!r} must be a string, not "
                                  f"{_toml_type(entry[key])}")  # fmt: skip
        if "agent" not in entry:
            raise ConfigError(f"{where}: key 'agent' is missing")
        if "agent_id" in entry:
            try:
                check_name("agent_id", entry["agent_id"])
            except ConfigError as exc:
                raise ConfigError(f"{where}: key 'agent_id': {exc}") from None
        hosted.append(HostedAgent(**entry))
    ids = [entry.agent_id for entry in hosted if entry.agent_id is not None]
    twice = next((agent_id for agent_id in ids if ids.count(agent_id) > 1), None)
    if twice is not None:
        raise ConfigError(f"{path}: agent id {twice!r} is in [[agents]] twice")
    return tuple(hosted)


def _describe(kind: type) -> str:
    return _toml_type(kind())  # what a value of that type is called


def _toml_type(value: Any) -> str:
    names = {bool: "a boolean", int: "a whole number", float: "a decimal number"}
    names |= {str: "a string", list: "an array", dict: "a table"}
    return names.get(type(value), type(value).__name__)
