"""Store backends, chosen by URL. A backend's client library is imported only when it is used."""

from __future__ import annotations

import importlib
from types import ModuleType
from urllib.parse import unquote, urlsplit

from ..errors import ConfigError
from .base import AdmissionState, Consumed, Fence, Store, StoreGuarantees
from .tail import Tail, TailRead

__all__ = [
    "AdmissionState",
    "Consumed",
    "Fence",
    "Store",
    "StoreGuarantees",
    "Tail",
    "TailRead",
    "check_store_url",
    "file_store_path",
    "open_store",
]


def open_store(url: str, *, create: bool = True) -> Store:
    """Open the store a URL names, e.g. ``file:///var/lib/hamsterbunker/store``.

    With create=False (readers such as ``hb status``) a store that does not
    exist is an error rather than something to make.
    """
    scheme = urlsplit(url).scheme
    store: Store
    if scheme in ("redis", "rediss"):
        store = _redis().RedisStore(url, create=create)
        return store
    if scheme in ("etcd", "etcds"):
        store = _etcd().EtcdStore(url, create=create)
        return store
    path = file_store_path(url)
    from .file import FileStore

    return FileStore(path, create=create)


def check_store_url(url: str) -> str | None:
    """Check a store URL without connecting: ConfigError if bad; a file:// URL's directory."""
    scheme = urlsplit(url).scheme
    if scheme in ("redis", "rediss"):
        _redis().parse_redis_url(url)
        return None
    if scheme in ("etcd", "etcds"):
        _etcd().parse_etcd_url(url)
        return None
    return file_store_path(url)


def file_store_path(url: str) -> str:
    """The directory of a ``file://`` store URL; ConfigError for any other URL."""
    parts = urlsplit(url)
    if parts.scheme != "file":
        raise ConfigError(
            f"store URL {url!r}: unknown scheme {parts.scheme or '(none)'!r}; use file:///path, "
            "etcd://host:port/prefix or redis://host:port/db"
        )
    path = unquote(parts.path)
    if parts.netloc not in ("", "localhost") or not path.startswith("/"):
        raise ConfigError(f"store URL {url!r}: a file URL needs an absolute path (file:///dir)")
    return path


def _redis() -> ModuleType:
    try:
        return importlib.import_module(".redis", __name__)
    except ModuleNotFoundError as exc:  # redis-py is the optional extra "redis"
        if exc.name != "redis":
            raise
        raise ConfigError(
            "the Redis store needs redis-py: pip install 'hamsterbunker[redis]'"
        ) from exc


def _etcd() -> ModuleType:
    try:
        return importlib.import_module(".etcd", __name__)
    except ModuleNotFoundError as exc:  # etcd3gw is the optional extra "etcd"
        if (exc.name or "").partition(".")[0] != "etcd3gw":
            raise
        raise ConfigError(
            "the etcd store needs etcd3gw: pip install 'hamsterbunker[etcd]'"
        ) from exc
