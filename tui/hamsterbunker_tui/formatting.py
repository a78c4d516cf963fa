"""How times, ages and sizes read on screen: one place, so every panel says them alike."""

from __future__ import annotations

import time

__all__ = ["coarse_age", "format_age", "format_size", "wall_clock"]


def wall_clock(wall: float) -> str:
    """HH:MM:SS of a writer's wall-clock time; dashes for one no calendar holds.

    The times come from the store, unauthenticated: 1e300 is a valid one there.
    """
    try:
        return time.strftime("%H:%M:%S", time.localtime(wall))
    except (OverflowError, OSError, ValueError):
        return "--:--:--"


def format_age(seconds: float | None) -> str:
    """1.2 s, 45 s, 3 m 05 s, 2 h 10 m, 12 d; a dash for unknown."""
    if seconds is None:
        return "—"
    seconds = max(0.0, seconds)
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 60:
        return f"{seconds:.0f} s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes} m {secs:02d} s"
    hours, minutes = divmod(minutes, 60)
    if hours < 100:
        return f"{hours} h {minutes:02d} m"
    # Days, capped: a writer's clock (unauthenticated) may put a time 1e300 s away.
    return f"{hours // 24} d" if hours < 24 * 10_000 else "> 9999 d"


def coarse_age(seconds: float | None) -> str:
    """An age at the resolution the eye needs: "< 1 s", then whole seconds, then format_age.

    A healthy cluster's ages then stay the same between polls, so nothing is repainted
    just because a tenth of a second went by.
    """
    if seconds is None or seconds >= 60:
        return format_age(seconds)
    return "< 1 s" if seconds < 1 else f"{int(seconds)} s"


def format_size(size: int) -> str:
    if size < 1024:
        return f"{size} B"
    if size < 1024 * 1024:
        return f"{size / 1024:.1f} KiB"
    return f"{size / (1024 * 1024):.1f} MiB"
