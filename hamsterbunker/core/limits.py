"""The bounds on everything read from a store (DESIGN.md invariant 10), in one place: what
falls outside them is a CorruptRecord (or Tampered, for a checkpoint), never a crash, a hang
or an overflow. The README states them. Also how old a temporary file left by a crash is.
"""

from __future__ import annotations

import re

__all__ = [
    "EFFECT_KINDS",
    "INBOX_REPLIES_KEPT",
    "MAX_CHECKPOINTS_LISTED",
    "MAX_CHECKPOINT_BYTES",
    "MAX_CLAIMS_TRIED",
    "MAX_CONSUMED_PER_STEP",
    "MAX_EFFECTS_PER_STEP",
    "MAX_EFFECT_BYTES",
    "MAX_EPOCH",
    "MAX_INBOX_BYTES",
    "MAX_INBOX_COUNT",
    "MAX_INBOX_GAPS",
    "MAX_JSON_DEPTH",
    "MAX_LEASE_TTL_MS",
    "MAX_NODES_READ",
    "MAX_NUMBER",
    "MAX_RECORD_BYTES",
    "MAX_REPLY_BYTES",
    "MAX_REQUEST_ID_CHARS",
    "MAX_SEQ",
    "MAX_SUBMISSION_BYTES",
    "MAX_TERMS_READ",
    "MAX_TERM_RECORD_BYTES",
    "STALE_TEMP_AGE_S",
    "check_checkpoint_bounds",
    "check_effect_bounds",
    "check_reply_bounds",
    "check_request_id",
    "check_submission_bounds",
]

# Epochs are written as 10 digits in file names: a takeover a second for 300 years.
MAX_EPOCH = 9_999_999_999
# Sequence numbers stay exact in a double (Redis' Lua, JavaScript readers): a step
# every millisecond for 280,000 years.
MAX_SEQ = 2**53 - 1
# Any other integer in a record (versions, counters, pids): etcd's revisions are int64.
MAX_NUMBER = 2**63 - 1
# A sealed checkpoint, as stored: what a node publishes, and the most it reads back.
MAX_CHECKPOINT_BYTES = 64 * 1024 * 1024
# The biggest checkpoint a leader's last publish before a stop writes in one commit with
# the lease's release; a bigger one is written as its pieces are made, released after.
RELEASE_WITH_PUBLISH_BYTES = 1024 * 1024
# A lease, cluster, heartbeat, loss-acceptance or memory record, or one event line.
MAX_RECORD_BYTES = 64 * 1024
# The most checkpoint descriptions one listing reads: a store keeps a few, the
# rest is junk a writer without the secret planted.
MAX_CHECKPOINTS_LISTED = 4096
# Nesting of JSON arrays and objects in a record (an event's detail included).
MAX_JSON_DEPTH = 16
# One sealed effect-journal record (an effect's intent or its outcome), as stored:
# well below etcd's default request limit (1.5 MiB), so every backend holds one.
MAX_EFFECT_BYTES = 512 * 1024
# Journaled effects in one step: a step may call no more, and a node reads no more
# of one step's journal, so a replay reads at most 2 * 128 * 512 KiB = 128 MiB,
# whatever was written or planted.
MAX_EFFECTS_PER_STEP = 128
# The two records an effect may have: "intent" (written before a replay="interrupted"
# effect is called) and "outcome" (its result or error).
EFFECT_KINDS = ("intent", "outcome")
# The inbox (hamsterbunker.agent.inbox). One sealed submission (its payload) as stored,
# and one sealed reply: far below etcd's request limit, so every backend holds one.
MAX_SUBMISSION_BYTES = 256 * 1024
MAX_REPLY_BYTES = 256 * 1024
# Admitted submissions not yet consumed, by count and by their sealed bytes: an
# admission above either is refused. A node reads at most this many per look.
MAX_INBOX_COUNT = 1000
MAX_INBOX_BYTES = 32 * 1024 * 1024
# Submissions one step may consume: one store write (an etcd txn) holds them all.
MAX_CONSUMED_PER_STEP = 32
# Consumed submissions whose number and reply a store keeps (newest first): a request
# id is known as a duplicate, and its reply readable, until this many newer ones
# were consumed. A store may be configured to keep fewer (tests do).
INBOX_REPLIES_KEPT = 10_000
# Runs of not-yet-consumed numbers below the newest consumed one that a checkpoint
# remembers: consuming out of order makes them, and a number that was never
# admitted (an admission cut short, a deleted entry) stays one. Past this, the
# oldest run is given up as consumed, and said so.
MAX_INBOX_GAPS = 2 * MAX_INBOX_COUNT
# A request id: what a submitter names its submission by (a UUID fits).
MAX_REQUEST_ID_CHARS = 128
_REQUEST_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@+=-]*")

# Nodes of one agent whose heartbeats one read takes (the lowest node ids first): as many
# as a synced folder's nodes/ lists, far above any real cluster.
MAX_NODES_READ = 1024
# The synced-folder store (stores.syncdir). A term record or a chain choice is a short
# JSON document and a 64-digit tag: a few hundred bytes. The newest records of one
# directory read: the lineage needs the newest terms; an older one unread leaves its
# checkpoints unplaced. The newest published claims of a node tried, each a lease record.
MAX_TERM_RECORD_BYTES = 4096
MAX_TERMS_READ = 256
MAX_CLAIMS_TRIED = 3

# A lease TTL above this in a lease record is not believed: ten minutes.
MAX_LEASE_TTL_MS = 600_000

# A temporary file (the file store's "tmp-hb-*", a node's ".memory-*", ".intents-*") this
# much older than its mtime, on this host's clock, was left by a crash and is removed: far
# above any write's few seconds, on a slow NFS server too. A clock skewed by more fails one
# write (a retry follows), never damages a record.
STALE_TEMP_AGE_S = 120.0


def check_checkpoint_bounds(seq: int, epoch: int, size: int) -> str | None:
    """Why a checkpoint with these numbers may not be stored, or None if it may."""
    if not 0 < seq <= MAX_SEQ:
        return f"checkpoint seq {seq} is outside 1..{MAX_SEQ}"
    if not 0 < epoch <= MAX_EPOCH:
        return f"checkpoint epoch {epoch} is outside 1..{MAX_EPOCH}"
    if size > MAX_CHECKPOINT_BYTES:
        return (
            f"checkpoint {seq} is {size} bytes sealed, above the limit of "
            f"{MAX_CHECKPOINT_BYTES} bytes ({MAX_CHECKPOINT_BYTES // 2**20} MiB): keep the "
            "agent's state smaller"
        )
    return None


def check_effect_bounds(seq: int, index: int, kind: str, size: int) -> str | None:
    """Why an effect-journal record with these numbers may not be stored, or None if it may."""
    if not 0 < seq <= MAX_SEQ:
        return f"effect record seq {seq} is outside 1..{MAX_SEQ}"
    if not 0 <= index < MAX_EFFECTS_PER_STEP:
        return (
            f"effect index {index} is outside 0..{MAX_EFFECTS_PER_STEP - 1}: a step may call "
            f"at most {MAX_EFFECTS_PER_STEP} journaled effects"
        )
    if kind not in EFFECT_KINDS:
        return f"effect record kind {kind!r} is not one of {', '.join(EFFECT_KINDS)}"
    if size > MAX_EFFECT_BYTES:
        return (
            f"effect record is {size} bytes sealed, above the limit of {MAX_EFFECT_BYTES} bytes "
            f"({MAX_EFFECT_BYTES // 2**10} KiB): return a smaller result from the effect"
        )
    return None


def check_request_id(request_id: object) -> str | None:
    """Why request_id may not name a submission, or None if it may."""
    if not isinstance(request_id, str) or not _REQUEST_ID.fullmatch(request_id):
        return (
            f"request id {request_id!r} must be letters, digits and . _ : @ + = - "
            "(starting with a letter or digit)"
        )
    if len(request_id) > MAX_REQUEST_ID_CHARS:
        return f"request id is {len(request_id)} characters, above {MAX_REQUEST_ID_CHARS}"
    return None


def check_submission_bounds(number: int, request_id: str, size: int) -> str | None:
    """Why a submission with this number, request id and sealed size may not be stored."""
    if not 0 < number <= MAX_SEQ:
        return f"submission number {number} is outside 1..{MAX_SEQ}"
    problem = check_request_id(request_id)
    if problem is not None:
        return problem
    if size > MAX_SUBMISSION_BYTES:
        return (
            f"submission is {size} bytes sealed, above the limit of {MAX_SUBMISSION_BYTES} "
            f"bytes ({MAX_SUBMISSION_BYTES // 2**10} KiB): send a smaller payload"
        )
    return None


def check_reply_bounds(number: int, request_id: str, size: int | None) -> str | None:
    """Why a consumed submission's record (its reply sealed, or None) may not be stored."""
    if not 0 < number <= MAX_SEQ:
        return f"submission number {number} is outside 1..{MAX_SEQ}"
    problem = check_request_id(request_id)
    if problem is not None:
        return problem
    if size is not None and size > MAX_REPLY_BYTES:
        return (
            f"reply is {size} bytes sealed, above the limit of {MAX_REPLY_BYTES} bytes "
            f"({MAX_REPLY_BYTES // 2**10} KiB): reply with less"
        )
    return None
