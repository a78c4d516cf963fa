"""``hb init``: write an instance's config file and secret, each atomically, never replacing
a secret, and the config only with ``force``."""

from __future__ import annotations

import os
import secrets
import socket
import tempfile
import textwrap
import tomllib
from dataclasses import dataclass, replace
from pathlib import Path

import tomli_w

from ..core.errors import ConfigError
from ..sealing.keyring import Keyring
from .config import KEYS, NodeConfig, instance_path, parse_config

__all__ = ["Provisioned", "choose_store", "local_store", "provision"]

# Where the unit lets a node write (StateDirectory=hamsterbunker).
STATE_DIRECTORY = Path("/var/lib/hamsterbunker")

_HEADER = """\
# HamsterBunker node config, read by `hb run --instance {name}`
# (systemd: hamsterbunker@{name}.service). The secret is not kept here:
# the unit passes {secret} with LoadCredential=.
# Keys (README, "A real node under systemd"):
{keys}
# create_store_on: the host whose node may create the store, if there is none
# yet, at its first start (written with a new secret; a copy elsewhere creates nothing).
"""


@dataclass(frozen=True)
class Provisioned:
    config_path: Path
    secret_path: Path
    new_secret: bool  # False: an existing secret was kept
    creates_store: bool  # this host's node may make the store (create_store_on)


def local_store(name: str) -> str:
    """The store of a cluster of one machine (``hb init --local-only``)."""
    return f"file://{STATE_DIRECTORY}/{name}"


def choose_store(name: str, store: str | None, *, local_only: bool) -> str:
    """The store URL ``hb init`` writes: the one given, or with local_only the local one."""
    if store and local_only:
        raise ConfigError(
            "--store and --local-only exclude each other: --store names the store every node "
            "of the cluster shares, --local-only keeps a cluster of this one machine in "
            f"{local_store(name)}"
        )
    if store:
        return store
    if local_only:
        return local_store(name)
    raise ConfigError(
        "no store given: pass --store URL, the store every node of the cluster shares "
        "(e.g. file:///mnt/hamsterbunker on NFS, redis://..., etcd://...; or set HB_STORE), "
        f"or --local-only for a cluster of this one machine (store {local_store(name)})"
    )


def secret_path(name: str, directory: Path) -> Path:
    return directory / f"{name}.secret"


def provision(name: str, config: NodeConfig, directory: Path, *, force: bool) -> Provisioned:
    config_file = instance_path(name, directory)
    secret_file = secret_path(name, directory)
    # Check everything `hb run` will check (the timing included) before writing anything.
    parse_config(config.to_toml_dict(), config_file)
    if config_file.exists() and not force:
        raise ConfigError(f"{config_file} already exists; pass --force to replace it")
    directory.mkdir(mode=0o755, parents=True, exist_ok=True)
    new_secret = not secret_file.exists()
    # A new secret is a new cluster, whose store this node makes; a config replaced with
    # --force keeps that leave (hb init again to choose the agent, say).
    creates_store = new_secret or _creates_store(config_file)
    if creates_store:
        config = replace(config, create_store_on=socket.gethostname())
    if new_secret:
        _write_new(secret_file, secrets.token_urlsafe(32) + "\n", mode=0o600, replace=False)
    else:
        _check_secret_file(secret_file)
    keys = "\n".join(textwrap.wrap(", ".join(KEYS), 76, initial_indent="#   ",
                                     subsequent_indent="#   "))  # fmt: skip
    text = _HEADER.format(name=name, secret=secret_file, keys=keys)
    text += tomli_w.dumps(config.to_toml_dict())
    _write_new(config_file, text, mode=0o644, replace=force)
    return Provisioned(config_file, secret_file, new_secret, creates_store)


def _creates_store(config_file: Path) -> bool:
    """Whether an existing config lets this host's node make the store."""
    try:
        recorded = tomllib.loads(config_file.read_text(encoding="utf-8")).get("create_store_on")
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return False
    return bool(recorded == socket.gethostname())


def _check_secret_file(path: Path) -> None:
    """An existing secret must be usable and private before we build on it."""
    mode = path.stat().st_mode
    if mode & 0o077:
        raise ConfigError(
            f"secret file {path} can be read by others (mode {mode & 0o777:o}); "
            f"run: chmod 600 {path}"
        )
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"secret file {path} cannot be read: {exc}") from exc
    Keyring.parse(text, f"secret file {path}")  # one secret a line, newest first


def _write_new(path: Path, text: str, *, mode: int, replace: bool) -> None:
    """Write ``text`` to ``path`` atomically; without ``replace``, fail if it exists."""
    fd, temp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".new", dir=path.parent)
    try:
        os.fchmod(fd, mode)  # before the first byte: the secret is never readable by others
        with os.fdopen(fd, "w", encoding="utf-8") as file:
            file.write(text)
            file.flush()
            os.fsync(file.fileno())
        if replace:
            os.replace(temp, path)
        else:
            try:
                os.link(temp, path)  # fails if path exists: no race with another writer
            except FileExistsError:
                raise ConfigError(f"{path} already exists; refusing to overwrite it") from None
    finally:
        Path(temp).unlink(missing_ok=True)
    dir_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
