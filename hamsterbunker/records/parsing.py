"""Strict JSON for the records kept in a store: a missing or mistyped field is a
CorruptRecord naming what is wrong, never a KeyError deep inside the runtime."""

from __future__ import annotations

import json
import math
import re
import secrets
from dataclasses import asdict
from typing import Any, TypeVar

from ..core.errors import ConfigError, CorruptRecord
from ..core.limits import (
    MAX_JSON_DEPTH,
    MAX_NUMBER,
    MAX_RECORD_BYTES,
)

# This process's nonce, in every heartbeat it writes: a node id beating under another
# session is another process (pid and host repeat across containers and clones).
PROCESS_SESSION = secrets.token_hex(8)

# Agent and node ids become file names and key parts: keep them plain.
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def check_name(kind: str, value: str) -> str:
    """Return value if it is a valid agent or node id, else raise ConfigError."""
    if not isinstance(value, str) or not NAME_PATTERN.fullmatch(value):
        raise ConfigError(
            f"invalid {kind} {value!r}: use 1-64 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    return value


T = TypeVar("T")


def field_of(doc: dict[str, Any], name: str, kind: type[T] | tuple[type, ...], what: str) -> T:
    if name not in doc:
        raise CorruptRecord(f"{what} record has no field {name!r}")
    value = doc[name]
    # bool is an int in Python; a flipped type must not pass as a number.
    if isinstance(value, bool) and kind is not bool:
        raise CorruptRecord(f"{what} record field {name!r} has the wrong type")
    if not isinstance(value, kind):
        raise CorruptRecord(f"{what} record field {name!r} has the wrong type")
    return value  # type: ignore[return-value]


def count_of(doc: dict[str, Any], name: str, what: str, maximum: int = MAX_NUMBER) -> int:
    """A whole number field in 0..maximum."""
    value = field_of(doc, name, int, what)
    if not 0 <= value <= maximum:
        raise CorruptRecord(f"{what} record field {name!r} is outside 0..{maximum}")
    return value


def _bounded_int(text: str) -> int:
    # int() itself refuses more than sys.int_max_str_digits (4300) digits.
    value = int(text)
    if not -MAX_NUMBER <= value <= MAX_NUMBER:
        raise ValueError(f"integer {text[:24]}… is out of range")
    return value


def _finite_float(text: str) -> float:
    value = float(text)
    if value in _INFINITIES:  # (NaN is spelt out, and goes to _no_constant)
        raise ValueError(f"number {text[:24]} is not finite")
    return value


_INFINITIES = (math.inf, -math.inf)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON allows")


_DECODER = json.JSONDecoder(
    parse_int=_bounded_int, parse_float=_finite_float, parse_constant=_no_constant
)


def _depth_within(doc: Any, limit: int) -> bool:
    """Whether arrays and objects nest at most limit deep (iteratively: no recursion)."""
    stack = [(doc, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict):
            value = list(value.values())
        elif not isinstance(value, list):
            continue
        if depth > limit:
            return False
        stack.extend((item, depth + 1) for item in value if isinstance(item, dict | list))
    return True


def parse_json(data: bytes, what: str, *, limit: int = MAX_RECORD_BYTES) -> Any:
    """Parse JSON read from a store within bounds, or raise CorruptRecord naming what it was
    (never another exception): at most limit bytes, UTF-8, integers within ±MAX_NUMBER, finite
    numbers only, nested at most MAX_JSON_DEPTH deep."""
    if len(data) > limit:
        raise CorruptRecord(f"{what} is {len(data)} bytes, above the limit of {limit} bytes")
    try:
        doc = _DECODER.decode(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:  # JSONDecodeError is a ValueError
        raise CorruptRecord(f"{what} is not valid JSON: {exc}") from exc
    except RecursionError as exc:
        raise CorruptRecord(f"{what} nests deeper than {MAX_JSON_DEPTH} levels") from exc
    # Only a document with more brackets than the limit can nest deeper: most have two.
    deep = data.count(b"[") + data.count(b"{") > MAX_JSON_DEPTH
    if deep and not _depth_within(doc, MAX_JSON_DEPTH):
        raise CorruptRecord(f"{what} nests deeper than {MAX_JSON_DEPTH} levels")
    return doc


def load_object(data: bytes, what: str) -> dict[str, Any]:
    doc = parse_json(data, f"{what} record")
    if not isinstance(doc, dict):
        raise CorruptRecord(f"{what} record is not a JSON object")
    return doc


def dump_compact(obj: Any) -> bytes:
    return json.dumps(asdict(obj), separators=(",", ":"), sort_keys=True).encode()


def finite_time(value: float) -> float:
    if not math.isfinite(value):
        raise CorruptRecord("lease record field 'history' has a time that is not a number")
    return float(value)


def check_record_name(value: str) -> str:
    """A node id read from a record: CorruptRecord (not ConfigError) if it is not one."""
    if not NAME_PATTERN.fullmatch(value):
        raise CorruptRecord(f"a record names the node {value[:80]!r}, which is not a node id")
    return value
