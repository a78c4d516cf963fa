"""A checkpoint on a store that keeps a chain per node is bound to the node that wrote it
(DESIGN.md invariant 5, docs/syncdir.md): the sealed header names the node, as associated
data, and the opener says which node's chain it read the checkpoint from.

A checkpoint sealed without a node (every other store) is byte for byte what it was
before the field existed: the digests below were made by the code before it.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import time
from typing import Any

import pytest

from hamsterbunker import sealing
from hamsterbunker.core.errors import SealError, Tampered
from hamsterbunker.records import ClusterRecord
from hamsterbunker.sealing import Sealer, new_cluster_record, read_header

SECRET = "correct horse battery staple"
AGENT, EPOCH, SEQ = "agent-1", 3, 17
STATE: dict[str, Any] = {
    "count": 41,
    "notes": ["naïve", "日本語"],
    "nested": {"ok": True, "pi": 3.25},
}
MARKS = {"next": 4}
BIG = {"data": "x" * (3 * 1024 * 1024)}  # sealed in several pieces by seal_pieces
FIXED_TIME = 1_800_000_000.25


def fixed_urandom(n: int) -> bytes:
    return bytes(range(7, 7 + n))


@pytest.fixture(scope="module")
def cluster() -> ClusterRecord:
    return new_cluster_record(SECRET)


@pytest.fixture(scope="module")
def sealer(cluster: ClusterRecord) -> Sealer:
    return Sealer(SECRET, cluster)


@pytest.fixture
def fixed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every nonce and salt the same bytes, the time one instant: seals repeat exactly."""
    monkeypatch.setattr(os, "urandom", fixed_urandom)
    monkeypatch.setattr(time, "time", lambda: FIXED_TIME)


def header_doc(blob: bytes) -> dict[str, Any]:
    (length,) = struct.unpack_from(">H", blob, 5)
    doc = json.loads(blob[7 : 7 + length])
    assert isinstance(doc, dict)
    return doc


# -- round trip -------------------------------------------------------------------------


@pytest.mark.parametrize("node", ["A", "node-b.example"])
def test_a_checkpoint_sealed_for_a_node_opens_in_that_nodes_chain(
    sealer: Sealer, node: str
) -> None:
    blob = sealer.seal(AGENT, EPOCH, SEQ, STATE, inbox=MARKS, node=node)
    assert sealer.open_checkpoint(blob, AGENT, EPOCH, SEQ, node) == (STATE, MARKS)
    assert sealer.open(blob, AGENT, EPOCH, SEQ, node=node) == STATE
    assert read_header(blob).node == node
    assert header_doc(blob)["node"] == node


def test_pieces_open_with_their_node_too(sealer: Sealer) -> None:
    for state in (STATE, BIG):
        blob = bytes(sealer.seal_pieces(AGENT, EPOCH, SEQ, state, inbox=MARKS, node="A"))
        assert sealer.open_checkpoint(blob, AGENT, EPOCH, SEQ, "A") == (state, MARKS)
        with pytest.raises(Tampered, match="node 'A'"):
            sealer.open(blob, AGENT, EPOCH, SEQ, node="B")


@pytest.mark.usefixtures("fixed")
@pytest.mark.parametrize("state", [STATE, BIG], ids=["one-shot", "in-pieces"])
def test_pieces_and_one_shot_agree_with_a_node(sealer: Sealer, state: dict[str, Any]) -> None:
    """With the same time and nonce, seal_pieces joins to exactly seal()'s bytes."""
    one = sealer.seal(AGENT, EPOCH, SEQ, state, inbox=MARKS, node="A")
    pieces = sealer.seal_pieces(AGENT, EPOCH, SEQ, state, inbox=MARKS, node="A")
    joined = bytes(pieces)
    assert joined == one
    assert len(pieces) == len(one)
    assert header_doc(one)["node"] == "A"


# -- every mismatch refused -------------------------------------------------------------


def test_a_checkpoint_of_another_nodes_chain_is_refused(sealer: Sealer) -> None:
    blob = sealer.seal(AGENT, EPOCH, SEQ, STATE, node="A")
    with pytest.raises(Tampered, match=r"sealed into node 'A'.*found in node 'B'.*copied"):
        sealer.open(blob, AGENT, EPOCH, SEQ, node="B")


def test_a_checkpoint_naming_a_node_is_refused_where_none_is_expected(sealer: Sealer) -> None:
    blob = sealer.seal(AGENT, EPOCH, SEQ, STATE, node="A")
    with pytest.raises(Tampered, match=r"node 'A'.*store without chains"):
        sealer.open(blob, AGENT, EPOCH, SEQ)
    with pytest.raises(Tampered, match="store without chains"):
        sealer.open_checkpoint(blob, AGENT, EPOCH, SEQ, None)


def test_a_checkpoint_naming_no_node_is_refused_in_a_chain(sealer: Sealer) -> None:
    blob = sealer.seal(AGENT, EPOCH, SEQ, STATE)
    with pytest.raises(Tampered, match=r"names no node but was found in node 'A'"):
        sealer.open(blob, AGENT, EPOCH, SEQ, node="A")


def test_the_other_bindings_still_hold_with_a_node(sealer: Sealer) -> None:
    blob = sealer.seal(AGENT, EPOCH, SEQ, STATE, node="A")
    with pytest.raises(Tampered, match="belongs to agent"):
        sealer.open(blob, "agent-2", EPOCH, SEQ, node="A")
    with pytest.raises(Tampered, match="replayed"):
        sealer.open(blob, AGENT, EPOCH, SEQ + 1, node="A")


def test_the_node_is_authenticated_an_edited_one_fails(sealer: Sealer) -> None:
    """The header is the associated data: naming another node (same length, so only that
    changes) breaks the tag, so the binding cannot be moved by editing the bytes."""
    blob = sealer.seal(AGENT, EPOCH, SEQ, STATE, node="A")
    edited = blob.replace(b'"node":"A"', b'"node":"B"', 1)
    assert edited != blob and read_header(edited).node == "B"
    with pytest.raises(Tampered, match="failed to authenticate"):
        sealer.open(edited, AGENT, EPOCH, SEQ, node="B")
    # Nor can it be dropped: the header without it (length fixed up) fails as well.
    doc = header_doc(blob)
    del doc["node"]
    header = json.dumps(doc, separators=(",", ":")).encode()
    (length,) = struct.unpack_from(">H", blob, 5)
    stripped = blob[:5] + struct.pack(">H", len(header)) + header + blob[7 + length :]
    assert read_header(stripped).node is None
    with pytest.raises(Tampered, match="failed to authenticate"):
        sealer.open(stripped, AGENT, EPOCH, SEQ)


@pytest.mark.parametrize("bad", [5, "", None, ["A"]])
def test_a_mistyped_node_in_a_header_is_damage(sealer: Sealer, bad: object) -> None:
    blob = sealer.seal(AGENT, EPOCH, SEQ, STATE, node="A")
    doc = {**header_doc(blob), "node": bad}
    header = json.dumps(doc, separators=(",", ":")).encode()
    (length,) = struct.unpack_from(">H", blob, 5)
    forged = blob[:5] + struct.pack(">H", len(header)) + header + blob[7 + length :]
    with pytest.raises(Tampered, match="field 'node'"):
        read_header(forged)
    with pytest.raises(Tampered, match="field 'node'"):
        sealer.open(forged, AGENT, EPOCH, SEQ, node="A")


@pytest.mark.parametrize("bad", ["", 5])
def test_sealing_for_an_empty_or_mistyped_node_is_refused(sealer: Sealer, bad: Any) -> None:
    with pytest.raises(SealError, match="node"):
        sealer.seal(AGENT, EPOCH, SEQ, STATE, node=bad)
    with pytest.raises(SealError, match="node"):
        sealer.seal_pieces(AGENT, EPOCH, SEQ, STATE, node=bad)


# -- without a node: as before ----------------------------------------------------------


def test_a_checkpoint_without_node_opens_as_before(sealer: Sealer) -> None:
    blob = sealer.seal(AGENT, EPOCH, SEQ, STATE, inbox=MARKS)
    assert sealer.open_checkpoint(blob, AGENT, EPOCH, SEQ) == (STATE, MARKS)
    assert read_header(blob).node is None
    assert list(header_doc(blob)) == ["kid", "agent", "epoch", "seq", "time", "inbox"]
    plain = bytes(sealer.seal_pieces(AGENT, EPOCH, SEQ, STATE))
    assert list(header_doc(plain)) == ["kid", "agent", "epoch", "seq", "time"]
    assert sealer.open(plain, AGENT, EPOCH, SEQ) == STATE


@pytest.mark.usefixtures("fixed")
def test_a_seal_without_node_gives_the_same_bytes_as_before() -> None:
    """A cluster made from fixed salt bytes, sealed at a fixed time under a fixed nonce:
    the digests of what the code before the node field gave for the same calls."""
    fixed_sealer = Sealer(SECRET, new_cluster_record(SECRET))
    blobs = [
        fixed_sealer.seal(AGENT, EPOCH, SEQ, STATE),
        fixed_sealer.seal(AGENT, EPOCH, SEQ, STATE, inbox=MARKS),
        bytes(fixed_sealer.seal_pieces(AGENT, EPOCH, SEQ, BIG, inbox=MARKS)),
    ]
    assert [hashlib.sha256(blob).hexdigest() for blob in blobs] == [
        "dedd7349c0502ec9220572e71a0e1a49aeb4a20d2b3bc6ca01881af6cff2d5c5",
        "04eae4d30d06f05c59c8470e3fb9bf1e35fb034e2e1a00ca1ca869f2c038ad3f",
        "0ee9af05392ceb3237d708af57db209488edb7715b8d3303c75d540465507c34",
    ]
    assert blobs[0][:7] == b"HBCP\x01\x00T"  # format version 1, as before


# -- re-sealing keeps the node ----------------------------------------------------------


def test_a_reseal_keeps_the_node_a_checkpoint_names(sealer: Sealer) -> None:
    blob = sealer.seal(AGENT, EPOCH, SEQ, STATE, inbox=MARKS, sealed_at=FIXED_TIME, node="A")
    again = sealer.reseal_checkpoint(blob, AGENT, EPOCH, SEQ)
    assert again != blob and len(again) == len(blob)
    assert read_header(again).node == "A" and read_header(again).time == FIXED_TIME
    assert sealer.open_checkpoint(again, AGENT, EPOCH, SEQ, "A") == (STATE, MARKS)
    with pytest.raises(Tampered):
        sealer.open(again, AGENT, EPOCH, SEQ, node="B")
    with pytest.raises(Tampered):
        sealer.open(again, AGENT, EPOCH, SEQ)


def test_a_reseal_of_a_checkpoint_without_node_names_none(sealer: Sealer) -> None:
    blob = sealer.seal(AGENT, EPOCH, SEQ, STATE)
    again = sealer.reseal_checkpoint(blob, AGENT, EPOCH, SEQ)
    assert read_header(again).node is None and "node" not in header_doc(again)
    assert sealer.open(again, AGENT, EPOCH, SEQ) == STATE


# -- effect-journal records ---------------------------------------------------------------


def _effect_header(blob: bytes) -> dict[str, Any]:
    return json.loads(blob[5 + 2 : 5 + 2 + struct.unpack_from(">H", blob, 5)[0]])


def test_an_effect_record_sealed_for_a_node_opens_only_in_that_nodes_journal(
    sealer: Sealer,
) -> None:
    """A record copied from one node's journal into another's (same agent, step, index,
    kind, epoch) does not open there, nor where no node is expected, nor the reverse."""
    at = sealing.EffectAt("agent-a", 3, 0, "outcome", "search", node="laptop")
    blob = sealer.seal_effect(at, 7, {"replay": "safe", "outcome": 42})
    opened = sealer.open_effect(blob, sealing.EffectAt("agent-a", 3, 0, "outcome", node="laptop"))
    assert (opened.epoch, opened.name, opened.payload["outcome"]) == (7, "search", 42)
    for where in ("server", None):
        with pytest.raises(Tampered, match="sealed as"):
            sealer.open_effect(blob, sealing.EffectAt("agent-a", 3, 0, "outcome", node=where))
    plain = sealer.seal_effect(sealing.EffectAt("agent-a", 3, 0, "outcome", "search"), 7, {})
    with pytest.raises(Tampered, match="sealed as"):
        sealer.open_effect(plain, sealing.EffectAt("agent-a", 3, 0, "outcome", node="laptop"))


def test_an_effect_record_without_a_node_has_the_header_it_always_had(sealer: Sealer) -> None:
    blob = sealer.seal_effect(sealing.EffectAt("agent-a", 3, 0, "intent", "search"), 7, {})
    assert set(_effect_header(blob)) == {"kid", "agent", "seq", "index", "kind", "name", "epoch"}
    with_node = sealing.EffectAt("agent-a", 3, 0, "intent", "search", node="laptop")
    assert _effect_header(sealer.seal_effect(with_node, 7, {}))["node"] == "laptop"
