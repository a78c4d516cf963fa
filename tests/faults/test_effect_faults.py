"""Journaled effects under process faults: real nodes, a real tool, SIGKILLs and SIGTERMs.

The test agents (``EffectsAgent``, ``SyncEffectsAgent`` in
tests/support/hb_test_agents.py) run each step's effects against a loopback
tool server started by the test (tests/support/tool_server.py), naming
``current_effect().key``; the tool counts calls per key. The agents write
what each effect gave them (a result, or ``EffectInterrupted``) to a file,
so what the world saw (the tool's counts) and what the agent saw are both
known from outside the runtime; every node also records its operations
(``--history``: ``effect_start`` before each call of an effect's function,
``effect`` once its outcome is recorded or replayed).

1. Each failpoint of an effect (before the intent, after the intent, during
   the call, after the call, after the record) kills the leader (SIGKILL) in
   its second step, on each store (every case on the file store, each point
   once on Redis and etcd); the standby replays that step:
   completed effects are never called again, an ``interrupted`` effect runs
   at most once and its replay raises ``EffectInterrupted`` exactly when its
   outcome is unknown, a ``safe`` one runs again when its outcome is unknown
   and the agent sees one result per key.
2. A kill loop: SIGKILLs of the active node at random moments, with four
   effects a step: no completed effect runs again, at most one ``safe``
   effect is re-executed per kill, no ``interrupted`` effect runs twice.
3. A SIGTERM loop: a planned stop lets the step in flight finish and
   publishes it, so no step and no effect is repeated (DESIGN.md invariant 6).
4. Pauses (SIGSTOP) of the leader past its renew deadline mid-effect: the
   abandoned sync step runs on in its thread beside its retry and must start
   no more effects.
5. A zombie leader (paused while the tool holds its call) records no outcome
   of the effect under its old epoch (each store).
6. A step that outlives the stop grace (``--stop-grace-ms``) is given up:
   the next leader reports its effect in flight interrupted.

Randomness comes from ``random.Random(seed)``; the seed is printed, and
``HB_TEST_SEED=<seed>`` replays a failed run's choices.

In the slow tier (``make test-all``). The backend half, the journal's fenced
writes, bounds and removal, is proved on every backend by
tests/stores/contract/test_effect_journal.py; the replay rules in-process by
tests/node/test_effects.py and tests/node/test_effect_journal_paths.py, in the
fast tier.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import secrets
import signal
import subprocess
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import pytest

from hamsterbunker.core.errors import StoreError
from hamsterbunker.core.history import Op, read_history
from hamsterbunker.core.timing import LeaseTiming
from hamsterbunker.ops.checker import check
from hamsterbunker.ops.local import LocalCluster, NodeSpec
from hamsterbunker.records import LeaseRecord
from hamsterbunker.sealing import Sealer
from hamsterbunker.stores import Store, open_store
from tests.support import pause_outside_lock, process_state, wait_until
from tests.support.etcd_server import etcd_url
from tests.support.hb_test_agents import EffectsAgent, SyncEffectsAgent
from tests.support.redis_server import redis_url
from tests.support.tool_server import ToolServer

pytestmark = [pytest.mark.fault, pytest.mark.multiprocess]

A, B, C = (
    NodeSpec("node-a", "eu-central"),
    NodeSpec("node-b", "us-east"),
    NodeSpec("node-c", "ap-south"),
)
SPECS = {spec.node: spec for spec in (A, B, C)}
FAST = LeaseTiming(100, 800)  # tick 100 ms, TTL 800 ms (renew deadline 480 ms)
MakeCluster = Callable[..., LocalCluster]
T = TypeVar("T")


# -- helpers -------------------------------------------------------------------


def url_of(backend: str) -> str | None:
    """None for local_cluster's own file store, or a prefix of its own on Redis or etcd."""
    if backend == "redis":
        return redis_url()
    if backend == "etcd":
        return etcd_url()
    assert backend == "file", backend
    return None


@pytest.fixture
def tool() -> Iterator[ToolServer]:
    with ToolServer.start() as server:
        yield server


def seeded(test: str) -> random.Random:
    """A Random for this test; its seed is printed (shown by pytest when the test fails)."""
    seed = int(os.environ.get("HB_TEST_SEED") or secrets.randbits(32))
    print(f"{test}: random seed {seed} (replay with HB_TEST_SEED={seed})")
    return random.Random(seed)


def effects_env(tool: ToolServer, tmp_path: Path, **extra: str) -> dict[str, str]:
    return {"HB_TOOL_URL": tool.url, "HB_TEST_EFFECTS": str(tmp_path / "saw.jsonl"), **extra}


def quietly(probe: Callable[[], T]) -> Callable[[], T | None]:
    """probe, as None while the store answers with an error (a record mid-write)."""

    def probed() -> T | None:
        try:
            return probe()
        except StoreError:
            return None

    return probed


def lease_of(store: Store, agent: str) -> LeaseRecord | None:
    return store.read_lease(agent)


def latest(store: Store, agent: str) -> tuple[int, int]:
    """(seq, epoch) of the newest checkpoint, (0, 0) without one."""
    checkpoints = store.list_checkpoints(agent)
    return (checkpoints[0].seq, checkpoints[0].epoch) if checkpoints else (0, 0)


def final_state(cluster: LocalCluster, store: Store, agent: str) -> tuple[int, dict[str, Any]]:
    """The newest checkpoint's seq and state, opened with the cluster's secret."""
    record = store.read_cluster()
    assert record is not None
    info = store.list_checkpoints(agent)[0]
    state = Sealer(cluster.secret, record).open(
        store.read_checkpoint(agent, info), agent, info.epoch, info.seq
    )
    return info.seq, state


def lines(path: Path) -> list[dict[str, Any]]:
    """The JSON lines of a file the agents append to (a torn last line from a kill skipped)."""
    found = []
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                found.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return found


def history(cluster: LocalCluster) -> list[Op]:
    assert cluster.history is not None
    return read_history(cluster.history) if cluster.history.exists() else []


def exited(process: subprocess.Popen[bytes], what: str, timeout: float = 30) -> int:
    wait_until(lambda: process.poll() is not None, what, timeout=timeout)
    code = process.returncode
    assert code is not None
    return code


def keys_by_effect(tool: ToolServer) -> dict[tuple[int, str], set[str]]:
    """The idempotency keys the tool was called with, by (step seq, effect name)."""
    keys: dict[tuple[int, str], set[str]] = defaultdict(set)
    for call in tool.calls():
        keys[(call.body["seq"], call.body["name"])].add(call.key)
    return keys


def calls_by_effect(tool: ToolServer) -> Counter[tuple[int, str]]:
    return Counter((call.body["seq"], call.body["name"]) for call in tool.calls())


def assert_stable_keys(tool: ToolServer) -> None:
    """One key per effect of a step, whichever node called it; different effects, different keys."""
    keys = keys_by_effect(tool)
    assert all(len(found) == 1 for found in keys.values()), keys
    flat = [next(iter(found)) for found in keys.values()]
    assert len(flat) == len(set(flat)), "two effects share an idempotency key"


# -- 1. each failpoint of an effect, on each store ------------------------------

PLAN = EffectsAgent.plan  # fetch (safe), charge (interrupted), notify (safe)
KILLED_SEQ = 2  # the leader is killed in its second step: the first is published


@dataclass(frozen=True)
class Point:
    """Where the leader is killed, and what the replay of that step must then see."""

    point: str  # the failpoint (effect.during_call: inside the agent's own function)
    target: str  # the effect of step 2 the kill lands on
    calls: int  # how many times the tool is called for the target, in all
    saw: str  # what the replay gets for the target: "result" or "interrupted"

    @property
    def index(self) -> int:
        return [name for name, _ in PLAN].index(self.target)

    @property
    def replay(self) -> str:
        return PLAN[self.index][1]

    @property
    def nth(self) -> int:
        """The failpoint's hit that lands on the target of step 2 (hits count per process)."""
        if self.point in ("effect.before_intent", "effect.after_intent"):
            per_step = [name for name, replay in PLAN if replay == "interrupted"]
        else:
            per_step = [name for name, _ in PLAN]
        return len(per_step) * (KILLED_SEQ - 1) + per_step.index(self.target) + 1

    @property
    def recorded(self) -> bool:
        """The target's outcome was in the store at the kill: the replay reuses it."""
        return self.point == "effect.after_record"


POINTS = [
    # Nothing of the effect stored: the replay calls it, for the first time.
    Point("effect.before_intent", "charge", calls=1, saw="result"),
    # Intent stored, never called: the outcome is unknown to the runtime.
    Point("effect.after_intent", "charge", calls=0, saw="interrupted"),
    # Called, outcome lost: a safe effect runs again, an interrupted one is reported.
    Point("effect.during_call", "fetch", calls=2, saw="result"),
    Point("effect.during_call", "charge", calls=1, saw="interrupted"),
    Point("effect.after_call", "fetch", calls=2, saw="result"),
    Point("effect.after_call", "charge", calls=1, saw="interrupted"),
    # Outcome recorded: reused, never called again (notify is the step's last effect:
    # killed after its record, before the step's checkpoint).
    Point("effect.after_record", "charge", calls=1, saw="result"),
    Point("effect.after_record", "notify", calls=1, saw="result"),
]


# Every case on the file store; on Redis and etcd each failpoint once (their records are
# written and read by the same rules), which keeps the suite fast.
ON_NETWORK_STORES = {
    ("effect.before_intent", "charge"),
    ("effect.after_intent", "charge"),
    ("effect.during_call", "charge"),
    ("effect.after_call", "fetch"),
    ("effect.after_record", "notify"),
}
CASES = [("file", p) for p in POINTS] + [
    (backend, p)
    for backend in ("redis", "etcd")
    for p in POINTS
    if (p.point, p.target) in ON_NETWORK_STORES
]


@pytest.mark.parametrize(
    ("backend", "point"),
    CASES,
    ids=[f"{b}-{p.point.removeprefix('effect.')}-{p.target}" for b, p in CASES],
)
def test_a_leader_killed_at_an_effect_failpoint_is_replayed_without_repeating_completed_effects(
    local_cluster: MakeCluster,
    tool: ToolServer,
    tmp_path: Path,
    backend: str,
    point: Point,
) -> None:
    """SIGKILL at one effect failpoint in step 2; the standby's replay of step 2 keeps the rules."""
    agent = "effects"
    saw_path = tmp_path / "saw.jsonl"
    cluster = local_cluster(
        agent="hb_test_agents:EffectsAgent",
        timing=FAST,
        store_url=url_of(backend),
        env=effects_env(tool, tmp_path),
    )
    store = open_store(cluster.store_url)
    # node-b starts with node-a, but waits before its first look at the lease (stopped
    # by a failpoint) until node-a has taken it: then it is watching when node-a dies.
    standby = cluster.start(B, extra_env={"HB_FAILPOINTS": "node.before_first_tick=stop"})
    leader = cluster.start(A, extra_env={"HB_FAILPOINTS": f"{point.point}=kill@{point.nth}"})
    wait_until(
        quietly(lambda: (lease := lease_of(store, agent)) and lease.holder == A.node),
        "node-a to take the lease",
    )
    wait_until(lambda: process_state(standby.pid) == "T", "node-b to line up")
    standby.send_signal(signal.SIGCONT)
    code = exited(leader, "node-a to be killed at its failpoint")
    assert code == -signal.SIGKILL, f"node-a exited with {code}:\n{cluster.log(A.node)}"
    wait_until(
        quietly(lambda: (at := latest(store, agent))[0] >= KILLED_SEQ + 2 and at[1] >= 2),
        "node-b to take over and publish two steps past the replayed one",
    )
    cluster.stop_all()
    final_seq, state = final_state(cluster, store, agent)

    abandoned = given_up(store, agent)  # runs of a step the runtime gave up (load: rare)
    saw = lines(saw_path)
    # A given-up run and its retry see the same: each effect once, in order.
    by_a = list(dict.fromkeys((s["seq"], s["name"]) for s in saw if s["node"] == A.node))
    names = [name for name, _ in PLAN]
    # The kill landed where it was aimed: node-a saw step 1 and the effects of step 2
    # before the target, nothing more.
    assert by_a == [(1, n) for n in names] + [(KILLED_SEQ, n) for n in names[: point.index]], (
        by_a,
        cluster.log(A.node),
    )
    a_values = {(s["seq"], s["name"]): s["value"] for s in saw if s["node"] == A.node}

    # The world: every effect of every step called exactly once, except the target; a
    # call repeated after a run the runtime gave up (its renew deadline passed under
    # load, with the call in flight) is not the kill's doing, and not counted.
    calls = calls_by_effect(tool)
    repeated_after_give_up: Counter[tuple[int, str]] = Counter()
    for call in tool.calls():
        if call.n > 1:
            before = next(c for c in tool.calls() if c.key == call.key and c.n == call.n - 1)
            if (before.body["node"], before.body["epoch"], before.body["seq"]) in abandoned:
                repeated_after_give_up[(call.body["seq"], call.body["name"])] += 1
    expected = {(seq, name): 1 for seq in range(1, final_seq + 1) for name in names}
    expected[(KILLED_SEQ, point.target)] = point.calls
    assert dict(calls - repeated_after_give_up) == {k: v for k, v in expected.items() if v}, (
        point,
        sorted(calls.items()),
        repeated_after_give_up,
    )
    assert_stable_keys(tool)
    runs = EffectRuns(history(cluster), tool)
    runs.assert_tool_calls_were_started()
    runs.assert_completed_never_called_again()
    runs.assert_interrupted_at_most_once()
    assert check(history(cluster)) == []  # hamsterbunker.ops.checker's rules, effects included

    # What node-b's replay of step 2 gave the agent.
    replayed = {s["name"]: s for s in saw if s["node"] == B.node and s["seq"] == KILLED_SEQ}
    assert sorted(replayed) == sorted(names), saw
    for name in names[: point.index]:  # completed before the kill: the recorded result
        assert replayed[name]["saw"] == "result", replayed[name]
        assert replayed[name]["value"] == a_values[(KILLED_SEQ, name)], (name, saw)
    target = replayed[point.target]
    assert target["saw"] == point.saw, (point, target)
    for name in names[point.index :]:  # a result: from the tool's last call of it
        if replayed[name]["saw"] == "result":
            assert replayed[name]["value"]["n"] == calls[(KILLED_SEQ, name)], (name, saw)
    # The agent sees one result per effect, whichever node ran the step.
    assert_agent_saw_one_outcome_per_effect(saw, abandoned)

    # EffectInterrupted exactly where the outcome was unknown, in the published state too.
    want = [(KILLED_SEQ, point.target)] if point.saw == "interrupted" else []
    interrupted = [(s["seq"], s["name"]) for s in saw if s["saw"] == "interrupted"]
    assert set(interrupted) == set(want), saw
    if not abandoned:  # else node-b may have run step 2, and seen it, more than once
        assert interrupted == want, saw
    assert state["interrupted"] == [list(w) for w in want], state
    assert state["count"] == final_seq, state
    assert_published_run_saw_recorded_outcomes(state, runs, PLAN, final_seq)

    # node-b's history: which effects of step 2 it replayed and which it started.
    ops = [o for o in runs.ops if o.node == B.node and o.seq == KILLED_SEQ]
    reused = {o.detail["index"] for o in ops if o.op == "effect" and o.outcome == "replayed"}
    started = {o.detail["index"] for o in ops if o.op == "effect_start"}
    marked = {o.detail["index"] for o in ops if o.op == "effect" and o.outcome == "interrupted"}
    want_reused = set(range(point.index + (1 if point.recorded else 0)))
    fresh = set(range(point.index, len(PLAN))) - want_reused
    if point.saw == "interrupted":
        fresh.discard(point.index)
    want_marked = {point.index} if point.saw == "interrupted" else set()
    if any(node == B.node and seq == KILLED_SEQ for node, _, seq in abandoned):
        # node-b ran step 2 more than once: its retry also reuses what the first run did.
        assert want_reused <= reused and fresh <= started | reused, ops
        assert want_marked <= marked, ops
    else:
        assert (reused, started, marked) == (want_reused, fresh, want_marked), ops


# -- 2. kill loop ----------------------------------------------------------------


@dataclass
class EffectRuns:
    """What the histories and the tool tell of each effect, by idempotency key."""

    ops: list[Op]
    tool: ToolServer

    def __post_init__(self) -> None:
        self.starts: dict[str, list[Op]] = defaultdict(list)  # effect_start: fn was called
        self.outcomes: dict[str, list[Op]] = defaultdict(list)  # effect: ok/failed/replayed/...
        for op in self.ops:
            if op.op == "effect_start":
                self.starts[op.detail["key"]].append(op)
            elif op.op == "effect":
                self.outcomes[op.detail["key"]].append(op)
        self.calls = self.tool.counts()
        self.replay: dict[str, str] = {}  # key -> "safe" or "interrupted"
        self.where: dict[str, tuple[int, str]] = {}  # key -> (seq, name)
        for call in self.tool.calls():
            self.replay[call.key] = call.body["replay"]
            self.where[call.key] = (call.body["seq"], call.body["name"])
        for key, starts in self.starts.items():
            self.replay.setdefault(key, starts[0].detail["replay"])

    def recorded_at(self, key: str) -> float | None:
        """When the key's outcome was first known to be in the store (node clock), if ever."""
        ends = [o.end for o in self.outcomes[key] if o.outcome in ("ok", "failed", "replayed")]
        return min(ends, default=None)

    def assert_completed_never_called_again(self) -> None:
        for key in set(self.starts) | set(self.outcomes):
            recorded = self.recorded_at(key)
            if recorded is not None:
                late = [o for o in self.starts[key] if o.start > recorded]
                assert late == [], f"{key} {self.where.get(key)} called after its record: {late}"

    def assert_tool_calls_were_started(self) -> None:
        """Every call the tool saw was an effect's function run by a node (an effect_start)."""
        for key, n in self.calls.items():
            assert n <= len(self.starts[key]), (key, n, self.starts[key])

    def assert_interrupted_at_most_once(self) -> None:
        for key, replay in self.replay.items():
            if replay == "interrupted":
                assert self.calls[key] <= 1 and len(self.starts[key]) <= 1, (
                    f"interrupted effect {key} {self.where.get(key)} ran "
                    f"{self.calls[key]} times, started {len(self.starts[key])} times"
                )
        # Once a replay has reported an effect interrupted, nothing calls it (after an
        # intent and a kill before the call, that would be its first call).
        for key, outcomes in self.outcomes.items():
            reported = [o.end for o in outcomes if o.outcome == "interrupted"]
            if reported:
                late = [o for o in self.starts[key] if o.start > min(reported)]
                assert late == [], f"{key} called after a replay reported it interrupted: {late}"

    def safe_reruns(self) -> list[tuple[str, int, bool]]:
        """For each extra call of a safe effect: its key, the epoch of the call it repeated,
        and whether that call was the last the tool got in its epoch (in flight at its end)."""
        calls = self.tool.calls()
        last_of_epoch = {c.body["epoch"]: c.order for c in calls}  # calls come in order
        reruns = []
        for call in calls:
            if call.body["replay"] == "safe" and call.n > 1:
                before = next(c for c in calls if c.key == call.key and c.n == call.n - 1)
                epoch = before.body["epoch"]
                reruns.append((call.key, epoch, before.order == last_of_epoch[epoch]))
        return reruns


def given_up(store: Store, agent: str) -> set[tuple[str, int, int]]:
    """(node, epoch, step seq) of each step the runtime gave up on while the node ran on
    (renew deadline, fenced, store failure): an abandoned sync run of it may go on beside
    its retry, and see what the retry does not."""
    return {
        (e.node, e.epoch, e.detail["step_seq"])
        for e in store.read_events(agent)
        if e.type in ("agent.yielded", "node.fenced", "checkpoint.failed")
        and "step_seq" in e.detail
    }


def assert_agent_saw_one_outcome_per_effect(
    saw: list[dict[str, Any]], abandoned: set[tuple[str, int, int]]
) -> Counter[str]:
    """Every run of a step (on any node, killed or not; runs of a step the runtime gave up
    aside) gave the agent the same result, or the same interruption, for each effect."""
    outcomes: dict[tuple[int, str], set[str]] = defaultdict(set)
    for s in saw:
        if (s["node"], s["epoch"], s["seq"]) not in abandoned:
            value = json.dumps([s["saw"], s["value"]], sort_keys=True)
            outcomes[(s["seq"], s["name"])].add(value)
    differing = {k: v for k, v in outcomes.items() if len(v) > 1}
    assert differing == {}, differing
    return Counter(s["saw"] for s in saw)


def outcome_digest(outcome: dict[str, Any]) -> str:
    """An outcome's digest as the history records it (hamsterbunker.agent.effects._digest)."""
    text = json.dumps(outcome, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def assert_published_run_saw_recorded_outcomes(
    state: dict[str, Any], runs: EffectRuns, plan: tuple[tuple[str, str], ...], final_seq: int
) -> None:
    """What the published run of each step saw (kept in the agent's state): for every effect,
    the outcome recorded in the store (its digest in a node's history), or interrupted
    for an effect marked so whose outcome was never recorded; each safe effect a result."""
    calls = {call.order: call for call in runs.tool.calls()}
    keys = {where: key for key, where in runs.where.items()}
    for seq in range(1, final_seq + 1):
        for name, replay in plan:
            seen = state["seen"][f"{seq}/{name}"]
            key = keys.get((seq, name))
            if seen == "interrupted":
                assert replay == "interrupted", (seq, name)
                assert key is None or runs.recorded_at(key) is None, (seq, name, runs.outcomes[key])
                continue
            call = calls[seen]
            assert call.key == key, (seq, name, call)
            digest = outcome_digest({"result": {"key": key, "n": call.n, "order": call.order}})
            recorded = {
                o.detail.get("digest")
                for o in runs.outcomes[key]
                if o.outcome in ("ok", "replayed")
            }
            assert digest in recorded, (seq, name, call, runs.outcomes[key])


def publishing_term(store: Store, agent: str, after_epoch: int) -> LeaseRecord | None:
    """The lease, once its holder has published a checkpoint in an epoch above after_epoch."""
    lease = store.read_lease(agent)
    if lease is None or lease.holder is None or lease.epoch <= after_epoch:
        return None
    seq, epoch = latest(store, agent)
    return lease if seq and epoch == lease.epoch else None


# 21 kills on the file store; a shorter loop on Redis and etcd keeps the suite fast.
@pytest.mark.parametrize(("backend", "kills_wanted"), [("file", 21), ("redis", 10), ("etcd", 10)])
def test_kill_loop_completed_effects_never_run_again_and_each_kill_repeats_at_most_one(
    local_cluster: MakeCluster, tool: ToolServer, tmp_path: Path, backend: str, kills_wanted: int
) -> None:
    """SIGKILLs of the active node mid-step (four effects a step, safe and interrupted)."""
    rng = seeded("effect kill loop")
    agent, time_budget = "effects-sync", 90.0
    cluster = local_cluster(
        agent="hb_test_agents:SyncEffectsAgent",
        timing=LeaseTiming(100, 700),
        store_url=url_of(backend),
        env=effects_env(tool, tmp_path, HB_TEST_TOOL_DELAY_S="0.02"),
    )
    for spec in (A, B, C):
        cluster.start(spec)
    store = open_store(cluster.store_url)

    started = time.monotonic()
    killed: dict[int, str] = {}  # epoch -> node killed in it
    epoch = 0
    for _ in range(kills_wanted):
        assert time.monotonic() - started < time_budget, f"{len(killed)} kills in {time_budget} s"
        lease = wait_until(
            quietly(partial(publishing_term, store, agent, epoch)),
            f"a leader above epoch {epoch} to publish",
        )
        time.sleep(rng.uniform(0.0, 0.3))  # the random moment of the crash: the fault itself
        lease = wait_until(quietly(lambda: lease_of(store, agent)), "the lease")
        assert lease.holder is not None, lease
        cluster.kill(lease.holder)  # SIGKILL, and reaped: it does nothing more
        killed[lease.epoch] = lease.holder
        epoch = lease.epoch
        cluster.start(SPECS[lease.holder])  # the machine comes back, as a standby
    wait_until(
        quietly(partial(publishing_term, store, agent, epoch)), "a leader after the last kill"
    )
    duration = time.monotonic() - started
    cluster.stop_all()

    final_seq, state = final_state(cluster, store, agent)
    runs = EffectRuns(history(cluster), tool)
    runs.assert_tool_calls_were_started()
    runs.assert_completed_never_called_again()
    runs.assert_interrupted_at_most_once()
    assert check(history(cluster)) == []  # hamsterbunker.ops.checker's rules, effects included
    assert_stable_keys(tool)

    # A safe effect runs again only when a kill (or the runtime giving a step up:
    # renew deadline, fenced, store failure, each with an event) left it in flight;
    # the effects of a step run one after another, so at most one per kill.
    discarded = Counter(
        e.epoch
        for e in store.read_events(agent)
        if e.type in ("agent.yielded", "node.fenced", "checkpoint.failed")
    )
    reruns = runs.safe_reruns()
    per_epoch = Counter(epoch for _, epoch, _ in reruns)
    for run_epoch, n in per_epoch.items():
        allowed = (1 if run_epoch in killed else 0) + discarded[run_epoch]
        assert n <= allowed, (
            f"epoch {run_epoch}: {n} safe effects ran again; killed: {run_epoch in killed}, "
            f"steps given up: {discarded[run_epoch]}; {reruns}"
        )
    for key, run_epoch, in_flight in reruns:
        # What a kill repeats is the effect it cut short: the epoch's last call.
        assert in_flight or discarded[run_epoch], (key, run_epoch, reruns)

    # The agent: one outcome per effect, whichever node ran the step; EffectInterrupted
    # only for an effect whose outcome was never recorded.
    saw = lines(tmp_path / "saw.jsonl")
    seen = assert_agent_saw_one_outcome_per_effect(saw, given_up(store, agent))
    assert_published_run_saw_recorded_outcomes(state, runs, SyncEffectsAgent.plan, final_seq)
    keys = {where: key for key, where in runs.where.items()}
    interrupted = {(s["seq"], s["name"]) for s in saw if s["saw"] == "interrupted"}
    for where in interrupted:
        called = keys.get(where)  # None: never called (killed after its intent)
        assert called is None or runs.recorded_at(called) is None, (where, runs.outcomes[called])
    assert len(interrupted) <= len(killed) + sum(discarded.values()), interrupted
    assert {tuple(i) for i in state["interrupted"]} <= interrupted, state
    # Every completed step counted once, none lost.
    assert state["count"] == final_seq, state
    journal = lines(Path(cluster.env["HB_TEST_JOURNAL"]))
    assert set(range(1, final_seq + 1)) <= {line["seq"] for line in journal}
    print(
        f"effect kill loop ({backend}): {len(killed)} SIGKILLs in {duration:.1f} s; {final_seq} steps, "
        f"{sum(runs.calls.values())} tool calls for {len(runs.calls)} effects; "
        f"{len(reruns)} safe effects ran again, {len(interrupted)} reported interrupted; "
        f"agent saw {dict(seen)}; {sum(discarded.values())} steps given up by the runtime"
    )
    assert len(killed) == kills_wanted


# -- 3. SIGTERM loop -------------------------------------------------------------


@pytest.mark.parametrize(
    "agent_class", [EffectsAgent, SyncEffectsAgent], ids=["async-effect", "sync-effect_sync"]
)
def test_sigterm_loop_a_planned_stop_repeats_no_step_and_no_effect(
    local_cluster: MakeCluster, tool: ToolServer, tmp_path: Path, agent_class: type[EffectsAgent]
) -> None:
    """8 SIGTERMs of the active node mid-step: each step and each effect runs exactly once."""
    rng = seeded("effect SIGTERM loop")
    agent, stops_wanted, time_budget = agent_class.id, 8, 60.0
    # Steps of 150 to 200 ms (three or four effects of 50 ms each), well within the stop
    # grace (10 s by default). The TTL is long: a handover on SIGTERM must not wait for it.
    cluster = local_cluster(
        agent=f"hb_test_agents:{agent_class.__name__}",
        timing=LeaseTiming(100, 3000),
        env=effects_env(tool, tmp_path, HB_TEST_TOOL_DELAY_S="0.05"),
    )
    for spec in (A, B, C):
        cluster.start(spec)
    store = open_store(cluster.store_url)

    started = time.monotonic()
    stopped: list[tuple[str, int, float]] = []  # node, epoch, how long it took to exit
    epoch = 0
    for _ in range(stops_wanted):
        assert time.monotonic() - started < time_budget, f"{len(stopped)} stops in {time_budget} s"
        wait_until(
            quietly(partial(publishing_term, store, agent, epoch)),
            f"a leader above epoch {epoch} to publish",
        )
        time.sleep(rng.uniform(0.0, 0.3))  # a random moment of a step: the fault itself
        lease = wait_until(quietly(lambda: lease_of(store, agent)), "the lease")
        assert lease.holder is not None, lease
        sent = time.monotonic()
        cluster.signal(lease.holder, signal.SIGTERM)
        code = exited(cluster.processes[lease.holder], f"{lease.holder} to stop", timeout=20)
        assert code == 0, f"{lease.holder} exited with {code}:\n{cluster.log(lease.holder)}"
        stopped.append((lease.holder, lease.epoch, time.monotonic() - sent))
        epoch = lease.epoch
        cluster.start(SPECS[lease.holder])  # back, as a standby
    wait_until(
        quietly(partial(publishing_term, store, agent, epoch)), "a leader after the last stop"
    )
    duration = time.monotonic() - started
    cluster.stop_all()

    final_seq, state = final_state(cluster, store, agent)
    names = [name for name, _ in agent_class.plan]
    # The world: each effect of each step called exactly once.
    calls = calls_by_effect(tool)
    assert calls == Counter({(seq, name): 1 for seq in range(1, final_seq + 1) for name in names})
    assert_stable_keys(tool)
    # The runtime: no effect started twice, none replayed or reported interrupted.
    runs = EffectRuns(history(cluster), tool)
    assert all(len(starts) == 1 for starts in runs.starts.values()), runs.starts
    assert [o for ops in runs.outcomes.values() for o in ops if o.outcome != "ok"] == []
    # The agent: every step ran once, every effect gave it a result.
    saw = lines(tmp_path / "saw.jsonl")
    assert sorted((s["seq"], s["name"]) for s in saw) == sorted(calls), saw
    assert all(s["saw"] == "result" and s["value"]["n"] == 1 for s in saw), saw
    journal = lines(Path(cluster.env["HB_TEST_JOURNAL"]))
    assert sorted(line["seq"] for line in journal) == list(range(1, final_seq + 1)), journal
    assert (state["count"], state["interrupted"]) == (final_seq, []), state
    assert_published_run_saw_recorded_outcomes(state, runs, agent_class.plan, final_seq)
    # Each stop handed the lease over at once (released, not expired).
    acquired = [
        (e.epoch, e.detail.get("via"))
        for e in store.read_events(agent)
        if e.type == "lease.acquired"
    ]
    assert sorted(acquired) == [(1, "empty")] + [(e + 1, "released") for _, e, _ in stopped], (
        acquired
    )
    slowest = max(s for _, _, s in stopped)
    print(
        f"effect SIGTERM loop: {len(stopped)} SIGTERMs in {duration:.1f} s (slowest exit "
        f"{slowest:.2f} s); {final_seq} steps, {sum(calls.values())} tool calls, none repeated"
    )


# -- 4. pauses past the renew deadline -------------------------------------------


def test_a_leader_paused_past_its_renew_deadline_mid_effect_repeats_no_completed_effect(
    local_cluster: MakeCluster, tool: ToolServer, tmp_path: Path
) -> None:
    """SIGSTOP of the leader mid-step for 0.75 TTL, three times: past its renew deadline, so
    the sync step is abandoned, yet its renewal succeeds and it retries the step beside the
    abandoned one, which runs on in its thread and must start no more effects."""
    rng = seeded("effect pause")
    agent, ttl_ms = "effects-sync", 2000
    cluster = local_cluster(
        agent="hb_test_agents:SyncEffectsAgent",
        timing=LeaseTiming(200, ttl_ms),
        env=effects_env(tool, tmp_path, HB_TEST_TOOL_DELAY_S="0.1"),
    )
    cluster.start(A)  # alone: no standby to take over, the renewal after the pause succeeds
    store = open_store(cluster.store_url)
    assert cluster.store_url.startswith("file://")

    def yields() -> int:
        return sum(e.type == "agent.yielded" for e in store.read_events(agent))

    def more_yields(than: int) -> bool:
        return yields() > than

    def published_past(seq: int) -> bool:
        return latest(store, agent)[0] > seq

    # Three pauses that made node-a give a step up. Whether one does depends on whether
    # its renewal or its step's deadline runs first once it is continued, so a pause
    # that did not is tried again (at most ten pauses in all).
    pauses = 0
    while yields() < 3:
        assert pauses < 10, f"only {yields()} of {pauses} pauses made node-a give a step up"
        pauses += 1
        seq = latest(store, agent)[0]
        wait_until(quietly(partial(published_past, seq)), f"pause {pauses}: a new step")
        time.sleep(rng.uniform(0.0, 0.2))  # a random moment of the step: the fault itself
        before = yields()
        pause_outside_lock(cluster, A.node)
        time.sleep(0.75 * ttl_ms / 1000)  # the pause itself is the fault
        cluster.signal(A.node, signal.SIGCONT)
        # Given up, or stepping on: either way the pause is over.
        wait_until(
            quietly(lambda: more_yields(before) or published_past(seq + 1)),  # noqa: B023
            f"pause {pauses}: node-a to give the step up or step on",
        )
    wait_until(quietly(partial(published_past, latest(store, agent)[0] + 1)), "node-a to step on")
    cluster.stop_all()

    final_seq, state = final_state(cluster, store, agent)
    runs = EffectRuns(history(cluster), tool)
    runs.assert_tool_calls_were_started()
    runs.assert_completed_never_called_again()
    runs.assert_interrupted_at_most_once()
    assert check(history(cluster)) == []  # hamsterbunker.ops.checker's rules, effects included
    assert_stable_keys(tool)
    saw = lines(tmp_path / "saw.jsonl")
    assert_agent_saw_one_outcome_per_effect(saw, given_up(store, agent))
    assert_published_run_saw_recorded_outcomes(state, runs, SyncEffectsAgent.plan, final_seq)
    # A yield repeats at most the effect in flight (its call was cut short): one per pause.
    reruns = runs.safe_reruns()
    assert len(reruns) <= pauses, reruns
    assert state["count"] == final_seq, state
    assert all(lease.epoch == 1 for lease in [store.read_lease(agent)] if lease), "took over"
    print(
        f"effect pause: {pauses} pauses of 0.75 TTL; {final_seq} steps, {yields()} yields, "
        f"{len(reruns)} safe effects ran again, "
        f"{sum(s['saw'] == 'interrupted' for s in saw)} reported interrupted"
    )


# -- 5. a zombie leader's effect record ------------------------------------------


def pause(cluster: LocalCluster, node: str, agent: str) -> None:
    """SIGSTOP node; on the file store outside its store lock (a node paused holding it
    would hold up every other node, a stated limit of the file store)."""
    if cluster.store_url.startswith("file://"):
        pause_outside_lock(cluster, node)
        return
    cluster.signal(node, signal.SIGSTOP)
    wait_until(lambda: process_state(cluster.pid(node)) == "T", f"{node} to stop")


@pytest.mark.parametrize("backend", ["file", "redis", "etcd"])
def test_a_zombie_leaders_effect_outcome_is_fenced_by_the_store(
    local_cluster: MakeCluster, tool: ToolServer, tmp_path: Path, backend: str
) -> None:
    """node-a is paused (SIGSTOP) while the tool holds an effect's call of step 2; node-b
    takes over and replays the step, calling it again; node-a, continued, gets its answer
    and records no outcome under its old epoch: it gives the step up first, or the store
    refuses the write (the store's fence on effect records is in the contract tests).

    A sync step: its effect's record is written by a task of its own, which goes on
    although node-a, continued, gives the step up at once (its renew deadline long past)."""
    agent, plan = "effects-sync", SyncEffectsAgent.plan
    target = plan[0][0]  # lookup (safe), the first effect of step 2
    cluster = local_cluster(
        agent="hb_test_agents:SyncEffectsAgent",
        timing=FAST,
        store_url=url_of(backend),
        env=effects_env(tool, tmp_path),
    )
    store = open_store(cluster.store_url)
    tool.hold(node=A.node, seq=KILLED_SEQ, name=target)
    standby = cluster.start(B, extra_env={"HB_FAILPOINTS": "node.before_first_tick=stop"})
    cluster.start(A)
    wait_until(
        quietly(lambda: (lease := lease_of(store, agent)) and lease.holder == A.node),
        "node-a to take the lease",
    )
    wait_until(lambda: process_state(standby.pid) == "T", "node-b to line up")
    standby.send_signal(signal.SIGCONT)
    wait_until(lambda: calls_by_effect(tool)[(KILLED_SEQ, target)], "node-a to call the tool")
    pause(cluster, A.node, agent)
    wait_until(
        quietly(lambda: (at := latest(store, agent))[0] > KILLED_SEQ and at[1] >= 2),
        "node-b to take over and publish past the step node-a is paused in",
    )
    tool.release()  # the answer waits in node-a's socket
    cluster.signal(A.node, signal.SIGCONT)
    ended = wait_until(
        quietly(
            lambda: [
                e
                for e in store.read_events(agent)
                if e.node == A.node and e.type in ("node.fenced", "lease.lost")
            ]
        ),
        "node-a to be fenced or to see its lease lost",
    )
    wait_until(
        quietly(lambda: any(b.node == A.node and b.role == "standby"
                            for b in store.list_heartbeats(agent))),
        "node-a to stand by",
    )  # fmt: skip
    seq = latest(store, agent)[0]
    wait_until(quietly(lambda: latest(store, agent)[0] >= seq + 2), "node-b to step on")
    cluster.stop_all()

    final_seq, state = final_state(cluster, store, agent)
    ops = history(cluster)
    # node-a's record of the effect was refused: no outcome of it under epoch 1, and
    # node-a published nothing of step 2 or later.
    zombie = [o for o in ops if o.node == A.node and o.seq >= KILLED_SEQ]
    assert [o for o in zombie if o.op in ("effect", "publish")] == [], zombie
    assert [(o.seq, o.detail["index"]) for o in zombie if o.op == "effect_start"] == [
        (KILLED_SEQ, 0)
    ], zombie
    # node-a, continued, gives the step up before it records the outcome; had its write
    # gone out first, the store would have refused it, and node-a would have said so.
    refused = [o for o in zombie if o.op == "effect_record"]
    assert all(o.outcome == "fenced" for o in refused), zombie
    if refused:
        assert any(
            e.node == A.node and e.type == "node.fenced" and e.detail.get("step_seq") == KILLED_SEQ
            for e in store.read_events(agent)
        )
    # The world: the effect node-a left in flight ran again on node-b; nothing else twice.
    names = [name for name, _ in plan]
    calls = calls_by_effect(tool)
    expected = {(s, name): 1 for s in range(1, final_seq + 1) for name in names}
    expected[(KILLED_SEQ, target)] = 2
    assert dict(calls) == expected, sorted(calls.items())
    runs = EffectRuns(ops, tool)
    assert_published_run_saw_recorded_outcomes(state, runs, plan, final_seq)
    assert state["count"] == final_seq and state["interrupted"] == [], state
    print(f"zombie ({backend}): node-a ended its term with {sorted({e.type for e in ended})}")


# -- 6. a step that outlives the stop grace ----------------------------------------


def test_a_step_outliving_the_stop_grace_is_given_up_and_its_interrupted_effect_reported(
    local_cluster: MakeCluster, tool: ToolServer, tmp_path: Path
) -> None:
    """SIGTERM while the tool holds an interrupted effect's call past the stop grace
    (--stop-grace-ms 300): node-a gives the step up, publishes nothing of it and hands
    over at once; node-b's replay reuses the completed effect and reports the one in
    flight interrupted, without calling it again."""
    agent, grace_ms = "effects", 300
    cluster = local_cluster(
        agent="hb_test_agents:EffectsAgent",
        timing=LeaseTiming(100, 3000),  # a handover on SIGTERM must not wait for the TTL
        env=effects_env(tool, tmp_path),
    )
    store = open_store(cluster.store_url)
    tool.hold(node=A.node, seq=KILLED_SEQ, name="charge")
    # The process started is the node: sh execs it with the flag appended.
    with_grace = ["sh", "-c", f'exec "$@" --stop-grace-ms {grace_ms}', "sh"]
    standby = cluster.start(B, extra_env={"HB_FAILPOINTS": "node.before_first_tick=stop"})
    leader = cluster.start(A, command_prefix=with_grace)
    wait_until(
        quietly(lambda: (lease := lease_of(store, agent)) and lease.holder == A.node),
        "node-a to take the lease",
    )
    wait_until(lambda: process_state(standby.pid) == "T", "node-b to line up")
    standby.send_signal(signal.SIGCONT)
    wait_until(lambda: calls_by_effect(tool)[(KILLED_SEQ, "charge")], "node-a to call charge")
    sent = time.monotonic()
    leader.send_signal(signal.SIGTERM)
    code = exited(leader, "node-a to stop", timeout=20)
    took = time.monotonic() - sent
    tool.release()  # its answer goes nowhere: node-a is gone
    assert code == 0, cluster.log(A.node)
    assert took < 5.0, f"node-a took {took:.1f} s to stop with a grace of {grace_ms} ms"
    wait_until(
        quietly(lambda: (at := latest(store, agent))[0] > KILLED_SEQ + 1 and at[1] >= 2),
        "node-b to take over and step on",
    )
    cluster.stop_all()

    final_seq, state = final_state(cluster, store, agent)
    acquired = [(e.epoch, e.detail.get("via")) for e in store.read_events(agent)
                if e.type == "lease.acquired"]  # fmt: skip
    assert acquired == [(1, "empty"), (2, "released")], acquired
    ops = history(cluster)
    assert [o.seq for o in ops if o.node == A.node and o.op == "publish"] == [1], ops
    names = [name for name, _ in PLAN]
    calls = calls_by_effect(tool)
    assert calls == Counter({(s, name): 1 for s in range(1, final_seq + 1) for name in names})
    saw = lines(tmp_path / "saw.jsonl")
    by_b = {s["name"]: s["saw"] for s in saw if s["node"] == B.node and s["seq"] == KILLED_SEQ}
    assert by_b == {"fetch": "result", "charge": "interrupted", "notify": "result"}, saw
    assert state["interrupted"] == [[KILLED_SEQ, "charge"]], state
    runs = EffectRuns(ops, tool)
    assert_published_run_saw_recorded_outcomes(state, runs, PLAN, final_seq)
    print(f"stop grace {grace_ms} ms: node-a stopped in {took:.2f} s, step {KILLED_SEQ} given up")
