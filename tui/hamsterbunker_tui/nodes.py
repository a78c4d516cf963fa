"""The nodes table: one row per node, keyed by node id, updated cell by cell in place.

Rows are not cleared and rebuilt while ages tick twice a second: the cursor, the
scroll position and the column widths stay put. Under COMPACT_BELOW cells wide
(an 80-column terminal) the table is compact: short labels, short cells, and a
long cell abbreviated with an ellipsis at its end, so that every column is on
screen; it is built anew when its width changes, or when a column must narrow.
"""

from __future__ import annotations

import time

from rich.text import Text
from textual.events import Resize
from textual.widgets import DataTable
from textual.widgets.data_table import ColumnKey

from .formatting import coarse_age, format_age
from .model import NodeView

__all__ = [
    "COLUMNS",
    "NodesTable",
    "abbreviate",
    "effects_cell",
    "heartbeat_age",
    "inbox_cell",
    "node_cells",
    "step_cell",
]

# (key, label, compact label): the keys address cells in update_cell. What tells the state
# of a node comes first.
COLUMNS = (
    ("node", "node", "node"),
    ("role", "role", "role"),
    ("epoch", "epoch", "ep"),
    ("seq", "seq", "seq"),
    ("heartbeat", "heartbeat", "beat"),
    ("region", "region", "region"),
    ("host", "host", "host"),
    ("pid", "pid", "pid"),
    ("inbox", "inbox", "inbox"),
    ("effects", "step in flight", "step"),
)
# A table with fewer cells than this across is compact.
COMPACT_BELOW = 100
# Compact, the step in flight has what the other columns leave, at least MIN_STEP_WIDTH;
# to make room, the wider of host and region gives up a cell, then the node's name, down
# to MIN_SHRUNK; the table scrolls sideways only when that is not enough.
MIN_STEP_WIDTH = 8
SHRINKABLE = (("host", "region"), ("node",))
MIN_SHRUNK = 6
ROLE_STYLES = {
    "active": "bold green",
    "standby": "cyan",
    "starting": "yellow",
    "stopping": "yellow",
    "offline": "bold red",
    "superseded": "yellow",  # says active, in an epoch the lease has left behind
}
# Heartbeat age against the lease TTL: past half of it is late, past all of it dead.
HEALTH_STYLES = {"fresh": "green", "late": "yellow", "dead": "bold red"}
# The state of a journaled effect of the step in flight (the active node's heartbeat).
EFFECT_STYLES = {
    "running": "bold yellow",
    "done": "green",
    "reused": "cyan",
    "failed": "bold red",
    "interrupted": "bold magenta",
}
# The row shows the newest few effects of the step; the rest are counted.
EFFECTS_SHOWN = 3
# A failing step's error is cut to this many characters in its cell.
FAILING_ERROR_SHOWN = 48
# Cells that change with every step, brought up to date at most this often (the
# progress panel and the event log's routine lines too): any change of a cell repaints
# every row, and with a step a second or more that was much of the monitor's idle cost.
ROUTINE_COLUMNS = frozenset({"seq", "effects", "inbox"})
ROUTINE_S = 2.0
# A submission that waited longer than this for the agent is shown as waiting long.
INBOX_LATE_S = 60.0


def heartbeat_age(seconds: float) -> str:
    """An age for the table; under a second it reads "< 1 s".

    A healthy node's cell then stays the same between polls, so fifty nodes
    beating every tick do not repaint the table twice a second.
    """
    return coarse_age(seconds)


def abbreviate(text: Text, width: int) -> Text:
    """text, or, if wider than width cells, its start and an ellipsis in the last cell."""
    if text.cell_len <= width:
        return text
    short = text.copy()
    short.truncate(width, overflow="ellipsis")
    return short


def effects_cell(effects: tuple[tuple[str, str], ...]) -> Text:
    """``+2 · search reused · llm done · tool running``: the newest effects of the step in
    flight with their states, coloured; empty when no step is in flight."""
    text = Text()
    hidden = len(effects) - EFFECTS_SHOWN
    if hidden > 0:
        text.append(f"+{hidden}", style="dim")
    for name, state in effects[-EFFECTS_SHOWN:]:
        if text:
            text.append(" · ", style="dim")
        text.append(f"{name} ").append(state, style=EFFECT_STYLES.get(state, ""))
    return text


def step_cell(view: NodeView, compact: bool = False) -> Text:
    """``failing ×3 RuntimeError: the API said 500``, in red, while the active node's steps
    fail in a row; then the effects of the step in flight. Compact: no error (the event log
    has it) and the newest effect only."""
    effects = effects_cell(view.effects[-1:] if compact else view.effects)
    if not view.failing:
        return effects
    text = Text(f"failing ×{view.failing}", style="bold red")
    if not compact:
        error = view.failing_error
        if len(error) > FAILING_ERROR_SHOWN:
            error = error[: FAILING_ERROR_SHOWN - 1] + "…"
        text.append(f" {error}", style="red")
    if effects:
        text.append(" · ", style="dim").append_text(effects)
    return text


def inbox_cell(view: NodeView, compact: bool = False) -> Text:
    """``3 waiting · 12 s``: an active node's unconsumed submissions and the oldest's age
    (yellow past INBOX_LATE_S); ``empty`` if none waits; ``not read while paused``; nothing
    on any other row. Compact: ``3 · 12 s``, and ``paused`` (the role then says no more)."""
    if view.role != "active":
        return Text()
    if view.paused:  # a paused leader reads no inbox: its heartbeat's depth is from before
        return (
            Text("paused", style="bold yellow")
            if compact
            else Text("not read while paused", style="dim")
        )
    if not view.inbox_depth:
        return Text("empty", style="dim")
    text = Text(f"{view.inbox_depth}{'' if compact else ' waiting'}", style="bold")
    if view.inbox_age_s is not None:
        # Whole seconds: a cell that changes on every poll repaints the table each time.
        age = view.inbox_age_s
        shown = f"{max(0, int(age))} s" if age < 60 else format_age(age)
        text.append(" · ", style="dim").append(shown, style="yellow" if age > INBOX_LATE_S else "")
    return text


def role_cell(view: NodeView, compact: bool = False) -> Text:
    """``active``, or ``active · paused`` when the node says the agent is paused (compact:
    the inbox cell says it)."""
    text = Text(view.role, style=ROLE_STYLES.get(view.role, ""))
    if view.paused and not compact:
        text.append(" · ").append("paused", style="bold yellow")
    return text


def node_cells(view: NodeView, compact: bool = False) -> dict[str, Text]:
    """The cells of one node's row, by column key, styled by role and heartbeat health."""
    dim = "dim" if view.role == "offline" else ""
    return {
        "node": Text(view.node, style="bold" if view.role == "active" else dim),
        "role": role_cell(view, compact),
        "epoch": Text(str(view.epoch), style=dim, justify="right"),
        "seq": Text(str(view.seq), style=dim, justify="right"),
        "heartbeat": Text(heartbeat_age(view.age_s), style=HEALTH_STYLES.get(view.health, "")),
        "region": Text(view.region, style=dim),
        "host": Text(view.host, style=dim),
        "pid": Text(str(view.pid), style=dim, justify="right"),
        "inbox": inbox_cell(view, compact),
        "effects": step_cell(view, compact),
    }


class NodesTable(DataTable[Text]):
    DEFAULT_CSS = """
    NodesTable {
        height: auto;
        max-height: 14;
    }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id, cursor_type="row", zebra_stripes=True)
        self.border_title = "nodes"
        self._shown: dict[str, dict[str, Text]] = {}
        self._routine_at = -ROUTINE_S  # when routine cells were last brought up to date
        self._views: list[NodeView] = []
        self._built_width = 0  # the width the table was built for
        self.compact = False
        self._widths: dict[str, int] = {}  # compact: each column's width
        self._natural: dict[str, int] = {}  # compact: the widest cells, by column
        self._new_table()

    def _new_table(self) -> None:
        """No rows, and the columns with the labels of the mode, as narrow as those."""
        self.clear(columns=True)
        for key, label, short in COLUMNS:
            self.add_column(short if self.compact else label, key=key)
        self._shown = {}

    def on_resize(self, event: Resize) -> None:
        width = self.size.width
        if width != self._built_width:
            self._built_width = width
            self.compact = width < COMPACT_BELOW
            self._natural = {}
            self._new_table()
            self.show(self._views)

    def _fit(self, rows: list[tuple[NodeView, dict[str, Text]]]) -> dict[str, int]:
        """Compact: each column's width, so that the table needs no sideways scrolling.

        The widest a column's cells were since the table was built, not the widest now:
        an age going from "< 1 s" to "1 s" and back would build it anew each time.
        """
        self._natural = {
            key: max([len(short), self._natural.get(key, 0), *(c[key].cell_len for _, c in rows)])
            for key, _, short in COLUMNS
            if key != "effects"
        }
        widths = dict(self._natural)
        room = self.scrollable_content_region.width - 2 * self.cell_padding * len(COLUMNS)
        for keys in SHRINKABLE:
            while sum(widths.values()) + MIN_STEP_WIDTH > room:
                widest = max(keys, key=widths.__getitem__)
                if widths[widest] <= MIN_SHRUNK:
                    break
                widths[widest] -= 1
        widths["effects"] = max(MIN_STEP_WIDTH, room - sum(widths.values()))
        return widths

    def show(self, nodes: list[NodeView]) -> None:
        """Add rows for new nodes; change only the cells whose text changed.

        A column is widened only when a cell outgrows it, never narrowed: asking
        for a width update on every changed cell makes the table measure the
        whole column again for each one, which a ticking age does every poll.

        The cells that change with every step (seq, the step in flight, the inbox)
        are brought up to date at most every ROUTINE_S, unless something else in
        the table changed anyway: any change repaints every row.
        """
        self._views = nodes
        rows = [(view, node_cells(view, self.compact)) for view in nodes]
        if self.compact:
            widths = self._fit(rows)
            if widths != self._widths:  # a column narrows only in a new table
                self._widths = widths
                self._new_table()
            rows = [
                (view, {key: abbreviate(cell, widths[key]) for key, cell in cells.items()})
                for view, cells in rows
            ]
        changed = {
            column
            for view, cells in rows
            if (shown := self._shown.get(view.node)) is not None
            for column, cell in cells.items()
            if shown[column] != cell
        }
        now = time.monotonic()
        known = all(view.node in self._shown for view, _ in rows)
        gone = self._shown.keys() - {view.node for view in nodes}  # forgotten (hb forget)
        if known and not gone and changed <= ROUTINE_COLUMNS and now - self._routine_at < ROUTINE_S:
            return
        self._routine_at = now
        for node in gone:
            self.remove_row(node)
            del self._shown[node]
        for view, cells in rows:
            shown = self._shown.get(view.node)
            if shown is None:
                self.add_row(*cells.values(), key=view.node)
            else:
                for column, cell in cells.items():
                    if shown[column] != cell:
                        wider = cell.cell_len > self.columns[ColumnKey(column)].content_width
                        self.update_cell(view.node, column, cell, update_width=wider)
            self._shown[view.node] = cells

    def row_text(self, node: str) -> dict[str, str]:
        """Column key → the plain text of node's row as shown (for tests and scripts)."""
        return {key: self.get_cell(node, key).plain for key, _, _ in COLUMNS}

    def roles(self) -> dict[str, str]:
        """Node id → the role its row shows, read back from the table (for tests and scripts)."""
        return {str(key.value): self.get_cell(key, "role").plain for key in self.rows}
