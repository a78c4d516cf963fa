"""What one tick of a lease keeper came to."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from ..records import LeaseRecord

__all__ = ["Outcome", "TickResult"]


class Outcome(enum.Enum):
    STANDBY = "standby"  # someone else holds a live lease
    ACQUIRED = "acquired"
    RENEWED = "renewed"
    RENEW_FAILED = "renew_failed"  # the store did not answer; still leading until the deadline
    LOST = "lost"


@dataclass(frozen=True)
class TickResult:
    outcome: Outcome
    record: LeaseRecord | None
    reason: str = ""
    store_error: str = ""  # why the store did not answer this tick, if it did not
    replaced: str = ""  # for an acquisition that replaced an unreadable record: what it was
