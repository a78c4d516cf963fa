"""AES-256-GCM sealing of agent state (DESIGN.md invariant 5).

A sealed checkpoint is::

    b"HBCP" | version (1 byte) | header length (2 bytes, big-endian) | header JSON
    | nonce (12 bytes) | ciphertext with its 16-byte GCM tag

The header names the key id, agent id, epoch and sequence number; the whole
prefix up to the nonce is the GCM associated data, so an edited header fails to
authenticate. The opener passes the agent, epoch and sequence under which it
found the blob, so a checkpoint moved to another agent or replayed under
another number is rejected even though it authenticates on its own.

The key is derived from the network secret with scrypt and a random salt kept
in the cluster record; HKDF gives one subkey per purpose. The key-check value
in the cluster record tells a wrong secret apart from a tampered checkpoint.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import struct
import time
from dataclasses import dataclass
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.hazmat.primitives.kdf.scrypt import Scrypt

from .errors import CorruptRecord, SealError, SecretTooShort, Tampered, WrongSecret
from .limits import MAX_EPOCH, MAX_SEQ
from .records import ClusterRecord, parse_json

__all__ = [
    "MIN_SECRET_LENGTH",
    "EffectAt",
    "OpenedEffect",
    "OpenedSubmission",
    "SealedHeader",
    "Sealer",
    "check_scrypt_parameters",
    "check_secret",
    "new_cluster_record",
]

MIN_SECRET_LENGTH = 8
FORMAT_VERSION = 1
_MAGIC = b"HBCP"
_EFFECT_MAGIC = b"HBEF"
_SUBMISSION_MAGIC = b"HBSB"
_REPLY_MAGIC = b"HBRP"
_PREFIX = struct.Struct(">4sBH")  # magic, version, header length
_NONCE_BYTES = 12
_TAG_BYTES = 16
# scrypt cost: 32 MiB and about 0.1 s once per node start. Kept in the cluster
# record so that a later release can raise it without breaking old clusters.
_SCRYPT_N, _SCRYPT_R, _SCRYPT_P = 2**15, 8, 1
# The parameters come from the unauthenticated cluster record: bounded, so that a
# hostile record can neither hang a node at start (up to 8 times the default
# work, 256 MiB) nor weaken the key below the default.
SCRYPT_MAX_MEMORY = 256 * 2**20  # 128 * n * r bytes
SCRYPT_MAX_WORK = 8 * _SCRYPT_N * _SCRYPT_R * _SCRYPT_P  # n * r * p


def check_scrypt_parameters(n: int, r: int, p: int) -> None:
    """Raise SealError unless n, r, p are within the bounds a node accepts."""
    problem = None
    if n < _SCRYPT_N or n & (n - 1):
        problem = f"n={n} is not a power of two of at least {_SCRYPT_N}"
    elif not (r >= 1 and p >= 1):
        problem = f"r={r} and p={p} must be at least 1"
    elif 128 * n * r > SCRYPT_MAX_MEMORY:
        problem = f"n={n}, r={r} would take {128 * n * r} bytes, above {SCRYPT_MAX_MEMORY}"
    elif n * r * p > SCRYPT_MAX_WORK:
        problem = f"n*r*p={n * r * p} is above {SCRYPT_MAX_WORK} (8 times the default)"
    if problem is not None:
        raise SealError(f"cluster record has key parameters outside the bounds: {problem}")


def check_secret(secret: str) -> str:
    """Refuse a secret that is too short before anything else happens."""
    if not isinstance(secret, str) or len(secret) < MIN_SECRET_LENGTH:
        got = len(secret) if isinstance(secret, str) else 0
        raise SecretTooShort(
            f"the network secret must be at least {MIN_SECRET_LENGTH} characters (it has {got})"
        )
    return secret


def _subkey(master: bytes, purpose: bytes, length: int) -> bytes:
    return HKDF(hashes.SHA256(), length, salt=None, info=b"hamsterbunker/v1/" + purpose).derive(
        master
    )


def _master_key(secret: str, salt: bytes, n: int, r: int, p: int) -> bytes:
    return Scrypt(salt=salt, length=32, n=n, r=r, p=p).derive(secret.encode("utf-8"))


def _key_id(salt: bytes) -> str:
    return hashlib.sha256(salt).hexdigest()[:16]


def new_cluster_record(secret: str) -> ClusterRecord:
    """Make the key material for a new cluster (a fresh random salt)."""
    check_secret(secret)
    salt = os.urandom(16)
    master = _master_key(secret, salt, _SCRYPT_N, _SCRYPT_R, _SCRYPT_P)
    return ClusterRecord(
        format=FORMAT_VERSION,
        kdf="scrypt",
        n=_SCRYPT_N,
        r=_SCRYPT_R,
        p=_SCRYPT_P,
        salt=base64.b64encode(salt).decode(),
        key_id=_key_id(salt),
        key_check=base64.b64encode(_subkey(master, b"key-check", 16)).decode(),
        created=time.time(),
    )


@dataclass(frozen=True)
class SealedHeader:
    """What a sealed checkpoint says about itself (authenticated, not secret)."""

    key_id: str
    agent: str
    epoch: int
    seq: int
    time: float


class Sealer:
    """Seals and opens checkpoints with the key of one cluster."""

    def __init__(self, secret: str, cluster: ClusterRecord) -> None:
        check_secret(secret)
        if cluster.format != FORMAT_VERSION or cluster.kdf != "scrypt":
            raise SealError(
                f"cluster record uses format {cluster.format} / {cluster.kdf!r}, "
                f"which this version does not know"
            )
        try:
            salt = base64.b64decode(cluster.salt, validate=True)
            expected_check = base64.b64decode(cluster.key_check, validate=True)
        except ValueError as exc:
            raise SealError(f"cluster record is damaged: {exc}") from exc
        if cluster.key_id != _key_id(salt):
            raise SealError("cluster record is damaged: its key id does not match its salt")
        check_scrypt_parameters(cluster.n, cluster.r, cluster.p)
        try:
            master = _master_key(secret, salt, cluster.n, cluster.r, cluster.p)
        except (ValueError, MemoryError) as exc:
            raise SealError(f"cluster record has unusable key parameters: {exc}") from exc
        if not hmac.compare_digest(_subkey(master, b"key-check", 16), expected_check):
            raise WrongSecret(
                f"the secret does not match this cluster (key id {cluster.key_id}): "
                "check that every node has the same secret"
            )
        self.cluster = cluster
        self.key_id = cluster.key_id
        self._aead = AESGCM(_subkey(master, b"checkpoint", 32))
        self._effect_aead = AESGCM(_subkey(master, b"effect", 32))
        self._inbox_aead = AESGCM(_subkey(master, b"inbox", 32))
        self._record_key = _subkey(master, b"record", 32)

    def sign_record(self, kind: str, payload: bytes) -> bytes:
        """payload with an HMAC-SHA256 tag bound to kind, for records that need no secrecy."""
        tag = hmac.new(self._record_key, kind.encode() + b"\0" + payload, "sha256").hexdigest()
        return payload + b"\n" + tag.encode()

    def open_record(self, kind: str, signed: bytes) -> bytes:
        """The payload of a record sign_record made for kind; Tampered if it is not one."""
        payload, _, tag = signed.rpartition(b"\n")
        expected = hmac.new(self._record_key, kind.encode() + b"\0" + payload, "sha256")
        if not hmac.compare_digest(expected.hexdigest().encode(), tag):
            raise Tampered(f"{kind} record failed to authenticate (edited, or written without "
                           "the secret)")  # fmt: skip
        return payload

    def seal(
        self,
        agent: str,
        epoch: int,
        seq: int,
        state: dict[str, Any],
        *,
        inbox: dict[str, Any] | None = None,
    ) -> bytes:
        """Seal a JSON-serialisable state under a fresh random nonce.

        inbox: which of the agent's submissions are consumed as of this state
        (``hamsterbunker.inbox.ConsumedMarks``), sealed with it, so that they
        commit together; the header says a checkpoint carries it.
        """
        body: dict[str, Any] = state if inbox is None else {"state": state, "inbox": inbox}
        try:
            plaintext = json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()
        except (TypeError, ValueError) as exc:
            raise SealError(f"agent state is not JSON-serialisable: {exc}") from exc
        fields = {"kid": self.key_id, "agent": agent, "epoch": epoch, "seq": seq}
        header = json.dumps(
            {**fields, "time": time.time(), **({"inbox": 1} if inbox is not None else {})},
            separators=(",", ":"),
        ).encode()
        prefix = _PREFIX.pack(_MAGIC, FORMAT_VERSION, len(header)) + header
        nonce = os.urandom(_NONCE_BYTES)
        return prefix + nonce + self._aead.encrypt(nonce, plaintext, prefix)

    def open(self, blob: bytes, agent: str, epoch: int, seq: int) -> dict[str, Any]:
        """Open a checkpoint found under (agent, epoch, seq); raise Tampered if it is not that."""
        return self.open_checkpoint(blob, agent, epoch, seq)[0]

    def open_checkpoint(
        self, blob: bytes, agent: str, epoch: int, seq: int
    ) -> tuple[dict[str, Any], dict[str, Any] | None]:
        """open(), and the inbox marks sealed with the state (None if it carries none)."""
        header = read_header(blob)
        if header.key_id != self.key_id:
            raise Tampered(
                f"checkpoint names key id {header.key_id}, the cluster's is {self.key_id}"
            )
        prefix_len = _PREFIX.size + struct.unpack_from(">H", blob, 5)[0]
        prefix, nonce = blob[:prefix_len], blob[prefix_len : prefix_len + _NONCE_BYTES]
        try:
            plaintext = self._aead.decrypt(nonce, blob[prefix_len + _NONCE_BYTES :], prefix)
        except InvalidTag as exc:
            raise Tampered("checkpoint failed to authenticate (edited or truncated)") from exc
        if header.agent != agent:
            raise Tampered(f"checkpoint belongs to agent {header.agent!r}, not {agent!r}")
        if (header.epoch, header.seq) != (epoch, seq):
            raise Tampered(
                f"checkpoint was sealed as epoch {header.epoch} seq {header.seq} but is stored "
                f"as epoch {epoch} seq {seq} (replayed)"
            )
        try:
            state = json.loads(plaintext.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise Tampered(f"checkpoint plaintext is not JSON: {exc}") from exc
        inbox: dict[str, Any] | None = None
        if _carries_inbox(blob[_PREFIX.size : prefix_len]):
            wrapped = state
            if not isinstance(wrapped, dict) or not isinstance(wrapped.get("inbox"), dict):
                raise Tampered("checkpoint says it carries inbox marks but has none")
            state, inbox = wrapped.get("state"), wrapped["inbox"]
        if not isinstance(state, dict):
            raise Tampered("checkpoint state is not a JSON object")
        return state, inbox

    def seal_submission(
        self, agent: str, number: int, request_id: str, payload: Any, submitted: float
    ) -> bytes:
        """Seal a submission's payload as number `number` of agent's inbox.

        The header (associated data) names the agent, the number and the
        request id, so a sealed submission moved to another number or agent
        fails to open as that one: an old one planted again under a new number
        is never taken for a new submission.
        """
        header = {"agent": agent, "number": number, "rid": request_id}
        body = {"payload": payload, "submitted": submitted}
        return self._seal_inbox(_SUBMISSION_MAGIC, header, body, "submission payload")

    def open_submission(self, blob: bytes, agent: str, number: int) -> OpenedSubmission:
        """The submission found as number of agent; Tampered if it is not that one."""
        header, body = self._open_inbox(_SUBMISSION_MAGIC, blob, "submission")
        if (header.get("agent"), header.get("number")) != (agent, number):
            raise Tampered(
                f"submission sealed for agent {header.get('agent')!r} as number "
                f"{header.get('number')!r} was found as number {number} of {agent!r}"
            )
        if not isinstance(body, dict) or not isinstance(body.get("submitted"), (int, float)):
            raise Tampered("submission is damaged: no payload or time")
        return OpenedSubmission(
            number, str(header.get("rid")), body.get("payload"), float(body["submitted"])
        )

    def seal_reply(self, agent: str, number: int, request_id: str, reply: Any) -> bytes:
        """Seal the reply to submission number (request_id) of agent."""
        header = {"agent": agent, "number": number, "rid": request_id}
        return self._seal_inbox(_REPLY_MAGIC, header, {"reply": reply}, "reply")

    def open_reply(self, blob: bytes, agent: str, request_id: str) -> Any:
        """The reply found for request_id of agent; Tampered if it is not that one's."""
        header, body = self._open_inbox(_REPLY_MAGIC, blob, "reply")
        if (header.get("agent"), header.get("rid")) != (agent, request_id):
            raise Tampered(
                f"reply sealed for request {header.get('rid')!r} of {header.get('agent')!r} was "
                f"found as the reply to {request_id!r} of {agent!r}"
            )
        if not isinstance(body, dict) or "reply" not in body:
            raise Tampered("reply is damaged: no reply in it")
        return body["reply"]

    def _seal_inbox(self, magic: bytes, header: dict[str, Any], body: Any, what: str) -> bytes:
        try:
            plaintext = json.dumps(body, separators=(",", ":"), allow_nan=False).encode()
        except (TypeError, ValueError) as exc:
            raise SealError(f"the {what} is not JSON-serialisable: {exc}") from exc
        prefix_header = json.dumps({"kid": self.key_id, **header}, separators=(",", ":")).encode()
        prefix = _PREFIX.pack(magic, FORMAT_VERSION, len(prefix_header)) + prefix_header
        nonce = os.urandom(_NONCE_BYTES)
        return prefix + nonce + self._inbox_aead.encrypt(nonce, plaintext, prefix)

    def _open_inbox(self, magic: bytes, blob: bytes, what: str) -> tuple[dict[str, Any], Any]:
        """The authenticated header and body of an inbox record; Tampered for anything else."""
        found, version, header_len = _PREFIX.unpack_from(blob.ljust(_PREFIX.size, b"\0"))
        if found != magic or version != FORMAT_VERSION:
            raise Tampered(f"not a HamsterBunker {what} of a known version")
        prefix_len = _PREFIX.size + header_len
        if len(blob) < prefix_len + _NONCE_BYTES + _TAG_BYTES:
            raise Tampered(f"{what} is truncated")
        prefix, nonce = blob[:prefix_len], blob[prefix_len : prefix_len + _NONCE_BYTES]
        try:
            plaintext = self._inbox_aead.decrypt(nonce, blob[prefix_len + _NONCE_BYTES :], prefix)
        except InvalidTag as exc:
            raise Tampered(f"{what} failed to authenticate (edited, or sealed without the "
                           "secret)") from exc  # fmt: skip
        # Authentic from here on: sealed by a holder of the secret.
        header = json.loads(prefix[_PREFIX.size :])
        if header.get("kid") != self.key_id:
            raise Tampered(f"{what} names key id {header.get('kid')}, not {self.key_id}")
        return header, json.loads(plaintext)

    def seal_effect(self, at: EffectAt, epoch: int, payload: dict[str, Any]) -> bytes:
        """Seal one effect-journal record (an intent or an outcome) written under epoch.

        The header, all associated data, names the agent, step, index, kind,
        effect name and epoch, so a record moved to another effect, step or
        agent fails to open as that one.
        """
        try:
            plaintext = json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode()
        except (TypeError, ValueError) as exc:
            raise SealError(f"effect record is not JSON-serialisable: {exc}") from exc
        header = json.dumps(
            {"kid": self.key_id, **at.header(), "epoch": epoch}, separators=(",", ":")
        ).encode()
        prefix = _PREFIX.pack(_EFFECT_MAGIC, FORMAT_VERSION, len(header)) + header
        nonce = os.urandom(_NONCE_BYTES)
        return prefix + nonce + self._effect_aead.encrypt(nonce, plaintext, prefix)

    def open_effect(self, blob: bytes, at: EffectAt) -> OpenedEffect:
        """The record found as `at` (its name aside); Tampered if it is not that record.

        The reader does not know the effect's name before it opens the record:
        the sealed name comes back to be compared by the caller (another name
        is a replay that called its effects in another order, not tampering).
        """
        magic, version, header_len = _PREFIX.unpack_from(blob.ljust(_PREFIX.size, b"\0"))
        if magic != _EFFECT_MAGIC or version != FORMAT_VERSION:
            raise Tampered("not a HamsterBunker effect record of a known version")
        prefix_len = _PREFIX.size + header_len
        if len(blob) < prefix_len + _NONCE_BYTES + _TAG_BYTES:
            raise Tampered("effect record is truncated")
        prefix, nonce = blob[:prefix_len], blob[prefix_len : prefix_len + _NONCE_BYTES]
        try:
            plaintext = self._effect_aead.decrypt(nonce, blob[prefix_len + _NONCE_BYTES :], prefix)
        except InvalidTag as exc:
            raise Tampered("effect record failed to authenticate (edited or truncated)") from exc
        # Authentic from here on: written by a node that holds the secret.
        header = json.loads(prefix[_PREFIX.size :])
        sealed_as = {field: header.get(field) for field in ("agent", "seq", "index", "kind")}
        found_as = {field: at.header()[field] for field in sealed_as}
        if header.get("kid") != self.key_id or sealed_as != found_as:
            raise Tampered(f"effect record sealed as {sealed_as} was found as {found_as}")
        return OpenedEffect(header["epoch"], header["name"], json.loads(plaintext))


def _carries_inbox(header: bytes) -> bool:
    """Whether an authenticated checkpoint header says the state carries inbox marks."""
    doc = json.loads(header)
    return isinstance(doc, dict) and doc.get("inbox") == 1


@dataclass(frozen=True)
class OpenedSubmission:
    """An authentic submission: its number, request id, payload and the submitter's time."""

    number: int
    request_id: str
    payload: Any
    submitted: float  # the submitter's wall clock: display only


@dataclass(frozen=True)
class OpenedEffect:
    """An authentic effect-journal record: the epoch it was written under, its name, payload."""

    epoch: int
    name: str
    payload: Any


@dataclass(frozen=True)
class EffectAt:
    """Where an effect-journal record belongs: agent, step, index, kind and the effect's name."""

    agent: str
    seq: int
    index: int
    kind: str
    name: str = ""

    def header(self) -> dict[str, Any]:
        return {
            "agent": self.agent,
            "seq": self.seq,
            "index": self.index,
            "kind": self.kind,
            "name": self.name,
        }


def read_header(blob: bytes) -> SealedHeader:
    """Parse the unauthenticated header; Sealer.open authenticates it."""
    if len(blob) < _PREFIX.size:
        raise Tampered("checkpoint is truncated (no header)")
    magic, version, header_len = _PREFIX.unpack_from(blob)
    if magic != _MAGIC:
        raise Tampered("not a HamsterBunker checkpoint (bad magic)")
    if version != FORMAT_VERSION:
        raise Tampered(f"checkpoint format version {version} is not known to this version")
    if len(blob) < _PREFIX.size + header_len + _NONCE_BYTES + _TAG_BYTES:
        raise Tampered("checkpoint is truncated")
    try:
        doc = parse_json(blob[_PREFIX.size : _PREFIX.size + header_len], "checkpoint header")
    except CorruptRecord as exc:
        raise Tampered(str(exc)) from exc
    if not isinstance(doc, dict):
        raise Tampered("checkpoint header is damaged: not a JSON object")
    kinds: dict[str, type | tuple[type, ...]] = {
        "kid": str,
        "agent": str,
        "epoch": int,
        "seq": int,
        "time": (int, float),
    }
    for name, kind in kinds.items():
        if isinstance(doc.get(name), bool) or not isinstance(doc.get(name), kind):
            raise Tampered(f"checkpoint header is damaged: field {name!r} is missing or mistyped")
    if not (0 <= doc["epoch"] <= MAX_EPOCH and 0 <= doc["seq"] <= MAX_SEQ):
        raise Tampered("checkpoint header is damaged: epoch or seq out of range")
    return SealedHeader(
        key_id=doc["kid"], agent=doc["agent"], epoch=doc["epoch"], seq=doc["seq"], time=doc["time"]
    )
