"""A sealed state comes back exactly as the standard library's JSON would give it back.

``Sealer.seal`` encodes the state with orjson when that cannot change what
``Sealer.open`` returns, and with ``json.dumps`` otherwise
(``hamsterbunker.core.state_json``). These tests hold every state, plain or not, to
the standard library's result: the same values of the same types (NaN included,
the sign of zero, the order of keys), or the same SealError. Checkpoints sealed
before the change open with this version, and those sealed now open with the
reader every version has.
"""

from __future__ import annotations

import base64
import collections
import dataclasses
import datetime
import enum
import json
import math
import uuid
from typing import Any

import orjson
import pytest
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from hypothesis import given, settings
from hypothesis import strategies as st

from hamsterbunker.core import state_json
from hamsterbunker.core.errors import SealError
from hamsterbunker.records import ClusterRecord
from hamsterbunker.sealing import Sealer, new_cluster_record, read_header
from hamsterbunker.sealing.cluster_keys import master_key, subkey

SECRET = "correct horse battery staple"
AGENT, EPOCH, SEQ = "agent-1", 3, 17


@pytest.fixture(scope="module")
def cluster() -> ClusterRecord:
    return new_cluster_record(SECRET)


@pytest.fixture(scope="module")
def sealer(cluster: ClusterRecord) -> Sealer:
    return Sealer(SECRET, cluster)


def same(a: Any, b: Any) -> bool:
    """Equal in value and type all the way down: NaN is NaN, -0.0 is not 0.0, key order counts."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        if math.isnan(a):
            return math.isnan(b)
        return a == b and math.copysign(1, a) == math.copysign(1, b)
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(map(same, a, b))
    return bool(a == b)


def stdlib_result(body: Any) -> Any:
    """What the standard library's JSON gives back for body (json.loads of json.dumps)."""
    return json.loads(state_json.encode_with_stdlib(body).decode("utf-8"))


def stdlib_refusal(body: Any, state: Any) -> str | None:
    """The SealError message seal gives (the standard library's error, and where in the
    state it is), or None if the body is sealable."""
    try:
        state_json.encode_with_stdlib(body)
    except (TypeError, ValueError) as exc:
        return f"agent state is not JSON-serialisable at {state_json.not_json_at(state)}: {exc}"
    return None


def assert_seals_as_stdlib(sealer: Sealer, state: dict[str, Any], inbox: Any = None) -> None:
    """seal + open_checkpoint gives what the standard library gives, or refuses as it did."""
    body = state if inbox is None else {"state": state, "inbox": inbox}
    refusal = stdlib_refusal(body, state)
    if refusal is not None:
        with pytest.raises(SealError) as caught:
            sealer.seal(AGENT, EPOCH, SEQ, state, inbox=inbox)
        assert str(caught.value) == refusal
        return
    blob = sealer.seal(AGENT, EPOCH, SEQ, state, inbox=inbox)
    opened, marks = sealer.open_checkpoint(blob, AGENT, EPOCH, SEQ)
    expected = stdlib_result(body)
    if inbox is None:
        assert same(opened, expected), (opened, expected)
        assert marks is None
    else:
        assert same(opened, expected["state"]), (opened, expected)
        assert same(marks, expected["inbox"]), (marks, expected)


class Colour(enum.Enum):
    RED = "red"


class Level(enum.IntEnum):
    HIGH = 3


class Name(enum.StrEnum):
    ALICE = "alice"


class Reprless(int):
    def __repr__(self) -> str:
        return "not a number"


class Shouty(str):
    def __str__(self) -> str:
        return "SHOUT"


class Items(dict):  # type: ignore[type-arg]
    def items(self) -> Any:
        return [("replaced", True)]


@dataclasses.dataclass
class Point:
    x: int
    y: int


Pair = collections.namedtuple("Pair", "left right")

NAN, INF = float("nan"), float("inf")

# Where orjson alone would write something else than the standard library, or refuse:
# each of these is encoded by the standard library itself (or refused as it refuses).
NOT_PLAIN: dict[str, Any] = {
    "nan": NAN,
    "infinity": INF,
    "-infinity": -INF,
    "nan in a list": [1.5, NAN],
    "infinity in a tuple": (1, (2, -INF)),
    "nan deep in dicts": {"a": [{"b": {"c": [NAN]}}]},
    "uuid": uuid.UUID(int=5),
    "uuid in a list": ["x", uuid.UUID(int=6)],
    "enum": Colour.RED,
    "int enum": Level.HIGH,
    "str enum": Name.ALICE,
    "enum as a key": {Name.ALICE: 1},
    "orjson fragment": orjson.Fragment(b'{"raw":1}'),
    "datetime": datetime.datetime(2026, 12, 2, 9, 0),
    "date": datetime.date(2026, 12, 2),
    "time": datetime.time(9, 0),
    "dataclass": Point(1, 2),
    "namedtuple": Pair(1, "two"),
    "int keys": {1: "one", 2: "two"},
    "float, bool and None keys": {1.5: "a", True: "b", None: "c"},
    "int key beside its string": {1: "int", "1": "str"},
    "big int": 2**64,
    "big negative int": -(2**63) - 1,
    "huge int": 10**40,
    "int subclass with its own repr": Reprless(7),
    "str subclass": Shouty("quiet"),
    "str subclass key": {Shouty("key"): 1},
    "dict subclass with its own items": Items(kept=1),
    "ordered dict": collections.OrderedDict([("b", 1), ("a", 2)]),
    "list subclass": type("Many", (list,), {})([1, 2]),
    "float subclass": type("Ratio", (float,), {})(0.5),
    "bytes": b"bytes",
    "set": {1, 2},
    "object": object(),
    "lone surrogate": "\ud800",
    "surrogate key": {"\udfff": 1},
    "deeper than orjson goes": json.loads("[" * 300 + "]" * 300),
}
# Plain values whose text orjson may write otherwise than the standard library.
PLAIN_EDGES: dict[str, Any] = {
    "tuple": (1, "two", None),
    "u64 max": 2**64 - 1,
    "i64 min": -(2**63),
    "negative zero": -0.0,
    "float that looks whole": 1.0,
    "floats with exponents": [1e16, 1e-7, 5e-324, 1.7976931348623157e308, 0.1 + 0.2],
    "control characters": '\x00\x1f\x7f\u2028\u2029"\\/',
    "true and one": [True, 1, 1.0, False, 0, 0.0],
}
EVERY = {**NOT_PLAIN, **PLAIN_EDGES}


@pytest.mark.parametrize("value", EVERY.values(), ids=EVERY.keys())
def test_special_values_seal_and_open_as_with_the_stdlib(sealer: Sealer, value: Any) -> None:
    """A value orjson could treat otherwise comes back as the stdlib gives it, or is refused alike."""
    assert_seals_as_stdlib(sealer, {"v": value})


@pytest.mark.parametrize("value", EVERY.values(), ids=EVERY.keys())
def test_special_values_in_the_inbox_marks_too(sealer: Sealer, value: Any) -> None:
    """The state and its inbox marks, sealed together, both come back as the stdlib gives them."""
    assert_seals_as_stdlib(sealer, {"v": value, "n": [NAN]}, inbox={"consumed": [1], "v": value})
    assert_seals_as_stdlib(sealer, {"v": value}, inbox={"consumed": [2], "v": [value]})


@pytest.mark.parametrize("value", NOT_PLAIN.values(), ids=NOT_PLAIN.keys())
def test_values_not_plain_take_the_stdlib_bytes(value: Any) -> None:
    """Anything not plain is encoded by the standard library itself, byte for byte, or refused alike."""
    try:
        expected = state_json.encode_with_stdlib({"v": value})
    except (TypeError, ValueError) as exc:
        with pytest.raises(type(exc)) as caught:
            state_json.encode({"v": value})
        assert str(caught.value) == str(exc)
    else:
        assert state_json.encode({"v": value}) == expected


@pytest.mark.parametrize("value", PLAIN_EDGES.values(), ids=PLAIN_EDGES.keys())
def test_plain_values_take_orjsons_bytes(value: Any) -> None:
    """A plain value is encoded by orjson (and read back as the stdlib's, as the tests above show)."""
    assert state_json.encode({"v": value}) == orjson.dumps({"v": value})


def test_circular_state_is_refused_as_before(sealer: Sealer) -> None:
    """A state that contains itself is the stdlib's SealError (orjson's recursion error is not shown)."""
    state: dict[str, Any] = {"list": []}
    state["list"].append(state)
    assert_seals_as_stdlib(sealer, state)


def test_a_plain_state_takes_the_fast_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """A state of plain JSON types alone never reaches the standard library's encoder."""
    state = {"text": "naïve 🐹", "n": [1, -2, 2**63], "f": [0.5, -0.0], "t": (True, None), "d": {}}

    def refuse(obj: Any) -> bytes:
        raise AssertionError("the standard library encoder was used")

    monkeypatch.setattr(state_json, "encode_with_stdlib", refuse)
    assert state_json.encode(state) == orjson.dumps(state)


# -- any state -------------------------------------------------------------------------------

SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats()
    | st.text()
)
KEYS = st.text() | st.integers() | st.booleans() | st.none() | st.floats(allow_nan=False)
VALUES = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=5)
        | st.lists(inner, max_size=5).map(tuple)
        | st.dictionaries(st.text(max_size=5), inner, max_size=5)
        | st.dictionaries(KEYS, inner, max_size=3)
    ),
    max_leaves=30,
)


@settings(max_examples=400, deadline=None)
@given(state=st.dictionaries(st.text(max_size=8), VALUES, max_size=6))
def test_any_state_opens_as_the_stdlib_gives_it_back(sealer: Sealer, state: dict[str, Any]) -> None:
    """For any JSON-ish state, open(seal(s)) is json.loads(json.dumps(s)), value and type."""
    assert_seals_as_stdlib(sealer, state)


@settings(max_examples=200, deadline=None)
@given(
    state=st.dictionaries(st.text(max_size=8), VALUES, max_size=4),
    marks=st.dictionaries(st.text(max_size=8), VALUES, max_size=3),
)
def test_any_state_with_inbox_marks_opens_as_the_stdlib_gives_it_back(
    sealer: Sealer, state: dict[str, Any], marks: dict[str, Any]
) -> None:
    """The {"state", "inbox"} wrapper holds the same for both its parts."""
    assert_seals_as_stdlib(sealer, state, inbox=marks)


PLAIN = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: (
        st.lists(inner, max_size=5)
        | st.lists(inner, max_size=5).map(tuple)
        | st.dictionaries(st.text(max_size=5), inner, max_size=5)
    ),
    max_leaves=30,
)


@settings(max_examples=400, deadline=None)
@given(value=PLAIN)
def test_orjson_and_stdlib_bytes_of_a_plain_value_read_back_alike(value: Any) -> None:
    """For plain values encode takes orjson's bytes, and json.loads reads them as the stdlib's."""
    fast = state_json.encode(value)
    assert fast == orjson.dumps(value)
    assert same(json.loads(fast), stdlib_result(value))


# -- old and new checkpoints -----------------------------------------------------------------

# Sealed by the code before orjson (plaintext json.dumps(...).encode()), under this record.
OLD_CLUSTER = ClusterRecord(
    format=1,
    kdf="scrypt",
    n=32768,
    r=8,
    p=1,
    salt="GnV7HjEJmMD4O/QccvWXsw==",
    key_id="8e473767927c9cda",
    key_check="zpomspZ6yrvhxsNJDLKDSw==",
    created=1796202530.15843,
)
# seal("agent-1", 3, 17, {"count": 41, "pi": 3.25, "notes": ["日本語"]})
OLD_PLAIN = bytes.fromhex(
    "484243500100537b226b6964223a2238653437333736373932376339636461222c226167656e74223a226167"
    "656e742d31222c2265706f6368223a332c22736571223a31372c2274696d65223a313730303030303030302e"
    "307d6d829f43a97073aff84e04d6090474f4bf3fce54dec39021bc22a826b86a89982987b3d53aaa4ac7ef2d"
    "b6ea4370a1cc60ee8b1cb599f5dca04ab08b23821444d8522bc8284dd2c2"
)
# seal("agent-1", 3, 18, OLD_SPECIAL_STATE, inbox={"consumed": [1, 2, 3]})
OLD_SPECIAL = bytes.fromhex(
    "4842435001005d7b226b6964223a2238653437333736373932376339636461222c226167656e74223a226167"
    "656e742d31222c2265706f6368223a332c22736571223a31382c2274696d65223a313730303030303030312e"
    "302c22696e626f78223a317d11e6799119dce0a4e1ccf80577beb7c1b2579156a669c1ab3c3ef62a176c1f6c"
    "1f4f43c391ba7ef728ead8cdfb8ca7e3f995acc8e10b8f1d231b0a6208085ceb02f13024b30c7a090f098668"
    "53fd2fba0d307d98db9692327b5980b3230f0a69bca7804bb73b60265a02bd5d5d69e163981995406bdc58e4"
    "e04e48ec3cb28a16116e9ec13a8e1700eb6b4ab7aa806d537bc607d5777c4869b71c99afae95d77abda3cb58"
    "d59acafeb57d241367cf9215ec6041af8838a7e0dfacd417a0de65a255d3a35c0a6e07d14fd6b493f59d912d"
    "5f18b2820d"
)
OLD_SPECIAL_STATE: dict[str, Any] = {
    "n": NAN,
    "inf": [INF, -INF],
    "big": 2**80,
    "neg0": -0.0,
    "text": "naïve 🐹\u2028",
    "t": (1, 2.5),
    "k": {1: "one", None: "none"},
}


@pytest.fixture(scope="module")
def old_sealer() -> Sealer:
    return Sealer(SECRET, OLD_CLUSTER)


def test_checkpoints_sealed_before_orjson_open_as_they_did(old_sealer: Sealer) -> None:
    """Checkpoints the previous version sealed (plain, and NaN, big ints, inbox marks) open alike."""
    assert same(
        old_sealer.open(OLD_PLAIN, AGENT, 3, 17), {"count": 41, "pi": 3.25, "notes": ["日本語"]}
    )
    state, marks = old_sealer.open_checkpoint(OLD_SPECIAL, AGENT, 3, 18)
    assert same(state, stdlib_result(OLD_SPECIAL_STATE))
    assert same(marks, {"consumed": [1, 2, 3]})


def test_checkpoints_sealed_now_reseal_as_before(old_sealer: Sealer) -> None:
    """An old checkpoint re-sealed now (a key rotation's step) keeps its state, NaN and all."""
    header = read_header(OLD_SPECIAL)
    again = old_sealer.reseal_checkpoint(OLD_SPECIAL, AGENT, 3, 18)
    state, marks = old_sealer.open_checkpoint(again, AGENT, 3, 18)
    assert same(state, stdlib_result(OLD_SPECIAL_STATE))
    assert same(marks, {"consumed": [1, 2, 3]})
    assert read_header(again).time == header.time


def old_reader(sealer: Sealer, blob: bytes) -> Any:
    """What every version's open does with a checkpoint's plaintext: json.loads of its UTF-8."""
    cluster = sealer.cluster
    salt = base64.b64decode(cluster.salt)
    key = subkey(master_key(SECRET, salt, cluster.n, cluster.r, cluster.p), b"checkpoint", 32)
    prefix_len = 7 + int.from_bytes(blob[5:7], "big")
    nonce = blob[prefix_len : prefix_len + 12]
    plaintext = AESGCM(key).decrypt(nonce, blob[prefix_len + 12 :], blob[:prefix_len])
    return json.loads(plaintext.decode("utf-8"))


@pytest.mark.parametrize(
    "state",
    [{"count": 41, "notes": ["日本語", "🐹"], "pi": 3.25, "t": (1, None)}, OLD_SPECIAL_STATE],
    ids=["plain", "special"],
)
def test_checkpoints_sealed_now_open_with_the_old_reader(
    old_sealer: Sealer, state: dict[str, Any]
) -> None:
    """A checkpoint sealed now is standard JSON to the reader of earlier versions."""
    blob = old_sealer.seal(AGENT, 3, 19, state)
    assert same(old_reader(old_sealer, blob), stdlib_result(state))


@pytest.mark.parametrize(
    ("state", "where"),
    [
        ({"when": {"at": object()}}, "state['when']['at'] (of type object)"),
        ({"ok": [1, 2, {"bad": {1, 2}}]}, "state['ok'][2]['bad'] (of type set)"),
        ({"k": {(1, 2): "tuple key"}}, "state['k'] (a key of type tuple)"),
        ({"raw": b"bytes", "later": object()}, "state['raw'] (of type bytes)"),  # the first
    ],
    ids=["nested", "in-a-list", "bad-key", "first-of-two"],
)
def test_not_json_at_names_the_path_of_the_value_json_cannot_encode(
    state: dict[str, Any], where: str
) -> None:
    assert state_json.not_json_at(state) == where
