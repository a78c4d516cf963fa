"""A journaled PydanticAI agent in real node processes, its leader SIGKILLed mid-run.

Three nodes run ``PydanticTasks`` (tests/support/hb_pydantic_agents.py): each step takes
one submitted task and runs a ``JournaledAgent`` on it, three model requests and four
tool calls, ``notify`` among them declared ``interrupted``. Every real call logs its
start and its end to a file. Eight tasks are submitted with ``Client``; the leader is
SIGKILLed three times, each time inside a call of another kind (a task's last model
request, a ``notify``, a plain tool), and restarted as a standby. Then every task is answered, and
from the log:

- a call is made again only when it was the one in flight at a kill (at most one
  repeat per kill), and one that had not returned when its node died is made again
  exactly once if ``safe`` (the model request, the plain tool);
- ``notify`` is called at most once per task and text; one cut by a kill is not called
  again: the replay raises ``EffectInterrupted`` and the agent replies that the message's
  fate is unknown (``{"unknown": "notify"}``) instead of sending it twice;
- every other task's reply is its run's whole output, and each task is answered once
  (the final checkpoint's list of answered tasks; the history checker, via conftest).
"""

from __future__ import annotations

import json
import time
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
from tests.support.hb_pydantic_agents import REQUESTS, PydanticTasks, expected_output

pytestmark = pytest.mark.multiprocess

SPECS = {
    spec.node: spec
    for spec in (
        NodeSpec("node-a", "eu-central"),
        NodeSpec("node-b", "us-east"),
        NodeSpec("node-c", "ap-south"),
    )
}
AGENT = PydanticTasks.id
TASKS = 8
# A patient lease (renew deadline 1.2 s): on a loaded machine a leader that is not
# killed must not lose it, or its step would be replayed without a kill.
TIMING = LeaseTiming(100, 2000)
CALL_S = "0.3"  # each real model or tool call takes this long: a kill lands inside one
# Each kill: once the leader is inside this call (a line started, not ended), spread over
# the tasks: the last model request of a task (its two others and four tool calls recorded
# before it), the interrupted tool, the last plain tool of a task.
TARGETS: tuple[tuple[str, Callable[[dict[str, Any]], bool]], ...] = (
    ("request-2 of task 1 or later", lambda ln: ln["task"] >= 1 and ln["name"] == "request-2"),
    ("notify of task 3 or later", lambda ln: ln["task"] >= 3 and ln["name"] == "notify"),
    ("the second add of task 5 or later",
     lambda ln: ln["task"] >= 5 and ln["name"] == "add" and ln["args"]["b"] == 100),
)  # fmt: skip
WAIT_S = 30.0  # for any one thing to happen (a takeover, a call to start)
RESULT_S = 60.0  # for all the replies, once the kills are done
MakeCluster = Callable[..., LocalCluster]
Key = tuple[int, str, str, str]  # (task, kind, name, args as JSON): one call


def journal(path: Path) -> list[dict[str, Any]]:
    """The calls' lines, in order (a line cut by a kill, which one write rules out, skipped)."""
    found = []
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                found.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return found


def key(line: dict[str, Any]) -> Key:
    args = json.dumps(line["args"], sort_keys=True)
    return (line["task"], line["kind"], line["name"], args)


def in_call(
    path: Path, after: int, wanted: Callable[[dict[str, Any]], bool], not_on: str | None
) -> dict[str, Any] | None:
    """The last line, if it is the start of a wanted call after line number after, on
    another node than not_on (a call it makes has not ended)."""
    lines = journal(path)[after:]
    if not lines:
        return None
    last = lines[-1]
    if last["phase"] != "start" or last["node"] == not_on or not wanted(last):
        return None
    return last


def final_state(cluster: LocalCluster, store: Store) -> dict[str, Any]:
    record = store.read_cluster()
    assert record is not None
    info = store.list_checkpoints(AGENT)[0]
    state, _marks = Sealer(cluster.secret, record).open_checkpoint(
        store.read_checkpoint(AGENT, info), AGENT, info.epoch, info.seq
    )
    return state


def test_a_journaled_pydantic_ai_agent_survives_three_leader_kills_mid_run(
    local_cluster: MakeCluster, tmp_path: Path
) -> None:
    path = tmp_path / "calls.jsonl"
    env = {"HB_TEST_PAI_JOURNAL": str(path), "HB_TEST_PAI_CALL_S": CALL_S}
    cluster = local_cluster(agent="hb_pydantic_agents:PydanticTasks", env=env, timing=TIMING)
    for spec in SPECS.values():
        cluster.start(spec)
    store = open_store(cluster.store_url)

    def published() -> bool:
        return bool(store.list_checkpoints(AGENT))

    wait_until(published, "a first leader to publish", timeout=WAIT_S)
    with Client(cluster.store_url, cluster.secret) as client:
        numbers = {
            f"task-{i}": client.submit(AGENT, {"task": i}, request_id=f"task-{i}").number
            for i in range(TASKS)
        }
        assert sorted(numbers.values()) == list(range(1, TASKS + 1))

        kills: list[tuple[dict[str, Any], bool]] = []  # (call in flight, had it ended?)
        seen, killed = 0, None
        for what, wanted in TARGETS:
            line = wait_until(
                lambda: in_call(path, seen, wanted, killed),  # noqa: B023 (called at once)
                f"the leader inside {what}",
                timeout=WAIT_S,
            )
            node = line["node"]
            lease = store.read_lease(AGENT)
            assert lease is not None and lease.holder == node, (lease, node)
            cluster.kill(node)
            lines = journal(path)  # final for node: it is dead
            # The call in flight at the kill: the node's last (its calls are sequential),
            # the one seen unless the kill came a whole call late.
            mine = [ln for ln in lines if ln["node"] == node]
            started = [ln for ln in mine if ln["phase"] == "start"][-1]
            kills.append((started, mine[-1]["phase"] == "end"))
            seen, killed = len(lines), node
            cluster.start(SPECS[node])  # back as a standby

        deadline = time.monotonic() + RESULT_S
        replies = {
            rid: client.result(AGENT, rid, timeout=max(0.1, deadline - time.monotonic()))
            for rid in numbers
        }

    lines = journal(path)
    print(f"kills (call in flight, ended before the kill): {kills}\nreplies: {replies}")
    starts = Counter(key(ln) for ln in lines if ln["phase"] == "start")
    in_flight = Counter(key(line) for line, _ended in kills)
    repeats = {k: n - 1 for k, n in starts.items() if n > 1}
    # A call is made again only if it was in flight at a kill, once per such kill.
    assert all(n <= in_flight[k] for k, n in repeats.items()), (repeats, kills)
    assert sum(repeats.values()) <= len(kills)
    # The interrupted tool: never twice.
    assert all(n == 1 for k, n in starts.items() if k[2] == "notify"), starts

    unknown = set()
    for line, ended in kills:
        k = key(line)
        if ended:  # returned before the kill: recorded or not, made at most twice
            assert starts[k] <= 2, (k, starts[k])
        elif line["name"] == "notify":  # cut: its replay raised EffectInterrupted
            unknown.add(line["task"])
        else:  # cut, safe: made again, once
            assert starts[k] == 2, (k, starts[k])

    for rid, reply in replies.items():
        task = int(rid.removeprefix("task-"))
        assert reply["task"] == task, reply
        if "unknown" in reply:
            assert reply["unknown"] == "notify" and "notify" in reply["effect"], reply
            assert any(line["task"] == task and line["name"] == "notify" for line, _ in kills)
        else:
            assert reply["output"] == expected_output(task), reply
            assert sum(n for k, n in starts.items() if k[0] == task and k[2] == "notify") == 1
            for request in range(REQUESTS):
                assert any(
                    k[0] == task and k[1:3] == ("model", f"request-{request}") for k in starts
                ), (task, request)
    assert {r["task"] for r in replies.values() if "unknown" in r} >= unknown
    assert unknown, f"no notify was cut by its kill: {kills}"

    state = final_state(cluster, store)
    assert sorted(state["answered"]) == list(range(TASKS)), state["answered"]
    assert set(state["unknown"]) >= unknown
