"""``hb forget`` in etcd: a node's heartbeat, log index key and event log, deleted in one txn.

The node id is checked with ``records.check_name`` before it names a key. Its
event log is the range ``events/<node>/`` up to ``events/<node>0``: no other
node's key falls in it, since a node id holds no '/' and every other node id
that starts with this one continues with a character sorting below '/' (``.``,
``-``) or at or above '0' (letters, digits, ``_``).
"""

from __future__ import annotations

from typing import Any

from ...records import check_name
from .kv import delete_op, range_end

__all__ = ["forget_ops"]


def forget_ops(agent_prefix: str, node: str) -> list[dict[str, Any]]:
    """The txn requests that delete every key of node under agent_prefix."""
    node = check_name("node id", node)
    heartbeat = f"{agent_prefix}heartbeats/{node}"
    index = f"{agent_prefix}event-nodes/{node}"
    log = f"{agent_prefix}events/{node}/"
    return [
        delete_op(heartbeat, heartbeat + "\0"),
        delete_op(index, index + "\0"),
        delete_op(log, range_end(log)),
    ]
