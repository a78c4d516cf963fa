"""A journaled PydanticAI agent in real node processes, its leader SIGKILLed mid-run.

Three nodes run ``PydanticTasks`` (tests/support/hb_pydantic_agents.py): each step takes
one submitted task and runs a ``JournaledAgent`` on it, three model requests and four
tool calls, ``notify`` among them declared ``interrupted``. Every real call logs its
start and its end to a file, with the node and epoch that made it. Eight tasks are
submitted with ``Client``; the leader is SIGKILLed three times, each time inside a call
of another kind (a task's last model request, a ``notify``, a plain tool), and restarted
as a standby. Then every task is answered, and from the log:

- a call is made again only when it was the one in flight at a handover (the last call
  a term started), at most once per handover; there are three handovers, one per kill,
  unless the load made a leader miss its renew deadline (each such handover is one
  more, printed);
- one in flight at a kill that had not returned is made again if ``safe`` (the model
  request, the plain tool); every other model request and tool call, each completed
  before a handover, is made once;
- ``notify`` is made at most once per task and text: one cut by a kill is not made
  again, the replay raises ``EffectInterrupted`` and the agent replies that the
  message's fate is unknown (``{"unknown": "notify"}``) instead of sending it twice;
- every other task's reply is its run's whole output, and each task is answered once
  (the final checkpoint's list of answered tasks and conversation; the history checker,
  via conftest).
"""

from __future__ import annotations

import json
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pydantic_ai.messages import TextPart

from hamsterbunker import Client
from hamsterbunker.core.timing import LeaseTiming
from hamsterbunker.integrations.pydantic_ai import load_messages
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
# A patient lease (renew deadline 1.8 s): on a loaded machine a leader that is not
# killed should keep it (one that does not is a handover more, which the test allows).
TIMING = LeaseTiming(100, 3000)
CALL_S = "0.3"  # each real model or tool call takes this long: a kill lands inside one
Line = dict[str, Any]
# Each kill: once the leader is inside this call (a line started, not ended), spread over
# the tasks: the last model request of a task (its two others and four tool calls recorded
# before it), the interrupted tool, the last plain tool of a task.
TARGETS: tuple[tuple[str, Callable[[Line], bool]], ...] = (
    ("request-2 of task 1 or later", lambda ln: ln["task"] >= 1 and ln["name"] == "request-2"),
    ("notify of task 3 or later", lambda ln: ln["task"] >= 3 and ln["name"] == "notify"),
    ("the second add of task 5 or later",
     lambda ln: ln["task"] >= 5 and ln["name"] == "add" and ln["args"]["b"] == 100),
)  # fmt: skip
WAIT_S = 30.0  # for any one thing to happen (a takeover, a call to start)
RESULT_S = 60.0  # for all the replies, once the kills are done
MakeCluster = Callable[..., LocalCluster]
Key = tuple[int, str, str, str]  # (task, kind, name, args as JSON): one call


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


def key(line: Line) -> Key:
    return (line["task"], line["kind"], line["name"], json.dumps(line["args"], sort_keys=True))


def last_started(lines: list[Line]) -> dict[tuple[str, int], Line]:
    """Each term's (node, epoch) last call started: the one in flight when it ended."""
    found: dict[tuple[str, int], Line] = {}
    for line in lines:
        if line["phase"] == "start":
            found[line["node"], line["epoch"]] = line
    return found


def in_call(path: Path, after: int, wanted: Callable[[Line], bool], store: Store) -> Line | None:
    """A wanted call started after line number after, not yet ended, by the term that holds
    the lease."""
    lines = journal(path)[after:]
    ended = {(ln["node"], ln["epoch"], key(ln)) for ln in lines if ln["phase"] == "end"}
    started = [
        ln for ln in lines
        if ln["phase"] == "start" and wanted(ln) and (ln["node"], ln["epoch"], key(ln)) not in ended
    ]  # fmt: skip
    if not started:
        return None
    lease = store.read_lease(AGENT)
    line = started[-1]
    held = lease is not None and (lease.holder, lease.epoch) == (line["node"], line["epoch"])
    return line if held else None


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

        kills: list[tuple[Line, bool]] = []  # (the call in flight, had it returned?)
        seen = 0
        for what, wanted in TARGETS:
            line = wait_until(
                lambda: in_call(path, seen, wanted, store),  # noqa: B023 (called at once)
                f"the leader inside {what}",
                timeout=WAIT_S,
            )
            cluster.kill(line["node"])
            lines = journal(path)  # final for the term: its node is dead
            # The call in flight at the kill: the term's last (its calls are sequential),
            # the one seen unless the kill came a whole call late.
            term = [
                ln for ln in lines if (ln["node"], ln["epoch"]) == (line["node"], line["epoch"])
            ]
            in_flight = last_started(term)[line["node"], line["epoch"]]
            kills.append((in_flight, term[-1]["phase"] == "end"))
            seen = len(lines)  # every line after these is a later term's
            cluster.start(SPECS[line["node"]])  # back as a standby

        deadline = time.monotonic() + RESULT_S
        replies = {
            rid: client.result(AGENT, rid, timeout=max(0.1, deadline - time.monotonic()))
            for rid in numbers
        }

    lines = journal(path)
    terms = last_started(lines)
    handovers = len(terms) - 1  # each term but the last ended with a call in flight (or none)
    print(f"kills (in flight, returned): {kills}\nterms: {list(terms)}\nreplies: {replies}")
    assert handovers >= len(kills), terms
    starts = Counter(key(ln) for ln in lines if ln["phase"] == "start")
    in_flight_at_handover = Counter(key(ln) for ln in terms.values())
    repeats = {k: n - 1 for k, n in starts.items() if n > 1}
    # A call is made again only if it was in flight at a handover, once per handover.
    assert all(n <= in_flight_at_handover[k] for k, n in repeats.items()), (repeats, terms)
    assert sum(repeats.values()) <= handovers, repeats
    # The interrupted tool: never twice.
    assert all(n == 1 for k, n in starts.items() if k[2] == "notify"), starts

    cut_notify = set()  # tasks whose notify a kill cut before it returned
    for line, returned in kills:
        if line["name"] == "notify" and not returned:
            cut_notify.add(line["task"])
        elif not returned:  # safe, cut: made again
            assert starts[key(line)] >= 2, (line, starts[key(line)])
    assert cut_notify, f"no kill cut a notify (each kill's call in flight: {kills})"
    handed_notify = {ln["task"] for ln in terms.values() if ln["name"] == "notify"}

    by_task = {int(rid.removeprefix("task-")): reply for rid, reply in replies.items()}
    calls_of: dict[int, Counter[str]] = defaultdict(Counter)
    for k, n in starts.items():
        calls_of[k[0]][k[2]] += n
    for task, reply in by_task.items():
        assert reply["task"] == task, reply
        if task in cut_notify or "unknown" in reply:
            # EffectInterrupted on the replay; a notify in flight at a handover only.
            assert task in handed_notify, (task, reply)
            assert reply.get("unknown") == "notify" and "notify" in reply["effect"], reply
        else:
            assert reply["output"] == expected_output(task), reply
            assert calls_of[task]["notify"] == 1, (task, calls_of[task])
            assert all(calls_of[task][f"request-{r}"] for r in range(REQUESTS)), calls_of[task]

    state = final_state(cluster, store)
    assert sorted(state["answered"]) == list(range(TASKS)), state["answered"]
    unknown = {task for task, reply in by_task.items() if "unknown" in reply}
    assert set(state["unknown"]) == unknown
    # The conversation went on across the nodes: every answered run's six messages (the
    # prompt, three responses, two of tool returns), in the order the tasks were taken.
    messages = load_messages(state["messages"])
    assert len(messages) == 6 * (TASKS - len(unknown)), len(messages)
    outputs = [p.content for m in messages for p in m.parts if isinstance(p, TextPart)]
    assert outputs == [expected_output(t) for t in state["answered"] if t not in unknown]
