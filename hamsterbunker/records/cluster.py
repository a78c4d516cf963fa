"""The cluster record: the key material every node derives its keys from."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from ..core.errors import CorruptRecord
from .parsing import count_of, field_of, load_object

# Keys a cluster record names besides its current one (accepted while a rotation
# is under way, retired ones kept to name them to a node that still holds one).
MAX_CLUSTER_KEYS = 4
KEY_ID_PATTERN = re.compile(r"[0-9a-f]{16}")
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
        if not (isinstance(kid, str) and KEY_ID_PATTERN.fullmatch(kid)):
            raise CorruptRecord(f"cluster record field {what!r} has an entry with a bad key id")
        if not (isinstance(check, str) and len(check) <= 64):
            raise CorruptRecord(f"cluster record field {what!r} has an entry with a bad check")
        return cls(kid, check)


@dataclass(frozen=True)
class ClusterRecord:
    """Key material every node needs to derive the sealing key: never the key itself.

    ``key_id`` and ``key_check`` name the current key, the one that seals. Every change of
    keys (``hb rotate-secret``) raises ``generation``, lists the keys still ``accepted`` and
    the ``retired`` ones, says how far a rotation has come (``rotation``) and carries
    ``macs``, an HMAC of the rest under every listed key.
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
        doc = load_object(data, "cluster")
        generation = count_of({"generation": 0, **doc}, "generation", "cluster")
        rotation = field_of({"rotation": "", **doc}, "rotation", str, "cluster")
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
            format=field_of(doc, "format", int, "cluster"),
            kdf=field_of(doc, "kdf", str, "cluster"),
            n=count_of(doc, "n", "cluster"),
            r=count_of(doc, "r", "cluster"),
            p=count_of(doc, "p", "cluster"),
            salt=field_of(doc, "salt", str, "cluster"),
            key_id=field_of(doc, "key_id", str, "cluster"),
            key_check=field_of(doc, "key_check", str, "cluster"),
            created=float(field_of(doc, "created", (int, float), "cluster")),
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
