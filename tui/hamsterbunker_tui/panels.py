"""The small panels: store banner, lease, agent progress, takeover timeline, kill switch.

Each widget takes a view from the model in ``show`` and renders it with a
pure ``*_text`` function, so what is on screen can be checked without an app.
"""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical, VerticalScroll
from textual.widgets import Button, Static

from hamsterbunker.lease.gap import format_gap

from .formatting import coarse_age, format_size, wall_clock
from .killing import KillTarget
from .model import LeaseView, ProgressView, Takeover

__all__ = [
    "KillPanel",
    "LeasePanel",
    "ProgressPanel",
    "StoreBanner",
    "TextPanel",
    "Timeline",
    "lease_text",
    "progress_text",
    "timeline_text",
]

# How the new holder got the lease (the lease.acquired event's "via").
VIA = {
    "expired": "expired",
    "released": "released",
    "empty": "first lease",
    "switchover": "switchover",
    "handoff": "handed off",
}


class StoreBanner(Static):
    """Shown only while the store cannot be read; the data below is the last known."""

    DEFAULT_CSS = """
    StoreBanner {
        display: none;
        background: $error;
        color: $text;
        text-style: bold;
        padding: 0 1;
        width: 100%;
    }
    StoreBanner.-shown {
        display: block;
    }
    """

    def show_error(self, reason: str) -> None:
        # Text, not a markup string: an OS error message may well contain "[Errno 2]".
        text = Text(f"store unreachable: {reason} — retrying (showing the last data read)")
        if text != self.content:
            self.update(text)
        self.add_class("-shown")

    def clear(self) -> None:
        self.remove_class("-shown")

    @property
    def shown(self) -> bool:
        return self.has_class("-shown")


class TextPanel(Static):
    """A panel of fixed size whose text changes on most polls (ages tick).

    It repaints only when the text changed, and never asks for a new layout:
    its size does not depend on its text (app.tcss), and a layout of the
    whole screen on every poll is what would make the monitor slow.
    """

    def show_text(self, text: Text) -> None:
        if text != self.content:
            self.update(text, layout=False)


def lease_text(view: LeaseView | None, agent: str, error: str | None = None) -> Text:
    if error is not None:
        # Not "store unreachable": the store answered, with a record that does not parse.
        return Text("unreadable: ", style="bold red").append(error)
    if view is None:
        return Text(f"no lease record for agent {agent!r} yet", style="dim")
    text = Text()
    if view.holder is None:
        text.append("holder  ").append("none (released)", style="yellow")
    else:
        text.append("holder  ").append(view.holder, style="bold green")
        text.append(f" ({view.region})")
    text.append("\n").append(f"epoch {view.epoch}", style="bold")
    if view.paused:
        text.append(" · ").append("paused", style="bold yellow")
    if view.expires_in_s is None or view.renewed_s is None:
        return text
    # Whole seconds while healthy ("renewed < 1 s ago"): the text then stays the same
    # from one renewal to the next, and the panel is not repainted for nothing.
    if view.expires_in_s <= 0:
        text.append("\n").append(f"expired {coarse_age(-view.expires_in_s)} ago", "bold red")
    elif view.renewed_s <= view.ttl_s / 2:
        text.append("\n").append(f"renewed {coarse_age(view.renewed_s)} ago")
    else:  # late: every tenth of a second counts now
        text.append("\n").append(f"expires in {view.expires_in_s:.1f} s", "yellow")
    return text


class LeasePanel(TextPanel):
    """Who holds the lease, its epoch, and when it would expire as seen from here."""

    def __init__(self, agent: str, *, id: str | None = None) -> None:
        super().__init__(lease_text(None, agent), id=id, classes="panel")
        self.agent = agent
        self.border_title = "lease"

    def show(self, view: LeaseView | None, error: str | None = None) -> None:
        self.show_text(lease_text(view, self.agent, error))


def progress_text(view: ProgressView | None, counter: int | None = None) -> Text:
    if view is None:
        return Text("no checkpoint yet", style="dim")
    text = Text()
    if counter is not None:  # the demo: the agent's state, opened with the demo's secret
        text.append("counter ").append(str(counter), style="bold green").append("\n")
    text.append("checkpoint ").append(f"seq {view.seq}", style="bold")
    text.append(f" (epoch {view.epoch})")
    text.append(f"\nage {coarse_age(view.age_s)} · {format_size(view.size)}")
    return text


class ProgressPanel(TextPanel):
    """The agent's last checkpoint: number, age, size. The monitor never opens it."""

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(progress_text(None), id=id, classes="panel")
        self.border_title = "agent progress"

    def show(self, view: ProgressView | None, counter: int | None = None) -> None:
        self.show_text(progress_text(view, counter))


def timeline_line(takeover: Takeover) -> Text:
    """epoch 2  12:03:04  hbnk-1 → hbnk-3  expired  gap 2.004 s"""
    text = Text()
    text.append(f"epoch {takeover.epoch:<3}", style="bold")
    text.append(f" {wall_clock(takeover.time)}  ")
    if takeover.previous is not None:
        text.append(takeover.previous, style="red").append(" → ")
    text.append(takeover.node, style="green")
    text.append(f"  {VIA.get(takeover.via, takeover.via)}", style="dim")
    if takeover.gap_ms is not None:
        text.append(f"  gap {format_gap(takeover.gap_ms)}", style="bold yellow")
    return text


def timeline_text(takeovers: list[Takeover]) -> Text:
    if not takeovers:
        return Text("no takeover seen yet", style="dim")
    return Text("\n").join(timeline_line(takeover) for takeover in takeovers)


class Timeline(VerticalScroll):
    """One line per epoch, newest at the bottom: who took over from whom, and the gap."""

    DEFAULT_CSS = """
    Timeline > Static {
        width: 100%;
    }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id, classes="panel")
        self.border_title = "takeovers"
        self._lines = Static(timeline_text([]))
        self._shown = timeline_text([])

    def compose(self) -> ComposeResult:
        yield self._lines

    # The newest line in sight: when a line comes, and when the pane is made shorter. (Not
    # at once in show(): the layout that makes room for the new line comes after it.)
    def watch_virtual_size(self) -> None:
        self.scroll_end(animate=False, immediate=True)

    def on_resize(self) -> None:
        self.scroll_end(animate=False, immediate=True)

    def show(self, takeovers: list[Takeover]) -> None:
        text = timeline_text(takeovers)
        if text != self._shown:
            self._shown = text
            # A short screen shows the newest line only: the count says what scrolls.
            self.border_title = f"takeovers · {len(takeovers)}" if takeovers else "takeovers"
            self._lines.update(text)

    @property
    def plain(self) -> str:
        return self._shown.plain


class KillPanel(Vertical):
    """The kill switch: enabled only for an active node whose process runs on this machine."""

    DEFAULT_CSS = """
    KillPanel {
        height: auto;
    }
    KillPanel > Button {
        width: 100%;
    }
    KillPanel > Static {
        color: $text-muted;
    }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id, classes="panel")
        self.border_title = "kill switch"
        self.button = Button("kill: unavailable", id="kill-button", variant="error", disabled=True)
        self.reason = Static("cannot kill: no active node")
        self.target = KillTarget(None, None, "no active node")
        self.button.tooltip = "cannot kill: no active node"

    def compose(self) -> ComposeResult:
        yield self.button
        yield self.reason

    def show(self, target: KillTarget) -> None:
        if target == self.target:
            return  # unchanged: no repaint
        self.target = target
        enabled = target.pid is not None
        self.button.disabled = not enabled
        why = target.reason if enabled else f"cannot kill: {target.reason}"
        self.button.label = Text(f"k: kill {target.node}" if enabled else "kill: unavailable")
        self.button.tooltip = Text(why)
        # "k: ..." as well: on a narrow terminal the button is hidden and this line is all.
        self.reason.update(Text(f"k: {why}" if enabled else why))
