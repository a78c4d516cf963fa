"""What the parts of a running node share: who it is, where it stands, and its signals.

The node loop, the leader's term, the event sink and the status text each
read these; none of them needs the others (or the ``Runtime``) to get them.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

__all__ = ["Identity", "Signals", "Standing"]


@dataclass(frozen=True)
class Identity:
    """Which node this is, of which agent, as heartbeats and events name it."""

    node: str
    region: str
    host: str
    agent: str


@dataclass
class Standing:
    """Where the node stands now: set by the loop (role, epoch) and the term (seq, restored)."""

    role: str = "starting"
    epoch_seen: int = 0  # the highest lease epoch seen in any record
    seq: int = 0  # the last checkpoint this node published or resumed from
    restored: bool = False  # whether the current term has restored its state yet
    # The journaled effects of the step in flight, [name, state] each (shown in heartbeats).
    effects: list[list[str]] = field(default_factory=list)
    # The inbox as the leader last read it: unconsumed count, and the oldest's submit time.
    inbox: tuple[int, float | None] = (0, None)
    # The steps of the current term failing in a row, and the last error (shown in heartbeats).
    failing: tuple[int, str] = (0, "")
    # Paused by an operator (hb pause): the leader keeps its lease but does not step.
    paused: bool = False
    # The key ids of the secrets this node holds, and the one it seals with (node.keys).
    keys: tuple[str, ...] = ()
    sealing: str = ""


@dataclass
class Signals:
    """The asyncio events of one run of the node loop (made inside it, on its event loop)."""

    stopping: asyncio.Event
    wake: asyncio.Event = field(default_factory=asyncio.Event)  # the store hints at a change
    renewed: asyncio.Event = field(default_factory=asyncio.Event)  # set on every renewal
    # A second SIGTERM or SIGINT during a stop: give the step in flight no more grace.
    hurry: asyncio.Event = field(default_factory=asyncio.Event)
    # An operator's request changed (Standing.paused): a paused term looks again.
    control_changed: asyncio.Event = field(default_factory=asyncio.Event)
