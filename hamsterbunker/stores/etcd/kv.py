"""The etcd JSON gateway's vocabulary as the etcd store uses it.

Requests of a txn (put, get, delete), what a txn answers (ranges, a kv's key,
revisions, read within bounds: etcd's own, but checked all the same), base64
as the gateway wants it, and the key names this store writes (numbers
zero-padded so that key order is number order).
"""

from __future__ import annotations

import base64
import re
from collections.abc import Mapping
from typing import Any

from ...errors import CorruptRecord
from ...limits import EFFECT_KINDS, MAX_EFFECTS_PER_STEP, MAX_EPOCH, MAX_NUMBER, MAX_SEQ

__all__ = [
    "EFFECT_INDEX_DIGITS",
    "EPOCH_DIGITS",
    "SEQ_DIGITS",
    "TXN_OPS",
    "b64",
    "checkpoint_key",
    "checkpoint_name",
    "delete_op",
    "effect_key",
    "effect_name",
    "effects_prefix",
    "fence_value",
    "get_op",
    "info_name",
    "kv_key",
    "pad",
    "put_op",
    "range_end",
    "ranges",
    "revision",
    "unb64",
]

SEQ_DIGITS = 20  # of a zero-padded checkpoint or event number
EPOCH_DIGITS = 10
EFFECT_INDEX_DIGITS = 4  # of a zero-padded effect index (below MAX_EFFECTS_PER_STEP)
TXN_OPS = 100  # operations per txn; etcd's --max-txn-ops is 128 by default


def b64(data: str | bytes) -> str:
    return base64.b64encode(data.encode() if isinstance(data, str) else data).decode()


def unb64(text: str) -> bytes:
    return base64.b64decode(text)


def range_end(prefix: str) -> str:
    """The end of the key range holding every key that starts with prefix (which ends in '/')."""
    return prefix[:-1] + chr(ord(prefix[-1]) + 1)


def pad(number: int, digits: int = SEQ_DIGITS) -> str:
    return f"{number:0{digits}d}"


def checkpoint_key(agent_prefix: str, seq: int, epoch: int) -> str:
    """The key of a checkpoint's sealed bytes."""
    return f"{agent_prefix}checkpoints/{pad(seq)}-{pad(epoch, EPOCH_DIGITS)}"


def effects_prefix(agent_prefix: str, seq: int) -> str:
    """The prefix of every effect-journal key of step seq (ends in '/')."""
    return f"{agent_prefix}effects/{pad(seq)}/"


def effect_key(agent_prefix: str, seq: int, index: int, kind: str) -> str:
    """The key of one effect-journal record: step, index (both zero-padded), kind."""
    return f"{effects_prefix(agent_prefix, seq)}{pad(index, EFFECT_INDEX_DIGITS)}/{kind}"


def fence_value(kvs: list[dict[str, Any]]) -> bytes | None:
    """The stored fence's bytes as a txn response has them (None if there is none)."""
    if not kvs:
        return None
    try:
        return unb64(kvs[0].get("value", ""))
    except ValueError:  # the gateway's base64, never expected: b"" reads as unreadable
        return b""


def revision(meta: Mapping[str, Any], name: str = "mod_revision") -> int:
    """A revision in etcd's metadata (etcd's own, but read within bounds all the same)."""
    try:
        value = int(meta[name])
    except (KeyError, TypeError, ValueError) as exc:
        raise CorruptRecord(f"etcd metadata has no readable {name}") from exc
    if not 0 <= value <= MAX_NUMBER:
        raise CorruptRecord(f"etcd metadata {name} {value} is out of range")
    return value


# The last part of a checkpoint key and of a description key, as put_checkpoint writes them.
_CHECKPOINT_NAME = re.compile(rb"([0-9]{%d})-([0-9]{%d})" % (SEQ_DIGITS, EPOCH_DIGITS))
_INFO_NAME = re.compile(rb"[0-9]{%d}" % SEQ_DIGITS)
# The part of an effect-journal key after its step's prefix.
_EFFECT_NAME = re.compile(rb"([0-9]{%d})/([a-z]+)" % EFFECT_INDEX_DIGITS)


def checkpoint_name(name: bytes) -> tuple[int, int] | None:
    """(seq, epoch) of a checkpoint key's last part, or None if it is not one we write."""
    match = _CHECKPOINT_NAME.fullmatch(name)
    if match is None:
        return None
    seq, epoch = int(match[1]), int(match[2])
    return (seq, epoch) if 0 < seq <= MAX_SEQ and 0 < epoch <= MAX_EPOCH else None


def info_name(name: bytes) -> int | None:
    """The seq of a description key's last part, or None if it is not one we write."""
    if not _INFO_NAME.fullmatch(name):
        return None
    seq = int(name)
    return seq if 0 < seq <= MAX_SEQ else None


def effect_name(name: bytes) -> tuple[int, str] | None:
    """(index, kind) of an effect key's part after its step's prefix, or None if not ours."""
    match = _EFFECT_NAME.fullmatch(name)
    if match is None:
        return None
    index, kind = int(match[1]), match[2].decode("ascii")
    return (index, kind) if index < MAX_EFFECTS_PER_STEP and kind in EFFECT_KINDS else None


def kv_key(kv: Mapping[str, Any]) -> bytes:
    """The key of a kv in a txn response (base64 there); b"" if it cannot be read."""
    try:
        return unb64(kv.get("key", ""))
    except ValueError:
        return b""


def put_op(key: str, value: str | bytes) -> dict[str, Any]:
    """A txn request that writes value under key."""
    return {"request_put": {"key": b64(key), "value": b64(value)}}


def get_op(key: str | bytes, range_end: str | None = None, **options: Any) -> dict[str, Any]:
    """A txn request that reads key, or the keys from key up to range_end."""
    request: dict[str, Any] = {"key": b64(key), **options}
    if range_end is not None:
        request["range_end"] = b64(range_end)
    return {"request_range": request}


def delete_op(key: str | bytes, range_end: str | bytes) -> dict[str, Any]:
    """A txn request that deletes the keys from key up to range_end."""
    return {"request_delete_range": {"key": b64(key), "range_end": b64(range_end)}}


def ranges(response: Mapping[str, Any]) -> list[list[dict[str, Any]]]:
    """The kvs of each range in a txn response (an empty list for a range that found nothing)."""
    return [op.get("response_range", {}).get("kvs", []) for op in response.get("responses", [])]
