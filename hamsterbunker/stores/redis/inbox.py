"""The inbox in Redis: admission, the bounded reads, and the consumption a checkpoint commits.

Keys (P the store's prefix, A the agent; ``inbox_scripts.INBOX_KEYS``)::

    P:agent:A:inbox            hash: last -> the last number admitted (the counter),
                               bytes -> sealed bytes of the unconsumed submissions
    P:agent:A:inbox:pending    hash: number -> sealed submission, while unconsumed
    P:agent:A:inbox:numbers    sorted set: the unconsumed numbers, scored by number
    P:agent:A:inbox:ids        hash: request id -> its number (pending, or consumed and kept)
    P:agent:A:inbox:consumed   hash: number -> request id of a kept consumed submission
    P:agent:A:inbox:replies    hash: number -> its sealed reply (absent: consumed without one)
    P:agent:A:inbox:kept       sorted set: the kept consumed numbers, scored by number

``admit`` is one Lua script (``inbox_scripts.ADMIT``): the duplicate check, the
next-number check, the limits and the writes (entry, number, request id,
counter, byte total) in one atomic step, announced on ``P:agent:A:changed``.
The consumption is part of the fenced checkpoint script
(``scripts.PUT_CHECKPOINT`` with ``inbox_scripts.CONSUME``): written with the
checkpoint or not at all, and announced with it. Durable as the checkpoints
are: as the server's ``appendonly``/``appendfsync`` say (``GUARANTEES``).

Nothing stored is trusted (DESIGN.md invariant 10). ``read_inbox`` looks at no
more numbers, and sends no bigger entry and no more bytes in all, than
``read_bounds.INBOX_READ`` allows (the script is handed its three numbers);
``read_admission`` measures the request id and reply before fetching them.
What does not parse is logged once and left out (read_inbox) or taken as
unknown, or as no reply (read_admission). A counter or byte total that is not
a number as we write one (or an ``inbox`` key of another type) is rebuilt by
``admit`` from what is stored, in its script, and logged once: the counter as
the highest number among the pending and the kept consumed ones (so the next
admission goes above every stored entry, never to a number given before), the
total as the sealed bytes of the pending entries; one junk write never stops
admissions for good. The checkpoint leaves that key as it is (only a total
whose pending entries were lost restarts at 0), so junk there never keeps a
step from being published. Any other inbox key of another type holds nothing
readable and is replaced by the next write.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from typing import Any

import redis

from ...errors import CorruptRecord, InboxFull, NotNextNumber, StoreError
from ...limits import (
    MAX_CONSUMED_PER_STEP,
    MAX_INBOX_BYTES,
    MAX_INBOX_COUNT,
    MAX_REPLY_BYTES,
    MAX_REQUEST_ID_CHARS,
    MAX_SEQ,
    MAX_SUBMISSION_BYTES,
    check_request_id,
    check_submission_bounds,
)
from ...read_bounds import INBOX_READ, BoundedRead
from .._reported import ReportedOnce
from ..base import AdmissionState, Consumed
from ..reseal import reply_page_bounds
from . import inbox_scripts as _scripts
from .replies import text

__all__ = ["REPLIES_REMOVED_PER_CHECKPOINT", "RedisInbox"]

# How many consumed records past keep_replies one checkpoint removes at most:
# twice what a step may add, so retention catches up, and bounded whatever was planted.
REPLIES_REMOVED_PER_CHECKPOINT = 2 * MAX_CONSUMED_PER_STEP

# A number as the scripts write it: no sign, no leading zero.
_NUMBER = re.compile(rb"[1-9][0-9]{0,15}")


# What ADMIT's rebuilt names say of the inbox record.
_DAMAGE = {
    b"inbox": "is not stored as a hash",
    b"last": "has a counter (field last) that is not a number as this store writes it",
    b"bytes": "has a byte total (field bytes) that is not a number as this store writes it",
}


def _number(value: Any) -> int | None:
    """A number as the scripts write one (1..MAX_SEQ), or None."""
    if not isinstance(value, bytes) or not _NUMBER.fullmatch(value):
        return None
    number = int(value)
    return number if number <= MAX_SEQ else None


def _following(score: Any, after: int) -> int | None:
    """Where READ_REPLIES says the next page starts; at least after + 1, so a listing
    moves on past kept members planted with scores that are not whole numbers."""
    if not isinstance(score, bytes) or not score:
        return None
    try:
        value = float(score)
    except ValueError:
        return None
    if not math.isfinite(value) or value >= MAX_SEQ:
        return None
    return max(math.floor(value), after + 1)


class RedisInbox:
    """The inboxes of every agent of one Redis store.

    key(agent, *parts) names the agent's keys, as the store does; changed(agent)
    is the channel its writes are announced on.
    """

    def __init__(
        self,
        client: redis.Redis,
        key: Callable[..., str],
        changed: Callable[[str], str],
        reported: ReportedOnce,
        url: str,
        keep_replies: int,
    ) -> None:
        self._client = client
        self._key = key
        self._changed = changed
        self._reported = reported
        self._url = url
        self.keep_replies = keep_replies
        self._admit = client.register_script(_scripts.ADMIT)
        self._read = client.register_script(_scripts.READ_INBOX)
        self._admission = client.register_script(_scripts.READ_ADMISSION)
        self._read_replies = client.register_script(_scripts.READ_REPLIES)

    def keys(self, agent: str) -> list[str]:
        """The agent's inbox keys, in the order every inbox script takes them."""
        return [self._key(agent, *name.split(":")) for name in _scripts.INBOX_KEYS]

    def consume_args(self, consumed: Sequence[Consumed]) -> list[Any]:
        """The checkpoint script's arguments for the consumption (after its own)."""
        args: list[Any] = [
            self.keep_replies,
            REPLIES_REMOVED_PER_CHECKPOINT,
            MAX_SEQ,
            MAX_REQUEST_ID_CHARS,
        ]
        for each in consumed:
            reply = each.reply
            args += [str(each.number), each.request_id, "0" if reply is None else "1"]
            args.append(b"" if reply is None else bytes(reply))
        return args

    def admit(self, agent: str, request_id: str, number: int, blob: bytes) -> tuple[int, bool]:
        """Store.admit: bounds first, then one script."""
        problem = check_submission_bounds(number, request_id, len(blob))
        if problem is not None:  # refused before anything is sent
            raise StoreError(problem)
        answer = self._admit(
            keys=self.keys(agent),
            args=[
                request_id,
                str(number),
                bytes(blob),
                MAX_INBOX_COUNT,
                MAX_INBOX_BYTES,
                MAX_SEQ,
                self._changed(agent),
                MAX_SUBMISSION_BYTES,
            ],
        )
        status = answer[0]
        if len(answer) > 2:
            self._report_rebuilt(agent, answer[2])
        if status == b"ok":
            return number, False
        if status == b"duplicate":
            known = _number(answer[1])
            if known is None:  # the script sends only numbers it parsed; checked again
                raise CorruptRecord(f"inbox of {agent!r}: request id {request_id!r} is damaged")
            return known, True
        if status == b"next":
            next_number = _number(answer[1])
            if next_number is None:
                raise CorruptRecord(f"inbox of {agent!r}: its next number is past {MAX_SEQ}")
            raise NotNextNumber(number, next_number)
        if status == b"count":
            raise InboxFull(
                f"inbox is full: it holds {MAX_INBOX_COUNT} unconsumed submissions, the limit"
            )
        if status == b"bytes":
            raise InboxFull(
                f"inbox is full: this submission would make its unconsumed submissions "
                f"{text(answer[1])} bytes, above the limit of {MAX_INBOX_BYTES} bytes "
                f"({MAX_INBOX_BYTES // 2**20} MiB)"
            )
        raise CorruptRecord(
            f"redis store {self._url}: inbox record {self._key(agent, 'inbox')} "
            "answered the admission in a way not understood"
        )

    def _report_rebuilt(self, agent: str, rebuilt: Any) -> None:
        """Log once each part of the counter's hash ADMIT found junk and rebuilt."""
        for name in rebuilt.split() if isinstance(rebuilt, bytes) else []:
            what = _DAMAGE.get(name, "was junk")
            self._warn(
                agent, ("rebuilt", name), "record %s %s: rebuilt from the stored entries",
                self._key(agent, "inbox"), what,
            )  # fmt: skip

    def read(self, agent: str, after: int) -> list[tuple[int, bytes]]:
        """Store.read_inbox: what the script sent, checked again; the rest reported once."""
        answer = self._read(
            keys=self.keys(agent),
            args=[
                max(int(after), 0),
                INBOX_READ.count,
                INBOX_READ.entry_bytes,
                INBOX_READ.total_bytes,
                MAX_SEQ,
            ],
        )
        if not isinstance(answer, list) or len(answer) < 2:
            return []
        if answer[0] == b"type":
            kind = text(answer[2]) if len(answer) > 2 else "?"
            self._warn(agent, ("type", answer[1]), "%s is a Redis %s", text(answer[1]), kind)
            return []
        left_out, stopped = answer[0], answer[1]
        if isinstance(left_out, int) and left_out > 0:
            self._warn(agent, ("junk", left_out), "left out %d numbers that are not ours", left_out)
        found: BoundedRead[int] = BoundedRead(INBOX_READ)
        for field, value in zip(answer[2::2], answer[3::2], strict=False):
            number = _number(field)
            if number is None or number <= after:  # the script sends only ours; checked again
                continue
            if not isinstance(value, bytes) or found.too_big(len(value)):
                self._warn(
                    agent,
                    ("size", number, value if isinstance(value, int) else None),
                    "left out submission %d: %s bytes, above the limit of %d bytes",
                    number,
                    value if isinstance(value, int) else "?",
                    INBOX_READ.entry_bytes,
                )
            elif not found.offer(number, value):
                break
        if stopped == 1 or found.stopped:
            self._warn(
                agent, ("stopped", after), "stopped reading at %d bytes, the most one read "
                "takes: a read from the last number read goes on", INBOX_READ.total_bytes,
            )  # fmt: skip
        return found.entries

    def request_ids(self, agent: str, most: int) -> list[str]:
        """The request ids admitted and kept (pending, or consumed and kept), at most most
        of them (``hb migrate-store``): HSCAN in batches, junk names passed over."""
        ids, found, scanned = self.keys(agent)[3], [], 0
        try:
            for name, _number in self._client.hscan_iter(ids, count=256):
                scanned += 1
                request_id = name.decode("ascii", "replace") if isinstance(name, bytes) else ""
                if check_request_id(request_id) is None:
                    found.append(request_id)
                if len(found) >= most or scanned >= 2 * most:
                    break
        except redis.ResponseError as exc:  # not a hash: planted
            self._warn(agent, ("type", ids), "%s: %s", ids, exc)
        return found

    def admission(self, agent: str, request_id: str) -> AdmissionState | None:
        """Store.read_admission: None for anything that does not parse (reported once)."""
        answer = self._admission(
            keys=self.keys(agent), args=[request_id, MAX_REPLY_BYTES, MAX_REQUEST_ID_CHARS]
        )
        if not isinstance(answer, list) or not answer:
            return None
        if answer[0] == b"type":
            self._warn(agent, ("type", answer[1]), "%s is not a hash", text(answer[1]))
            return None
        number = _number(answer[0])
        if number is None:
            self._warn(
                agent,
                ("id", request_id),
                "request id %r names no number: taken as unknown",
                request_id[:64],
            )
            return None
        if len(answer) == 1:
            return AdmissionState(number, consumed=False, reply=None)
        recorded = answer[1]
        reply = answer[2] if len(answer) > 2 else None
        if not isinstance(recorded, bytes) or recorded != request_id.encode():
            self._warn(
                agent,
                ("owner", number),
                "consumed submission %d is recorded under another request id: no reply given",
                number,
            )
            return AdmissionState(number, consumed=True, reply=None)
        if reply is not None and not isinstance(reply, bytes):
            self._warn(
                agent,
                ("reply", number),
                "the reply to submission %d is %s bytes, above the limit of %d bytes: not read",
                number,
                reply,
                MAX_REPLY_BYTES,
            )
            reply = None
        return AdmissionState(number, consumed=True, reply=reply)

    def replies(
        self, agent: str, after: int, limit: int
    ) -> tuple[list[tuple[int, bytes]], int | None]:
        """Store.read_replies: one script; what it sent checked again, the rest reported once."""
        count, scan = reply_page_bounds(limit)
        answer = self._read_replies(
            keys=self.keys(agent),
            args=[max(int(after), 0), scan, count, MAX_REPLY_BYTES, MAX_SEQ],
        )
        if not isinstance(answer, list) or len(answer) < 2:
            return [], None
        if answer[0] == b"type":
            kind = text(answer[2]) if len(answer) > 2 else "?"
            self._warn(agent, ("type", answer[1]), "%s is a Redis %s", text(answer[1]), kind)
            return [], None
        left_out, following = answer[0], answer[1]
        if isinstance(left_out, int) and left_out > 0:
            self._warn(agent, ("kept", left_out), "left out %d kept numbers not ours", left_out)
        found: list[tuple[int, bytes]] = []
        for field, value in zip(answer[2::2], answer[3::2], strict=False):
            number = _number(field)
            if number is None or number <= after:  # the script sends only ours; checked again
                continue
            if not isinstance(value, bytes):
                self._warn(
                    agent,
                    ("reply-size", number, value),
                    "left out the reply to %d: %s bytes, above the limit of %d bytes",
                    number,
                    value,
                    MAX_REPLY_BYTES,
                )
                continue
            found.append((number, value))
        return found[:count], _following(following, after)

    def _warn(self, agent: str, key: object, why: str, *args: object) -> None:
        """Log once what was left out of agent's inbox."""
        self._reported.warn(
            (agent, "inbox", key),
            "redis store %s: inbox of %s: " + why,
            self._url,
            agent,
            *args,
        )
