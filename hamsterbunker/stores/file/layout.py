"""The file store's names and caps, shared by the store and its tail (layout: ``stores.file``).

Only names matching these patterns are ever read, so editor backups, our own
temporary files and sync-conflict copies are passed over. Any digits are
matched in a checkpoint name, so that one with numbers we would never write is
reported rather than silently passed over; likewise an effect record's index
and kind. An effect-journal step directory (``effects/<seq>``, 20 digits) is
read only under the exact name of the step asked for, and a removal takes
nothing under ``effects`` but names of 20 digits.
"""

from __future__ import annotations

import logging
import re

from ...limits import check_checkpoint_bounds, check_effect_bounds
from ...read_bounds import HEARTBEATS_READ
from ...records import check_name
from .fileio import dir_entries

__all__ = [
    "CHECKPOINT_NAME",
    "EFFECT_NAME",
    "EVENTS_NAME",
    "HEARTBEAT_ENTRIES",
    "HEARTBEAT_NAME",
    "MAX_SEGMENT_BYTES",
    "STEP_NAME",
    "agent_parts",
    "checkpoint_name",
    "checkpoint_name_problem",
    "effect_name",
    "effect_name_problem",
    "is_sync_copy",
    "log",
    "record_files",
    "step_name",
]

# Every module of the file store logs as the store.
log = logging.getLogger("hamsterbunker.stores.file")

CHECKPOINT_NAME = re.compile(r"ckpt-(\d+)-(\d+)\.hbc")
HEARTBEAT_NAME = re.compile(r"([A-Za-z0-9][A-Za-z0-9._-]{0,63})\.json")
EVENTS_NAME = re.compile(r"([A-Za-z0-9][A-Za-z0-9._-]{0,63})\.jsonl")
# The effect journal: effects/<seq>/<index>-<kind>.hbe, one directory per step.
STEP_NAME = re.compile(r"[0-9]{20}")
EFFECT_NAME = re.compile(r"(\d+)-(\w+)\.hbe")

# The most read of one event segment, by read_events, by append_event counting
# its lines, and by the tail per file per call. A store's own cap is
# events_per_segment * MAX_RECORD_BYTES (no segment of whole events is longer),
# but never above this: 16 MiB is a thousand events of 16 KiB each, while ours
# are a few hundred bytes.
MAX_SEGMENT_BYTES = 16 * 1024 * 1024
# The most entries of a heartbeats directory listed by one read (the store's, the
# tail's): four times the heartbeats it takes (read_bounds.HEARTBEATS_READ), so
# temporary files and sync copies beside them never count.
HEARTBEAT_ENTRIES = 4 * HEARTBEATS_READ.count


def agent_parts(agent: str, *sub: str) -> tuple[str, ...]:
    """The path components of the agent's directory (or of sub below it), under the root."""
    return ("agents", check_name("agent id", agent), *sub)


def is_sync_copy(name: str) -> bool:
    """Syncthing, Dropbox and Nextcloud conflict copies: never one of our records."""
    return ".sync-conflict-" in name or "conflicted copy" in name or "(conflict" in name


def record_files(
    directory: int, pattern: re.Pattern[str], limit: int | None = None
) -> list[tuple[str, str]]:
    """(node, file name) of each node's record file in directory, by name, sync copies left
    out; of no more than limit entries, if given (see fileio.dir_entries)."""
    names = sorted(entry.name for entry in dir_entries(directory, limit))
    matches = ((pattern.fullmatch(name), name) for name in names if not is_sync_copy(name))
    return [(match[1], name) for match, name in matches if match]


def checkpoint_name(seq: int, epoch: int) -> str:
    return f"ckpt-{seq:020d}-{epoch:010d}.hbc"


def checkpoint_name_problem(match: re.Match[str]) -> str | None:
    """Why a name matching CHECKPOINT_NAME is not one we could have written, or None."""
    seq_digits, epoch_digits = match[1], match[2]
    # \d matches any script's digits, and int() reads them: such a name would be listed
    # under numbers whose file (named in ASCII digits) does not exist.
    if not (seq_digits + epoch_digits).isascii():
        return "a checkpoint name with digits other than 0-9"
    if (len(seq_digits), len(epoch_digits)) != (20, 10):
        return "a checkpoint name with other than 20 seq and 10 epoch digits"
    return check_checkpoint_bounds(int(seq_digits), int(epoch_digits), 0)


def step_name(seq: int) -> str:
    """The name of step seq's effect-journal directory (under ``effects``)."""
    return f"{seq:020d}"


def effect_name(index: int, kind: str) -> str:
    """The name of a step's effect-journal record (in its step directory)."""
    return f"{index:04d}-{kind}.hbe"


def effect_name_problem(match: re.Match[str]) -> str | None:
    """Why a name matching EFFECT_NAME is not one we could have written, or None."""
    index_digits, kind = match[1], match[2]
    if not index_digits.isascii() or len(index_digits) != 4:
        return "an effect record name with other than 4 index digits 0-9"
    return check_effect_bounds(1, int(index_digits), kind, 0)
