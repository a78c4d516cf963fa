"""Which of a node's secrets are which of the cluster's keys, and whether the record's key
list is authentic (``docs/design.md``, "Leases, effects and sealing in the code").
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import threading
from dataclasses import dataclass, replace

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.hazmat.primitives.kdf.scrypt import Scrypt

from ..core.errors import SealError, Tampered, WrongSecret
from ..records import ClusterRecord, KeyEntry
from .keyring import Keyring

__all__ = ["ClusterKeys", "HeldKey", "legacy_key_id", "master_key", "subkey"]

FORMAT_VERSION = 1
# scrypt cost: 32 MiB and about 0.1 s once per secret at node start.
SCRYPT_N, SCRYPT_R, SCRYPT_P = 2**15, 8, 1
# The parameters come from the unauthenticated cluster record: bounded, so that a
# hostile record can neither hang a node at start (up to 8 times the default
# work, 256 MiB) nor weaken the key below the default.
SCRYPT_MAX_MEMORY = 256 * 2**20  # 128 * n * r bytes
SCRYPT_MAX_WORK = 8 * SCRYPT_N * SCRYPT_R * SCRYPT_P  # n * r * p


def check_scrypt_parameters(n: int, r: int, p: int) -> None:
    """Raise SealError unless n, r, p are within the bounds a node accepts."""
    problem = None
    if n < SCRYPT_N or n & (n - 1):
        problem = f"n={n} is not a power of two of at least {SCRYPT_N}"
    elif not (r >= 1 and p >= 1):
        problem = f"r={r} and p={p} must be at least 1"
    elif 128 * n * r > SCRYPT_MAX_MEMORY:
        problem = f"n={n}, r={r} would take {128 * n * r} bytes, above {SCRYPT_MAX_MEMORY}"
    elif n * r * p > SCRYPT_MAX_WORK:
        problem = f"n*r*p={n * r * p} is above {SCRYPT_MAX_WORK} (8 times the default)"
    if problem is not None:
        raise SealError(f"cluster record has key parameters outside the bounds: {problem}")


def subkey(master: bytes, purpose: bytes, length: int) -> bytes:
    return HKDF(hashes.SHA256(), length, salt=None, info=b"hamsterbunker/v1/" + purpose).derive(
        master
    )


def master_key(secret: str, salt: bytes, n: int, r: int, p: int) -> bytes:
    """The secret's key for a cluster's salt: derived once per process, as a process that
    keeps many agents opens their one cluster record once per agent (each derivation
    costs 32 MiB and some 0.1 s)."""
    given = (hashlib.sha256(secret.encode("utf-8")).digest(), salt, n, r, p)
    with _DERIVING:  # one at a time: the others then find it derived
        derived = _DERIVED.get(given)
        if derived is None:
            derived = Scrypt(salt=salt, length=32, n=n, r=r, p=p).derive(secret.encode("utf-8"))
            if len(_DERIVED) >= _DERIVED_KEPT:
                del _DERIVED[next(iter(_DERIVED))]  # the oldest
            _DERIVED[given] = derived
        return derived


# The keys master_key derived lately, by (the secret's SHA-256, salt, n, r, p).
_DERIVED: dict[tuple[bytes, bytes, int, int, int], bytes] = {}
_DERIVED_KEPT = 16
_DERIVING = threading.Lock()


def legacy_key_id(salt: bytes) -> str:
    """The id of a cluster's first key (from its salt, as every record before rotation)."""
    return hashlib.sha256(salt).hexdigest()[:16]


def key_check(master: bytes) -> str:
    return base64.b64encode(subkey(master, b"key-check", 16)).decode()


def record_tag(master: bytes, record: ClusterRecord) -> str:
    """The HMAC of a record's key list (its whole body) under one key."""
    key = subkey(master, b"cluster-record", 32)
    return hmac.new(key, record.signed_body(), "sha256").hexdigest()


@dataclass(frozen=True)
class HeldKey:
    """One secret of the keyring, derived with the cluster's salt."""

    position: int  # in the keyring: 0 is the newest
    master: bytes
    check: str
    fresh_id: str  # its key id when it is not the cluster's first key


class ClusterKeys:
    """A keyring's secrets as keys of one cluster (its salt and parameters): derived once."""

    def __init__(self, keyring: Keyring, record: ClusterRecord) -> None:
        if record.format != FORMAT_VERSION or record.kdf != "scrypt":
            raise SealError(
                f"cluster record uses format {record.format} / {record.kdf!r}, "
                f"which this version does not know"
            )
        try:
            salt = base64.b64decode(record.salt, validate=True)
        except ValueError as exc:
            raise SealError(f"cluster record is damaged: {exc}") from exc
        check_scrypt_parameters(record.n, record.r, record.p)
        self.salt, self.params = salt, (record.salt, record.n, record.r, record.p)
        held = []
        for position, secret in enumerate(keyring):
            try:
                master = master_key(secret, salt, record.n, record.r, record.p)
            except (ValueError, MemoryError) as exc:
                raise SealError(f"cluster record has unusable key parameters: {exc}") from exc
            fresh = subkey(master, b"key-id", 8).hex()
            held.append(HeldKey(position, master, key_check(master), fresh))
        self.held = tuple(held)

    def find(self, entry: KeyEntry) -> HeldKey | None:
        """The held secret that is entry's key, if any."""
        for key in self.held:
            if hmac.compare_digest(key.check.encode(), entry.check.encode()):
                return key
        return None

    def key_id(self, key: HeldKey, record: ClusterRecord) -> str:
        """The id the record gives key (listed or retired), else its fresh id."""
        for entry in (*record.listed, *record.retired):
            if self.find(entry) is key:
                return entry.kid
        return key.fresh_id

    def held_ids(self, record: ClusterRecord) -> tuple[str, ...]:
        """The ids of every secret held, newest first (what a node's heartbeat shows)."""
        return tuple(self.key_id(key, record) for key in self.held)

    def open(self, record: ClusterRecord) -> dict[str, bytes]:
        """The master key of every key record lists, by key id, once record is shown to be
        authentic and this keyring holds them all; WrongSecret or Tampered otherwise."""
        if self.params != (record.salt, record.n, record.r, record.p):
            raise Tampered("the cluster record's salt or key parameters changed")
        if record.generation == 0:
            if record.key_id != legacy_key_id(self.salt):
                raise SealError("cluster record is damaged: its key id does not match its salt")
            if record.accepted or record.retired or record.rotation or record.macs:
                raise Tampered("cluster record of generation 0 names a rotation")
        masters: dict[str, bytes] = {}
        for entry in record.listed:
            key = self.find(entry)
            if key is None:
                raise WrongSecret(self._lacking(record, entry))
            masters[entry.kid] = key.master
        if len(masters) != len(record.listed):
            raise Tampered("cluster record lists a key twice")
        if record.generation > 0:
            tags = dict(record.macs)
            for kid, master in masters.items():
                tag = tags.get(kid, "")
                if set(tags) != set(masters) or not hmac.compare_digest(
                    tag.encode(), record_tag(master, record).encode()
                ):
                    raise Tampered(
                        f"the cluster record's key list (generation {record.generation}) failed "
                        "to authenticate: it was edited, or written without the secrets"
                    )
        return masters

    def sign(self, record: ClusterRecord) -> ClusterRecord:
        """record with the tag of every key it lists (each must be held)."""
        tags = []
        for entry in record.listed:
            key = self.find(entry)
            if key is None:
                raise WrongSecret(f"this keyring does not hold key id {entry.kid}")
            tags.append((entry.kid, record_tag(key.master, replace(record, macs=()))))
        return replace(record, macs=tuple(sorted(tags)))

    def _lacking(self, record: ClusterRecord, entry: KeyEntry) -> str:
        """What a node or a command that lacks entry's key is told it lacks (one wording for
        both: hb submit, hb pause... are no node)."""
        held = ", ".join(self.held_ids(record))
        current = record.key_id
        if entry.kid != current:
            return (
                f"a secret rotation is under way (generation {record.generation}): the secrets "
                f"given here lack the previous one (key id {entry.kid}), which opens what is not "
                "yet re-sealed; give both secrets (the new one as HB_SECRET or the first line of "
                "the secret file, the previous one as HB_SECRET_PREVIOUS or the next line) until "
                "`hb rotate-secret finish`"
            )
        if any(self.find(other) for other in record.accepted):
            return (
                f"a secret rotation is under way (generation {record.generation}): the cluster "
                f"seals with key id {current} now, and the secrets given here hold only key id "
                f"{held}; give the new secret as well (HB_SECRET or the first line of the secret "
                "file, the old one as HB_SECRET_PREVIOUS or the next line), then start the node "
                "or run the command again"
            )
        retired = [entry.kid for entry in record.retired if self.find(entry)]
        if retired:
            return (
                f"the cluster's secret was rotated (hb rotate-secret finish, generation "
                f"{record.generation}): key id {retired[0]}, the secret given here, was "
                f"retired; the cluster's key is {current}: give the new secret "
                "(HB_SECRET, or the first line of the secret file)"
            )
        return (
            f"the secret does not match this cluster (key id {current}): check that every node "
            f"has the same secret (the secret given here is key id {held}; a node given a new secret "
            "before `hb rotate-secret begin` needs the current one too, as HB_SECRET_PREVIOUS "
            "or the next line of the secret file)"
        )
