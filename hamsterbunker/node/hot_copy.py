"""A standby's hot copy: the newest sealed checkpoint, fetched as the leader's lease
record names it, so that a takeover restores with no read of it (docs/design.md, "Hot
standbys").
"""

from __future__ import annotations

import asyncio
import logging

from ..core.errors import HamsterbunkerError
from ..records import CheckpointInfo, LeaseRecord
from ..stores import Store
from .calls import NodeCalls

__all__ = ["HotCopy"]

log = logging.getLogger("hamsterbunker")

Named = tuple[int, int]  # (seq, epoch), as a lease record names its newest checkpoint


class HotCopy:
    """One agent's newest checkpoint as a standby last fetched it: sealed, opened only by
    a restore, which checks it against what the store lists. One fetch at a time, of the
    one the last record seen names: records seen while a fetch is under way leave only the
    last one's to fetch after it. (The last, not the highest: a forged record naming a
    seq far ahead must not keep the genuine ones from being fetched.)"""

    def __init__(self, store: Store, agent: str, calls: NodeCalls) -> None:
        self._store, self._agent, self._calls = store, agent, calls
        self._held: tuple[CheckpointInfo, bytes] | None = None
        self._wanted: Named = (0, 0)
        self._fetching: asyncio.Task[None] | None = None

    def follow(self, record: LeaseRecord | None) -> None:
        """A lease record seen as a standby: fetch the checkpoint it names, unless that is
        the one held or already wanted."""
        if record is None or not record.seq:
            return
        named = (record.seq, record.seq_epoch)
        if named == self._wanted or self._holds(named):
            return
        self._wanted = named
        if self._fetching is None or self._fetching.done():
            self._fetching = asyncio.create_task(self._fetch(), name="hb-hot-copy")

    async def take(self, newest: CheckpointInfo | None) -> bytes | None:
        """The sealed bytes of the checkpoint listed as newest, if this copy is of it (a
        fetch of it under way is awaited: started at the wake-up, it overlaps the acquire).
        A new term's restore calls it: the copy is let go and fetching stops either way."""
        fetching = self._fetching
        named = None if newest is None else (newest.seq, newest.epoch)
        if fetching is not None and self._wanted == named:
            await asyncio.wait([fetching])
        if fetching is not None:
            fetching.cancel()
        held, self._held, self._fetching, self._wanted = self._held, None, None, (0, 0)
        return held[1] if held is not None and held[0] == newest else None

    def _holds(self, named: Named) -> bool:
        return self._held is not None and (self._held[0].seq, self._held[0].epoch) == named

    async def _fetch(self) -> None:
        fetched: Named = (0, 0)
        while self._wanted != fetched:
            fetched = seq, epoch = self._wanted
            try:
                found = await self._calls.io(
                    self._store.read_checkpoint_from, self._agent, seq, epoch
                )
            except HamsterbunkerError as exc:  # a hint only: the restore reads for itself
                log.debug("%s: hot copy of checkpoint %d not fetched: %s", self._agent, seq, exc)
                self._wanted = (0, 0)  # fetched again at the next record that names one
                return
            if found is not None:
                self._held = found
