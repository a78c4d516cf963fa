"""How often a standby reads the lease and beats (issue 18: an idle standby nearly free).

A standby whose store watch works is woken by every change of the lease
record (a live leader's renewal each tick) and by the lease's expiry, and
reads then; it reads on its own only after two ticks without one. Without a
working watch it reads every tick, as before. Either way a lease that stands
still is taken one TTL after it last changed, as seen on the standby's clock.
A standby writes its heartbeat every half TTL; a leader every tick.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from hamsterbunker import FileStore
from hamsterbunker.core.timing import LeaseTiming
from hamsterbunker.records import Heartbeat, LeaseRecord
from hamsterbunker.runtime import Runtime
from hamsterbunker.stores import Store, open_store
from tests.support import wait_until
from tests.support.agents import AGENT, SECRET, CountingAgent
from tests.support.etcd_server import etcd_url
from tests.support.redis_server import redis_url

TIMING = LeaseTiming(tick_ms=50, lease_ttl_ms=3000)
TICKS_PER_TTL = TIMING.lease_ttl_ms // TIMING.tick_ms  # 60


class CountedStore:
    """Delegates to a store, counting lease reads; its watch can be made to fail."""

    def __init__(self, inner: Store, *, watch_fails: bool = False) -> None:
        self._inner = inner
        self._watch_fails = watch_fails
        self._lock = threading.Lock()
        self.reads = 0
        self.beats: dict[str, int] = {}  # by the role they told

    def put_heartbeat(self, agent: str, heartbeat: Heartbeat) -> None:
        with self._lock:
            self.beats[heartbeat.role] = self.beats.get(heartbeat.role, 0) + 1
        self._inner.put_heartbeat(agent, heartbeat)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def read_lease(self, agent: str) -> LeaseRecord | None:
        with self._lock:
            self.reads += 1
        return self._inner.read_lease(agent)

    async def watch(
        self, agent: str, *, lease_only: bool = False, terms_only: bool = False
    ) -> AsyncIterator[LeaseRecord | None]:
        if self._watch_fails:
            raise RuntimeError("injected: this store cannot watch")
        async for heard in self._inner.watch(agent, lease_only=lease_only, terms_only=terms_only):
            yield heard


@contextlib.contextmanager
def _standby_facing_a_dead_holder(
    tmp_path: Path, *, watch_fails: bool
) -> Iterator[tuple[int, float, CountedStore]]:
    """(lease reads, seconds, the store) from a standby's start until it took a lease whose
    holder never renews; the node runs on, as the leader, until the block ends."""
    store = FileStore(tmp_path / "store")
    store.cas_lease(
        AGENT, None, LeaseRecord(holder="gone", region="r0", session="s0", epoch=1, ttl_ms=3000)
    )
    counted = CountedStore(store, watch_fails=watch_fails)
    node = Runtime(
        node_id="standby",
        region="r1",
        store=counted,  # type: ignore[arg-type]  # a Store in all but name
        agent=CountingAgent(),  # type: ignore[arg-type]  # a subclass defines step()
        secret=SECRET,
        timing=TIMING,
        stop_grace_ms=0,
    )
    started = time.monotonic()
    node.start()
    try:

        def taken() -> tuple[int, float, CountedStore] | None:
            lease = store.read_lease(AGENT)
            if lease is None or lease.holder != "standby":
                return None
            return counted.reads, time.monotonic() - started, counted

        yield wait_until(taken, "the standby to take the dead holder's lease", timeout=30)
    finally:
        node.stop(timeout=20)


TIMING_BESIDE = LeaseTiming(tick_ms=100, lease_ttl_ms=3000)


@contextlib.contextmanager
def _standby_beside_a_leader(store: Store, counted: CountedStore) -> Iterator[list[Runtime]]:
    """A leader on store and a standby on counted, both running until the block ends;
    yields (leader, standby) once the standby stands by."""
    nodes = [
        Runtime(node_id=node_id, region="r1", store=node_store,  # type: ignore[arg-type]
                agent=CountingAgent(), secret=SECRET, timing=TIMING_BESIDE,  # type: ignore[arg-type]
                stop_grace_ms=0)
        for node_id, node_store in (("leader", store), ("standby", counted))
    ]  # fmt: skip
    nodes[0].start()
    try:
        wait_until(lambda: (lease := store.read_lease(AGENT)) and lease.holder, "a leader")
        nodes[1].start()
        wait_until(lambda: counted.beats.get("standby"), "the standby to stand by")
        yield nodes
    finally:
        for node in nodes:
            node.stop(timeout=20)


def _reads_in_thirty_renewals(store: Store, counted: CountedStore) -> int:
    """The standby's lease reads while the leader renews thirty more times."""

    def renewals() -> int:
        lease = store.read_lease(AGENT)
        assert lease is not None and lease.holder == "leader"
        return lease.renewals

    first, reads_before = renewals(), counted.reads
    wait_until(lambda: renewals() >= first + 30, "thirty more renewals")
    return counted.reads - reads_before


def test_a_watching_standby_reads_once_a_renewal_not_once_more_a_tick(tmp_path: Path) -> None:
    """Beside a live leader renewing every tick, the standby reads about once per renewal
    (woken by each); before, it also read on every tick of its own: twice as often."""
    store = FileStore(tmp_path / "store")
    counted = CountedStore(FileStore(tmp_path / "store"))
    with _standby_beside_a_leader(store, counted):
        reads = _reads_in_thirty_renewals(store, counted)
        assert reads <= 1.4 * 30, f"the standby read the lease {reads} times in 30 renewals"


@pytest.mark.parametrize("backend", ["etcd", "redis"])
def test_a_standby_takes_the_records_its_watch_carries_for_reads(backend: str) -> None:
    """On etcd and Redis each renewal's watch notice carries the record: beside a live
    leader the standby reads the lease only when a notice came without one (the
    read it made for each renewal before)."""
    url = etcd_url() if backend == "etcd" else redis_url()
    store = open_store(url)
    counted = CountedStore(open_store(url))
    try:
        with _standby_beside_a_leader(store, counted) as (leader, _standby):
            reads = _reads_in_thirty_renewals(store, counted)
            # Reading for each renewal would be 30. A few more than none: on a loaded machine
            # a renewal can come over two ticks late, and the standby then reads on its own
            # (4 seen beside two CPU burners).
            assert reads <= 10, f"the standby read the lease {reads} times in 30 renewals"
            # It still follows the lease: stopping the leader hands it over at once.
            leader.stop(timeout=20)
            wait_until(
                lambda: (lease := store.read_lease(AGENT)) and lease.holder == "standby",
                "the standby to take the released lease",
                timeout=TIMING_BESIDE.lease_ttl_s,
            )
    finally:
        store.close()


def test_a_standby_beats_every_half_ttl_and_a_leader_every_tick(tmp_path: Path) -> None:
    with _standby_facing_a_dead_holder(tmp_path, watch_fails=False) as (_, _, counted):
        # One TTL as a standby: a beat at start and about two more; not one a tick (60).
        assert 1 <= counted.beats.get("standby", 0) <= 4, counted.beats
        # As the leader, a beat a tick: twenty within 3 s (a standby's would take 30 s).
        wait_until(lambda: counted.beats.get("active", 0) >= 20, "twenty beats", timeout=3.0)


def test_a_standby_without_a_working_watch_reads_every_tick(tmp_path: Path) -> None:
    with _standby_facing_a_dead_holder(tmp_path, watch_fails=True) as (reads, took, _):
        # A watching standby would read every second tick here (30): nothing wakes it.
        assert reads >= 0.8 * TICKS_PER_TTL, f"{reads} reads in one TTL of {TICKS_PER_TTL} ticks"
        assert TIMING.lease_ttl_s <= took <= TIMING.lease_ttl_s + 2.0
