"""The Redis store, one module per part; ``store`` holds ``RedisStore`` and the key layout.

Imported only when a redis:// URL is opened: it needs redis-py.
"""

from ..backends.redis_connection import parse_redis_url
from .store import GUARANTEES, RedisStore
from .tail import RedisTail

__all__ = ["GUARANTEES", "RedisStore", "RedisTail", "parse_redis_url"]
