"""Hostile and damaged store contents on every backend (DESIGN.md invariant 10).

Whatever a store writer without the secret puts in the store (bit rot does the
same), a node does not crash, hang, or resume behind a checkpoint it knows was
accepted: it reports what it rejected and either resumes from the newest
checkpoint that authenticates or refuses (StoreRegressed). Only authenticated
checkpoints move the next epoch and the next seq. Each test runs on the file
store, Redis and etcd (``raw_store.backend_store``), with real node runtimes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import secrets
import signal
import struct
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hamsterbunker.core.errors import NoUsableCheckpoint, SealError, StoreRegressed
from hamsterbunker.core.history import read_history
from hamsterbunker.core.limits import MAX_EPOCH
from hamsterbunker.core.timing import LeaseTiming
from hamsterbunker.ops.checker import check
from hamsterbunker.ops.local import LocalCluster, NodeSpec
from hamsterbunker.runtime import Runtime
from hamsterbunker.sealing import Sealer
from hamsterbunker.stores import open_store
from tests.support import SUPPORT_DIR, wait_until
from tests.support.agents import SECRET, AsyncAgent, CountingAgent, Recorder
from tests.support.raw_store import RawStore, backend_store

__all__ = ["backend_store"]  # the fixture, used by name

AGENT = "a"
TICK_MS, TTL_MS = 100, 600


class Nodes:
    """Runtimes on one store URL, each with its own store client; all stopped at the end."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.events = Recorder()
        self.made: list[tuple[Runtime, CountingAgent]] = []

    def start(self, node_id: str, agent: CountingAgent, **kwargs: Any) -> Runtime:
        node = Runtime(
            node_id=node_id,
            region="r1",
            store=self.url,
            agent=agent,  # type: ignore[arg-type]
            secret=SECRET,
            timing=LeaseTiming(tick_ms=TICK_MS, lease_ttl_ms=TTL_MS),
            on_event=self.events,
            **{"stop_grace_ms": 0, **kwargs},  # parked steps: no grace to wait out
        )
        self.made.append((node, agent))
        node.start()
        return node

    def publish_and_stop(self, count: int) -> None:
        """node-a publishes checkpoints 1..count under epoch 1, then hands the lease back."""
        agent = AsyncAgent(AGENT, park_from=count + 1)
        node = self.start("node-a", agent)
        self.events.wait("checkpoint.published", "node-a", where=lambda e: e.seq == count)
        node.stop()

    def checkpoints(self) -> list[tuple[int, int]]:
        store = open_store(self.url)
        try:
            return [(i.seq, i.epoch) for i in store.list_checkpoints(AGENT)]
        finally:
            store.close()

    def sealer(self) -> Sealer:
        store = open_store(self.url)
        try:
            cluster = store.read_cluster()
            assert cluster is not None
            return Sealer(SECRET, cluster)
        finally:
            store.close()

    def refusal(self, node: Runtime) -> BaseException:
        assert node.stopped.wait(20), "the node did not refuse"
        with pytest.raises(NoUsableCheckpoint) as caught:
            node.stop()
        return caught.value

    def close(self) -> None:
        for node, agent in self.made:
            agent.release.set()
            with contextlib.suppress(BaseException):
                node.stop(timeout=20)


@pytest.fixture
def nodes(backend_store: RawStore) -> Iterator[Nodes]:
    made = Nodes(backend_store.url)
    try:
        yield made
    finally:
        made.close()


def flip_one_byte(data: bytes) -> bytes:
    damaged = bytearray(data)
    damaged[len(damaged) // 2] ^= 0x01
    return bytes(damaged)


def with_header(header: bytes) -> bytes:
    """A blob shaped like a sealed checkpoint, with this unauthenticated header."""
    return struct.pack(">4sBH", b"HBCP", 1, len(header)) + header + bytes(12 + 16 + 8)


CRAFTED_HEADERS = {
    "infinite-epoch": b'{"kid":"k","agent":"a","epoch":Infinity,"seq":3,"time":1}',
    "deep-nesting": b"[" * 60_000,
    "huge-epoch": b'{"kid":"k","agent":"a","epoch":1' + b"0" * 400 + b',"seq":3,"time":1}',
    "not-an-object": b'"just a string"',
}


# -- case 1 and 2: damaged newest checkpoints refuse, never crash or roll back ---------------------


@pytest.mark.parametrize("header", list(CRAFTED_HEADERS))
def test_a_crafted_checkpoint_header_is_rejected_and_the_leader_refuses_not_crashes(
    nodes: Nodes, backend_store: RawStore, header: str
) -> None:
    """A newest checkpoint whose unauthenticated header holds Infinity, 60,000 nested '[', a
    400-digit epoch or no object is rejected as damaged: the next leader refuses to resume
    behind it (StoreRegressed naming its seq) instead of dying of an OverflowError or a
    RecursionError, and so does every node after it."""
    nodes.publish_and_stop(3)
    backend_store.put_checkpoint(AGENT, 3, 1, with_header(CRAFTED_HEADERS[header]))
    for node_id in ("node-b", "node-c"):
        agent = AsyncAgent(AGENT)
        refused = nodes.refusal(nodes.start(node_id, agent))
        assert isinstance(refused, StoreRegressed), refused
        assert "seq 3 did not authenticate" in str(refused)
        assert agent.init_calls == 0 and agent.entered == []
    rejected = nodes.events.of("checkpoint.rejected", "node-b")
    assert [e.detail["checkpoint_seq"] for e in rejected] == [3]
    [regressed] = [
        e for e in nodes.events.of("store.regressed", "node-b") if "damaged_seqs" in e.detail
    ]
    assert regressed.detail["damaged_seqs"] == [3]


def test_one_flipped_byte_in_each_newest_checkpoint_refuses_instead_of_rolling_back(
    nodes: Nodes, backend_store: RawStore
) -> None:
    """Flipping one byte in each of the two newest checkpoints (no secret needed; bit rot does
    the same) makes the next leader refuse, naming both seqs, rather than resume from the third
    newest: nothing is written and init() is never called."""
    nodes.publish_and_stop(4)
    for seq in (3, 4):
        backend_store.put_checkpoint(
            AGENT, seq, 1, flip_one_byte(backend_store.checkpoint(AGENT, seq, 1))
        )
    agent = AsyncAgent(AGENT)
    refused = nodes.refusal(nodes.start("node-b", agent))
    assert isinstance(refused, StoreRegressed)
    assert "newest checkpoint that authenticates is seq 2 of epoch 1, behind seq 4" in str(refused)
    assert "seq 4, 3 did not authenticate" in str(refused)
    assert nodes.events.of("agent.resumed", "node-b") == []
    assert agent.entered == [] and agent.init_calls == 0
    assert nodes.checkpoints()[:2] == [(4, 1), (3, 1)]  # left for inspection, nothing added


# -- case 4: numbers in names move nothing ---------------------------------------------------------


def test_junk_checkpoints_move_neither_the_next_epoch_nor_the_next_seq(
    nodes: Nodes, backend_store: RawStore
) -> None:
    """Junk listed as a checkpoint at the highest epoch, and junk at a seq far above the newest,
    are rejected and reported; the next leader takes epoch 2 (not one past the junk), numbers on
    from the newest checkpoint that authenticates, and publishes past the junk at once."""
    nodes.publish_and_stop(2)
    backend_store.put_checkpoint(AGENT, 1_000_000_000, 1, b"junk with a high seq")
    backend_store.put_checkpoint(AGENT, 5, MAX_EPOCH, b"junk with the highest epoch")
    agent = AsyncAgent(AGENT, park_from=5)
    nodes.start("node-b", agent)
    acquired = nodes.events.wait("lease.acquired", "node-b")
    assert acquired.epoch == 2
    nodes.events.wait("checkpoint.published", "node-b", where=lambda e: e.seq == 4)
    assert [c.seq for c in agent.entered_ctx()][:2] == [3, 4]
    rejected = {e.detail["checkpoint_seq"] for e in nodes.events.of("checkpoint.rejected")}
    assert rejected == {5, 1_000_000_000}
    ours = [(seq, epoch) for seq, epoch in nodes.checkpoints() if epoch == 2]
    assert ours[:2] == [(4, 2), (3, 2)]
    assert (1_000_000_000, 1) in nodes.checkpoints()  # above our seqs: never pruned


# -- case 5: a lease record that does not parse ---------------------------------------------------


@pytest.mark.parametrize(
    "lease",
    [
        b'{"holder":"x","region":"r","session":"s","epoch":1,"ttl_ms":1' + b"0" * 400
        + b',"renewals":1,"version":1}',
        b'{"holder":"x","region":"r","session":"s","epoch":1,"ttl_ms":999999999999,'
        b'"renewals":1,"version":1}',
        b'{"holder":"x","region":"r","session":"s","epoch":Infinity,"ttl_ms":2000,'
        b'"renewals":1,"version":1}',
        b"[" * 60_000,
        b"\x00\xffplain junk, no JSON at all",
    ],
    ids=["ttl-1e400", "ttl-beyond-the-limit", "infinite-epoch", "deep-nesting", "plain-junk"],
)  # fmt: skip
def test_a_lease_record_that_does_not_parse_is_replaced_a_ttl_later_and_the_agent_steps_again(
    nodes: Nodes, backend_store: RawStore, lease: bytes
) -> None:
    """A single write of a lease record with a TTL of 10^400 or beyond the stated limit, an
    infinite epoch, 60,000 nested '[' or plain junk is reported (store.error naming the lease
    record) and stalls nobody for good: once it stood a TTL, one node replaces it
    (lease.replaced_unreadable saying what it found) under a new epoch and steps on from the
    last checkpoint; none dies."""
    nodes.publish_and_stop(1)
    backend_store.put_lease(AGENT, lease)
    started = [nodes.start(node_id, AsyncAgent(AGENT)) for node_id in ("node-b", "node-c")]
    for node in started:
        error = nodes.events.wait("store.error", node.node_id)
        assert "lease record" in error.detail["error"], error
    replaced = nodes.events.wait("lease.replaced_unreadable", timeout=30)
    assert "lease record" in replaced.detail["found"], replaced
    # A node that knew no epoch took epoch 1 again, found node-a's checkpoint of epoch 1 and
    # gave the lease up to take it above: whoever resumes, resumes from that checkpoint.
    resumed = nodes.events.wait("agent.resumed", timeout=30)
    assert resumed.detail["from_seq"] == 1 and resumed.epoch >= 2
    nodes.events.wait("checkpoint.published", resumed.node, where=lambda e: e.seq == 2)
    assert len(nodes.events.of("lease.replaced_unreadable")) == 1
    assert nodes.events.of("store.regressed") == []  # nothing went back
    assert not any(node.stopped.is_set() for node in started)


# -- accepting a loss on purpose ------------------------------------------------------------------


def test_hb_accept_loss_lets_nodes_resume_and_forgives_nothing_published_after_it(
    nodes: Nodes, backend_store: RawStore, tmp_path: Path
) -> None:
    """After the two newest checkpoints are damaged, a node with a state directory refuses;
    hb accept-loss (told to give up everything above seq 1) records the acceptance; a node
    started afterwards, and the one that refused, resume from seq 1 under a new epoch. A later
    damage of the new line is refused again: the acceptance forgives nothing published after
    it."""
    from hamsterbunker.cli.main import main

    nodes.publish_and_stop(4)
    for seq in (3, 4):
        backend_store.put_checkpoint(
            AGENT, seq, 1, flip_one_byte(backend_store.checkpoint(AGENT, seq, 1))
        )
    state_dir = tmp_path / "state-b"
    refused = nodes.refusal(nodes.start("node-b", AsyncAgent(AGENT), state_dir=state_dir))
    assert isinstance(refused, StoreRegressed)

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HB_SECRET", SECRET)
        args = ["accept-loss", "--store", nodes.url, "--agent-id", AGENT]
        patch.setattr("sys.stdin", io.StringIO())
        before = open_store(nodes.url).read_lease(AGENT)
        assert main(args) == 1  # asked, no answer: nothing changed
        assert open_store(nodes.url).read_lease(AGENT) == before
        assert main([*args, "--to-seq", "1", "--yes"]) == 0

    agent = AsyncAgent(AGENT, park_from=4)
    nodes.start("node-b", agent, state_dir=state_dir)  # remembers seq 4: the acceptance covers it
    accepted = nodes.events.wait("store.loss_accepted", "node-b")
    assert (accepted.detail["from_seq"], sorted(accepted.detail["given_up"])) == (1, [2, 3, 4])
    resumed = nodes.events.wait(
        "agent.resumed", "node-b", where=lambda e: e.detail["from_seq"] == 1
    )
    nodes.events.wait("checkpoint.published", "node-b", where=lambda e: e.seq == 3)
    context, state = agent.entered[0]
    assert (context.seq, state["n"]) == (2, 1)  # built on checkpoint 1
    epoch = resumed.epoch
    assert epoch >= 3  # above the epoch the acceptance wrote
    store = open_store(nodes.url)
    try:
        [acceptor_event] = [e for e in store.read_events(AGENT) if e.node == "hb-accept-loss"]
        assert acceptor_event.type == "store.loss_accepted"
    finally:
        store.close()

    # The new line's newest checkpoint damaged: refused again, not resumed from the old line.
    [(node, agent_b)] = [(n, a) for n, a in nodes.made if n.node_id == "node-b" and a is agent]
    agent_b.release.set()
    node.stop()
    newest = max(s for s, e in nodes.checkpoints() if e == epoch)
    backend_store.put_checkpoint(
        AGENT, newest, epoch, flip_one_byte(backend_store.checkpoint(AGENT, newest, epoch))
    )
    again = nodes.refusal(nodes.start("node-c", AsyncAgent(AGENT)))
    assert isinstance(again, StoreRegressed)


def test_an_acceptance_written_without_the_secret_is_ignored(
    nodes: Nodes, backend_store: RawStore
) -> None:
    """A loss-acceptance record that does not authenticate (written by someone without the
    secret) is reported (acceptance.rejected) and changes nothing: the node still refuses."""
    nodes.publish_and_stop(3)
    backend_store.put_checkpoint(AGENT, 3, 1, flip_one_byte(backend_store.checkpoint(AGENT, 3, 1)))
    forged = {
        "agent": AGENT, "id": "x", "epoch": 99, "resume_seq": 2, "resume_epoch": 1,
        "to_seq": None, "given_up": [[3, 1]], "time": 0,
    }  # fmt: skip
    backend_store.put_acceptance(AGENT, json.dumps(forged).encode() + b"\n" + b"0" * 64)
    refused = nodes.refusal(nodes.start("node-b", AsyncAgent(AGENT)))
    assert isinstance(refused, StoreRegressed)
    [rejected] = nodes.events.of("acceptance.rejected", "node-b")
    assert "authenticate" in rejected.detail["error"]


# -- the same through hb run and hb accept-loss, as real processes -------------------------------


@pytest.mark.multiprocess
def test_hb_run_exits_3_on_a_damaged_newest_checkpoint_and_resumes_after_hb_accept_loss(
    backend_store: RawStore, tmp_path: Path
) -> None:
    """hb run over a store whose newest checkpoint does not authenticate exits 3 with one line
    naming its seq and hb accept-loss; hb accept-loss --yes gives it up and prints what it gave
    up; a node started afterwards resumes and publishes."""
    cluster = LocalCluster(
        store_url=backend_store.url,
        secret=secrets.token_urlsafe(16),
        agent="hb_test_agents:JournalCounter",
        log_dir=tmp_path / "logs",
        timing=LeaseTiming(100, 600),
        env={"PYTHONPATH": str(SUPPORT_DIR)},
        history=tmp_path / "history.jsonl",
    )
    store = open_store(backend_store.url)
    try:
        cluster.start(NodeSpec("node-a", "r1"))
        wait_until(lambda: len(store.list_checkpoints("journal")) >= 3, "three checkpoints")
        cluster.signal("node-a", signal.SIGTERM)
        assert cluster.processes["node-a"].wait(30) == 0
        newest = store.list_checkpoints("journal")[0]
        data = backend_store.checkpoint("journal", newest.seq, newest.epoch)
        backend_store.put_checkpoint("journal", newest.seq, newest.epoch, flip_one_byte(data))

        cluster.start(NodeSpec("node-b", "r1"))
        assert cluster.processes["node-b"].wait(60) == 3, cluster.log("node-b")
        refusal = [line for line in cluster.log("node-b").splitlines() if "refused" in line]
        assert len(refusal) == 1, cluster.log("node-b")
        assert f"seq {newest.seq} did not authenticate" in refusal[0]
        assert "hb accept-loss" in refusal[0]

        accepted = subprocess.run(
            [
                sys.executable,
                "-m",
                "hamsterbunker",
                "accept-loss",
                "--agent-id",
                "journal",
                "--yes",
            ],
            env={**os.environ, "HB_SECRET": cluster.secret, "HB_STORE": backend_store.url},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert accepted.returncode == 0, accepted.stderr
        assert f"seq {newest.seq} (epoch {newest.epoch})" in accepted.stdout  # given up
        assert f"resume from checkpoint seq {newest.seq - 1}" in accepted.stdout

        cluster.start(NodeSpec("node-c", "r1"))
        wait_until(
            lambda: any(i.epoch > newest.epoch + 1 for i in store.list_checkpoints("journal")),
            "node-c to publish under a new epoch",
        )
        assert cluster.alive("node-c"), cluster.log("node-c")
    finally:
        cluster.stop_all()
        store.close()
    # The history holds the loss, accepted on purpose, and nothing else wrong.
    assert check(read_history(tmp_path / "history.jsonl")) == []


# -- case 9: key parameters in the cluster record ---------------------------------------------------


def test_changed_key_parameters_are_reported_and_the_remembered_ones_kept(
    nodes: Nodes, backend_store: RawStore, tmp_path: Path
) -> None:
    """The cluster record's scrypt parameters changed in the store (key id kept): a node that
    remembers the record says so (store.warning) and goes on with the one it verified; a node
    that remembers nothing refuses to start with a clear error rather than derive a key from
    parameters someone else chose."""
    state_dir = tmp_path / "state-a"
    first = nodes.start("node-a", AsyncAgent(AGENT, park_from=3), state_dir=state_dir)
    nodes.events.wait("checkpoint.published", "node-a", where=lambda e: e.seq == 2)
    first.stop()
    store = open_store(nodes.url)
    try:
        cluster = store.read_cluster()
    finally:
        store.close()
    assert cluster is not None
    changed = dataclasses.replace(cluster, n=cluster.n * 2, p=2)
    backend_store.put_cluster(changed.to_json())

    again = AsyncAgent(AGENT, park_from=4)
    nodes.start("node-a", again, state_dir=state_dir)
    warning = nodes.events.wait(
        "store.warning", "node-a", where=lambda e: "differs" in e.detail["message"]
    )
    assert f"n={changed.n} r={changed.r} p=2" in warning.detail["message"]
    nodes.events.wait("checkpoint.published", "node-a", where=lambda e: e.seq == 3)

    forgetful = Runtime(
        node_id="node-b", region="r1", store=nodes.url, agent=AsyncAgent(AGENT), secret=SECRET
    )
    forgetful.start()
    assert forgetful.stopped.wait(30), "the node without memory did not refuse"
    with pytest.raises(SealError):
        forgetful.stop()
