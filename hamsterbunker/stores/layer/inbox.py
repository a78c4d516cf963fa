"""The exactly-once inbox on a backend: admission, reading, replies (a consumption is the
checkpoint's commit: ``consumption``).

An admission compares ``inbox/last``, the request id's absence and its own number's, so
two racing clients never take one number, and a counter deleted, set back or planted
never gives a stored number again (it is rebuilt from the highest stored).
"""

from __future__ import annotations

from contextlib import suppress

from ...core.errors import CorruptRecord, InboxFull, NotNextNumber, StoreError
from ...core.failpoints import failpoints_within
from ...core.limits import (
    INBOX_REPLIES_KEPT,
    MAX_INBOX_COUNT,
    MAX_REPLY_BYTES,
    MAX_SEQ,
    check_request_id,
    check_submission_bounds,
)
from ...core.read_bounds import INBOX_READ, ReadBound
from ..backend import Compare, Get, Put, ScanResult, TooLarge, Txn
from ..base import AdmissionState, inbox_full, refuse
from ..reseal import check_resealed_reply, reply_page_bounds
from .base import Layer, bounded_records, count_of, counts_of, value_of
from .consumption import COUNT_BYTES, ID_BYTES, admitted_as
from .keys import AgentKeys, parse_number

__all__ = [
    "admit",
    "read_admission",
    "read_inbox",
    "read_replies",
    "reseal_reply",
    "submissions_in",
]

# Admissions that lost their compare to another client's, one after another,
# before an admission gives up (each loser reads again and tries the next number).
_ADMIT_ATTEMPTS = 64


def admit(layer: Layer, keys: AgentKeys, request_id: str, n: int, blob: bytes) -> tuple[int, bool]:
    """Store.admit: once per request id, as the next number, within the inbox's limits."""
    refuse(check_submission_bounds(n, request_id, len(blob)))
    what = f"admission of {request_id!r} to {keys.agent!r}"
    reads = [
        Get(keys.request(request_id), ID_BYTES),
        Get(keys.last, COUNT_BYTES),
        Get(keys.admitted, COUNT_BYTES),
        Get(keys.consumed, COUNT_BYTES),
    ]
    # The counts this client's last admission left: for the number after it, the commit
    # compares them as a guess, and its reads are what the next try goes by if it fails.
    seen = layer.admissions.pop(keys.agent, None)
    guessed = seen is not None and seen[0] == str(n - 1).encode()
    found = [None, *seen] if seen is not None and guessed else layer.read(*reads)
    behind = False  # the counter was found behind a submission stored: rebuild it
    for _attempt in range(_ADMIT_ATTEMPTS):
        known, last, admitted, consumed = found
        admission = admitted_as(value_of(known, ID_BYTES, what), what)
        if admission is not None:
            return admission[0], True
        ever = _totals(layer, admitted, f"admissions to {keys.agent!r}")
        gone = _totals(layer, consumed, f"consumptions of {keys.agent!r}")
        last_n = _last_number(layer, keys, last, ever[0], behind)
        if n != last_n + 1:
            raise NotNextNumber(n, last_n + 1)
        full = inbox_full(ever[0] - gone[0] + 1, ever[1] - gone[1] + len(blob))
        if full is not None:
            if not guessed:
                raise InboxFull(full)
            guessed, found = False, layer.read(*reads)  # consumptions since the guess count
            continue
        # The submission's own key compared absent: whatever the counter says, a number
        # whose submission is stored is never given again (the counter may be junk).
        compares = [Compare(keys.request(request_id), None), Compare(keys.submission(n), None)]
        if not isinstance(last, TooLarge):
            compares.append(Compare(keys.last, last))
        txn = Txn(
            compares=compares,
            writes=[
                Put(keys.submission(n), bytes(blob)),
                Put(keys.request(request_id), f"{n} {len(blob)}".encode()),
                Put(keys.last, str(n).encode()),
                Put(keys.admitted, f"{ever[0] + 1} {ever[1] + len(blob)}".encode()),
            ],
            reads=[*reads, Get(keys.submission(n), 0)],
        )
        with failpoints_within("inbox.admit"):
            result = layer.commit_indexed(keys, txn)
        *found, taken = [each for each in result.reads if not isinstance(each, ScanResult)]
        if result.succeeded:
            layer.admissions[keys.agent] = found[1:]
            return n, False
        guessed = False
        # n is stored while the counter still says it is not: the counter is behind.
        behind = taken is not None and found[1] == last
    raise StoreError(f"{what} lost {_ADMIT_ATTEMPTS} races in a row to other admissions")


def _last_number(
    layer: Layer, keys: AgentKeys, last: bytes | TooLarge | None, ever: int, behind: bool
) -> int:
    """The last number admitted: the counter, unless it cannot be believed (junk, gone,
    behind the admissions counted or a submission stored): then the highest number a
    submission or a reply is stored under, if higher (reported), so that no number stored
    is given again. The count of admissions only tells that the counter fell behind: a
    count planted high must not use the numbers up."""
    what = f"last admitted number of {keys.agent!r}"
    counted = None
    with suppress(CorruptRecord):
        counted = count_of(value_of(last, COUNT_BYTES, what), what)
    if counted is not None and last is not None and counted >= ever and not behind:
        return counted
    if last is None and ever == 0 and not behind:
        return 0  # a new inbox
    highest = max(counted or 0, _highest_stored(layer, keys))
    layer.reported(f"{what}: not believable ({counted}); numbering on from {highest}")
    # Put right in the store, so that every client numbers on from there (a counter over
    # its bound cannot be compared: a race is found again by the submission's compare).
    compares = [] if isinstance(last, TooLarge) else [Compare(keys.last, last)]
    layer.commit(Txn(compares=compares, writes=[Put(keys.last, str(highest).encode())]))
    return highest


def _highest_stored(layer: Layer, keys: AgentKeys) -> int:
    """The highest number a submission or a kept reply is stored under; CorruptRecord if
    more names are planted there than a genuine inbox holds (none is given then)."""
    highest = 0
    for folder, most in ((keys.pending, MAX_INBOX_COUNT), (keys.done, INBOX_REPLIES_KEPT)):
        bound = ReadBound(2 * most + 16, 0, 0)  # names only
        found = layer.backend.scan(folder, bound)
        if found.more:
            raise CorruptRecord(
                f"the inbox of {keys.agent!r} holds more than {bound.count} names under "
                f"{folder}: its counter cannot be rebuilt, and no number is given"
            )
        for key in found.keys:
            n = parse_number(key[len(folder) :][:20])
            if n is not None and n <= MAX_SEQ:
                highest = max(highest, n)
    return highest


def _totals(layer: Layer, found: bytes | TooLarge | None, what: str) -> tuple[int, int]:
    """A stored "count bytes" total; (0, 0), reported, for junk: a total planted must not
    stop admissions for good (the limits then count from the junk on)."""
    try:
        return counts_of(value_of(found, COUNT_BYTES, what), what)
    except CorruptRecord as exc:
        layer.reported(f"{what}: {exc}")
        return 0, 0


def read_inbox(layer: Layer, keys: AgentKeys, after: int) -> list[tuple[int, bytes]]:
    """Store.read_inbox: unconsumed submissions above after, within INBOX_READ."""
    start = keys.submission(after) if after > 0 else ""
    what = f"the inbox of {keys.agent}"
    found = bounded_records(layer, keys.pending, INBOX_READ, _submission, what, after=start)
    _note_shown(layer, keys, found)
    return found


def submissions_in(
    layer: Layer, keys: AgentKeys, found: ScanResult
) -> list[tuple[int, bytes]] | None:
    """read_inbox(agent, 0) as the commit that took the lease read it along
    (TAKEN_INBOX_READ); None if the bound cut it short: the term reads it then."""
    if found.more or found.too_large:
        return None
    entries = []
    for key, blob in found.items:
        n = _submission(key[len(keys.pending) :])
        if n is None:
            layer.reported(f"leaving out {key}: not a name the inbox of {keys.agent} has")
        else:
            entries.append((n, blob))
    _note_shown(layer, keys, entries)
    return entries


def _submission(name: str) -> int | None:
    n = parse_number(name)
    return n if n is not None and 0 < n <= MAX_SEQ else None


def _note_shown(layer: Layer, keys: AgentKeys, found: list[tuple[int, bytes]]) -> None:
    """The submissions a read found, with their sizes, as the leader's consumptions guess."""
    shown = layer.shown.setdefault(keys.agent, {})
    if len(shown) + len(found) > 2 * MAX_INBOX_COUNT:  # ones consumed by another leader
        shown.clear()
    shown.update((n, len(blob)) for n, blob in found)


def read_admission(layer: Layer, keys: AgentKeys, request_id: str) -> AdmissionState | None:
    """Store.read_admission: the number, and the reply once consumed (unauthenticated)."""
    if check_request_id(request_id) is not None:
        return None  # never admitted: admit refuses such an id
    what = f"admission of {request_id!r} to {keys.agent!r}"
    try:
        found = admitted_as(layer.get(keys.request(request_id), ID_BYTES, what), what)
    except CorruptRecord as exc:
        layer.reported(f"{what}: {exc}")
        return None
    if found is None:
        return None
    n = found[0]
    done = layer.backend.get(keys.reply(n, request_id), MAX_REPLY_BYTES + 1)
    if done is None:  # not consumed yet (or its record is gone)
        return AdmissionState(n, consumed=False, reply=None)
    reply = None
    if isinstance(done, TooLarge):
        layer.reported(f"ignoring an oversized reply to {request_id} of {keys.agent}")
    elif done.startswith(b"+"):
        reply = done[1:]
    return AdmissionState(n, consumed=True, reply=reply)


def read_replies(
    layer: Layer, keys: AgentKeys, after: int, limit: int
) -> tuple[list[tuple[int, bytes]], int | None]:
    """Store.read_replies: one page of kept replies above after (see Store)."""
    count, scan = reply_page_bounds(limit)
    entry = MAX_REPLY_BYTES + 1
    bound = ReadBound(scan, entry, scan * entry)
    # Every reply to a submission above after sorts after after + 1's number alone.
    found = layer.backend.scan(keys.done, bound, after=keys.done_below(after + 1))
    for too_large in found.too_large:
        layer.reported(f"leaving out the reply {too_large.key} of {keys.agent}: too big")
    looked = sorted([*found.items, *((t.key, b"") for t in found.too_large)])
    replies: list[tuple[int, bytes]] = []
    last = None
    for index, (key, data) in enumerate(looked):
        n = parse_number(key[len(keys.done) :].partition("-")[0])
        last = n if n is not None else last
        if n is not None and data.startswith(b"+"):
            replies.append((n, data[1:]))
            if len(replies) == count:
                more = index + 1 < len(looked) or found.more
                return replies, n if more else None
    return replies, last if found.more else None


def reseal_reply(layer: Layer, keys: AgentKeys, n: int, old: bytes, new: bytes) -> bool:
    check_resealed_reply(n, new)
    entry = MAX_REPLY_BYTES + 1
    # One reply, unless planted.
    found = layer.backend.scan(keys.replies_of(n), ReadBound(4, entry, 4 * entry))
    for key, data in found.items:
        if data == b"+" + old:
            return layer.reseal(key, data, b"+" + new)
    return False
