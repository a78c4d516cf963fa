"""Effects on a synced folder: a replay reads the journal of the terms that built on the
checkpoint it restored (docs/syncdir.md, "Inbox, effects and replies"; DESIGN.md invariant 8).

Each node journals into its own subtree. A node that takes over from another node's
checkpoint at seq s replays step s + 1 with the outcomes the previous leaders recorded
for it in their own subtrees, brought by the sync tool (``tests.support.syncdir``
plays it), and never calls the tool again. Every node is a real ``Runtime`` on a
folder of its own; a ``Tool`` counts the real calls per idempotency key.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hamsterbunker import current_effect, current_step
from hamsterbunker.core.timing import LeaseTiming
from hamsterbunker.node.lineage_view import LineageRead
from hamsterbunker.records.lineage import CheckpointRef, Lineage, TermId, TermStart
from hamsterbunker.runtime import Runtime
from hamsterbunker.stores.layer.keys import AgentKeys
from tests.support import wait_until
from tests.support.agents import AGENT, SECRET, Recorder
from tests.support.raw_store import file_key
from tests.support.records import fence_of, lease
from tests.support.syncdir import Sync

TIMING = LeaseTiming(tick_ms=100, lease_ttl_ms=600)
SYNC_DELAY_MS = 100  # TTL 600 ms >= 2 x (tick 100 ms + 100 ms)
WAIT_S = 30.0


class Tool:
    """The outside world: counts calls per idempotency key, and says which node called."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()
        self.keys: dict[int, str] = {}  # step seq -> the key of its effect
        self._lock = threading.Lock()

    async def call(self, what: str) -> str:
        effect, step = current_effect(), current_step()
        assert effect is not None and step is not None
        with self._lock:
            self.calls[effect.key] += 1
            self.keys[step.seq] = effect.key
        return f"{what}@{step.seq} by {step.node}"


class Journaling:
    """Each step calls one journaled effect; a (node, seq) in park parks that step "before"
    or "after" its effect, until the node is stopped (as a crash leaves it)."""

    id = AGENT

    def __init__(self, tool: Tool, park: dict[tuple[str, int], str]) -> None:
        self.tool, self.park = tool, park
        self.parked: dict[str, threading.Event] = {node: threading.Event() for node, _ in park}
        self.results: dict[tuple[str, int], str] = {}  # (node, seq) -> what the effect gave

    def init(self) -> dict[str, Any]:
        return {"seen": []}

    async def step(self, state: dict[str, Any]) -> dict[str, Any]:
        context = current_step()
        assert context is not None
        where = self.park.get((context.node, context.seq))
        if where == "before":
            await self._park(context.node)
        result = await context.effect("search", self.tool.call, "search")
        self.results[(context.node, context.seq)] = result
        if where == "after":
            await self._park(context.node)
        state["seen"].append(result)
        return state

    async def _park(self, node: str) -> None:
        self.parked[node].set()
        await asyncio.sleep(3600)  # cancelled when the node stops (no grace)


class Nodes:
    """Runtimes on a Sync's folders, one per node; all stopped at the end."""

    def __init__(self, tmp_path: Path) -> None:
        self.sync = Sync(tmp_path, delay_ms=SYNC_DELAY_MS)
        self.events = Recorder()
        self.runtimes: dict[str, Runtime] = {}

    def start(self, node: str, agent: Journaling) -> Runtime:
        runtime = Runtime(
            node_id=node,
            region="r1",
            store=self.sync.open(node),
            agent=agent,  # type: ignore[arg-type]  # a duck-typed agent
            secret=SECRET,
            timing=TIMING,
            on_event=self.events,
            stop_grace_ms=0,
        )
        self.runtimes[node] = runtime
        runtime.start()
        wait_until(runtime.ready.is_set, f"{node} online", WAIT_S)
        return runtime

    def crash(self, node: str, agent: Journaling) -> None:
        """Once node's step is parked, stop node with no grace: the step never publishes."""
        wait_until(agent.parked[node].is_set, f"{node}'s step to park", WAIT_S)
        self.runtimes[node].stop(timeout=20)

    def close(self) -> None:
        for runtime in self.runtimes.values():
            with contextlib.suppress(BaseException):
                runtime.stop(timeout=20)


@pytest.fixture
def nodes(tmp_path: Path) -> Iterator[Nodes]:
    made = Nodes(tmp_path)
    try:
        yield made
    finally:
        made.close()


def _published(nodes: Nodes, node: str, seq: int) -> None:
    nodes.events.wait("checkpoint.published", node, where=lambda e: e.seq >= seq, timeout=WAIT_S)


def test_a_new_leader_replays_the_effect_the_previous_leader_journaled_in_its_own_chain(
    nodes: Nodes,
) -> None:
    """A publishes step 1, journals step 2's effect into its own subtree and dies before
    publishing step 2. B takes over on its own folder, restores seq 1 from A's chain, and
    replays step 2 with A's recorded outcome: the tool is called once for step 2."""
    tool = Tool()
    agent = Journaling(tool, {("A", 2): "after"})
    nodes.start("A", agent)
    nodes.crash("A", agent)
    assert agent.results[("A", 2)] == "search@2 by A"
    nodes.sync.copy("A", "B")  # A's subtree, its step-2 journal in it, reaches B's machine
    nodes.start("B", agent)
    resumed = nodes.events.wait("agent.resumed", "B", timeout=WAIT_S)
    assert resumed.detail["from_seq"] == 1
    _published(nodes, "B", 3)
    assert agent.results[("B", 2)] == "search@2 by A"  # A's recorded outcome, replayed
    assert tool.calls[tool.keys[2]] == 1  # never called again
    replayed = nodes.events.wait("effect.replayed", "B", timeout=WAIT_S)
    assert (replayed.detail["step_seq"], replayed.detail["reused"]) == (2, 1)
    assert ("B", 3) in agent.results and tool.calls[tool.keys[3]] == 1
    assert not nodes.events.of("effect.rejected")


def test_the_journal_of_a_term_that_built_on_the_same_checkpoint_is_replayed(
    nodes: Nodes,
) -> None:
    """A publishes step 1 and dies in step 2 before its effect. B restores A's seq 1,
    journals step 2's effect into B's subtree, and dies before publishing. C restores A's
    seq 1 too (B published nothing): B's term began from it, so C replays B's outcome."""
    tool = Tool()
    agent = Journaling(tool, {("A", 2): "before", ("B", 2): "after"})
    nodes.start("A", agent)
    nodes.crash("A", agent)
    nodes.sync.copy("A", "B")
    nodes.start("B", agent)
    nodes.crash("B", agent)
    assert agent.results[("B", 2)] == "search@2 by B"
    for node in ("A", "B"):
        nodes.sync.copy(node, "C")
    nodes.start("C", agent)
    resumed = nodes.events.wait("agent.resumed", "C", timeout=WAIT_S)
    assert resumed.detail["from_seq"] == 1
    _published(nodes, "C", 2)
    assert agent.results[("C", 2)] == "search@2 by B"
    assert tool.calls[tool.keys[2]] == 1


def test_only_terms_that_built_on_the_checkpoint_are_read() -> None:
    """built_on: the checkpoint's own term and the terms whose records name it as their
    base; a term that began elsewhere (a branch kept aside) ran that step on another state."""
    a1, b2, c3, d4 = TermId(1, "A"), TermId(2, "B"), TermId(3, "C"), TermId(4, "D")
    base = CheckpointRef(a1, 5)
    starts = (
        TermStart(a1, None),
        TermStart(b2, base),
        TermStart(c3, CheckpointRef(a1, 4)),  # built step 5 on seq 4: not step 6 on seq 5
        TermStart(d4, base),
    )
    read = LineageRead(Lineage(d4), {}, starts=starts)
    assert read.built_on(base) == (a1, b2, d4)
    assert read.built_on(None) == (a1,)
    assert read.built_on(CheckpointRef(b2, 7)) == (b2,)


def test_a_store_reads_another_nodes_effect_journal_and_skips_junk(tmp_path: Path) -> None:
    """read_chain_effects reads a step's journal from any node's subtree (the own one too);
    a node with no subtree has none; a record that is not a regular file is left out."""
    sync = Sync(tmp_path, delay_ms=SYNC_DELAY_MS)
    a = sync.open("A")
    held = a.cas_lease(AGENT, None, lease("A", 1))
    a.put_effect(AGENT, fence_of(held), 2, 0, "intent", b"intent")
    a.put_effect(AGENT, fence_of(held), 2, 0, "outcome", b"outcome")
    sync.copy("A", "B")
    b = sync.open("B")
    assert b.chains is b  # its chain operations are its own
    assert b.read_effects(AGENT, 2) == {}  # its own subtree holds none
    assert b.read_chain_effects(AGENT, "A", 2) == {
        (0, "intent"): b"intent",
        (0, "outcome"): b"outcome",
    }
    assert a.read_chain_effects(AGENT, "A", 2) == a.read_effects(AGENT, 2)
    assert b.read_chain_effects(AGENT, "A", 3) == {}
    assert b.read_chain_effects(AGENT, "Z", 2) == {}
    outcome = file_key(sync.root("B") / "nodes" / "A", AgentKeys(AGENT).effect(2, 0, "outcome"))
    os.unlink(outcome)
    os.mkdir(outcome)  # junk where a record belongs
    assert b.read_chain_effects(AGENT, "A", 2) == {(0, "intent"): b"intent"}
