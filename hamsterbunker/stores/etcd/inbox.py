"""The inbox in etcd: admission (one compare-and-swap txn), the bounded reads, and the
consumption a checkpoint's txn commits (DESIGN.md invariant 9).

Keys under the agent's prefix P/agents/A/::

    inbox/meta                              {"last", "count", "bytes"}: the last number
                                            admitted, and how many submissions (and their
                                            sealed bytes) were ever admitted; admit only
    inbox/consumed                          {"count", "bytes"}: of those, how many were
                                            consumed; checkpoint txns only
    inbox/pending/<number:020d>             a sealed submission not yet consumed
    inbox/ids/<request id>                  {"n", "size"} once admitted; {"n", "consumed":
                                            true, "reply": "<epoch:010d>-<seq:020d>" or null}
                                            once consumed
    inbox/done/<number:020d>                the request id of a consumed submission (retention)
    inbox/replies/<number:020d>/<epoch:010d>-<seq:020d>
                                            a sealed reply, staged before the checkpoint txn
                                            of step seq; readable once ``ids`` names it

Unconsumed count and bytes are meta's totals less consumed's: each key has one
writer, so ``admit`` never compares a key a checkpoint writes, nor a checkpoint
one that ``admit`` writes (but for a junk counter's rebuilding, below). A
consumption between admit's read and its txn only lowers what is unconsumed, so
a refusal (InboxFull) decided on that read is still right at the read, and an
admission never goes over a limit.

``admit``: one read txn (meta, consumed, ``ids/<request id>``,
``pending/<number>``, and the highest key under ``pending/`` and under ``done/``,
keys only), then one txn comparing meta's mod_revision and
``ids/<request id>``'s (0: absent; a record that does not parse is replaced),
and that ``pending/<number>`` is absent, that puts pending entry, ids record
and meta. A pending entry is never overwritten: one found where meta names the
next number (meta lost or changed, or the entry planted) is counted as
admitted and meta moved past it (NotNextNumber: the client seals for the next
number), so that one planted key never stops admissions. A failed compare reads again and decides again
(duplicate, NotNextNumber, or another try): two clients racing with one request
id get one admission.

``put_checkpoint(..., consumed)``: the replies are staged first, in fenced txns
of at most ``_STAGE_BYTES`` each (a fenced writer stages nothing), under keys no
reader looks at until an ids record names them. Then the checkpoint's own read
also reads ``consumed`` and, for each consumed number, its pending entry (keys
only) and its request id's ids record (which holds the admitted size), and the
checkpoint's txn also compares consumed's and each pending entry's mod_revision
and, per consumed number, deletes the pending entry, puts ``done/<number>`` and
the ids record naming the reply (3 operations), and puts consumed's new totals
(1). The txn holds at most 7 checkpoint operations (bytes, description, journal
delete-range, 2 retention and 2 same-seq delete-ranges) + 1 + 3 * 32 = 104
operations, under etcd's default ``--max-txn-ops`` of 128, and 2 + 1 + 32 = 35
compares; the read 3 + 1 + 2 * 32 = 68 ranges. The request is small (the replies
went before), so a step consuming 32 replies of ``MAX_REPLY_BYTES`` (8 MiB) fits
etcd's default ``--max-request-bytes`` of 1.5 MiB: 8 staging txns of 1 MiB, then
the checkpoint. A failed compare of the inbox's part (another write consumed
meanwhile) writes nothing and is read and tried again, a few times.

Retention, after the checkpoint is committed and best effort (a failure is
logged; the next consuming checkpoint goes on with it): the oldest ``done``
records past ``keep_replies`` are removed with their replies (staged ones never
committed included) and their ids record (if it still names that number), at
most ``_FORGOTTEN_PER_TXN`` per txn and two txns per checkpoint.

``read_inbox`` reads the pending entries above ``after`` in pages of ``_PAGE``
(values included: etcd's request limit bounds each), looks at no more than
``2 * MAX_INBOX_COUNT`` keys, junk included, and takes no more than
``read_bounds.INBOX_READ`` (stopping in the page that would pass its byte
total); ``read_admission`` reads the ids record, then the reply it names;
``replies`` (``Store.read_replies``) reads a page of ``done`` records, then
their ids records, then the replies those name (three reads a page). Every
inbox key is under the agent's prefix, which ``watch`` follows: an admission
and a consuming checkpoint wake it.

Nothing stored is trusted: a pending entry whose name does not parse or whose
bytes are over ``MAX_SUBMISSION_BYTES``, an ids record that does not parse, a
reply over ``MAX_REPLY_BYTES`` are logged once and left out (the ids record is
taken as unknown, the reply as none). A meta or consumed record that does not
parse (or the two disagreeing: more consumed than admitted) is rebuilt by
``admit`` from the stored entries, and logged once, so that one junk write never
stops admissions for good: meta's last becomes the highest number a pending or
done key has (so the next admission goes above every stored entry, never to a
number given before), its totals consumed's plus the pending entries' (as
``read_inbox`` would take them, at most ``_SCANNED`` keys looked at), or only
the pending entries' with consumed written again as 0 when consumed is the junk.
The rebuilt records are written with the admission's txn, which then also
compares consumed's mod_revision (or alone, the admission refused, so that the
number never goes back). A checkpoint leaves a consumed record that does not
parse as it is, so a node's checkpoints are never held up.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from etcd3gw.exceptions import Etcd3Exception

from ...errors import CorruptRecord, InboxFull, NotNextNumber, StoreError
from ...limits import (
    MAX_INBOX_COUNT,
    MAX_NUMBER,
    MAX_REPLY_BYTES,
    MAX_SEQ,
    MAX_SUBMISSION_BYTES,
    check_request_id,
    check_submission_bounds,
)
from ...read_bounds import INBOX_READ, BoundedRead
from ...records import CheckpointInfo, parse_json
from .._reported import ReportedOnce
from ..backends.etcd_connection import EtcdConnection, grpc_error, too_large
from ..base import AdmissionState, Consumed, Fence, describe_fence_text, inbox_full
from ..reseal import reply_page_bounds
from .checkpoints import Raced, TxnExtra
from .kv import (
    EPOCH_DIGITS,
    b64,
    delete_op,
    fence_value,
    get_op,
    kv_key,
    pad,
    put_op,
    range_end,
    ranges,
    revision,
    unb64,
)

__all__ = ["EtcdInbox"]

# Replies staged in one txn: at most this many sealed bytes (4 of MAX_REPLY_BYTES),
# well under etcd's default request limit of 1.5 MiB.
_STAGE_BYTES = 1024 * 1024
# Pending entries one read of read_inbox fetches (values included), and the most
# keys one read_inbox looks at, junk included.
_PAGE = 64
_SCANNED = 2 * MAX_INBOX_COUNT
# Tries of an admission or a consuming checkpoint whose compare lost to another write.
_ADMIT_TRIES = 100
_CHECKPOINT_TRIES = 5
# Consumed records retention removes per txn (3 operations each), and txns per checkpoint.
_FORGOTTEN_PER_TXN = 32
_FORGET_TXNS = 2

_NUMBER_NAME = re.compile(rb"[0-9]{20}")
_REPLY_REF = re.compile(rf"[0-9]{{{EPOCH_DIGITS}}}-[0-9]{{20}}")

PutCheckpoint = Callable[[str, Fence, int, bytes, TxnExtra], CheckpointInfo]


def _counts(data: bytes, what: str, names: tuple[str, ...]) -> dict[str, int]:
    """The named numbers of a meta or consumed record; CorruptRecord naming what otherwise."""
    doc = parse_json(data, what)
    if not isinstance(doc, dict):
        raise CorruptRecord(f"{what} is not a JSON object")
    counts = {}
    for name in names:
        value = doc.get(name)
        if type(value) is not int or not 0 <= value <= MAX_NUMBER:
            raise CorruptRecord(f"{what} has no {name} in 0..{MAX_NUMBER}")
        counts[name] = value
    return counts


def _id_record(data: bytes, what: str) -> dict[str, Any]:
    """An ids record, checked: n in bounds, and size (admitted) or reply (consumed)."""
    doc = parse_json(data, what)
    if not isinstance(doc, dict):
        raise CorruptRecord(f"{what} is not a JSON object")
    number = doc.get("n")
    if type(number) is not int or not 0 < number <= MAX_SEQ:
        raise CorruptRecord(f"{what} has no number in 1..{MAX_SEQ}")
    if doc.get("consumed") is True:
        reply = doc.get("reply")
        if reply is not None and not (isinstance(reply, str) and _REPLY_REF.fullmatch(reply)):
            raise CorruptRecord(f"{what} names no reply this store writes")
    else:
        size = doc.get("size")
        if type(size) is not int or not 0 <= size <= MAX_SUBMISSION_BYTES:
            raise CorruptRecord(f"{what} has no size in 0..{MAX_SUBMISSION_BYTES}")
    return doc


def _value(kvs: list[dict[str, Any]]) -> tuple[bytes | None, int]:
    """(value, mod_revision) of a range's one kv; (None, 0) if there is none."""
    if not kvs:
        return None, 0
    try:
        return unb64(kvs[0].get("value", "")), revision(kvs[0])
    except ValueError as exc:  # the gateway's base64, never expected
        raise CorruptRecord(f"etcd answered a value that is not base64: {exc}") from exc


def _mod_equal(key: str, rev: int) -> dict[str, Any]:
    """Compare: key's mod_revision is rev (0: key absent)."""
    return {"key": b64(key), "target": "MOD", "result": "EQUAL", "mod_revision": rev}


# The counts of meta and of consumed, and the entries whose highest number bounds meta's last.
_META = ("last", "count", "bytes")
_TOTALS = ("count", "bytes")
_ENTRIES = ("pending/", "done/")


def _zeros(names: tuple[str, ...]) -> dict[str, int]:
    return dict.fromkeys(names, 0)


def _parsed(
    data: bytes | None, what: str, names: tuple[str, ...]
) -> tuple[dict[str, int] | None, str | None]:
    """(counts, None) of a meta or consumed record (zeros if absent), or (None, why) for junk."""
    if data is None:
        return _zeros(names), None
    try:
        return _counts(data, what, names), None
    except CorruptRecord as exc:
        return None, str(exc)


def _numbers_end(prefix: str) -> str:
    """The end of the range of keys under prefix named as numbers up to MAX_SEQ."""
    return prefix + pad(MAX_SEQ) + "\0"


def _highest_op(prefix: str) -> dict[str, Any]:
    """The range request of the highest key under prefix up to MAX_SEQ's (its key only)."""
    return get_op(
        prefix + pad(1), _numbers_end(prefix),
        sort_order="DESCEND", sort_target="KEY", limit=1, keys_only=True,
    )  # fmt: skip


def _highest_number(prefix: str, kvs: list[dict[str, Any]]) -> int:
    """The highest number named as we name one (20 digits) whose key sorts at or below the
    key _highest_op found (0 if none): at least any stored entry's, whatever junk sorts
    among them (a junk key is never higher than MAX_SEQ's, by the range)."""
    if not kvs:
        return 0
    name: bytes = kv_key(kvs[0]).removeprefix(prefix.encode())
    digits = 0
    while digits < min(len(name), 20) and name[digits : digits + 1].isdigit():
        digits += 1
    head = int(name[:digits] or b"0")
    scale: int = 10 ** (20 - digits)
    if digits == 20:
        return min(head, MAX_SEQ)
    if digits < len(name) and name[digits] > ord("9"):  # above every name head starts
        return min((head + 1) * scale - 1, MAX_SEQ)
    return max(min(head * scale - 1, MAX_SEQ), 0)  # below every name head starts


@dataclass(frozen=True)
class _Counters:
    """The meta and consumed counts an admission goes on from, and how it writes them."""

    meta: str
    meta_rev: int
    admitted: dict[str, int]
    consumed: dict[str, int]
    totals: str
    totals_rev: int
    rebuilt: bool = False  # from the stored entries: meta (and consumed, if reset) written
    reset: bool = False  # consumed was junk: written again as consumed

    @property
    def compare(self) -> list[dict[str, Any]]:
        """meta unchanged; rebuilt, consumed too (meta was counted on from it)."""
        compare = [_mod_equal(self.meta, self.meta_rev)]
        if self.rebuilt:
            compare.append(_mod_equal(self.totals, self.totals_rev))
        return compare

    def writes(self, new_meta: dict[str, int]) -> list[dict[str, Any]]:
        ops = [put_op(self.meta, json.dumps(new_meta))]
        if self.reset:
            ops.append(put_op(self.totals, json.dumps(self.consumed)))
        return ops


class EtcdInbox:
    """The inboxes of every agent of one etcd store; the store translates the errors."""

    def __init__(
        self,
        connection: EtcdConnection,
        agent_prefix: Callable[[str], str],
        reported: ReportedOnce,
        keep_replies: int,
    ) -> None:
        self._connection = connection
        self._agent_prefix = agent_prefix
        self._reported = reported
        self._keep = keep_replies

    def _inbox(self, agent: str) -> str:
        return self._agent_prefix(agent) + "inbox/"

    def _warn(self, agent: str, key: object, why: str, *args: object) -> None:
        """Log once what was left out of (or taken as unknown in) agent's inbox."""
        self._reported.warn((agent, "inbox", key), "etcd store: inbox of %s: " + why, agent, *args)

    # -- admission -----------------------------------------------------------

    def admit(self, agent: str, request_id: str, number: int, blob: bytes) -> tuple[int, bool]:
        """Store.admit: read meta, consumed and the id's record; one compare-and-swap txn."""
        problem = check_submission_bounds(number, request_id, len(blob))
        if problem is not None:
            raise StoreError(problem)
        inbox = self._inbox(agent)
        meta, totals, ids = inbox + "meta", inbox + "consumed", f"{inbox}ids/{request_id}"
        pending = inbox + "pending/" + pad(number)
        for _try in range(_ADMIT_TRIES):
            reads = [get_op(meta), get_op(totals), get_op(ids), get_op(pending)]
            reads += [_highest_op(inbox + name) for name in _ENTRIES]
            meta_kvs, totals_kvs, id_kvs, taken, *highest = ranges(self._connection.txn([], reads))
            known, id_rev = _value(id_kvs)
            if known is not None:
                try:
                    return _id_record(known, f"inbox record of request id {request_id}")["n"], True
                except CorruptRecord as exc:  # replaced below, as if unknown
                    self._warn(agent, (request_id, id_rev), "replacing %s", exc)
            counters = self._counters(agent, inbox, meta_kvs, totals_kvs, highest)
            admitted, consumed = counters.admitted, counters.consumed
            if number != admitted["last"] + 1:
                self._keep_rebuilt(counters)
                raise NotNextNumber(number, admitted["last"] + 1)
            if taken:  # never overwritten: meta was lost or changed, or the entry planted
                self._skip_taken(agent, meta, counters.meta_rev, pending, taken, admitted)
                raise NotNextNumber(number, number + 1)
            count = admitted["count"] - consumed["count"]
            full = inbox_full(count + 1, admitted["bytes"] - consumed["bytes"] + len(blob))
            if full is not None and not counters.rebuilt:
                # Totals forged to look full (they parse) would refuse every admission
                # for good: count what is stored before refusing.
                counters = self._counters(agent, inbox, meta_kvs, totals_kvs, highest, full)
                admitted, consumed = counters.admitted, counters.consumed
                count = admitted["count"] - consumed["count"]
                full = inbox_full(count + 1, admitted["bytes"] - consumed["bytes"] + len(blob))
            if full is not None:
                self._keep_rebuilt(counters)
                raise InboxFull(full)
            new_meta = {
                "last": number,
                "count": admitted["count"] + 1,
                "bytes": admitted["bytes"] + len(blob),
            }
            response = self._connection.txn(
                [*counters.compare, _mod_equal(ids, id_rev), _mod_equal(pending, 0)],
                [
                    put_op(pending, bytes(blob)),
                    put_op(ids, json.dumps({"n": number, "size": len(blob)})),
                    *counters.writes(new_meta),
                ],
            )
            if response.get("succeeded"):
                return number, False
        raise StoreError(
            f"admission of {request_id!r} to {agent!r} lost {_ADMIT_TRIES} races in a row"
        )

    def _counters(
        self,
        agent: str,
        inbox: str,
        meta_kvs: list[dict[str, Any]],
        totals_kvs: list[dict[str, Any]],
        highest: list[list[dict[str, Any]]],
        full: str | None = None,
    ) -> _Counters:
        """meta and consumed as stored, or rebuilt (reported once) where they are junk or
        disagree (more consumed than admitted): one junk write must not stop admissions for
        good (DESIGN.md invariant 10). Rebuilt, meta's last is the highest number a pending
        or done entry has (or meta's own, if higher), so no number is given twice, and its
        totals consumed's plus what is pending; a junk consumed restarts at 0 (meta then
        counts only what is pending), so that a later consumption is never more than what
        meta counts. full: why the stored totals say the inbox is full; then they are
        counted again (what is pending), and kept as they were if they were right."""
        meta, totals = inbox + "meta", inbox + "consumed"
        meta_data, meta_rev = _value(meta_kvs)
        totals_data, totals_rev = _value(totals_kvs)
        admitted, meta_junk = _parsed(meta_data, f"inbox meta record {meta}", _META)
        consumed, totals_junk = _parsed(totals_data, f"inbox consumed record {totals}", _TOTALS)
        if admitted is not None and admitted["last"] > MAX_SEQ:
            admitted, meta_junk = None, f"inbox meta record {meta} has last above {MAX_SEQ}"
        if admitted is not None and consumed is not None:
            agree = (
                admitted["count"] >= consumed["count"] and admitted["bytes"] >= consumed["bytes"]
            )
            if agree and full is None:
                return _Counters(meta, meta_rev, admitted, consumed, totals, totals_rev)
            meta_junk = (
                f"inbox records {meta} and {totals} disagree: more consumed than admitted"
                if not agree
                else f"inbox records {meta} and {totals} say the inbox is full ({full})"
            )
        stored = [
            _highest_number(inbox + name, kvs) for name, kvs in zip(_ENTRIES, highest, strict=True)
        ]
        last = max([*stored, admitted["last"] if admitted else 0])
        count, size = self._pending_totals(inbox + "pending/")
        base = consumed or _zeros(_TOTALS)
        rebuilt = {"last": last, "count": base["count"] + count, "bytes": base["bytes"] + size}
        if full is not None and rebuilt == admitted:  # truly full: nothing to rebuild
            return _Counters(meta, meta_rev, admitted, base, totals, totals_rev)
        for junk, rev in ((meta_junk, meta_rev), (totals_junk, totals_rev)):
            if junk is not None:
                self._warn(
                    agent, ("rebuilt", junk, rev), "%s: rebuilt from the stored entries", junk
                )
        return _Counters(
            meta, meta_rev, rebuilt, base, totals, totals_rev, rebuilt=True, reset=consumed is None
        )

    def _keep_rebuilt(self, counters: _Counters) -> None:
        """Write rebuilt counters even though the admission is refused, so that the number
        never goes back; a lost race is decided again by the next admission."""
        if counters.rebuilt:
            self._connection.txn(counters.compare, counters.writes(counters.admitted))

    def _pending_totals(self, prefix: str) -> tuple[int, int]:
        """How many pending entries there are and their sealed bytes, as read_inbox would
        take them (named as we name them, no bigger than a submission may be: bigger ones
        are never read, so never consumed), looking at no more than _SCANNED keys."""
        start: str | bytes = prefix + pad(1)
        end = _numbers_end(prefix)
        count = size = scanned = 0
        while scanned < _SCANNED:
            limit = min(_PAGE, _SCANNED - scanned)
            [kvs] = ranges(self._connection.txn([], [get_op(start, end, limit=limit)]))
            for kv in kvs:
                data, _rev = _value([kv])
                name = kv_key(kv).removeprefix(prefix.encode())
                if _NUMBER_NAME.fullmatch(name) and len(data or b"") <= MAX_SUBMISSION_BYTES:
                    count, size = count + 1, size + len(data or b"")
            scanned += len(kvs)
            if len(kvs) < limit:
                break
            start = kv_key(kvs[-1]) + b"\0"
        return count, size

    def _skip_taken(
        self,
        agent: str,
        meta: str,
        meta_rev: int,
        pending: str,
        taken: list[dict[str, Any]],
        admitted: dict[str, int],
    ) -> None:
        """Count the entry found at the number meta names next as admitted, and move meta
        past it: one planted key must not stop every admission for good. No number is given
        twice (only a free one ever is); the node shows the entry only if it authenticates,
        and it is consumed, and counted consumed, like any other."""
        value, rev = _value(taken)
        self._warn(
            agent, pending, "%s is stored before meta names it: counted as admitted", pending
        )
        new_meta = {
            "last": admitted["last"] + 1,
            "count": admitted["count"] + 1,
            "bytes": admitted["bytes"] + len(value or b""),
        }
        self._connection.txn(
            [_mod_equal(meta, meta_rev), _mod_equal(pending, rev)],
            [put_op(meta, json.dumps(new_meta))],
        )  # a lost race is decided again by the next try

    # -- reads ---------------------------------------------------------------

    def request_ids(self, agent: str, most: int) -> list[str]:
        """The request ids admitted and kept (pending, or consumed and kept), at most most
        of them, by name alone (``hb migrate-store``)."""
        ids = self._inbox(agent) + "ids/"
        start, end, scanned = ids.encode(), range_end(ids), 0
        found: list[str] = []
        while len(found) < most and scanned < 2 * most:  # junk beside them takes its part
            op = get_op(start, end, limit=_PAGE, keys_only=True)
            [kvs] = ranges(self._connection.txn([], [op]))
            scanned += len(kvs)
            for kv in kvs:
                request_id = kv_key(kv)[len(ids) :].decode("ascii", "replace")
                if check_request_id(request_id) is None:
                    found.append(request_id)
            if len(kvs) < _PAGE:
                break
            start = kv_key(kvs[-1]) + b"\0"
        return found[:most]

    def read(self, agent: str, after: int) -> list[tuple[int, bytes]]:
        """Store.read_inbox: pages of pending entries, in key (number) order, bounded."""
        if after >= MAX_SEQ:
            return []
        return self.read_on(agent, after, None)

    def first_page_op(self, agent: str) -> dict[str, Any]:
        """The range request of read(agent, 0)'s first page (for read_on)."""
        pending = self._inbox(agent) + "pending/"
        return get_op(pending + pad(1), range_end(pending), limit=_PAGE)

    def read_on(
        self, agent: str, after: int, first: list[dict[str, Any]] | None
    ) -> list[tuple[int, bytes]]:
        """read(agent, after), its first page found already (first_page_op's, after 0) or
        read here (None)."""
        pending = self._inbox(agent) + "pending/"
        start: bytes = (pending + pad(max(after, 0) + 1)).encode()
        end = range_end(pending)
        found: BoundedRead[int] = BoundedRead(INBOX_READ)
        scanned = 0
        while not found.full and scanned < _SCANNED:
            if first is None:
                [kvs] = ranges(self._connection.txn([], [get_op(start, end, limit=_PAGE)]))
            else:
                kvs, first = first, None
            for kv in kvs:
                scanned += 1
                entry = self._entry(agent, pending.encode(), kv)
                if entry is not None and entry[0] > after and not found.offer(*entry):
                    break
            last = kv_key(kvs[-1]) if kvs else b""
            if len(kvs) < _PAGE or not last:
                break
            start = last + b"\0"
        else:
            if scanned >= _SCANNED:
                self._warn(agent, ("scanned", after), "read only the first %d keys", _SCANNED)
        if found.stopped:
            self._warn(
                agent, ("stopped", after), "stopped reading at %d bytes, the most one read "
                "takes: a read from the last number read goes on", found.total,
            )  # fmt: skip
        return found.entries

    def _entry(self, agent: str, pending: bytes, kv: Mapping[str, Any]) -> tuple[int, bytes] | None:
        """(number, sealed bytes) of a pending entry, or None (logged) for junk."""
        key = kv_key(kv)
        name = key.removeprefix(pending)
        number = int(name) if _NUMBER_NAME.fullmatch(name) else 0
        if not 0 < number <= MAX_SEQ:
            self._warn(agent, (key, kv.get("mod_revision")), "skipping key %r", name[:80])
            return None
        try:
            blob = unb64(kv.get("value", ""))
        except ValueError:  # the gateway's base64, never expected
            blob = b"\0" * (MAX_SUBMISSION_BYTES + 1)
        if len(blob) > MAX_SUBMISSION_BYTES:
            self._warn(
                agent,
                (key, kv.get("mod_revision")),
                "leaving out submission %d: %d bytes, above the limit of %d",
                number,
                len(blob),
                MAX_SUBMISSION_BYTES,
            )
            return None
        return number, blob

    def admission(self, agent: str, request_id: str) -> AdmissionState | None:
        """Store.read_admission: the id's record, then the reply it names (if any)."""
        if check_request_id(request_id) is not None:
            return None  # no admission is stored under a name that is no request id
        inbox = self._inbox(agent)
        found = self._connection.kv.get(f"{inbox}ids/{request_id}", metadata=True)
        if not found:
            return None
        data, meta = found[0]
        try:
            doc = _id_record(data, f"inbox record of request id {request_id}")
        except CorruptRecord as exc:
            self._warn(agent, (request_id, meta.get("mod_revision")), "%s: taken as unknown", exc)
            return None
        number = doc["n"]
        if doc.get("consumed") is not True:
            return AdmissionState(number, consumed=False, reply=None)
        if doc.get("reply") is None:
            return AdmissionState(number, consumed=True, reply=None)
        stored = self._connection.kv.get(f"{inbox}replies/{pad(number)}/{doc['reply']}")
        reply = stored[0] if stored else None
        if reply is None or len(reply) > MAX_REPLY_BYTES:
            self._warn(
                agent,
                (request_id, meta.get("mod_revision")),
                "the reply to %s is %s: taken as no reply yet",
                request_id,
                "missing" if reply is None else f"{len(reply)} bytes, above {MAX_REPLY_BYTES}",
            )
            reply = None
        return AdmissionState(number, consumed=True, reply=reply)

    def replies(
        self, agent: str, after: int, limit: int
    ) -> tuple[list[tuple[int, bytes]], int | None]:
        """Store.read_replies: the done records above after (one range), their ids records
        (one txn), then the replies those name (one txn)."""
        count, scan = reply_page_bounds(limit)
        if after >= MAX_SEQ:
            return [], None
        inbox = self._inbox(agent)
        done = inbox + "done/"
        start = done + pad(max(after, 0) + 1)
        [kvs] = ranges(self._connection.txn([], [get_op(start, range_end(done), limit=scan)]))
        named = [entry for kv in kvs if (entry := self._done(agent, done.encode(), kv))]
        following = _listed_to(kvs, done.encode(), after) if len(kvs) >= scan else None
        keys: list[tuple[int, str]] = []
        if named:
            ids = [get_op(f"{inbox}ids/{request_id}") for _n, request_id in named]
            for (number, request_id), id_kvs in zip(
                named, ranges(self._connection.txn([], ids)), strict=True
            ):
                ref = self._reply_ref(agent, number, request_id, id_kvs)
                if ref is not None:
                    keys.append((number, f"{inbox}replies/{pad(number)}/{ref}"))
        if len(keys) > count:
            keys, following = keys[:count], keys[count - 1][0]
        if not keys:
            return [], following
        found: list[tuple[int, bytes]] = []
        stored = ranges(self._connection.txn([], [get_op(key) for _n, key in keys]))
        for (number, _key), reply_kvs in zip(keys, stored, strict=True):
            reply, rev = _value(reply_kvs)
            if reply is not None and len(reply) > MAX_REPLY_BYTES:
                self._warn(
                    agent, ("reply", number, rev), "leaving out the reply to %d: %d bytes, "
                    "above the limit of %d", number, len(reply), MAX_REPLY_BYTES,
                )  # fmt: skip
            elif reply is not None:
                found.append((number, reply))
        return found, following

    def _done(self, agent: str, done: bytes, kv: Mapping[str, Any]) -> tuple[int, str] | None:
        """(number, request id) of a done record, or None (logged) for junk."""
        key = kv_key(kv)
        name = key.removeprefix(done)
        number = int(name) if _NUMBER_NAME.fullmatch(name) else 0
        try:
            request_id = unb64(kv.get("value", "")).decode("ascii")
        except (ValueError, UnicodeDecodeError):
            request_id = ""
        if not 0 < number <= MAX_SEQ or check_request_id(request_id) is not None:
            self._warn(agent, (key, kv.get("mod_revision")), "skipping done record %r", name[:80])
            return None
        return number, request_id

    def _reply_ref(
        self, agent: str, number: int, request_id: str, kvs: list[dict[str, Any]]
    ) -> str | None:
        """The reply a consumed submission's ids record names, or None (none, or junk)."""
        data, rev = _value(kvs)
        if data is None:
            return None
        try:
            doc = _id_record(data, f"inbox record of request id {request_id}")
        except CorruptRecord as exc:
            self._warn(agent, (request_id, rev), "%s: its reply left out", exc)
            return None
        if doc["n"] != number or doc.get("consumed") is not True:
            return None  # the id names another number: that one's reply is the readable one
        reply = doc.get("reply")
        return reply if isinstance(reply, str) else None

    # -- consumption -----------------------------------------------------------

    def checkpoint(
        self,
        agent: str,
        fence: Fence,
        seq: int,
        blob: bytes,
        consumed: Sequence[Consumed],
        put: PutCheckpoint,
    ) -> CheckpointInfo:
        """Store.put_checkpoint with consumed: stage the replies, then the checkpoint's txn."""
        by_number = {each.number: each for each in consumed}  # a number twice: the last
        entries = sorted(by_number.values(), key=lambda each: each.number)
        ref = f"{pad(fence.epoch, EPOCH_DIGITS)}-{pad(seq)}"
        self._stage(agent, fence, seq, ref, entries)
        for _try in range(_CHECKPOINT_TRIES):
            try:
                info = put(agent, fence, seq, blob, _Consumption(self, agent, ref, entries))
            except Raced:
                continue
            self.forget(agent)
            return info
        raise StoreError(
            f"checkpoint {seq} of {agent!r}: the inbox changed under {_CHECKPOINT_TRIES} tries"
        )

    def _stage(
        self, agent: str, fence: Fence, seq: int, ref: str, entries: Sequence[Consumed]
    ) -> None:
        """Put the replies under ref in fenced txns of at most _STAGE_BYTES (unread as yet)."""
        inbox = self._inbox(agent)
        batches: list[list[dict[str, Any]]] = []
        size = 0
        for each in entries:
            if each.reply is None:
                continue
            if not batches or size + len(each.reply) > _STAGE_BYTES:
                batches.append([])
                size = 0
            batches[-1].append(put_op(f"{inbox}replies/{pad(each.number)}/{ref}", each.reply))
            size += len(each.reply)
        fence_key = self._agent_prefix(agent) + "fence"
        compare = [{"key": b64(fence_key), "target": "VALUE", "result": "EQUAL",
                    "value": b64(fence.to_text())}]  # fmt: skip
        for batch in batches:
            try:
                response = self._connection.txn(compare, batch, [get_op(fence_key)])
            except Etcd3Exception as exc:
                if too_large(exc):
                    raise StoreError(
                        f"replies of checkpoint {seq} of {agent!r} refused by etcd: "
                        f"{grpc_error(exc)[1]}. etcd takes requests up to its "
                        "--max-request-bytes (1.5 MiB by default)"
                    ) from exc
                raise
            if not response.get("succeeded"):
                [fence_kvs] = ranges(response)
                raise fence.refused(seq, describe_fence_text(fence_value(fence_kvs)))

    def forget(self, agent: str) -> None:
        """Remove the oldest consumed records past keep_replies (bounded, best effort)."""
        done = self._inbox(agent) + "done/"
        try:
            with self._connection.errors_translated("forget old replies"):
                for _txn in range(_FORGET_TXNS):
                    if not self._forget_some(agent, done):
                        return
        except (StoreError, ValueError) as exc:  # ValueError: the gateway's base64
            self._warn(agent, ("forget", str(exc)), "old replies not removed yet: %s", exc)

    def _forget_some(self, agent: str, done: str) -> bool:
        """One txn of retention; True if there may be more to remove."""
        end = range_end(done)
        counted = self._connection.txn([], [get_op(done, end, count_only=True)])
        try:
            total = int(counted["responses"][0]["response_range"].get("count", 0))
        except (IndexError, KeyError, TypeError, ValueError, AttributeError):
            return False
        excess = min(total - self._keep, _FORGOTTEN_PER_TXN)
        if excess <= 0:
            return False
        [oldest] = ranges(self._connection.txn([], [get_op(done, end, limit=excess)]))
        inbox = self._inbox(agent)
        ops: list[dict[str, Any]] = []
        named: list[tuple[int, str]] = []
        for kv in oldest:
            stored = kv_key(kv)
            ops.append(delete_op(stored, stored + b"\0"))
            name = stored.removeprefix(done.encode())
            if not _NUMBER_NAME.fullmatch(name):
                self._warn(agent, (stored, kv.get("mod_revision")), "removing key %r", name[:80])
                continue
            number = int(name)
            replies = f"{inbox}replies/{pad(number)}/"
            ops.append(delete_op(replies, range_end(replies)))
            request_id = unb64(kv.get("value", "")).decode("ascii", "replace")
            if check_request_id(request_id) is None:
                named.append((number, request_id))
        compare: list[dict[str, Any]] = []
        if named:
            keys = [f"{inbox}ids/{request_id}" for _n, request_id in named]
            found = ranges(self._connection.txn([], [get_op(key) for key in keys]))
            for (number, request_id), key, kvs in zip(named, keys, found, strict=True):
                data, rev = _value(kvs)
                try:
                    if data is None or _id_record(data, request_id)["n"] != number:
                        continue  # the id is admitted again, or names another number
                except CorruptRecord:
                    pass  # junk: removed with the rest
                compare.append(_mod_equal(key, rev))
                ops.append(delete_op(key, key + "\0"))
        response = self._connection.txn(compare, ops)
        return bool(response.get("succeeded")) and excess == _FORGOTTEN_PER_TXN


def _listed_to(kvs: list[dict[str, Any]], done: bytes, after: int) -> int | None:
    """Where a page that looked at as many done keys as it may goes on: after the number
    its last key starts with (past after, so junk cannot hold it); None if no number."""
    name = kv_key(kvs[-1]).removeprefix(done)[:20]
    if not _NUMBER_NAME.fullmatch(name):
        return None
    return min(max(int(name), after + 1), MAX_SEQ)


class _Consumption:
    """The inbox's part of one checkpoint txn (a TxnExtra): see the module's docstring."""

    def __init__(self, inbox: EtcdInbox, agent: str, ref: str, entries: Sequence[Consumed]):
        self._inbox = inbox
        self._agent = agent
        self._prefix = inbox._inbox(agent)
        self._ref = ref
        self._entries = entries

    def _pending(self, number: int) -> str:
        return f"{self._prefix}pending/{pad(number)}"

    def _ids(self, request_id: str) -> str:
        return f"{self._prefix}ids/{request_id}"

    def reads(self) -> list[dict[str, Any]]:
        reads = [get_op(self._prefix + "consumed")]
        for each in self._entries:
            reads += [
                get_op(self._pending(each.number), keys_only=True),
                get_op(self._ids(each.request_id)),
            ]
        return reads

    def ops(
        self, found: list[list[dict[str, Any]]]
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        totals_key = self._prefix + "consumed"
        totals_data, totals_rev = _value(found[0])
        totals: dict[str, int] | None = {"count": 0, "bytes": 0}
        if totals_data is not None:
            try:
                totals = _counts(
                    totals_data, f"inbox consumed record {totals_key}", ("count", "bytes")
                )
            except CorruptRecord as exc:
                self._inbox._warn(self._agent, ("consumed", totals_rev), "%s: left as it is", exc)
                totals = None
        compare = [_mod_equal(totals_key, totals_rev)]
        success: list[dict[str, Any]] = []
        unsized: list[str] = []
        count = size = 0
        ids_written: set[str] = set()
        for index, each in enumerate(self._entries):
            pending_kvs, id_kvs = found[1 + 2 * index], found[2 + 2 * index]
            pending = self._pending(each.number)
            pending_rev = revision(pending_kvs[0]) if pending_kvs else 0
            compare.append(_mod_equal(pending, pending_rev))
            record, _id_rev = _value(id_kvs)
            doc = None
            if record is not None:
                try:
                    doc = _id_record(record, each.request_id)
                except CorruptRecord:
                    doc = None
            if pending_kvs:
                success.append(delete_op(pending, pending + "\0"))
                count += 1
                if doc is not None and doc["n"] == each.number and "size" in doc:
                    size += doc["size"]
                else:
                    unsized.append(pending)
            success.append(put_op(f"{self._prefix}done/{pad(each.number)}", each.request_id))
            # As a first admission does: a request id known under another number keeps it.
            if (doc is None or doc["n"] == each.number) and each.request_id not in ids_written:
                ids_written.add(each.request_id)
                reply = None if each.reply is None else self._ref
                value = {"n": each.number, "consumed": True, "reply": reply}
                success.append(put_op(self._ids(each.request_id), json.dumps(value)))
        size += self._sizes(unsized)
        if totals is not None and count:
            new = {"count": totals["count"] + count, "bytes": totals["bytes"] + size}
            success.append(put_op(totals_key, json.dumps(new)))
        return compare, success

    def _sizes(self, keys: list[str]) -> int:
        """The stored sizes of pending entries whose ids record does not say (rare: junk)."""
        if not keys:
            return 0
        found = ranges(self._inbox._connection.txn([], [get_op(key) for key in keys]))
        total = 0
        for kvs in found:
            data, _rev = _value(kvs)
            total += 0 if data is None else len(data)  # gone: the txn's compare fails
        return total
