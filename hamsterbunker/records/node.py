"""What nodes write of themselves and of the checkpoints: heartbeats, events, checkpoint
descriptions."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from ..core.errors import CorruptRecord
from ..core.limits import (
    MAX_CHECKPOINT_BYTES,
    MAX_EPOCH,
    MAX_SEQ,
)
from .cluster import KEY_ID_PATTERN, MAX_CLUSTER_KEYS
from .parsing import PROCESS_SESSION, count_of, dump_compact, field_of, load_object, parse_json

MAX_HOSTED = 100_000  # the most agents a heartbeat may say its node process keeps
_SESSION = re.compile(r"[0-9a-f]{0,32}")  # a lease keeper's session ("" from older nodes)


@dataclass(frozen=True)
class CheckpointInfo:
    """Where a checkpoint sits, without its sealed bytes."""

    epoch: int
    seq: int
    size: int
    written: float  # wall-clock time from the writer's store call; display only

    def to_json(self) -> bytes:
        """The description a backend stores under the checkpoint's seq, beside its bytes."""
        return dump_compact(self)

    @classmethod
    def from_json(cls, data: bytes, seq: int) -> CheckpointInfo:
        """The description stored under seq (its key or field name); CorruptRecord if it
        names another seq (a copy under the wrong name)."""
        doc = parse_json(data, f"checkpoint {seq} description")
        if not isinstance(doc, dict):
            raise CorruptRecord(f"checkpoint {seq} description is not a JSON object")
        epoch, size, written = doc.get("epoch"), doc.get("size"), doc.get("written")
        if type(epoch) is not int or not 0 < epoch <= MAX_EPOCH:
            raise CorruptRecord(f"checkpoint {seq} epoch is not a number in 1..{MAX_EPOCH}")
        if "seq" in doc and (type(doc["seq"]) is not int or doc["seq"] != seq):
            raise CorruptRecord(f"checkpoint {seq} description names another seq")
        if type(size) is not int or not 0 <= size <= MAX_CHECKPOINT_BYTES:
            raise CorruptRecord(
                f"checkpoint {seq} size is not a number in 0..{MAX_CHECKPOINT_BYTES}"
            )
        if isinstance(written, bool) or not isinstance(written, int | float):
            raise CorruptRecord(f"checkpoint {seq} has no time written")
        return cls(epoch=epoch, seq=seq, size=size, written=float(written))


@dataclass(frozen=True)
class Heartbeat:
    """A node's liveness record. Never carries agent state."""

    node: str
    region: str
    host: str
    pid: int
    role: str  # active | standby | starting | stopping
    epoch: int  # highest epoch this node has seen
    seq: int  # last checkpoint sequence this node has seen or written
    leader: str | None
    time: float  # writer's wall clock; display only, never compared across nodes
    beats: int = 0
    # The journaled effects of the step in flight on the active node: (name, state).
    effects: tuple[tuple[str, str], ...] = ()
    # The active node's inbox: unconsumed submissions, and the oldest's submit time
    # (the submitter's wall clock: display only).
    inbox_depth: int = 0
    inbox_oldest: float | None = None
    # The active node's steps failing in a row, and the last one's error (short): 0, "" if none.
    failing: int = 0
    failing_error: str = ""
    session: str = PROCESS_SESSION  # the writing process's nonce ("" from older nodes)
    paused: bool = False  # the agent is paused (hb pause), as this node last saw
    # The key ids of the secrets this node holds, and the one it seals with now
    # (hb rotate-secret begin waits for every live node to hold, then use, the new one).
    keys: tuple[str, ...] = ()
    sealing: str = ""
    # The session this node's lease keeper writes into a lease it holds: a leader handing
    # the lease over (a switchover) writes the target's next term in it.
    lease_session: str = ""
    # The node process's load: how many of the agents it keeps it leads, and how many it
    # keeps (hosts spread their leases by these: hamsterbunker.node.balance).
    host_leads: int = 0
    host_agents: int = 0

    def change_key(self) -> tuple[object, ...]:
        """What every beat of one process changes: its node is live while this changes."""
        return (self.session, self.beats, self.time)

    def to_json(self) -> bytes:
        return dump_compact(self)

    @classmethod
    def from_json(cls, data: bytes) -> Heartbeat:
        doc = load_object(data, "heartbeat")
        leader = doc.get("leader")
        if leader is not None and not isinstance(leader, str):
            raise CorruptRecord("heartbeat record field 'leader' has the wrong type")
        return cls(
            node=field_of(doc, "node", str, "heartbeat"),
            region=field_of(doc, "region", str, "heartbeat"),
            host=field_of(doc, "host", str, "heartbeat"),
            pid=count_of(doc, "pid", "heartbeat"),
            role=field_of(doc, "role", str, "heartbeat"),
            epoch=count_of(doc, "epoch", "heartbeat", MAX_EPOCH),
            seq=count_of(doc, "seq", "heartbeat", MAX_SEQ),
            leader=leader,
            time=float(field_of(doc, "time", (int, float), "heartbeat")),
            beats=count_of(doc, "beats", "heartbeat"),
            effects=_effects_shown(doc.get("effects", [])),
            inbox_depth=count_of({"inbox_depth": 0, **doc}, "inbox_depth", "heartbeat"),
            inbox_oldest=optional_time(doc.get("inbox_oldest"), "inbox_oldest", "heartbeat"),
            failing=count_of({"failing": 0, **doc}, "failing", "heartbeat"),
            failing_error=_failing_error(doc.get("failing_error", "")),
            session=field_of({"session": "", **doc}, "session", str, "heartbeat")[:64],
            paused=field_of({"paused": False, **doc}, "paused", bool, "heartbeat"),
            keys=_key_ids(doc.get("keys", [])),
            sealing=field_of({"sealing": "", **doc}, "sealing", str, "heartbeat")[:16],
            lease_session=_lease_session(doc.get("lease_session", "")),
            host_leads=count_of({"host_leads": 0, **doc}, "host_leads", "heartbeat", MAX_HOSTED),
            host_agents=count_of({"host_agents": 0, **doc}, "host_agents", "heartbeat", MAX_HOSTED),
        )


def _lease_session(value: Any) -> str:
    if not isinstance(value, str) or not _SESSION.fullmatch(value):
        raise CorruptRecord("heartbeat record field 'lease_session' is not a session")
    return value


def _key_ids(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or len(value) > 2 * MAX_CLUSTER_KEYS:
        raise CorruptRecord("heartbeat record field 'keys' is not a short list")
    if not all(isinstance(kid, str) and KEY_ID_PATTERN.fullmatch(kid) for kid in value):
        raise CorruptRecord("heartbeat record field 'keys' has an entry that is not a key id")
    return tuple(value)


def optional_time(value: Any, name: str, what: str) -> float | None:
    """A wall-clock time field that may be absent (None)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise CorruptRecord(f"{what} record field {name!r} is not a time")
    return float(value)


# A heartbeat shows at most this many effects of the step in flight, the newest.
MAX_SHOWN_EFFECTS = 16
MAX_SHOWN_NAME = 64
# A heartbeat shows at most this many characters of a failing step's last error.
MAX_SHOWN_ERROR = 200


def _failing_error(value: Any) -> str:
    if not isinstance(value, str) or len(value) > MAX_SHOWN_ERROR:
        raise CorruptRecord("heartbeat record field 'failing_error' is not a short string")
    return value


def _effects_shown(value: Any) -> tuple[tuple[str, str], ...]:
    if not isinstance(value, list) or len(value) > MAX_SHOWN_EFFECTS:
        raise CorruptRecord("heartbeat record field 'effects' is not a short list")
    shown = []
    for item in value:
        if not (
            isinstance(item, list)
            and len(item) == 2
            and all(isinstance(part, str) and len(part) <= MAX_SHOWN_NAME for part in item)
        ):
            raise CorruptRecord("heartbeat record field 'effects' has an entry of the wrong shape")
        shown.append((item[0], item[1]))
    return tuple(shown)


@dataclass(frozen=True)
class Event:
    """One state change of one node. ``n`` counts up per node from 1."""

    node: str
    n: int
    type: str
    time: float
    epoch: int = 0
    seq: int = 0
    detail: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> bytes:
        return dump_compact(self)

    @classmethod
    def from_json(cls, data: bytes) -> Event:
        doc = load_object(data, "event")
        detail = doc.get("detail", {})
        if not isinstance(detail, dict):
            raise CorruptRecord("event record field 'detail' has the wrong type")
        return cls(
            node=field_of(doc, "node", str, "event"),
            n=count_of(doc, "n", "event"),
            type=field_of(doc, "type", str, "event"),
            time=float(field_of(doc, "time", (int, float), "event")),
            epoch=count_of(doc, "epoch", "event", MAX_EPOCH),
            seq=count_of(doc, "seq", "event", MAX_SEQ),
            detail=detail,
        )
