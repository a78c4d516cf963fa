"""The exactly-once inbox on a backend: admission, reading, consumption, replies.

Admissions number on from ``inbox/last``, compared in the admission's commit, so
two racing clients never take one number, and a request id is admitted once
(``inbox/ids/<request>`` compared absent). The inbox's limits count what is
unconsumed as every admission (``inbox/admitted``) less every consumption
(``inbox/consumed``): the leader's checkpoint never has to compare anything an
admission writes, so submissions never hold up a checkpoint. A consumption
is recorded by the checkpoint's own commit (``Consumption``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

from ...errors import CorruptRecord, InboxFull, NotNextNumber, StoreError
from ...failpoints import failpoint, failpoints_within
from ...limits import MAX_REPLY_BYTES, MAX_SEQ, check_request_id, check_submission_bounds
from ...read_bounds import INBOX_READ, ReadBound
from ..backend import Compare, DeleteRange, Get, Put, Scan, ScanResult, TooLarge, Txn
from ..base import AdmissionState, Consumed, inbox_full
from ..reseal import check_resealed_reply, check_resealed_submission, reply_page_bounds
from .base import Layer, bounded_records, count_of, counts_of, value_of
from .keys import AgentKeys, parse_number

__all__ = [
    "Consumption",
    "admit",
    "read_admission",
    "read_inbox",
    "read_replies",
    "reseal_reply",
    "reseal_submission",
]

T = TypeVar("T")

# Admissions that lost their compare to another client's, one after another,
# before an admission gives up (each loser reads again and tries the next number).
_ADMIT_ATTEMPTS = 64
_COUNT_BYTES = 48  # "count bytes": two numbers
_ID_BYTES = 256  # a request id, or "number size"
# Consumed records looked at for removal past keep_replies, beyond those consumed now.
_PRUNE_SLACK = 16


def _admitted_as(data: bytes | None, what: str) -> tuple[int, int] | None:
    """(number, size) an ids entry records, None if absent; CorruptRecord if junk."""
    if data is None:
        return None
    n, size = counts_of(data, what)
    if not 0 < n <= MAX_SEQ:
        raise CorruptRecord(f"{what} names number {n}, outside 1..{MAX_SEQ}")
    return n, size


def admit(layer: Layer, keys: AgentKeys, request_id: str, n: int, blob: bytes) -> tuple[int, bool]:
    """Store.admit: once per request id, as the next number, within the inbox's limits."""
    problem = check_submission_bounds(n, request_id, len(blob))
    if problem is not None:
        raise StoreError(problem)
    what = f"admission of {request_id!r} to {keys.agent!r}"
    reads = [
        Get(keys.request(request_id), _ID_BYTES),
        Get(keys.last, _COUNT_BYTES),
        Get(keys.admitted, _COUNT_BYTES),
        Get(keys.consumed, _COUNT_BYTES),
    ]
    # The counts this client's last admission left: for the number after it, the commit
    # compares them as a guess, and its reads are what the next try goes by if it fails.
    seen = layer.admissions.pop(keys.agent, None)
    guessed = seen is not None and seen[0] == str(n - 1).encode()
    found = [None, *seen] if seen is not None and guessed else layer.read(*reads)
    for _attempt in range(_ADMIT_ATTEMPTS):
        known, last, admitted, consumed = found
        admitted_as = _admitted_as(value_of(known, _ID_BYTES, what), what)
        if admitted_as is not None:
            return admitted_as[0], True
        last_bytes = value_of(last, _COUNT_BYTES, f"last admitted number of {keys.agent!r}")
        last_n = count_of(last_bytes, f"last admitted number of {keys.agent!r}")
        if n != last_n + 1:
            raise NotNextNumber(n, last_n + 1)
        ever = _totals(layer, admitted, f"admissions to {keys.agent!r}")
        gone = _totals(layer, consumed, f"consumptions of {keys.agent!r}")
        full = inbox_full(ever[0] - gone[0] + 1, ever[1] - gone[1] + len(blob))
        if full is not None:
            if not guessed:
                raise InboxFull(full)
            guessed, found = False, layer.read(*reads)  # consumptions since the guess count
            continue
        txn = Txn(
            compares=[Compare(keys.request(request_id), None), Compare(keys.last, last_bytes)],
            writes=[
                Put(keys.submission(n), bytes(blob)),
                Put(keys.request(request_id), f"{n} {len(blob)}".encode()),
                Put(keys.last, str(n).encode()),
                Put(keys.admitted, f"{ever[0] + 1} {ever[1] + len(blob)}".encode()),
            ],
            reads=reads,
        )
        with failpoints_within("inbox.admit"):
            result = layer.commit_indexed(keys, txn)
        found = [each for each in result.reads if not isinstance(each, ScanResult)]
        if result.succeeded:
            layer.admissions[keys.agent] = found[1:]
            return n, False
        guessed = False
    raise StoreError(f"{what} lost {_ADMIT_ATTEMPTS} races in a row to other admissions")


def _totals(layer: Layer, found: bytes | TooLarge | None, what: str) -> tuple[int, int]:
    """A stored "count bytes" total; (0, 0), reported, for junk: a total planted must not
    stop admissions for good (the limits then count from the junk on)."""
    try:
        return counts_of(value_of(found, _COUNT_BYTES, what), what)
    except CorruptRecord as exc:
        layer.reported(f"{what}: {exc}")
        return 0, 0


def read_inbox(layer: Layer, keys: AgentKeys, after: int) -> list[tuple[int, bytes]]:
    """Store.read_inbox: unconsumed submissions above after, within INBOX_READ."""
    start = keys.submission(after) if after > 0 else ""

    def submission(name: str) -> int | None:
        n = parse_number(name)
        return n if n is not None and 0 < n <= MAX_SEQ else None

    what = f"the inbox of {keys.agent}"
    return bounded_records(layer, keys.pending, INBOX_READ, submission, what, after=start)


def read_admission(layer: Layer, keys: AgentKeys, request_id: str) -> AdmissionState | None:
    """Store.read_admission: the number, and the reply once consumed (unauthenticated)."""
    if check_request_id(request_id) is not None:
        return None  # never admitted: admit refuses such an id
    what = f"admission of {request_id!r} to {keys.agent!r}"
    try:
        found = _admitted_as(layer.get(keys.request(request_id), _ID_BYTES, what), what)
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


def reseal_submission(layer: Layer, keys: AgentKeys, n: int, old: bytes, new: bytes) -> bool:
    check_resealed_submission(n, old, new)
    key = keys.submission(n)
    failpoint("reseal.before_commit")
    with failpoints_within("reseal"):
        return layer.commit(
            Txn(compares=[Compare(key, bytes(old))], writes=[Put(key, bytes(new))])
        ).succeeded


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
    found = layer.backend.scan(
        keys.replies_of(n), ReadBound(4, entry, 4 * entry)
    )  # one, unless planted
    for key, data in found.items:
        if data == b"+" + old:
            txn = Txn(compares=[Compare(key, data)], writes=[Put(key, b"+" + new)])
            failpoint("reseal.before_commit")
            with failpoints_within("reseal"):
                return layer.commit(txn).succeeded
    return False


class Consumption:
    """What a checkpoint's commit writes for the submissions its step consumed.

    Read first (``reads``, then ``found``; once more if consumed records are
    removed), then written with the checkpoint (``writes``). Only the fenced
    leader consumes, so nothing here is compared: the fence is. Few writes,
    so that a commit stays within a backend's operations per transaction
    (etcd's 128): consecutive numbers and old replies go as ranges.
    """

    def __init__(self, layer: Layer, keys: AgentKeys, consumed: Sequence[Consumed]) -> None:
        self.layer, self.keys = layer, keys
        self.consumed = sorted({each.number: each for each in consumed}.values(), key=_number)
        self._writes: list[Put | DeleteRange] = []
        self._prune: list[tuple[int, str]] = []

    def reads(self) -> list[Get | Scan]:
        if not self.consumed:
            return []
        keys = self.keys
        reads: list[Get | Scan] = [Get(keys.kept, _COUNT_BYTES), Get(keys.consumed, _COUNT_BYTES)]
        for each in self.consumed:
            reads += [
                Get(keys.request(each.request_id), _ID_BYTES),
                Get(keys.reply(each.number, each.request_id), 0),  # only whether they are there
                Get(keys.submission(each.number), 0),
            ]
        oldest = len(self.consumed) + _PRUNE_SLACK
        reads.append(Scan(keys.done, ReadBound(oldest, 0, 0)))  # names only
        return reads

    def found(self, reads: Sequence[object]) -> None:
        """Plan the writes from what reads() read (in its order)."""
        if not self.consumed:
            return
        keys, what = self.keys, f"inbox of {self.keys.agent!r}"
        kept = self._tolerated(count_of, reads[0], "kept count", 0)
        gone = self._tolerated(counts_of, reads[1], "consumptions", (0, 0))
        newly: list[tuple[int, str]] = []
        for i, each in enumerate(self.consumed):
            known, done, pending = reads[2 + 3 * i : 5 + 3 * i]
            admitted = self._tolerated(_admitted_as, known, what, None)
            if admitted is None:
                self._writes.append(Put(keys.request(each.request_id), f"{each.number} 0".encode()))
            if pending is not None:
                size = admitted[1] if admitted is not None and admitted[0] == each.number else 0
                gone = (gone[0] + 1, gone[1] + size)
            if done is None:
                newly.append((each.number, each.request_id))
        self._writes += _ranges(keys, [each.number for each in self.consumed])
        oldest = reads[-1]
        assert isinstance(oldest, ScanResult)
        stored = [_reply_name(keys, t.key) for t in oldest.too_large] + [
            _reply_name(keys, key) for key, _ in oldest.items
        ]
        excess = max(kept + len(newly) - self.layer.settings.keep_replies, 0)
        pruned = sorted([name for name in stored if name is not None] + newly)[:excess]
        if pruned:
            self._writes.append(DeleteRange(keys.done, keys.done_below(pruned[-1][0] + 1)))
        self._prune = [name for name in pruned if name not in newly]
        for each in self.consumed:
            if (each.number, each.request_id) not in pruned:
                reply = b"-" if each.reply is None else b"+" + each.reply
                self._writes.append(Put(keys.reply(each.number, each.request_id), reply))
        self._writes += [
            Put(keys.kept, str(max(kept + len(newly) - len(pruned), 0)).encode()),
            Put(keys.consumed, f"{gone[0]} {gone[1]}".encode()),
        ]

    def writes(self) -> list[Put | DeleteRange]:
        """The writes planned, and the removal of the request ids of the replies removed."""
        if not self._prune:
            return self._writes
        keys = self.keys
        ids = self.layer.read(*(Get(keys.request(rid), _ID_BYTES) for _n, rid in self._prune))
        for (n, rid), found in zip(self._prune, ids, strict=True):
            admitted = self._tolerated(_admitted_as, found, "a request id's number", None)
            if admitted is not None and admitted[0] == n:  # the id is this number's: forgotten
                self._writes.append(DeleteRange(keys.request(rid)))
        return self._writes

    def _tolerated(
        self, parse: Callable[[bytes | None, str], T], found: object, what: str, otherwise: T
    ) -> T:
        """parse(found), or otherwise where found is junk (reported): junk planted in the
        inbox's records must never keep the leader from publishing."""
        try:
            return parse(_bytes(found), what)
        except CorruptRecord as exc:
            self.layer.reported(f"inbox of {self.keys.agent}: {exc}")
            return otherwise


def _number(each: Consumed) -> int:
    return each.number


def _ranges(keys: AgentKeys, numbers: list[int]) -> list[DeleteRange]:
    """The removal of the pending submissions numbered, a range for each consecutive run."""
    runs: list[list[int]] = []
    for n in sorted(numbers):
        if runs and runs[-1][1] + 1 == n:
            runs[-1][1] = n
        else:
            runs.append([n, n])
    return [DeleteRange(keys.submission(a), keys.submission(b + 1)) for a, b in runs]


def _reply_name(keys: AgentKeys, key: str) -> tuple[int, str] | None:
    """(number, request id) of a reply's key, or None for a name we never write."""
    digits, _, request_id = key[len(keys.done) :].partition("-")
    n = parse_number(digits)
    if n is None or check_request_id(request_id) is not None:
        return None
    return n, request_id


def _bytes(found: object) -> bytes | None:
    """A read's bytes; TooLarge (junk planted) as CorruptRecord."""
    if isinstance(found, TooLarge):
        raise CorruptRecord(f"{found.key} is over its limit")
    assert found is None or isinstance(found, bytes)
    return found
