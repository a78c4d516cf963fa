"""Raw "consumed" marks in each backend's own keys are never taken by a ``Client`` as done
(DESIGN.md invariant 10; the contract-level tests are in
tests/stores/contract/test_inbox_proof.py).

Planted as someone without the secret would, past the store contract: on the
file store ``done/N.hbr`` (a record with no reply) and ``ids/<sha>.hbi``; on
Redis ``inbox:consumed`` and ``inbox:ids``; on etcd ``ids/<request id>`` =
``{"consumed": true, "reply": null}``. And a genuine reply taken away: the
store then reports the submission consumed with no reply, which is no proof
either.
"""

from __future__ import annotations

import json

import pytest

from hamsterbunker.client import Client
from hamsterbunker.errors import Tampered
from hamsterbunker.limits import MAX_REPLY_BYTES
from hamsterbunker.sealing import Sealer
from hamsterbunker.stores.base import Consumed
from hamsterbunker.stores.etcd.kv import pad
from hamsterbunker.stores.file.inbox_records import done_bytes, done_name, index_bytes, index_name
from tests.stores.contract.test_inbox import held
from tests.support.agents import SECRET
from tests.support.raw_store import RawEtcd, RawFile, RawRedis, RawStore, backend_store

__all__ = ["backend_store"]  # the fixture, used by name

AGENT = "a"
NO_REPLY_S = 0.5  # how long a wait that must not end in a reply goes on


def plant_consumed(raw: RawStore, request_id: str, number: int) -> None:
    """Mark request_id consumed as number, with no reply, in the backend's own keys."""
    if isinstance(raw, RawFile):
        raw._agent(AGENT, "inbox", "done", done_name(number)).write_bytes(
            done_bytes(request_id, None)
        )
        raw._agent(AGENT, "inbox", "ids", index_name(request_id)).write_bytes(
            index_bytes(request_id, number)
        )
    elif isinstance(raw, RawRedis):
        raw._redis.hset(raw._key(AGENT, "inbox:ids"), request_id, str(number))
        raw._redis.hset(raw._key(AGENT, "inbox:consumed"), str(number), request_id)
    else:
        assert isinstance(raw, RawEtcd)
        record = {"n": number, "consumed": True, "reply": None}
        raw._kv.put(raw._key(AGENT, f"inbox/ids/{request_id}"), json.dumps(record))


def take_reply_away(raw: RawStore, request_id: str, number: int) -> None:
    """Remove, or make unreadable, the stored reply of consumed number (checkpoint 1 of
    epoch 1), leaving it marked consumed."""
    if isinstance(raw, RawFile):
        raw._agent(AGENT, "inbox", "done", done_name(number)).write_bytes(
            done_bytes(request_id, None)
        )
    elif isinstance(raw, RawRedis):  # over the limit: the store reads it as no reply
        raw._redis.hset(raw._key(AGENT, "inbox:replies"), str(number), b"x" * MAX_REPLY_BYTES * 2)
    else:
        assert isinstance(raw, RawEtcd)
        raw._kv.delete(raw._key(AGENT, f"inbox/replies/{pad(number)}/{1:010d}-{pad(1)}"))


def test_a_raw_consumed_mark_for_a_request_nobody_submitted_is_not_done(
    backend_store: RawStore,
) -> None:
    """result() does not return None for it, and submit does not call it already admitted."""
    with Client(backend_store.url, SECRET) as client:
        client.submit(AGENT, 1, request_id="real")  # the inbox exists, #1 is taken
        plant_consumed(backend_store, "ghost", 1)
        with pytest.raises(TimeoutError, match="marked consumed, but with no sealed reply"):
            client.result(AGENT, "ghost", timeout=NO_REPLY_S)
        with pytest.raises(Tampered, match="no sealed submission or reply"):
            client.submit(AGENT, 2, request_id="ghost")


def test_a_genuine_reply_taken_away_is_not_read_as_none(backend_store: RawStore) -> None:
    """A consumed submission whose sealed reply is gone or over the limit is not done."""
    with Client(backend_store.url, SECRET) as client:
        number = client.submit(AGENT, 1, request_id="r1").number
        cluster = client.store.read_cluster()
        assert cluster is not None
        reply = Sealer(SECRET, cluster).seal_reply(AGENT, number, "r1", "the answer")
        client.store.put_checkpoint(
            AGENT, held(client.store), 1, b"cp", [Consumed(number, "r1", reply)]
        )
        assert client.result(AGENT, "r1", timeout=NO_REPLY_S) == "the answer"
        take_reply_away(backend_store, "r1", number)
        with pytest.raises(TimeoutError, match="marked consumed, but with no sealed reply"):
            client.result(AGENT, "r1", timeout=NO_REPLY_S)
