"""The nodes table: one row per node, keyed by node id, updated cell by cell in place.

Rows are never cleared and rebuilt: the cursor, the scroll position and the
column widths stay put while ages tick twice a second.
"""

from __future__ import annotations

import time

from rich.text import Text
from textual.widgets import DataTable
from textual.widgets.data_table import ColumnKey

from .formatting import coarse_age, format_age
from .model import NodeView

__all__ = [
    "COLUMNS",
    "NodesTable",
    "effects_cell",
    "heartbeat_age",
    "inbox_cell",
    "node_cells",
    "step_cell",
]

# (key, label): the keys address cells in update_cell. What tells the state of a node
# comes first, so that it is on screen however narrow the terminal (the table scrolls
# sideways for the rest).
COLUMNS = (
    ("node", "node"),
    ("role", "role"),
    ("epoch", "epoch"),
    ("seq", "seq"),
    ("heartbeat", "heartbeat"),
    ("region", "region"),
    ("host", "host"),
    ("pid", "pid"),
    ("inbox", "inbox"),
    ("effects", "step in flight"),
)
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


def step_cell(view: NodeView) -> Text:
    """``failing ×3 RuntimeError: the API said 500``, in red, while the active node's steps
    fail in a row; then the effects of the step in flight."""
    effects = effects_cell(view.effects)
    if not view.failing:
        return effects
    error = view.failing_error
    if len(error) > FAILING_ERROR_SHOWN:
        error = error[: FAILING_ERROR_SHOWN - 1] + "…"
    text = Text(f"failing ×{view.failing}", style="bold red").append(f" {error}", style="red")
    if effects:
        text.append(" · ", style="dim").append_text(effects)
    return text


def inbox_cell(view: NodeView) -> Text:
    """``3 waiting · 12 s``: an active node's unconsumed submissions and the oldest's age
    (yellow past INBOX_LATE_S); ``empty`` if none waits; ``not read while paused``; nothing
    on any other row."""
    if view.role != "active":
        return Text()
    if view.paused:  # a paused leader reads no inbox: its heartbeat's depth is from before
        return Text("not read while paused", style="dim")
    if not view.inbox_depth:
        return Text("empty", style="dim")
    text = Text(f"{view.inbox_depth} waiting", style="bold")
    if view.inbox_age_s is not None:
        # Whole seconds: a cell that changes on every poll repaints the table each time.
        age = view.inbox_age_s
        shown = f"{max(0, int(age))} s" if age < 60 else format_age(age)
        text.append(" · ", style="dim").append(shown, style="yellow" if age > INBOX_LATE_S else "")
    return text


def role_cell(view: NodeView) -> Text:
    """``active``, or ``active · paused`` when the node says the agent is paused."""
    text = Text(view.role, style=ROLE_STYLES.get(view.role, ""))
    if view.paused:
        text.append(" · ").append("paused", style="bold yellow")
    return text


def node_cells(view: NodeView) -> dict[str, Text]:
    """The cells of one node's row, by column key, styled by role and heartbeat health."""
    dim = "dim" if view.role == "offline" else ""
    return {
        "node": Text(view.node, style="bold" if view.role == "active" else dim),
        "role": role_cell(view),
        "epoch": Text(str(view.epoch), style=dim, justify="right"),
        "seq": Text(str(view.seq), style=dim, justify="right"),
        "heartbeat": Text(heartbeat_age(view.age_s), style=HEALTH_STYLES.get(view.health, "")),
        "region": Text(view.region, style=dim),
        "host": Text(view.host, style=dim),
        "pid": Text(str(view.pid), style=dim, justify="right"),
        "inbox": inbox_cell(view),
        "effects": step_cell(view),
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
        for key, label in COLUMNS:
            self.add_column(label, key=key)

    def show(self, nodes: list[NodeView]) -> None:
        """Add rows for new nodes; change only the cells whose text changed.

        A column is widened only when a cell outgrows it, never narrowed: asking
        for a width update on every changed cell makes the table measure the
        whole column again for each one, which a ticking age does every poll.

        The cells that change with every step (seq, the step in flight, the inbox)
        are brought up to date at most every ROUTINE_S, unless something else in
        the table changed anyway: any change repaints every row.
        """
        rows = [(view, node_cells(view)) for view in nodes]
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
        return {key: self.get_cell(node, key).plain for key, _ in COLUMNS}

    def roles(self) -> dict[str, str]:
        """Node id → the role its row shows, read back from the table (for tests and scripts)."""
        return {str(key.value): self.get_cell(key, "role").plain for key in self.rows}
