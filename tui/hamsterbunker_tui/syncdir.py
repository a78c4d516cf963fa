"""The syncdir panel: a ``syncdir://`` store's own report, as ``hb status`` gives it.

Shown only on such a store (mounted below the nodes table the first time a
poll brings the report; below 120 columns or 30 rows as one summary line, app.tcss): the
mode and what it does not guarantee, the stated
sync delay, what was kept aside (the ``store.diverged`` events as the nodes
reported them), each node's chain per term, the sync tool's own files and what
the store skipped as unreadable. The report is ``hamsterbunker.ops.status``'s
``SyncDirShown``; this module only renders it (``syncdir_text``, pure).

Everything here comes from the folder, unauthenticated: the monitor has no
secret. Text is shown with control characters escaped and cut to a length.
"""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.app import App, ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import Static

from hamsterbunker.ops.status import ChainShown, SyncDirShown

__all__ = ["SyncDirPanel", "show_syncdir", "syncdir_summary", "syncdir_text"]

MAX_SHOWN = 10  # sync-tool files and problems listed; the rest counted
MAX_CHARS = 200  # of any one value from the store
WARN = "bold yellow"


def _safe(value: object) -> str:
    """A value from the store, fit for one line: printable, and not endless."""
    text = str(value)
    if not text.isprintable():
        text = repr(text)[1:-1]
    return text if len(text) <= MAX_CHARS else text[:MAX_CHARS] + "…"


def _count(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"


def _aside_line(diverged: dict[str, object]) -> Text:
    """term 1@A seq 6..9 (4) · winner 2@B · forked at seq 5 of term 1@A · reported by A, B"""
    get = diverged.get
    reported = get("reported_by")
    by = ", ".join(_safe(n) for n in reported) if isinstance(reported, list) else _safe(reported)
    seqs = f"seq {_safe(get('from_seq'))}..{_safe(get('to_seq'))} ({_safe(get('count'))})"
    line = Text("  ").append(f"term {_safe(get('term'))} {seqs}", style=WARN)
    line.append(f" · winner {_safe(get('winner'))}")
    line.append(f" · forked at {_safe(get('forked_at') or 'the start')}")
    return line.append(f" · reported by {by}")


def _chain_line(chain: ChainShown) -> Text:
    """A  epoch 1  seq 42..46  (5 checkpoints)"""
    line = Text(f"  {_safe(chain.node)}  epoch {chain.epoch}  ")
    line.append(f"seq {chain.from_seq}..{chain.to_seq}  ")
    return line.append(f"({_count(chain.count, 'checkpoint')})", style="dim")


def _listed(label: str, items: list[str], note: str = "") -> Text:
    line = Text(f"{label}: ")
    if not items:
        return line.append("none", style="dim")
    shown = ", ".join(_safe(item) for item in items[:MAX_SHOWN])
    more = f" and {len(items) - MAX_SHOWN} more" if len(items) > MAX_SHOWN else ""
    return line.append(f"{len(items)}: {shown}{more}", style="yellow").append(note, style="dim")


def syncdir_text(shown: SyncDirShown) -> Text:
    """The panel's lines: the mode and delay, what was kept aside (it needs a person), the
    chains, the sync tool's files and the problems."""
    lines = [Text("mode: ").append("syncdir", style="bold").append(f" ({shown.mutual_exclusion})")]
    if shown.sync_delay_ms is not None:
        lines.append(Text(f"sync delay: {shown.sync_delay_ms} ms (as configured)"))
    else:
        lines.append(Text("sync delay: not known here (hb-tui --instance NAME reads it)", "dim"))
    if shown.diverged:
        lines.append(Text(f"kept aside: {len(shown.diverged)} (store.diverged)", style=WARN))
        lines.extend(_aside_line(d) for d in shown.diverged)
        lines.append(Text("  hb choose-chain --term EPOCH@NODE goes on from one instead", "dim"))
    else:
        lines.append(Text("kept aside: none reported"))
    if shown.chains:
        lines.append(Text("chains (as listed, not authenticated):"))
        lines.extend(_chain_line(chain) for chain in shown.chains)
    else:
        lines.append(Text("chains: none", style="dim"))
    lines.append(_listed("sync-tool files", shown.sync_files, " (never read as ours)"))
    lines.append(_listed("problems", shown.problems))
    return Text("\n").join(lines)


def syncdir_summary(shown: SyncDirShown) -> Text:
    """One line, for a narrow screen: the mode, then what needs a person first."""
    line = Text("syncdir", style="bold").append(" (no mutual exclusion)")
    if shown.diverged:
        newest = shown.diverged[-1]
        line.append(" · ").append(f"{len(shown.diverged)} kept aside", style=WARN)
        line.append(f" (term {_safe(newest.get('term'))}, winner {_safe(newest.get('winner'))})")
    line.append(f" · {_count(len(shown.chains), 'chain')}")
    for items, what in ((shown.sync_files, "sync-tool file"), (shown.problems, "problem")):
        if items:
            line.append(" · ").append(_count(len(items), what), style="yellow")
    return line


class SyncDirPanel(VerticalScroll):
    """The syncdir report, scrollable; its border turns to a warning once a chain is aside.

    It holds the whole report and its summary line; app.tcss shows one or the other by
    the screen's width.
    """

    DEFAULT_CSS = """
    SyncDirPanel.-diverged {
        border: round $warning;
        border-title-color: $warning;
    }
    SyncDirPanel > Static {
        width: 100%;
    }
    """

    def __init__(self, shown: SyncDirShown, *, id: str | None = None) -> None:
        super().__init__(id=id, classes="panel")
        self.border_title = "syncdir"
        self._summary = Static(classes="-summary")
        self._lines = Static(classes="-whole")
        self._shown = Text()
        self.show(shown)

    def compose(self) -> ComposeResult:
        yield self._summary
        yield self._lines

    def show(self, shown: SyncDirShown) -> None:
        text = syncdir_text(shown)
        if text == self._shown:
            return  # unchanged: no repaint
        self._shown = text
        self._lines.update(text)
        self._summary.update(syncdir_summary(shown))
        aside = len(shown.diverged)
        self.set_class(bool(aside), "-diverged")
        self.border_title = f"syncdir · {aside} kept aside" if aside else "syncdir"

    @property
    def plain(self) -> str:
        """The whole report as text (what a wide screen shows)."""
        return self._shown.plain


def show_syncdir(app: App[Any], shown: SyncDirShown) -> None:
    """Show shown in the app's panel, mounted below the nodes table on first sight."""
    panels = app.query(SyncDirPanel)
    if panels:
        panels.first().show(shown)
    else:
        app.mount(SyncDirPanel(shown, id="syncdir"), after="#nodes")
