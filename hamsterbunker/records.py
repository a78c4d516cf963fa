"""The records kept in a store, and their strict JSON forms.

Every backend stores these same JSON documents, so a record written by one
node's code is read identically by every other. Parsing is strict: a record
with a missing or mistyped field raises CorruptRecord naming what is wrong,
never a KeyError deep inside the runtime.
"""

from __future__ import annotations

import json
import math
import re
import secrets
from dataclasses import asdict, dataclass, field
from typing import Any, TypeVar

from .errors import ConfigError, CorruptRecord
from .limits import (
    MAX_CHECKPOINT_BYTES,
    MAX_EPOCH,
    MAX_JSON_DEPTH,
    MAX_LEASE_TTL_MS,
    MAX_NUMBER,
    MAX_RECORD_BYTES,
    MAX_SEQ,
)

__all__ = [
    "PROCESS_SESSION",
    "CheckpointInfo",
    "ClusterRecord",
    "Event",
    "Heartbeat",
    "KeyEntry",
    "LeaseRecord",
    "Takeover",
    "check_name",
    "parse_json",
]

# This process's nonce, in every heartbeat it writes: a node id beating under another
# session is another process (pid and host repeat across containers and clones).
PROCESS_SESSION = secrets.token_hex(8)

# Agent and node ids become file names and key parts: keep them plain.
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def check_name(kind: str, value: str) -> str:
    """Return value if it is a valid agent or node id, else raise ConfigError."""
    if not isinstance(value, str) or not _NAME.fullmatch(value):
        raise ConfigError(
            f"invalid {kind} {value!r}: use 1-64 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    return value


T = TypeVar("T")


def _field(doc: dict[str, Any], name: str, kind: type[T] | tuple[type, ...], what: str) -> T:
    if name not in doc:
        raise CorruptRecord(f"{what} record has no field {name!r}")
    value = doc[name]
    # bool is an int in Python; a flipped type must not pass as a number.
    if isinstance(value, bool) and kind is not bool:
        raise CorruptRecord(f"{what} record field {name!r} has the wrong type")
    if not isinstance(value, kind):
        raise CorruptRecord(f"{what} record field {name!r} has the wrong type")
    return value  # type: ignore[return-value]


def _count(doc: dict[str, Any], name: str, what: str, maximum: int = MAX_NUMBER) -> int:
    """A whole number field in 0..maximum."""
    value = _field(doc, name, int, what)
    if not 0 <= value <= maximum:
        raise CorruptRecord(f"{what} record field {name!r} is outside 0..{maximum}")
    return value


def _bounded_int(text: str) -> int:
    # int() itself refuses more than sys.int_max_str_digits (4300) digits.
    value = int(text)
    if not -MAX_NUMBER <= value <= MAX_NUMBER:
        raise ValueError(f"integer {text[:24]}… is out of range")
    return value


def _finite_float(text: str) -> float:
    value = float(text)
    if value in _INFINITIES:  # (NaN is spelt out, and goes to _no_constant)
        raise ValueError(f"number {text[:24]} is not finite")
    return value


_INFINITIES = (math.inf, -math.inf)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON allows")


_DECODER = json.JSONDecoder(
    parse_int=_bounded_int, parse_float=_finite_float, parse_constant=_no_constant
)


def _depth_within(doc: Any, limit: int) -> bool:
    """Whether arrays and objects nest at most limit deep (iteratively: no recursion)."""
    stack = [(doc, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict):
            value = list(value.values())
        elif not isinstance(value, list):
            continue
        if depth > limit:
            return False
        stack.extend((item, depth + 1) for item in value if isinstance(item, dict | list))
    return True


def parse_json(data: bytes, what: str, *, limit: int = MAX_RECORD_BYTES) -> Any:
    """Parse JSON read from a store within bounds, or raise CorruptRecord naming what it was.

    The bounds: at most limit bytes, UTF-8, integers within ±MAX_NUMBER, finite
    numbers only (no NaN, Infinity or 1e999), arrays and objects nested at most
    MAX_JSON_DEPTH deep. Whatever a store writer puts there, this raises
    CorruptRecord or returns plain JSON values: never another exception.
    """
    if len(data) > limit:
        raise CorruptRecord(f"{what} is {len(data)} bytes, above the limit of {limit} bytes")
    try:
        doc = _DECODER.decode(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:  # JSONDecodeError is a ValueError
        raise CorruptRecord(f"{what} is not valid JSON: {exc}") from exc
    except RecursionError as exc:
        raise CorruptRecord(f"{what} nests deeper than {MAX_JSON_DEPTH} levels") from exc
    # Only a document with more brackets than the limit can nest deeper: most have two.
    deep = data.count(b"[") + data.count(b"{") > MAX_JSON_DEPTH
    if deep and not _depth_within(doc, MAX_JSON_DEPTH):
        raise CorruptRecord(f"{what} nests deeper than {MAX_JSON_DEPTH} levels")
    return doc


def _load(data: bytes, what: str) -> dict[str, Any]:
    doc = parse_json(data, f"{what} record")
    if not isinstance(doc, dict):
        raise CorruptRecord(f"{what} record is not a JSON object")
    return doc


def _dump(obj: Any) -> bytes:
    return json.dumps(asdict(obj), separators=(",", ":"), sort_keys=True).encode()


# Keys a cluster record names besides its current one (accepted while a rotation
# is under way, retired ones kept to name them to a node that still holds one).
MAX_CLUSTER_KEYS = 4
_KEY_ID = re.compile(r"[0-9a-f]{16}")
MAX_HOSTED = 100_000  # the most agents a heartbeat may say its node process keeps
_SESSION = re.compile(r"[0-9a-f]{0,32}")  # a lease keeper's session ("" from older nodes)
_ROTATIONS = frozenset({"", "begun", "committed"})


@dataclass(frozen=True)
class KeyEntry:
    """One key of the cluster: its id (as sealed headers name it) and key-check value."""

    kid: str
    check: str  # base64; proves a secret is this key's without revealing the key

    def to_doc(self) -> dict[str, str]:
        return {"kid": self.kid, "check": self.check}

    @classmethod
    def from_doc(cls, doc: Any, what: str) -> KeyEntry:
        if not isinstance(doc, dict):
            raise CorruptRecord(f"cluster record field {what!r} has an entry that is not an object")
        kid, check = doc.get("kid"), doc.get("check")
        if not (isinstance(kid, str) and _KEY_ID.fullmatch(kid)):
            raise CorruptRecord(f"cluster record field {what!r} has an entry with a bad key id")
        if not (isinstance(check, str) and len(check) <= 64):
            raise CorruptRecord(f"cluster record field {what!r} has an entry with a bad check")
        return cls(kid, check)


@dataclass(frozen=True)
class ClusterRecord:
    """Key material every node needs to derive the sealing key: never the key itself.

    ``key_id`` and ``key_check`` name the *current* key, the one that seals.
    A record as first written (``generation`` 0) has no more than that; every
    change of keys (``hb rotate-secret``) raises the generation by one, lists
    the other keys still ``accepted`` for opening and the ``retired`` ones, and
    says how far a rotation has come (``rotation``: "", "begun", "committed").
    From generation 1 on the record carries ``macs``: an HMAC of all the rest
    under every key it lists as current or accepted (``hamsterbunker.sealing``
    checks them), so a writer without the secrets cannot change the key list.
    """

    format: int
    kdf: str
    n: int
    r: int
    p: int
    salt: str  # base64
    key_id: str
    key_check: str  # base64; tells a wrong secret apart from a tampered checkpoint
    created: float
    generation: int = 0
    accepted: tuple[KeyEntry, ...] = ()
    retired: tuple[KeyEntry, ...] = ()
    rotation: str = ""
    macs: tuple[tuple[str, str], ...] = ()  # (key id, hex HMAC), sorted by key id

    @property
    def current(self) -> KeyEntry:
        return KeyEntry(self.key_id, self.key_check)

    @property
    def listed(self) -> tuple[KeyEntry, ...]:
        """The keys that open sealed records: the current one first, then the accepted ones."""
        return (self.current, *self.accepted)

    def signed_body(self) -> bytes:
        """What ``macs`` authenticate: the whole record but the macs, canonically."""
        return json.dumps(self._doc(), separators=(",", ":"), sort_keys=True).encode()

    def _doc(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "format": self.format, "kdf": self.kdf, "n": self.n, "r": self.r, "p": self.p,
            "salt": self.salt, "key_id": self.key_id, "key_check": self.key_check,
            "created": self.created,
        }  # fmt: skip
        if self.generation:  # a first record is written as before rotation existed
            doc["generation"] = self.generation
            doc["accepted"] = [entry.to_doc() for entry in self.accepted]
            doc["retired"] = [entry.to_doc() for entry in self.retired]
            doc["rotation"] = self.rotation
        return doc

    def to_json(self) -> bytes:
        doc = self._doc()
        if self.generation:
            doc["macs"] = dict(self.macs)
        return json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes) -> ClusterRecord:
        doc = _load(data, "cluster")
        generation = _count({"generation": 0, **doc}, "generation", "cluster")
        rotation = _field({"rotation": "", **doc}, "rotation", str, "cluster")
        if rotation not in _ROTATIONS:
            raise CorruptRecord("cluster record field 'rotation' is not a known step")
        macs = doc.get("macs", {})
        if (
            not isinstance(macs, dict)
            or len(macs) > 2 * MAX_CLUSTER_KEYS
            or not all(isinstance(tag, str) and len(tag) <= 64 for tag in macs.values())
        ):
            raise CorruptRecord("cluster record field 'macs' is not a short map of tags")
        return cls(
            format=_field(doc, "format", int, "cluster"),
            kdf=_field(doc, "kdf", str, "cluster"),
            n=_count(doc, "n", "cluster"),
            r=_count(doc, "r", "cluster"),
            p=_count(doc, "p", "cluster"),
            salt=_field(doc, "salt", str, "cluster"),
            key_id=_field(doc, "key_id", str, "cluster"),
            key_check=_field(doc, "key_check", str, "cluster"),
            created=float(_field(doc, "created", (int, float), "cluster")),
            generation=generation,
            accepted=_key_entries(doc, "accepted"),
            retired=_key_entries(doc, "retired"),
            rotation=rotation,
            macs=tuple(sorted((str(kid), tag) for kid, tag in macs.items())),
        )


def _key_entries(doc: dict[str, Any], name: str) -> tuple[KeyEntry, ...]:
    value = doc.get(name, [])
    if not isinstance(value, list) or len(value) > MAX_CLUSTER_KEYS:
        raise CorruptRecord(f"cluster record field {name!r} is not a list of at most "
                            f"{MAX_CLUSTER_KEYS}")  # fmt: skip
    return tuple(KeyEntry.from_doc(entry, name) for entry in value)


# The lease record keeps this many of the newest takeovers (``hb history``).
MAX_HISTORY = 32
# A signed operator request (hamsterbunker.control) in a lease record: at most this long.
MAX_CONTROL_CHARS = 2048
# A lease record's proof (hamsterbunker.lease.proof): a key id and an HMAC, well below this.
MAX_PROOF_CHARS = 256
_VIAS = frozenset({"empty", "released", "expired", "switchover", "handoff"})


@dataclass(frozen=True)
class Takeover:
    """One acquisition of the lease, as its taker wrote it (display only, not authenticated)."""

    epoch: int
    to: str
    via: str  # empty | released | expired | switchover | handoff
    gap_ms: int  # how long the taker saw the lease without a live holder, on its own clock
    time: float  # the taker's wall clock
    from_: str | None = None  # the previous holder, if known

    def to_doc(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "from": self.from_, "to": self.to, "via": self.via,
                "gap_ms": self.gap_ms, "time": self.time}  # fmt: skip

    @classmethod
    def from_doc(cls, doc: Any) -> Takeover:
        if not isinstance(doc, dict):
            raise CorruptRecord("lease record field 'history' has an entry that is not an object")
        previous = doc.get("from")
        via = _field(doc, "via", str, "lease history")
        if via not in _VIAS or (previous is not None and not _NAME.fullmatch(str(previous))):
            raise CorruptRecord("lease record field 'history' has an entry of the wrong shape")
        return cls(
            epoch=_count(doc, "epoch", "lease history", MAX_EPOCH),
            to=check_record_name(_field(doc, "to", str, "lease history")),
            via=via,
            gap_ms=_count(doc, "gap_ms", "lease history"),
            time=_finite_time(_field(doc, "time", (int, float), "lease history")),
            from_=previous,
        )


def _finite_time(value: float) -> float:
    if not math.isfinite(value):
        raise CorruptRecord("lease record field 'history' has a time that is not a number")
    return float(value)


def check_record_name(value: str) -> str:
    """A node id read from a record: CorruptRecord (not ConfigError) if it is not one."""
    if not _NAME.fullmatch(value):
        raise CorruptRecord(f"a record names the node {value[:80]!r}, which is not a node id")
    return value


@dataclass(frozen=True)
class LeaseRecord:
    """Who may step the agent, under which epoch (the fencing token).

    ``version`` is assigned by the store on every successful write and is what
    compare-and-set compares; ``holder`` is None once the lease is released.
    ``renewals`` changes on every renewal so observers see the record change.
    ``seq`` and ``seq_epoch`` are the newest checkpoint seq, and the latest epoch
    of a checkpoint, that the writer knew to be accepted: they let every node,
    standbys included, tell when the store loses checkpoints.
    ``control`` is an operator's signed request (pause, switchover: see
    hamsterbunker.control), carried from term to term; ``successor`` names the
    node a released lease was handed to (the others leave it to that node for
    a TTL); ``history`` the newest takeovers, oldest first. ``proof`` is its
    writer's signature over the fields that steer a node beyond one TTL
    (``hamsterbunker.lease.proof``); the store never looks at it.
    """

    holder: str | None
    region: str
    session: str
    epoch: int
    ttl_ms: int
    renewals: int = 0
    version: int = 0
    seq: int = 0
    seq_epoch: int = 0
    control: str = ""
    successor: str | None = None
    handoff: bool = False  # released after failing steps (history says via=handoff)
    history: tuple[Takeover, ...] = ()
    proof: str = ""

    def term(self) -> str:
        """What a renewal leaves as it was: the holder, its term, and what it was asked.

        A watch of terms alone wakes on a change of this, not on every renewal.
        """
        parts = [self.holder, self.session, self.epoch, self.control, self.successor, self.handoff]
        return json.dumps(parts, separators=(",", ":"))

    def to_json(self) -> bytes:
        doc = asdict(self)
        doc["history"] = [t.to_doc() for t in self.history]
        return json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes) -> LeaseRecord:
        doc = _load(data, "lease")
        if "holder" not in doc:  # null means released; absent means damaged
            raise CorruptRecord("lease record has no field 'holder'")
        holder = doc["holder"]
        if holder is not None and not isinstance(holder, str):
            raise CorruptRecord("lease record field 'holder' has the wrong type")
        ttl_ms = _count(doc, "ttl_ms", "lease", MAX_LEASE_TTL_MS)
        if ttl_ms == 0:
            raise CorruptRecord("lease record field 'ttl_ms' is 0")
        # Absent in records written before these were kept: none.
        control = _field({"control": "", **doc}, "control", str, "lease")
        if len(control) > MAX_CONTROL_CHARS:
            raise CorruptRecord(f"lease record field 'control' is over {MAX_CONTROL_CHARS} chars")
        proof = _field({"proof": "", **doc}, "proof", str, "lease")
        if len(proof) > MAX_PROOF_CHARS:
            raise CorruptRecord(f"lease record field 'proof' is over {MAX_PROOF_CHARS} chars")
        successor = doc.get("successor")
        if successor is not None:
            successor = check_record_name(_field(doc, "successor", str, "lease"))
        history = doc.get("history", [])
        if not isinstance(history, list) or len(history) > MAX_HISTORY:
            raise CorruptRecord(f"lease record field 'history' is not a list of at most "
                                f"{MAX_HISTORY}")  # fmt: skip
        return cls(
            holder=holder,
            region=_field(doc, "region", str, "lease"),
            session=_field(doc, "session", str, "lease"),
            epoch=_count(doc, "epoch", "lease", MAX_EPOCH),
            ttl_ms=ttl_ms,
            renewals=_count(doc, "renewals", "lease"),
            version=_count(doc, "version", "lease"),
            seq=_count(doc, "seq", "lease", MAX_SEQ) if "seq" in doc else 0,
            seq_epoch=_count(doc, "seq_epoch", "lease", MAX_EPOCH) if "seq_epoch" in doc else 0,
            control=control,
            successor=successor,
            handoff=_field({"handoff": False, **doc}, "handoff", bool, "lease"),
            history=tuple(Takeover.from_doc(entry) for entry in history),
            proof=proof,
        )


@dataclass(frozen=True)
class CheckpointInfo:
    """Where a checkpoint sits, without its sealed bytes."""

    epoch: int
    seq: int
    size: int
    written: float  # wall-clock time from the writer's store call; display only

    def to_json(self) -> bytes:
        """The description a backend stores under the checkpoint's seq, beside its bytes."""
        return _dump(self)

    @classmethod
    def from_json(cls, data: bytes, seq: int) -> CheckpointInfo:
        """The description stored under seq (read from its key or field name).

        Descriptions written before the seq was kept in them have none; one that
        names another seq is a copy under the wrong name.
        """
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

    def to_json(self) -> bytes:
        return _dump(self)

    @classmethod
    def from_json(cls, data: bytes) -> Heartbeat:
        doc = _load(data, "heartbeat")
        leader = doc.get("leader")
        if leader is not None and not isinstance(leader, str):
            raise CorruptRecord("heartbeat record field 'leader' has the wrong type")
        return cls(
            node=_field(doc, "node", str, "heartbeat"),
            region=_field(doc, "region", str, "heartbeat"),
            host=_field(doc, "host", str, "heartbeat"),
            pid=_count(doc, "pid", "heartbeat"),
            role=_field(doc, "role", str, "heartbeat"),
            epoch=_count(doc, "epoch", "heartbeat", MAX_EPOCH),
            seq=_count(doc, "seq", "heartbeat", MAX_SEQ),
            leader=leader,
            time=float(_field(doc, "time", (int, float), "heartbeat")),
            beats=_count(doc, "beats", "heartbeat"),
            effects=_effects_shown(doc.get("effects", [])),
            inbox_depth=_count({"inbox_depth": 0, **doc}, "inbox_depth", "heartbeat"),
            inbox_oldest=_optional_time(doc.get("inbox_oldest"), "inbox_oldest", "heartbeat"),
            failing=_count({"failing": 0, **doc}, "failing", "heartbeat"),
            failing_error=_failing_error(doc.get("failing_error", "")),
            session=_field({"session": "", **doc}, "session", str, "heartbeat")[:64],
            paused=_field({"paused": False, **doc}, "paused", bool, "heartbeat"),
            keys=_key_ids(doc.get("keys", [])),
            sealing=_field({"sealing": "", **doc}, "sealing", str, "heartbeat")[:16],
            lease_session=_lease_session(doc.get("lease_session", "")),
            host_leads=_count({"host_leads": 0, **doc}, "host_leads", "heartbeat", MAX_HOSTED),
            host_agents=_count({"host_agents": 0, **doc}, "host_agents", "heartbeat", MAX_HOSTED),
        )


def _lease_session(value: Any) -> str:
    if not isinstance(value, str) or not _SESSION.fullmatch(value):
        raise CorruptRecord("heartbeat record field 'lease_session' is not a session")
    return value


def _key_ids(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or len(value) > 2 * MAX_CLUSTER_KEYS:
        raise CorruptRecord("heartbeat record field 'keys' is not a short list")
    if not all(isinstance(kid, str) and _KEY_ID.fullmatch(kid) for kid in value):
        raise CorruptRecord("heartbeat record field 'keys' has an entry that is not a key id")
    return tuple(value)


def _optional_time(value: Any, name: str, what: str) -> float | None:
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
        return _dump(self)

    @classmethod
    def from_json(cls, data: bytes) -> Event:
        doc = _load(data, "event")
        detail = doc.get("detail", {})
        if not isinstance(detail, dict):
            raise CorruptRecord("event record field 'detail' has the wrong type")
        return cls(
            node=_field(doc, "node", str, "event"),
            n=_count(doc, "n", "event"),
            type=_field(doc, "type", str, "event"),
            time=float(_field(doc, "time", (int, float), "event")),
            epoch=_count(doc, "epoch", "event", MAX_EPOCH),
            seq=_count(doc, "seq", "event", MAX_SEQ),
            detail=detail,
        )
