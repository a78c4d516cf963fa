"""Raw "consumed" marks under the store's own keys are never taken by a ``Client`` as done
(DESIGN.md invariant 10; the contract-level tests are in
tests/stores/contract/test_inbox_proof.py).

Planted as someone without the secret would, past the store contract, under
the record layer's keys (``stores.layer.keys``): ``inbox/done/<n>-<request id>``
= ``-`` (consumed, no reply) with ``inbox/ids/<request id>`` naming n. And a
genuine reply taken away (its record rewritten as ``-``) or made unreadable
(over the limit): the store then reports the submission consumed with no
reply, which is no proof either.
"""

from __future__ import annotations

import pytest

from hamsterbunker.core.errors import Tampered
from hamsterbunker.core.limits import MAX_REPLY_BYTES
from hamsterbunker.ops.client import Client
from hamsterbunker.sealing import Sealer
from hamsterbunker.stores.base import Consumed
from hamsterbunker.stores.layer.keys import AgentKeys
from tests.stores.contract.test_inbox import held
from tests.support.agents import SECRET
from tests.support.raw_store import RawRecords, RawStore, backend_store
from tests.support.raw_work import raw_work

__all__ = ["backend_store"]  # the fixture, used by name

AGENT = "a"
NO_REPLY_S = 0.5  # how long a wait that must not end in a reply goes on


def plant_consumed(raw: RawStore, request_id: str, number: int) -> None:
    """Mark request_id consumed as number, with no reply, under the layer's keys."""
    raw_work(raw).put_done(AGENT, number, request_id, None)


def take_reply_away(raw: RawStore, request_id: str, number: int, how: str) -> None:
    """Remove (the record left as "consumed, no reply"), or make unreadable, the stored reply
    of consumed number, leaving it marked consumed."""
    if how == "removed":
        raw_work(raw).delete_reply(AGENT, number, request_id)
    else:  # over the limit: the store reads it as no reply
        assert isinstance(raw, RawRecords)
        raw.put(AgentKeys(AGENT).reply(number, request_id), b"+" + b"x" * MAX_REPLY_BYTES * 2)


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


@pytest.mark.parametrize("how", ["removed", "over-the-limit"])
def test_a_genuine_reply_taken_away_is_not_read_as_none(backend_store: RawStore, how: str) -> None:
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
        take_reply_away(backend_store, "r1", number, how)
        with pytest.raises(TimeoutError, match="marked consumed, but with no sealed reply"):
            client.result(AGENT, "r1", timeout=NO_REPLY_S)
