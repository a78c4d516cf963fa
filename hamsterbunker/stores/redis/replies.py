"""Reading what the Redis store's scripts answer, trusting none of it.

A script sends back whatever a store writer put in the keys it read (bounded
by the script, not vetted): these turn its answers into records, raising
CorruptRecord for a value that is not as the store writes it, and skip (and
report once) a heartbeat or event that does not parse.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from ...errors import ConfigError, CorruptRecord
from ...limits import MAX_SEQ
from ...read_bounds import HEARTBEATS_READ, BoundedRead
from ...records import CheckpointInfo, Event, Heartbeat, check_name
from .._reported import ReportedOnce, readable

__all__ = [
    "Report",
    "bounded",
    "checkpoint_info",
    "events_in",
    "heartbeats_in",
    "node_name",
    "raw",
    "reporter",
    "text",
]

# What readable() calls with a record that does not parse: (node, stored bytes, error).
Report = Callable[[str, bytes, Exception], None]


def raw(value: bytes | str) -> bytes:
    """A reply as bytes (our clients never decode; this only narrows redis-py's types)."""
    return value if isinstance(value, bytes) else value.encode()


def text(value: Any) -> str:
    """A reply as text for messages: bytes a store writer chose may not be UTF-8."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


# A seq as put_checkpoint writes it in a field name: no sign, no leading zero.
_SEQ_FIELD = re.compile(rb"[1-9][0-9]{0,15}")


def checkpoint_info(field: bytes, doc: bytes | int) -> CheckpointInfo:
    """A checkpoints hash entry as CheckpointInfo; CorruptRecord for anything else.

    doc is the description, or its length (an int) when the server found it over
    the record limit and did not send it.
    """
    if not _SEQ_FIELD.fullmatch(field) or int(field) > MAX_SEQ:
        raise CorruptRecord(f"checkpoint field {field[:40]!r} is not a seq in 1..{MAX_SEQ}")
    seq = int(field)
    if isinstance(doc, int):
        raise CorruptRecord(f"checkpoint {seq} has a description of {doc} bytes")
    return CheckpointInfo.from_json(doc, seq)


def bounded(answer: list[Any], what: str, limit: int) -> bytes | None:
    """The value of a BOUNDED_GET or BOUNDED_HGET answer: None if absent, CorruptRecord if huge."""
    if not answer:
        return None
    if len(answer) == 2:  # {'type', kind}
        raise CorruptRecord(
            f"{what} is stored as a Redis {text(answer[1])}, not as this store writes it"
        )
    if isinstance(answer[0], int):
        raise CorruptRecord(f"{what} is {answer[0]} bytes, above the limit of {limit} bytes")
    return raw(answer[0])


def node_name(value: Any) -> str | None:
    """A node id read from the store, or None if it is not one check_name accepts."""
    if not isinstance(value, bytes):
        return None
    try:
        return check_name("node id", value.decode("ascii"))
    except (UnicodeDecodeError, ConfigError):
        return None


def reporter(reported: ReportedOnce, agent: str, kind: str) -> Report:
    """The report for readable(): an unreadable heartbeat or event of agent, logged once."""

    def report(node: str, data: bytes, exc: Exception) -> None:
        reported.warn(
            (agent, kind, node, hash(data)),
            f"ignoring an unreadable {kind} of %s: %s",
            node[:64],
            exc,
        )

    return report


def heartbeats_in(flat: Any, report: Report) -> list[Heartbeat]:
    """The heartbeats in a flat HGETALL-shaped reply, by node id, within
    read_bounds.HEARTBEATS_READ (the lowest node ids); damaged ones reported."""
    if not isinstance(flat, list):
        return []
    pairs = zip(flat[::2], flat[1::2], strict=False)
    stored: BoundedRead[str] = BoundedRead(HEARTBEATS_READ)
    for node, data in sorted(
        (text(node), data)
        for node, data in pairs
        if isinstance(node, bytes) and isinstance(data, bytes)
    ):
        if stored.full:
            break
        stored.offer(node, data)
    return list(readable(stored.entries, Heartbeat.from_json, report))


def events_in(node: str, lines: list[Any], report: Report) -> list[Event]:
    """The events of node's log that parse and are node's; damaged ones reported."""
    stored = ((node, line) for line in lines if isinstance(line, bytes))
    return list(readable(stored, Event.from_json, report))
