"""Reading a store the earlier etcd store wrote, for ``hb migrate-store``: read only.

The keys that store wrote under the URL's prefix P and that a migration reads
(numbers zero-padded: seq and n to 20 digits, epoch to 10, an effect's index to 4)::

    P/cluster                                    the cluster record
    P/agents/A/lease                             the lease record; its version: the key's mod_revision
    P/agents/A/checkpoints/<seq>-<epoch>         a checkpoint's sealed bytes, one value
    P/agents/A/checkpoint-info/<seq>             {"epoch", "seq", "size", "written"}
    P/agents/A/effects/<seq>/<index>/<kind>      one sealed effect-journal record
    P/agents/A/acceptance                        the loss-acceptance record
    P/agents/A/heartbeats/<node>                 a node's heartbeat
    P/agents/A/inbox/pending/<n>                 a sealed submission not yet consumed
    P/agents/A/inbox/ids/<request id>            {"n", "size"} once admitted; {"n", "consumed":
                                                 true, "reply": "<epoch>-<seq>" or null} once consumed
    P/agents/A/inbox/replies/<n>/<epoch>-<seq>   a sealed reply, the one its ids record names

Each read answers as that store's did, bounded as it was: listings by a count (in pages
of ``_PAGE`` where values come along), values by the record's own limit.
"""

from __future__ import annotations

import base64
import logging
import re
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

from ...core import limits
from ...core.errors import ConfigError, CorruptRecord
from ...core.read_bounds import EFFECTS_READ, HEARTBEATS_READ, INBOX_READ, BoundedRead
from ...records import CheckpointInfo, ClusterRecord, Heartbeat, LeaseRecord, check_name, parse_json
from ...records.parsing import NAME_PATTERN
from .._reported import ReportedOnce
from ..backend import prefix_end
from ..backends.etcd_connection import EtcdConnection, parse_etcd_url
from ..base import MAX_LISTED_AGENTS, AdmissionState, parse_lease
from ..urls import redacted_url
from . import common

__all__ = ["EarlierEtcdStore", "open_earlier_etcd"]

log = logging.getLogger(__name__)

Kv = dict[str, Any]  # one key and value of a range's answer (base64, as the gateway has them)

_PAGE = 64  # kvs one paged range fetches (values included)
_SCANNED = 2 * limits.MAX_INBOX_COUNT  # pending keys one read_inbox looks at, junk included
_LIST_REQUESTS = 2 * MAX_LISTED_AGENTS  # list_agents: one request per agent or planted name
_HEARTBEAT_KEYS = 4 * HEARTBEATS_READ.count
_TXN_OPS = 100  # range requests in one txn: etcd's --max-txn-ops is 128 by default
_AGENT_NAME = re.compile(NAME_PATTERN.pattern.encode())
_NUMBER = re.compile(rb"[0-9]{20}")
_REPLY_REF = re.compile(r"[0-9]{10}-[0-9]{20}")


def _pad(number: int, digits: int = 20) -> str:
    return f"{number:0{digits}d}"


def _b64(data: str | bytes) -> str:
    return base64.b64encode(data.encode() if isinstance(data, str) else data).decode()


def _key(kv: Kv) -> bytes:
    try:
        return base64.b64decode(kv.get("key", ""))
    except ValueError:
        return b""


def _value(kv: Kv) -> bytes:
    try:
        return base64.b64decode(kv.get("value", ""))
    except ValueError as exc:  # the gateway's base64, never expected
        raise CorruptRecord(f"etcd answered a value that is not base64: {exc}") from exc


def _revision(kv: Kv) -> int:
    value = str(kv.get("mod_revision"))
    if not value.isdigit() or int(value) > limits.MAX_NUMBER:
        raise CorruptRecord(f"etcd metadata has no mod_revision in range: {value[:40]!r}")
    return int(value)


def _within(data: bytes, limit: int, what: str) -> bytes:
    """data, or CorruptRecord if it is over limit (etcd's request limit may be raised)."""
    if len(data) > limit:
        raise common.over_limit(what, len(data), limit)
    return data


def open_earlier_etcd(url: str) -> EarlierEtcdStore:
    """The earlier etcd store at url (etcd:// or etcds://, the prefix in its path); ConfigError
    if the URL is bad, nothing is stored under its prefix, or this version's layout is."""
    return EarlierEtcdStore(url)


class EarlierEtcdStore:
    """The reads ``hb migrate-store`` makes (``earlier.SourceStore``) of an earlier etcd store."""

    def __init__(self, url: str) -> None:
        target = parse_etcd_url(url)
        self.url = redacted_url(url)
        self._prefix = target.prefix
        self._connection = EtcdConnection(target)
        self._reported = ReportedOnce(log)
        try:
            self._check()
        except BaseException:
            self._connection.close()
            raise

    def _check(self) -> None:
        whole = self._prefix + "/"
        if not self._range(whole, prefix_end(whole), limit=1, keys_only=True):
            where = self._connection.all_endpoints()
            raise ConfigError(f"no HamsterBunker store under {self._prefix} in etcd {where}")
        if self._range(whole + "index/", prefix_end(whole + "index/"), limit=1, keys_only=True):
            raise common.already_migrated(self.url, f"keys under {whole}index/")

    def _agent(self, agent: str) -> str:
        return f"{self._prefix}/agents/{check_name('agent id', agent)}/"

    def _ranges(self, *requests: dict[str, Any]) -> list[dict[str, Any]]:
        """The answers of range requests, read in one txn (nothing compared, nothing written)."""
        with self._connection.errors_translated("read"):
            response = self._connection.txn([], [{"request_range": each} for each in requests])
        return [op.get("response_range", {}) for op in response.get("responses", [])]

    def _range(self, key: str | bytes, end: str | None = None, **options: Any) -> list[Kv]:
        ends = {} if end is None else {"range_end": _b64(end)}
        kvs: list[Kv] = self._ranges({"key": _b64(key), **ends, **options})[0].get("kvs", [])
        return kvs

    def _pages(self, start: bytes, end: str, *, keys_only: bool = False) -> Iterator[list[Kv]]:
        """The kvs from start up to end in pages of _PAGE, each fetched when the one before
        is used up: the caller stops when it has looked at enough."""
        while True:
            kvs = self._range(start, end, limit=_PAGE, keys_only=keys_only)
            if kvs:
                yield kvs
            if len(kvs) < _PAGE or not _key(kvs[-1]):
                return
            start = _key(kvs[-1]) + b"\0"

    def _skip(self, agent: str, kv: Kv | None, why: str, *args: object) -> None:
        """Log once that something stored for agent was left out."""
        where = (_key(kv), kv.get("mod_revision")) if kv is not None else None
        self._reported.warn((agent, where, why), f"earlier etcd store: {agent}: {why}", *args)

    # -- cluster, agents, lease, heartbeats ---------------------------------

    def read_cluster(self) -> ClusterRecord | None:
        found = self._range(f"{self._prefix}/cluster")
        return ClusterRecord.from_json(_value(found[0])) if found else None

    def list_agents(self) -> list[str]:
        # A key per request, each past the agent's keys before: one request per agent (or
        # planted name), however many keys an agent holds.
        agents = f"{self._prefix}/agents/"
        base, end = agents.encode(), prefix_end(agents)
        start, found = base, list[str]()
        for _request in range(_LIST_REQUESTS):
            kvs = self._range(start, end, limit=1, keys_only=True)
            key = _key(kvs[0]) if kvs else b""
            if not key.startswith(base) or len(found) >= MAX_LISTED_AGENTS:
                break
            name, slash, _rest = key[len(base) :].partition(b"/")
            start = base + name + b"0" if slash else key + b"\0"  # b"0" follows b"/"
            if _AGENT_NAME.fullmatch(name):
                found.append(name.decode())
        return found

    def read_lease(self, agent: str) -> LeaseRecord | None:
        found = self._range(self._agent(agent) + "lease")
        if not found:
            return None
        version = _revision(found[0])
        return replace(
            parse_lease(_value(found[0]), lambda: f"revision {version}"), version=version
        )

    def list_heartbeats(self, agent: str) -> list[Heartbeat]:
        beats = self._agent(agent) + "heartbeats/"
        stored: BoundedRead[str] = BoundedRead(HEARTBEATS_READ)
        for kv in self._range(beats, prefix_end(beats), limit=_HEARTBEAT_KEYS):
            if stored.full:
                break
            name = _key(kv).removeprefix(beats.encode()).decode("utf-8", "surrogateescape")
            data = _value(kv)
            if stored.too_big(len(data)):
                self._skip(agent, kv, "heartbeat of %s: %d bytes, over the limit", name, len(data))
            else:
                stored.offer(name, data)
        return common.heartbeats(
            stored, lambda node, exc: self._skip(agent, None, "heartbeat of %s: %s", node, exc)
        )

    # -- checkpoints, effects, acceptance ------------------------------------

    def list_checkpoints(self, agent: str) -> list[CheckpointInfo]:
        infos = self._agent(agent) + "checkpoint-info/"
        listed, looked = [], 0
        for kvs in self._pages(infos.encode(), prefix_end(infos)):
            for kv in kvs:
                name = _key(kv).removeprefix(infos.encode())
                seq = common.seq_named(_NUMBER, name)
                if seq is None:
                    self._skip(agent, kv, "checkpoint description %r: not a name written", name)
                    continue
                try:
                    listed.append(CheckpointInfo.from_json(_value(kv), seq))
                except CorruptRecord as exc:
                    self._skip(agent, kv, "checkpoint %d left out: %s", seq, exc)
            looked += len(kvs)
            if looked >= limits.MAX_CHECKPOINTS_LISTED:
                break
        return common.newest_first(listed)

    def read_checkpoint(self, agent: str, info: CheckpointInfo) -> bytes:
        key = f"{self._agent(agent)}checkpoints/{_pad(info.seq)}-{_pad(info.epoch, 10)}"
        found = self._range(key)
        if not found:
            raise common.no_longer_retained(agent, info)
        what = f"checkpoint {info.seq} of {agent!r}"
        return _within(_value(found[0]), limits.MAX_CHECKPOINT_BYTES, what)

    def read_effects(self, agent: str, seq: int) -> dict[tuple[int, str], bytes]:
        step = f"{self._agent(agent)}effects/{_pad(seq)}/"
        # Keys only, of the names an index below the bound can have, no more of them than
        # a step's records; the step's other keys only counted.
        names_end = _b64(step + _pad(limits.MAX_EFFECTS_PER_STEP, 4))
        listing, counted = self._ranges(
            {"key": _b64(step + _pad(0, 4)), "range_end": names_end, "keys_only": True,
             "limit": EFFECTS_READ.count},
            {"key": _b64(step), "range_end": _b64(prefix_end(step)), "count_only": True},
        )  # fmt: skip
        listed: list[Kv] = listing.get("kvs", [])
        every = {f"{step}{index:04d}/{kind}": (index, kind) for index, kind in common.EVERY_EFFECT}
        names: dict[str, tuple[int, str]] = {}
        for kv in listed:
            key = _key(kv).decode("utf-8", "replace")
            if key in every:
                names[key] = every[key]
            else:
                self._skip(agent, kv, "effect journal of step %d: a name not written", seq)
        if len(listed) >= EFFECTS_READ.count and len(names) < len(listed):
            names = every  # planted names took places of the listing: look under every name
        if int(counted.get("count", 0) or 0) > len(listed):
            self._skip(agent, None, "effect journal of step %d: keys left unread", seq)
        journal: BoundedRead[tuple[int, str]] = BoundedRead(EFFECTS_READ)
        keys = list(names)
        for first in range(0, len(keys), _TXN_OPS):
            chunk = keys[first : first + _TXN_OPS]
            found = self._ranges(*({"key": _b64(key)} for key in chunk))
            for key, answer in zip(chunk, found, strict=True):
                for kv in answer.get("kvs", [])[:1]:  # none: removed since it was listed
                    data = _value(kv)
                    if journal.too_big(len(data)):
                        self._skip(agent, kv, "effect record of step %d over its limit", seq)
                    else:
                        journal.offer(names[key], data)
            if journal.full:
                break
        return dict(journal.entries)

    def read_acceptance(self, agent: str) -> bytes | None:
        found = self._range(self._agent(agent) + "acceptance")
        what = f"loss-acceptance record of {agent!r}"
        return _within(_value(found[0]), limits.MAX_RECORD_BYTES, what) if found else None

    # -- inbox ---------------------------------------------------------------

    def read_inbox(self, agent: str, after: int = 0) -> list[tuple[int, bytes]]:
        if after >= limits.MAX_SEQ:
            return []
        pending = self._agent(agent) + "inbox/pending/"
        start = (pending + _pad(max(after, 0) + 1)).encode()
        found: BoundedRead[int] = BoundedRead(INBOX_READ)
        scanned = 0
        for kvs in self._pages(start, prefix_end(pending)):
            for kv in kvs:
                scanned += 1
                name = _key(kv).removeprefix(pending.encode())
                number = common.seq_named(_NUMBER, name)
                if number is None:
                    self._skip(agent, kv, "inbox key %r: not a name written", name[:80])
                    continue
                data = _value(kv)
                if len(data) > limits.MAX_SUBMISSION_BYTES:
                    self._skip(
                        agent, kv, "submission %d: %d bytes, over the limit", number, len(data)
                    )
                elif number > after and not found.offer(number, data):
                    break
            if found.full or scanned >= _SCANNED:
                break
        return found.entries

    def read_admission(self, agent: str, request_id: str) -> AdmissionState | None:
        if limits.check_request_id(request_id) is not None:
            return None  # no admission is stored under a name that is no request id
        inbox = self._agent(agent) + "inbox/"
        found = self._range(f"{inbox}ids/{request_id}")
        if not found:
            return None
        try:
            doc = _id_record(_value(found[0]), f"inbox record of request id {request_id}")
        except CorruptRecord as exc:
            self._skip(agent, found[0], "%s: taken as unknown", exc)
            return None
        number = doc["n"]
        if doc.get("consumed") is not True or doc.get("reply") is None:
            return AdmissionState(number, consumed=doc.get("consumed") is True, reply=None)
        stored = self._range(f"{inbox}replies/{_pad(number)}/{doc['reply']}")
        reply = _value(stored[0]) if stored else None
        if reply is None or len(reply) > limits.MAX_REPLY_BYTES:
            self._skip(agent, found[0], "the reply to %s: taken as no reply yet", request_id)
            reply = None
        return AdmissionState(number, consumed=True, reply=reply)

    def request_ids(self, agent: str, most: int) -> list[str]:
        """The request ids the inbox keeps (pending, or consumed and kept), at most most, by
        name alone; junk names beside them take their part of the 2 * most looked at."""
        ids = (self._agent(agent) + "inbox/ids/").encode()
        found: list[str] = []
        scanned = 0
        if most < 1:
            return found
        for kvs in self._pages(ids, prefix_end(ids.decode()), keys_only=True):
            scanned += len(kvs)
            for kv in kvs:
                request_id = _key(kv)[len(ids) :].decode("ascii", "replace")
                if limits.check_request_id(request_id) is None:
                    found.append(request_id)
            if len(found) >= most or scanned >= 2 * most:
                break
        return found[:most]

    def close(self) -> None:
        self._connection.close()


def _id_record(data: bytes, what: str) -> dict[str, Any]:
    """An ids record, checked: n in bounds, and size (admitted) or reply (consumed)."""
    doc = parse_json(data, what)
    if not isinstance(doc, dict):
        raise CorruptRecord(f"{what} is not a JSON object")
    number = doc.get("n")
    if type(number) is not int or not 0 < number <= limits.MAX_SEQ:
        raise CorruptRecord(f"{what} has no number in 1..{limits.MAX_SEQ}")
    if doc.get("consumed") is True:
        reply = doc.get("reply")
        if reply is not None and not (isinstance(reply, str) and _REPLY_REF.fullmatch(reply)):
            raise CorruptRecord(f"{what} names no reply this store writes")
    else:
        size = doc.get("size")
        if type(size) is not int or not 0 <= size <= limits.MAX_SUBMISSION_BYTES:
            raise CorruptRecord(f"{what} has no size in 0..{limits.MAX_SUBMISSION_BYTES}")
    return doc
