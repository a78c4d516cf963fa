"""Sealing of agent state (DESIGN.md invariant 5): AES-256-GCM, bound to agent, epoch and seq.

scrypt costs tens of milliseconds, so the cluster record and its Sealer are
derived once per module; only tests about deriving keys derive again.
"""

from __future__ import annotations

import base64
import struct
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hamsterbunker.core.errors import ConfigError, SealError, SecretTooShort, Tampered, WrongSecret
from hamsterbunker.records import ClusterRecord
from hamsterbunker.sealing import Sealer, check_secret, new_cluster_record

SECRET = "correct horse battery staple"
AGENT, EPOCH, SEQ = "agent-1", 3, 17
STATE: dict[str, Any] = {
    "count": 41,
    "notes": ["naïve", "日本語", "emoji 🐹"],
    "nested": {"ok": True, "none": None, "pi": 3.25},
}
NONCE_BYTES = 12


@pytest.fixture(scope="module")
def cluster() -> ClusterRecord:
    return new_cluster_record(SECRET)


@pytest.fixture(scope="module")
def sealer(cluster: ClusterRecord) -> Sealer:
    return Sealer(SECRET, cluster)


@pytest.fixture(scope="module")
def blob(sealer: Sealer) -> bytes:
    return sealer.seal(AGENT, EPOCH, SEQ, STATE)


def nonce_of(blob: bytes) -> bytes:
    """The 12 nonce bytes: after magic, version, header length and header."""
    (header_len,) = struct.unpack_from(">H", blob, 5)
    start = 4 + 1 + 2 + header_len
    return blob[start : start + NONCE_BYTES]


def flip_b64(value: str, index: int) -> str:
    raw = bytearray(base64.b64decode(value))
    raw[index] ^= 0x01
    return base64.b64encode(bytes(raw)).decode()


# -- round trip --------------------------------------------------------------


def test_round_trip(sealer: Sealer, blob: bytes) -> None:
    """A sealed state opens to an equal state under the same agent, epoch and seq."""
    assert sealer.open(blob, AGENT, EPOCH, SEQ) == STATE


def test_another_node_with_the_secret_opens_it(cluster: ClusterRecord, blob: bytes) -> None:
    """A Sealer built on another node from the stored cluster record opens the checkpoint."""
    elsewhere = Sealer(SECRET, ClusterRecord.from_json(cluster.to_json()))
    assert elsewhere.open(blob, AGENT, EPOCH, SEQ) == STATE


def test_state_is_not_readable_in_the_blob(blob: bytes) -> None:
    """The sealed bytes do not contain the plaintext state."""
    assert b"count" not in blob and "naïve".encode() not in blob


# -- tampering ---------------------------------------------------------------


@pytest.mark.parametrize("mask", [0x01, 0xFF])
def test_every_single_byte_flip_is_tampered(sealer: Sealer, blob: bytes, mask: int) -> None:
    """Flipping any one byte of a sealed checkpoint makes it fail with Tampered."""
    for i in range(len(blob)):
        edited = bytearray(blob)
        edited[i] ^= mask
        with pytest.raises(Tampered):
            sealer.open(bytes(edited), AGENT, EPOCH, SEQ)


def test_every_truncation_is_tampered(sealer: Sealer, blob: bytes) -> None:
    """Every prefix shorter than the checkpoint, the empty one included, is Tampered."""
    for length in range(len(blob)):
        with pytest.raises(Tampered):
            sealer.open(blob[:length], AGENT, EPOCH, SEQ)


@pytest.mark.parametrize("extra", [b"\x00", b"x", b"\xff" * 16])
def test_appended_bytes_are_tampered(sealer: Sealer, blob: bytes, extra: bytes) -> None:
    """A checkpoint with bytes appended is Tampered."""
    with pytest.raises(Tampered):
        sealer.open(blob + extra, AGENT, EPOCH, SEQ)


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_arbitrary_damage_is_tampered(sealer: Sealer, blob: bytes, data: st.DataObject) -> None:
    """Any mix of byte edits and a cut to any length is Tampered, never another error."""
    damaged = bytearray(blob)
    edits = data.draw(
        st.lists(
            st.tuples(st.integers(0, len(blob) - 1), st.integers(1, 255)), min_size=0, max_size=4
        )
    )
    for index, mask in edits:
        damaged[index] ^= mask
    cut = data.draw(st.integers(0, len(blob)))
    damaged = damaged[:cut]
    if bytes(damaged) == blob:
        return  # no damage drawn (empty edits cancelled out and no cut)
    with pytest.raises(Tampered):
        sealer.open(bytes(damaged), AGENT, EPOCH, SEQ)


def test_moved_to_another_agent_is_tampered(sealer: Sealer, blob: bytes) -> None:
    """A checkpoint opened as another agent's is Tampered."""
    with pytest.raises(Tampered, match="agent"):
        sealer.open(blob, "agent-2", EPOCH, SEQ)


@pytest.mark.parametrize(
    ("epoch", "seq"),
    [(EPOCH, SEQ + 1), (EPOCH, SEQ - 1), (EPOCH + 1, SEQ), (EPOCH - 1, SEQ), (EPOCH + 1, SEQ + 1)],
)
def test_replayed_under_another_number_is_tampered(
    sealer: Sealer, blob: bytes, epoch: int, seq: int
) -> None:
    """A checkpoint found under another epoch or seq than it was sealed with is Tampered."""
    with pytest.raises(Tampered, match="replayed"):
        sealer.open(blob, AGENT, epoch, seq)


def test_checkpoint_of_another_cluster_is_tampered(blob: bytes) -> None:
    """A checkpoint sealed by another cluster (same secret, other salt) is Tampered."""
    other = Sealer(SECRET, new_cluster_record(SECRET))
    with pytest.raises(Tampered):
        other.open(blob, AGENT, EPOCH, SEQ)


# -- fresh nonces ------------------------------------------------------------


def test_two_seals_of_one_state_differ(sealer: Sealer, blob: bytes) -> None:
    """Sealing the same state twice uses a fresh nonce, so nonce and ciphertext differ."""
    again = sealer.seal(AGENT, EPOCH, SEQ, STATE)
    assert len(nonce_of(again)) == NONCE_BYTES
    assert nonce_of(again) != nonce_of(blob)
    assert again[-32:] != blob[-32:]
    assert sealer.open(again, AGENT, EPOCH, SEQ) == STATE


def test_nonces_do_not_repeat(sealer: Sealer) -> None:
    """Five hundred seals of one state have five hundred different nonces."""
    nonces = {nonce_of(sealer.seal(AGENT, EPOCH, SEQ, STATE)) for _ in range(500)}
    assert len(nonces) == 500


# -- bad state ---------------------------------------------------------------


@pytest.mark.parametrize("state", [{"x": object()}, {"s": {1, 2}}, {"b": b"bytes"}])
def test_non_json_state_is_a_seal_error(sealer: Sealer, state: dict[str, Any]) -> None:
    """A state that is not JSON-serialisable raises SealError, not Tampered."""
    with pytest.raises(SealError) as caught:
        sealer.seal(AGENT, EPOCH, SEQ, state)
    assert not isinstance(caught.value, Tampered)


def test_circular_state_is_a_seal_error(sealer: Sealer) -> None:
    """A state that refers to itself raises SealError, not Tampered."""
    state: dict[str, Any] = {}
    state["self"] = state
    with pytest.raises(SealError) as caught:
        sealer.seal(AGENT, EPOCH, SEQ, state)
    assert not isinstance(caught.value, Tampered)


# -- secrets -----------------------------------------------------------------


def test_wrong_secret_is_not_tampered(cluster: ClusterRecord) -> None:
    """A wrong secret raises WrongSecret at Sealer construction: a SealError, not a Tampered."""
    with pytest.raises(WrongSecret) as caught:
        Sealer("not the right secret", cluster)
    assert isinstance(caught.value, SealError)
    assert not isinstance(caught.value, Tampered)
    assert not issubclass(WrongSecret, Tampered) and not issubclass(Tampered, WrongSecret)
    assert issubclass(Tampered, SealError)


def test_seven_character_secret_is_refused(cluster: ClusterRecord) -> None:
    """A 7-character secret raises SecretTooShort everywhere a secret is taken."""
    short = "1234567"
    with pytest.raises(SecretTooShort):
        check_secret(short)
    with pytest.raises(SecretTooShort):
        new_cluster_record(short)
    with pytest.raises(SecretTooShort):
        Sealer(short, cluster)
    assert issubclass(SecretTooShort, ConfigError)
    assert check_secret("12345678") == "12345678"


def flip_hex(text: str, index: int) -> str:
    """text with the hex digit at index changed."""
    chars = list(text)
    chars[index] = "1" if chars[index] == "0" else "0"
    return "".join(chars)


@pytest.mark.parametrize("index", [0, -1])
def test_edited_key_check_reads_as_wrong_secret(cluster: ClusterRecord, index: int) -> None:
    """A flipped byte in the cluster's key_check gives WrongSecret: it cannot be told apart."""
    edited = replace(cluster, key_check=flip_b64(cluster.key_check, index))
    with pytest.raises(WrongSecret):
        Sealer(SECRET, edited)


@pytest.mark.parametrize("field", ["salt", "key_id"])
@pytest.mark.parametrize("index", [0, -1])
def test_edited_salt_or_key_id_is_reported_as_a_damaged_cluster_record(
    cluster: ClusterRecord, field: str, index: int
) -> None:
    """A flipped byte in the salt or key id breaks the key id (a hash of the salt): a damaged
    record, not a wrong secret, and refused before any key is derived.
    """
    if field == "salt":
        edited = replace(cluster, salt=flip_b64(cluster.salt, index))
    else:
        edited = replace(cluster, key_id=flip_hex(cluster.key_id, index))
    with pytest.raises(SealError, match="damaged") as info:
        Sealer(SECRET, edited)
    assert not isinstance(info.value, WrongSecret)
