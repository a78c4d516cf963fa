"""Junk planted under the record layer's keys, on every backend (DESIGN.md invariant 10).

Someone who can write the store but lacks the secret may put anything under its
keys. Checkpoints under numbers out of range, damaged heartbeats and events are
left out; a checkpoint under another epoch never keeps the leader's publish out.
"""

from __future__ import annotations

from hamsterbunker.core.limits import MAX_CHECKPOINT_BYTES
from hamsterbunker.records import CheckpointInfo
from hamsterbunker.stores.base import Fence
from hamsterbunker.stores.interface import Store
from hamsterbunker.stores.layer.keys import AgentKeys
from tests.support.raw_store import RawRecords, raw_view
from tests.support.records import lease
from tests.support.records import network_event as event
from tests.support.records import network_heartbeat as heartbeat


def test_planted_junk_is_left_out_and_never_blocks_a_publish(store: Store) -> None:
    held = store.cas_lease("a", None, lease("n1", 1))
    raw, keys = raw_view(store), AgentKeys("a")
    assert isinstance(raw, RawRecords)

    def plant_info(info: CheckpointInfo) -> None:
        raw.put(keys.checkpoint(info), b"sealed bytes, say")

    plant_info(CheckpointInfo(epoch=9, seq=99, size=4, written=0.0))
    plant_info(CheckpointInfo(epoch=1, seq=98, size=-1, written=0.0))
    plant_info(CheckpointInfo(epoch=2, seq=97, size=MAX_CHECKPOINT_BYTES + 1, written=0.0))
    store.put_checkpoint("a", Fence("n1", "s1", held.epoch), 1, b"ours")
    assert [(i.seq, i.epoch) for i in store.list_checkpoints("a")] == [(99, 9), (1, 1)]
    raw.put_heartbeat("a", "bad", b"[" * 60_000)
    raw.put_heartbeat("a", "copy", heartbeat("good").to_json())
    store.put_heartbeat("a", heartbeat("good"))
    assert [b.node for b in store.list_heartbeats("a")] == ["good"]
    raw.put(keys.event("n1", 5), b"{nope")
    store.append_event("a", event("n1", 1))  # appended after the junk
    store.append_event("a", event("n1", 2))
    assert [e.n for e in store.read_events("a")] == [1, 2]


def test_a_standby_reading_the_checkpoint_a_lease_names_passes_planted_names_by(
    store: Store,
) -> None:
    """read_checkpoint_from finds no checkpoint under a name we do not write, nor one out of
    range (the listing leaves both out); a planted one under a valid name comes back as
    planted, and the restore's open rejects it."""
    held = store.cas_lease("a", None, lease("n1", 1))
    raw, keys = raw_view(store), AgentKeys("a")
    assert isinstance(raw, RawRecords)
    raw.put(keys.checkpoints_of(2, 1) + "junk", b"junk")
    assert store.read_checkpoint_from("a", 2, 1) is None
    raw.put(keys.checkpoint(CheckpointInfo(epoch=1, seq=3, size=-1, written=0.0)), b"junk")
    assert store.read_checkpoint_from("a", 3, 1) is None
    store.put_checkpoint("a", Fence("n1", "s1", held.epoch), 4, b"ours")
    found = store.read_checkpoint_from("a", 4, 1)
    assert found is not None and (found[0].seq, found[1]) == (4, b"ours")
