"""The Redis store's compare-and-set rewrites: the cluster record, and the re-seals.

Each is one Lua script, which Redis runs with nothing interleaved: the
stored bytes are compared with the expected ones and replaced in that step
(a checkpoint's or a reply's against ``put_checkpoint``'s script and its
retention: a reply retention removed is gone from its hash, and stays gone). A
value that is not a string is taken as changed, never a Lua error.
"""

from __future__ import annotations

from collections.abc import Callable

import redis

from ...errors import ClusterChanged, StoreError
from ...failpoints import failpoint
from ...limits import check_effect_bounds
from ...records import CheckpointInfo, ClusterRecord
from ..base import check_reseal
from ..reseal import check_resealed_reply, check_resealed_submission

__all__ = ["RedisRewrites"]

# KEYS: the cluster key. ARGV: expected bytes, new bytes. Returns 1 if replaced, else 0.
_REPLACE_CLUSTER = """
local stored = redis.pcall('GET', KEYS[1])
if type(stored) ~= 'string' or stored ~= ARGV[1] then
  return 0
end
redis.call('SET', KEYS[1], ARGV[2])
return 1
"""

# KEYS: a hash (the agent's blobs, one step's effect journal, the pending submissions,
# the kept replies). ARGV: field (a seq, "<index>:<kind>", a number), expected bytes,
# new bytes. 1 if replaced, else 0. A checkpoint or submission keeps its length (checked
# by the caller): no byte total changes; no total counts a reply's.
_RESEAL_CHECKPOINT = """
if redis.call('TYPE', KEYS[1])['ok'] ~= 'hash' then
  return 0
end
local stored = redis.call('HGET', KEYS[1], ARGV[1])
if type(stored) ~= 'string' or stored ~= ARGV[2] then
  return 0
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
return 1
"""


class RedisRewrites:
    """Store.replace_cluster and the re-seals of one Redis store."""

    def __init__(self, client: redis.Redis, prefix: str, key: Callable[..., str]) -> None:
        self._cluster_key, self._key = f"{prefix}:cluster", key
        self._replace_cluster = client.register_script(_REPLACE_CLUSTER)
        self._reseal = client.register_script(_RESEAL_CHECKPOINT)

    def replace_cluster(self, expected: ClusterRecord, new: ClusterRecord) -> ClusterRecord:
        done = self._replace_cluster(
            keys=[self._cluster_key], args=[expected.to_json(), new.to_json()]
        )
        if done != 1:
            raise ClusterChanged(f"the cluster record {self._cluster_key} changed since it "
                                 "was read")  # fmt: skip
        return new

    def reseal_effect(
        self, agent: str, seq: int, index: int, kind: str, old: bytes, new: bytes
    ) -> bool:
        problem = check_effect_bounds(seq, index, kind, len(new))
        if problem is not None:
            raise StoreError(problem)
        failpoint("reseal.before_commit")
        key = self._key(agent, "effects", str(seq))
        done = self._reseal(keys=[key], args=[f"{index}:{kind}", old, new])
        return bool(done == 1)

    def reseal_submission(self, agent: str, number: int, old: bytes, new: bytes) -> bool:
        check_resealed_submission(number, old, new)
        failpoint("reseal.before_commit")
        key = self._key(agent, "inbox", "pending")
        return bool(self._reseal(keys=[key], args=[str(number), old, new]) == 1)

    def reseal_reply(self, agent: str, number: int, old: bytes, new: bytes) -> bool:
        check_resealed_reply(number, new)
        failpoint("reseal.before_commit")
        key = self._key(agent, "inbox", "replies")
        return bool(self._reseal(keys=[key], args=[str(number), old, new]) == 1)

    def reseal_checkpoint(self, agent: str, info: CheckpointInfo, old: bytes, new: bytes) -> bool:
        check_reseal(info, old, new)
        failpoint("reseal.before_commit")
        done = self._reseal(keys=[self._key(agent, "blobs")], args=[str(info.seq), old, new])
        return bool(done == 1)
