"""The file store's inbox records: their names, and their bytes written and parsed within bounds.

Layout under ``agents/<agent>/inbox`` (see ``stores.file.inbox``)::

    admitted                          the last admitted number (20 digits and a newline)
    pending/<number>.hbs              an unconsumed submission: header, then its sealed bytes
    done/<number>.hbr                 a consumed one: header, then its sealed reply (if any)
    ids/<sha256 of request id>.hbi    request id -> number (header, then 20 digits)
    staged/<seq>-<epoch>.hbt          what checkpoint <seq>-<epoch> consumes, before it is applied

A header is fixed in length (``HEADER_BYTES``): 8 bytes of magic, the request
id padded with spaces to ``MAX_REQUEST_ID_CHARS``, a newline. So a submission's
sealed size is its file's size less the header, read from the listing alone.
A request id names its index file through its SHA-256: request ids may differ
only in case, or look like our temporary names or a sync tool's copies.

Nothing here is trusted: every parser returns None for bytes it does not
accept, and each name pattern is checked for ASCII digits of the exact width
and numbers within ``hamsterbunker.limits``.
"""

from __future__ import annotations

import hashlib
import re
import struct

from ...limits import (
    MAX_CONSUMED_PER_STEP,
    MAX_REPLY_BYTES,
    MAX_REQUEST_ID_CHARS,
    MAX_SEQ,
    MAX_SUBMISSION_BYTES,
    check_checkpoint_bounds,
    check_reply_bounds,
    check_request_id,
)
from ..base import Consumed

__all__ = [
    "COUNTER_NAME",
    "DONE_CAP",
    "DONE_NAME",
    "HEADER_BYTES",
    "INDEX_CAP",
    "INDEX_NAME",
    "PENDING_CAP",
    "PENDING_NAME",
    "STAGED_CAP",
    "STAGED_NAME",
    "counter_bytes",
    "done_bytes",
    "done_name",
    "head_request_id",
    "index_bytes",
    "index_name",
    "number_of",
    "parse_counter",
    "parse_done",
    "parse_index",
    "parse_pending",
    "parse_staged",
    "pending_bytes",
    "pending_name",
    "staged_bytes",
    "staged_key",
    "staged_name",
]

COUNTER_NAME = "admitted"
PENDING_NAME = re.compile(r"(\d+)\.hbs")
DONE_NAME = re.compile(r"(\d+)\.hbr")
INDEX_NAME = re.compile(r"[0-9a-f]{64}\.hbi")
STAGED_NAME = re.compile(r"(\d+)-(\d+)\.hbt")

_SUBMISSION = b"hb-sub-1"
_REPLY = b"hb-rep-1"  # consumed with a reply
_NO_REPLY = b"hb-rep-0"  # consumed without one
_INDEX = b"hb-rid-1"
_STAGED = b"hb-stg-1"
HEADER_BYTES = 8 + MAX_REQUEST_ID_CHARS + 1
_COUNTER_BYTES = 21
_INDEX_BYTES = HEADER_BYTES + _COUNTER_BYTES
PENDING_CAP = HEADER_BYTES + MAX_SUBMISSION_BYTES
DONE_CAP = HEADER_BYTES + MAX_REPLY_BYTES
INDEX_CAP = _INDEX_BYTES
# A staged record: magic, a count, then per consumed submission its header, number,
# whether it has a reply, the reply's length and the reply.
_ENTRY = struct.Struct(">QBI")
STAGED_CAP = 8 + 2 + MAX_CONSUMED_PER_STEP * (HEADER_BYTES + _ENTRY.size + MAX_REPLY_BYTES)


def _number_name(number: int, suffix: str) -> str:
    return f"{number:020d}.{suffix}"


def pending_name(number: int) -> str:
    return _number_name(number, "hbs")


def done_name(number: int) -> str:
    return _number_name(number, "hbr")


def index_name(request_id: str) -> str:
    return hashlib.sha256(request_id.encode()).hexdigest() + ".hbi"


def staged_name(seq: int, epoch: int) -> str:
    return f"{seq:020d}-{epoch:010d}.hbt"


def number_of(match: re.Match[str]) -> int | None:
    """The submission number a pending or done name matched, or None if we never write it."""
    digits = match[1]
    if not digits.isascii() or len(digits) != 20:
        return None
    number = int(digits)
    return number if 0 < number <= MAX_SEQ else None


def staged_key(match: re.Match[str]) -> tuple[int, int] | None:
    """(seq, epoch) of a staged name, or None if we never write it."""
    seq_digits, epoch_digits = match[1], match[2]
    if not (seq_digits + epoch_digits).isascii() or (len(seq_digits), len(epoch_digits)) != (
        20,
        10,
    ):
        return None
    seq, epoch = int(seq_digits), int(epoch_digits)
    return None if check_checkpoint_bounds(seq, epoch, 0) else (seq, epoch)


# -- headers -------------------------------------------------------------------------


def _header(magic: bytes, request_id: str) -> bytes:
    return magic + request_id.encode().ljust(MAX_REQUEST_ID_CHARS, b" ") + b"\n"


def _parse_header(data: bytes) -> tuple[bytes, str] | None:
    """(magic, request id) of a header at the start of data, or None."""
    if len(data) < HEADER_BYTES or data[HEADER_BYTES - 1 : HEADER_BYTES] != b"\n":
        return None
    magic, padded = data[:8], data[8 : HEADER_BYTES - 1]
    try:
        request_id = padded.rstrip(b" ").decode("ascii")
    except UnicodeDecodeError:
        return None
    return None if check_request_id(request_id) else (magic, request_id)


# -- records ---------------------------------------------------------------------------


def counter_bytes(number: int) -> bytes:
    return f"{number:020d}\n".encode()


def parse_counter(data: bytes) -> int | None:
    if len(data) != _COUNTER_BYTES or not data.endswith(b"\n") or not data[:20].isdigit():
        return None
    number = int(data[:20])
    return number if number <= MAX_SEQ else None


def pending_bytes(request_id: str, blob: bytes) -> bytes:
    return _header(_SUBMISSION, request_id) + blob


def head_request_id(head: bytes, *, pending: bool) -> str | None:
    """The request id in the header of a pending entry (or a consumed record), or None."""
    header = _parse_header(head[:HEADER_BYTES])
    if header is None:
        return None
    magics = (_SUBMISSION,) if pending else (_REPLY, _NO_REPLY)
    return header[1] if header[0] in magics else None


def parse_pending(data: bytes) -> tuple[str, bytes] | None:
    """(request id, sealed submission) of a pending entry, or None."""
    header = _parse_header(data)
    if header is None or header[0] != _SUBMISSION or len(data) > PENDING_CAP:
        return None
    return header[1], data[HEADER_BYTES:]


def done_bytes(request_id: str, reply: bytes | None) -> bytes:
    if reply is None:
        return _header(_NO_REPLY, request_id)
    return _header(_REPLY, request_id) + reply


def parse_done(data: bytes) -> tuple[str, bytes | None] | None:
    """(request id, reply or None) of a consumed record, or None."""
    header = _parse_header(data)
    if header is None or len(data) > DONE_CAP:
        return None
    if header[0] == _NO_REPLY and len(data) == HEADER_BYTES:
        return header[1], None
    if header[0] == _REPLY:
        return header[1], data[HEADER_BYTES:]
    return None


def index_bytes(request_id: str, number: int) -> bytes:
    return _header(_INDEX, request_id) + counter_bytes(number)


def parse_index(data: bytes) -> tuple[str, int] | None:
    """(request id, number) of an index record, or None."""
    header = _parse_header(data)
    if header is None or header[0] != _INDEX or len(data) != _INDEX_BYTES:
        return None
    number = parse_counter(data[HEADER_BYTES:])
    return None if not number else (header[1], number)


def staged_bytes(consumed: list[Consumed]) -> bytes:
    parts = [_STAGED, len(consumed).to_bytes(2, "big")]
    for each in consumed:
        reply = b"" if each.reply is None else each.reply
        parts.append(_header(_STAGED, each.request_id))
        parts.append(_ENTRY.pack(each.number, each.reply is not None, len(reply)))
        parts.append(reply)
    return b"".join(parts)


def parse_staged(data: bytes) -> list[Consumed] | None:
    """The consumed submissions of a staged record, or None if it does not parse in bounds."""
    if len(data) > STAGED_CAP or len(data) < 10 or data[:8] != _STAGED:
        return None
    count, offset, found = int.from_bytes(data[8:10], "big"), 10, []
    if count > MAX_CONSUMED_PER_STEP:
        return None
    for _ in range(count):
        header = _parse_header(data[offset : offset + HEADER_BYTES])
        offset += HEADER_BYTES
        if header is None or header[0] != _STAGED or len(data) < offset + _ENTRY.size:
            return None
        number, has_reply, size = _ENTRY.unpack_from(data, offset)
        offset += _ENTRY.size
        if has_reply > 1 or (not has_reply and size) or len(data) < offset + size:
            return None
        if check_reply_bounds(number, header[1], size):
            return None
        reply = data[offset : offset + size] if has_reply else None
        offset += size
        found.append(Consumed(number, header[1], reply))
    return found if offset == len(data) else None
