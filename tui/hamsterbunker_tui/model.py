"""What the monitor shows, computed from what it read: no Textual here, so it is testable alone.

``ClusterModel.update`` takes one poll of the store (new events, current
heartbeats, the lease record, the checkpoint list) and the monitor's clocks;
the views (nodes, lease, timeline, progress, event log) are derived from it.

Ages are measured the way the nodes measure a lease: from when *this* monitor
saw a record change, on its own monotonic clock, so a monitor whose wall clock
is off still shows the truth after one look. Only a record seen for the first
time is aged by the writer's wall-clock time (there is nothing better yet).
"""

from __future__ import annotations

import collections
import os
import socket
import time
from dataclasses import dataclass, field
from typing import Any

from hamsterbunker.records import CheckpointInfo, Event, Heartbeat, LeaseRecord

__all__ = [
    "ClusterModel",
    "KillTarget",
    "LeaseView",
    "NodeView",
    "ProgressView",
    "Takeover",
    "format_age",
    "kill_target",
]

DEFAULT_TTL_S = 2.0
MAX_EVENTS = 2000  # the event log keeps this many lines: memory stays bounded
MAX_TAKEOVERS = 200
MAX_EPOCH_MARKS = 1000


@dataclass(frozen=True)
class NodeView:
    node: str
    region: str
    host: str
    pid: int
    role: str  # active, standby, starting, stopping, offline
    age_s: float  # since this monitor saw the heartbeat change
    epoch: int
    seq: int
    health: str  # fresh, late (past half the TTL), dead (past the TTL)


@dataclass(frozen=True)
class LeaseView:
    holder: str | None
    region: str
    epoch: int
    expires_in_s: float | None  # None: released, or no lease yet


@dataclass
class Takeover:
    """One epoch: who took the lease from whom, and how long the agent stood still."""

    epoch: int
    node: str
    previous: str | None
    via: str
    time: float  # the new leader's wall-clock time of acquiring
    gap_ms: float | None = None  # old leader's last checkpoint → new leader's resume


@dataclass(frozen=True)
class ProgressView:
    seq: int
    epoch: int
    age_s: float
    size: int


@dataclass
class _Seen:
    """A record and when this monitor first saw it in this form (monotonic)."""

    key: object
    since: float


@dataclass
class ClusterModel:
    agent: str
    max_events: int = MAX_EVENTS
    hostname: str = field(default_factory=socket.gethostname)
    events: collections.deque[Event] = field(init=False)
    heartbeats: dict[str, Heartbeat] = field(default_factory=dict)
    lease: LeaseRecord | None = None
    checkpoint: CheckpointInfo | None = None
    events_seen: int = 0
    _beat_seen: dict[str, _Seen] = field(default_factory=dict)
    _lease_seen: _Seen | None = None
    _checkpoint_seen: _Seen | None = None
    _takeovers: dict[int, Takeover] = field(default_factory=dict)
    _resumed: dict[int, float] = field(default_factory=dict)  # epoch -> resume time
    _last_publish: dict[int, float] = field(default_factory=dict)  # epoch -> last publish time
    _offline: set[str] = field(default_factory=set)  # said node.offline since its last beat
    _now: float = 0.0

    def __post_init__(self) -> None:
        self.events = collections.deque(maxlen=self.max_events)

    # -- input -----------------------------------------------------------------

    def update(
        self,
        events: list[Event],
        heartbeats: list[Heartbeat],
        lease: LeaseRecord | None,
        checkpoints: list[CheckpointInfo],
        *,
        now: float | None = None,
        wall: float | None = None,
    ) -> None:
        now = time.monotonic() if now is None else now
        wall = time.time() if wall is None else wall
        self._now = now
        for event in sorted(events, key=lambda e: e.time):
            self._take_event(event)
        current = {beat.node: beat for beat in heartbeats}
        for node, beat in current.items():
            self._beat_seen[node] = _observe(
                self._beat_seen.get(node), (beat.beats, beat.time), now, wall - beat.time
            )
            if beat.beats != self.heartbeats.get(node, beat).beats:
                self._offline.discard(node)  # it came back
        # A node whose heartbeat vanished (graceful stop) stays listed, as offline.
        for node in self.heartbeats.keys() - current.keys():
            self._offline.add(node)
            current[node] = self.heartbeats[node]
        self.heartbeats = current
        if lease is not None:
            self._lease_seen = _observe(
                self._lease_seen, (lease.version, lease.renewals, lease.holder), now, 0.0
            )
        self.lease = lease
        newest = checkpoints[0] if checkpoints else None
        if newest is not None:
            self._checkpoint_seen = _observe(
                self._checkpoint_seen, newest.seq, now, wall - newest.written
            )
        self.checkpoint = newest

    def _take_event(self, event: Event) -> None:
        self.events.append(event)
        self.events_seen += 1
        match event.type:
            case "lease.acquired":
                previous = max((e for e in self._takeovers if e < event.epoch), default=None)
                self._takeovers[event.epoch] = Takeover(
                    epoch=event.epoch,
                    node=event.node,
                    previous=self._takeovers[previous].node if previous is not None else None,
                    via=str(event.detail.get("via", "")),
                    time=event.time,
                )
                _trim(self._takeovers, MAX_TAKEOVERS)
            case "agent.resumed" | "agent.started":
                self._resumed.setdefault(event.epoch, event.time)
                _trim(self._resumed, MAX_EPOCH_MARKS)
            case "checkpoint.published":
                self._last_publish[event.epoch] = max(
                    event.time, self._last_publish.get(event.epoch, 0.0)
                )
                _trim(self._last_publish, MAX_EPOCH_MARKS)
            case "node.offline":
                self._offline.add(event.node)

    # -- views -----------------------------------------------------------------

    @property
    def ttl_s(self) -> float:
        return self.lease.ttl_ms / 1000 if self.lease else DEFAULT_TTL_S

    def nodes(self) -> list[NodeView]:
        views = []
        for node, beat in sorted(self.heartbeats.items()):
            age = self._now - self._beat_seen[node].since
            health = "fresh" if age <= self.ttl_s / 2 else "late" if age <= self.ttl_s else "dead"
            gone = health == "dead" or node in self._offline
            views.append(
                NodeView(
                    node=node,
                    region=beat.region,
                    host=beat.host,
                    pid=beat.pid,
                    role="offline" if gone else beat.role,
                    age_s=age,
                    epoch=beat.epoch,
                    seq=beat.seq,
                    health=health,
                )
            )
        return views

    def lease_view(self) -> LeaseView | None:
        if self.lease is None:
            return None
        expires_in = None
        if self.lease.holder is not None and self._lease_seen is not None:
            expires_in = self.ttl_s - (self._now - self._lease_seen.since)
        return LeaseView(self.lease.holder, self.lease.region, self.lease.epoch, expires_in)

    def timeline(self) -> list[Takeover]:
        """One line per epoch, oldest first; the gap filled in once both ends are known."""
        lines = []
        epochs = sorted(self._takeovers)
        for index, epoch in enumerate(epochs):
            takeover = self._takeovers[epoch]
            resumed = self._resumed.get(epoch)
            before = self._last_publish.get(epochs[index - 1]) if index > 0 else None
            if resumed is not None and before is not None:
                takeover.gap_ms = max(0.0, (resumed - before) * 1000)
            lines.append(takeover)
        return lines

    def progress(self) -> ProgressView | None:
        if self.checkpoint is None or self._checkpoint_seen is None:
            return None
        age = self._now - self._checkpoint_seen.since
        return ProgressView(self.checkpoint.seq, self.checkpoint.epoch, age, self.checkpoint.size)

    def active_node(self) -> NodeView | None:
        holder = self.lease.holder if self.lease else None
        return next((n for n in self.nodes() if n.node == holder and n.role != "offline"), None)


def _observe(seen: _Seen | None, key: object, now: float, first_age: float) -> _Seen:
    """Keep the time a record was first seen in this form; a change restarts it."""
    if seen is not None and seen.key == key:
        return seen
    # First sight: the writer's own age estimate, clamped (clocks may disagree).
    age = max(0.0, first_age) if seen is None else 0.0
    return _Seen(key, now - age)


def _trim(marks: dict[int, Any], limit: int) -> None:
    while len(marks) > limit:
        del marks[min(marks)]


# -- the kill button -------------------------------------------------------------


@dataclass(frozen=True)
class KillTarget:
    node: str | None
    pid: int | None
    reason: str  # why the button is disabled, or what it will do


def kill_target(model: ClusterModel) -> KillTarget:
    """The active node if its process runs on this machine, else why it cannot be killed."""
    active = model.active_node()
    if active is None:
        return KillTarget(None, None, "no active node")
    if active.host != model.hostname:
        return KillTarget(None, None, f"{active.node} runs on {active.host}, not on this machine")
    if not _process_exists(active.pid):
        return KillTarget(None, None, f"{active.node}'s process {active.pid} is not running here")
    return KillTarget(active.node, active.pid, f"kill {active.node} (pid {active.pid})")


def _process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # it exists, owned by someone else
    return True


def format_age(seconds: float | None) -> str:
    """1.2 s, 45 s, 3 m 05 s, 2 h 10 m; a dash for unknown."""
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
    return f"{hours} h {minutes:02d} m"
