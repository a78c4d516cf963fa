"""The etcd store: ``etcd://host:port[,host:port...]/prefix`` (``etcds://`` for TLS).

Every operation that must be atomic is one etcd transaction, so etcd itself
(Raft: linearizable, committed on a majority) decides races and fences stale
writers; no local flag is ever the guard. Keys under the prefix P::

    P/cluster                                   cluster record (txn: create_revision == 0)
    P/agents/A/lease                            lease record; its version is the key's mod_revision
    P/agents/A/fence                            [holder, session, epoch] of that lease, same txn
    P/agents/A/checkpoints/<seq>-<epoch>        sealed bytes (seq and epoch zero-padded)
    P/agents/A/checkpoint-info/<seq>            {"epoch", "seq", "size", "written"}, same txn
    P/agents/A/effects/<seq>/<index>/<kind>     one sealed effect-journal record (seq, index padded)
    P/agents/A/inbox/...                        the inbox: see ``hamsterbunker.stores.etcd.inbox``
    P/agents/A/acceptance                       the loss-acceptance record (``hb accept-loss``)
    P/agents/A/heartbeats/<node>                heartbeat record
    P/agents/A/event-nodes/<node>               empty: lets readers find every node's log
    P/agents/A/events/<node>/<n>                one event; the oldest are deleted past the bound

``cas_lease`` compares the lease key's mod_revision (create_revision 0 for "no
record yet") and writes lease and fence in one txn (``take_lease`` reads what
a restore needs in that txn too). ``put_checkpoint`` reads
the names of the checkpoints at or above the new seq, and refuses the write if
one of them is of the writer's own epoch (only the fenced leader writes under
its epoch, so that read cannot go stale; a client's later puts under the same
fence skip it, knowing what they wrote); then one txn compares the fence key's
value with the writer's fence and the new key's create_revision with 0 (nothing
is overwritten), writes bytes and info and deletes what retention drops (only
below the new seq) and another epoch's bytes under the same seq, and the effect
journal of the new seq and older (one delete-range, up to ``effects/<seq + 1>``).
``put_effect`` is one txn comparing the fence key as the checkpoint txn does.
``read_effects`` lists the step's keys (keys only, the lowest
``2 * MAX_EFFECTS_PER_STEP`` names an index below the bound can have; the rest
only counted), then gets the values of those that parse. Watches follow the
lease key (``lease_only``) or the agent's whole prefix. ``forget_node`` deletes
a node's heartbeat, index key and log in one txn (``forget``); an append writes
the index key in its own txn wherever it is missing.

Nothing stored is trusted (DESIGN.md invariant 10): a key under the prefix
whose name does not parse, or a description that does not, is skipped and
logged once, never raised; checkpoints of other epochs above the new seq
(junk, or damaged ones the runtime skipped) never keep a write out. A stored
checkpoint above ``MAX_CHECKPOINT_BYTES`` or a record above ``MAX_RECORD_BYTES``
is a CorruptRecord, and an effect-journal record above ``MAX_EFFECT_BYTES`` is
left out (etcd's request limit bounds what one read fetches: etcd cannot measure
a value without sending it).

Limits. etcd refuses a request over its ``--max-request-bytes`` (1.5 MiB by
default), so a checkpoint larger than about 1.5 MiB is refused with a
StoreError that says so: raise the limit on every member, or keep the agent's
state smaller. TLS: ``etcds://h:2379/p?ca=CA.pem&cert=client.pem&key=client.key``
(mutual TLS; ``ca`` alone for server-only TLS). The files are loaded when the
URL is parsed, so a missing file, one that is not PEM or a key that does not
match its certificate is a ConfigError at start; a refused TLS handshake is
reported in words (the server's certificate not trusted by ``ca``, or the
client certificate refused by the server). ``timeout=SECONDS`` (default 5)
bounds every request, so a dead or frozen member is a StoreUnavailable, never
a hang; after one, the next call goes to the next endpoint. Requests are never
retried within a call: a write whose answer was lost may have been applied, and
the lease logic above copes with that (its next compare-and-set conflicts).
Needs etcd 3.4 or newer (the ``/v3`` gateway path). Proxies and CA bundles
named in the environment are not used: the URL says how to reach etcd.

The client library is etcd3gw (OpenStack, used by tooz): maintained, typed,
and light (requests, futurist, pbr). It talks to the gRPC-JSON gateway every
etcd member serves on its client port, which has KV, txn with range compares,
watch and TLS with client certificates. python-etcd3 (gRPC) had its last
release in 2020 and breaks with protobuf 4 or newer; aetcd (gRPC) is asyncio
only, while this contract is blocking and called from threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import re
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any, Concatenate, ParamSpec, TypeVar

from etcd3gw.client import Etcd3Client
from etcd3gw.types import Event as WatchEvent

from ...blob import Blob
from ...errors import ConfigError, CorruptRecord, LeaseConflict, StoreError
from ...limits import (
    INBOX_REPLIES_KEPT,
    MAX_CHECKPOINT_BYTES,
    MAX_RECORD_BYTES,
    check_checkpoint_bounds,
)
from ...read_bounds import HEARTBEATS_READ, BoundedRead
from ...records import CheckpointInfo, ClusterRecord, Event, Heartbeat, LeaseRecord, check_name
from .._reported import ReportedOnce, readable
from ..backends.etcd_connection import EtcdConnection, parse_etcd_url
from ..base import (
    MAX_LISTED_AGENTS,
    AdmissionState,
    Consumed,
    Fence,
    HeardLease,
    RestoreRead,
    Store,
    StoreGuarantees,
    StoreReport,
    check_consumed,
    fence_text,
    newest_first,
    parse_lease,
)
from ..urls import redacted_url
from .checkpoints import EtcdCheckpoints
from .effects import EtcdEffects
from .forget import forget_ops
from .inbox import EtcdInbox
from .kv import (
    TXN_OPS,
    b64,
    checkpoint_key,
    delete_op,
    get_op,
    kv_key,
    pad,
    put_op,
    range_end,
    ranges,
    revision,
    unb64,
)
from .rewrites import EtcdRewrites
from .watch import Follower, lease_in, term_changes

__all__ = ["GUARANTEES", "EtcdStore"]

log = logging.getLogger(__name__)

GUARANTEES = StoreGuarantees(
    mutual_exclusion="etcd transactions: the lease compare-and-set (on the key's mod_revision) "
    "and the fenced checkpoint write (a compare of the lease's holder, session and epoch) are "
    "each one linearizable txn, decided by Raft; a stale writer is refused by etcd itself",
    durability="a write is acknowledged once a majority of the etcd members has it in its "
    "fsynced log; a one-member etcd is only as durable as its one disk",
    across_hosts="yes: every node that reaches the cluster (etcds:// for mutual TLS); a 3- or "
    "5-member cluster keeps working while a minority of members is lost",
)

# A watch stream that dies silently (a member restarts, a connection is cut) is
# not reported by etcd3gw, so every stream is replaced after this long, from the
# last revision seen: a lost stream costs at most this much of early wake-ups.
_WATCH_RENEW_S = 10.0

# list_agents: an agent id as check_name takes it, and the most range requests it makes.
_AGENT_NAME = re.compile(rb"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_LIST_REQUESTS = 2 * MAX_LISTED_AGENTS
# The most heartbeat keys one read fetches: four times the heartbeats it takes.
_HEARTBEAT_KEYS = 4 * HEARTBEATS_READ.count
# What an unreadable lease record is (UnreadableLease.found): the revision that wrote it.
_FOUND = "revision %d"
_FOUND_REVISION = re.compile(r"revision ([0-9]{1,19})")

P = ParamSpec("P")
R = TypeVar("R")


def _translated(
    method: Callable[Concatenate[EtcdStore, P], R],
) -> Callable[Concatenate[EtcdStore, P], R]:
    """Translate etcd3gw's and requests' errors at the store boundary, keeping the reason."""

    @functools.wraps(method)
    def translated(self: EtcdStore, /, *args: P.args, **kwargs: P.kwargs) -> R:
        with self._connection.errors_translated(method.__name__.lstrip("_")):
            return method(self, *args, **kwargs)

    return translated


class EtcdStore(Store):
    """A store in an etcd v3 cluster, under one key prefix."""

    guarantees = GUARANTEES

    def __init__(
        self,
        url: str,
        *,
        keep_checkpoints: int = 5,
        events_per_node: int = 1000,
        keep_replies: int = INBOX_REPLIES_KEPT,
        create: bool = True,
    ) -> None:
        if keep_checkpoints < 1:
            raise ConfigError("keep_checkpoints must be at least 1")
        if keep_replies < 1:
            raise ConfigError("keep_replies must be at least 1")
        if events_per_node < 1:
            raise ConfigError("events_per_node must be at least 1")
        self.url = redacted_url(url)
        self.target = parse_etcd_url(url)
        self.keep_checkpoints = keep_checkpoints
        self.events_per_node = events_per_node
        self.warnings: list[str] = []
        self._connection = EtcdConnection(self.target)
        self._followers: set[Follower] = set()
        self._reported = ReportedOnce(log)
        self._checkpoints = EtcdCheckpoints(
            self._connection, self._agent_prefix, self._reported, keep_checkpoints
        )
        self._effects = EtcdEffects(self._connection, self._agent_prefix, self._reported)
        self._inbox = EtcdInbox(self._connection, self._agent_prefix, self._reported, keep_replies)
        self._rewrites = EtcdRewrites(self._connection, self.target.prefix, self._agent_prefix)
        if not create and not self._exists():
            where = self._connection.all_endpoints()
            raise ConfigError(f"no HamsterBunker store under {self.target.prefix} in etcd {where}")

    @property
    def _kv(self) -> Etcd3Client:
        return self._connection.kv

    @_translated
    def _exists(self) -> bool:
        prefix = self.target.prefix + "/"
        return bool(self._kv.get(prefix, range_end=range_end(prefix), limit=1, keys_only=True))

    def _agent_prefix(self, agent: str) -> str:
        return f"{self.target.prefix}/agents/{check_name('agent id', agent)}/"

    @_translated
    def list_agents(self) -> list[str]:
        # A keys-only range of one key per request, skipping past each agent's
        # prefix: one request per agent (or per planted name), however many keys
        # an agent holds, and at most _LIST_REQUESTS requests.
        agents = f"{self.target.prefix}/agents/"
        base, end = agents.encode(), range_end(agents)
        start = base
        found: list[str] = []
        for _request in range(_LIST_REQUESTS):
            kvs = self._kv.get(start, metadata=True, range_end=end, limit=1, keys_only=True)
            key = kvs[0][1].get("key", b"") if kvs else b""
            if not key.startswith(base) or len(found) >= MAX_LISTED_AGENTS:
                break
            name, slash, _rest = key[len(base) :].partition(b"/")
            # Past every key under name/ (b"0" follows b"/"), or past this one key.
            start = base + name + b"0" if slash else key + b"\0"
            if _AGENT_NAME.fullmatch(name):
                found.append(name.decode())
        return found

    # -- cluster -----------------------------------------------------------

    @_translated
    def read_cluster(self) -> ClusterRecord | None:
        found = self._kv.get(f"{self.target.prefix}/cluster")
        return ClusterRecord.from_json(found[0]) if found else None

    @_translated
    def create_cluster(self, record: ClusterRecord) -> ClusterRecord:
        key = f"{self.target.prefix}/cluster"
        data = record.to_json()
        response = self._connection.txn(
            [{"key": b64(key), "target": "CREATE", "result": "EQUAL", "create_revision": 0}],
            [put_op(key, data)],
            [get_op(key)],
        )
        if response.get("succeeded"):
            return ClusterRecord.from_json(data)
        kvs = ranges(response)[0]
        if not kvs:
            raise StoreError(f"cluster record under {self.target.prefix} vanished")
        return ClusterRecord.from_json(unb64(kvs[0].get("value", "")))

    @_translated
    def replace_cluster(self, expected: ClusterRecord, new: ClusterRecord) -> ClusterRecord:
        return self._rewrites.replace_cluster(expected, new)

    @_translated
    def reseal_checkpoint(self, agent: str, info: CheckpointInfo, old: bytes, new: bytes) -> bool:
        return self._rewrites.reseal_checkpoint(agent, info, old, new)

    @_translated
    def reseal_effect(
        self, agent: str, seq: int, index: int, kind: str, old: bytes, new: bytes
    ) -> bool:
        return self._rewrites.reseal_effect(agent, seq, index, kind, old, new)

    @_translated
    def reseal_submission(self, agent: str, number: int, old: bytes, new: bytes) -> bool:
        return self._rewrites.reseal_submission(agent, number, old, new)

    @_translated
    def read_replies(
        self, agent: str, after: int, limit: int
    ) -> tuple[list[tuple[int, bytes]], int | None]:
        return self._inbox.replies(agent, after, limit)

    @_translated
    def reseal_reply(self, agent: str, number: int, old: bytes, new: bytes) -> bool:
        return self._rewrites.reseal_reply(agent, number, old, new)

    # -- lease -------------------------------------------------------------

    @_translated
    def read_lease(self, agent: str) -> LeaseRecord | None:
        found = self._kv.get(self._agent_prefix(agent) + "lease", metadata=True)
        if not found:
            return None
        data, meta = found[0]
        version = revision(meta)
        return replace(parse_lease(data, lambda: _FOUND % version), version=version)

    @_translated
    def cas_lease(self, agent: str, expected_version: int | None, new: LeaseRecord) -> LeaseRecord:
        return self._cas_lease(agent, expected_version, new, [])[0]

    @_translated
    def replace_unreadable_lease(self, agent: str, found: str, new: LeaseRecord) -> LeaseRecord:
        # The revision of a write names it: compared as a renewal compares its own.
        match = _FOUND_REVISION.fullmatch(found)
        if match is None:
            raise LeaseConflict(f"lease of {agent!r}: {found[:40]!r} names no revision")
        return self._cas_lease(agent, int(match[1]), new, [])[0]

    @_translated
    def take_lease(
        self, agent: str, expected_version: int | None, new: LeaseRecord
    ) -> tuple[LeaseRecord, RestoreRead | None]:
        """One txn: the compare-and-set, and read_for_restore's reads as of it (and the
        inbox's first page: the new term's first look at its inbox)."""
        reads = self._restore_ops(agent, inbox=True)
        taken, found = self._cas_lease(agent, expected_version, new, reads)
        try:
            return taken, self._restore_read(agent, found)
        except StoreError:  # the lease is taken all the same: the restore reads again
            return taken, None

    def _cas_lease(
        self, agent: str, expected_version: int | None, new: LeaseRecord, reads: list[Any]
    ) -> tuple[LeaseRecord, list[list[dict[str, Any]]]]:
        """The compare-and-set, with more range requests in its txn: (the record written,
        what those found)."""
        prefix = self._agent_prefix(agent)
        key = prefix + "lease"
        if expected_version is None:
            compare = {"target": "CREATE", "result": "EQUAL", "create_revision": 0}
        elif expected_version < 1:  # etcd would compare a missing key's mod_revision 0 as equal
            raise LeaseConflict(f"lease of {agent!r}: version {expected_version} is never stored")
        else:
            compare = {"target": "MOD", "result": "EQUAL", "mod_revision": expected_version}
        response = self._connection.txn(
            [{"key": b64(key), **compare}],
            [
                # The version lives in etcd (mod_revision), not in the stored JSON.
                put_op(key, replace(new, version=0).to_json()),
                put_op(prefix + "fence", fence_text(new.holder, new.session, new.epoch)),
                *reads,
            ],
            [get_op(key, keys_only=True)],
        )
        if not response.get("succeeded"):
            kvs = ranges(response)[0]
            current = revision(kvs[0]) if kvs else None
            raise LeaseConflict(
                f"lease of {agent!r} is at version {current}, not {expected_version}"
            )
        written = replace(new, version=revision(response.get("header", {}), "revision"))
        return written, ranges(response)[2:]

    # -- checkpoints -------------------------------------------------------

    @_translated
    def put_checkpoint(
        self, agent: str, fence: Fence, seq: int, blob: Blob, consumed: Sequence[Consumed] = ()
    ) -> CheckpointInfo:
        # Before the replies are staged, and before a blob in pieces is made.
        problem = check_checkpoint_bounds(seq, fence.epoch, len(blob)) or check_consumed(consumed)
        if problem is not None:  # refused before anything is sent
            raise StoreError(problem)
        data = bytes(blob)  # one value in one txn: its pieces (if it has them) joined
        if not consumed:
            return self._checkpoints.put(agent, fence, seq, data)
        return self._inbox.checkpoint(agent, fence, seq, data, consumed, self._checkpoints.put)

    @_translated
    def list_checkpoints(self, agent: str) -> list[CheckpointInfo]:
        return self._checkpoints.list(agent)

    @_translated
    def read_checkpoint(self, agent: str, info: CheckpointInfo) -> bytes:
        found = self._kv.get(checkpoint_key(self._agent_prefix(agent), info.seq, info.epoch))
        if not found:
            raise StoreError(f"checkpoint {info.seq} of {agent!r} is no longer retained")
        return _checkpoint_within_bounds(agent, info, found[0])

    @_translated
    def read_for_restore(self, agent: str) -> RestoreRead:
        """One txn reads the descriptions, the acceptance record and the checkpoint under
        the highest key: the newest one, unless planted keys say otherwise (it is read
        on its own then)."""
        return self._restore_read(agent, ranges(self._connection.txn([], self._restore_ops(agent))))

    def _restore_ops(self, agent: str, *, inbox: bool = False) -> list[dict[str, Any]]:
        """The range requests of read_for_restore, and of the inbox's first page if asked
        (what they found: _restore_read)."""
        return [
            self._checkpoints.list_op(agent),
            get_op(self._agent_prefix(agent) + "acceptance"),
            self._checkpoints.newest_op(agent),
            *([self._inbox.first_page_op(agent)] if inbox else []),
        ]

    def _restore_read(self, agent: str, found: list[list[dict[str, Any]]]) -> RestoreRead:
        prefix = self._agent_prefix(agent)
        listing, acceptance, top = found[:3]
        pending = self._inbox.read_on(agent, 0, found[3]) if len(found) > 3 else None
        infos = newest_first(self._checkpoints.listed(agent, listing))
        try:
            data = unb64(acceptance[0].get("value", "")) if acceptance else None
            accepted = data and _acceptance_within_bounds(agent, data)
            read = RestoreRead(infos, accepted, None, inbox=pending)
        except CorruptRecord as exc:
            read = RestoreRead(infos, None, None, str(exc), pending)
        if not infos:
            return read
        newest = infos[0]
        if top and kv_key(top[0]) == checkpoint_key(prefix, newest.seq, newest.epoch).encode():
            blob = _checkpoint_within_bounds(agent, newest, unb64(top[0].get("value", "")))
        else:
            blob = self.read_checkpoint(agent, newest)
        return replace(read, newest=blob)

    # -- effect journal ----------------------------------------------------

    @_translated
    def put_effect(
        self, agent: str, fence: Fence, seq: int, index: int, kind: str, blob: bytes
    ) -> None:
        self._effects.put(agent, fence, seq, index, kind, blob)

    @_translated
    def read_effects(self, agent: str, seq: int) -> dict[tuple[int, str], bytes]:
        return self._effects.read(agent, seq)

    # -- inbox -------------------------------------------------------------

    @_translated
    def admit(self, agent: str, request_id: str, number: int, blob: bytes) -> tuple[int, bool]:
        return self._inbox.admit(agent, request_id, number, blob)

    @_translated
    def read_inbox(self, agent: str, after: int = 0) -> list[tuple[int, bytes]]:
        return self._inbox.read(agent, after)

    @_translated
    def request_ids(self, agent: str, most: int) -> list[str]:
        """The request ids the inbox keeps, at most most (``stores.migrate``)."""
        return self._inbox.request_ids(agent, most)

    @_translated
    def read_admission(self, agent: str, request_id: str) -> AdmissionState | None:
        return self._inbox.admission(agent, request_id)

    # -- loss acceptance ---------------------------------------------------

    @_translated
    def read_acceptance(self, agent: str) -> bytes | None:
        found = self._kv.get(self._agent_prefix(agent) + "acceptance")
        return _acceptance_within_bounds(agent, found[0]) if found else None

    @_translated
    def put_acceptance(self, agent: str, data: bytes) -> None:
        if len(data) > MAX_RECORD_BYTES:  # it could never be read back
            raise StoreError(
                f"loss-acceptance record of {agent!r} is {len(data)} bytes, above the limit of "
                f"{MAX_RECORD_BYTES} bytes"
            )
        self._kv.put(self._agent_prefix(agent) + "acceptance", bytes(data))

    # -- heartbeats --------------------------------------------------------

    @_translated
    def put_heartbeat(self, agent: str, heartbeat: Heartbeat) -> None:
        node = check_name("node id", heartbeat.node)
        self._kv.put(f"{self._agent_prefix(agent)}heartbeats/{node}", heartbeat.to_json())

    @_translated
    def list_heartbeats(self, agent: str) -> list[Heartbeat]:
        beats = self._agent_prefix(agent) + "heartbeats/"
        # Keys and values of four times the nodes a read takes, at most: planted keys
        # beside them cost no more than that.
        found = self._kv.get(
            beats, metadata=True, range_end=range_end(beats), limit=_HEARTBEAT_KEYS
        )
        prefix = beats.encode()
        # In key order (by node id); a copy under another node's name is not that node's.
        stored: BoundedRead[str] = BoundedRead(HEARTBEATS_READ)
        items: dict[str, tuple[bytes, Mapping[str, Any]]] = {}
        for data, meta in found:
            name = meta.get("key", b"").removeprefix(prefix).decode("utf-8", "surrogateescape")
            if stored.full:
                break
            if stored.too_big(len(data)):
                too_big = CorruptRecord(f"{len(data)} bytes, above the limit of {MAX_RECORD_BYTES}")
                self._report_heartbeat(agent, name, (data, meta), too_big)
            elif stored.offer(name, data):
                items[name] = (data, meta)
        return list(
            readable(
                ((name, items[name]) for name, _data in stored.entries),
                lambda item: Heartbeat.from_json(item[0]),
                functools.partial(self._report_heartbeat, agent),
            )
        )

    def _report_heartbeat(
        self, agent: str, _node: str, item: tuple[bytes, Mapping[str, Any]], exc: Exception
    ) -> None:
        key = item[1].get("key", b"")
        self._reported.warn(
            (agent, key, item[1].get("mod_revision")),
            "ignoring unreadable heartbeat %s: %s",
            key.decode("utf-8", "replace")[-80:],
            exc,
        )

    @_translated
    def remove_heartbeat(self, agent: str, node: str) -> None:
        self._kv.delete(f"{self._agent_prefix(agent)}heartbeats/{check_name('node id', node)}")

    # -- events ------------------------------------------------------------

    @_translated
    def append_event(self, agent: str, event: Event) -> None:
        node = check_name("node id", event.node)
        prefix = self._agent_prefix(agent)
        log_prefix = f"{prefix}events/{node}/"
        ops = [put_op(log_prefix + pad(event.n), event.to_json())]
        if event.n > self.events_per_node:  # bounded: drop everything below the newest N
            ops.append(delete_op(log_prefix, log_prefix + pad(event.n - self.events_per_node + 1)))
        # The index key is written only where it is missing: on the first event, and
        # after hb forget deleted it (even under a process that still runs).
        index = f"{prefix}event-nodes/{node}"
        indexed = {"key": b64(index), "target": "CREATE", "result": "GREATER", "create_revision": 0}
        self._connection.txn([indexed], ops, [*ops, put_op(index, b"")])

    @_translated
    def read_events(self, agent: str, after: Mapping[str, int] | None = None) -> list[Event]:
        after = after or {}
        prefix = self._agent_prefix(agent)
        index = prefix + "event-nodes/"
        found = self._kv.get(index, metadata=True, range_end=range_end(index), keys_only=True)
        nodes = []
        for _value, meta in found:
            name = meta.get("key", b"").removeprefix(index.encode())
            try:  # a node id as check_name accepts it, or a key someone else put there
                nodes.append(check_name("node id", name.decode("ascii")))
            except (UnicodeDecodeError, ConfigError):
                self._reported.warn(
                    (agent, name), "etcd store: skipping event log %r of %s", name[:80], agent
                )
        nodes.sort()
        if not nodes:
            return []
        # Read-only txns (one per TXN_OPS nodes): only each node's events past its cursor.
        reads = []
        for node in nodes:
            log_prefix = f"{prefix}events/{node}/"
            start = log_prefix + pad(after.get(node, 0) + 1)
            reads.append(get_op(start, range_end(log_prefix)))
        found_kvs: list[list[dict[str, Any]]] = []
        for first in range(0, len(reads), TXN_OPS):
            found_kvs += ranges(self._connection.txn([], reads[first : first + TXN_OPS]))
        events: list[Event] = []
        for node, kvs in zip(nodes, found_kvs, strict=True):  # each in key order: by n
            logged = readable(
                ((node, kv) for kv in kvs),
                lambda kv: Event.from_json(unb64(kv.get("value", ""))),
                functools.partial(self._report_event, agent),
                errors=(CorruptRecord, ValueError),  # ValueError: the gateway's base64
            )
            events.extend(event for event in logged if event.n > after.get(node, 0))
        return events

    def _report_event(self, agent: str, node: str, kv: Mapping[str, Any], exc: Exception) -> None:
        self._reported.warn(
            (agent, kv_key(kv), kv.get("mod_revision")),
            "ignoring unreadable event of %s: %s",
            node,
            exc,
        )

    @_translated
    def forget_node(self, agent: str, node: str) -> None:
        self._connection.txn([], forget_ops(self._agent_prefix(agent), node))

    # -- watch -------------------------------------------------------------

    async def watch(
        self, agent: str, *, lease_only: bool = False, terms_only: bool = False
    ) -> AsyncIterator[LeaseRecord | None]:
        """Yield after etcd reports a change of the lease key (lease_only: of its term, with
        terms_only, judged from the value the event carries) or of any agent key.

        With lease_only, the newest record the events since the last yield carried."""
        prefix = self._agent_prefix(agent)
        key, end = (prefix + "lease", None) if lease_only else (prefix, range_end(prefix))
        loop = asyncio.get_running_loop()
        changed = asyncio.Event()
        heard = HeardLease()

        def hint(event: WatchEvent | None) -> None:
            record = lease_in(event) if lease_only else None
            with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits any more
                loop.call_soon_threadsafe(heard_now, record)

        def heard_now(record: LeaseRecord | None) -> None:
            heard.add(record)
            changed.set()

        wanted = term_changes() if lease_only and terms_only else None
        follower = Follower(self._connection, key, end, hint, renew_s=_WATCH_RENEW_S, wanted=wanted)
        self._followers.add(follower)
        follower.start()
        try:
            while True:
                await changed.wait()
                changed.clear()
                yield heard.take()
        finally:
            follower.stop()
            self._followers.discard(follower)

    @_translated
    def check(self) -> None:
        """StoreUnavailable unless an endpoint answers a read (of the cluster key's name)."""
        self._kv.get(f"{self.target.prefix}/cluster", keys_only=True)

    def report(self) -> StoreReport:
        return StoreReport(cheap_watch=True)  # one idle watch stream

    def close(self) -> None:
        """Stop every watch of this store and close its connections."""
        for follower in list(self._followers):
            follower.stop()
        self._connection.close()


def _checkpoint_within_bounds(agent: str, info: CheckpointInfo, blob: bytes) -> bytes:
    # etcd's request limit bounds what a read fetched; its own limit may be raised.
    if len(blob) > MAX_CHECKPOINT_BYTES:
        raise CorruptRecord(
            f"checkpoint {info.seq} of {agent!r} is {len(blob)} bytes, above the limit "
            f"of {MAX_CHECKPOINT_BYTES} bytes"
        )
    return blob


def _acceptance_within_bounds(agent: str, data: bytes) -> bytes:
    if len(data) > MAX_RECORD_BYTES:
        raise CorruptRecord(
            f"loss-acceptance record of {agent!r} is {len(data)} bytes, above the limit "
            f"of {MAX_RECORD_BYTES} bytes"
        )
    return data
