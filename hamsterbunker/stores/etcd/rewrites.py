"""The etcd store's compare-and-set rewrites: the cluster record, and the re-seals.

The cluster record is replaced by a txn that compares its value. A re-sealed
checkpoint is read with its mod revision, compared with the expected bytes
here, and replaced by a txn that compares the revision: one request carries
the checkpoint once, not twice (etcd's request limit), and a checkpoint
written or removed since (``put_checkpoint``, its retention) fails it.
"""

from __future__ import annotations

from collections.abc import Callable

from ...errors import ClusterChanged, StoreError
from ...failpoints import failpoint
from ...limits import check_effect_bounds
from ...records import CheckpointInfo, ClusterRecord
from ..backends.etcd_connection import EtcdConnection
from ..base import check_reseal
from ..reseal import check_resealed_reply, check_resealed_submission
from .kv import (
    b64,
    checkpoint_key,
    effect_key,
    get_op,
    kv_key,
    pad,
    put_op,
    range_end,
    ranges,
    revision,
    unb64,
)

__all__ = ["EtcdRewrites"]

# The most reply keys read under one number: a committed one, and those a checkpoint
# that was never committed staged (retention removes them with it).
_REPLY_KEYS = 8


class EtcdRewrites:
    """Store.replace_cluster and the re-seals of one etcd store."""

    def __init__(
        self, connection: EtcdConnection, prefix: str, agent_prefix: Callable[[str], str]
    ) -> None:
        self._connection, self._cluster_key = connection, f"{prefix}/cluster"
        self._agent_prefix = agent_prefix

    def replace_cluster(self, expected: ClusterRecord, new: ClusterRecord) -> ClusterRecord:
        key = self._cluster_key
        compare = {"key": b64(key), "target": "VALUE", "result": "EQUAL",
                   "value": b64(expected.to_json())}  # fmt: skip
        response = self._connection.txn([compare], [put_op(key, new.to_json())])
        if not response.get("succeeded"):
            raise ClusterChanged(f"the cluster record {key} changed since it was read")
        return new

    def reseal_checkpoint(self, agent: str, info: CheckpointInfo, old: bytes, new: bytes) -> bool:
        check_reseal(info, old, new)
        return self._swap(checkpoint_key(self._agent_prefix(agent), info.seq, info.epoch), old, new)

    def reseal_effect(
        self, agent: str, seq: int, index: int, kind: str, old: bytes, new: bytes
    ) -> bool:
        problem = check_effect_bounds(seq, index, kind, len(new))
        if problem is not None:
            raise StoreError(problem)
        return self._swap(effect_key(self._agent_prefix(agent), seq, index, kind), old, new)

    def reseal_submission(self, agent: str, number: int, old: bytes, new: bytes) -> bool:
        check_resealed_submission(number, old, new)
        return self._swap(f"{self._agent_prefix(agent)}inbox/pending/{pad(number)}", old, new)

    def reseal_reply(self, agent: str, number: int, old: bytes, new: bytes) -> bool:
        check_resealed_reply(number, new)
        # A reply is kept under the checkpoint that staged it (stores.etcd.inbox): the
        # key under the number that holds old is the one its ids record names.
        replies = f"{self._agent_prefix(agent)}inbox/replies/{pad(number)}/"
        get = get_op(replies, range_end(replies), limit=_REPLY_KEYS)
        [found] = ranges(self._connection.txn([], [get]))
        for kv in found:
            if unb64(kv.get("value", "")) == old:
                return self._swap(kv_key(kv).decode("utf-8", "replace"), old, new)
        return False

    def _swap(self, key: str, old: bytes, new: bytes) -> bool:
        """Put new under key if it holds old: compared here, then by its mod revision."""
        [found] = ranges(self._connection.txn([], [get_op(key)]))
        if not found or unb64(found[0].get("value", "")) != old:
            return False
        compare = {"key": b64(key), "target": "MOD", "result": "EQUAL",
                   "mod_revision": revision(found[0])}  # fmt: skip
        failpoint("reseal.before_commit")
        response = self._connection.txn([compare], [put_op(key, new)])
        return bool(response.get("succeeded"))
