"""A store the earlier etcd store wrote, loaded raw into the shared test etcd.

``tests/data/earlier/etcd.json.gz`` (written, as tests/data/earlier/README.md says, while
that store existed) holds every key it wrote and what its own reads answered.
``load_earlier_etcd()`` puts those keys under a fresh prefix and gives its URL;
``expected()`` the answers; ``plant`` and ``unplant`` change keys behind a reader's back
(hostile contents, or a node that writes during a migration).
"""

from __future__ import annotations

import base64
import functools
import gzip
import hashlib
import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol

from hamsterbunker.core.limits import INBOX_REPLIES_KEPT, MAX_INBOX_COUNT
from hamsterbunker.records import CheckpointInfo, ClusterRecord, Heartbeat, LeaseRecord
from hamsterbunker.stores.backends.etcd_connection import EtcdConnection, parse_etcd_url
from hamsterbunker.stores.base import AdmissionState
from hamsterbunker.stores.earlier import SourceStore
from tests.support.etcd_server import etcd_url

__all__ = [
    "FIXTURE",
    "answers_of",
    "expected",
    "load_earlier_etcd",
    "plant",
    "planted_many",
    "raw_revision",
    "request_ids_of",
    "unplant",
]

FIXTURE = Path(__file__).parents[1] / "data" / "earlier" / "etcd.json.gz"
_PLACEHOLDER = "PREFIX"
_PER_TXN = 100  # puts in one txn, under etcd's --max-txn-ops
_BYTES_PER_TXN = 1 << 20


@functools.cache
def _fixture() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(gzip.decompress(FIXTURE.read_bytes()))
    return loaded


def expected() -> dict[str, Any]:
    """What the earlier store's reads answered: ``answers`` (answers_of) and ``request_ids``
    (request_ids_of); a copy."""
    fixture = _fixture()
    return json.loads(
        json.dumps({"answers": fixture["answers"], "request_ids": fixture["request_ids"]})
    )  # type: ignore[no-any-return]


def load_earlier_etcd() -> str:
    """The URL of a fresh prefix of the shared test etcd holding the fixture's keys."""
    url = etcd_url()
    prefix = parse_etcd_url(url).prefix
    stored = [
        (prefix + key.removeprefix(_PLACEHOLDER), base64.b64decode(value))
        for key, value in _fixture()["keys"]
    ]
    _put(url, stored)
    return url


def plant(url: str, key: str, value: bytes) -> None:
    """Put value at key (relative to the store's prefix: ``agents/a1/lease``), raw."""
    _put(url, [(parse_etcd_url(url).prefix + "/" + key, value)])


def planted_many(url: str, keys: list[str], value: bytes = b"") -> None:
    """Put value at each of keys (relative to the prefix), raw, in few txns."""
    prefix = parse_etcd_url(url).prefix + "/"
    _put(url, [(prefix + key, value) for key in keys])


def unplant(url: str, key: str) -> None:
    """Delete key (relative to the store's prefix), raw."""
    full = parse_etcd_url(url).prefix + "/" + key
    with _connection(url) as connection:
        connection.kv.delete(full)


def raw_revision(url: str, key: str) -> int:
    """The mod_revision of key (relative to the store's prefix): a lease record's version."""
    full = parse_etcd_url(url).prefix + "/" + key
    with _connection(url) as connection:
        [(_value, meta)] = connection.kv.get(full, metadata=True)
    return int(meta["mod_revision"])


@contextmanager
def _connection(url: str) -> Iterator[EtcdConnection]:
    connection = EtcdConnection(parse_etcd_url(url))
    try:
        yield connection
    finally:
        connection.close()


def _put(url: str, items: list[tuple[str, bytes]]) -> None:
    """Put each (key, value) raw, in txns of at most _PER_TXN puts and (but for one big
    value alone) _BYTES_PER_TXN."""
    batches: list[list[dict[str, Any]]] = [[]]
    size = 0
    for key, value in items:
        if batches[-1] and (len(batches[-1]) >= _PER_TXN or size + len(value) > _BYTES_PER_TXN):
            batches.append([])
            size = 0
        put = {"key": base64.b64encode(key.encode()).decode(),
               "value": base64.b64encode(value).decode()}  # fmt: skip
        batches[-1].append({"request_put": put})
        size += len(value)
    with _connection(url) as connection:
        for batch in batches:
            if batch:
                connection.txn([], batch)


class Readable(Protocol):
    """The reads answers_of makes: an earlier store's, its reader's, or a RecordStore's."""

    def read_cluster(self) -> ClusterRecord | None: ...
    def list_agents(self) -> list[str]: ...
    def read_lease(self, agent: str) -> LeaseRecord | None: ...
    def list_heartbeats(self, agent: str) -> list[Heartbeat]: ...
    def list_checkpoints(self, agent: str) -> list[CheckpointInfo]: ...
    def read_checkpoint(self, agent: str, info: CheckpointInfo) -> bytes: ...
    def read_effects(self, agent: str, seq: int) -> dict[tuple[int, str], bytes]: ...
    def read_acceptance(self, agent: str) -> bytes | None: ...
    def read_inbox(self, agent: str, after: int = 0) -> list[tuple[int, bytes]]: ...
    def read_admission(self, agent: str, request_id: str) -> AdmissionState | None: ...


# Request ids whose admission is recorded beside those request_ids lists: the pruned one
# (r1), one never admitted (r7, unknown), the submission that does not open (junk).
ASKED = [f"r{n}" for n in range(1, 8)] + ["junk", "unknown"]


def answers_of(store: Readable) -> dict[str, Any]:
    """What store's reads answer, as JSON values (the fixture's "answers"): per agent, the
    lease (its version apart: an etcd revision), heartbeats, checkpoints with their bytes'
    sha256, the effect journal of the step after the newest, the acceptance record, the
    inbox's pages, and the admission of each request id in ASKED."""
    cluster = store.read_cluster()
    agents: dict[str, Any] = {}
    for agent in store.list_agents():
        held = store.read_lease(agent)
        listed = store.list_checkpoints(agent)
        step = listed[0].seq + 1 if listed else 1
        pages, after = [], 0
        while page := store.read_inbox(agent, after):
            pages.append([[n, _b64(blob)] for n, blob in page])
            after = page[-1][0]
        admissions = {}
        for request_id in ASKED:
            state = store.read_admission(agent, request_id)
            admissions[request_id] = state and [state.number, state.consumed, _b64(state.reply)]
        agents[agent] = {
            "lease": held and json.loads(replace(held, version=0).to_json()),
            "heartbeats": [json.loads(beat.to_json()) for beat in store.list_heartbeats(agent)],
            "checkpoints": [
                {**json.loads(info.to_json()), "sha256": _digest(store.read_checkpoint(agent, info))}
                for info in listed
            ],
            "effects_step": step,
            "effects": [[i, kind, _b64(data)] for (i, kind), data in store.read_effects(agent, step).items()],
            "acceptance": _b64(store.read_acceptance(agent)),
            "inbox_pages": pages,
            "admissions": admissions,
        }  # fmt: skip
    return {"cluster": cluster and json.loads(cluster.to_json()), "agents": agents}


def request_ids_of(store: SourceStore) -> dict[str, list[str]]:
    """What an earlier store (or its reader) answers to request_ids, per agent, asked for
    as many as hb migrate-store asks for."""
    most = MAX_INBOX_COUNT + INBOX_REPLIES_KEPT
    return {agent: store.request_ids(agent, most) for agent in store.list_agents()}


def _b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode()


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
