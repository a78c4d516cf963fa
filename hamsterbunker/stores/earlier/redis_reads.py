"""Bounded reads of Redis keys with plain commands, for the earlier Redis store's reader.

A value is measured (STRLEN, HSTRLEN) before it is fetched, and fetched under WATCH
of its key, so that one that changed meanwhile aborts the read (StoreError) rather
than being fetched whatever its size. Names are listed without their values
(HRANDFIELD) once HLEN said how many there are.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import redis

from ...core.errors import CorruptRecord, StoreError
from . import common

__all__ = ["BoundedReads", "Value", "text"]

Value = bytes | int | None  # a value fetched, its size (over its cap: not fetched), or absent


def text(value: Any) -> str:
    """A reply as text: bytes a store writer chose may not be UTF-8."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


class BoundedReads:
    """Reads of one Redis database, each within the bounds its caller names."""

    def __init__(self, client: Any, url: str) -> None:
        self._redis = client  # redis-py's replies are untyped
        self._url = url

    def type(self, key: str) -> str:
        return text(self._redis.type(key))

    def string(self, key: str, what: str, limit: int) -> bytes | None:
        """The string at key (None if absent); CorruptRecord if of another type or over limit."""
        kind = self.type(key)
        if kind == "none":
            return None
        if kind != "string":
            raise CorruptRecord(f"{what} is stored as a Redis {kind}, not as this store writes it")
        pipe = self._redis.pipeline(transaction=True)
        size, data = pipe.strlen(key).getrange(key, 0, limit).execute()  # limit + 1 bytes at most
        if size > limit:
            raise common.over_limit(what, size, limit)
        return bytes(data)

    def values(
        self, wanted: Sequence[tuple[str, bytes, int]], budget: int | None = None
    ) -> tuple[list[Value], bool]:
        """Hash fields (key, field, cap) measured, then fetched under WATCH: each a value, its
        size when over its cap (unread), or None when absent. The fetch stops before the
        first value that would pass budget bytes in all (then True)."""
        if not wanted:
            return [], False
        with self._redis.pipeline(transaction=True) as watched:
            watched.watch(*{key for key, _, _ in wanted})
            measure = self._redis.pipeline(transaction=False)  # after the WATCH: any change counts
            for key, field, _cap in wanted:
                measure.hstrlen(key, field)
            sizes: list[int] = measure.execute()
            fetch: list[bool] = []
            total = 0
            for (_key, _field, cap), size in zip(wanted, sizes, strict=True):
                if size <= cap and budget is not None and total + size > budget:
                    break
                fetch.append(size <= cap)
                total += size if size <= cap else 0
            watched.multi()
            for (key, field, _cap), one in zip(wanted, fetch, strict=False):
                if one:
                    watched.hget(key, field)
            try:
                fetched = iter(watched.execute())
            except redis.WatchError:
                raise StoreError(
                    f"redis store {self._url}: {wanted[0][0]} changed while it was read: "
                    "stop every node of this store first"
                ) from None
        values = [next(fetched) if one else size for one, size in zip(fetch, sizes, strict=False)]
        return values, len(fetch) < len(wanted)

    def names(self, key: str, most: int, what: str) -> list[bytes]:
        """The field names of hash key (none if absent or of another type), values unread;
        CorruptRecord if it holds more than most."""
        if self.type(key) != "hash":
            return []
        count = self._redis.hlen(key)
        if count > most:
            raise CorruptRecord(
                f"{what} holds {count} entries, above the {most} a read looks at: not as the "
                "store wrote them"
            )
        return list(self._redis.hrandfield(key, most) or [])
