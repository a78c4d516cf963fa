"""The secrets a node holds, newest first (``HB_SECRET`` and ``HB_SECRET_PREVIOUS``, or a
secret file with one a line): several while the cluster's secret rotates. Which one seals is
the cluster record's business; the order only tells ``hb rotate-secret begin`` the new one.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ..core.errors import ConfigError, SecretTooShort

__all__ = [
    "MAX_SECRETS",
    "MIN_SECRET_LENGTH",
    "Keyring",
    "Secret",
    "check_secret",
    "read_keyring",
]

MIN_SECRET_LENGTH = 8
# Each secret costs a scrypt derivation (about 0.1 s, 32 MiB) at start: a few suffice
# for a rotation (the new, the current, perhaps one more).
MAX_SECRETS = 4


def check_secret(secret: str) -> str:
    """Refuse a secret that is too short before anything else happens."""
    if not isinstance(secret, str) or len(secret) < MIN_SECRET_LENGTH:
        got = len(secret) if isinstance(secret, str) else 0
        raise SecretTooShort(
            f"the network secret must be at least {MIN_SECRET_LENGTH} characters (it has {got})"
        )
    return secret


@dataclass(frozen=True)
class Keyring:
    """One or more secrets, newest first; never printed (repr hides them)."""

    secrets: tuple[str, ...]

    def __post_init__(self) -> None:
        if not self.secrets:
            raise ConfigError("no secret given")
        if len(self.secrets) > MAX_SECRETS:
            raise ConfigError(f"{len(self.secrets)} secrets given: at most {MAX_SECRETS}")
        for secret in self.secrets:
            check_secret(secret)
        if len(set(self.secrets)) != len(self.secrets):
            raise ConfigError("the same secret is given twice")

    def __repr__(self) -> str:
        return f"Keyring(<{len(self.secrets)} secrets>)"

    def __iter__(self) -> Iterator[str]:
        return iter(self.secrets)

    @property
    def newest(self) -> str:
        return self.secrets[0]

    @classmethod
    def of(cls, given: str | Keyring) -> Keyring:
        """A keyring of a plain secret (the API's ``secret=``), or the keyring given."""
        return given if isinstance(given, Keyring) else cls((check_secret(given),))

    @classmethod
    def parse(cls, text: str, where: str) -> Keyring:
        """The secrets of a secret file: one a line, newest first (blank lines skipped)."""
        lines = [line.rstrip("\r") for line in text.split("\n")]
        secrets = tuple(line for line in lines if line.strip())
        if not secrets:
            raise SecretTooShort(f"{where}: the secret file is empty")
        try:
            return cls(secrets)
        except SecretTooShort as exc:
            raise SecretTooShort(f"{where}: {exc}") from None
        except ConfigError as exc:
            raise ConfigError(f"{where}: {exc}") from None


# What the API takes as a secret: one, or a keyring while the secret rotates.
Secret = str | Keyring


def read_keyring(secret_file: Path | None) -> Keyring:
    """The secrets from HB_SECRET (+ HB_SECRET_PREVIOUS), --secret-file, or the systemd
    credential, the first of these that is given."""
    if os.environ.get("HB_SECRET"):
        given = [os.environ["HB_SECRET"]]
        if os.environ.get("HB_SECRET_PREVIOUS"):
            given.append(os.environ["HB_SECRET_PREVIOUS"])
        return Keyring(tuple(given))
    if os.environ.get("HB_SECRET_PREVIOUS"):
        raise ConfigError("HB_SECRET_PREVIOUS is set but HB_SECRET is not: set both")
    candidates = [secret_file] if secret_file else []
    if os.environ.get("CREDENTIALS_DIRECTORY"):
        candidates.append(Path(os.environ["CREDENTIALS_DIRECTORY"]) / "secret")
    for path in candidates:
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            if path is secret_file:
                raise ConfigError(f"secret file {path} does not exist") from None
            continue
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"secret file {path} cannot be read: {exc}") from exc
        return Keyring.parse(text, f"secret file {path}")
    raise ConfigError("no secret given: set HB_SECRET, pass --secret-file, or use LoadCredential")
