"""Agent state as compact JSON bytes: fast, and exactly what the standard library gives back.

A checkpoint's plaintext is the compact UTF-8 JSON of the state, as
``json.dumps(state, separators=(",", ":"), ensure_ascii=False).encode()`` writes
it, and ``json.loads`` reads it back. The standard library's encoder is slow (about
0.4 GB/s on one long string, 30 MB/s on many small objects), so ``encode`` lets
orjson write it (a 1 MiB string in 0.07 ms against 2.5 ms) when that cannot change
what comes back. orjson differs from the standard library in what it accepts:

* it writes NaN and ±Infinity as ``null`` (the standard library writes ``NaN`` and
  ``Infinity``, which ``json.loads`` reads back as those floats);
* it writes ``uuid.UUID``, ``enum.Enum`` members and ``orjson.Fragment`` where the
  standard library raises (or, for an enum that is also an ``int`` or ``str``,
  writes its value where the standard library writes the ``int`` or ``str``);
* it refuses much the standard library writes: keys that are not ``str``, integers
  beyond 64 bits, subclasses of ``str``, ``int``, ``dict`` and ``list`` (passed
  through with the options below), recursion beyond 254 levels.

So orjson's bytes are taken only for a state made of the plain JSON types alone:
``dict`` (orjson has checked that every key is a ``str``), ``list``, ``tuple``,
``str``, ``int`` (within 64 bits, also checked), finite ``float``, ``bool`` and
``None``, which ``_plain`` checks by type, a level of the state at a time, in C
loops: next to nothing for a state of a few long strings, about 0.1 µs an object
for one of many small ones (still half the standard library's time in all). The
check ``orjson.loads(out) == state`` would hold as well but costs a decode: 0.6 ms
a MiB of string, more than orjson's encoding. For those types, orjson's JSON
and the standard library's read back equal, value and type: the same strings and
integers, and floats written as the shortest text that reads back as the same
float (the text may differ, ``1e-7`` against ``1e-07``). Anything else, or
anything orjson refuses, is encoded by the standard library as before, which
writes it or raises the same ``TypeError`` or ``ValueError`` as before. Old and
new checkpoints therefore open with either version.

Decoding stays ``json.loads``: orjson's decoder reads an integer beyond 64 bits as
a float, and a state the standard library wrote may hold one.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from itertools import chain, compress, repeat
from operator import is_
from typing import Any

import orjson

__all__ = ["encode", "encode_with_stdlib"]

# Subclasses of str, int, dict and list, datetimes and dataclasses, which orjson would
# write by its own rules, go to `default` instead; there is none, so orjson raises and
# the standard library decides. (UUIDs, enums and fragments have no such option: the
# walk finds them.)
_OPTIONS = (
    orjson.OPT_PASSTHROUGH_SUBCLASS
    | orjson.OPT_PASSTHROUGH_DATETIME
    | orjson.OPT_PASSTHROUGH_DATACLASS
)
_PLAIN = frozenset({dict, list, tuple, str, int, float, bool, type(None)})


def encode(obj: Any) -> bytes:
    """The compact UTF-8 JSON of obj; json.loads of it equals json.loads of encode_with_stdlib(obj).

    Raises what the standard library raises for obj (TypeError, ValueError).
    """
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
    """Whether obj holds nothing but the plain JSON types, and no NaN or infinity.

    Only for a value orjson has encoded (so no cycles, which would never end the walk,
    and only str keys): a level of containers at a time, the values of the next level
    gathered in C loops.
    """
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
