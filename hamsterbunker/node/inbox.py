"""A leader term's inbox: the unconsumed submissions it reads, opens and hands to its steps.

One per term, moving on with each checkpoint it publishes: it shows what the newest
accepted checkpoint left unconsumed, each only once it authenticates as its number
(anything else: ``inbox.rejected``). Junk above the inbox is read past, and read again
only every ``RESCAN_TICKS`` ticks (docs/design.md, "The node").
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
from collections.abc import Callable
from typing import Any

from ..agent.inbox import ConsumedMarks, Submission
from ..core.clock import Clock
from ..core.errors import StoreError, Tampered
from ..core.limits import MAX_INBOX_COUNT
from ..sealing import Sealer
from ..stores import Consumed, Store
from .calls import NodeCalls
from .events import EventSink
from .state import Identity, Standing

__all__ = ["RESCAN_TICKS", "TermInbox"]

log = logging.getLogger("hamsterbunker")

# How often, in ticks, a term reads again the junk it read past: a genuine submission
# admitted where junk was planted ahead of the counter waits at most this long.
RESCAN_TICKS = 5


class TermInbox:
    """The inbox as one term sees it (an ``InboxIO`` for its steps' ``StepInbox``)."""

    def __init__(
        self,
        identity: Identity,
        store: Store,
        sealer: Sealer,
        calls: NodeCalls,
        sink: EventSink,
        standing: Standing,
        *,
        tick_s: float,
        closing: Callable[[], bool],
        clock: Clock,
    ) -> None:
        self._id, self._store, self._sealer, self._calls = identity, store, sealer, calls
        self._sink, self._standing, self._tick_s, self._clock = sink, standing, tick_s, clock
        self.closing = closing  # the node is stopping, or the term is over
        self.marks = ConsumedMarks()
        self._pending: dict[int, Submission] = {}
        # The highest number that authenticated: read on from there. Never past one that
        # did not: a number planted ahead of the inbox's counter must not hide the
        # genuine submissions admitted below it later.
        self._after = 0
        # Where the next read starts: past _after while reading on past junk; back to
        # _after (to look at the junk again) once the clock passes _rescan_at.
        self._scan = 0
        self._rescan_at = 0.0
        # Numbers that failed to authenticate, with a digest of what was stored: reported
        # once, not opened again unless something else is stored there (an admission
        # replaces what was planted above the counter).
        self._rejected: dict[int, bytes] = {}
        self._wakes = 0
        self._woke = asyncio.Event()
        self._read_failed = False  # the last read failed: say store.recovered after the next
        self._watcher: asyncio.Task[None] | None = None
        self._ahead: asyncio.Future[list[tuple[int, bytes]]] | None = None

    def read_ahead(self, taken: list[tuple[int, bytes]] | None = None) -> None:
        """Begin the first read now, while the term restores: a round trip less before
        its first step; none where the take read it along (taken). It reads from the
        start; resume()'s marks hide what is consumed."""
        if self._ahead is not None:
            return
        if taken is not None:
            self._ahead = asyncio.get_running_loop().create_future()
            self._ahead.set_result(taken)
            return
        self._ahead = asyncio.create_task(
            self._calls.io(self._store.read_inbox, self._id.agent, 0), name="hb-inbox-ahead"
        )

    def resume(self, marks: ConsumedMarks) -> None:
        """Start from (or move on to) a checkpoint's marks: what they consume is not shown."""
        self.marks = marks
        self._pending = {n: s for n, s in self._pending.items() if n not in marks}
        self._after = max(self._after, marks.through)
        self._show_depth()

    def committed(self, consumed: list[Consumed], marks: ConsumedMarks) -> None:
        """A checkpoint that consumed these was accepted: never show them again."""
        self.resume(marks)
        if consumed:
            self._sink.emit(
                "inbox.consumed",
                numbers=[c.number for c in consumed],
                request_ids=[c.request_id for c in consumed],
            )

    def gave_up(self, gaps: list[tuple[int, int]]) -> None:
        """Say which never-consumed numbers a checkpoint gave up (too many gaps)."""
        if gaps:
            self._sink.emit("inbox.gave_up", gaps=[list(gap) for gap in gaps[:16]])

    # -- InboxIO ---------------------------------------------------------------

    def seal_reply(self, number: int, request_id: str, reply: Any) -> bytes:
        return self._sealer.seal_reply(self._id.agent, number, request_id, reply)

    async def unconsumed(self) -> list[Submission]:
        """Read what was admitted since the last look; every unconsumed one, oldest first.

        A store that fails now only delays new submissions: what was read before
        is still shown, and the next look tries again.
        """
        ahead, self._ahead = self._ahead, None
        try:
            if ahead is not None:
                entries = await ahead
            else:
                entries = await self._calls.io(self._store.read_inbox, self._id.agent, self._scan)
        except StoreError as exc:
            self._sink.emit("store.error", error=f"inbox: {exc}")
            entries = None
        if entries is not None and self._read_failed:
            self._sink.emit("store.recovered", during="inbox")
        self._read_failed = entries is None
        for number, blob in entries or ():
            await self._take(number, blob)
        if entries is not None:
            self._read_on(max((number for number, _blob in entries), default=None))
        self._show_depth()
        return [self._pending[n] for n in sorted(self._pending)]

    async def _take(self, number: int, blob: bytes) -> None:
        """Show a submission read from the store if it authenticates; report it if not."""
        if number in self.marks or number in self._pending:
            return
        digest = hashlib.sha256(blob).digest()
        if self._rejected.get(number) == digest:
            return
        try:
            opened = await self._calls.work(
                self._sealer.open_submission, blob, self._id.agent, number
            )
        except Tampered as exc:
            if len(self._rejected) >= MAX_INBOX_COUNT:
                self._rejected.clear()  # bounded: at worst some are reported again
            self._rejected[number] = digest
            self._sink.emit("inbox.rejected", number=number, error=str(exc))
            return
        self._after = max(self._after, number)
        self._pending[number] = Submission(
            number, opened.request_id, opened.payload, opened.submitted
        )
        self._sink.emit("inbox.admitted", number=number, request_id=opened.request_id)

    def _read_on(self, top: int | None) -> None:
        """Move where the next read starts, after a read whose highest number was top: past
        what did not authenticate, back to _after only once _rescan_at has passed.
        """
        now = self._clock.monotonic()
        if self._scan <= self._after:
            self._scan = self._after
            self._rescan_at = now + RESCAN_TICKS * self._tick_s
        if top is not None and top > self._scan:
            self._scan = top
        elif top is None and now >= self._rescan_at:
            self._scan = self._after

    def wakes(self) -> int:
        return self._wakes

    async def woken(self, since: int, timeout: float) -> None:
        """Wait for the store's watch to hint at a change after since; at most one tick at a
        time, so a watch that misses a change delays a waiting step by a tick at most."""
        if self._watcher is None:
            self._watcher = asyncio.create_task(self._watch(), name="hb-inbox-watch")
        deadline = asyncio.get_running_loop().time() + min(timeout, self._tick_s)
        while self._wakes <= since and not self.closing():
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                return
            self._woke.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._woke.wait(), left)

    def interrupt(self) -> None:
        """The term is ending (closing() is true now): a step waiting for work returns at
        once, so that a stop or a switchover publishes it without waiting out a tick."""
        self._woke.set()

    async def _watch(self) -> None:
        while True:
            try:
                async for _ in self._store.watch(self._id.agent):
                    self._wakes += 1
                    self._woke.set()
            except StoreError as exc:
                log.debug("%s: inbox watch: %s", self._id.node, exc)
            await asyncio.sleep(self._tick_s)

    async def close(self) -> None:
        """Stop watching (the term is over): a node that no longer leads shows no inbox."""
        self._standing.inbox = (0, None)
        if self._ahead is not None:
            self._ahead.cancel()
            await asyncio.gather(self._ahead, return_exceptions=True)
            self._ahead = None
        if self._watcher is not None:
            self._watcher.cancel()
            await asyncio.gather(self._watcher, return_exceptions=True)
            self._watcher = None

    def _show_depth(self) -> None:
        """What heartbeats say of the inbox: how many wait, and since when (submitter's clock)."""
        oldest = min((s.submitted for s in self._pending.values()), default=None)
        self._standing.inbox = (len(self._pending), oldest)
