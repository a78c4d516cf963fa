"""Fuzzing the store under running nodes: arbitrary bytes and JSON in every record kind.

On each backend two nodes run (a leader and a standby, each with its own
store client, recording a history) while hypothesis writes what a store writer
without the secret could: arbitrary bytes, arbitrary JSON and record-shaped
JSON with arbitrary values, as a checkpoint (any seq and epoch, the ones in
use included), the lease record, heartbeats, event lines, the cluster record
and a loss acceptance. After every write:

* no node crashes or hangs: each keeps writing heartbeats, or has ended by
  refusing to resume (NoUsableCheckpoint), never by any other error;
* at the end, the history checker finds nothing wrong: one writer per epoch,
  store order, and nothing resumed behind an accepted checkpoint.

Bounded: a fixed number of examples per backend, each waiting at most a few
seconds.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hamsterbunker.core.history import read_history
from hamsterbunker.core.limits import MAX_EPOCH, MAX_SEQ
from hamsterbunker.core.timing import LeaseTiming
from hamsterbunker.ops.checker import check
from hamsterbunker.runtime import Runtime
from hamsterbunker.stores import open_store
from tests.support import fuzz_examples, wait_until
from tests.support.agents import SECRET, AsyncAgent
from tests.support.hostile_values import json_values
from tests.support.raw_store import RawStore, backend_store
from tests.support.restarting import RestartingNodes

__all__ = ["backend_store"]  # the fixture, used by name

pytestmark = pytest.mark.fuzz

AGENT = "a"
NODES = ("node-a", "node-b")
EXAMPLES = fuzz_examples(full=40, fast=16)


class BeatCounter:
    """A store client that counts this node's heartbeat writes: proof that its loop goes on."""

    def __init__(self, url: str) -> None:
        self._inner = open_store(url)
        self.beats = 0
        self._lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def put_heartbeat(self, agent: str, heartbeat: Any) -> None:
        self._inner.put_heartbeat(agent, heartbeat)
        with self._lock:
            self.beats += 1


class Running(RestartingNodes):
    def __init__(self, raw: RawStore, tmp_path: Path) -> None:
        super().__init__()
        self.raw = raw
        self.tmp_path = tmp_path
        self.history = tmp_path / "history.jsonl"
        self.agents: list[AsyncAgent] = []

    def start(self, node_id: str) -> None:
        counter = BeatCounter(self.raw.url)
        agent = AsyncAgent(AGENT, slow=dict.fromkeys(range(1, 100_000), 0.02))
        node = Runtime(
            node_id=node_id,
            region="r1",
            store=counter,  # type: ignore[arg-type]
            agent=agent,  # type: ignore[arg-type]
            secret=SECRET,
            timing=LeaseTiming(tick_ms=100, lease_ttl_ms=600),
            history=self.history,
            state_dir=self.tmp_path / f"state-{node_id}",
        )
        self.nodes[node_id] = (node, counter)
        self.agents.append(agent)
        node.start()
        wait_until(lambda: node.ready.is_set() or node.stopped.is_set(), f"{node_id} to start")

    def stop(self) -> None:
        for agent in self.agents:
            agent.release.set()
        for node, counter in self.nodes.values():
            with contextlib.suppress(BaseException):
                node.stop(timeout=20)
            counter.close()
        self.nodes.clear()


@pytest.fixture
def running(backend_store: RawStore, tmp_path: Path) -> Iterator[Running]:
    made = Running(backend_store, tmp_path)
    for node_id in NODES:
        made.start(node_id)
    try:
        yield made
    finally:
        made.stop()


FIELDS = {
    "lease": ["holder", "region", "session", "epoch", "ttl_ms", "renewals", "version", "seq",
              "seq_epoch"],
    "heartbeat": ["node", "region", "host", "pid", "role", "epoch", "seq", "leader", "time",
                  "beats"],
    "event": ["node", "n", "type", "time", "epoch", "seq", "detail"],
    "cluster": ["format", "kdf", "n", "r", "p", "salt", "key_id", "key_check", "created"],
    "acceptance": ["agent", "id", "epoch", "resume_seq", "resume_epoch", "to_seq", "given_up",
                   "time"],
}  # fmt: skip


@st.composite
def payloads(draw: st.DrawFn, kind: str) -> bytes:
    """Arbitrary bytes, arbitrary JSON, or JSON shaped like the record with arbitrary values."""
    form = draw(st.sampled_from(["bytes", "json", "shaped", "deep"]))
    if form == "bytes":
        return draw(st.binary(max_size=300))
    if form == "deep":
        return draw(st.sampled_from([b"[", b'{"a":'])) * draw(st.integers(1, 70_000))
    if form == "json":
        value = draw(json_values())
    else:
        names = FIELDS.get(kind, FIELDS["lease"])
        value = draw(st.dictionaries(st.sampled_from(names), json_values(), max_size=len(names)))
    # allow_nan: Python writes NaN and Infinity, which a hostile writer can too
    return json.dumps(value, allow_nan=True).encode()


@st.composite
def hostile_writes(draw: st.DrawFn) -> tuple[str, dict[str, Any], bytes]:
    kind = draw(
        st.sampled_from(["checkpoint", "lease", "heartbeat", "event", "cluster", "acceptance"])
    )
    where: dict[str, Any] = {}
    if kind == "checkpoint":
        where["seq"] = draw(st.integers(1, 40) | st.integers(1, MAX_SEQ))
        where["epoch"] = draw(st.integers(1, 4) | st.integers(1, MAX_EPOCH))
    if kind in ("heartbeat", "event"):
        where["node"] = draw(st.sampled_from([*NODES, "mallory"]))
    return kind, where, draw(payloads(kind))


def write(raw: RawStore, kind: str, where: dict[str, Any], data: bytes) -> None:
    match kind:
        case "checkpoint":
            raw.put_checkpoint(AGENT, where["seq"], where["epoch"], data)
        case "lease":
            raw.put_lease(AGENT, data)
        case "heartbeat":
            raw.put_heartbeat(AGENT, where["node"], data)
        case "event":
            raw.add_event(AGENT, where["node"], data.replace(b"\n", b" "))
        case "cluster":
            raw.put_cluster(data)
        case "acceptance":
            raw.put_acceptance(AGENT, data)


def test_hostile_writes_never_crash_hang_or_roll_back_a_node(running: Running) -> None:
    """Under every kind of hostile write, on every backend, nodes keep their loop going (or
    refuse to resume), and the recorded history stays clean."""
    written: Counter[str] = Counter()

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        derandomize=True,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    @given(hostile=hostile_writes())
    def one_write(hostile: tuple[str, dict[str, Any], bytes]) -> None:
        kind, where, data = hostile
        write(running.raw, kind, where, data)
        written[kind] += 1
        # After every third write a node restarts, so that the nodes read what only a
        # starting node or a new leader reads: the cluster record and the event logs at
        # start, the checkpoints and the acceptance at restore (the other one takes over).
        if sum(written.values()) % 3 == 0:
            running.restart(NODES[running.restarts % len(NODES)])
        running.assert_alive()

    one_write()
    assert len(written) >= 4 and running.restarts >= 5, (written, running.restarts)
    running.stop()
    assert check(read_history(running.history)) == []
