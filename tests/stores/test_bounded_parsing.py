"""Everything read from a store is parsed within bounds (DESIGN.md invariant 10, issue 12 case 1).

Whatever bytes or JSON a store writer without the secret puts in a record, the
parsers raise CorruptRecord (Tampered for a checkpoint, ConfigError for a
node's memory file) or return a record whose every field has its type and
range: never OverflowError, RecursionError, TypeError or a hang.
"""

from __future__ import annotations

import dataclasses
import json
import struct
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hamsterbunker.core.errors import ConfigError, CorruptRecord, SealError, Tampered
from hamsterbunker.core.limits import MAX_EPOCH, MAX_LEASE_TTL_MS, MAX_RECORD_BYTES, MAX_SEQ
from hamsterbunker.lease.memory import MemoryFile
from hamsterbunker.records import ClusterRecord, Event, Heartbeat, LeaseRecord, parse_json
from hamsterbunker.sealing import Sealer, new_cluster_record, read_header

SECRET = "correct-horse-battery-staple"
RECORDS = [ClusterRecord, LeaseRecord, Heartbeat, Event]
FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

HOSTILE = {
    "infinity": b'{"epoch": Infinity}',
    "nan": b'{"epoch": NaN}',
    "overflowing-float": b'{"epoch": 1e999}',
    "400-digit-integer": b'{"epoch": 1' + b"0" * 400 + b"}",
    "5000-digit-integer": b'{"epoch": ' + b"9" * 5000 + b"}",
    "60000-nested-arrays": b"[" * 60_000,
    "60000-nested-objects": b'{"a":' * 60_000,
    "17-nested-arrays": b'{"detail": ' + b"[" * 17 + b"]" * 17 + b"}",
    "not-utf8": b'{"epoch": "\xff"}',
    "too-large": b'{"pad": "' + b"x" * MAX_RECORD_BYTES + b'"}',
}


@pytest.mark.parametrize("data", list(HOSTILE.values()), ids=list(HOSTILE))
def test_hostile_json_is_a_corrupt_record(data: bytes) -> None:
    """Non-finite numbers, integers beyond range, deep nesting, bad UTF-8 and oversize records
    are CorruptRecord, and so is each record kind built from them."""
    with pytest.raises(CorruptRecord):
        parse_json(data, "test record")
    for kind in RECORDS:
        with pytest.raises(CorruptRecord):
            kind.from_json(data)


@pytest.mark.parametrize("data", list(HOSTILE.values()), ids=list(HOSTILE))
def test_a_hostile_checkpoint_header_is_tampered(data: bytes) -> None:
    """The unauthenticated checkpoint header is parsed with the same bounds: Tampered."""
    header = data[:65_535]
    blob = struct.pack(">4sBH", b"HBCP", 1, len(header)) + header + bytes(28)
    with pytest.raises(Tampered):
        read_header(blob)


def json_values() -> st.SearchStrategy[Any]:
    scalars = (
        st.none()
        | st.booleans()
        | st.integers()
        | st.integers(min_value=-(2**70), max_value=2**70)
        | st.floats(allow_nan=False, allow_infinity=False)
        | st.text(max_size=20)
    )
    return st.recursive(
        scalars,
        lambda inner: (
            st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=5)
        ),
        max_leaves=30,
    )


def record_like(kind: type) -> st.SearchStrategy[dict[str, Any]]:
    """Dicts with the record's field names (so parsing goes deep) holding any JSON value."""
    names = [f.name for f in dataclasses.fields(kind)]
    return st.dictionaries(st.sampled_from(names), json_values(), max_size=len(names))


def assert_in_bounds(record: Any) -> None:
    for f in dataclasses.fields(record):
        value = getattr(record, f.name)
        if isinstance(value, int) and not isinstance(value, bool):
            assert 0 <= value <= 2**63 - 1, (f.name, value)
        if isinstance(value, float):
            assert value == value and abs(value) != float("inf"), (f.name, value)
    if isinstance(record, LeaseRecord):
        assert record.epoch <= MAX_EPOCH and record.seq <= MAX_SEQ
        assert 0 < record.ttl_ms <= MAX_LEASE_TTL_MS


@FUZZ
@given(kind=st.sampled_from(RECORDS), data=st.binary(max_size=200))
def test_arbitrary_bytes_parse_or_are_corrupt(kind: type, data: bytes) -> None:
    """Any bytes: a record within bounds, or CorruptRecord."""
    try:
        record = kind.from_json(data)
    except CorruptRecord:
        return
    assert_in_bounds(record)


@FUZZ
@given(data=st.data())
def test_arbitrary_json_in_a_records_fields_parses_or_is_corrupt(data: st.DataObject) -> None:
    """Any JSON value in any field of any record kind: a record within bounds, or CorruptRecord."""
    kind = data.draw(st.sampled_from(RECORDS))
    doc = data.draw(record_like(kind))
    try:
        record = kind.from_json(json.dumps(doc).encode())
    except CorruptRecord:
        return
    assert_in_bounds(record)


@pytest.mark.parametrize("data", list(HOSTILE.values()), ids=list(HOSTILE))
def test_a_hostile_memory_file_is_a_clear_config_error(tmp_path: Path, data: bytes) -> None:
    """A node's memory file holding hostile JSON stops the node with one clear ConfigError
    naming the file, never a RecursionError or an OverflowError."""
    memory = MemoryFile(tmp_path, "file:///store", "agent")
    memory.path.write_bytes(data)
    with pytest.raises(ConfigError, match="memory"):
        memory.load()


# -- case 9: scrypt parameters from the store ------------------------------------------------------

GOOD = new_cluster_record(SECRET)


@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    "n, r, p",
    [(2**40, 8, 1), (2**15, 2**20, 1), (2**15, 8, 10**6), (2**10, 8, 1), (2**15 + 1, 8, 1)],
    ids=["huge-n", "huge-r", "huge-p", "weak-n", "n-not-a-power-of-two"],
)
def test_scrypt_parameters_outside_the_bounds_are_refused_at_once(n: int, r: int, p: int) -> None:
    """Key parameters in the (unauthenticated) cluster record that would hang a node at start,
    eat its memory, or weaken the key are refused with a SealError naming them, at once."""
    started = time.monotonic()
    with pytest.raises(SealError, match="outside the bounds"):
        Sealer(SECRET, dataclasses.replace(GOOD, n=n, r=r, p=p))
    assert time.monotonic() - started < 1.0


def test_default_scrypt_parameters_are_within_the_bounds() -> None:
    """The parameters a new cluster gets pass the bounds (and the key check)."""
    Sealer(SECRET, GOOD)
