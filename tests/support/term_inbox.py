"""A leader term's inbox (hamsterbunker.node.inbox.TermInbox) over any store, on a FakeClock.

``leading(store)`` gives a ``Term``: its inbox, a way to admit genuine
submissions whatever the store holds (``admit``: sealed, then planted), the
numbers a step beginning now is shown (``shown``), the events emitted, and the
bytes the store's ``read_inbox`` returned so far.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from hamsterbunker import Client
from hamsterbunker.core.clock import FakeClock
from hamsterbunker.node.calls import NodeCalls
from hamsterbunker.node.inbox import TermInbox
from hamsterbunker.node.state import Identity, Standing
from hamsterbunker.sealing import Sealer
from hamsterbunker.stores.interface import Store

from .agents import AGENT, SECRET
from .raw_inbox import plant_submissions

__all__ = ["TICK_S", "CountingReads", "Sink", "Term", "leading"]

TICK_S = 0.4


class CountingReads:
    """A store as the term sees it, counting the bytes its read_inbox returned."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.bytes_read = 0

    def read_inbox(self, agent: str, after: int = 0) -> list[tuple[int, bytes]]:
        found = self.store.read_inbox(agent, after)
        self.bytes_read += sum(len(blob) for _number, blob in found)
        return found

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)


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
        self, reads: CountingReads, sealer: Sealer, inbox: TermInbox, sink: Sink, clock: FakeClock
    ) -> None:
        self.reads, self.sealer, self.inbox = reads, sealer, inbox
        self.sink, self.clock = sink, clock

    def admit(self, number: int) -> None:
        """Admit a genuine submission as number, whatever is stored there (junk included)
        and whatever the junk makes of the inbox's limits."""
        sealed = self.sealer.seal_submission(AGENT, number, f"r{number}", number, 0.0)
        plant_submissions(self.reads.store, AGENT, [(number, sealed)])

    async def shown(self) -> list[int]:
        """The numbers a step beginning now is shown (the term reads its inbox first)."""
        return [submission.number for submission in await self.inbox.unconsumed()]


@contextlib.asynccontextmanager
async def leading(store: Store) -> AsyncIterator[Term]:
    """A term's inbox of AGENT on store (its cluster record made here), closed at the end."""
    with Client(store, SECRET):
        cluster = store.read_cluster()
    assert cluster is not None
    reads, sink, clock, calls = CountingReads(store), Sink(), FakeClock(), NodeCalls()
    sealer = Sealer(SECRET, cluster)
    inbox = TermInbox(
        Identity("n1", "r", "h", AGENT), reads, sealer, calls, sink,  # type: ignore[arg-type]
        Standing(), tick_s=TICK_S, closing=lambda: False, clock=clock,
    )  # fmt: skip
    try:
        yield Term(reads, sealer, inbox, sink, clock)
    finally:
        await inbox.close()
        calls.close()
