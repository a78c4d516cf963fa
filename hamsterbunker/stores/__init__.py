"""Store backends, chosen by URL. A backend's client library is imported only when it is used."""

from __future__ import annotations

import importlib
import os
import stat
from pathlib import Path
from types import ModuleType
from urllib.parse import unquote, urlsplit

from ..core.errors import ConfigError, CorruptRecord, StoreUnavailable
from .base import (
    AdmissionState,
    Consumed,
    Fence,
    HeardLease,
    RestoreRead,
    StoreGuarantees,
    StoreReport,
    SyncedFolder,
)
from .chains import Chains
from .interface import Store
from .tail import Tail, TailRead
from .urls import redacted_url

__all__ = [
    "AdmissionState",
    "Chains",
    "Consumed",
    "Fence",
    "HeardLease",
    "RestoreRead",
    "Store",
    "StoreGuarantees",
    "StoreReport",
    "SyncedFolder",
    "Tail",
    "TailRead",
    "check_store_url",
    "file_store_path",
    "folder_store_made",
    "is_syncdir_url",
    "open_store",
    "redacted_url",
    "syncdir_store_path",
]


POSTGRES_SCHEMES = ("postgresql", "postgres")
NEEDS_PSYCOPG = "the PostgreSQL store needs psycopg 3"
NEEDS_REDIS = "the Redis store needs redis-py"
NEEDS_ETCD = "the etcd store needs etcd3gw and requests"


def open_store(
    url: str,
    *,
    create: bool = True,
    node: str | None = None,
    sync_delay_ms: int | None = None,
) -> Store:
    """Open the store a URL names, e.g. ``file:///var/lib/hamsterbunker/store``; with
    create=False (readers such as ``hb status``) a store that does not exist is an error.

    ``node`` and ``sync_delay_ms`` are for ``syncdir:///path`` only: a writer must give
    both, a reader may give neither. Other stores ignore ``node``; ``sync_delay_ms`` given
    for one is a ConfigError.
    """
    scheme = urlsplit(url).scheme
    if scheme == "syncdir":
        from .syncdir import SyncDirStore

        path = syncdir_store_path(url)
        if create and (node is None or sync_delay_ms is None):
            missing = " and ".join(
                what
                for what, value in (("the node id", node), ("sync_delay_ms", sync_delay_ms))
                if value is None
            )
            raise ConfigError(
                f"store URL {redacted_url(url)!r}: a node writing a syncdir store needs {missing} "
                "(set sync_delay_ms in the instance config, or pass --sync-delay-ms)"
            )
        return SyncDirStore(path, node, sync_delay_ms=sync_delay_ms, create=create)
    if sync_delay_ms is not None:
        raise ConfigError(
            f"sync_delay_ms only applies to a syncdir:// store, not {redacted_url(url)!r}"
        )
    from .layer import RecordStore

    if scheme in ("redis", "rediss"):
        backend = _backend(".backends.redis", NEEDS_REDIS, "redis").RedisBackend(url)
    elif scheme in ("etcd", "etcds"):
        backend = _backend(".backends.etcd", NEEDS_ETCD, "etcd").EtcdBackend(url)
    elif scheme in POSTGRES_SCHEMES:
        backend = _backend(".backends.postgres", NEEDS_PSYCOPG, "postgres").PostgresBackend(url)
    else:
        from .layer.files import FileStore

        return FileStore(file_store_path(url), create=create)
    store = RecordStore(backend)
    if not create:
        try:
            _refuse_an_empty_store(store)
        except BaseException:
            store.close()
            raise
    return store


def _refuse_an_empty_store(store: Store) -> None:
    """ConfigError for a reader of a store that holds nothing (a mistyped prefix or
    database, most likely); where the store does not answer, its reads will say so."""
    try:
        empty = store.read_cluster() is None and not store.list_agents()
    except StoreUnavailable:
        return
    if empty:
        raise ConfigError(
            f"no HamsterBunker store at {store.url}: nothing is stored there (a node makes "
            "the store as it starts; check the URL's prefix or database)"
        )


def check_store_url(url: str) -> str | None:
    """Check a store URL without connecting: ConfigError if bad; a file:// or syncdir://
    URL's directory."""
    scheme = urlsplit(url).scheme
    if scheme in ("redis", "rediss"):
        _backend(".backends.redis_connection", NEEDS_REDIS, "redis").parse_redis_url(url)
        return None
    if scheme in ("etcd", "etcds"):
        _backend(".backends.etcd_connection", NEEDS_ETCD, "etcd").parse_etcd_url(url)
        return None
    if scheme in POSTGRES_SCHEMES:
        _backend(".backends.postgres_connection", NEEDS_PSYCOPG, "postgres").parse_postgres_url(url)
        return None
    if scheme == "syncdir":
        return syncdir_store_path(url)
    return file_store_path(url)


def folder_store_made(url: str) -> bool | None:
    """Whether a file:// or syncdir:// store holds a cluster record, read without writing
    anything (a node opening one to write makes its folder); None where this cannot tell
    (any other store, whose reads may wait for its server; a path not readable here; a
    syncdir folder the sync is bringing), and the node's own open and reads decide."""
    scheme = urlsplit(url).scheme
    if scheme not in ("file", "syncdir"):
        return None
    path = check_store_url(url)
    assert path is not None  # a folder store's URL names its folder
    try:
        if not stat.S_ISDIR(os.stat(path).st_mode):
            return None  # opening it says what is there instead
    except FileNotFoundError:
        return False
    except OSError:
        return None  # not readable here: opening it names the problem and the fix
    try:
        return _read_folder_cluster(scheme, path)
    except CorruptRecord:
        return True  # a record is there: the node's own read says what is wrong with it
    except StoreUnavailable:
        return None


def _read_folder_cluster(scheme: str, path: str) -> bool | None:
    """Whether the folder holds a cluster record, None for a syncdir folder without one that
    the sync may yet bring it to; ConfigError for a folder its store's open would refuse (an
    earlier layout), as the node would have said."""
    if scheme == "syncdir":
        from .syncdir.first_start import being_synced
        from .syncdir.layout import os_errors
        from .syncdir.root import read_cluster_record
        from .syncdir.subtrees import refuse_earlier_subtrees

        os_errors(refuse_earlier_subtrees)(Path(path))
        if os_errors(read_cluster_record)(Path(path)) is not None:
            return True
        return None if os_errors(being_synced)(Path(path)) else False
    from .layer.files import FileStore

    store = FileStore(path, create=False)
    try:
        return store.read_cluster() is not None
    finally:
        store.close()


def is_syncdir_url(url: str) -> bool:
    """Whether url names a syncdir store (a folder kept in step by a sync tool)."""
    return urlsplit(url).scheme == "syncdir"


def syncdir_store_path(url: str) -> str:
    """The folder of a ``syncdir://`` store URL (absolute, as a file:// URL's)."""
    path, parts = _absolute_path(url, "syncdir"), urlsplit(url)
    if parts.query or parts.fragment:
        raise ConfigError(
            f"store URL {redacted_url(url)!r}: a syncdir URL takes no query or fragment (the node id and "
            "sync_delay_ms come from the node's config)"
        )
    return path


def file_store_path(url: str) -> str:
    """The directory of a ``file://`` store URL; ConfigError for any other URL."""
    parts = urlsplit(url)
    if parts.scheme != "file":
        raise ConfigError(
            f"store URL {redacted_url(url)!r}: unknown scheme {parts.scheme or '(none)'!r}; "
            "use file:///path, syncdir:///path, etcd://host:port/prefix, redis://host:port/db "
            "or postgresql://user@host:port/db"
        )
    return _absolute_path(url, "file")


def _absolute_path(url: str, scheme: str) -> str:
    parts = urlsplit(url)
    path = unquote(parts.path)
    if parts.netloc not in ("", "localhost") or not path.startswith("/"):
        raise ConfigError(
            f"store URL {redacted_url(url)!r}: a {scheme} URL needs an absolute path "
            f"({scheme}:///dir)"
        )
    return path


def _backend(module: str, needs: str, extra: str) -> ModuleType:
    """Import a backend whose client library is an optional extra: a ConfigError in one
    line if that library (or one it imports, such as requests) cannot be imported."""
    try:
        return importlib.import_module(module, __name__)
    except ImportError as exc:
        missing = exc.name or ""
        if missing.partition(".")[0] == "hamsterbunker":
            raise  # our own module is broken: a bug, not a missing extra
        what = f"no module {missing!r}" if missing else str(exc)
        raise ConfigError(f"{needs} ({what}): pip install 'hamsterbunker[{extra}]'") from exc
