"""Nodes on a synced folder restore from the winning lineage and report divergence
(docs/syncdir.md, part 2: the node side).

Every node is a real ``Runtime`` with a ``SyncDirStore`` on a folder of its own
(a machine's copy); ``tests.support.syncdir`` plays the sync tool, a copy at a
time or (``SyncPump``) continuously. Timing is short (tick 100 ms, TTL 1.2 s, a
stated sync delay of 400 ms: a copy pass of the pump stays within it on a loaded
machine, where 100 ms did not) and every wait is bounded: tests wait on
conditions, never on fixed sleeps.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hamsterbunker.agent.step import current_step
from hamsterbunker.core.timing import LeaseTiming
from hamsterbunker.node.lineage_view import LineageView
from hamsterbunker.records import Event
from hamsterbunker.records.lineage import ChainChoice, CheckpointRef, TermId, TermStart
from hamsterbunker.runtime import Runtime
from hamsterbunker.sealing import Sealer, new_cluster_record
from hamsterbunker.sealing.term_records import open_term_start, seal_chain_choice, seal_term_start
from hamsterbunker.stores.layer.keys import AgentKeys
from hamsterbunker.stores.syncdir import SyncDirStore
from tests.support import wait_until
from tests.support.agents import AGENT, SECRET, AsyncAgent, Recorder
from tests.support.cli import hb_env, run_hb
from tests.support.raw_store import file_key
from tests.support.syncdir import Sync, SyncPump

TIMING = LeaseTiming(tick_ms=100, lease_ttl_ms=1200)
SYNC_DELAY_MS = 400  # TTL 1.2 s >= 2 x (tick 100 ms + 400 ms)
WAIT_S = 60.0  # generous: a loaded machine (load average 25) took over 30 s to hand over a term


class PacedAgent(AsyncAgent):
    """A CountingAgent whose every step takes pace_s (20 ms): chains grow at a pace a test
    can follow."""

    def __init__(self, pace_s: float = 0.02, park_from: int | None = None) -> None:
        super().__init__(park_from=park_from)
        self.pace_s = pace_s

    async def step(self, state: dict[str, Any]) -> dict[str, Any]:
        await asyncio.sleep(self.pace_s)
        context = current_step()
        assert context is not None
        state = await super().step(state)
        state.setdefault("epochs", []).append(context.epoch)  # whose line each step is on
        return state


class Nodes:
    """Runtimes on a Sync's folders, one folder per node; all stopped at the end."""

    def __init__(self, tmp_path: Path) -> None:
        self.sync = Sync(tmp_path, delay_ms=SYNC_DELAY_MS)
        self.events = Recorder()
        self.agents: dict[str, PacedAgent] = {}
        self.runtimes: dict[str, Runtime] = {}

    def start(self, node: str, pace_s: float = 0.02, park_from: int | None = None) -> Runtime:
        agent = self.agents[node] = PacedAgent(pace_s, park_from)
        runtime = Runtime(
            node_id=node,
            region="r1",
            store=self.sync.open(node),
            agent=agent,  # type: ignore[arg-type]  # a subclass defines step()
            secret=SECRET,
            timing=TIMING,
            on_event=self.events,
            stop_grace_ms=0,
        )
        self.runtimes[node] = runtime
        runtime.start()
        wait_until(runtime.ready.is_set, f"{node} online", WAIT_S)
        return runtime

    def store(self, node: str) -> SyncDirStore:
        """A reader of node's folder (as node's machine holds it)."""
        return SyncDirStore(
            self.sync.root(node), "reader", sync_delay_ms=SYNC_DELAY_MS, create=False
        )

    def sealer(self) -> Sealer:
        cluster = self.store(next(iter(self.runtimes))).read_cluster()
        assert cluster is not None
        return Sealer(SECRET, cluster)

    def term_start(self, folder: str, epoch: int, node: str) -> TermStart:
        data = self.store(folder).read_term_starts(AGENT)[(epoch, node)]
        return open_term_start(self.sealer(), data, AGENT, TermId(epoch, node))

    def chain_files(self, folder: str, node: str) -> set[str]:
        """The names of node's checkpoints in folder (``<seq>-<epoch>-<size>-<ms>``: their
        keys in its subtree's file store, ``stores.layer.keys``)."""
        keys, chain = AgentKeys(AGENT), checkpoint_file(self.sync.root(folder) / "nodes", node, "")
        names = [path.name for path in chain.iterdir()] if chain.is_dir() else []
        return {name for name in names if keys.checkpoint_info(keys.ckpt + name) is not None}

    def published(self, node: str, past: int) -> bool:
        runtime = self.runtimes[node]
        return runtime.leading and runtime.seq > past

    def close(self) -> None:
        for agent in self.agents.values():
            agent.release.set()
        for runtime in self.runtimes.values():
            with contextlib.suppress(BaseException):
                runtime.stop(timeout=20)


def checkpoint_file(nodes: Path, node: str, name: str) -> Path:
    """The file of node's checkpoint name under nodes/ (its folder of checkpoints for "")."""
    return file_key(nodes / node, AgentKeys(AGENT).ckpt + name)


@pytest.fixture
def nodes(tmp_path: Path) -> Iterator[Nodes]:
    made = Nodes(tmp_path)
    try:
        yield made
    finally:
        made.close()


def _diverged(events: Recorder, node: str | None = None) -> list[Event]:
    return events.of("store.diverged", node)


def test_a_clean_failover_resumes_from_the_newest_checkpoint_and_records_its_base(
    nodes: Nodes,
) -> None:
    """With the sync working, B takes over from A's newest checkpoint, writes its term
    record naming it as its base, and nothing is reported as diverged."""
    a = nodes.start("A")
    epoch_a = nodes.events.wait("lease.acquired", "A", timeout=WAIT_S).epoch
    wait_until(lambda: nodes.published("A", 3), "A publishing", WAIT_S)
    nodes.sync.copy("A", "B")  # the cluster record first: B joins the folder
    with SyncPump(nodes.sync, "A", "B"):
        b = nodes.start("B")
        nodes.events.wait("node.standby", "B", timeout=WAIT_S)
        a.stop(timeout=20)
        last = a.seq
        resumed = nodes.events.wait("agent.resumed", "B", timeout=WAIT_S)
        assert resumed.detail["from_seq"] == last
        wait_until(lambda: nodes.published("B", last + 3), "B publishing", WAIT_S)
        entered = nodes.agents["B"].entered_ctx()
        assert entered[0].seq == last + 1
        epoch_b = entered[0].epoch
        start = nodes.term_start("B", epoch_b, "B")
        assert start.base == CheckpointRef(TermId(resumed.detail["from_epoch"], "A"), last)
        assert nodes.term_start("B", epoch_a, "A").base is None  # A began from init()
        # Both folders agree, and see one lineage with nothing aside.
        wait_until(
            lambda: (epoch_b, "B") in nodes.store("A").read_term_starts(AGENT),
            "B's term record synced to A's folder",
            WAIT_S,
        )
    assert nodes.events.of("term_record.rejected") == []
    assert _diverged(nodes.events) == []
    assert b.leading


def _two_leaders(nodes: Nodes) -> tuple[Runtime, Runtime, int, int, int]:
    """A leads, the sync is cut, B takes over from A's checkpoint at the fork and both
    lead on: (A, B, A's epoch, B's epoch, the fork's seq)."""
    a = nodes.start("A")
    epoch_a = nodes.events.wait("lease.acquired", "A", timeout=WAIT_S).epoch
    wait_until(lambda: nodes.published("A", 3), "A publishing", WAIT_S)
    nodes.sync.copy("A", "B")  # the last sync before the cut
    fork = max(int(name[:20]) for name in nodes.chain_files("B", "A"))
    b = nodes.start("B")  # sees A's claim never change: takes the lease after a TTL
    epoch_b = nodes.events.wait("lease.acquired", "B", timeout=WAIT_S).epoch
    resumed = nodes.events.wait("agent.resumed", "B", timeout=WAIT_S)
    assert resumed.detail["from_seq"] == fork
    assert epoch_b == epoch_a + 1
    wait_until(lambda: nodes.published("B", fork + 3), "B publishing", WAIT_S)
    wait_until(lambda: nodes.published("A", fork + 8), "A publishing on", WAIT_S)
    assert a.leading and b.leading  # both lead: what a synced folder cannot prevent
    return a, b, epoch_a, epoch_b, fork


def test_a_partition_keeps_the_losers_steps_aside_and_reports_them(nodes: Nodes) -> None:
    """Two leaders at once (the sync cut): once it heals, A steps down, B goes on from its
    own chain, every node that sees both chains says store.diverged, and nothing of A's
    chain is deleted."""
    a, b, epoch_a, epoch_b, fork = _two_leaders(nodes)
    with SyncPump(nodes.sync, "A", "B"):
        nodes.events.wait("lease.lost", "A", timeout=WAIT_S)
        aside_b = nodes.events.wait("store.diverged", "B", timeout=WAIT_S)
        aside_a = nodes.events.wait("store.diverged", "A", timeout=WAIT_S)
        for seen in (aside_a, aside_b):
            assert seen.detail["winner"] == f"{epoch_b}@B"
            assert seen.detail["term"] == f"{epoch_a}@A"
            assert seen.detail["forked_at"] == f"seq {fork} of term {epoch_a}@A"
            assert seen.detail["from_seq"] > fork
            assert seen.detail["to_seq"] >= seen.detail["from_seq"]
            assert seen.detail["count"] >= 1
        kept = nodes.chain_files("A", "A")
        assert kept and all(int(name[:20]) > fork for name in kept)
        # B goes on, from its own chain; A stands by and publishes nothing more.
        past = b.seq
        wait_until(lambda: nodes.published("B", past + 5), "B publishing after the heal", WAIT_S)
        wait_until(lambda: nodes.chain_files("B", "A") == kept, "A's chain synced", WAIT_S)
        assert not a.leading
    assert b.leading
    assert nodes.chain_files("A", "A") == kept  # nothing kept aside is deleted
    for context, state in nodes.agents["B"].entered:
        # Each step of B builds on A's steps up to the fork, then B's own: never on A's after.
        assert state["effects"] == list(range(1, context.seq))
    # Reported once per segment per node.
    assert len(_diverged(nodes.events, "A")) == len(_diverged(nodes.events, "B")) == 1


def test_an_operator_chooses_the_chain_kept_aside_and_the_leader_goes_on_from_it(
    nodes: Nodes,
) -> None:
    """After a partition, B's chain wins and A's is kept aside. The operator chooses A's
    chain (hb choose-chain on B's machine): B, leading the winning term, ends it at its
    next divergence check, a new term goes on from A's newest checkpoint, and B's steps
    past the fork are kept aside in their turn and reported; nothing is deleted."""
    _a, _b, epoch_a, epoch_b, fork = _two_leaders(nodes)
    with SyncPump(nodes.sync, "A", "B"):
        nodes.events.wait("lease.lost", "A", timeout=WAIT_S)
        nodes.events.wait("store.diverged", "B", timeout=WAIT_S)
        top_a = max(int(name[:20]) for name in nodes.chain_files("A", "A"))
        wait_until(lambda: nodes.chain_files("B", "A") == nodes.chain_files("A", "A"),
                   "A's chain synced", WAIT_S)  # fmt: skip
        chosen = run_hb(
            ["choose-chain", *_chain_args(nodes, "B"), "--term", f"{epoch_a}@A", "--yes"],
            env=hb_env(HB_SECRET=SECRET),
        )
        assert chosen.returncode == 0, chosen.stdout + chosen.stderr
        given_up = nodes.events.wait(
            "lease.given_up", "B", where=lambda e: e.epoch == epoch_b, timeout=WAIT_S
        )
        assert "chain chosen" in given_up.detail["reason"]
        taken = nodes.events.wait("chain.chosen", timeout=WAIT_S)
        assert taken.detail["after"] == f"{epoch_b}@B"
        assert taken.detail["base"] == f"seq {top_a} of term {epoch_a}@A"
        resumed = nodes.events.wait(
            "agent.resumed", taken.node, where=lambda e: e.epoch > epoch_b, timeout=WAIT_S
        )
        assert (resumed.detail["from_seq"], resumed.detail["from_epoch"]) == (top_a, epoch_a)
        leader = nodes.runtimes[taken.node]
        # By its steps, not its seq: B's seq, past A's newest, is the new term's until it restores.
        agent = nodes.agents[taken.node]
        wait_until(lambda: sum(c.epoch > epoch_b for c, _st in agent.entered) >= 2, "going on",
                   WAIT_S)  # fmt: skip
        aside = nodes.events.wait(
            "store.diverged", where=lambda e: e.detail["term"] == f"{epoch_b}@B", timeout=WAIT_S
        )
        assert aside.detail["forked_at"] == f"seq {fork} of term {epoch_a}@A"
        assert leader.leading
    new_term = [(c, st) for c, st in nodes.agents[taken.node].entered if c.epoch > epoch_b]
    assert new_term[0][0].seq == top_a + 1
    assert new_term[0][1]["effects"] == list(range(1, top_a + 1))
    assert set(new_term[0][1]["epochs"]) == {epoch_a}  # A's line, no step of B's
    assert nodes.chain_files("B", "B")  # B's own chain is kept, aside


def test_a_chain_chosen_while_no_node_runs_is_where_the_next_node_to_start_goes_on(
    nodes: Nodes,
) -> None:
    """Both nodes stopped after a partition healed (B's chain won); the operator chooses A's
    chain on B's machine; the sync brings the choice to A, the first to start again: A
    goes on from its own newest checkpoint, not B's, whose steps are then kept aside."""
    a, b, epoch_a, epoch_b, _fork = _two_leaders(nodes)
    with SyncPump(nodes.sync, "A", "B"):
        nodes.events.wait("lease.lost", "A", timeout=WAIT_S)
        a.stop(timeout=20)
        wait_until(lambda: nodes.chain_files("B", "A") == nodes.chain_files("A", "A"),
                   "A's chain synced", WAIT_S)  # fmt: skip
        b.stop(timeout=20)
    top_a = max(int(name[:20]) for name in nodes.chain_files("A", "A"))
    chosen = run_hb(
        ["choose-chain", *_chain_args(nodes, "B"), "--term", f"{epoch_a}@A", "--yes"],
        env=hb_env(HB_SECRET=SECRET),
    )
    assert chosen.returncode == 0, chosen.stdout + chosen.stderr
    nodes.sync.copy("B", "A")
    nodes.start("A")
    resumed = nodes.events.wait(
        "agent.resumed", "A", where=lambda e: e.epoch > epoch_b, timeout=WAIT_S
    )
    assert (resumed.detail["from_seq"], resumed.detail["from_epoch"]) == (top_a, epoch_a)
    taken = nodes.events.wait("chain.chosen", "A", timeout=WAIT_S)
    assert taken.detail["base"] == f"seq {top_a} of term {epoch_a}@A"
    aside = nodes.events.wait(
        "store.diverged", "A", where=lambda e: e.detail["term"] == f"{epoch_b}@B", timeout=WAIT_S
    )
    assert aside.detail["winner"] == f"{resumed.epoch}@A"


def test_a_forged_term_record_is_rejected_and_cannot_pick_the_restore_base(
    nodes: Nodes,
) -> None:
    """A term record written without the secret (a real one with its bytes changed, made
    to name a newer term whose base would roll the agent back) is reported
    (term_record.rejected) and ignored: B resumes from A's newest checkpoint."""
    a = nodes.start("A")
    epoch_a = nodes.events.wait("lease.acquired", "A", timeout=WAIT_S).epoch
    wait_until(lambda: nodes.published("A", 5), "A publishing", WAIT_S)
    real = nodes.store("A").read_term_starts(AGENT)[(epoch_a, "A")]
    payload, _, tag = real.rpartition(b"\n")
    doc = json.loads(payload)
    doc.update(epoch=99, node="Z", base=[epoch_a, "A", 1])
    forged = json.dumps(doc, separators=(",", ":")).encode() + b"\n" + tag
    a.stop(timeout=20)
    last = a.seq
    nodes.sync.copy("A", "B")
    # As the sync would bring it from a machine of a writer without the secret.
    terms = nodes.sync.root("B") / "nodes" / "Z" / "published" / AGENT / "terms"
    terms.mkdir(parents=True)
    (terms / "0000000099.rec").write_bytes(forged)
    nodes.start("B")
    rejected = nodes.events.wait("term_record.rejected", "B", timeout=WAIT_S)
    assert rejected.detail["term"] == "99@Z"
    resumed = nodes.events.wait("agent.resumed", "B", timeout=WAIT_S)
    assert resumed.detail["from_seq"] == last
    assert _diverged(nodes.events) == []


def test_a_loser_that_leads_again_resumes_from_the_lineage_behind_its_own_steps(
    nodes: Nodes,
) -> None:
    """A, whose steps were kept aside, takes over from B later: it resumes from B's newest
    checkpoint, behind what A itself published, without refusing (those steps are still
    stored, kept aside, not lost), and its term record names B's checkpoint as its base."""
    a = nodes.start("A")
    epoch_a = nodes.events.wait("lease.acquired", "A", timeout=WAIT_S).epoch
    wait_until(lambda: nodes.published("A", 3), "A publishing", WAIT_S)
    nodes.sync.copy("A", "B")
    fork = max(int(name[:20]) for name in nodes.chain_files("B", "A"))
    b = nodes.start("B", pace_s=0.2)  # slower: A stays far ahead of B
    epoch_b = nodes.events.wait("lease.acquired", "B", timeout=WAIT_S).epoch
    wait_until(lambda: nodes.published("B", fork + 1), "B publishing", WAIT_S)
    with SyncPump(nodes.sync, "A", "B"):
        nodes.events.wait("lease.lost", "A", timeout=WAIT_S)
        top_a = a.seq
        b.stop(timeout=20)
        last_b = b.seq
        assert last_b < top_a
        resumed = nodes.events.wait(
            "agent.resumed", "A", where=lambda e: e.epoch > epoch_b, timeout=WAIT_S
        )
        assert resumed.detail["from_seq"] == last_b
        assert resumed.detail["from_epoch"] == epoch_b
        epoch_again = resumed.epoch
        wait_until(lambda: nodes.published("A", last_b + 2), "A publishing again", WAIT_S)
    start = nodes.term_start("A", epoch_again, "A")
    assert start.base == CheckpointRef(TermId(epoch_b, "B"), last_b)
    assert nodes.events.of("store.regressed") == []
    entered = [(c, st) for c, st in nodes.agents["A"].entered if c.epoch == epoch_again]
    assert entered[0][0].seq == last_b + 1
    assert entered[0][1]["effects"] == list(range(1, last_b + 1))
    assert epoch_again > epoch_b > epoch_a


def test_a_checkpoint_announced_by_a_claim_that_synced_first_is_waited_for(
    nodes: Nodes,
) -> None:
    """The sync brings A's release (naming its last checkpoint) before that checkpoint:
    B, taking over, reads again within the sync delay rather than refusing to resume
    behind, and resumes from it once it arrives."""
    a = nodes.start("A")
    wait_until(lambda: nodes.published("A", 3), "A publishing", WAIT_S)
    nodes.sync.copy("A", "B")
    nodes.sync.delay_ms = 5000  # B's store: the sync may take up to 5 s
    with SyncPump(nodes.sync, "A", "B"):
        nodes.start("B")
        nodes.events.wait("node.standby", "B", timeout=WAIT_S)
        nodes.sync.held_back.add("/ckpt/")  # claims go on syncing, checkpoints wait
        past = a.seq
        wait_until(lambda: nodes.published("A", past), "A publishing, held back", WAIT_S)
        a.stop(timeout=20)
        last = a.seq
        nodes.events.wait("lease.acquired", "B", timeout=WAIT_S)
        assert nodes.events.of("agent.resumed", "B") == []
        nodes.sync.held_back.clear()
        resumed = nodes.events.wait("agent.resumed", "B", timeout=WAIT_S)
    assert resumed.detail["from_seq"] == last
    assert nodes.events.of("store.regressed") == []


def test_a_lineage_whose_base_is_gone_is_not_led_from_behind_until_a_chain_is_chosen(
    nodes: Nodes,
) -> None:
    """B took over from A's checkpoint at the fork and stopped before publishing; A,
    partitioned, stepped on and pruned that checkpoint from its chain. A, taking the
    lease afterwards, finds the lineage's base gone and only its own kept-aside steps: it
    neither starts the agent over from init() nor leads from behind; it keeps trying (the
    sync may still bring the base), naming hb choose-chain. The operator chooses A's own
    chain (hb choose-chain, through the command line): A goes on from its newest
    checkpoint, and its term record names that checkpoint as its base."""
    a = nodes.start("A")
    epoch_a = nodes.events.wait("lease.acquired", "A", timeout=WAIT_S).epoch
    wait_until(lambda: nodes.published("A", 3), "A publishing", WAIT_S)
    nodes.sync.copy("A", "B")
    fork = max(int(name[:20]) for name in nodes.chain_files("B", "A"))
    b = nodes.start("B", park_from=1)  # its first step never ends: it publishes nothing
    epoch_b = nodes.events.wait("lease.acquired", "B", timeout=WAIT_S).epoch
    nodes.events.wait("agent.resumed", "B", timeout=WAIT_S)
    assert nodes.term_start("B", epoch_b, "B").base is not None
    wait_until(lambda: nodes.published("A", fork + 8), "A pruning the fork", WAIT_S)
    b.stop(timeout=20)  # released: nothing published in its term
    assert all(int(name[:20]) > fork for name in nodes.chain_files("A", "A"))
    with SyncPump(nodes.sync, "A", "B"):
        behind = nodes.events.wait(
            "lease.given_up", "A", where=lambda e: e.epoch > epoch_b, timeout=WAIT_S
        )
    assert "hb choose-chain" in behind.detail["reason"]
    assert not a.stopped.is_set()
    assert nodes.agents["A"].init_calls == 1
    assert [e for e in nodes.events.of("agent.resumed", "A") if e.epoch > epoch_b] == []
    top = max(int(name[:20]) for name in nodes.chain_files("A", "A"))
    listed = run_hb(["choose-chain", *_chain_args(nodes, "A")], env=hb_env(HB_SECRET=SECRET))
    assert listed.returncode == 0, listed.stderr
    assert f"winning term: {epoch_b}@B" in listed.stdout
    assert f"kept aside: term {epoch_a}@A" in listed.stdout
    chosen = run_hb(
        ["choose-chain", *_chain_args(nodes, "A"), "--term", f"{epoch_a}@A", "--yes", "--wait"],
        env=hb_env(HB_SECRET=SECRET),
        timeout=WAIT_S + 10,
    )
    assert chosen.returncode == 0, chosen.stdout + chosen.stderr
    resumed = nodes.events.wait(
        "agent.resumed", "A", where=lambda e: e.epoch > epoch_b, timeout=WAIT_S
    )
    assert (resumed.detail["from_seq"], resumed.detail["from_epoch"]) == (top, epoch_a)
    taken = nodes.events.wait("chain.chosen", "A", timeout=WAIT_S)
    assert taken.detail["after"] == f"{epoch_b}@B"
    assert nodes.term_start("A", resumed.epoch, "A").base == CheckpointRef(
        TermId(epoch_a, "A"), top
    )
    wait_until(lambda: nodes.published("A", top + 2), "A stepping on from its chain", WAIT_S)
    assert nodes.agents["A"].init_calls == 1
    assert nodes.events.of("store.regressed") == []


def _chain_args(nodes: Nodes, node: str) -> list[str]:
    """hb choose-chain's flags for node's machine (its folder, as that machine holds it)."""
    url = f"syncdir://{nodes.sync.root(node)}"
    return ["--store", url, "--node-id", node, "--agent-id", AGENT, "--timeout", str(WAIT_S)]


def test_a_checkpoint_copied_into_another_nodes_chain_does_not_authenticate_there(
    nodes: Nodes,
) -> None:
    """A and B lead one epoch at once (both took over from C's release, cut off from each
    other), and A gets further. An authentic checkpoint of A's chain, copied by anyone who
    can write the folder into B's chain under the same name, would carry B's winning term
    past B's own steps: it names node A in its sealed header, so in B's chain it does not
    authenticate (checkpoint.rejected), and B resumes from its own newest checkpoint."""
    c = nodes.start("C")
    wait_until(lambda: nodes.published("C", 2), "C publishing", WAIT_S)
    c.stop(timeout=20)
    base = c.seq
    nodes.sync.copy("C", "A")
    nodes.sync.copy("C", "B")
    a = nodes.start("A")
    b = nodes.start("B", pace_s=0.2)  # slower: A gets past B's seqs
    epoch = nodes.events.wait("lease.acquired", "A", timeout=WAIT_S).epoch
    assert nodes.events.wait("lease.acquired", "B", timeout=WAIT_S).epoch == epoch
    wait_until(lambda: nodes.published("B", base), "B publishing", WAIT_S)
    wait_until(lambda: a.seq > b.seq + 3, "A ahead of B", WAIT_S)
    b.stop(timeout=20)
    a.stop(timeout=20)
    last_a, last_b = a.seq, b.seq
    assert last_a > last_b > base
    nodes.sync.copy("A", "B")  # the partition heals: B's folder holds both chains
    name = next(n for n in nodes.chain_files("B", "A") if int(n[:20]) == last_a)
    chains = nodes.sync.root("B") / "nodes"
    source = checkpoint_file(chains, "A", name)
    copied = checkpoint_file(chains, "B", name)
    assert not copied.exists()
    shutil.copyfile(source, copied)  # a writer of the folder, not the sync tool
    # Authentic: it opens as what it is, a checkpoint of A's chain at (epoch, last_a).
    assert nodes.sealer().open(source.read_bytes(), AGENT, epoch, last_a, node="A")
    nodes.start("B")
    rejected = nodes.events.wait(
        "checkpoint.rejected",
        "B",
        where=lambda e: e.detail["checkpoint_seq"] == last_a,
        timeout=WAIT_S,
    )
    assert "sealed into node 'A'" in rejected.detail["error"]
    assert "node 'B'" in rejected.detail["error"]
    resumed = nodes.events.wait(
        "agent.resumed", "B", where=lambda e: e.epoch > epoch, timeout=WAIT_S
    )
    assert (resumed.detail["from_seq"], resumed.detail["from_epoch"]) == (last_b, epoch)
    wait_until(
        lambda: any(ctx.epoch > epoch for ctx, _st in nodes.agents["B"].entered),
        "B stepping",
        WAIT_S,
    )
    entered = [(ctx, st) for ctx, st in nodes.agents["B"].entered if ctx.epoch > epoch]
    assert entered[0][0].seq == last_b + 1
    assert entered[0][1]["effects"] == list(range(1, last_b + 1))  # B's own line, not A's
    assert nodes.events.of("store.regressed") == []


def test_standbys_that_take_a_released_lease_at_once_settle_it_before_either_steps(
    nodes: Nodes,
) -> None:
    """B and C see A's release in the same sync and both take the next epoch, each before
    the other's claim arrives. Neither steps until its claim has had the sync delay to
    reach the other: the loser finds the winning claim and ends its term, so no step is
    taken twice and nothing diverges."""
    a = nodes.start("A")
    wait_until(lambda: nodes.published("A", 3), "A publishing", WAIT_S)
    for node in ("B", "C"):
        nodes.sync.copy("A", node)
    with SyncPump(nodes.sync, "A", "B", "C"):
        for node in ("B", "C"):
            nodes.start(node)
            nodes.events.wait("node.standby", node, timeout=WAIT_S)
        a.stop(timeout=20)
        last = a.seq
        wait_until(
            lambda: [n for n in ("B", "C") if nodes.published(n, last + 5)], "a new leader", WAIT_S
        )
        takers = {e.node for e in nodes.events.of("lease.acquired") if e.node in ("B", "C")}
        print(f"took the released lease: {sorted(takers)}")
        stepped = {n for n in ("B", "C") if nodes.agents[n].entered}
        assert len(stepped) == 1, f"both stepped: {stepped} (took the lease: {takers})"
    assert _diverged(nodes.events) == []


def test_a_chain_choice_without_the_secret_is_rejected_and_never_applies(tmp_path: Path) -> None:
    """A choice a writer without the secret put in a node's subtree (or a real one moved
    to follow another term) is reported as rejected and picks nothing; a signed one made
    after the winning term is the read's choice, and a restore's read goes on from it."""
    sync = Sync(tmp_path, delay_ms=SYNC_DELAY_MS)
    store = sync.open("n1")
    cluster = store.create_cluster(new_cluster_record(SECRET))
    sealer = Sealer(SECRET, cluster)
    stranger = Sealer("not-the-secret", new_cluster_record("not-the-secret"))
    winner, aside = TermId(2, "n1"), CheckpointRef(TermId(1, "n1"), 4)
    store.put_term_start(AGENT, 1, seal_term_start(sealer, AGENT, TermStart(TermId(1, "n1"), None)))
    store.put_term_start(AGENT, 2, seal_term_start(sealer, AGENT, TermStart(winner, None)))
    view = LineageView(store, sealer, AGENT, "n1", emit=lambda *a, **k: None)
    forged = seal_chain_choice(stranger, AGENT, ChainChoice(winner, aside))
    store.put_chain_choice(AGENT, 2, forged)
    moved = seal_chain_choice(sealer, AGENT, ChainChoice(TermId(1, "n1"), aside))
    sync.open("n2").put_chain_choice(AGENT, 2, moved)  # says it follows term 1, kept as 2's
    sync.copy("n2", "n1")
    read = view.read(apply_choice=True)
    assert read.choice is None and read.lineage.chosen is None
    assert sorted(error.split(":")[0] for _t, error, _d in read.rejected) == ["chain choice"] * 2
    genuine = ChainChoice(winner, aside)
    sync.open("n3").put_chain_choice(AGENT, 2, seal_chain_choice(sealer, AGENT, genuine))
    sync.copy("n3", "n1")
    assert view.read().choice == genuine and view.read().lineage.chosen is None
    assert view.read(apply_choice=True).lineage.chosen == aside
