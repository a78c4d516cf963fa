"""Operator requests in the lease record: pause, resume, switchover (hamsterbunker.lease.control).

Real ``Runtime`` nodes in this process, each with its own store client, on
every backend. Waits are on conditions: "does not step" is shown by the
lease record being renewed several times over while the seq stands still.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from hamsterbunker.core.errors import CorruptRecord, Tampered
from hamsterbunker.core.timing import LeaseTiming
from hamsterbunker.lease.control import (
    Control,
    ControlRefused,
    open_control,
    request_switchover,
    set_paused,
    sign_control,
)
from hamsterbunker.records import MAX_CONTROL_CHARS, MAX_HISTORY, LeaseRecord, Takeover
from hamsterbunker.runtime import Runtime
from hamsterbunker.sealing import Sealer, new_cluster_record
from hamsterbunker.stores import Store, open_store
from tests.support import wait_until
from tests.support.agents import AGENT, SECRET, CountingAgent, Recorder, SyncAgent
from tests.support.etcd_server import etcd_url
from tests.support.redis_server import redis_url

# TTL 1000 ms: a switchover watches a standby for one TTL, and it beats every half TTL;
# on a loaded machine (make test's workers) a 300 ms stall must not hide a live standby.
TIMING = LeaseTiming(tick_ms=100, lease_ttl_ms=1000)
BACKENDS = ["file", "redis", "etcd"]


class Cluster:
    def __init__(self, url: str) -> None:
        self.url = url
        self.events = Recorder()
        self.nodes: dict[str, Runtime] = {}
        self.agents: dict[str, CountingAgent] = {}
        self.store = open_store(url)

    def start(self, node_id: str, store: Store | None = None, **kwargs: Any) -> Runtime:
        agent = self.agents[node_id] = SyncAgent()
        node = self.nodes[node_id] = Runtime(
            node_id=node_id, region="r1", store=store or open_store(self.url), agent=agent,
            on_event=self.events, secret=SECRET, timing=TIMING, **kwargs,
        )  # fmt: skip
        node.start()
        return node

    def sealer(self) -> Sealer:
        cluster = self.store.read_cluster()
        assert cluster is not None
        return Sealer(SECRET, cluster)

    def leader(self) -> str | None:
        lease = self.store.read_lease(AGENT)
        return None if lease is None else lease.holder

    def seq(self) -> int:
        infos = self.store.list_checkpoints(AGENT)
        return max((i.seq for i in infos), default=0)

    def close(self) -> None:
        for agent in self.agents.values():
            agent.release.set()
        for node in self.nodes.values():
            with contextlib.suppress(BaseException):
                node.stop(timeout=20)
        self.store.close()


@pytest.fixture(params=BACKENDS)
def cluster(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Cluster]:
    backend = request.param
    url = {"file": lambda: f"file://{tmp_path}/store", "redis": redis_url, "etcd": etcd_url}
    made = Cluster(url[backend]())
    try:
        yield made
    finally:
        made.close()


def three_nodes(cluster: Cluster) -> str:
    """Start a, then b and c once a leads and has published; the leader."""
    cluster.start("a")
    wait_until(lambda: cluster.leader() == "a" and cluster.seq() >= 2, "a to lead and step")
    for node in ("b", "c"):
        cluster.start(node)
    beats = lambda: {hb.node for hb in cluster.store.list_heartbeats(AGENT)}  # noqa: E731
    wait_until(lambda: beats() >= {"a", "b", "c"}, "three heartbeats")
    return "a"


def steps_entered(cluster: Cluster) -> list[int]:
    return sorted(s for agent in cluster.agents.values() for s in agent.entered_seqs())


def settled_seq(cluster: Cluster) -> int:
    """The seq once a pause has taken hold: the step in flight at the pause may still publish."""
    renewed_times(cluster, 3)
    return cluster.seq()


def renewed_times(cluster: Cluster, times: int) -> None:
    """Wait until the lease record has been renewed that many times more (time passes)."""
    first = cluster.store.read_lease(AGENT)
    assert first is not None
    wait_until(
        lambda: (
            (lease := cluster.store.read_lease(AGENT)) is not None
            and lease.renewals >= first.renewals + times
        ),
        f"{times} renewals",
    )


# -- switchover --------------------------------------------------------------------


def test_switchover_hands_the_lease_to_the_named_standby_at_once(cluster: Cluster) -> None:
    """The named standby takes the next epoch via=switchover, well within a TTL of the
    request; the other standby never takes it; no step is run twice."""
    three_nodes(cluster)
    before = cluster.store.read_lease(AGENT)
    assert before is not None
    target = request_switchover(cluster.store, cluster.sealer(), AGENT, to="c")
    assert target == "c"
    acquired = cluster.events.wait("lease.acquired", node="c")
    assert acquired.detail["via"] == "switchover"
    assert acquired.detail["from"] == "a"
    assert acquired.epoch == before.epoch + 1
    released = cluster.events.wait("lease.released", node="a")
    assert released.detail == {"via": "switchover", "to": "c"}
    wait_until(lambda: cluster.seq() >= acquired.seq + 3, "c to step")
    assert cluster.events.of("lease.acquired", node="b") == []
    # Each step ran once (the step a was in finished and was published, not repeated).
    entered = steps_entered(cluster)
    assert len(entered) == len(set(entered)), entered
    lease = cluster.store.read_lease(AGENT)
    assert lease is not None and lease.holder == "c"
    last = lease.history[-1]
    assert (last.epoch, last.from_, last.to, last.via) == (before.epoch + 1, "a", "c", "switchover")
    assert last.gap_ms < TIMING.lease_ttl_ms


def test_the_target_leads_the_term_handed_to_it_before_it_writes_the_lease(
    cluster: Cluster,
) -> None:
    """The leader writes the target's next term (LeaseKeeper.hand_over): the target's
    first step does not wait for a lease write of its own (its first renewal, sent at
    once beside the restore, is slow here: the step is entered before it returns)."""
    cluster.start("a")
    wait_until(lambda: cluster.leader() == "a" and cluster.seq() >= 2, "a to lead and step")
    # a's steps take a while, so the hand-over comes well after c's read of the request
    # (the read its lease counts from).
    cluster.agents["a"].slow.update({seq: 0.1 for seq in range(1, 1000)})
    store = open_store(cluster.url)
    steps_at_write: list[int] = []  # how many steps c had entered as each lease write returned

    def counted(write: Any) -> Any:
        def call(*args: Any) -> Any:
            try:
                time.sleep(0.2)  # a slow store: a first step waiting on the write comes after
                return write(*args)
            finally:
                steps_at_write.append(len(cluster.agents["c"].entered_seqs()))

        return call

    store.cas_lease = counted(store.cas_lease)  # type: ignore[method-assign]
    store.take_lease = counted(store.take_lease)  # type: ignore[method-assign]
    cluster.start("c", store=store)
    beats = lambda: {hb.node for hb in cluster.store.list_heartbeats(AGENT)}  # noqa: E731
    wait_until(lambda: beats() >= {"a", "c"}, "two heartbeats")

    request_switchover(cluster.store, cluster.sealer(), AGENT, to="c")

    acquired = cluster.events.wait("lease.acquired", node="c")
    assert acquired.detail["via"] == "switchover"
    wait_until(lambda: steps_at_write, "c to renew the lease it was handed")
    assert steps_at_write[0] >= 1, "c's first step waited for a lease write of its own"
    lease = cluster.store.read_lease(AGENT)
    assert lease is not None and lease.holder == "c"


def test_switchover_without_a_target_picks_a_live_standby(cluster: Cluster) -> None:
    three_nodes(cluster)
    # A standby stalled for the whole watch (a TTL) on a loaded machine is rightly not seen
    # as live, and the request refused: asked again, as an operator would, at most twice.
    for attempt in range(3):
        try:
            target = request_switchover(cluster.store, cluster.sealer(), AGENT)
            break
        except ControlRefused as exc:
            if "no live standby" not in str(exc) or attempt == 2:
                raise
    assert target in ("b", "c")
    wait_until(lambda: cluster.leader() == target, f"{target} to lead")


@pytest.mark.parametrize(
    ("to", "says"),
    [
        (
            "nobody",
            r"no node nobody keeps agent 'a' \(it has no heartbeat in the store\); "
            "its nodes: a, b, c",
        ),
        ("a", "a leads agent 'a' already"),
    ],
    ids=["unknown", "the-leader"],
)
def test_switchover_to_a_node_that_is_not_a_live_standby_is_refused(
    cluster: Cluster, to: str, says: str
) -> None:
    three_nodes(cluster)
    with pytest.raises(ControlRefused, match=says):
        request_switchover(cluster.store, cluster.sealer(), AGENT, to=to)
    lease = cluster.store.read_lease(AGENT)
    # Nothing was written: no request, and no switchover. (On a loaded machine the lease may
    # still have expired to another node meanwhile: that is no switchover.)
    assert lease is not None and lease.control == ""
    assert all(takeover.via != "switchover" for takeover in lease.history), lease.history


def test_switchover_to_a_stopped_standby_is_refused(cluster: Cluster) -> None:
    three_nodes(cluster)
    cluster.nodes["b"].stop(timeout=20)
    # A stopped node drops its heartbeat; one put back by hand beats no more.
    cluster.store.put_heartbeat(AGENT, replace(cluster.store.list_heartbeats(AGENT)[0], node="b"))
    with pytest.raises(ControlRefused, match="not a live standby"):
        request_switchover(cluster.store, cluster.sealer(), AGENT, to="b")


def test_switchover_without_a_leader_is_refused(cluster: Cluster) -> None:
    cluster.start("a")
    wait_until(lambda: cluster.leader() == "a", "a to lead")
    sealer = cluster.sealer()
    cluster.nodes["a"].stop(timeout=20)
    with pytest.raises(ControlRefused, match="no leader"):
        request_switchover(cluster.store, sealer, AGENT)  # to any standby: there is none


# -- pause ------------------------------------------------------------------------


def test_a_paused_leader_keeps_its_lease_and_steps_no_more_until_resumed(
    cluster: Cluster,
) -> None:
    three_nodes(cluster)
    sealer = cluster.sealer()
    epoch = cluster.store.read_lease(AGENT).epoch  # type: ignore[union-attr]
    set_paused(cluster.store, sealer, AGENT, True)
    cluster.events.wait("agent.paused", node="a")
    wait_until(lambda: all(hb.paused for hb in cluster.store.list_heartbeats(AGENT)),
               "every heartbeat to say paused")  # fmt: skip
    seq = settled_seq(cluster)
    # Several TTLs of renewals: the standbys see a live leader and leave it be.
    renewed_times(cluster, 4 * TIMING.lease_ttl_ms // TIMING.tick_ms)
    assert cluster.seq() == seq
    lease = cluster.store.read_lease(AGENT)
    assert lease is not None and (lease.holder, lease.epoch) == ("a", epoch)
    set_paused(cluster.store, sealer, AGENT, False)
    cluster.events.wait("agent.unpaused", node="a")
    wait_until(lambda: cluster.seq() >= seq + 3, "a to step again")


def test_a_paused_agent_stays_paused_across_a_takeover(cluster: Cluster) -> None:
    """The request is carried into the next term: a new leader starts paused."""
    three_nodes(cluster)
    set_paused(cluster.store, cluster.sealer(), AGENT, True)
    cluster.events.wait("agent.paused", node="a")
    seq = settled_seq(cluster)
    cluster.nodes["a"].stop(timeout=20)  # a planned stop: released, taken at once
    acquired = wait_until(
        lambda: [e for e in cluster.events.of("lease.acquired") if e.node != "a"], "a takeover"
    )[0]
    cluster.events.wait("agent.paused", node=acquired.node)
    renewed_times(cluster, 10)
    assert cluster.seq() == seq
    lease = cluster.store.read_lease(AGENT)
    assert lease is not None and lease.holder == acquired.node


def test_pause_before_any_node_makes_the_first_leader_start_paused(cluster: Cluster) -> None:
    cluster.start("a")
    wait_until(lambda: cluster.leader() == "a", "a to lead")
    sealer = cluster.sealer()
    cluster.nodes["a"].stop(timeout=20)
    set_paused(cluster.store, sealer, AGENT, True)
    seq = cluster.seq()
    cluster.start("b")
    cluster.events.wait("agent.paused", node="b")
    renewed_times(cluster, 10)
    assert cluster.seq() == seq


# -- hostile control fields -------------------------------------------------------------


def _write_control(cluster: Cluster, text: str) -> None:
    for _ in range(50):
        lease = cluster.store.read_lease(AGENT)
        assert lease is not None
        with contextlib.suppress(Exception):
            cluster.store.cas_lease(AGENT, lease.version, replace(lease, control=text))
            return
    raise AssertionError("could not write the lease record")


@pytest.mark.parametrize("kind", ["unsigned", "other-key", "other-agent"])
def test_a_control_request_that_does_not_authenticate_is_ignored(
    cluster: Cluster, kind: str
) -> None:
    three_nodes(cluster)
    forged = Control(agent=AGENT, revision=10**18, paused=True)
    payload = json.dumps(forged.__dict__).encode()
    other = Sealer("another-secret-entirely", new_cluster_record("another-secret-entirely"))
    text = {
        "unsigned": payload.decode() + "\n" + "0" * 64,
        "other-key": sign_control(other, forged),
        "other-agent": sign_control(cluster.sealer(), replace(forged, agent="b")),
    }[kind]
    _write_control(cluster, text)
    ignored = cluster.events.wait("control.ignored", node="a")
    assert "ignored a control request" in ignored.detail["reason"]
    seq = cluster.seq()
    wait_until(lambda: cluster.seq() >= seq + 3, "a to go on stepping")
    assert cluster.events.of("agent.paused") == []


def test_an_older_request_put_back_undoes_nothing(cluster: Cluster) -> None:
    three_nodes(cluster)
    sealer = cluster.sealer()
    paused = set_paused(cluster.store, sealer, AGENT, True)
    cluster.events.wait("agent.paused", node="a")
    set_paused(cluster.store, sealer, AGENT, False)
    cluster.events.wait("agent.unpaused", node="a")
    _write_control(cluster, paused.control)  # the pause, put back
    ignored = cluster.events.wait("control.ignored", node="a")
    assert "older" in ignored.detail["reason"]
    seq = cluster.seq()
    wait_until(lambda: cluster.seq() >= seq + 3, "a to go on stepping")
    assert len(cluster.events.of("agent.paused", node="a")) == 1


def test_open_control_refuses_what_is_not_signed_for_the_agent() -> None:
    sealer = Sealer(SECRET, new_cluster_record(SECRET))
    text = sign_control(sealer, Control(agent="x", revision=1, paused=True))
    assert open_control(sealer, text, "x").paused
    with pytest.raises(Tampered):
        open_control(sealer, text, "y")
    with pytest.raises(Tampered):
        open_control(sealer, text.replace('"paused":true', '"paused":false'), "x")


def _lease_doc(**fields: Any) -> bytes:
    doc = json.loads(LeaseRecord("a", "r", "s", 3, 2000).to_json())
    doc.update(fields)
    return json.dumps(doc).encode()


GOOD_TAKEOVER = {"epoch": 3, "from": "b", "to": "a", "via": "expired", "gap_ms": 2000, "time": 1.5}


@pytest.mark.parametrize(
    "fields",
    [
        {"history": [GOOD_TAKEOVER] * (MAX_HISTORY + 1)},
        {"history": [{**GOOD_TAKEOVER, "via": "magic"}]},
        {"history": [{**GOOD_TAKEOVER, "from": "../etc"}]},
        {"history": [{**GOOD_TAKEOVER, "to": "a b"}]},
        {"history": [{**GOOD_TAKEOVER, "gap_ms": -1}]},
        {"history": [{**GOOD_TAKEOVER, "time": 1e999}]},
        {"history": ["not an object"]},
        {"history": {"not": "a list"}},
        {"control": "x" * (MAX_CONTROL_CHARS + 1)},
        {"control": 7},
        {"successor": "../../b"},
        {"handoff": "yes"},
        {"written": -1},
        {"written": "yesterday"},
        {"written": 1e300},
    ],
    ids=lambda fields: f"{next(iter(fields))}",
)
def test_a_lease_record_with_hostile_new_fields_is_corrupt(fields: dict[str, Any]) -> None:
    """What a store writer without the secret can put in the fields switchover, pause and
    history added is refused as a damaged record (a standby reads it as unreadable)."""
    assert LeaseRecord.from_json(_lease_doc()).history == ()
    with pytest.raises(CorruptRecord):
        LeaseRecord.from_json(_lease_doc(**fields))


def test_a_lease_record_keeps_its_history_and_requests_through_json() -> None:
    takeover = Takeover(epoch=3, to="a", via="switchover", gap_ms=12, time=1.5, from_="b")
    record = LeaseRecord("a", "r", "s", 3, 2000, control="c", successor=None, history=(takeover,),
                         written=1_700_000_000.25)  # fmt: skip
    assert LeaseRecord.from_json(record.to_json()) == record
    assert LeaseRecord.from_json(_lease_doc(history=[GOOD_TAKEOVER])).history[0].from_ == "b"


def test_a_lease_record_written_before_its_write_time_was_kept_still_reads() -> None:
    """A record without ``written`` (an older node's) reads as written at an unknown time, 0,
    and is written back without it, as it was."""
    old = _lease_doc(history=[GOOD_TAKEOVER])
    assert "written" not in json.loads(old)
    record = LeaseRecord.from_json(old)
    assert (record.written, record.history[0].gap_ms) == (0.0, 2000)
    assert json.loads(record.to_json()) == json.loads(old)


def test_a_lease_handed_to_a_node_that_never_takes_it_is_taken_after_a_ttl(
    cluster: Cluster,
) -> None:
    """A released record naming a successor (hostile, or a target that died) is left to it
    for one TTL as seen by the others, then taken as expired: it stalls, never blocks."""
    cluster.start("a")
    wait_until(lambda: cluster.leader() == "a" and cluster.seq() >= 2, "a to lead and step")
    cluster.start("b")
    wait_until(lambda: len(cluster.store.list_heartbeats(AGENT)) == 2, "two heartbeats")
    for _ in range(50):
        lease = cluster.store.read_lease(AGENT)
        assert lease is not None
        with contextlib.suppress(Exception):
            written = cluster.store.cas_lease(
                AGENT, lease.version, replace(lease, holder=None, successor="ghost")
            )
            break
    written_at = time.monotonic()
    taken = cluster.events.wait(
        "lease.acquired", where=lambda e: e.epoch > written.epoch, timeout=20
    )
    taken_at = next(t for t, e in cluster.events.timed("lease.acquired") if e is taken)
    assert taken.detail["via"] == "expired"
    assert taken_at - written_at >= TIMING.lease_ttl_s - 0.05
