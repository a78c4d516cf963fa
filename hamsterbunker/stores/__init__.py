"""Store backends, chosen by URL. A backend's client library is imported only when it is used."""

from __future__ import annotations

from urllib.parse import unquote, urlsplit

from ..errors import ConfigError
from .base import Fence, Store, StoreGuarantees

__all__ = ["Fence", "Store", "StoreGuarantees", "file_store_path", "open_store"]

SCHEMES = ("file",)


def open_store(url: str, *, create: bool = True) -> Store:
    """Open the store a URL names, e.g. ``file:///var/lib/hamsterbunker/store``.

    With create=False (readers such as ``hb status``) a store that does not
    exist is an error rather than something to make.
    """
    if url.startswith(("redis://", "rediss://")):
        try:
            from .redis import RedisStore
        except ModuleNotFoundError as exc:  # redis-py is the optional extra "redis"
            if exc.name != "redis":
                raise
            raise ConfigError(
                "the Redis store needs redis-py: pip install 'hamsterbunker[redis]'"
            ) from exc
        return RedisStore(url, create=create)
    if url.startswith(("etcd://", "etcds://")):
        try:
            from .etcd import EtcdStore
        except ModuleNotFoundError as exc:  # etcd3gw is the optional extra "etcd"
            if (exc.name or "").partition(".")[0] != "etcd3gw":
                raise
            raise ConfigError(
                "the etcd store needs etcd3gw: pip install 'hamsterbunker[etcd]'"
            ) from exc
        return EtcdStore(url, create=create)
    path = file_store_path(url)
    from .file import FileStore

    return FileStore(path, create=create)


def file_store_path(url: str) -> str:
    """The directory of a ``file://`` store URL; ConfigError for any URL we cannot open."""
    parts = urlsplit(url)
    if parts.scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise ConfigError(f"store URL {url!r}: a file URL needs an absolute path (file:///dir)")
        path = unquote(parts.path)
        if not path.startswith("/"):
            raise ConfigError(f"store URL {url!r}: a file URL needs an absolute path (file:///dir)")
        return path
    if parts.scheme in ("etcd", "etcds", "redis", "rediss"):
        raise ConfigError(f"store URL {url!r}: the {parts.scheme} store is not available yet")
    raise ConfigError(
        f"store URL {url!r}: unknown scheme {parts.scheme or '(none)'!r}; use file:///path"
    )
