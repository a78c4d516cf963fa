"""AES-256-GCM sealing of agent state (DESIGN.md invariant 5).

A sealed checkpoint is::

    b"HBCP" | version (1 byte) | header length (2 bytes, big-endian) | header JSON
    | nonce (12 bytes) | ciphertext with its 16-byte GCM tag

The header names the key id, agent id, epoch and sequence number; the whole
prefix up to the nonce is the GCM associated data, so an edited header fails to
authenticate. The opener passes the agent, epoch and sequence under which it
found the blob, so a checkpoint moved to another agent or replayed under
another number is rejected even though it authenticates on its own.

On a store that keeps one chain of checkpoints per node (``Store.chains``,
``docs/syncdir.md``) the header also names the node whose chain it was
published into (``"node"``), and the opener passes the node of the chain it
read the blob from: a checkpoint copied into another node's chain does not
open there, though two nodes that led one epoch at once both hold a
checkpoint of that (agent, epoch, seq). The field is written only when a node
is given, so a checkpoint of any other store is byte for byte what it was
before, and the format version stays 1:

- an older version-1 reader checks a header's known fields and ignores
  others (``read_header``), and the whole header is associated data however
  it is parsed: it opens a node-bound checkpoint to the same state and inbox
  marks, and misses only the node check it does not know of. Only a chained
  store holds node-bound checkpoints, and no release has one (the ``syncdir``
  store is new, in the same unreleased line of work as this check), so no
  deployed reader mis-reads one or loses a check it relied on;
- bumping the version for every checkpoint would have made those of every
  store unreadable to older nodes of a rolling upgrade (and, shared through
  ``FORMAT_VERSION``, cluster, inbox and effect records too), for nothing on
  the stores they can open; bumping it for node-bound ones only would buy a
  refusal from readers that cannot open a chained store anyway.

This reader is strict both ways: a checkpoint that names a node is refused
where none is expected (copied out of a chain into a store without chains),
and one that names none is refused in a chain (sealed for another kind of
store, or before checkpoints were bound to their node).

A publish seals with ``seal_pieces``: the same format, encrypted a piece at a
time (one GCM stream: one nonce, one tag) while the store writes the pieces
(``hamsterbunker.blob``).

The key is derived from the network secret with scrypt and a random salt kept
in the cluster record; HKDF gives one subkey per purpose. The key-check value
in the cluster record tells a wrong secret apart from a tampered checkpoint.
"""

from __future__ import annotations

import base64
import hmac
import json
import logging
import os
import struct
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from . import state_json
from .blob import BlobPieces
from .cluster_keys import (
    SCRYPT_MAX_MEMORY,
    SCRYPT_MAX_WORK,
    SCRYPT_N,
    SCRYPT_P,
    SCRYPT_R,
    ClusterKeys,
    check_scrypt_parameters,
    key_check,
    legacy_key_id,
    master_key,
    subkey,
)
from .errors import CorruptRecord, HamsterbunkerError, SealError, StoreRegressed, Tampered
from .keyring import MIN_SECRET_LENGTH, Keyring, check_secret
from .limits import MAX_EPOCH, MAX_SEQ
from .records import ClusterRecord, parse_json

__all__ = [
    "MIN_SECRET_LENGTH",
    "SCRYPT_MAX_MEMORY",
    "SCRYPT_MAX_WORK",
    "EffectAt",
    "OpenedEffect",
    "OpenedSubmission",
    "SealedHeader",
    "Sealer",
    "check_scrypt_parameters",
    "check_secret",
    "gcm_pieces",
    "new_cluster_record",
    "sealed_key_id",
]

FORMAT_VERSION = 1
_MAGIC = b"HBCP"
_EFFECT_MAGIC = b"HBEF"
_SUBMISSION_MAGIC = b"HBSB"
_REPLY_MAGIC = b"HBRP"
_PREFIX = struct.Struct(">4sBH")  # magic, version, header length
_NONCE_BYTES = 12
_TAG_BYTES = 16
# seal_pieces encrypts a state above _ONE_SHOT_BYTES of JSON a piece of _PIECE_BYTES at a
# time (the file store writes each while the next is encrypted), a smaller one at once.
_PIECE_BYTES = 1024 * 1024
_ONE_SHOT_BYTES = 64 * 1024
# The least time between two reads of the cluster record for a key not known yet.
REFRESH_EVERY_S = 1.0
log = logging.getLogger("hamsterbunker")


def new_cluster_record(secret: str | Keyring) -> ClusterRecord:
    """Make the key material for a new cluster (a fresh random salt), for its newest secret."""
    newest = Keyring.of(secret).newest
    salt = os.urandom(16)
    master = master_key(newest, salt, SCRYPT_N, SCRYPT_R, SCRYPT_P)
    return ClusterRecord(
        format=FORMAT_VERSION,
        kdf="scrypt",
        n=SCRYPT_N,
        r=SCRYPT_R,
        p=SCRYPT_P,
        salt=base64.b64encode(salt).decode(),
        key_id=legacy_key_id(salt),
        key_check=key_check(master),
        created=time.time(),
    )


class _Key:
    """One key's per-purpose subkeys."""

    def __init__(self, kid: str, master: bytes) -> None:
        self.kid = kid
        self.checkpoint_key = subkey(master, b"checkpoint", 32)
        self.checkpoint = AESGCM(self.checkpoint_key)
        self.effect = AESGCM(subkey(master, b"effect", 32))
        self.inbox = AESGCM(subkey(master, b"inbox", 32))
        self.record = subkey(master, b"record", 32)


@dataclass(frozen=True)
class _InUse:
    """The record a sealer follows and its keys; replaced whole (adopt), never changed."""

    cluster: ClusterRecord
    current: _Key
    by_kid: dict[str, _Key]


@dataclass(frozen=True)
class SealedHeader:
    """What a sealed checkpoint says about itself (authenticated, not secret)."""

    key_id: str
    agent: str
    epoch: int
    seq: int
    time: float
    node: str | None = None  # the node whose chain it was published into (Store.chains)


class Sealer:
    """Seals with the cluster's current key and opens with any key it accepts.

    ``secret`` is one secret or a keyring (``hamsterbunker.keyring``); it must
    hold every key the cluster record lists (WrongSecret says which it lacks).
    A running node follows changes of the record with ``adopt``.
    """

    def __init__(
        self,
        secret: str | Keyring,
        cluster: ClusterRecord,
        *,
        refresh: Callable[[], ClusterRecord | None] | None = None,
    ) -> None:
        """``refresh`` reads the cluster record again (a running node's store): a record
        naming a key this sealer does not know yet makes it follow the store's record
        first (at most once a second), so a standby that has not yet read begin's record
        still opens what the leader sealed with the new key."""
        self._keys = ClusterKeys(Keyring.of(secret), cluster)
        self._in_use = self._opened(cluster)
        self._refresh, self._refreshed_at = refresh, -REFRESH_EVERY_S

    def _opened(self, cluster: ClusterRecord) -> _InUse:
        masters = self._keys.open(cluster)
        by_kid = {kid: _Key(kid, master) for kid, master in masters.items()}
        return _InUse(cluster, by_kid[cluster.key_id], by_kid)

    @property
    def cluster(self) -> ClusterRecord:
        """The cluster record this sealer follows (authenticated)."""
        return self._in_use.cluster

    @property
    def key_id(self) -> str:
        """The id of the key that seals now: the cluster's current one."""
        return self._in_use.current.kid

    @property
    def keys(self) -> ClusterKeys:
        """The keyring's secrets as this cluster's keys."""
        return self._keys

    def held_key_ids(self) -> tuple[str, ...]:
        """The ids of the secrets this sealer holds, newest first (for heartbeats)."""
        return self._keys.held_ids(self._in_use.cluster)

    def adopt(self, cluster: ClusterRecord) -> bool:
        """Follow a newer cluster record (a rotation's step): True if it changed the keys.

        The record must authenticate and list only keys this sealer holds
        (WrongSecret, Tampered otherwise, and nothing changes). One of a lower
        generation than the one followed is a rollback of the store: StoreRegressed.
        """
        ours = self._in_use.cluster
        if cluster == ours:
            return False
        if cluster.generation < ours.generation:
            raise StoreRegressed(
                f"the store's cluster record went back from key generation {ours.generation} "
                f"to {cluster.generation}: refusing the older key list"
            )
        if cluster.generation == ours.generation:
            return False  # the same keys; another copy's unauthenticated bytes differ
        self._in_use = self._opened(cluster)
        return True

    def sign_record(self, kind: str, payload: bytes) -> bytes:
        """payload with an HMAC-SHA256 tag bound to kind, for records that need no secrecy."""
        return payload + b"\n" + _record_mac(self._in_use.current, kind, payload).encode()

    def open_record(self, kind: str, signed: bytes) -> bytes:
        """The payload of a record sign_record made for kind under any accepted key; Tampered
        if it is not one."""
        payload, _, tag = signed.rpartition(b"\n")
        for key in self._in_use.by_kid.values():
            if hmac.compare_digest(_record_mac(key, kind, payload).encode(), tag):
                return payload
        raise Tampered(f"{kind} record failed to authenticate (edited, or written without "
                       "the secret)")  # fmt: skip

    def tag_record(self, kind: str, payload: bytes) -> str:
        """An HMAC-SHA256 tag of payload bound to kind, naming the key that made it: for a
        record whose signed fields stay in place (a lease record's proof)."""
        key = self._in_use.current
        return f"{key.kid}:{_record_mac(key, kind, payload)}"

    def check_tag(self, kind: str, payload: bytes, tag: str) -> None:
        """Tampered unless tag is tag_record's for kind and payload under an accepted key
        (one the store's newer cluster record names is followed, as for a sealed blob)."""
        kid, _, mac = tag.rpartition(":")
        key = self._key_named(kid, f"{kind} record")
        if not hmac.compare_digest(_record_mac(key, kind, payload), mac):
            raise Tampered(f"{kind} record failed to authenticate (edited, or written without "
                           "the secret)")  # fmt: skip

    def _key_named(self, kid: str, what: str) -> _Key:
        """The accepted key a sealed header names (the name is authenticated by the tag)."""
        key = self._in_use.by_kid.get(kid)
        if key is None and self._refresh is not None:
            self._follow_store()
            key = self._in_use.by_kid.get(kid)
        if key is None:
            accepted = ", ".join(self._in_use.by_kid)
            raise Tampered(f"{what} failed to authenticate: it names key id {kid[:32]!r}, "
                           f"which the cluster does not accept (it accepts {accepted})")  # fmt: skip
        return key

    def _follow_store(self) -> None:
        """Adopt the store's record now, if it is authentic and newer (never more than once
        a second: junk naming unknown keys must not cost a store read each)."""
        now = time.monotonic()
        if self._refresh is None or now - self._refreshed_at < REFRESH_EVERY_S:
            return
        self._refreshed_at = now
        try:
            stored = self._refresh()
            if stored is not None:
                self.adopt(stored)
        except HamsterbunkerError as exc:  # the node's key follower reports and acts on it
            log.debug("cluster record not followed: %s", exc)

    def seal(
        self,
        agent: str,
        epoch: int,
        seq: int,
        state: dict[str, Any],
        *,
        inbox: dict[str, Any] | None = None,
        sealed_at: float | None = None,
        node: str | None = None,
    ) -> bytes:
        """Seal a JSON-serialisable state under a fresh random nonce, with the current key.

        The plaintext is the state's compact JSON (``hamsterbunker.state_json``:
        orjson's bytes where they read back as the standard library's would, else
        the standard library's), so ``open`` gives back what json.loads of
        json.dumps(state) gives, and refuses what json.dumps refuses.

        inbox: which of the agent's submissions are consumed as of this state
        (``hamsterbunker.inbox.ConsumedMarks``), sealed with it, so that they
        commit together; the header says a checkpoint carries it. sealed_at:
        the time the header gives (now; a re-seal keeps the first one's).
        node: the node whose chain the checkpoint goes into, on a store that
        keeps a chain per node (``Store.chains``); None on any other store,
        whose checkpoints name no node (see the module).
        """
        key, prefix, plaintext = self._checkpoint_parts(
            agent, epoch, seq, state, inbox, sealed_at, node
        )
        nonce = os.urandom(_NONCE_BYTES)
        return prefix + nonce + key.checkpoint.encrypt(nonce, plaintext, prefix)

    def seal_pieces(
        self,
        agent: str,
        epoch: int,
        seq: int,
        state: dict[str, Any],
        *,
        inbox: dict[str, Any] | None = None,
        node: str | None = None,
    ) -> BlobPieces:
        """seal(), encrypted piece by piece as a store takes the pieces (``hamsterbunker.blob``).

        The same format, opened by ``open``; for a publish, whose store writes each
        piece while the next is encrypted. The state's JSON is made here, so a
        state that is not JSON-serialisable raises SealError before a store is
        handed anything; the nonce and the encryption come as the pieces are taken.
        node: as for seal().
        """
        key, prefix, plaintext = self._checkpoint_parts(agent, epoch, seq, state, inbox, None, node)
        length = len(prefix) + _NONCE_BYTES + len(plaintext) + _TAG_BYTES
        return BlobPieces(length, _checkpoint_pieces(key, prefix, plaintext))

    def _checkpoint_parts(
        self,
        agent: str,
        epoch: int,
        seq: int,
        state: dict[str, Any],
        inbox: dict[str, Any] | None,
        sealed_at: float | None,
        node: str | None,
    ) -> tuple[_Key, bytes, bytes]:
        """What a seal encrypts: the current key, the prefix (associated data), the plaintext."""
        if node is not None and (not isinstance(node, str) or not node):
            raise SealError(f"a checkpoint's node must be a non-empty string, not {node!r}")
        key = self._in_use.current
        body: dict[str, Any] = state if inbox is None else {"state": state, "inbox": inbox}
        try:
            plaintext = state_json.encode(body)
        except (TypeError, ValueError) as exc:
            raise SealError(f"agent state is not JSON-serialisable: {exc}") from exc
        fields: dict[str, Any] = {"kid": key.kid, "agent": agent, "epoch": epoch, "seq": seq}
        if node is not None:  # only then: other stores' headers are as they always were
            fields["node"] = node
        when = time.time() if sealed_at is None else sealed_at
        header = json.dumps(
            {**fields, "time": when, **({"inbox": 1} if inbox is not None else {})},
            separators=(",", ":"),
        ).encode()
        prefix = _PREFIX.pack(_MAGIC, FORMAT_VERSION, len(header)) + header
        return key, prefix, plaintext

    def open(
        self, blob: bytes, agent: str, epoch: int, seq: int, node: str | None = None
    ) -> dict[str, Any]:
        """Open a checkpoint found under (agent, epoch, seq), in node's chain if the store
        keeps chains (else None); raise Tampered if it is not that."""
        return self.open_checkpoint(blob, agent, epoch, seq, node)[0]

    def open_checkpoint(
        self, blob: bytes, agent: str, epoch: int, seq: int, node: str | None = None
    ) -> tuple[dict[str, Any], dict[str, Any] | None]:
        """open(), and the inbox marks sealed with the state (None if it carries none).

        node: the node whose chain the blob was read from, on a store that keeps a
        chain per node; None on any other store. A checkpoint naming another node,
        naming one where none is expected, or naming none where one is, is Tampered.
        """
        header = read_header(blob)
        key = self._key_named(header.key_id, "checkpoint")
        prefix_len = _PREFIX.size + struct.unpack_from(">H", blob, 5)[0]
        prefix, nonce = blob[:prefix_len], blob[prefix_len : prefix_len + _NONCE_BYTES]
        try:
            plaintext = key.checkpoint.decrypt(nonce, blob[prefix_len + _NONCE_BYTES :], prefix)
        except InvalidTag as exc:
            raise Tampered("checkpoint failed to authenticate (edited or truncated)") from exc
        if header.agent != agent:
            raise Tampered(f"checkpoint belongs to agent {header.agent!r}, not {agent!r}")
        if (header.epoch, header.seq) != (epoch, seq):
            raise Tampered(
                f"checkpoint was sealed as epoch {header.epoch} seq {header.seq} but is stored "
                f"as epoch {epoch} seq {seq} (replayed)"
            )
        _check_node(header.node, node)
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

    def reseal_checkpoint(self, blob: bytes, agent: str, epoch: int, seq: int) -> bytes:
        """The checkpoint found under (agent, epoch, seq), sealed again with the current key.

        The same state, inbox marks, time and node (if it names one: it stays bound
        to the chain it was published into): as long as the blob it replaces, so a
        store can swap one for the other in place (``Store.reseal_checkpoint``).
        """
        header = read_header(blob)
        # The node is taken from the header and authenticated by the open: kept, not checked
        # (the store that reads it back checks it against the chain it is found in).
        state, inbox = self.open_checkpoint(blob, agent, epoch, seq, header.node)
        return self.seal(
            agent, epoch, seq, state, inbox=inbox, sealed_at=header.time, node=header.node
        )

    def reseal_effect(self, blob: bytes, at: EffectAt) -> bytes:
        """The effect-journal record found as ``at`` (its name aside), sealed again with the
        current key: the same epoch, name and payload."""
        opened = self.open_effect(blob, at)
        return self.seal_effect(replace(at, name=opened.name), opened.epoch, opened.payload)

    def reseal_submission(self, blob: bytes, agent: str, number: int) -> bytes:
        """The submission found as number of agent, sealed again with the current key: the
        same request id, payload and time."""
        found = self.open_submission(blob, agent, number)
        return self.seal_submission(agent, number, found.request_id, found.payload, found.submitted)

    def reseal_reply(self, blob: bytes, agent: str, number: int) -> bytes:
        """The reply found as that to submission number of agent, sealed again with the
        current key: the same request id and reply. Tampered if it is not that one's."""
        header, body = self._open_inbox(_REPLY_MAGIC, blob, "reply")
        request_id = header.get("rid")
        if (header.get("agent"), header.get("number")) != (agent, number) or not isinstance(
            request_id, str
        ):
            raise Tampered(
                f"reply sealed for submission {header.get('number')!r} of "
                f"{header.get('agent')!r} was found as the reply to {number} of {agent!r}"
            )
        if not isinstance(body, dict) or "reply" not in body:
            raise Tampered("reply is damaged: no reply in it")
        return self.seal_reply(agent, number, request_id, body["reply"])

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

    def open_reply(self, blob: bytes, agent: str, number: int, request_id: str) -> Any:
        """The reply found for submission number (request_id) of agent; Tampered if it is not
        that one's.

        The number counts as much as the request id: a request id forgotten (its
        consumed record compacted) and submitted again is a new submission under a
        new number, and the first one's genuine reply, planted again, must not
        answer it.
        """
        header, body = self._open_inbox(_REPLY_MAGIC, blob, "reply")
        found = (header.get("agent"), header.get("number"), header.get("rid"))
        if found != (agent, number, request_id):
            raise Tampered(
                f"reply sealed for request {found[2]!r} (#{found[1]!r}) of {found[0]!r} was "
                f"found as the reply to {request_id!r} (#{number}) of {agent!r}"
            )
        if not isinstance(body, dict) or "reply" not in body:
            raise Tampered("reply is damaged: no reply in it")
        return body["reply"]

    def _seal_inbox(self, magic: bytes, header: dict[str, Any], body: Any, what: str) -> bytes:
        try:
            plaintext = json.dumps(body, separators=(",", ":"), allow_nan=False).encode()
        except (TypeError, ValueError) as exc:
            raise SealError(f"the {what} is not JSON-serialisable: {exc}") from exc
        key = self._in_use.current
        prefix_header = json.dumps({"kid": key.kid, **header}, separators=(",", ":")).encode()
        prefix = _PREFIX.pack(magic, FORMAT_VERSION, len(prefix_header)) + prefix_header
        nonce = os.urandom(_NONCE_BYTES)
        return prefix + nonce + key.inbox.encrypt(nonce, plaintext, prefix)

    def _open_inbox(self, magic: bytes, blob: bytes, what: str) -> tuple[dict[str, Any], Any]:
        """The authenticated header and body of an inbox record; Tampered for anything else."""
        found, version, header_len = _PREFIX.unpack_from(blob.ljust(_PREFIX.size, b"\0"))
        if found != magic or version != FORMAT_VERSION:
            raise Tampered(f"not a HamsterBunker {what} of a known version")
        prefix_len = _PREFIX.size + header_len
        if len(blob) < prefix_len + _NONCE_BYTES + _TAG_BYTES:
            raise Tampered(f"{what} is truncated")
        prefix, nonce = blob[:prefix_len], blob[prefix_len : prefix_len + _NONCE_BYTES]
        key = self._key_named(_named_key_id(prefix[_PREFIX.size :], what), what)
        try:
            plaintext = key.inbox.decrypt(nonce, blob[prefix_len + _NONCE_BYTES :], prefix)
        except InvalidTag as exc:
            raise Tampered(f"{what} failed to authenticate (edited, or sealed without the "
                           "secret)") from exc  # fmt: skip
        # Authentic from here on: sealed by a holder of the secret.
        return json.loads(prefix[_PREFIX.size :]), json.loads(plaintext)

    def seal_effect(self, at: EffectAt, epoch: int, payload: dict[str, Any]) -> bytes:
        """Seal one effect-journal record (an intent or an outcome) written under epoch.

        The header, all associated data, names the agent, step, index, kind,
        effect name and epoch (and on a chained store the node whose journal
        holds it), so a record moved to another effect, step, agent or node's
        journal fails to open as that one.
        """
        try:
            plaintext = json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode()
        except (TypeError, ValueError) as exc:
            raise SealError(f"effect record is not JSON-serialisable: {exc}") from exc
        key = self._in_use.current
        header = json.dumps(
            {"kid": key.kid, **at.header(), "epoch": epoch}, separators=(",", ":")
        ).encode()
        prefix = _PREFIX.pack(_EFFECT_MAGIC, FORMAT_VERSION, len(header)) + header
        nonce = os.urandom(_NONCE_BYTES)
        return prefix + nonce + key.effect.encrypt(nonce, plaintext, prefix)

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
        key = self._key_named(
            _named_key_id(prefix[_PREFIX.size :], "effect record"), "effect record"
        )
        try:
            plaintext = key.effect.decrypt(nonce, blob[prefix_len + _NONCE_BYTES :], prefix)
        except InvalidTag as exc:
            raise Tampered("effect record failed to authenticate (edited or truncated)") from exc
        # Authentic from here on: written by a node that holds the secret.
        header = json.loads(prefix[_PREFIX.size :])
        fields = ("agent", "seq", "index", "kind", "node")  # no node: None on both sides
        sealed_as = {field: header.get(field) for field in fields}
        found_as = {field: at.header().get(field) for field in fields}
        if sealed_as != found_as:
            raise Tampered(f"effect record sealed as {sealed_as} was found as {found_as}")
        return OpenedEffect(header["epoch"], header["name"], json.loads(plaintext))


def _record_mac(key: _Key, kind: str, payload: bytes) -> str:
    return hmac.new(key.record, kind.encode() + b"\0" + payload, "sha256").hexdigest()


def _checkpoint_pieces(key: _Key, prefix: bytes, plaintext: bytes) -> Iterator[bytes]:
    """A sealed checkpoint's pieces under a fresh nonce: one, if the state is small."""
    nonce = os.urandom(_NONCE_BYTES)
    if len(plaintext) <= _ONE_SHOT_BYTES:  # one call costs less than a cipher's set-up (10 µs)
        yield prefix + nonce + key.checkpoint.encrypt(nonce, plaintext, prefix)
        return
    yield prefix + nonce
    yield from gcm_pieces(key.checkpoint_key, nonce, plaintext, prefix)


def gcm_pieces(
    key: bytes, nonce: bytes, plaintext: bytes, associated: bytes, piece: int = _PIECE_BYTES
) -> Iterator[bytes]:
    """AESGCM(key).encrypt(nonce, plaintext, associated), in pieces of about piece bytes.

    The ciphertext piece by piece, then the 16-byte tag: joined, the same bytes.
    """
    encryptor = Cipher(algorithms.AES(key), modes.GCM(nonce)).encryptor()
    encryptor.authenticate_additional_data(associated)
    view = memoryview(plaintext)
    for start in range(0, len(view), piece):
        yield encryptor.update(view[start : start + piece])
    yield encryptor.finalize() + encryptor.tag


def sealed_key_id(blob: bytes) -> str | None:
    """The key id a sealed record of any kind names in its header (not authenticated: for
    finding what a rotation must re-seal); None if it names none or is not one of ours."""
    if len(blob) < _PREFIX.size:
        return None
    _magic, _version, header_len = _PREFIX.unpack_from(blob)
    try:
        return _named_key_id(blob[_PREFIX.size : _PREFIX.size + header_len], "record")
    except Tampered:
        return None


def _named_key_id(header: bytes, what: str) -> str:
    """The key id an (as yet unauthenticated) sealed header names; Tampered if none."""
    try:
        doc = parse_json(header, f"{what} header")
    except CorruptRecord as exc:
        raise Tampered(str(exc)) from exc
    kid = doc.get("kid") if isinstance(doc, dict) else None
    if not isinstance(kid, str):
        raise Tampered(f"{what} header names no key id")
    return kid


def _check_node(sealed: str | None, expected: str | None) -> None:
    """Tampered unless an authenticated checkpoint names the node expected (or none, both)."""
    if sealed == expected:
        return
    if expected is None:
        raise Tampered(
            f"checkpoint was sealed into node {sealed!r}'s chain of a store that keeps one per "
            "node, but was found in a store without chains (copied)"
        )
    if sealed is None:
        raise Tampered(
            f"checkpoint names no node but was found in node {expected!r}'s chain: it was "
            "sealed for a store without chains (copied), or before checkpoints were bound to "
            "their node"
        )
    raise Tampered(
        f"checkpoint was sealed into node {sealed!r}'s chain but was found in node "
        f"{expected!r}'s chain (copied)"
    )


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
    """Where an effect-journal record belongs: agent, step, index, kind and the effect's name;
    on a store that keeps a chain per node (``Store.chains``), the node whose journal it is
    in (None elsewhere: the header then names none, as before)."""

    agent: str
    seq: int
    index: int
    kind: str
    name: str = ""
    node: str | None = None

    def header(self) -> dict[str, Any]:
        header: dict[str, Any] = {
            "agent": self.agent,
            "seq": self.seq,
            "index": self.index,
            "kind": self.kind,
            "name": self.name,
        }
        if self.node is not None:
            header["node"] = self.node
        return header


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
    node = doc.get("node")
    if "node" in doc and (not isinstance(node, str) or not node):
        raise Tampered("checkpoint header is damaged: field 'node' is mistyped or empty")
    return SealedHeader(
        key_id=doc["kid"],
        agent=doc["agent"],
        epoch=doc["epoch"],
        seq=doc["seq"],
        time=doc["time"],
        node=node,
    )
