"""Store.list_agents, on every backend: the agents a store holds records of (``hb status``).

An agent is listed once something was written for it, by any client; reading an
agent's records (a mistyped id in ``hb status``) never makes one. Names that are
not agent ids, planted by whoever can write the store, are skipped (the file
store's case is below, where a name can be planted directly).
"""

from __future__ import annotations

import os
from pathlib import Path

from hamsterbunker.records import Event, Heartbeat, LeaseRecord
from hamsterbunker.stores.interface import Store
from hamsterbunker.stores.layer.files import FileStore

from .conftest import Opener


def beat(node: str) -> Heartbeat:
    return Heartbeat(node=node, region="eu", host="h", pid=1, role="standby", epoch=0, seq=0,
                     leader=None, time=0.0, beats=1)  # fmt: skip


def test_an_empty_store_lists_no_agents(store: Store) -> None:
    assert store.list_agents() == []


def test_agents_written_by_one_client_are_listed_by_another_sorted(
    store: Store, open_second: Opener
) -> None:
    """A lease, a heartbeat, an admission or an event each make an agent known."""
    store.cas_lease("zeta", None, LeaseRecord("n1", "eu", "s1", epoch=1, ttl_ms=2000))
    store.put_heartbeat("alpha", beat("n2"))
    store.admit("mid.agent-1", "r1", 1, b"sealed")
    store.append_event("b_2", Event(node="n1", n=1, type="node.started", time=0.0))
    assert open_second().list_agents() == ["alpha", "b_2", "mid.agent-1", "zeta"]


def test_reading_an_agent_does_not_make_it_listed(store: Store) -> None:
    """hb status with a mistyped id reads that agent's records: it must not appear."""
    store.put_heartbeat("real", beat("n1"))
    assert store.read_lease("typo") is None
    assert store.list_heartbeats("typo") == []
    assert store.list_checkpoints("typo") == []
    assert store.read_events("typo") == []
    assert store.list_agents() == ["real"]


def test_the_file_store_skips_planted_names(tmp_path: Path) -> None:
    """Under kv/index/: a name that is no agent id, a folder, a symlink and a sync-conflict
    copy are all skipped."""
    store = FileStore(tmp_path / "store")
    store.put_heartbeat("good", beat("n1"))
    index = tmp_path / "store" / "kv" / "index"
    (index / "bad name!").write_bytes(b"")
    (index / ".hidden").write_bytes(b"")
    (index / "a-folder").mkdir()
    (index / "a-folder" / "inside").write_bytes(b"")
    os.symlink(index / "good", index / "linked")
    (index / "good.sync-conflict-20260101-000000-ABCDEF").write_bytes(b"")
    assert store.list_agents() == ["good"]
