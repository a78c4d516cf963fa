"""What a checkpoint's commit writes for the submissions its step consumed: the pending
ones removed, their replies, the counts, and the oldest replies (with their request ids)
past ``keep_replies`` removed. Only the fence is compared but for what a plan from the
last consumption's ``Ledger`` guessed (docs/design.md, "One record layer ...").
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

from ...core.errors import CorruptRecord
from ...core.limits import MAX_SEQ, check_request_id
from ...core.read_bounds import ReadBound
from ..backend import Compare, DeleteRange, Get, Put, Scan, ScanResult, TooLarge
from ..base import Consumed
from .base import Layer, Ledger, Name, count_of, counts_of
from .keys import AgentKeys, parse_number

__all__ = ["COUNT_BYTES", "ID_BYTES", "Consumption", "admitted_as"]

T = TypeVar("T")

COUNT_BYTES = 48  # "count bytes": two numbers
ID_BYTES = 256  # a request id's record: "number size"
# Consumed records looked at for removal past keep_replies, beyond those consumed now.
_PRUNE_SLACK = 16
# The most records one guessed commit compares (etcd allows 128 operations in all).
_MOST_COMPARED = 32


def admitted_as(data: bytes | None, what: str) -> tuple[int, int] | None:
    """(number, size) a request id's record names, None if absent; CorruptRecord if junk."""
    if data is None:
        return None
    n, size = counts_of(data, what)
    if not 0 < n <= MAX_SEQ:
        raise CorruptRecord(f"{what} names number {n}, outside 1..{MAX_SEQ}")
    return n, size


class Consumption:
    """A checkpoint's consumption: ``guess`` from the ledger, or ``reads`` then ``found``;
    then ``writes()``, and the ``compares`` it completes, go into the commit; ``committed`` after.

    Few writes, so that a commit stays within a backend's operations per transaction
    (etcd's 128): consecutive numbers and old replies go as ranges.
    """

    def __init__(
        self, layer: Layer, keys: AgentKeys, consumed: Sequence[Consumed], fence: str
    ) -> None:
        self.layer, self.keys, self.fence = layer, keys, fence
        self.consumed = sorted({each.number: each for each in consumed}.values(), key=_number)
        self.compares: list[Compare] = []  # complete once writes() is called
        self._writes: list[Put | DeleteRange] = []
        self._ids: dict[str, bytes | None] = {}  # each consumed request id's record after
        self._pruned: list[tuple[Name, bytes | None]] = []
        self._oldest: list[tuple[Name, bytes | None]] = []
        self._complete = False
        self._totals = (b"", b"")
        self.guessed = False

    def guess(self) -> bool:
        """Plan from the ledger and the sizes the inbox reads saw; False where it cannot."""
        ledger = self.layer.ledgers.get(self.keys.agent)
        shown = self.layer.shown.get(self.keys.agent, {})
        if not self.consumed or ledger is None or ledger.fence != self.fence:
            return False
        if any(each.number not in shown for each in self.consumed):
            return False
        keys = self.keys
        kept = count_of(ledger.kept, "kept count")
        gone = counts_of(ledger.consumed, "consumptions")
        newly = [(each.number, each.request_id) for each in self.consumed]
        excess = max(kept + len(newly) - self.layer.settings.keep_replies, 0)
        oldest = _merged(ledger.oldest, ledger.complete, newly)
        if excess > len(oldest):
            return False  # the names known do not reach that far
        pruned = oldest[:excess]
        if any(name not in newly and seen is None for name, seen in pruned):
            return False  # a request id to forget whose record was not read
        if len(self.consumed) * 2 + 2 + len(pruned) > _MOST_COMPARED:
            return False
        self.compares = [Compare(keys.kept, ledger.kept), Compare(keys.consumed, ledger.consumed)]
        for each in self.consumed:
            record = f"{each.number} {shown[each.number]}".encode()
            self.compares += [
                Compare(keys.request(each.request_id), record),
                Compare(keys.reply(each.number, each.request_id), None),
            ]
            self._ids[each.request_id] = record
        gone = (gone[0] + len(newly), gone[1] + sum(shown[n] for n, _ in newly))
        self._plan(kept, gone, newly, pruned, oldest, ledger.complete)
        self.guessed = True
        return True

    def reads(self) -> list[Get | Scan]:
        if not self.consumed:
            return []
        keys = self.keys
        reads: list[Get | Scan] = [Get(keys.kept, COUNT_BYTES), Get(keys.consumed, COUNT_BYTES)]
        for each in self.consumed:
            reads += [
                Get(keys.request(each.request_id), ID_BYTES),
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
        newly: list[Name] = []
        for i, each in enumerate(self.consumed):
            known, done, pending = reads[2 + 3 * i : 5 + 3 * i]
            admitted = self._tolerated(admitted_as, known, what, None)
            record = f"{each.number} 0".encode()
            if admitted is None:
                self._writes.append(Put(keys.request(each.request_id), record))
            self._ids[each.request_id] = record if admitted is None else _bytes(known)
            if pending is not None:
                size = admitted[1] if admitted is not None and admitted[0] == each.number else 0
                gone = (gone[0] + 1, gone[1] + size)
            if done is None:
                newly.append((each.number, each.request_id))
        scanned = reads[-1]
        assert isinstance(scanned, ScanResult)
        stored = [_reply_name(keys, key) for key in scanned.keys]
        complete = not scanned.more
        known = sorted((name, None) for name in set(stored) if name is not None)
        oldest = _merged(known, complete, newly)
        excess = max(kept + len(newly) - self.layer.settings.keep_replies, 0)
        self._plan(kept, gone, newly, oldest[:excess], oldest, complete)

    def _plan(
        self,
        kept: int,
        gone: tuple[int, int],
        newly: list[Name],
        pruned: list[tuple[Name, bytes | None]],
        oldest: list[tuple[Name, bytes | None]],
        complete: bool,
    ) -> None:
        keys = self.keys
        pruned_names = {name for name, _ in pruned}
        if pruned:
            self._writes.append(DeleteRange(keys.done, keys.done_below(pruned[-1][0][0] + 1)))
        for each in self.consumed:
            if (each.number, each.request_id) not in pruned_names:
                reply = b"-" if each.reply is None else b"+" + each.reply
                self._writes.append(Put(keys.reply(each.number, each.request_id), reply))
        # After the replies: a reader of a backend that makes a commit's writes one by one
        # (file) finds each admitted request's submission or its reply, never neither.
        self._writes += _ranges(keys, [each.number for each in self.consumed])
        self._totals = (
            str(max(kept + len(newly) - len(pruned), 0)).encode(),
            f"{gone[0]} {gone[1]}".encode(),
        )
        self._writes += [Put(keys.kept, self._totals[0]), Put(keys.consumed, self._totals[1])]
        self._pruned = [(name, seen) for name, seen in pruned if name not in newly]
        self._oldest = [
            (name, self._ids.get(name[1]) if name in newly else seen)
            for name, seen in oldest[len(pruned) :]
        ]
        self._complete = complete

    def writes(self) -> list[Put | DeleteRange]:
        """The writes planned, and the removal of the request ids of the replies removed:
        an id is forgotten only if its record names the reply's number (a reply planted
        under a live request's id must not make the store forget that request)."""
        records = dict(self._pruned)
        if any(seen is None for seen in records.values()):
            # Read every unread one the ledger keeps too, so the next removals need no read.
            unread = [name for name, seen in [*self._pruned, *self._oldest] if seen is None]
            found = self.layer.read(*(Get(self.keys.request(rid), ID_BYTES) for _, rid in unread))
            read = dict(zip(unread, (_plain(each) for each in found), strict=True))
            records = {name: read.get(name, seen) for name, seen in records.items()}
            self._oldest = [(name, read.get(name, seen)) for name, seen in self._oldest]
        forgotten: list[Put | DeleteRange] = []
        for (n, rid), record in records.items():
            if not record:
                continue  # absent, or junk over its bound: nothing of this reply's to forget
            admitted = self._tolerated(admitted_as, record, "a request id's number", None)
            if admitted is not None and admitted[0] == n:
                if self.guessed:
                    self.compares.append(Compare(self.keys.request(rid), record))
                forgotten.append(DeleteRange(self.keys.request(rid)))
        # The request ids before their replies, for the same readers: an id known is one
        # whose reply is still there.
        return forgotten + self._writes

    def committed(self) -> None:
        """After the commit succeeded: the ledger the next consumption plans from."""
        if not self.consumed:
            return
        agent = self.keys.agent
        self.layer.ledgers[agent] = Ledger(
            self.fence, self._totals[0], self._totals[1], self._oldest, self._complete
        )
        shown = self.layer.shown.get(agent, {})
        for each in self.consumed:
            shown.pop(each.number, None)

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


def _merged(
    known: Sequence[tuple[Name, bytes | None]], complete: bool, newly: list[Name]
) -> list[tuple[Name, bytes | None]]:
    """The smallest reply names stored once newly are: known's, and newly's among them
    (a newly consumed name above known's last is not known to be the next unless known
    is every name stored)."""
    merged = sorted([*known, *((name, None) for name in newly)])
    if complete:
        return merged
    last = known[-1][0] if known else None
    return [entry for entry in merged if last is not None and entry[0] <= last]


def _ranges(keys: AgentKeys, numbers: list[int]) -> list[DeleteRange]:
    """The removal of the pending submissions numbered, a range for each consecutive run."""
    runs: list[list[int]] = []
    for n in sorted(numbers):
        if runs and runs[-1][1] + 1 == n:
            runs[-1][1] = n
        else:
            runs.append([n, n])
    return [DeleteRange(keys.submission(a), keys.submission(b + 1)) for a, b in runs]


def _reply_name(keys: AgentKeys, key: str) -> Name | None:
    """(number, request id) of a reply's key, or None for a name we never write."""
    digits, _, request_id = key[len(keys.done) :].partition("-")
    n = parse_number(digits)
    if n is None or check_request_id(request_id) is not None:
        return None
    return n, request_id


def _plain(found: bytes | TooLarge | None) -> bytes:
    """A request id's record as read; b"" for none, or junk over its bound."""
    return b"" if found is None or isinstance(found, TooLarge) else found


def _bytes(found: object) -> bytes | None:
    """A read's bytes; TooLarge (junk planted) as CorruptRecord."""
    if isinstance(found, TooLarge):
        raise CorruptRecord(f"{found.key} is over its limit")
    assert found is None or isinstance(found, bytes)
    return found
