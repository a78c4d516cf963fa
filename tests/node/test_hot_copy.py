"""The hot copy's fetching (``hamsterbunker.node.hot_copy``), on a store whose reads wait
until the test lets them answer: one fetch at a time, the newest named only, and a new
term's restore waits for the fetch of the checkpoint it needs rather than reading it."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import replace

from hamsterbunker.node.calls import NodeCalls
from hamsterbunker.node.hot_copy import HotCopy
from hamsterbunker.records import CheckpointInfo, LeaseRecord
from tests.support.records import lease

WAIT_S = 10


def info(seq: int) -> CheckpointInfo:
    return CheckpointInfo(epoch=1, seq=seq, size=5, written=1.0)


class HeldReads:
    """read_checkpoint_from answers only once let through, one answer per let_one()."""

    def __init__(self) -> None:
        self.asked: list[int] = []
        self._answer = threading.Semaphore(0)

    def read_checkpoint_from(
        self, agent: str, seq: int, epoch: int
    ) -> tuple[CheckpointInfo, bytes] | None:
        self.asked.append(seq)
        assert self._answer.acquire(timeout=WAIT_S), "the test never let the read answer"
        return info(seq), f"sealed {seq}".encode()

    def let_one(self) -> None:
        self._answer.release()


def naming(seq: int) -> LeaseRecord:
    return replace(lease("node-a", 1), seq=seq, seq_epoch=1)


async def wait_for(condition: object, what: str) -> None:
    async with asyncio.timeout(WAIT_S):
        while not condition():  # type: ignore[operator]
            await asyncio.sleep(0.005)


def test_only_the_last_named_is_fetched_after_the_fetch_under_way() -> None:
    async def run() -> None:
        store, calls = HeldReads(), NodeCalls()
        hot = HotCopy(store, "agent", calls)  # type: ignore[arg-type]
        hot.follow(naming(5))
        await wait_for(lambda: store.asked == [5], "the fetch of 5")
        for seq in (6, 7, 7):
            hot.follow(naming(seq))
        store.let_one()
        await wait_for(lambda: store.asked == [5, 7], "the fetch of 7, 6 skipped")
        store.let_one()
        assert await hot.take(info(7)) == b"sealed 7"
        assert await hot.take(info(7)) is None  # let go once taken
        calls.close()

    asyncio.run(run())


def test_a_forged_record_naming_a_seq_far_ahead_does_not_stop_the_fetches() -> None:
    async def run() -> None:
        store, calls = HeldReads(), NodeCalls()
        hot = HotCopy(store, "agent", calls)  # type: ignore[arg-type]
        hot.follow(naming(10**9))
        store.let_one()  # the store holds no such checkpoint: found, here, but never listed
        await wait_for(lambda: store.asked == [10**9], "the fetch the forged record asked")
        hot.follow(naming(3))
        store.let_one()
        assert await hot.take(info(3)) == b"sealed 3"
        calls.close()

    asyncio.run(run())


def test_a_restore_waits_for_the_fetch_of_the_checkpoint_it_needs() -> None:
    async def run() -> None:
        store, calls = HeldReads(), NodeCalls()
        hot = HotCopy(store, "agent", calls)  # type: ignore[arg-type]
        hot.follow(naming(3))
        await wait_for(lambda: store.asked == [3], "the fetch of 3")
        taking = asyncio.ensure_future(hot.take(info(3)))
        await asyncio.sleep(0)
        assert not taking.done()
        store.let_one()
        assert await asyncio.wait_for(taking, WAIT_S) == b"sealed 3"
        calls.close()

    asyncio.run(run())


def test_a_copy_of_another_checkpoint_than_the_newest_listed_is_not_taken() -> None:
    async def run() -> None:
        store, calls = HeldReads(), NodeCalls()
        hot = HotCopy(store, "agent", calls)  # type: ignore[arg-type]
        hot.follow(naming(3))
        store.let_one()
        assert await hot.take(replace(info(3), size=6)) is None  # listed otherwise
        assert store.asked == [3]
        calls.close()

    asyncio.run(run())
