"""A LangGraph graph in real node processes, its leader SIGKILLed mid-graph.

Three nodes run ``GraphTasks`` (tests/support/hb_langgraph_agents.py): each step takes one
submission and runs the graph plan -> research -> write on it; every real node call logs
its start and its end to a file. Six tasks are submitted with ``Client``; the leader is
SIGKILLed twice, inside a research and inside a write, and restarted as a standby. Then a
seventh task asks (``interrupt()``): its question comes back as the reply, ``hb submit``
answers it, and the leader is SIGKILLed inside the write that follows the answer. From the
log:

- a graph node is run again only when it was the one in flight when its step was lost (a
  kill, or a lease lost on a loaded machine): every node that completed before ran once;
  one cut by its kill ran again;
- every reply is the task's whole output; the answer reached the graph once, through
  ``hb submit``, and its approve node ran once;
- the final checkpoint counts each submission's run once (the history checker, via conftest,
  holds the rest).
"""

from __future__ import annotations

import json
import subprocess
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from hamsterbunker import Client
from hamsterbunker.core.timing import LeaseTiming
from hamsterbunker.ops.local import LocalCluster, NodeSpec
from hamsterbunker.sealing import Sealer
from hamsterbunker.stores import Store, open_store
from tests.support import wait_until
from tests.support.cli import HB, hb_env
from tests.support.hb_langgraph_agents import expected_output

pytestmark = pytest.mark.multiprocess

SPECS = {
    spec.node: spec
    for spec in (
        NodeSpec("node-a", "eu-central"),
        NodeSpec("node-b", "us-east"),
        NodeSpec("node-c", "ap-south"),
    )
}
AGENT = "graph-tasks"
TASKS = 6
ASKING = TASKS  # the task that asks, after the others
# A patient lease (renew deadline 1.8 s): a leader that is not killed must not lose it, or
# its step would be replayed without a kill.
TIMING = LeaseTiming(100, 3000)
CALL_S = "0.3"  # each node call takes this long: a kill lands inside one
WAIT_S = 30.0
RESULT_S = 60.0
MakeCluster = Callable[..., LocalCluster]
Key = tuple[int, str]  # (task, graph node)
Line = dict[str, Any]


def journal(path: Path) -> list[Line]:
    """The calls' lines, in order (a line cut by a kill, which one write rules out, skipped)."""
    found = []
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                found.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return found


def in_call(
    path: Path, after: int, wanted: Callable[[Line], bool], not_on: str | None
) -> Line | None:
    """The last line, if it is the start of a wanted call after line number after, on
    another node than not_on (a call it makes has not ended)."""
    lines = journal(path)[after:]
    if not lines:
        return None
    last = lines[-1]
    if last["phase"] != "start" or last["node"] == not_on or not wanted(last):
        return None
    return last


def lost_in_flight(lines: list[Line], call: Key) -> bool:
    """Whether each start of call but its last was the last start its node made before
    another node started one, or before the call started again (a step its node gave up)."""
    starts = [ln for ln in lines if ln["phase"] == "start"]
    made = [i for i, ln in enumerate(starts) if (ln["task"], ln["name"]) == call]
    for i in made[:-1]:
        after = starts[i + 1]
        if after["node"] == starts[i]["node"] and (after["task"], after["name"]) != call:
            return False  # its node went on to the next call: this one had completed
    return True


class Killer:
    """Kills the leader inside a wanted call and restarts it as a standby; remembers each
    call in flight and whether it had ended."""

    def __init__(self, cluster: LocalCluster, store: Store, path: Path) -> None:
        self.cluster, self.store, self.path = cluster, store, path
        self.kills: list[tuple[Line, bool]] = []
        self.seen, self.killed = 0, None

    def kill_inside(self, what: str, wanted: Callable[[Line], bool]) -> None:
        line = wait_until(
            lambda: in_call(self.path, self.seen, wanted, self.killed),
            f"the leader inside {what}",
            timeout=WAIT_S,
        )
        node = line["node"]
        lease = self.store.read_lease(AGENT)
        assert lease is not None and lease.holder == node, (lease, node)
        self.cluster.kill(node)
        lines = journal(self.path)  # final for node: it is dead
        last = [ln for ln in lines if ln["node"] == node][-1]
        assert (last["task"], last["name"]) == (line["task"], line["name"]), (last, line)
        self.kills.append((line, last["phase"] == "end"))
        self.seen, self.killed = len(lines), node
        self.cluster.start(SPECS[node])  # back as a standby


def final_state(cluster: LocalCluster, store: Store) -> dict[str, Any]:
    record = store.read_cluster()
    assert record is not None
    info = store.list_checkpoints(AGENT)[0]
    state, _marks = Sealer(cluster.secret, record).open_checkpoint(
        store.read_checkpoint(AGENT, info), AGENT, info.epoch, info.seq
    )
    return state


def test_a_langgraph_graph_survives_leader_kills_mid_graph_and_an_answer_by_hb_submit(
    local_cluster: MakeCluster, tmp_path: Path
) -> None:
    path = tmp_path / "calls.jsonl"
    env = {"HB_TEST_LG_JOURNAL": str(path), "HB_TEST_LG_CALL_S": CALL_S}
    cluster = local_cluster(agent="hb_langgraph_agents:GraphTasks", env=env, timing=TIMING)
    for spec in SPECS.values():
        cluster.start(spec)
    store = open_store(cluster.store_url)
    wait_until(lambda: store.list_checkpoints(AGENT), "a first leader to publish", WAIT_S)
    killer = Killer(cluster, store, path)
    with Client(cluster.store_url, cluster.secret) as client:
        for i in range(TASKS):
            payload = {"task": i, "ask": False, "done": []}
            client.submit(AGENT, payload, request_id=f"task-{i}")
        killer.kill_inside("research of task 1 or later",
                           lambda ln: ln["task"] >= 1 and ln["name"] == "research")  # fmt: skip
        killer.kill_inside("write of task 3 or later",
                           lambda ln: ln["task"] >= 3 and ln["name"] == "write")  # fmt: skip
        replies = {i: client.result(AGENT, f"task-{i}", timeout=RESULT_S) for i in range(TASKS)}

        payload = {"task": ASKING, "ask": True, "done": []}
        client.submit(AGENT, payload, request_id=f"task-{ASKING}")
        asked = client.result(AGENT, f"task-{ASKING}", timeout=RESULT_S)
    [question] = asked["interrupts"]
    assert question["value"] == {"question": f"write task {ASKING}?"}, asked

    answer = [*HB, "submit", "--store", cluster.store_url, "--agent-id", AGENT,
              "--request-id", "answer", "--wait", "--timeout", str(RESULT_S),
              "--data", '"yes, write it"']  # fmt: skip
    with subprocess.Popen(answer, env=hb_env(HB_SECRET=cluster.secret), text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE) as submit:  # fmt: skip
        killer.kill_inside(f"write of task {ASKING}",
                           lambda ln: ln["task"] == ASKING and ln["name"] == "write")  # fmt: skip
        out, err = submit.communicate(timeout=RESULT_S + 10)
    assert submit.returncode == 0, (out, err)
    answered = json.loads(out.strip().splitlines()[-1])

    lines = journal(path)
    kills = killer.kills
    print(f"kills (call in flight, ended before the kill): {kills}\nreplies: {replies}")
    print("calls:", *[(ln["node"], ln["phase"], ln["task"], ln["name"]) for ln in lines])
    starts = Counter((ln["task"], ln["name"]) for ln in lines if ln["phase"] == "start")
    # A call is made again only if it was in flight when its step was lost: the last call
    # its node started before another node started one (a kill, or a lease lost to a
    # loaded machine) or before it started again. A call that completed before its node
    # went on to the next is never made again.
    for call, n in starts.items():
        if n > 1:
            assert lost_in_flight(lines, call), (call, n, kills)
    for line, ended in kills:
        call = (line["task"], line["name"])
        assert starts[call] <= 2 or not ended, (call, starts[call])
        if not ended:  # cut off: made again
            assert starts[call] >= 2, (call, starts[call])
    assert starts[(ASKING, "approve")] == 1, "the answered node ran again"
    for call in [(i, name) for i in range(TASKS + 1) for name in ("plan", "research")]:
        assert starts[call] >= 1, call

    for i, reply in replies.items():
        assert reply == {"output": expected_output(i)}, reply
    assert answered == {"output": expected_output(ASKING, approved="yes, write it")}, answered
    state = final_state(cluster, store)
    assert state["runs"] == TASKS + 2 and state["waiting"] == [], state
