"""Store.forget_node, on every backend: a dead node's heartbeat and event log dropped (``hb forget``).

Only that node's records go, whoever wrote them and however many segments its
log has; a second forget, or one of a node never seen, is a no-op; a node that
writes again afterwards shows again, and every tail (one that read the old log
too) reads its new log from the start, whether the node numbers its events
afresh (a new process) or on from before (a process that was only frozen). A
node name that is no node id never names a key or a path.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from hamsterbunker.core.errors import ConfigError
from hamsterbunker.records import Event, Heartbeat, LeaseRecord
from hamsterbunker.stores.base import Fence
from hamsterbunker.stores.interface import Store
from hamsterbunker.stores.layer.files import FileStore
from hamsterbunker.stores.layer.keys import AgentKeys
from tests.support.raw_store import file_key

from .conftest import EVENT_BOUND, Opener, Spaces

HOSTILE = ["../a", "n1/../n2", "*", "n?", "[n]1", "n1*", "", " n1", "-n1", ".n1", "n" * 65, "n1\n"]


def beat(node: str, beats: int = 1) -> Heartbeat:
    return Heartbeat(node=node, region="eu", host="h", pid=1, role="standby", epoch=1, seq=0,
                     leader=None, time=1700000000.0 + beats, beats=beats)  # fmt: skip


def event(node: str, n: int, time: float = 1700000000.0) -> Event:
    return Event(node=node, n=n, type="agent.step", time=time + n, epoch=1, seq=n)


def numbers(events: list[Event]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for e in events:
        out.setdefault(e.node, []).append(e.n)
    return out


def populate(store: Store, agent: str = "a") -> None:
    """n1 with a log of more than one segment, n2 and n10 (whose names start like n1's)."""
    for node, count in (("n1", 2 * EVENT_BOUND + 3), ("n2", 3), ("n10", 2), ("n1.b", 1)):
        store.put_heartbeat(agent, beat(node))
        for n in range(1, count + 1):
            store.append_event(agent, event(node, n))


def test_forgetting_drops_the_nodes_heartbeat_and_events_and_nothing_else(
    store: Store, open_second: Opener
) -> None:
    """After forget_node another client sees nothing of that node; other nodes, other agents
    and the lease are as they were."""
    populate(store, "a")
    populate(store, "b")
    store.cas_lease("a", None, LeaseRecord("n1", "eu", "s1", epoch=1, ttl_ms=2000))
    before_b = (store.list_heartbeats("b"), store.read_events("b"))
    others = [e for e in store.read_events("a") if e.node != "n1"]
    open_second().forget_node("a", "n1")
    reader = open_second()
    assert [b.node for b in reader.list_heartbeats("a")] == ["n1.b", "n10", "n2"]
    assert reader.read_events("a") == others
    assert numbers(reader.read_events("a", after={"n2": 1})) == {"n1.b": [1], "n10": [1, 2],
                                                                 "n2": [2, 3]}  # fmt: skip
    assert (reader.list_heartbeats("b"), reader.read_events("b")) == before_b
    lease = reader.read_lease("a")
    assert lease is not None and lease.holder == "n1"


def test_forgetting_again_or_an_unknown_node_is_a_no_op(store: Store) -> None:
    """A second forget, a node that never wrote, and an agent never written raise nothing;
    the last leaves that agent unlisted."""
    populate(store)
    store.forget_node("a", "n1")
    store.forget_node("a", "n1")
    store.forget_node("a", "ghost")
    store.forget_node("never-written", "n1")
    assert [b.node for b in store.list_heartbeats("a")] == ["n1.b", "n10", "n2"]
    assert "n1" not in numbers(store.read_events("a"))
    assert store.list_agents() == ["a"]


def test_a_forgotten_node_with_events_only_or_a_heartbeat_only_is_dropped(store: Store) -> None:
    """Whichever of the two a node left behind goes."""
    store.put_heartbeat("a", beat("beat-only"))
    store.append_event("a", event("events-only", 1))
    store.forget_node("a", "beat-only")
    store.forget_node("a", "events-only")
    assert store.list_heartbeats("a") == []
    assert store.read_events("a") == []


@pytest.mark.parametrize("numbering", ["afresh", "on"])
def test_a_node_that_writes_again_shows_again_in_every_tail(
    store: Store, open_second: Opener, numbering: str
) -> None:
    """A tail that read the old log, one that read nothing yet, and read_events all show the
    node's new events from its first, numbered from 1 (a new process) or on from before (a
    process that was frozen): none is taken for an event already read."""
    old_count = 5
    writer = open_second()
    for n in range(1, old_count + 1):
        writer.append_event("a", event("n1", n))
    writer.put_heartbeat("a", beat("n1"))
    writer.append_event("a", event("n2", 1))
    tail = store.tail("a")
    assert numbers(tail.read().events) == {"n1": list(range(1, old_count + 1)), "n2": [1]}
    open_second().forget_node("a", "n1")
    first = 1 if numbering == "afresh" else old_count + 1
    new = [event("n1", n, time=1800000000.0) for n in range(first, first + 3)]
    for each in new:
        writer.append_event("a", each)
    writer.put_heartbeat("a", beat("n1", 7))
    seen = tail.read()
    assert seen.events == new
    assert {b.node: b.beats for b in seen.heartbeats} == {"n1": 7}
    assert tail.read().events == []
    assert [e for e in store.read_events("a") if e.node == "n1"] == new
    assert [e for e in open_second().tail("a").read().events if e.node == "n1"] == new


def test_a_tail_reports_nothing_of_a_forgotten_node(store: Store, open_second: Opener) -> None:
    """Its heartbeat drops out of the tail at once, and a new tail finds none of its events;
    when it writes again after the tail saw it gone, the new log comes whole, even one that
    grows past the old log's length before the next read."""
    writer = open_second()
    for n in range(1, 4):
        writer.append_event("a", event("n1", n))
    writer.put_heartbeat("a", beat("n1"))
    writer.put_heartbeat("a", beat("n2"))
    tail = store.tail("a")
    tail.read()
    writer.forget_node("a", "n1")
    gone = tail.read()
    assert gone.events == []
    assert [b.node for b in gone.heartbeats] == ["n2"]
    assert open_second().tail("a").read().events == []
    new = [event("n1", n, time=1800000000.0) for n in range(1, 6)]
    for each in new:
        writer.append_event("a", each)
    assert tail.read().events == new


@pytest.mark.parametrize("name", HOSTILE, ids=repr)
def test_a_name_that_is_no_node_id_is_refused_and_nothing_changes(store: Store, name: str) -> None:
    """Path traversal, glob and pattern characters, an empty or overlong name: ConfigError,
    before any key or path is named."""
    populate(store)
    before = (store.list_heartbeats("a"), store.read_events("a"))
    with pytest.raises(ConfigError, match="invalid node id"):
        store.forget_node("a", name)
    assert (store.list_heartbeats("a"), store.read_events("a")) == before


def test_no_key_of_a_forgotten_node_is_left(spaces: Spaces) -> None:
    """Every key (file: every file) of the node goes, all its log's segments included; the
    same node under another agent and another prefix keeps all of its."""
    for name in ("p", "q"):
        store = spaces.open(name)
        populate(store, "a")
        populate(store, "b")
    spaces.open("p").forget_node("a", "n1")
    of_n1 = re.compile(r"[/:]n1([/:]|\.json|$)")
    stored = spaces.keys()
    left = [key for key in stored if of_n1.search(key)]
    assert left and all(not k.startswith(spaces.agent_prefix("p", "a")) for k in left), left
    assert any(k.startswith(spaces.agent_prefix("p", "b")) for k in left)
    assert any(k.startswith(spaces.agent_prefix("q", "a")) for k in left)


# -- the file store: what someone planted under the node's names --------------------


def test_the_file_store_leaves_the_target_of_a_planted_symlink(tmp_path: Path) -> None:
    """A symlink where the node's heartbeat or an event goes is no key: forget never
    follows it, and the file it points to is left as it was."""
    root = tmp_path / "store"
    store = FileStore(root)
    store.put_heartbeat("a", beat("n2"))
    store.append_event("a", event("n1", 1))
    keys = AgentKeys("a")
    outside = tmp_path / "precious"
    outside.write_bytes(b"keep me")
    os.symlink(outside, file_key(root, keys.beat("n1")))
    os.symlink(outside, file_key(root, keys.node_events("n1")) / "link")
    store.forget_node("a", "n1")
    assert outside.read_bytes() == b"keep me"
    assert [b.node for b in store.list_heartbeats("a")] == ["n2"]
    assert store.read_events("a") == []


def test_the_file_store_leaves_a_planted_directory(tmp_path: Path) -> None:
    """A directory planted under the node's heartbeat key is not ours: left, and the rest
    of the node's records still go."""
    root = tmp_path / "store"
    store = FileStore(root)
    store.put_heartbeat("a", beat("n2"))
    store.append_event("a", event("n1", 1))
    planted = file_key(root, AgentKeys("a").beat("n1"))
    planted.mkdir()
    (planted / "inside").write_bytes(b"x")
    store.forget_node("a", "n1")
    assert [b.node for b in store.list_heartbeats("a")] == ["n2"]
    assert store.read_events("a") == []
    assert (planted / "inside").read_bytes() == b"x"


def test_forgetting_an_agent_removes_every_record_of_it_and_nothing_else(
    store: Store, open_second: Opener
) -> None:
    """forget_agent (hb forget --agent): another client then finds nothing of the agent (no
    lease, checkpoint, journal, inbox, heartbeat or event, not listed); another agent is as
    it was; a node that writes it again lists it again."""
    for agent in ("a", "b"):
        populate(store, agent)
        store.cas_lease(agent, None, LeaseRecord("n1", "eu", "s1", epoch=1, ttl_ms=2000))
        fence = Fence(holder="n1", session="s1", epoch=1)
        store.put_checkpoint(agent, fence, 1, b"sealed-1")
        store.put_effect(agent, fence, 2, 0, "outcome", b"an effect")
        store.admit(agent, "r1", 1, b"a submission")
    before_b = (store.read_lease("b"), store.list_checkpoints("b"), store.read_inbox("b"),
                store.list_heartbeats("b"), store.read_events("b"))  # fmt: skip
    open_second().forget_agent("a")
    reader = open_second()
    assert reader.list_agents() == ["b"]
    assert reader.read_lease("a") is None
    assert reader.list_checkpoints("a") == [] and reader.read_effects("a", 2) == {}
    assert reader.read_inbox("a") == [] and reader.read_admission("a", "r1") is None
    assert reader.list_heartbeats("a") == [] and reader.read_events("a") == []
    assert (reader.read_lease("b"), reader.list_checkpoints("b"), reader.read_inbox("b"),
            reader.list_heartbeats("b"), reader.read_events("b")) == before_b  # fmt: skip
    store.forget_agent("a")  # again: nothing to remove
    store.put_heartbeat("a", beat("n3"))  # the same client as before the forget
    assert open_second().list_agents() == ["a", "b"]
