"""The live event log: every node's events merged, newest at the bottom, bounded in memory."""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence

from rich.text import Text
from textual.widgets import RichLog

from hamsterbunker.records import Event

from .model import wall_clock

__all__ = ["EventLog", "event_line"]

MAX_LINES = 1000
# Lines written per poll at most: a screenful, the newest; the rest are counted.
WRITE_PER_POLL = 50
MIN_WRITE = 20
MAX_DETAIL = 300  # characters of an event's detail shown on its line
# The routine events (one per step) stay quiet so the takeovers stand out.
TYPE_STYLES = {
    "lease.acquired": "bold yellow",
    "lease.released": "yellow",
    "lease.lost": "bold red",
    "lease.renew_failed": "red",
    "agent.resumed": "bold green",
    "agent.started": "bold green",
    "node.online": "cyan",
    "node.standby": "cyan",
    "node.stopping": "yellow",
    "node.offline": "red",
    "node.fenced": "bold red",
    "effect.interrupted": "yellow",
    "effect.rejected": "red",
    "inbox.admitted": "blue",
    "inbox.consumed": "green",
    "inbox.rejected": "red",
    "inbox.gave_up": "yellow",
    "store.error": "bold red",
    "store.warning": "yellow",
    "checkpoint.failed": "red",
    "checkpoint.rejected": "red",
    "agent.failing": "red",
    "agent.step": "dim",
    "checkpoint.published": "dim",
}


def stamp(wall: float) -> str:
    return f"{wall_clock(wall)}.{int(wall % 1 * 1000):03d}"


def event_line(event: Event) -> Text:
    text = Text(f"{stamp(event.time)} ")
    text.append(f"{event.node:<10}", style="bold")
    text.append(f"{event.type:<22}", style=TYPE_STYLES.get(event.type, ""))
    text.append(f"epoch {event.epoch} seq {event.seq}", style="dim")
    if event.detail:
        text.append("  " + _cut(" ".join(f"{k}={v}" for k, v in event.detail.items())))
    return text


def _cut(detail: str) -> str:
    # A detail may hold up to 64 KiB from the store; nobody reads that in a log line.
    return detail if len(detail) <= MAX_DETAIL else detail[: MAX_DETAIL - 1] + "…"


class EventLog(RichLog):
    """Writes only the events it has not written yet; the oldest lines fall off."""

    def __init__(self, *, id: str | None = None, max_lines: int = MAX_LINES) -> None:
        super().__init__(id=id, max_lines=max_lines, wrap=False, markup=False, classes="panel")
        self.border_title = "events"
        self._written = 0  # how many of the model's events (ever seen) are written or counted

    def show_new(self, events: Sequence[Event], seen: int) -> None:
        """events: the model's newest events; seen: how many it has taken in all.

        At most a screenful of lines per call, the newest: writing a line costs
        a render, and a burst of a thousand events must not hold up the screen
        (nobody reads a thousand lines a second). The rest are counted.
        """
        new = seen - self._written
        self._written = seen
        shown = min(new, len(events), self.screenful)
        if new > shown:
            self.write(Text(f"… {new - shown} more events, not shown", style="dim italic"))
        newest = list(itertools.islice(reversed(events), shown))
        if newest:
            # One write of all the lines: each write measures, renders and scrolls.
            self.write(Text("\n").join(event_line(event) for event in reversed(newest)))

    @property
    def screenful(self) -> int:
        """How many lines one call writes at most: what the log shows, within bounds."""
        return max(MIN_WRITE, min(WRITE_PER_POLL, self.scrollable_content_region.height))

    def note(self, message: str) -> None:
        """A line from the monitor itself (a kill, a restart), set apart from the nodes'."""
        self.write(Text(f"{stamp(time.time())} {'hb-tui':<10}{message}", style="bold magenta"))
