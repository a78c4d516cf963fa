"""What one read of a store may return, per record kind, and the one helper that keeps to it.

Whatever a store holds, one read hands back at most ``count`` entries, none of more than
``entry_bytes``, and no more than ``total_bytes`` in all (DESIGN.md invariant 10): planted
junk can make a read stop early, never read on. Events are not here: how many a node's log
keeps is a store's setting, not a limit.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Generic, TypeVar

from .limits import (
    EFFECT_KINDS,
    MAX_CHECKPOINT_BYTES,
    MAX_CHECKPOINTS_LISTED,
    MAX_CLAIMS_TRIED,
    MAX_EFFECT_BYTES,
    MAX_EFFECTS_PER_STEP,
    MAX_INBOX_BYTES,
    MAX_INBOX_COUNT,
    MAX_NODES_READ,
    MAX_RECORD_BYTES,
    MAX_SUBMISSION_BYTES,
    MAX_TERM_RECORD_BYTES,
    MAX_TERMS_READ,
)

__all__ = [
    "CHECKPOINT_NAMES_READ",
    "CHECKPOINT_READ",
    "CLAIMS_READ",
    "EFFECTS_READ",
    "HEARTBEATS_READ",
    "INBOX_READ",
    "TAKEN_INBOX_READ",
    "TAKEN_JOURNAL_READ",
    "TERM_RECORDS_READ",
    "BoundedRead",
    "ReadBound",
]

K = TypeVar("K")


@dataclass(frozen=True)
class ReadBound:
    """The most one read of a record kind returns: entries, bytes of one, bytes in all."""

    count: int
    entry_bytes: int
    total_bytes: int


# The unconsumed submissions of one agent, from one number on (Store.read_inbox):
# what a full inbox holds, so a read of a genuine inbox always gets all of it.
INBOX_READ = ReadBound(MAX_INBOX_COUNT, MAX_SUBMISSION_BYTES, MAX_INBOX_BYTES)
# The effect journal of one step (Store.read_effects): an intent and an outcome
# for each effect a step may call.
EFFECTS_READ = ReadBound(
    MAX_EFFECTS_PER_STEP * len(EFFECT_KINDS),
    MAX_EFFECT_BYTES,
    MAX_EFFECTS_PER_STEP * len(EFFECT_KINDS) * MAX_EFFECT_BYTES,
)
# What the commit that takes a lease reads along for the new term's first step
# (stores.layer.restore): the effect journals of the steps after the checkpoint its record
# names, and the inbox. Each is read again after the take where the bound cut it short.
TAKEN_JOURNAL_READ = ReadBound(
    MAX_EFFECTS_PER_STEP * len(EFFECT_KINDS), MAX_EFFECT_BYTES, 256 * 1024
)
TAKEN_INBOX_READ = ReadBound(MAX_INBOX_COUNT, MAX_SUBMISSION_BYTES, 256 * 1024)
# The names of one agent's checkpoints (Store.list_checkpoints, and the check and
# retention of put_checkpoint), which describe them: the few a store keeps, and room for
# junk beside. No value is read (``stores.backend.Scan``: names only).
CHECKPOINT_NAMES_READ = ReadBound(MAX_CHECKPOINTS_LISTED, 0, 0)
# One sealed checkpoint (Store.read_checkpoint).
CHECKPOINT_READ = ReadBound(1, MAX_CHECKPOINT_BYTES, MAX_CHECKPOINT_BYTES)
# The heartbeats of one agent's nodes (Store.list_heartbeats), by node id.
HEARTBEATS_READ = ReadBound(MAX_NODES_READ, MAX_RECORD_BYTES, MAX_NODES_READ * MAX_RECORD_BYTES)
# The synced-folder store: the newest term records, or chain choices, of one subtree.
TERM_RECORDS_READ = ReadBound(
    MAX_TERMS_READ, MAX_TERM_RECORD_BYTES, MAX_TERMS_READ * MAX_TERM_RECORD_BYTES
)
# The synced-folder store: the newest published claims of one subtree tried (one is taken).
CLAIMS_READ = ReadBound(MAX_CLAIMS_TRIED, MAX_RECORD_BYTES, MAX_CLAIMS_TRIED * MAX_RECORD_BYTES)


@dataclass
class BoundedRead(Generic[K]):
    """The entries one read takes, in the order offered, within a ReadBound.

    An entry over ``entry_bytes`` is left out (``too_big`` asks before fetching one); the
    first that would pass ``total_bytes`` sets ``stopped``: the reader stops there, and the
    next read goes on from the last key taken.
    """

    bound: ReadBound
    entries: list[tuple[K, bytes]] = field(default_factory=list)
    total: int = 0
    stopped: bool = False  # an entry would have passed total_bytes

    @property
    def full(self) -> bool:
        """Whether nothing more may be taken: the reader stops reading."""
        return self.stopped or len(self.entries) >= self.bound.count

    @property
    def room(self) -> int:
        """The bytes the read may still take."""
        return self.bound.total_bytes - self.total

    def too_big(self, size: int) -> bool:
        """Whether an entry of size bytes is over the bound's entry_bytes (left out unread)."""
        return size > self.bound.entry_bytes

    def offer(self, key: K, data: bytes) -> bool:
        """Take (key, data) if it fits; False if it was left out or the read is full."""
        if self.full:
            return False
        if self.too_big(len(data)):
            return False
        if len(data) > self.room:
            self.stopped = True
            return False
        self.entries.append((key, data))
        self.total += len(data)
        return True
