"""The live event log: every node's events merged, newest at the bottom, bounded in memory.

It keeps its own bounded list of what it was given (events and the monitor's
notes), so that a new filter (the ``f`` key) or a new width redraws it from
there. It follows the newest line only while scrolled to the bottom: an
operator reading older lines is not thrown back down by every poll.
"""

from __future__ import annotations

import collections
import itertools
import time
from collections.abc import Sequence
from dataclasses import dataclass

from rich.text import Text
from textual.events import MouseScrollUp, Resize
from textual.geometry import Size
from textual.reactive import Reactive
from textual.widgets import RichLog

from hamsterbunker.records import Event

from .filters import ALL, EventFilter, is_important
from .formatting import wall_clock
from .nodes import ROUTINE_S

__all__ = ["EventLog", "Note", "event_line", "event_lines", "hang"]

MAX_LINES = 1000
# Lines written per poll at most: a screenful, the newest; the rest are counted.
WRITE_PER_POLL = 50
MIN_WRITE = 20
REDRAW_LINES = 300  # lines written again on a new filter or width
# Routine lines (steps, checkpoints) are written at most this often, together: each
# write scrolls, and a scroll repaints the whole log (see benchmarks/tui_idle.py).
ROUTINE_FLUSH_S = ROUTINE_S
MAX_DETAIL = 300  # characters of an event's detail shown on its line
HANG = 13  # a wrapped line goes on under the node, so that the times stand out
FOLDED = "agent.step+published"  # the type shown for a step and its checkpoint, folded
# The routine events (one per step) stay quiet so the takeovers stand out.
TYPE_STYLES = {
    FOLDED: "dim",
    "lease.acquired": "bold yellow",
    "lease.switchover_asked": "bold yellow",
    "lease.given_up": "yellow",
    "agent.paused": "bold yellow",
    "agent.unpaused": "bold green",
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
    "term_record.rejected": "red",
    "store.diverged": "bold red",
    "agent.failing": "red",
    "agent.step": "dim",
    "checkpoint.published": "dim",
}


def stamp(wall: float) -> str:
    return f"{wall_clock(wall)}.{int(wall % 1 * 1000):03d}"


def event_line(event: Event) -> Text:
    text = Text(f"{stamp(event.time)} ")
    text.append(f"{event.node:<10}", style="bold")
    text.append(f"{event.type:<21} ", style=TYPE_STYLES.get(event.type, ""))
    text.append(f"epoch {event.epoch} seq {event.seq}", style="dim")
    if event.detail:
        text.append("  " + _cut(" ".join(f"{k}={v}" for k, v in event.detail.items())))
    return text


def event_lines(events: Sequence[Event]) -> list[Text]:
    """One line per event, but a step and the checkpoint it published make one line:
    half as many routine lines to read past (and to write)."""
    lines: list[Text] = []
    previous: Event | None = None
    for event in events:
        if (
            previous is not None
            and previous.type == "agent.step"
            and event.type == "checkpoint.published"
            and (previous.node, previous.epoch, previous.seq)
            == (event.node, event.epoch, event.seq)
        ):
            detail = {**previous.detail, **event.detail}
            if detail.get("step_seq") == event.seq:
                del detail["step_seq"]  # the seq already says it
            lines[-1] = event_line(Event(event.node, event.n, FOLDED, event.time,
                                         epoch=event.epoch, seq=event.seq, detail=detail))  # fmt: skip
            previous = None
            continue
        lines.append(event_line(event))
        previous = event
    return lines


def _cut(detail: str) -> str:
    # A detail may hold up to 64 KiB from the store; nobody reads that in a log line.
    return detail if len(detail) <= MAX_DETAIL else detail[: MAX_DETAIL - 1] + "…"


def hang(line: Text, width: int, indent: int = HANG) -> list[Text]:
    """line in rows of at most width characters, broken at spaces where it can be, every
    row after the first indented by indent spaces: whole, and plainly one line."""
    if width <= 2 * indent:
        indent = 0  # too narrow to spare it
    rows: list[Text] = []
    rest, room = line, width
    while len(rest) > room:
        plain = rest.plain
        cut = plain.rfind(" ", 1, room + 1)
        if cut <= 0:
            cut = room  # one word longer than the row: broken inside it
        row = rest[:cut]
        row.rstrip()
        rows.append(row)
        rest = rest[len(plain) - len(plain[cut:].lstrip()) :]
        room = width - indent
    if rest or not rows:  # (nothing left but the spaces it was broken at: no blank row)
        rows.append(rest)
    return [rows[0], *(Text(" " * indent).append_text(row) for row in rows[1:])]


@dataclass(frozen=True)
class Note:
    """A line from the monitor itself (a kill, a restart), not from a node."""

    time: float
    message: str


def note_line(note: Note) -> Text:
    return Text(f"{stamp(note.time)} {'hb-tui':<10}{note.message}", style="bold magenta")


class EventLog(RichLog):
    """Writes only the events it has not written yet; the oldest lines fall off.

    Its scrollbars are always there (overflow-y: scroll, and no sideways scrolling:
    lines wrap), so that a write, which makes the log longer, needs no new layout of
    the screen: RichLog asks for one on every write, and a layout of the whole screen
    twice a second was most of what the monitor cost while nobody looked at it.
    """

    DEFAULT_CSS = """
    EventLog {
        overflow-y: scroll;
        overflow-x: hidden;
    }
    """

    # As Widget's, but a longer log repaints the log and its scrollbar, not the screen.
    virtual_size: Reactive[Size] = Reactive(Size(0, 0), layout=False)

    def __init__(self, *, id: str | None = None, max_lines: int = MAX_LINES) -> None:
        # Wrapped, not cut: a long line (a kill's note, an error) reads whole at 80 columns.
        super().__init__(
            id=id, max_lines=max_lines, wrap=True, min_width=1, markup=False, classes="panel"
        )
        self._written = 0  # how many of the model's events (ever seen) are written or counted
        self._kept: collections.deque[Event | Note] = collections.deque(maxlen=max_lines)
        self._width = 0  # the width the lines were wrapped at
        self._pending: list[Event] = []  # shown by the filter, not written yet
        self._last_write = -ROUTINE_FLUSH_S
        self.filter = ALL
        self.following = True  # scrolled to the newest line, and kept there
        self._title()

    def _title(self) -> None:
        self.border_title = f"events · {self.filter.label}"
        self.border_subtitle = "f filter · ↑↓ PgUp PgDn End scroll"

    def _shown(self, entry: Event | Note) -> bool:
        if isinstance(entry, Note):
            return self.filter.shows_notes()
        return self.filter.matches(entry)

    def _write(self, lines: list[Text]) -> None:
        # Follow the newest line unless scrolled up: someone up there is reading. (Not
        # is_vertical_scroll_end alone: the scroll of the last write may still be pending.)
        if not self.following and self.is_vertical_scroll_end:
            self.following = True  # scrolled back down, by the mouse say
        if lines:
            # At the log's width, not the terminal's (RichLog's default, which cuts a line
            # at the edge of a narrower log); before the width is known, RichLog keeps them.
            width = self.scrollable_content_region.width if self._size_known else None
            if width:
                lines = [row for line in lines for row in hang(line, width)]
            # One write of all the lines: each write measures, renders and scrolls.
            self.write(Text("\n").join(lines), width=width, scroll_end=self.following)

    def watch_virtual_size(self, size: Size) -> None:
        self._scroll_update(size)  # the scrollbar's thumb, and scroll_y kept in range

    # The keys and the wheel that scroll up stop the following; End resumes it.
    def action_scroll_up(self) -> None:
        self.following = False
        super().action_scroll_up()

    def action_page_up(self) -> None:
        self.following = False
        super().action_page_up()

    def action_scroll_home(self) -> None:
        self.following = False
        super().action_scroll_home()

    def action_scroll_end(self) -> None:
        self.following = True
        super().action_scroll_end()

    def _on_mouse_scroll_up(self, event: MouseScrollUp) -> None:
        self.following = False

    def show_new(self, events: Sequence[Event], seen: int) -> None:
        """events: the model's newest events; seen: how many it has taken in all.

        A warning or a takeover is written at once; the routine lines (steps,
        checkpoints) wait up to ROUTINE_FLUSH_S and go in one write: a write scrolls
        the log, and a scroll repaints every line of it, which twice a second was
        much of what the monitor cost while the cluster just stepped.
        """
        new = seen - self._written
        self._written = seen
        urgent = False
        if new > 0:
            newest = list(itertools.islice(reversed(events), min(new, len(events))))
            newest.reverse()
            self._kept.extend(newest)
            shown = [event for event in newest if self._shown(event)]
            self._pending.extend(shown)
            urgent = any(is_important(event.type) for event in shown)
        due = time.monotonic() - self._last_write >= ROUTINE_FLUSH_S
        if self._pending and (urgent or due):
            self.flush()

    def flush(self) -> None:
        """Write the pending lines: at most a screenful, the newest; the rest are counted.

        Writing a line costs a render, and a burst of a thousand events must not
        hold up the screen (nobody reads a thousand lines a second).
        """
        pending, self._pending = self._pending, []
        lines = event_lines(pending[-self.screenful :])
        if len(pending) > len(lines):
            left = len(pending) - len(lines)
            more = Text(f"… {left} more event{'s' if left != 1 else ''}, not shown", "dim italic")
            lines.insert(0, more)
        self._write(lines)
        self._last_write = time.monotonic()

    def forget(self, node: str) -> None:
        """Drop node's events (``hb forget``), and show what is left."""
        kept = [e for e in self._kept if not (isinstance(e, Event) and e.node == node)]
        self._kept = collections.deque(kept, maxlen=self._kept.maxlen)
        self.redraw()

    def set_filter(self, new: EventFilter) -> None:
        self.filter = new
        self._title()
        self.redraw()

    def redraw(self) -> None:
        """Write again what is kept and passes the filter, at the current width."""
        self.clear()
        self._pending = []  # they are in _kept: written below if they pass
        self.following = True
        self._width = self.scrollable_content_region.width
        entries = [entry for entry in self._kept if self._shown(entry)][-REDRAW_LINES:]
        lines: list[Text] = []
        run: list[Event] = []  # events in a row, between notes: folded as they are written
        for entry in entries:
            if isinstance(entry, Note):
                lines += [*event_lines(run), note_line(entry)]
                run = []
            else:
                run.append(entry)
        self._write(lines + event_lines(run))

    def on_resize(self, event: Resize) -> None:
        # (Textual calls RichLog's own on_resize after this one: the first time the size
        # is known, it writes what waited for it, at this width.)
        width = self.scrollable_content_region.width
        if not self._size_known:
            self._width = width
        elif self._kept and width != self._width:
            self.redraw()  # lines are wrapped when written: a new width wraps them again

    @property
    def screenful(self) -> int:
        """How many lines one call writes at most: what the log shows, within bounds."""
        return max(MIN_WRITE, min(WRITE_PER_POLL, self.scrollable_content_region.height))

    def note(self, message: str) -> None:
        """A line from the monitor itself (a kill, a restart), set apart from the nodes'."""
        entry = Note(time.time(), message)
        self._kept.append(entry)
        if self._shown(entry):
            if self._pending:
                self.flush()  # the lines before it go before it
            self._write([note_line(entry)])

    def lines_text(self) -> str:
        """Every line the log holds, as plain text (for tests and scripts)."""
        return "\n".join(strip.text for strip in self.lines)
