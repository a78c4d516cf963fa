"""The Sealer: seals with the cluster's current key, opens with any key it accepts
(``docs/design.md``, "Sealed records").
"""

from __future__ import annotations

import base64
import hmac
import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..core import state_json
from ..core.blob import BlobPieces
from ..core.errors import HamsterbunkerError, SealError, StateNotJson, StoreRegressed, Tampered
from ..records import ClusterRecord
from .cluster_keys import (
    SCRYPT_N,
    SCRYPT_P,
    SCRYPT_R,
    ClusterKeys,
    key_check,
    legacy_key_id,
    master_key,
)
from .formats import (
    CHECKPOINT_MAGIC,
    FORMAT_VERSION,
    NONCE_BYTES,
    PREFIX,
    TAG_BYTES,
    Key,
    carries_inbox,
    check_node,
    checkpoint_pieces,
    framed,
    opened,
    prefix_of,
    read_header,
    record_mac,
    unframed,
)
from .keyring import Keyring
from .work import WorkSealing

__all__ = ["REFRESH_EVERY_S", "Sealer", "new_cluster_record"]

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


@dataclass(frozen=True)
class _InUse:
    """The record a sealer follows and its keys; replaced whole (adopt), never changed."""

    cluster: ClusterRecord
    current: Key
    by_kid: dict[str, Key]


class Sealer(WorkSealing):
    """Seals with the cluster's current key and opens with any key it accepts. ``secret``
    (one, or a ``Keyring``) must hold every key the cluster record lists (else WrongSecret)."""

    def __init__(
        self,
        secret: str | Keyring,
        cluster: ClusterRecord,
        *,
        refresh: Callable[[], ClusterRecord | None] | None = None,
    ) -> None:
        """``refresh`` reads the store's cluster record, followed (at most once a second)
        when a sealed record names a key this sealer does not know yet."""
        self._keys = ClusterKeys(Keyring.of(secret), cluster)
        self._in_use = self._opened(cluster)
        self._refresh, self._refreshed_at = refresh, -REFRESH_EVERY_S

    def _opened(self, cluster: ClusterRecord) -> _InUse:
        masters = self._keys.open(cluster)
        by_kid = {kid: Key(kid, master) for kid, master in masters.items()}
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
        WrongSecret or Tampered if it does not authenticate or lists a key not held;
        StoreRegressed for a lower generation than the one followed."""
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
        return payload + b"\n" + record_mac(self._in_use.current, kind, payload).encode()

    def open_record(self, kind: str, signed: bytes) -> bytes:
        """The payload of a record sign_record made for kind under any accepted key; Tampered
        if it is not one."""
        payload, _, tag = signed.rpartition(b"\n")
        for key in self._in_use.by_kid.values():
            if hmac.compare_digest(record_mac(key, kind, payload).encode(), tag):
                return payload
        raise Tampered(f"{kind} record failed to authenticate (edited, or written without "
                       "the secret)")  # fmt: skip

    def tag_record(self, kind: str, payload: bytes) -> str:
        """An HMAC-SHA256 tag of payload bound to kind, naming the key that made it: for a
        record whose signed fields stay in place (a lease record's proof)."""
        key = self._in_use.current
        return f"{key.kid}:{record_mac(key, kind, payload)}"

    def check_tag(self, kind: str, payload: bytes, tag: str) -> None:
        """Tampered unless tag is tag_record's for kind and payload under an accepted key
        (one the store's newer cluster record names is followed, as for a sealed blob)."""
        kid, _, mac = tag.rpartition(":")
        key = self._key_named(kid, f"{kind} record")
        if not hmac.compare_digest(record_mac(key, kind, payload), mac):
            raise Tampered(f"{kind} record failed to authenticate (edited, or written without "
                           "the secret)")  # fmt: skip

    def _current_key(self) -> Key:
        return self._in_use.current

    def _key_named(self, kid: str, what: str) -> Key:
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
        """Seal a JSON-serialisable state (SealError if it is not) with the current key.

        ``open`` gives back what json.loads of json.dumps(state) gives (``core.state_json``).
        inbox: the consumed marks as of this state (``ConsumedMarks``), sealed with it.
        sealed_at: the header's time (default now). node: the node whose chain the checkpoint
        goes into on a store with chains (``Store.chains``), else None.
        """
        key, prefix, plaintext = self._checkpoint_parts(
            agent, epoch, seq, state, inbox, sealed_at, node
        )
        return framed(key.checkpoint, prefix, plaintext)

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
        """seal(), encrypted piece by piece as a store takes the pieces (``core.blob``). A
        state that is not JSON-serialisable raises SealError here, before a store has it."""
        key, prefix, plaintext = self._checkpoint_parts(agent, epoch, seq, state, inbox, None, node)
        length = len(prefix) + NONCE_BYTES + len(plaintext) + TAG_BYTES
        return BlobPieces(length, checkpoint_pieces(key, prefix, plaintext))

    def _checkpoint_parts(
        self,
        agent: str,
        epoch: int,
        seq: int,
        state: dict[str, Any],
        inbox: dict[str, Any] | None,
        sealed_at: float | None,
        node: str | None,
    ) -> tuple[Key, bytes, bytes]:
        """What a seal encrypts: the current key, the prefix (associated data), the plaintext."""
        if node is not None and (not isinstance(node, str) or not node):
            raise SealError(f"a checkpoint's node must be a non-empty string, not {node!r}")
        key = self._in_use.current
        body: dict[str, Any] = state if inbox is None else {"state": state, "inbox": inbox}
        try:
            plaintext = state_json.encode(body)
        except (TypeError, ValueError) as exc:
            where = state_json.not_json_at(state)
            raise StateNotJson(f"agent state is not JSON-serialisable at {where}: {exc}") from exc
        fields: dict[str, Any] = {"kid": key.kid, "agent": agent, "epoch": epoch, "seq": seq}
        if node is not None:  # only then: other stores' headers are as they always were
            fields["node"] = node
        when = time.time() if sealed_at is None else sealed_at
        header = {**fields, "time": when, **({"inbox": 1} if inbox is not None else {})}
        return key, prefix_of(CHECKPOINT_MAGIC, header), plaintext

    def open(
        self, blob: bytes, agent: str, epoch: int, seq: int, node: str | None = None
    ) -> dict[str, Any]:
        """Open a checkpoint found under (agent, epoch, seq), in node's chain if the store
        keeps chains (else None); raise Tampered if it is not that."""
        return self.open_checkpoint(blob, agent, epoch, seq, node)[0]

    def open_checkpoint(
        self, blob: bytes, agent: str, epoch: int, seq: int, node: str | None = None
    ) -> tuple[dict[str, Any], dict[str, Any] | None]:
        """open(), and the inbox marks sealed with the state (None if it carries none). A
        checkpoint that names another node than node (None: none) is Tampered."""
        header = read_header(blob)
        key = self._key_named(header.key_id, "checkpoint")
        prefix, nonce, ciphertext = unframed(CHECKPOINT_MAGIC, blob, "checkpoint")
        failed = "checkpoint failed to authenticate (edited or truncated)"
        plaintext = opened(key.checkpoint, prefix, nonce, ciphertext, failed)
        if header.agent != agent:
            raise Tampered(f"checkpoint belongs to agent {header.agent!r}, not {agent!r}")
        if (header.epoch, header.seq) != (epoch, seq):
            raise Tampered(
                f"checkpoint was sealed as epoch {header.epoch} seq {header.seq} but is stored "
                f"as epoch {epoch} seq {seq} (replayed)"
            )
        check_node(header.node, node)
        try:
            state = json.loads(plaintext.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise Tampered(f"checkpoint plaintext is not JSON: {exc}") from exc
        inbox: dict[str, Any] | None = None
        if carries_inbox(prefix[PREFIX.size :]):
            wrapped = state
            if not isinstance(wrapped, dict) or not isinstance(wrapped.get("inbox"), dict):
                raise Tampered("checkpoint says it carries inbox marks but has none")
            state, inbox = wrapped.get("state"), wrapped["inbox"]
        if not isinstance(state, dict):
            raise Tampered("checkpoint state is not a JSON object")
        return state, inbox

    def reseal_checkpoint(self, blob: bytes, agent: str, epoch: int, seq: int) -> bytes:
        """The checkpoint found under (agent, epoch, seq), sealed again with the current key:
        the same state, inbox marks, time and node, and as long as the blob it replaces."""
        header = read_header(blob)
        # The node is taken from the header and authenticated by the open: kept, not checked
        # (the store that reads it back checks it against the chain it is found in).
        state, inbox = self.open_checkpoint(blob, agent, epoch, seq, header.node)
        return self.seal(
            agent, epoch, seq, state, inbox=inbox, sealed_at=header.time, node=header.node
        )
