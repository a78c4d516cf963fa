"""The lease record and the takeovers it remembers."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

from ..core.errors import CorruptRecord
from ..core.limits import (
    MAX_EPOCH,
    MAX_LEASE_TTL_MS,
    MAX_SEQ,
)
from .parsing import NAME_PATTERN, check_record_name, count_of, field_of, finite_time, load_object

# The lease record keeps this many of the newest takeovers (``hb history``).
MAX_HISTORY = 32
# A signed operator request (hamsterbunker.lease.control) in a lease record: at most this long.
MAX_CONTROL_CHARS = 2048
# A lease record's proof (hamsterbunker.lease.proof): a key id and an HMAC, well below this.
MAX_PROOF_CHARS = 256
# A wall-clock time in seconds since 1970 beyond this (the year 5138) is no time at all.
MAX_WALL_TIME = 1e11
_VIAS = frozenset({"empty", "released", "expired", "switchover", "handoff"})


@dataclass(frozen=True)
class Takeover:
    """One acquisition of the lease, as its taker wrote it (display only, not authenticated)."""

    epoch: int
    to: str
    via: str  # empty | released | expired | switchover | handoff
    gap_ms: int  # the takeover gap as its taker judged it (hamsterbunker.lease.gap)
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
        via = field_of(doc, "via", str, "lease history")
        if via not in _VIAS or (previous is not None and not NAME_PATTERN.fullmatch(str(previous))):
            raise CorruptRecord("lease record field 'history' has an entry of the wrong shape")
        return cls(
            epoch=count_of(doc, "epoch", "lease history", MAX_EPOCH),
            to=check_record_name(field_of(doc, "to", str, "lease history")),
            via=via,
            gap_ms=count_of(doc, "gap_ms", "lease history"),
            time=finite_time(field_of(doc, "time", (int, float), "lease history")),
            from_=previous,
        )


@dataclass(frozen=True)
class LeaseRecord:
    """Who may step the agent, under which epoch (the fencing token).

    ``version``: the store's, compared by compare-and-set; ``holder``: None once released;
    ``renewals``: changes with every renewal; ``seq``, ``seq_epoch``: the newest checkpoint
    seq, and latest epoch, its writer knew accepted; ``control``: an operator's signed request
    (``lease.control``); ``successor``: the node a released lease was handed to; ``history``:
    the newest takeovers, oldest first; ``proof``: its writer's signature (``lease.proof``);
    ``written``: the wall clock of the node that last renewed, released or took it (display
    only: the takeover gap of a node that never saw that write, ``lease.gap``; 0 in records
    written before it was kept).
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
    written: float = 0.0

    def term(self) -> str:
        """What a renewal leaves as it was: the holder, its term, and what it was asked.

        A watch of terms alone wakes on a change of this, not on every renewal.
        """
        parts = [self.holder, self.session, self.epoch, self.control, self.successor, self.handoff]
        return json.dumps(parts, separators=(",", ":"))

    def change_key(self) -> tuple[object, ...]:
        """What every write of the record changes: its holder is live while this changes."""
        return (self.version, self.holder, self.session, self.epoch, self.renewals)

    def to_json(self) -> bytes:
        doc = asdict(self)
        doc["history"] = [t.to_doc() for t in self.history]
        if not self.written:
            del doc["written"]  # unknown: as a record from before it was kept, byte for byte
        return json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes) -> LeaseRecord:
        doc = load_object(data, "lease")
        if "holder" not in doc:  # null means released; absent means damaged
            raise CorruptRecord("lease record has no field 'holder'")
        holder = doc["holder"]
        if holder is not None and not isinstance(holder, str):
            raise CorruptRecord("lease record field 'holder' has the wrong type")
        ttl_ms = count_of(doc, "ttl_ms", "lease", MAX_LEASE_TTL_MS)
        if ttl_ms == 0:
            raise CorruptRecord("lease record field 'ttl_ms' is 0")
        # Absent in records written before these were kept: none.
        control = field_of({"control": "", **doc}, "control", str, "lease")
        if len(control) > MAX_CONTROL_CHARS:
            raise CorruptRecord(f"lease record field 'control' is over {MAX_CONTROL_CHARS} chars")
        proof = field_of({"proof": "", **doc}, "proof", str, "lease")
        if len(proof) > MAX_PROOF_CHARS:
            raise CorruptRecord(f"lease record field 'proof' is over {MAX_PROOF_CHARS} chars")
        successor = doc.get("successor")
        if successor is not None:
            successor = check_record_name(field_of(doc, "successor", str, "lease"))
        written: float = field_of({"written": 0.0, **doc}, "written", (int, float), "lease")
        if not 0 <= written <= MAX_WALL_TIME:
            raise CorruptRecord(f"lease record field 'written' is outside 0..{MAX_WALL_TIME}")
        history = doc.get("history", [])
        if not isinstance(history, list) or len(history) > MAX_HISTORY:
            raise CorruptRecord(f"lease record field 'history' is not a list of at most "
                                f"{MAX_HISTORY}")  # fmt: skip
        return cls(
            holder=holder,
            region=field_of(doc, "region", str, "lease"),
            session=field_of(doc, "session", str, "lease"),
            epoch=count_of(doc, "epoch", "lease", MAX_EPOCH),
            ttl_ms=ttl_ms,
            renewals=count_of(doc, "renewals", "lease"),
            version=count_of(doc, "version", "lease"),
            seq=count_of(doc, "seq", "lease", MAX_SEQ) if "seq" in doc else 0,
            seq_epoch=count_of(doc, "seq_epoch", "lease", MAX_EPOCH) if "seq_epoch" in doc else 0,
            control=control,
            successor=successor,
            handoff=field_of({"handoff": False, **doc}, "handoff", bool, "lease"),
            history=tuple(Takeover.from_doc(entry) for entry in history),
            proof=proof,
            written=float(written),
        )
