"""What every ``hb`` command that works on an existing store shares: the store opened (an
existing one only: a mistyped URL must not make an empty store) and closed, and its sealer
for the secret given."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ..core.errors import ConfigError
from ..sealing import Sealer
from ..sealing.keyring import Keyring
from ..stores import Store, open_store

__all__ = ["opened_store", "store_sealer"]

Secret = str | Keyring


@contextmanager
def opened_store(url: str, **options: Any) -> Iterator[Store]:
    """The store at url, which must exist, closed once the command is done with it."""
    store = open_store(url, create=False, **options)
    try:
        yield store
    finally:
        store.close()


def store_sealer(store: Store, secret: Secret) -> Sealer:
    """The store's sealer for secret (WrongSecret before anything is read or changed);
    ConfigError if no node has made its cluster record."""
    cluster = store.read_cluster()
    if cluster is None:
        raise ConfigError(f"store {store.url} has no cluster record: no node has run on it")
    return Sealer(secret, cluster)
