"""``hb forget`` in Redis: a node's heartbeat, event list and event count, dropped in one script.

One script, so a tail never sees the count without the list or the other way
round. Keys are named from a node id that ``records.check_name`` took (no
pattern is ever matched: each key is deleted by its exact name). A heartbeats
or counts key of another type (planted) holds nothing of the node: left as it is.
"""

from __future__ import annotations

from collections.abc import Callable

import redis

from ...records import check_name

__all__ = ["FORGET_NODE", "RedisForget"]

# KEYS: heartbeats hash, event counts hash, the node's event list. ARGV: node, channel.
FORGET_NODE = """
redis.pcall('HDEL', KEYS[1], ARGV[1])
redis.pcall('HDEL', KEYS[2], ARGV[1])
redis.call('DEL', KEYS[3])
redis.call('PUBLISH', ARGV[2], 'forget')
return 1
"""


class RedisForget:
    """Store.forget_node for one Redis store: key(agent, *parts) and changed(agent) are the
    store's own."""

    def __init__(
        self, client: redis.Redis, key: Callable[..., str], changed: Callable[[str], str]
    ) -> None:
        self._key, self._changed = key, changed
        self._script = client.register_script(FORGET_NODE)

    def forget(self, agent: str, node: str) -> None:
        node = check_name("node id", node)
        keys = [
            self._key(agent, "heartbeats"),
            self._key(agent, "event-counts"),
            self._key(agent, "events", node),
        ]
        self._script(keys=keys, args=[node, self._changed(agent)])
