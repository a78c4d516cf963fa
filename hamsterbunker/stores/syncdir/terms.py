"""Term records in a node's subtree, ``published/AGENT/terms/EPOCH.rec``, and the operator's
chain choices, ``published/AGENT/choices/EPOCH.rec`` (``kind`` names the directory).

Each is written once: the same bytes again are a no-op, other bytes a StoreError. The
(epoch, node) a record is read as comes from its place, never its bytes (the signature
binds them). Reads are bounded (``MAX_TERM_ENTRIES`` names, the newest epochs within
``read_bounds.TERM_RECORDS_READ``); junk is skipped and reported.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from pathlib import Path

from ...core.errors import CorruptRecord, StoreError
from ...core.limits import MAX_EPOCH, MAX_TERM_RECORD_BYTES, MAX_TERMS_READ
from ...core.read_bounds import TERM_RECORDS_READ, BoundedRead
from ...records import check_name
from ..dirs.fileio import dir_entries, opened_dir, read_file
from ..dirs.location import is_sync_copy
from .layout import os_errors, published_parts
from .root import link_once

__all__ = [
    "CHOICES",
    "MAX_TERMS_READ",
    "MAX_TERM_ENTRIES",
    "MAX_TERM_RECORD_BYTES",
    "read_term_records",
    "records_of_every_node",
    "term_record_name",
    "write_term_record",
]

TERMS = "terms"
CHOICES = "choices"
_WHAT = {TERMS: "term record", CHOICES: "chain choice"}  # as problems name them
TERM_NAME = re.compile(r"(\d+)\.rec")
# The most names of one terms directory looked at. The most (newest) records read, and
# their size, are read_bounds.TERM_RECORDS_READ's (MAX_TERMS_READ, MAX_TERM_RECORD_BYTES).
MAX_TERM_ENTRIES = 65_536


def term_record_name(epoch: int) -> str:
    return f"{epoch:010d}.rec"


def _epoch_of(name: str) -> int | str | None:
    """The epoch a record's name gives; None if it is not a record's name; a string saying
    why if it is named like one with numbers we never write."""
    match = TERM_NAME.fullmatch(name)
    if match is None or is_sync_copy(name):
        return None
    digits = match[1]
    if not digits.isascii() or len(digits) != 10:
        return "a term record name with other than 10 epoch digits 0-9"
    epoch = int(digits)
    if not 0 < epoch <= MAX_EPOCH:
        return f"a term record of epoch {epoch}, outside 1..{MAX_EPOCH}"
    return epoch


def write_term_record(
    root: Path, node: str, agent: str, epoch: int, data: bytes, kind: str = TERMS
) -> None:
    """Create node's published/agent/KIND/EPOCH.rec durably, once (see the module);
    nothing below root is followed if it is a symlink."""
    if not 0 < epoch <= MAX_EPOCH:
        raise StoreError(f"term record epoch {epoch} is outside 1..{MAX_EPOCH}")
    if len(data) > MAX_TERM_RECORD_BYTES:
        raise StoreError(
            f"term record of {len(data)} bytes is over the limit of {MAX_TERM_RECORD_BYTES}"
        )
    name = term_record_name(epoch)
    parts = published_parts(node, agent, kind)
    path = root.joinpath(*parts, name)
    with opened_dir(root, parts, create=True) as terms_fd:
        assert terms_fd is not None  # made
        if link_once(terms_fd, name, data):
            return
        stored = read_file(terms_fd, name, path, MAX_TERM_RECORD_BYTES)
    if stored != data:
        raise StoreError(f"{path} exists with other contents: it is written once, never rewritten")


def read_term_records(
    root: Path, node: str, agent: str, report: Callable[[str], None], kind: str = TERMS
) -> dict[int, bytes]:
    """node's records of agent of kind (epoch -> bytes), the newest MAX_TERMS_READ; junk
    skipped and reported; nothing below root followed."""
    found: BoundedRead[int] = BoundedRead(TERM_RECORDS_READ)
    parts = published_parts(node, agent, kind)
    where = root.joinpath(*parts)
    with opened_dir(root, parts) as terms_fd:
        if terms_fd is None:
            return {}
        epochs: dict[int, str] = {}
        for entry in dir_entries(terms_fd, MAX_TERM_ENTRIES):
            epoch = _epoch_of(entry.name)
            if isinstance(epoch, str):
                report(f"{where / entry.name} skipped: {epoch}")
            elif epoch is not None:
                epochs[epoch] = entry.name
        # The newest count names, junk among them too: no more files are opened.
        for epoch in sorted(epochs, reverse=True)[: TERM_RECORDS_READ.count]:
            name = epochs[epoch]
            try:
                data = read_file(terms_fd, name, where / name, TERM_RECORDS_READ.entry_bytes)
            except CorruptRecord as exc:
                report(f"{_WHAT[kind]} skipped: {exc}")
                continue
            if data is not None:
                found.offer(epoch, data)
    return dict(found.entries)


def records_of_every_node(
    root: Path, nodes: Iterable[str], agent: str, report: Callable[[str], None], kind: str = TERMS
) -> dict[tuple[int, str], bytes]:
    """Every node's records of agent of kind, unopened: (epoch, node) -> bytes, the node
    from the subtree and the epoch from the file's name. Junk is reported."""
    check_name("agent id", agent)
    found: dict[tuple[int, str], bytes] = {}
    for node in nodes:
        try:
            records = os_errors(read_term_records)(root, node, agent, report, kind)
        except CorruptRecord as exc:
            report(f"{kind} records of node {node} skipped: {exc}")
            continue
        found.update(((epoch, node), data) for epoch, data in records.items())
    return found
