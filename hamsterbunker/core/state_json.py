"""Agent state as compact JSON bytes, exactly as ``json.dumps(state, separators=(",", ":"),
ensure_ascii=False)`` writes them: by orjson where its bytes read back the same, else by the
standard library (``docs/design.md``, "Leases, effects and sealing in the code").
Decoding stays ``json.loads``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from itertools import chain, compress, repeat
from operator import is_
from typing import Any

import orjson

__all__ = ["encode", "encode_with_stdlib", "not_json_at"]

# Subclasses, datetimes and dataclasses go to `default`, of which there is none: orjson
# raises and the standard library decides (UUIDs, enums and fragments: _plain finds them).
_OPTIONS = (
    orjson.OPT_PASSTHROUGH_SUBCLASS
    | orjson.OPT_PASSTHROUGH_DATETIME
    | orjson.OPT_PASSTHROUGH_DATACLASS
)
_PLAIN = frozenset({dict, list, tuple, str, int, float, bool, type(None)})


def encode(obj: Any) -> bytes:
    """The compact UTF-8 JSON of obj; json.loads of it equals json.loads of encode_with_stdlib(obj).
    Raises what the standard library raises for obj (TypeError, ValueError)."""
    try:
        fast = orjson.dumps(obj, option=_OPTIONS)
    except orjson.JSONEncodeError:
        pass
    else:
        if _plain(obj):
            return fast
    return encode_with_stdlib(obj)


def encode_with_stdlib(obj: Any) -> bytes:
    """obj as the standard library writes a checkpoint's state: compact, UTF-8, NaN allowed."""
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


def _plain(obj: Any) -> bool:
    """Whether obj holds nothing but the plain JSON types, and no NaN or infinity: a level
    at a time, in C loops. Only for a value orjson encoded (no cycles, only str keys)."""
    level: list[Any] = [obj]
    while level:
        kinds = list(map(type, level))
        found = set(kinds)
        if not found <= _PLAIN:
            return False
        if float in found and not all(map(math.isfinite, _of_kind(level, kinds, float))):
            return False
        below: list[Any] = []
        if dict in found:
            below.extend(chain.from_iterable(map(dict.values, _of_kind(level, kinds, dict))))
        for sequence in (list, tuple):
            if sequence in found:
                below.extend(chain.from_iterable(_of_kind(level, kinds, sequence)))
        level = below
    return True


def _of_kind(values: list[Any], kinds: list[type], kind: type) -> Iterator[Any]:
    """The values whose type is exactly kind."""
    return compress(values, map(is_, kinds, repeat(kind)))


# How far not_json_at looks for the value that is not JSON (it runs only after a failure).
_MOST_LOOKED_AT = 100_000


def not_json_at(obj: Any, root: str = "state") -> str:
    """Where in obj the first value the standard library cannot encode is, as a Python
    path (``state["when"]["at"]``, of type object); ``root`` itself if none is found
    within a bounded look."""
    pending: list[tuple[str, Any]] = [(root, obj)]
    for _ in range(_MOST_LOOKED_AT):
        if not pending:
            break
        path, value = pending.pop()
        if isinstance(value, dict):
            bad_key = next((k for k in value if not isinstance(k, str | int | float | bool)
                            and k is not None), _NO_KEY)  # fmt: skip
            if bad_key is not _NO_KEY:
                return f"{path} (a key of type {type(bad_key).__name__})"
            pending.extend((f"{path}[{k!r}]", v) for k, v in reversed(value.items()))
        elif isinstance(value, list | tuple):
            pending.extend((f"{path}[{i}]", v) for i, v in reversed(list(enumerate(value))))
        elif not isinstance(value, str | int | float | bool) and value is not None:
            return f"{path} (of type {type(value).__name__})"
    return root


_NO_KEY = object()
