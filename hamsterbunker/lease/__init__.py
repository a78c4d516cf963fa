"""Lease keeping (``keeper``): acquire, renew, hand over and release one agent's lease,
judged on the local monotonic clock; its records' proof (``proof``) and the unreadable
record's replacement (``unreadable``). ``docs/design.md`` ("Lease keeping") tells how."""

from .keeper import LeaseKeeper
from .outcome import Outcome, TickResult

__all__ = ["LeaseKeeper", "Outcome", "TickResult"]
