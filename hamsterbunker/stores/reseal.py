"""What every backend's re-seal checks before it writes (``hb rotate-secret commit``)."""

from __future__ import annotations

from ..errors import StoreError
from ..limits import check_submission_bounds

__all__ = ["check_resealed_submission"]


def check_resealed_submission(number: int, old: bytes, new: bytes) -> None:
    """StoreError unless new can replace old as submission number's sealed bytes: within
    bounds, and as long (the inbox's byte totals count the stored length)."""
    problem = check_submission_bounds(number, "r", len(new))
    if problem is None and len(new) != len(old):
        problem = (
            f"a re-sealed submission {number} must be as long as the one it replaces "
            f"({len(new)} bytes, not {len(old)})"
        )
    if problem is not None:
        raise StoreError(problem)
