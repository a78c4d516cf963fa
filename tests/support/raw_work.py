"""Writing an agent's work records as someone without the secret would: the effect journal and
the inbox (submissions, "consumed" records with their replies, request-id index entries).

``raw_store`` puts bytes where a node reads its lease, checkpoints and logs;
this module does the same for the records of work, past the store contract,
under the record layer's keys (``stores.layer.keys``, every backend): put arbitrary
bytes, well-formed records naming any number or request id (the formats are
public: only the sealed bytes inside need the secret), or delete a record.
"""

from __future__ import annotations

from typing import Protocol

from hamsterbunker.stores.backend import DeleteRange, Txn
from hamsterbunker.stores.layer import RecordStore
from hamsterbunker.stores.layer.keys import AgentKeys

from .raw_store import RawRecords

__all__ = ["RawWork", "RawWorkRecords", "raw_work"]


class RawWork(Protocol):
    """Raw writes and deletions of one agent's effect journal and inbox records."""

    def put_effect(self, agent: str, seq: int, index: int, kind: str, data: bytes) -> None:
        """Store data as the effect-journal record (seq, index, kind)."""

    def delete_effect(self, agent: str, seq: int, index: int, kind: str) -> None: ...

    def delete_effects(self, agent: str, seq: int) -> None:
        """Delete the whole journal of step seq."""

    def put_pending(self, agent: str, number: int, request_id: str, blob: bytes) -> None:
        """Store blob as the unconsumed submission number (of request_id), framed as the
        backend frames one (the record layer keeps the blob as it is)."""

    def put_pending_raw(self, agent: str, number: int, data: bytes) -> None:
        """Store data as the whole record of unconsumed submission number, unframed."""

    def delete_pending(self, agent: str, number: int) -> None: ...

    def put_done(self, agent: str, number: int, request_id: str, reply: bytes | None) -> None:
        """Mark number (of request_id) consumed, with reply (None: "consumed, no reply"),
        and index request_id to it, as a checkpoint's consumption would."""

    def delete_done(self, agent: str, number: int, request_id: str) -> None:
        """Delete the consumed record of number and its reply (not the request id's index)."""

    def delete_reply(self, agent: str, number: int, request_id: str) -> None:
        """Delete the reply of consumed number, leaving its consumed mark ("-": consumed,
        no reply)."""

    def put_index(self, agent: str, request_id: str, number: int) -> None:
        """Index request_id to number (as admitted, unconsumed, where the backend says so)."""

    def put_index_raw(self, agent: str, request_id: str, data: bytes) -> None:
        """Store data as the index record of request_id."""

    def delete_index(self, agent: str, request_id: str) -> None: ...


class RawWorkRecords:
    """A record-layer store (the memory store's included): its backend, under the layer's keys."""

    def __init__(self, raw: RawRecords) -> None:
        self._raw = raw

    def _delete(self, key: str) -> None:
        self._raw.backend.commit(Txn(writes=[DeleteRange(key)]))

    def put_effect(self, agent: str, seq: int, index: int, kind: str, data: bytes) -> None:
        self._raw.put_effect(agent, seq, index, kind, data)

    def delete_effect(self, agent: str, seq: int, index: int, kind: str) -> None:
        self._delete(AgentKeys(agent).effect(seq, index, kind))

    def delete_effects(self, agent: str, seq: int) -> None:
        self._raw.drop_effects(agent, seq)

    def put_pending(self, agent: str, number: int, request_id: str, blob: bytes) -> None:
        self._raw.put(AgentKeys(agent).submission(number), blob)

    def put_pending_raw(self, agent: str, number: int, data: bytes) -> None:
        self._raw.put(AgentKeys(agent).submission(number), data)

    def delete_pending(self, agent: str, number: int) -> None:
        self._delete(AgentKeys(agent).submission(number))

    def put_done(self, agent: str, number: int, request_id: str, reply: bytes | None) -> None:
        keys = AgentKeys(agent)
        self._raw.put(keys.reply(number, request_id), b"-" if reply is None else b"+" + reply)
        self.put_index(agent, request_id, number)

    def delete_done(self, agent: str, number: int, request_id: str) -> None:
        keys = AgentKeys(agent)
        self._delete(keys.reply(number, request_id))

    def delete_reply(self, agent: str, number: int, request_id: str) -> None:
        key = AgentKeys(agent).reply(number, request_id)
        if self._raw.backend.get(key, 2**30) is not None:
            self._raw.put(key, b"-")

    def put_index(self, agent: str, request_id: str, number: int) -> None:
        self._raw.put(AgentKeys(agent).request(request_id), f"{number} 0".encode())

    def put_index_raw(self, agent: str, request_id: str, data: bytes) -> None:
        self._raw.put(AgentKeys(agent).request(request_id), data)

    def delete_index(self, agent: str, request_id: str) -> None:
        self._delete(AgentKeys(agent).request(request_id))


def raw_work(raw: object) -> RawWork:
    """The RawWork of a RawStore of tests.support.raw_store, or of a record-layer store."""
    if isinstance(raw, RecordStore):
        raw = RawRecords(raw)
    if isinstance(raw, RawRecords):
        return RawWorkRecords(raw)
    raise TypeError(f"no raw access to the work records of {raw!r}")
