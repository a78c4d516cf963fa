"""Record builders the store tests share, each with the values its tests were written with.

``lease``, ``fence_of``, ``heartbeat``, ``event`` and ``cluster`` are the file
store tests' (times near 2023); ``network_heartbeat`` and ``network_event``
are the network store tests' (Redis, etcd and hostile contents: times 1.0
and n, an event's epoch and seq set).
"""

from __future__ import annotations

from hamsterbunker.records import ClusterRecord, Event, Heartbeat, LeaseRecord
from hamsterbunker.stores.base import Fence

__all__ = [
    "cluster",
    "event",
    "fence_of",
    "heartbeat",
    "lease",
    "network_event",
    "network_heartbeat",
]


def lease(holder: str | None, epoch: int, session: str = "s1") -> LeaseRecord:
    return LeaseRecord(holder=holder, region="eu", session=session, epoch=epoch, ttl_ms=2000)


def fence_of(record: LeaseRecord) -> Fence:
    assert record.holder is not None
    return Fence(record.holder, record.session, record.epoch)


def heartbeat(node: str) -> Heartbeat:
    return Heartbeat(
        node=node, region="eu", host="h", pid=1, role="standby", epoch=1, seq=0,
        leader=None, time=1700000000.0,
    )  # fmt: skip


def event(node: str, n: int) -> Event:
    return Event(node=node, n=n, type="agent.step", time=1700000000.0 + n)


def cluster(tag: int) -> ClusterRecord:
    return ClusterRecord(
        format=1, kdf="scrypt", n=2**15, r=8, p=1, salt=f"c2Fsd{tag}==", key_id=f"k{tag}",
        key_check="Y2hlY2s=", created=1.0,
    )  # fmt: skip


def network_heartbeat(node: str, beats: int = 0) -> Heartbeat:
    return Heartbeat(
        node=node,
        region="eu",
        host="h",
        pid=1,
        role="standby",
        epoch=1,
        seq=0,
        leader=None,
        time=1.0,
        beats=beats,
    )


def network_event(node: str, n: int) -> Event:
    return Event(node=node, n=n, type="agent.step", time=float(n), epoch=1, seq=n)
