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
    for _attempt in range(_ADMIT_ATTEMPTS):
        known, last, admitted, consumed = layer.read(
            Get(keys.request(request_id), _ID_BYTES),
            Get(keys.last, _COUNT_BYTES),
            Get(keys.admitted, _COUNT_BYTES),
            Get(keys.consumed, _COUNT_BYTES),
        )
        found = _admitted_as(value_of(known, _ID_BYTES, what), what)
        if found is not None:
            return found[0], True
        last_bytes = value_of(last, _COUNT_BYTES, f"last admitted number of {keys.agent!r}")
        last_n = count_of(last_bytes, f"last admitted number of {keys.agent!r}")
        if n != last_n + 1:
            raise NotNextNumber(n, last_n + 1)
        ever = counts_of(value_of(admitted, _COUNT_BYTES, what), "inbox admissions")
        gone = counts_of(value_of(consumed, _COUNT_BYTES, what), "inbox consumptions")
        full = inbox_full(ever[0] - gone[0] + 1, ever[1] - gone[1] + len(blob))
        if full is not None:
            raise InboxFull(full)
        txn = Txn(
            compares=[Compare(keys.request(request_id), None), Compare(keys.last, last_bytes)],
            writes=[
                Put(keys.submission(n), bytes(blob)),
                Put(keys.request(request_id), f"{n} {len(blob)}".encode()),
                Put(keys.last, str(n).encode()),
                Put(keys.admitted, f"{ever[0] + 1} {ever[1] + len(blob)}".encode()),
                *layer.index(keys),
            ],
        )
        if layer.commit(txn).succeeded:
            return n, False
        layer.forget_index(keys)
    raise StoreError(f"{what} lost {_ADMIT_ATTEMPTS} races in a row to other admissions")


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
    done_id, done = layer.read(
        Get(keys.done_id(n), _ID_BYTES), Get(keys.reply(n), MAX_REPLY_BYTES + 1)
    )
    if done_id != request_id.encode():  # consumed is another request's (or not yet)
        return AdmissionState(n, consumed=False, reply=None)
    reply = None
    if isinstance(done, TooLarge):
        layer.reported(f"ignoring an oversized reply to {request_id} of {keys.agent}")
    elif done is not None and done.startswith(b"+"):
        reply = done[1:]
    return AdmissionState(n, consumed=True, reply=reply)


def reseal_submission(layer: Layer, keys: AgentKeys, n: int, old: bytes, new: bytes) -> bool:
    check_resealed_submission(n, old, new)
    key = keys.submission(n)
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
    found = layer.backend.scan(keys.done, bound, after=keys.reply(after) if after > 0 else "")
    for too_large in found.too_large:
        layer.reported(f"leaving out the reply {too_large.key} of {keys.agent}: too big")
    looked = sorted([*found.items, *((t.key, b"") for t in found.too_large)])
    replies: list[tuple[int, bytes]] = []
    for index, (key, data) in enumerate(looked):
        n = parse_number(key[len(keys.done) :])
        if n is not None and data.startswith(b"+"):
            replies.append((n, data[1:]))
            if len(replies) == count:
                more = index + 1 < len(looked) or found.more
                return replies, n if more else None
    last = parse_number(looked[-1][0][len(keys.done) :]) if looked else None
    return replies, last if found.more else None


def reseal_reply(layer: Layer, keys: AgentKeys, n: int, old: bytes, new: bytes) -> bool:
    check_resealed_reply(n, new)
    key = keys.reply(n)
    txn = Txn(compares=[Compare(key, b"+" + old)], writes=[Put(key, b"+" + new)])
    return layer.commit(txn).succeeded


class Consumption:
    """What a checkpoint's commit writes for the submissions its step consumed.

    Read first (``reads``, then ``found``; once more if consumed records are
    removed), then written with the checkpoint (``writes``). Only the fenced
    leader consumes, so nothing here is compared: the fence is.
    """

    def __init__(self, layer: Layer, keys: AgentKeys, consumed: Sequence[Consumed]) -> None:
        self.layer, self.keys = layer, keys
        self.consumed = {each.number: each for each in consumed}  # one record a number
        self._writes: list[Put | DeleteRange] = []

    def reads(self) -> list[Get | Scan]:
        if not self.consumed:
            return []
        keys = self.keys
        reads: list[Get | Scan] = [Get(keys.kept, _COUNT_BYTES), Get(keys.consumed, _COUNT_BYTES)]
        for n, each in self.consumed.items():
            reads += [
                Get(keys.request(each.request_id), _ID_BYTES),
                Get(keys.done_id(n), _ID_BYTES),
                Get(keys.submission(n), 0),  # only whether it is there
            ]
        oldest = len(self.consumed) + _PRUNE_SLACK
        reads.append(Scan(keys.done_ids, ReadBound(oldest, _ID_BYTES, oldest * _ID_BYTES)))
        return reads

    def found(self, reads: Sequence[object]) -> None:
        """Plan the writes from what reads() read (in its order)."""
        if not self.consumed:
            return
        keys, what = self.keys, f"inbox of {self.keys.agent!r}"
        kept = self._tolerated(count_of, reads[0], "kept count", 0)
        gone = self._tolerated(counts_of, reads[1], "consumptions", (0, 0))
        newly = []
        for i, (n, each) in enumerate(self.consumed.items()):
            known, done, pending = reads[2 + 3 * i : 5 + 3 * i]
            admitted = self._tolerated(_admitted_as, known, what, None)
            self._writes.append(DeleteRange(keys.submission(n)))
            if admitted is None:
                self._writes.append(Put(keys.request(each.request_id), f"{n} 0".encode()))
            if pending is not None:
                size = admitted[1] if admitted is not None and admitted[0] == n else 0
                gone = (gone[0] + 1, gone[1] + size)
            if done is None:
                newly.append(n)
        oldest = reads[-1]
        assert isinstance(oldest, ScanResult)
        stored = [(parse_number(k[len(keys.done_ids) :]), v) for k, v in oldest.items]
        excess = kept + len(newly) - self.layer.settings.keep_replies
        candidates = sorted(
            [(n, v) for n, v in stored if n is not None] + [(n, None) for n in newly]
        )
        pruned = candidates[: max(excess, 0)]
        self._prune = [(n, v) for n, v in pruned if v is not None]
        left_out = {n for n, v in pruned if v is None}
        for n, each in self.consumed.items():
            if n not in left_out:
                reply = b"-" if each.reply is None else b"+" + each.reply
                self._writes += [
                    Put(keys.reply(n), reply),
                    Put(keys.done_id(n), each.request_id.encode()),
                ]
        self._writes += [
            Put(keys.kept, str(max(kept + len(newly) - len(pruned), 0)).encode()),
            Put(keys.consumed, f"{gone[0]} {gone[1]}".encode()),
        ]

    def writes(self) -> list[Put | DeleteRange]:
        """The writes planned, and the removal of the oldest consumed records past the bound."""
        if not self.consumed or not self._prune:
            return self._writes
        keys = self.keys
        ids = self.layer.read(
            *(Get(keys.request(v.decode()), _ID_BYTES) for _n, v in self._prune if _valid(v))
        )
        maps = iter(ids)
        for n, v in self._prune:
            self._writes += [DeleteRange(keys.reply(n)), DeleteRange(keys.done_id(n))]
            if not _valid(v):
                continue
            admitted = self._tolerated(_admitted_as, next(maps), "a request id's number", None)
            if admitted is not None and admitted[0] == n:  # the id is this number's: forgotten
                self._writes.append(DeleteRange(keys.request(v.decode())))
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


def _valid(request_id: bytes | None) -> bool:
    return (
        request_id is not None
        and request_id.isascii()
        and check_request_id(request_id.decode()) is None
    )


def _bytes(found: object) -> bytes | None:
    """A read's bytes; TooLarge (junk planted) as CorruptRecord."""
    if isinstance(found, TooLarge):
        raise CorruptRecord(f"{found.key} is over its limit")
    assert found is None or isinstance(found, bytes)
    return found
