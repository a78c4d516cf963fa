"""The golden store the earlier Redis store wrote (tests/data/earlier/redis.json.gz), loaded raw.

``load_earlier_redis()`` writes the fixture's keys, by type, under a fresh prefix of the
session's redis-server and returns them there (``Loaded``: its URL, a raw client, the
key names); ``expected()`` is what the earlier store's own reads answered for them
(written as tests/data/earlier/README.md says). ``Loaded.plant``
puts any raw value there: junk, or a change made while a migration reads.
"""

from __future__ import annotations

import base64
import functools
import gzip
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import redis

from tests.support.redis_server import redis_url

__all__ = ["FIXTURE", "Loaded", "expected", "load_earlier_redis"]

FIXTURE = Path(__file__).resolve().parents[1] / "data" / "earlier" / "redis.json.gz"


@functools.cache
def _fixture() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(gzip.decompress(FIXTURE.read_bytes()))
    return loaded


def expected() -> dict[str, Any]:
    """The earlier store's answers: ``cluster`` (JSON) and per agent under ``agents``
    (as the earlier store answered them); bytes are base64."""
    return json.loads(json.dumps(_fixture()["answers"]))  # a copy a test may change


def unb64(text: str | None) -> bytes | None:
    return None if text is None else base64.b64decode(text)


@dataclass
class Loaded:
    """The fixture under one prefix: url opens it, client writes raw beside the reader."""

    url: str
    prefix: str
    client: redis.Redis

    def key(self, *parts: str) -> str:
        """A key under the prefix: key("agent", "a1", "lease") is P:agent:a1:lease."""
        return ":".join((self.prefix, *parts))

    def plant(self, name: str, kind: str, value: Any) -> None:
        """Replace key name (under the prefix, as key() takes it split on ":") with value
        of kind: bytes for a string, {field: bytes} for a hash, [(member, score)] for a
        sorted set, [bytes] for a list or set."""
        key = self.key(name)
        pipe = self.client.pipeline(transaction=True)
        pipe.delete(key)
        _put(pipe, key, kind, value)
        pipe.execute()

    def close(self) -> None:
        self.client.close()


def _put(pipe: Any, key: str, kind: str, value: Any) -> None:
    if kind == "string":
        pipe.set(key, value)
    elif kind == "hash":
        pipe.hset(key, mapping=value)
    elif kind == "zset":
        pipe.zadd(key, dict(value))
    elif kind == "list":
        pipe.rpush(key, *value)
    elif kind == "set":
        pipe.sadd(key, *value)
    else:
        raise ValueError(f"no Redis type {kind!r}")


def load_earlier_redis() -> Loaded:
    """The fixture's keys under a fresh prefix of the session's server (closed by the caller)."""
    url = redis_url()
    prefix = parse_qs(urlsplit(url).query)["prefix"][0]
    client = redis.Redis.from_url(url.split("?")[0])
    pipe = client.pipeline(transaction=True)
    for entry in _fixture()["keys"]:
        key = prefix + entry["key"].removeprefix(_fixture()["prefix"])
        kind, value = entry["type"], entry["value"]
        if kind == "string":
            data: Any = unb64(value)
        elif kind == "hash":
            data = {unb64(field): unb64(item) for field, item in value}
        elif kind == "zset":
            data = [(unb64(member), score) for member, score in value]
        else:
            data = [unb64(item) for item in value]
        _put(pipe, key, kind, data)
    pipe.execute()
    return Loaded(url, prefix, client)
