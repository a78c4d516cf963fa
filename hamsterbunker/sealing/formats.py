"""The sealed formats' framing: magic, version, header (associated data), nonce, ciphertext
with its GCM tag (``docs/design.md``, "Sealed records").
"""

from __future__ import annotations

import hmac
import json
import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from ..core.errors import CorruptRecord, Tampered
from ..core.limits import MAX_EPOCH, MAX_SEQ
from ..records import parse_json
from .cluster_keys import subkey

__all__ = [
    "CHECKPOINT_MAGIC",
    "EFFECT_MAGIC",
    "FORMAT_VERSION",
    "NONCE_BYTES",
    "PREFIX",
    "REPLY_MAGIC",
    "SUBMISSION_MAGIC",
    "TAG_BYTES",
    "Key",
    "SealedHeader",
    "check_node",
    "checkpoint_pieces",
    "framed",
    "gcm_pieces",
    "named_key_id",
    "read_header",
    "record_mac",
    "sealed_key_id",
    "unframed",
]

FORMAT_VERSION = 1
CHECKPOINT_MAGIC = b"HBCP"
EFFECT_MAGIC = b"HBEF"
SUBMISSION_MAGIC = b"HBSB"
REPLY_MAGIC = b"HBRP"
PREFIX = struct.Struct(">4sBH")  # magic, version, header length
NONCE_BYTES = 12
TAG_BYTES = 16
# A checkpoint above _ONE_SHOT_BYTES of JSON is encrypted a piece of _PIECE_BYTES at a time
# (the store writes each while the next is encrypted), a smaller one at once.
_PIECE_BYTES = 1024 * 1024
_ONE_SHOT_BYTES = 64 * 1024


class Key:
    """One key's per-purpose subkeys."""

    def __init__(self, kid: str, master: bytes) -> None:
        self.kid = kid
        self.checkpoint_key = subkey(master, b"checkpoint", 32)
        self.checkpoint = AESGCM(self.checkpoint_key)
        self.effect = AESGCM(subkey(master, b"effect", 32))
        self.inbox = AESGCM(subkey(master, b"inbox", 32))
        self.record = subkey(master, b"record", 32)


@dataclass(frozen=True)
class SealedHeader:
    """What a sealed checkpoint says about itself (authenticated, not secret)."""

    key_id: str
    agent: str
    epoch: int
    seq: int
    time: float
    node: str | None = None  # the node whose chain it was published into (Store.chains)


def record_mac(key: Key, kind: str, payload: bytes) -> str:
    return hmac.new(key.record, kind.encode() + b"\0" + payload, "sha256").hexdigest()


def prefix_of(magic: bytes, header: dict[str, Any]) -> bytes:
    """The associated data of a record: the frame's start and its header's compact JSON."""
    encoded = json.dumps(header, separators=(",", ":")).encode()
    return PREFIX.pack(magic, FORMAT_VERSION, len(encoded)) + encoded


def framed(aead: AESGCM, prefix: bytes, plaintext: bytes) -> bytes:
    """A whole sealed record under a fresh random nonce."""
    nonce = os.urandom(NONCE_BYTES)
    return prefix + nonce + aead.encrypt(nonce, plaintext, prefix)


def unframed(magic: bytes, blob: bytes, what: str) -> tuple[bytes, bytes, bytes]:
    """(prefix, nonce, ciphertext) of a record of this magic and version; Tampered if it is
    not one or is cut short. Nothing is authenticated yet."""
    found, version, header_len = PREFIX.unpack_from(blob.ljust(PREFIX.size, b"\0"))
    if found != magic or version != FORMAT_VERSION:
        raise Tampered(f"not a HamsterBunker {what} of a known version")
    prefix_len = PREFIX.size + header_len
    if len(blob) < prefix_len + NONCE_BYTES + TAG_BYTES:
        raise Tampered(f"{what} is truncated")
    nonce_end = prefix_len + NONCE_BYTES
    return blob[:prefix_len], blob[prefix_len:nonce_end], blob[nonce_end:]


def opened(aead: AESGCM, prefix: bytes, nonce: bytes, ciphertext: bytes, failed: str) -> bytes:
    """The plaintext, authenticated with the prefix; Tampered(failed) if it does not."""
    try:
        return aead.decrypt(nonce, ciphertext, prefix)
    except InvalidTag as exc:
        raise Tampered(failed) from exc


def checkpoint_pieces(key: Key, prefix: bytes, plaintext: bytes) -> Iterator[bytes]:
    """A sealed checkpoint's pieces under a fresh nonce: one, if the state is small."""
    nonce = os.urandom(NONCE_BYTES)
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
    if len(blob) < PREFIX.size:
        return None
    _magic, _version, header_len = PREFIX.unpack_from(blob)
    try:
        return named_key_id(blob[PREFIX.size : PREFIX.size + header_len], "record")
    except Tampered:
        return None


def named_key_id(header: bytes, what: str) -> str:
    """The key id an (as yet unauthenticated) sealed header names; Tampered if none."""
    try:
        doc = parse_json(header, f"{what} header")
    except CorruptRecord as exc:
        raise Tampered(str(exc)) from exc
    kid = doc.get("kid") if isinstance(doc, dict) else None
    if not isinstance(kid, str):
        raise Tampered(f"{what} header names no key id")
    return kid


def check_node(sealed: str | None, expected: str | None) -> None:
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


def carries_inbox(header: bytes) -> bool:
    """Whether an authenticated checkpoint header says the state carries inbox marks."""
    doc = json.loads(header)
    return isinstance(doc, dict) and doc.get("inbox") == 1


def read_header(blob: bytes) -> SealedHeader:
    """Parse the unauthenticated header; Sealer.open authenticates it."""
    if len(blob) < PREFIX.size:
        raise Tampered("checkpoint is truncated (no header)")
    magic, version, header_len = PREFIX.unpack_from(blob)
    if magic != CHECKPOINT_MAGIC:
        raise Tampered("not a HamsterBunker checkpoint (bad magic)")
    if version != FORMAT_VERSION:
        raise Tampered(f"checkpoint format version {version} is not known to this version")
    if len(blob) < PREFIX.size + header_len + NONCE_BYTES + TAG_BYTES:
        raise Tampered("checkpoint is truncated")
    try:
        doc = parse_json(blob[PREFIX.size : PREFIX.size + header_len], "checkpoint header")
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
