"""The etcd store: ``etcd://host:port[,host:port...]/prefix`` (``etcds://`` for TLS).

Every operation that must be atomic is one etcd transaction, so etcd itself
(Raft: linearizable, committed on a majority) decides races and fences stale
writers; no local flag is ever the guard. Keys under the prefix P::

    P/cluster                                   cluster record (txn: create_revision == 0)
    P/agents/A/lease                            lease record; its version is the key's mod_revision
    P/agents/A/fence                            [holder, session, epoch] of that lease, same txn
    P/agents/A/checkpoints/<seq>-<epoch>        sealed bytes (seq and epoch zero-padded)
    P/agents/A/checkpoint-info/<seq>            {"epoch", "seq", "size", "written"}, same txn
    P/agents/A/acceptance                       the loss-acceptance record (``hb accept-loss``)
    P/agents/A/heartbeats/<node>                heartbeat record
    P/agents/A/event-nodes/<node>               empty: lets readers find every node's log
    P/agents/A/events/<node>/<n>                one event; the oldest are deleted past the bound

``cas_lease`` compares the lease key's mod_revision (create_revision 0 for "no
record yet") and writes lease and fence in one txn. ``put_checkpoint`` reads
the names of the checkpoints at or above the new seq, and refuses the write if
one of them is of the writer's own epoch (only the fenced leader writes under
its epoch, so that read cannot go stale); then one txn compares the fence key's
value with the writer's fence and the new key's create_revision with 0 (nothing
is overwritten), writes bytes and info and deletes what retention drops (only
below the new seq) and another epoch's bytes under the same seq. Watches follow
the lease key (``lease_only``) or the agent's whole prefix.

Nothing stored is trusted (DESIGN.md invariant 10): a key under the prefix
whose name does not parse, or a description that does not, is skipped and
logged once, never raised; checkpoints of other epochs above the new seq
(junk, or damaged ones the runtime skipped) never keep a write out. A stored
checkpoint above ``MAX_CHECKPOINT_BYTES`` or a record above ``MAX_RECORD_BYTES``
is a CorruptRecord (etcd's request limit bounds what one read fetches).

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
import base64
import contextlib
import functools
import json
import logging
import os
import re
import threading
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Concatenate, ParamSpec, TypeVar, cast
from urllib.parse import parse_qsl, unquote, urlsplit

import requests
from etcd3gw.client import Etcd3Client
from etcd3gw.exceptions import ConnectionFailedError, ConnectionTimeoutError, Etcd3Exception
from etcd3gw.types import Event as WatchEvent
from etcd3gw.watch import Watcher

from ..errors import ConfigError, CorruptRecord, Fenced, LeaseConflict, StoreError, StoreUnavailable
from ..failpoints import failpoint
from ..limits import (
    MAX_CHECKPOINT_BYTES,
    MAX_EPOCH,
    MAX_NUMBER,
    MAX_RECORD_BYTES,
    MAX_SEQ,
    check_checkpoint_bounds,
)
from ..records import (
    CheckpointInfo,
    ClusterRecord,
    Event,
    Heartbeat,
    LeaseRecord,
    check_name,
)
from ._reported import ReportedOnce
from ._tls import describe_tls_failure, error_in, tls_error_in, tls_files_problem
from .base import Fence, StoreGuarantees, describe_fence_text, fence_text

__all__ = ["GUARANTEES", "EtcdStore", "EtcdTarget", "parse_etcd_url"]

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

DEFAULT_PORT = 2379
DEFAULT_TIMEOUT_S = 5.0
# A watch stream that dies silently (a member restarts, a connection is cut) is
# not reported by etcd3gw, so every stream is replaced after this long, from the
# last revision seen: a lost stream costs at most this much of early wake-ups.
_WATCH_RENEW_S = 10.0
_WATCH_RETRY_S = (0.1, 2.0)  # backoff bounds while the watch cannot be set up
_SEQ = 20  # digits of a zero-padded checkpoint or event number: key order is number order
_EPOCH = 10
# gRPC status codes that mean "not now" rather than "never" (DEADLINE_EXCEEDED,
# RESOURCE_EXHAUSTED, UNAVAILABLE).
_TRANSIENT_CODES = {4, 8, 14}
_TXN_OPS = 100  # operations per txn; etcd's --max-txn-ops is 128 by default

P = ParamSpec("P")
R = TypeVar("R")


@dataclass(frozen=True)
class EtcdTarget:
    """What a store URL names: endpoints, key prefix, TLS files and the request timeout."""

    endpoints: tuple[tuple[str, int], ...]
    prefix: str
    tls: bool = False
    ca: str | None = None
    cert: str | None = None
    key: str | None = None
    timeout: float = DEFAULT_TIMEOUT_S


def parse_etcd_url(url: str) -> EtcdTarget:
    """Parse ``etcd[s]://host:port[,host:port...]/prefix[?options]``; ConfigError if bad."""

    def bad(why: str) -> ConfigError:
        return ConfigError(f"store URL {url!r}: {why}")

    try:
        parts = urlsplit(url)
    except ValueError as exc:
        raise bad(str(exc)) from exc
    if parts.scheme not in ("etcd", "etcds"):
        raise bad("not an etcd:// or etcds:// URL")
    if "@" in parts.netloc:
        raise bad("etcd user names and passwords are not supported; use etcds:// with a "
                  "client certificate")  # fmt: skip
    endpoints = tuple(_endpoint(url, item) for item in parts.netloc.split(","))
    prefix = "/" + unquote(parts.path).strip("/")
    if prefix == "/":
        raise bad("an etcd URL needs a key prefix: etcd://host:2379/prefix")
    options = dict(parse_qsl(parts.query, keep_blank_values=True, strict_parsing=False))
    unknown = set(options) - {"ca", "cert", "key", "timeout"}
    if unknown:
        raise bad(f"unknown option(s) {', '.join(sorted(unknown))}; known: ca, cert, key, timeout")
    tls = parts.scheme == "etcds"
    files = {name: options.get(name) or None for name in ("ca", "cert", "key")}
    if not tls and any(files.values()):
        raise bad("ca, cert and key are TLS options: use etcds://")
    if bool(files["cert"]) != bool(files["key"]):
        raise bad("a client certificate needs both cert and key")
    for name, path in files.items():
        if path is not None and not os.path.isfile(path):
            raise bad(f"{name} file {path} does not exist")
    problem = tls_files_problem(
        ca=("ca", files["ca"]), cert=("cert", files["cert"]), key=("key", files["key"])
    )
    if problem is not None:
        raise bad(problem)
    try:
        timeout = float(options.get("timeout", DEFAULT_TIMEOUT_S))
    except ValueError as exc:
        raise bad(f"timeout must be a number of seconds, not {options['timeout']!r}") from exc
    if not 0 < timeout <= 600:
        raise bad("timeout must be above 0 and at most 600 seconds")
    return EtcdTarget(endpoints, prefix, tls, files["ca"], files["cert"], files["key"], timeout)


def _endpoint(url: str, item: str) -> tuple[str, int]:
    """One ``host[:port]`` or ``[ipv6][:port]`` of the URL; the port defaults to 2379."""
    if item.startswith("["):
        host, _, rest = item[1:].partition("]")
        port = rest.removeprefix(":")
        well_formed = rest == "" or rest.startswith(":")
    else:
        host, _, port = item.partition(":")
        well_formed = ":" not in port  # a bare IPv6 address needs brackets
    if not host or not well_formed:
        raise ConfigError(f"store URL {url!r}: endpoint {item!r} is not host:port")
    if not port:
        return host, DEFAULT_PORT
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"store URL {url!r}: endpoint {item!r} has a bad port")
    return host, int(port)


class _Session(requests.Session):
    """A requests session with a default timeout: etcd3gw's watch request sets none."""

    def __init__(self, timeout: tuple[float, float]) -> None:
        super().__init__()
        self.default_timeout = timeout

    def request(self, *args: Any, **kwargs: Any) -> requests.Response:
        if kwargs.get("timeout") is None:
            kwargs["timeout"] = self.default_timeout
        return super().request(*args, **kwargs)


def _b64(data: str | bytes) -> str:
    return base64.b64encode(data.encode() if isinstance(data, str) else data).decode()


def _unb64(text: str) -> bytes:
    return base64.b64decode(text)


def _range_end(prefix: str) -> str:
    """The end of the key range holding every key that starts with prefix (which ends in '/')."""
    return prefix[:-1] + chr(ord(prefix[-1]) + 1)


def _pad(number: int, digits: int = _SEQ) -> str:
    return f"{number:0{digits}d}"


def _fence_value(kvs: list[dict[str, Any]]) -> bytes | None:
    """The stored fence's bytes as a txn response has them (None if there is none)."""
    if not kvs:
        return None
    try:
        return _unb64(kvs[0].get("value", ""))
    except ValueError:  # the gateway's base64, never expected: b"" reads as unreadable
        return b""


def _revision(meta: Mapping[str, Any], name: str = "mod_revision") -> int:
    """A revision in etcd's metadata (etcd's own, but read within bounds all the same)."""
    try:
        value = int(meta[name])
    except (KeyError, TypeError, ValueError) as exc:
        raise CorruptRecord(f"etcd metadata has no readable {name}") from exc
    if not 0 <= value <= MAX_NUMBER:
        raise CorruptRecord(f"etcd metadata {name} {value} is out of range")
    return value


# The last part of a checkpoint key and of a description key, as put_checkpoint writes them.
_CHECKPOINT_NAME = re.compile(rb"([0-9]{%d})-([0-9]{%d})" % (_SEQ, _EPOCH))
_INFO_NAME = re.compile(rb"[0-9]{%d}" % _SEQ)


def _checkpoint_name(name: bytes) -> tuple[int, int] | None:
    """(seq, epoch) of a checkpoint key's last part, or None if it is not one we write."""
    match = _CHECKPOINT_NAME.fullmatch(name)
    if match is None:
        return None
    seq, epoch = int(match[1]), int(match[2])
    return (seq, epoch) if 0 < seq <= MAX_SEQ and 0 < epoch <= MAX_EPOCH else None


def _info_name(name: bytes) -> int | None:
    """The seq of a description key's last part, or None if it is not one we write."""
    if not _INFO_NAME.fullmatch(name):
        return None
    seq = int(name)
    return seq if 0 < seq <= MAX_SEQ else None


def _kv_key(kv: Mapping[str, Any]) -> bytes:
    """The key of a kv in a txn response (base64 there); b"" if it cannot be read."""
    try:
        return _unb64(kv.get("key", ""))
    except ValueError:
        return b""


def _put(key: str, value: str | bytes) -> dict[str, Any]:
    return {"request_put": {"key": _b64(key), "value": _b64(value)}}


def _get(key: str, range_end: str | None = None, **options: Any) -> dict[str, Any]:
    request: dict[str, Any] = {"key": _b64(key), **options}
    if range_end is not None:
        request["range_end"] = _b64(range_end)
    return {"request_range": request}


def _delete(key: str, range_end: str) -> dict[str, Any]:
    return {"request_delete_range": {"key": _b64(key), "range_end": _b64(range_end)}}


def _ranges(response: Mapping[str, Any]) -> list[list[dict[str, Any]]]:
    """The kvs of each range in a txn response (an empty list for a range that found nothing)."""
    return [op.get("response_range", {}).get("kvs", []) for op in response.get("responses", [])]


def _grpc_error(exc: Etcd3Exception) -> tuple[int | None, str]:
    """The gRPC code and message in a gateway error, as far as they can be read."""
    try:
        body = json.loads(exc.detail_text or "")
        return int(body.get("code")), str(body.get("message") or body.get("error"))
    except (TypeError, ValueError, AttributeError):
        return None, exc.detail_text or str(exc) or type(exc).__name__


def _too_large(exc: Etcd3Exception) -> bool:
    _code, message = _grpc_error(exc)
    return "request is too large" in message or "larger than max" in message


def _translated(
    method: Callable[Concatenate[EtcdStore, P], R],
) -> Callable[Concatenate[EtcdStore, P], R]:
    """Translate etcd3gw's and requests' errors at the store boundary, keeping the reason."""

    @functools.wraps(method)
    def translated(self: EtcdStore, /, *args: P.args, **kwargs: P.kwargs) -> R:
        used = self._current
        where = f"etcd store {method.__name__.lstrip('_')} ({self._endpoint_text(used)})"
        try:
            return method(self, *args, **kwargs)
        except (ConnectionFailedError, ConnectionTimeoutError) as exc:
            self._next_endpoint(used)
            raise StoreUnavailable(f"{where}: {self._unreachable(used, exc)}") from exc
        except requests.RequestException as exc:
            self._next_endpoint(used)
            raise StoreUnavailable(f"{where}: {self._unreachable(used, exc)}") from exc
        except Etcd3Exception as exc:
            code, message = _grpc_error(exc)
            if code in _TRANSIENT_CODES:
                self._next_endpoint(used)
                raise StoreUnavailable(f"{where}: {message}") from exc
            raise StoreError(f"{where}: {message}") from exc

    return translated


class EtcdStore:
    """A store in an etcd v3 cluster, under one key prefix."""

    guarantees = GUARANTEES

    def __init__(
        self,
        url: str,
        *,
        keep_checkpoints: int = 5,
        events_per_node: int = 1000,
        create: bool = True,
    ) -> None:
        if keep_checkpoints < 1:
            raise ConfigError("keep_checkpoints must be at least 1")
        if events_per_node < 1:
            raise ConfigError("events_per_node must be at least 1")
        self.url = url
        self.target = parse_etcd_url(url)
        self.keep_checkpoints = keep_checkpoints
        self.events_per_node = events_per_node
        self.warnings: list[str] = []
        self._clients = [self._client(i) for i in range(len(self.target.endpoints))]
        self._current = 0
        self._followers: set[_Follower] = set()
        self._indexed: set[tuple[str, str]] = set()  # (agent, node) whose event log is indexed
        self._reported = ReportedOnce(log)
        if not create and not self._exists():
            where = ",".join(map(self._endpoint_text, range(len(self._clients))))
            raise ConfigError(f"no HamsterBunker store under {self.target.prefix} in etcd {where}")

    # -- connections -------------------------------------------------------

    def _client(self, index: int, read_timeout: float | None = None) -> Etcd3Client:
        """A client of one endpoint with its own HTTP session (TLS files applied)."""
        target = self.target
        host, port = target.endpoints[index]
        session = _Session((target.timeout, read_timeout or target.timeout))
        # The URL says how to reach etcd: proxies and CA bundles named in the
        # environment (which requests would let override ``ca``) do not apply.
        session.trust_env = False
        if target.ca is not None:
            session.verify = target.ca
        if target.cert is not None and target.key is not None:
            session.cert = (target.cert, target.key)
        return Etcd3Client(
            host=host,
            port=port,
            protocol="https" if target.tls else "http",
            timeout=target.timeout,
            api_path="/v3/",  # etcd 3.4 or newer; spares a discovery request
            session=session,
        )

    @property
    def _kv(self) -> Etcd3Client:
        return self._clients[self._current]

    def _next_endpoint(self, failed: int) -> None:
        """After a failure of endpoint failed, send the next calls to the next one (round robin)."""
        if self._current == failed:  # not yet moved on by another thread's failure
            self._current = (failed + 1) % len(self._clients)

    def _unreachable(self, index: int, exc: Exception) -> str:
        """Why endpoint index could not be reached: a TLS refusal in words, else the error."""
        tls = tls_error_in(exc)
        if tls is not None:
            target = self.target
            return describe_tls_failure(
                tls,
                ca=target.ca,
                ca_option="ca",
                cert=target.cert,
                cert_option="cert",
            )
        refused = error_in(exc, OSError, lambda e: e.errno is not None)
        if refused is not None and refused.errno is not None:
            # requests' own text buries this under its connection pool's repr.
            return f"cannot connect: {os.strerror(refused.errno)}"
        detail = exc.detail_text if isinstance(exc, Etcd3Exception) else None
        return str(detail or exc)

    def _endpoint_text(self, index: int) -> str:
        host, port = self.target.endpoints[index]
        return f"{host}:{port}"

    def _txn(
        self,
        compare: list[dict[str, Any]],
        success: list[dict[str, Any]],
        failure: list[dict[str, Any]] | None = None,
    ) -> dict[str, Any]:
        txn = {"compare": compare, "success": success, "failure": failure or []}
        return cast(dict[str, Any], self._kv.transaction(txn))

    @_translated
    def _exists(self) -> bool:
        prefix = self.target.prefix + "/"
        return bool(self._kv.get(prefix, range_end=_range_end(prefix), limit=1, keys_only=True))

    # -- keys --------------------------------------------------------------

    def _agent_prefix(self, agent: str) -> str:
        return f"{self.target.prefix}/agents/{check_name('agent id', agent)}/"

    # -- cluster -----------------------------------------------------------

    @_translated
    def read_cluster(self) -> ClusterRecord | None:
        found = self._kv.get(f"{self.target.prefix}/cluster")
        return ClusterRecord.from_json(found[0]) if found else None

    @_translated
    def create_cluster(self, record: ClusterRecord) -> ClusterRecord:
        key = f"{self.target.prefix}/cluster"
        data = record.to_json()
        response = self._txn(
            [{"key": _b64(key), "target": "CREATE", "result": "EQUAL", "create_revision": 0}],
            [_put(key, data)],
            [_get(key)],
        )
        if response.get("succeeded"):
            return ClusterRecord.from_json(data)
        kvs = _ranges(response)[0]
        if not kvs:
            raise StoreError(f"cluster record under {self.target.prefix} vanished")
        return ClusterRecord.from_json(_unb64(kvs[0].get("value", "")))

    # -- lease -------------------------------------------------------------

    @_translated
    def read_lease(self, agent: str) -> LeaseRecord | None:
        found = self._kv.get(self._agent_prefix(agent) + "lease", metadata=True)
        if not found:
            return None
        data, meta = found[0]
        return replace(LeaseRecord.from_json(data), version=_revision(meta))

    @_translated
    def cas_lease(self, agent: str, expected_version: int | None, new: LeaseRecord) -> LeaseRecord:
        prefix = self._agent_prefix(agent)
        key = prefix + "lease"
        if expected_version is None:
            compare = {"target": "CREATE", "result": "EQUAL", "create_revision": 0}
        elif expected_version < 1:  # etcd would compare a missing key's mod_revision 0 as equal
            raise LeaseConflict(f"lease of {agent!r}: version {expected_version} is never stored")
        else:
            compare = {"target": "MOD", "result": "EQUAL", "mod_revision": expected_version}
        response = self._txn(
            [{"key": _b64(key), **compare}],
            [
                # The version lives in etcd (mod_revision), not in the stored JSON.
                _put(key, replace(new, version=0).to_json()),
                _put(prefix + "fence", fence_text(new.holder, new.session, new.epoch)),
            ],
            [_get(key, keys_only=True)],
        )
        if not response.get("succeeded"):
            kvs = _ranges(response)[0]
            current = _revision(kvs[0]) if kvs else None
            raise LeaseConflict(
                f"lease of {agent!r} is at version {current}, not {expected_version}"
            )
        return replace(new, version=_revision(response.get("header", {}), "revision"))

    # -- checkpoints -------------------------------------------------------

    @_translated
    def put_checkpoint(self, agent: str, fence: Fence, seq: int, blob: bytes) -> CheckpointInfo:
        problem = check_checkpoint_bounds(seq, fence.epoch, len(blob))
        if problem is not None:  # refused before anything is sent
            raise StoreError(problem)
        prefix = self._agent_prefix(agent)
        data, infos = prefix + "checkpoints/", prefix + "checkpoint-info/"
        fence_text = fence.to_text()
        key = f"{data}{_pad(seq)}-{_pad(fence.epoch, _EPOCH)}"
        info = CheckpointInfo(epoch=fence.epoch, seq=seq, size=len(blob), written=time.time())
        # One read of what is stored: the names of the checkpoints at or above seq
        # (they say seq and epoch), of every description (for retention), and the fence.
        above, described, fence_kvs = _ranges(
            self._txn(
                [],
                [
                    _get(data + _pad(seq), _range_end(data), keys_only=True),
                    _get(infos, _range_end(infos), keys_only=True),
                    _get(prefix + "fence"),
                ],
            )
        )
        replaced = False  # another epoch's checkpoint under this seq, to delete
        for kv in above:
            name = _kv_key(kv).removeprefix(data.encode())
            found = _checkpoint_name(name)
            if found is None:
                self._warn_key(agent, kv, "checkpoint key")
                continue
            if found[1] == fence.epoch:  # this term's own: it numbers upwards, never overwrites
                if _fence_value(fence_kvs) != fence_text.encode():
                    raise Fenced(
                        f"checkpoint {seq} of {fence.holder} under epoch {fence.epoch} refused: "
                        f"the lease is now {describe_fence_text(_fence_value(fence_kvs))}"
                    )
                raise StoreError(
                    f"checkpoint sequence must increase: {seq} is not above {found[0]}, "
                    f"stored under this epoch ({fence.epoch})"
                )
            replaced = replaced or found[0] == seq
        kept = {seq}
        for kv in described:
            stored = _info_name(_kv_key(kv).removeprefix(infos.encode()))
            if stored is None:
                self._warn_key(agent, kv, "checkpoint description key")
            elif stored < seq:  # retention never reaches above the new seq
                kept.add(stored)
        success = [
            _put(key, bytes(blob)),
            _put(infos + _pad(seq), info.to_json()),
        ]
        newest = sorted(kept, reverse=True)
        if len(newest) > self.keep_checkpoints:  # everything below the oldest one kept
            cutoff = _pad(newest[self.keep_checkpoints - 1])
            success += [_delete(data, data + cutoff), _delete(infos, infos + cutoff)]
        if replaced:
            # etcd refuses a txn whose delete covers its own put: the range either side of key.
            same_seq = f"{data}{_pad(seq)}-"
            success += [_delete(same_seq, key), _delete(key + "\0", _range_end(same_seq))]
        compare: list[dict[str, Any]] = [
            {
                "key": _b64(prefix + "fence"),
                "target": "VALUE",
                "result": "EQUAL",
                "value": _b64(fence_text),
            },
            # Nothing is overwritten: this epoch's key for seq does not exist yet.
            {"key": _b64(key), "target": "CREATE", "result": "EQUAL", "create_revision": 0},
        ]
        failure = [_get(prefix + "fence")]
        failpoint("checkpoint.before_commit")
        try:
            response = self._txn(compare, success, failure)
        except Etcd3Exception as exc:
            if _too_large(exc):
                raise StoreError(
                    f"checkpoint {seq} of {agent!r} ({len(blob)} bytes) refused by etcd: "
                    f"{_grpc_error(exc)[1]}. etcd takes requests up to its --max-request-bytes "
                    "(1.5 MiB by default): raise it on every member, or keep the agent's state "
                    "smaller"
                ) from exc
            raise
        if response.get("succeeded"):
            return info
        [fence_kvs] = _ranges(response)
        if _fence_value(fence_kvs) != fence_text.encode():
            raise Fenced(
                f"checkpoint {seq} of {fence.holder} under epoch {fence.epoch} refused: "
                f"the lease is now {describe_fence_text(_fence_value(fence_kvs))}"
            )
        raise StoreError(
            f"checkpoint sequence must increase: {seq} is already stored under this epoch "
            f"({fence.epoch})"
        )

    def _warn_key(self, agent: str, kv: Mapping[str, Any], what: str) -> None:
        """Log once that a key under the agent's prefix does not parse (it is skipped)."""
        name = _kv_key(kv)
        self._reported.warn(
            (agent, name, kv.get("mod_revision")),
            "etcd store: skipping %s %s of %s: its name is not one this store writes",
            what,
            name.decode("utf-8", "replace")[-80:],
            agent,
        )

    @_translated
    def list_checkpoints(self, agent: str) -> list[CheckpointInfo]:
        infos = self._agent_prefix(agent) + "checkpoint-info/"
        [found] = _ranges(self._txn([], [_get(infos, _range_end(infos))]))
        listed = []
        for kv in found:
            seq = _info_name(_kv_key(kv).removeprefix(infos.encode()))
            if seq is None:
                self._warn_key(agent, kv, "checkpoint description key")
                continue
            try:
                listed.append(CheckpointInfo.from_json(_unb64(kv.get("value", "")), seq))
            except (CorruptRecord, ValueError) as exc:  # ValueError: the gateway's base64
                # Not ours to judge further (the runtime authenticates what is listed):
                # left out, and said once.
                self._reported.warn(
                    (agent, _kv_key(kv), kv.get("mod_revision")),
                    "etcd store: leaving out checkpoint %d of %s: %s",
                    seq,
                    agent,
                    exc,
                )
        return sorted(listed, key=lambda info: (info.seq, info.epoch), reverse=True)

    @_translated
    def read_checkpoint(self, agent: str, info: CheckpointInfo) -> bytes:
        key = f"{self._agent_prefix(agent)}checkpoints/{_pad(info.seq)}-{_pad(info.epoch, _EPOCH)}"
        found = self._kv.get(key)
        if not found:
            raise StoreError(f"checkpoint {info.seq} of {agent!r} is no longer retained")
        # etcd's request limit bounds what this fetched; its own limit may be raised.
        if len(found[0]) > MAX_CHECKPOINT_BYTES:
            raise CorruptRecord(
                f"checkpoint {info.seq} of {agent!r} is {len(found[0])} bytes, above the limit "
                f"of {MAX_CHECKPOINT_BYTES} bytes"
            )
        return found[0]

    # -- loss acceptance ---------------------------------------------------

    @_translated
    def read_acceptance(self, agent: str) -> bytes | None:
        found = self._kv.get(self._agent_prefix(agent) + "acceptance")
        if not found:
            return None
        if len(found[0]) > MAX_RECORD_BYTES:
            raise CorruptRecord(
                f"loss-acceptance record of {agent!r} is {len(found[0])} bytes, above the limit "
                f"of {MAX_RECORD_BYTES} bytes"
            )
        return found[0]

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
        found = self._kv.get(beats, metadata=True, range_end=_range_end(beats))
        listed = []
        for data, meta in found:  # in key order: by node id
            key = meta.get("key", b"")
            try:
                beat = Heartbeat.from_json(data)
            except CorruptRecord as exc:
                self._reported.warn(
                    (agent, key, meta.get("mod_revision")),
                    "ignoring unreadable heartbeat %s: %s",
                    key.decode("utf-8", "replace")[-80:],
                    exc,
                )
                continue
            if key == (beats + beat.node).encode():  # a copy under another name is not it
                listed.append(beat)
        return listed

    @_translated
    def remove_heartbeat(self, agent: str, node: str) -> None:
        self._kv.delete(f"{self._agent_prefix(agent)}heartbeats/{check_name('node id', node)}")

    # -- events ------------------------------------------------------------

    @_translated
    def append_event(self, agent: str, event: Event) -> None:
        node = check_name("node id", event.node)
        prefix = self._agent_prefix(agent)
        log_prefix = f"{prefix}events/{node}/"
        ops = [_put(log_prefix + _pad(event.n), event.to_json())]
        if (agent, node) not in self._indexed:
            ops.append(_put(f"{prefix}event-nodes/{node}", b""))
        if event.n > self.events_per_node:  # bounded: drop everything below the newest N
            ops.append(_delete(log_prefix, log_prefix + _pad(event.n - self.events_per_node + 1)))
        self._txn([], ops)
        self._indexed.add((agent, node))

    @_translated
    def read_events(self, agent: str, after: Mapping[str, int] | None = None) -> list[Event]:
        after = after or {}
        prefix = self._agent_prefix(agent)
        index = prefix + "event-nodes/"
        found = self._kv.get(index, metadata=True, range_end=_range_end(index), keys_only=True)
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
        # Read-only txns (one per _TXN_OPS nodes): only each node's events past its cursor.
        ranges = []
        for node in nodes:
            log_prefix = f"{prefix}events/{node}/"
            start = log_prefix + _pad(after.get(node, 0) + 1)
            ranges.append(_get(start, _range_end(log_prefix)))
        found_kvs: list[list[dict[str, Any]]] = []
        for first in range(0, len(ranges), _TXN_OPS):
            found_kvs += _ranges(self._txn([], ranges[first : first + _TXN_OPS]))
        events: list[Event] = []
        for node, kvs in zip(nodes, found_kvs, strict=True):
            for kv in kvs:  # in key order: by n
                try:
                    event = Event.from_json(_unb64(kv.get("value", "")))
                except (CorruptRecord, ValueError) as exc:  # ValueError: the gateway's base64
                    self._reported.warn(
                        (agent, _kv_key(kv), kv.get("mod_revision")),
                        "ignoring unreadable event of %s: %s",
                        node,
                        exc,
                    )
                    continue
                if event.node == node and event.n > after.get(node, 0):
                    events.append(event)
        return events

    # -- watch -------------------------------------------------------------

    async def watch(self, agent: str, *, lease_only: bool = False) -> AsyncIterator[None]:
        """Yield after etcd reports a change of the lease key (lease_only) or of any agent key."""
        prefix = self._agent_prefix(agent)
        key, range_end = (prefix + "lease", None) if lease_only else (prefix, _range_end(prefix))
        loop = asyncio.get_running_loop()
        changed = asyncio.Event()

        def hint() -> None:
            with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits any more
                loop.call_soon_threadsafe(changed.set)

        follower = _Follower(self, key, range_end, hint)
        self._followers.add(follower)
        follower.start()
        try:
            while True:
                await changed.wait()
                changed.clear()
                yield None
        finally:
            follower.stop()
            self._followers.discard(follower)

    def close(self) -> None:
        """Stop every watch of this store and close its connections."""
        for follower in list(self._followers):
            follower.stop()
        for client in self._clients:
            client.session.close()


class _Follower(threading.Thread):
    """Keeps an etcd watch on one key or range open, calling hint() after every change.

    etcd3gw's watcher is a blocking HTTP stream read in a thread; this thread
    sets it up, renews it every _WATCH_RENEW_S (from the last revision seen, so
    nothing is missed between two streams), and backs off while etcd cannot be
    reached. A watch is a hint: failures are logged, never raised.
    """

    def __init__(
        self, store: EtcdStore, key: str, range_end: str | None, hint: Callable[[], None]
    ) -> None:
        super().__init__(name=f"hb-etcd-watch {key}", daemon=True)
        self._store = store
        self._key = key
        self._range_end = range_end
        self._hint = hint
        self._stopping = threading.Event()
        self._seen = 0  # the highest revision whose changes were hinted

    def stop(self) -> None:
        """Ask the thread to end; it closes its stream within one HTTP timeout at most."""
        self._stopping.set()

    def run(self) -> None:
        delay = _WATCH_RETRY_S[0]
        caught_up = False
        while not self._stopping.is_set():
            store, endpoint = self._store, self._store._current
            # Reads of an idle stream wait for the next renewal, and a little longer.
            client = store._client(endpoint, _WATCH_RENEW_S + store.target.timeout)
            watcher = None
            try:
                self._catch_up(client, hint_missed=caught_up)
                caught_up = True
                watcher = Watcher(
                    client,
                    self._key,
                    self._on_event,
                    range_end=self._range_end,
                    start_revision=self._seen + 1,
                )
                delay = _WATCH_RETRY_S[0]
                self._stopping.wait(_WATCH_RENEW_S)
            except (Etcd3Exception, requests.RequestException, ValueError, KeyError) as exc:
                log.info("etcd watch of %s failed (%s); retrying in %.1f s", self._key, exc, delay)
                store._next_endpoint(endpoint)
                self._stopping.wait(delay)
                delay = min(delay * 2, _WATCH_RETRY_S[1])
            finally:
                if watcher is not None:
                    watcher.stop()
                client.session.close()

    def _catch_up(self, client: Etcd3Client, *, hint_missed: bool) -> None:
        """Start the next stream at the current revision; hint if a key changed unwatched."""
        now = int(client.status()["header"]["revision"])
        if hint_missed:
            newest = client.get(
                self._key,
                metadata=True,
                range_end=self._range_end,
                sort_order="descend",
                sort_target="mod",
                limit=1,
                keys_only=True,
            )
            if newest and int(newest[0][1]["mod_revision"]) > self._seen:
                self._hint()
        self._seen = max(self._seen, now)

    def _on_event(self, event: WatchEvent) -> None:
        self._seen = max(self._seen, int(event["kv"]["mod_revision"]))
        self._hint()
