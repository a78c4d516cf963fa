"""A leader term's inbox under planted junk (DESIGN.md invariant 10), in-process, on a FakeClock.

Junk in the inbox (entries that do not authenticate) is read within the store's
bound, reported once, and not read again before every step: the term reads on
past it, so that a submission admitted behind it is shown, and looks at it
again only every few ticks, so that a submission admitted where junk was
planted ahead of the counter is shown then.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from hamsterbunker import Client
from hamsterbunker.clock import FakeClock
from hamsterbunker.node.calls import NodeCalls
from hamsterbunker.node.inbox import _RESCAN_TICKS, TermInbox
from hamsterbunker.node.state import Identity, Standing
from hamsterbunker.read_bounds import INBOX_READ
from hamsterbunker.sealing import Sealer
from hamsterbunker.testing import MemoryStore
from tests.support.agents import AGENT, SECRET
from tests.support.raw_inbox import plant_submissions

TICK_S = 0.4
JUNK = 200  # entries of the biggest size: more than one read takes
LOOKS = 20  # the steps a test lets begin (each reads the inbox)


class CountingStore(MemoryStore):
    """A MemoryStore that counts the bytes its read_inbox returned."""

    def __init__(self) -> None:
        super().__init__()
        self.bytes_read = 0

    def read_inbox(self, agent: str, after: int = 0) -> list[tuple[int, bytes]]:
        found = super().read_inbox(agent, after)
        self.bytes_read += sum(len(blob) for _number, blob in found)
        return found


class Sink:
    """The events the term's inbox emits."""

    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []

    def emit(self, name: str, **detail: Any) -> None:
        self.events.append((name, detail))

    def of(self, name: str) -> list[dict[str, Any]]:
        return [detail for event, detail in self.events if event == name]


class Term:
    def __init__(
        self, store: CountingStore, sealer: Sealer, inbox: TermInbox, sink: Sink, clock: FakeClock
    ) -> None:
        self.store, self.sealer, self.inbox = store, sealer, inbox
        self.sink, self.clock = sink, clock

    def admit(self, number: int) -> None:
        """Admit a genuine submission as number, whatever is stored there (junk included)
        and whatever the junk makes of the inbox's limits."""
        sealed = self.sealer.seal_submission(AGENT, number, f"r{number}", number, 0.0)
        plant_submissions(self.store, AGENT, [(number, sealed)])

    async def shown(self) -> list[int]:
        """The numbers a step beginning now is shown (the term reads its inbox first)."""
        return [submission.number for submission in await self.inbox.unconsumed()]


@contextlib.asynccontextmanager
async def leading() -> AsyncIterator[Term]:
    """A term's inbox on a fresh store, closed at the end."""
    store, sink, clock, calls = CountingStore(), Sink(), FakeClock(), NodeCalls()
    with Client(store, SECRET):
        cluster = store.read_cluster()
    assert cluster is not None
    sealer = Sealer(SECRET, cluster)
    inbox = TermInbox(
        Identity("n1", "r", "h", AGENT), store, sealer, calls, sink,  # type: ignore[arg-type]
        Standing(), tick_s=TICK_S, closing=lambda: False, clock=clock,
    )  # fmt: skip
    try:
        yield Term(store, sealer, inbox, sink, clock)
    finally:
        await inbox.close()
        calls.close()


def _junk(numbers: range) -> list[tuple[int, bytes]]:
    return [(n, b"j" * INBOX_READ.entry_bytes) for n in numbers]


def test_junk_is_read_past_and_not_again_before_every_step() -> None:
    """Junk that overwrote submissions below the counter, more than one read takes: a
    submission admitted after it is shown, and over many steps the junk is read once."""

    async def scenario() -> None:
        async with leading() as term:
            await _go(term)

    async def _go(term: Term) -> None:
        term.admit(1)
        plant_submissions(term.store, AGENT, _junk(range(2, 2 + JUNK)))  # over 2..JUNK + 1
        behind = 2 + JUNK
        term.admit(behind)
        seen = []
        for _look in range(LOOKS):
            seen = await term.shown()
        assert seen == [1, behind]
        junk_bytes = JUNK * INBOX_READ.entry_bytes
        assert term.store.bytes_read < junk_bytes + INBOX_READ.total_bytes  # once, not per step
        assert len(term.sink.of("inbox.rejected")) == JUNK  # each reported once

    asyncio.run(scenario())


def test_junk_read_past_is_looked_at_again_every_few_ticks() -> None:
    """Junk planted ahead of the counter, more than one read takes: a submission admitted in
    its place is shown once the term looks at the junk again, a few ticks later."""

    async def scenario() -> None:
        async with leading() as term:
            await _go(term)

    async def _go(term: Term) -> None:
        term.admit(1)
        plant_submissions(term.store, AGENT, _junk(range(2, 2 + JUNK)))  # ahead of the counter
        for _look in range(LOOKS):
            assert await term.shown() == [1]
        read_once = term.store.bytes_read
        term.admit(2)  # in place of the junk planted as #2
        for _look in range(LOOKS):
            await term.shown()
        assert term.store.bytes_read == read_once  # the junk is not read again at every step
        term.clock.advance(_RESCAN_TICKS * TICK_S)
        seen = []
        for _look in range(LOOKS):
            seen = await term.shown()
        assert seen == [1, 2]
        assert len(term.sink.of("inbox.rejected")) == JUNK  # each reported once

    asyncio.run(scenario())
