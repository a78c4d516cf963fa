"""What every backend's re-seal checks before it writes (``hb rotate-secret commit``), and
how much one page of ``Store.read_replies`` holds."""

from __future__ import annotations

from ..core.limits import check_reply_bounds, check_submission_bounds
from .base import refuse

__all__ = [
    "REPLY_PAGE",
    "REPLY_SCAN_FACTOR",
    "check_resealed_reply",
    "check_resealed_submission",
    "reply_page_bounds",
]

# The most replies one page of Store.read_replies holds (at most 4 MiB), and how many
# times as many consumed records it looks at (consumed without a reply, or junk).
REPLY_PAGE = 16
REPLY_SCAN_FACTOR = 4


def reply_page_bounds(limit: int) -> tuple[int, int]:
    """(replies, consumed records looked at) of one page asked for with limit."""
    replies = min(max(int(limit), 1), REPLY_PAGE)
    return replies, REPLY_SCAN_FACTOR * replies


def check_resealed_submission(number: int, old: bytes, new: bytes) -> None:
    """StoreError unless new can replace old as submission number's sealed bytes: within
    bounds, and as long (the inbox's byte totals count the stored length)."""
    problem = check_submission_bounds(number, "r", len(new))
    if problem is None and len(new) != len(old):
        problem = (
            f"a re-sealed submission {number} must be as long as the one it replaces "
            f"({len(new)} bytes, not {len(old)})"
        )
    refuse(problem)


def check_resealed_reply(number: int, new: bytes) -> None:
    """StoreError unless new can be stored as the sealed reply of consumed submission number
    (``check_reply_bounds``; no total counts a reply's length, so it may change)."""
    refuse(check_reply_bounds(number, "r", len(new)))
