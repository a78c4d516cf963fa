"""Which events the event log shows: all, the warnings and takeovers, or one node's.

Pure: no Textual. The ``f`` key steps through ``next_filter``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from hamsterbunker.records import Event

__all__ = ["ALL", "IMPORTANT", "EventFilter", "is_important", "next_filter"]

# Who holds the lease and when the agent moved: what an operator looks for first.
TAKEOVER_TYPES = frozenset(
    {
        "lease.acquired",
        "lease.released",
        "lease.lost",
        "lease.given_up",
        "lease.switchover_asked",
        "agent.resumed",
        "agent.started",
    }
)
# Anything that went wrong or is about to (the routine step, checkpoint, standby and
# inbox events are the rest).
WARNING_TYPES = frozenset(
    {
        "lease.renew_failed",
        "node.offline",
        "node.fenced",
        "node.stopping",
        "effect.interrupted",
        "effect.rejected",
        "inbox.rejected",
        "inbox.gave_up",
        "store.error",
        "store.warning",
        "checkpoint.failed",
        "checkpoint.rejected",
        "term_record.rejected",
        "store.diverged",
        "agent.failing",
        "agent.paused",
        "agent.unpaused",
        "control.ignored",
        "lease.replaced_unreadable",
        "lease.unproven",
        "effect.lost",
        "acceptance.rejected",
        "store.regressed",
        "store.loss_accepted",
        "store.recovered",
    }
)


def is_important(event_type: str) -> bool:
    return event_type in TAKEOVER_TYPES or event_type in WARNING_TYPES


@dataclass(frozen=True)
class EventFilter:
    kind: str  # "all", "important" or "node"
    node: str | None = None

    @property
    def label(self) -> str:
        if self.kind == "important":
            return "warnings and takeovers"
        if self.kind == "node":
            return f"node {self.node}"
        return "all"

    def matches(self, event: Event) -> bool:
        if self.kind == "important":
            return is_important(event.type)
        if self.kind == "node":
            return event.node == self.node
        return True

    def shows_notes(self) -> bool:
        """The monitor's own lines (a kill, a restart) are shown unless one node is picked."""
        return self.kind != "node"


ALL = EventFilter("all")
IMPORTANT = EventFilter("important")


def next_filter(current: EventFilter, nodes: Iterable[str]) -> EventFilter:
    """all → warnings and takeovers → each node in turn → all."""
    ordered = sorted(set(nodes))
    if current.kind == "all":
        return IMPORTANT
    if current.kind == "important":
        return EventFilter("node", ordered[0]) if ordered else ALL
    later = [node for node in ordered if current.node is not None and node > current.node]
    return EventFilter("node", later[0]) if later else ALL
