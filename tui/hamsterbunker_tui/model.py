"""What the monitor shows, computed from what it read: no Textual here, so it is testable alone.

``ClusterModel.update`` takes one poll of the store (new events, current
heartbeats, the lease record, the checkpoint list) and the monitor's clocks;
the views (nodes, lease, timeline, progress, event log) are derived from it.

Ages are measured the way the nodes measure a lease: from when *this* monitor
saw a record change, on its own monotonic clock, so a monitor whose wall clock
is off still shows the truth after one look. A record seen for the first time
is aged by what the store says of it: a heartbeat's and a checkpoint's own
``time``, and for the lease record its holder's heartbeat in that epoch, else
the epoch's ``lease.acquired`` event. Those times are the writers' wall clocks
compared with this monitor's: acceptable for display only (nodes never compare
clocks to decide anything), and clamped at zero.

The takeover gaps are not worked out here: each is the one its taker wrote
(``hamsterbunker.lease.gap``), the number ``hb history`` prints.
"""

from __future__ import annotations

import collections
import socket
import time
from dataclasses import dataclass, field, replace
from typing import Any

from hamsterbunker.ops.status import superseded
from hamsterbunker.records import CheckpointInfo, Event, Heartbeat, LeaseRecord

# Re-exported: they were defined here before the split, and tests and scripts import them.
from .formatting import format_age, wall_clock

__all__ = [
    "ClusterModel",
    "LeaseView",
    "NodeView",
    "ProgressView",
    "Takeover",
    "format_age",
    "wall_clock",
]

DEFAULT_TTL_S = 2.0
MAX_EVENTS = 2000  # the event log keeps this many lines: memory stays bounded
MAX_TAKEOVERS = 200


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
    # The journaled effects of the step in flight, (name, state), newest last: only an
    # active node's (running, done, failed, reused or interrupted).
    effects: tuple[tuple[str, str], ...] = ()
    # The inbox as an active node's heartbeat tells it: how many submissions wait, and
    # how long ago the oldest was submitted (None: none waits, or not an active node).
    inbox_depth: int = 0
    inbox_age_s: float | None = None
    # The steps failing in a row on an active node, and the last one's error (short).
    failing: int = 0
    failing_error: str = ""
    paused: bool = False  # the node's heartbeat says the agent is paused (hb pause)


@dataclass(frozen=True)
class LeaseView:
    holder: str | None
    region: str
    epoch: int
    expires_in_s: float | None  # None: released, or no lease yet
    renewed_s: float | None = None  # since the record last changed (or was written, first seen)
    ttl_s: float = DEFAULT_TTL_S
    # The holder's heartbeat says the agent is paused. Display only: the request itself
    # is signed in the lease record, which the monitor cannot check without the secret.
    paused: bool = False


@dataclass(frozen=True)
class Takeover:
    """One epoch: who took the lease from whom, and how long the agent stood still."""

    epoch: int
    node: str
    previous: str | None
    via: str
    time: float  # the new leader's wall-clock time of acquiring
    # The takeover gap its taker wrote (hamsterbunker.lease.gap): in its lease.acquired
    # event and the lease record's history. None: neither has been read.
    gap_ms: int | None = None


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
    lease_error: str | None = None  # the lease record did not parse (lease is then None)
    checkpoint: CheckpointInfo | None = None
    events_seen: int = 0
    _beat_seen: dict[str, _Seen] = field(default_factory=dict)
    # node -> its heartbeat's oldest unconsumed submission time, and when that was seen.
    _inbox_seen: dict[str, _Seen] = field(default_factory=dict)
    _lease_seen: _Seen | None = None
    _checkpoint_seen: _Seen | None = None
    _takeovers: dict[int, Takeover] = field(default_factory=dict)
    _acquired: dict[int, float] = field(default_factory=dict)  # epoch -> lease.acquired time
    # node -> its heartbeat (beats, time) when it said node.offline; any later
    # change of the heartbeat means it is back.
    _offline_marks: dict[str, object] = field(default_factory=dict)
    _said_offline: list[Event] = field(default_factory=list)  # to mark once beats are read
    _vanished: set[str] = field(default_factory=set)  # heartbeat removed (graceful stop)
    # Nodes dropped from the view since the app last asked (drain_forgotten).
    _forgotten: list[str] = field(default_factory=list)
    # Nodes known to exist before any heartbeat (the demo's, just started): shown as
    # starting until their first heartbeat, so the table is not empty meanwhile.
    expected: dict[str, NodeView] = field(default_factory=dict)
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
        lease_error: str | None = None,
    ) -> None:
        now = time.monotonic() if now is None else now
        wall = time.time() if wall is None else wall
        self._now = now
        for event in sorted(events, key=lambda e: e.time):
            self._take_event(event)
        current = {beat.node: beat for beat in heartbeats}
        for node, beat in current.items():
            self._beat_seen[node] = _observe(
                self._beat_seen.get(node), _beat_key(beat), now, wall - beat.time
            )
            self._vanished.discard(node)
            self._see_inbox(node, beat.inbox_oldest, now, wall)
        self._mark_offline(current)
        # A node whose heartbeat vanished (graceful stop) stays listed, as offline; a
        # dead one's was dropped by `hb forget` (it refuses a live node): so is the node.
        for node in self.heartbeats.keys() - current.keys():
            if node not in self._vanished and self._health(node) == "dead":
                self._forget(node)
                continue
            self._vanished.add(node)
            current[node] = self.heartbeats[node]
        self.heartbeats = current
        if lease is not None:
            self._lease_seen = _observe(
                self._lease_seen,
                (lease.version, lease.renewals, lease.holder),
                now,
                self._lease_first_age(lease, wall),
            )
        self.lease = lease
        self.lease_error = lease_error
        newest = checkpoints[0] if checkpoints else None
        if newest is not None:
            self._checkpoint_seen = _observe(
                self._checkpoint_seen, newest.seq, now, wall - newest.written
            )
        self.checkpoint = newest

    def _lease_first_age(self, lease: LeaseRecord, wall: float) -> float:
        """How long ago a lease record seen for the first time was last written, as far as
        the store tells: the holder's heartbeat in that epoch (it renews the lease on the
        same tick), else the epoch's lease.acquired event; 0 (just now) if neither is known.
        """
        beat = self.heartbeats.get(lease.holder) if lease.holder is not None else None
        if beat is not None and beat.epoch == lease.epoch and beat.role == "active":
            return wall - beat.time
        acquired = self._acquired.get(lease.epoch)
        return 0.0 if acquired is None else wall - acquired

    def _see_inbox(self, node: str, oldest: float | None, now: float, wall: float) -> None:
        """Age a heartbeat's oldest submission time from when it was first seen: each new
        one by the submitter's clock (every one is a time in the past, unlike a record's
        change), then on this monitor's monotonic clock."""
        seen = self._inbox_seen.get(node)
        if oldest is None:
            self._inbox_seen.pop(node, None)
        elif seen is None or seen.key != oldest:
            self._inbox_seen[node] = _Seen(oldest, now - max(0.0, wall - oldest))

    def _take_event(self, event: Event) -> None:
        self.events.append(event)
        self.events_seen += 1
        match event.type:
            case "lease.acquired":
                # The previous holder is worked out in timeline(): the epoch before
                # this one may be read in a later poll.
                gap = event.detail.get("gap_ms")  # from the store: junk is no gap
                self._takeovers[event.epoch] = Takeover(
                    epoch=event.epoch,
                    node=event.node,
                    previous=None,
                    via=str(event.detail.get("via", "")),
                    time=event.time,
                    gap_ms=gap if type(gap) is int and gap >= 0 else None,
                )
                _trim(self._takeovers, MAX_TAKEOVERS)
                self._acquired[event.epoch] = event.time
                _trim(self._acquired, MAX_TAKEOVERS)
            case "node.offline":
                self._said_offline.append(event)

    def _forget(self, node: str) -> None:
        """Drop node and its events from the view (``hb forget``)."""
        for seen in (self._beat_seen, self._inbox_seen, self._offline_marks):
            seen.pop(node, None)
        self._vanished.discard(node)
        kept = [event for event in self.events if event.node != node]
        self.events = collections.deque(kept, maxlen=self.max_events)
        self._forgotten.append(node)

    def drain_forgotten(self) -> list[str]:
        """The nodes dropped from the view since the last call, for the event log."""
        forgotten, self._forgotten = self._forgotten, []
        return forgotten

    def _health(self, node: str) -> str:
        """fresh, late or dead: how long since node's heartbeat last changed, as seen here."""
        age = self._now - self._beat_seen[node].since
        return "fresh" if age <= self.ttl_s / 2 else "late" if age <= self.ttl_s else "dead"

    def _mark_offline(self, beats: dict[str, Heartbeat]) -> None:
        for event in self._said_offline:
            beat = beats.get(event.node) or self.heartbeats.get(event.node)
            # An offline older than the heartbeat (an earlier run, read in the
            # first poll's history) says nothing about the node now.
            if beat is None or event.time >= beat.time:
                self._offline_marks[event.node] = _beat_key(beat)
        self._said_offline.clear()
        for node, beat in beats.items():
            if node in self._offline_marks and self._offline_marks[node] != _beat_key(beat):
                del self._offline_marks[node]

    # -- views -----------------------------------------------------------------

    @property
    def ttl_s(self) -> float:
        return self.lease.ttl_ms / 1000 if self.lease else DEFAULT_TTL_S

    def expect(self, node: str, region: str, pid: int) -> None:
        """A node started here that has not written a heartbeat yet."""
        self.expected[node] = NodeView(
            node, region, self.hostname, pid, "starting", 0.0, 0, 0, "fresh"
        )

    def nodes(self) -> list[NodeView]:
        views = [view for node, view in self.expected.items() if node not in self.heartbeats]
        for node, beat in sorted(self.heartbeats.items()):
            age = self._now - self._beat_seen[node].since
            health = self._health(node)
            gone = health == "dead" or node in self._vanished or node in self._offline_marks
            role = "offline" if gone else superseded(beat.role, beat.epoch, self.lease)
            active = role == "active"
            oldest = self._inbox_seen.get(node) if active and beat.inbox_depth else None
            views.append(
                NodeView(
                    node=node,
                    region=beat.region,
                    host=beat.host,
                    pid=beat.pid,
                    role=role,
                    age_s=age,
                    epoch=beat.epoch,
                    seq=beat.seq,
                    health=health,
                    effects=beat.effects if active else (),
                    inbox_depth=beat.inbox_depth if active else 0,
                    inbox_age_s=None if oldest is None else self._now - oldest.since,
                    failing=beat.failing if active else 0,
                    failing_error=beat.failing_error if active else "",
                    paused=beat.paused and not gone,
                )
            )
        return sorted(views, key=lambda view: view.node)

    def lease_view(self) -> LeaseView | None:
        if self.lease is None:
            return None
        expires_in = renewed = None
        if self.lease.holder is not None and self._lease_seen is not None:
            renewed = self._now - self._lease_seen.since
            expires_in = self.ttl_s - renewed
        lease = self.lease
        holder = self.heartbeats.get(lease.holder) if lease.holder is not None else None
        paused = holder is not None and holder.paused and holder.epoch == lease.epoch
        return LeaseView(
            lease.holder, lease.region, lease.epoch, expires_in, renewed, self.ttl_s, paused
        )

    def timeline(self) -> list[Takeover]:
        """One line per epoch, oldest first, with the gap its taker wrote (``hb history``'s):
        the lease record's history, where it still holds the epoch, else the event's."""
        written = {} if self.lease is None else {t.epoch: t.gap_ms for t in self.lease.history}
        lines = []
        previous: str | None = None
        for epoch in sorted(self._takeovers):
            takeover = self._takeovers[epoch]
            gap = written.get(epoch, takeover.gap_ms)
            lines.append(replace(takeover, previous=previous, gap_ms=gap))
            previous = takeover.node
        return lines

    def progress(self) -> ProgressView | None:
        if self.checkpoint is None or self._checkpoint_seen is None:
            return None
        age = self._now - self._checkpoint_seen.since
        return ProgressView(self.checkpoint.seq, self.checkpoint.epoch, age, self.checkpoint.size)

    def active_node(self) -> NodeView | None:
        holder = self.lease.holder if self.lease else None
        return next((n for n in self.nodes() if n.node == holder and n.role != "offline"), None)


def _beat_key(beat: Heartbeat | None) -> object:
    return None if beat is None else (beat.beats, beat.time)


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
