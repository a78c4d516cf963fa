"""The one stored form of a checkpoint's description and of a lease's fence.

The Redis and etcd stores both write and read these; whatever a store writer
puts in their place reads back as a value within bounds or as CorruptRecord.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hamsterbunker.core.errors import CorruptRecord, Fenced
from hamsterbunker.core.limits import MAX_CHECKPOINT_BYTES, MAX_EPOCH
from hamsterbunker.records import CheckpointInfo
from hamsterbunker.stores.base import (
    Fence,
    describe_fence_text,
    fence_text,
    parse_fence_text,
)

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def test_a_description_reads_back_as_written() -> None:
    """CheckpointInfo.to_json read back under its seq is the same CheckpointInfo."""
    info = CheckpointInfo(epoch=3, seq=42, size=1000, written=1_700_000_000.25)
    assert CheckpointInfo.from_json(info.to_json(), 42) == info


def test_a_description_without_a_seq_reads_under_its_key() -> None:
    """A description written before the seq was kept in it takes the seq of its key."""
    data = json.dumps({"epoch": 2, "size": 5, "written": 1.0}).encode()
    assert CheckpointInfo.from_json(data, 7) == CheckpointInfo(2, 7, 5, 1.0)


@pytest.mark.parametrize(
    "doc",
    [
        {"epoch": 1, "seq": 8, "size": 1, "written": 1},  # another seq
        {"epoch": 1, "seq": "7", "size": 1, "written": 1},
        {"epoch": 1, "seq": True, "size": 1, "written": 1},
        {"epoch": 0, "size": 1, "written": 1},
        {"epoch": MAX_EPOCH + 1, "size": 1, "written": 1},
        {"epoch": True, "size": 1, "written": 1},
        {"epoch": 1, "size": -1, "written": 1},
        {"epoch": 1, "size": MAX_CHECKPOINT_BYTES + 1, "written": 1},
        {"epoch": 1, "size": 1, "written": "yesterday"},
        {"epoch": 1, "size": 1},
        [1, 7, 1, 1],
    ],
)
def test_a_description_not_as_written_is_corrupt(doc: object) -> None:
    """A description naming another seq, or with a field out of its bounds, is CorruptRecord."""
    with pytest.raises(CorruptRecord, match="checkpoint 7"):
        CheckpointInfo.from_json(json.dumps(doc).encode(), 7)


@FUZZ
@given(data=st.binary(max_size=200))
def test_any_bytes_are_a_description_within_bounds_or_corrupt(data: bytes) -> None:
    """Any bytes: a CheckpointInfo within the limits, or CorruptRecord."""
    try:
        info = CheckpointInfo.from_json(data, 7)
    except CorruptRecord:
        return
    assert info.seq == 7 and 0 < info.epoch <= MAX_EPOCH
    assert 0 <= info.size <= MAX_CHECKPOINT_BYTES


def test_a_fence_reads_back_as_written() -> None:
    """A writer's fence and a released lease's both parse back to what was written."""
    fence = Fence("n1", "s1", 4)
    assert parse_fence_text(fence.to_text().encode()) == ("n1", "s1", 4)
    assert fence.to_text() == fence_text("n1", "s1", 4)
    assert parse_fence_text(fence_text(None, "s1", 4).encode()) == (None, "s1", 4)
    assert fence_text(None, "s1", 4) != fence.to_text()  # no writer's fence is a released one


@pytest.mark.parametrize(
    "stored, words",
    [
        (None, "no lease"),
        (fence_text("n2", "s2", 5).encode(), "epoch 5 held by n2"),
        (fence_text(None, "s2", 5).encode(), "epoch 5 released"),
        (b'["n2", "s2", "five"]', "an unreadable fence"),
        (b'["n2", 3, 5]', "an unreadable fence"),
        (b'["n2", "s2", %d]' % (MAX_EPOCH + 1), "an unreadable fence"),
        (b"[1,", "an unreadable fence"),
        (b"", "an unreadable fence"),
    ],
)
def test_a_stored_fence_is_told_in_words(stored: bytes | None, words: str) -> None:
    """A Fenced message says whose the lease is now, or that its fence is unreadable."""
    assert describe_fence_text(stored) == words
    refused = Fence("n1", "s1", 4).refused(9, describe_fence_text(stored))
    assert isinstance(refused, Fenced)
    assert str(refused) == f"checkpoint 9 of n1 under epoch 4 refused: the lease is now {words}"


@FUZZ
@given(data=st.binary(max_size=200))
def test_any_bytes_are_a_fence_within_bounds_or_corrupt(data: bytes) -> None:
    """Any bytes: (holder, session, epoch) of the right types and range, or CorruptRecord."""
    try:
        holder, session, epoch = parse_fence_text(data)
    except CorruptRecord:
        return
    assert holder is None or isinstance(holder, str)
    assert isinstance(session, str) and 0 <= epoch <= MAX_EPOCH
