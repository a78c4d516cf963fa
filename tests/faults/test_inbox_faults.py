"""The inbox under process faults: real nodes, real submitters, SIGKILLs and SIGTERMs.

DESIGN.md invariant 9: work handed in is admitted once and processed once.
The test agent (``InboxAnswerer`` in tests/support/hb_inbox_agents.py) waits
in ``wait_for_inbox``, consumes every submission it is shown with a reply that
depends on the payload and names the node that made it, and counts each
request id in its state; it appends what each step was shown and consumed to
a file, so what the runtime showed is known from outside. Every node records
its operations (``--history``); the history checker holds them to its rules,
the inbox's (a submission consumed by one accepted checkpoint at most) among
them.

1. The soak, per backend: 1,000 submissions from four client threads (each
   with a Client of its own), a third of them submitted again under the same
   request id (at once, later, after the next fault, or by another thread at
   about the same time), while the active node is SIGKILLed 10 times and
   SIGTERMed 5 times (each one restarted; three nodes). Every request id is
   admitted once, consumed once (the final checkpoint's counts), its reply read
   back by ``result()``, nothing lost, the history clean.
2. The leader is killed between consuming and its checkpoint (``inbox.before_commit``,
   ``inbox.after_commit``; on the file store also inside that checkpoint's
   commit, before its lock and with its redo log durable:
   ``inbox.commit.file_backend.commit.*``): all or nothing. Killed before the
   commit point, the next leader's replay consumes them and the replies are
   its own; after it, nothing shows them again and the replies are the killed
   node's.
3. A submitter is killed between admission steps (``inbox.submit.after_admit``
   on every backend; on the file store also inside the admission's commit,
   ``inbox.admit.file_backend.commit.*``): a retry of its request id is
   admitted once in all (a duplicate exactly when the first admission had
   landed), the agent answers it once, and the next submission is admitted
   after it.

Randomness comes from ``random.Random(seed)``; the seed is printed, and
``HB_TEST_SEED=<seed>`` replays a failed run's choices.

In the slow tier (``make test-all``). The backend half, racing admissions,
all-or-nothing consumption and fencing, is proved on every backend by
tests/stores/contract/test_inbox.py; the term's inbox in-process by
tests/node/test_inbox.py, in the fast tier.
"""

from __future__ import annotations

import json
import os
import random
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import pytest

from hamsterbunker import Client
from hamsterbunker.agent.inbox import Admission
from hamsterbunker.core.errors import InboxFull, StoreError
from hamsterbunker.core.history import Op, read_history
from hamsterbunker.core.timing import LeaseTiming
from hamsterbunker.ops.checker import check
from hamsterbunker.ops.local import LocalCluster, NodeSpec
from hamsterbunker.records import LeaseRecord
from hamsterbunker.sealing import Sealer
from hamsterbunker.stores import Store, open_store
from tests.support import pause_outside_lock, process_state, wait_until
from tests.support.etcd_server import etcd_url
from tests.support.hb_inbox_agents import InboxAnswerer, answer
from tests.support.redis_server import redis_url

pytestmark = [pytest.mark.fault, pytest.mark.multiprocess]

A, B, C = (
    NodeSpec("node-a", "eu-central"),
    NodeSpec("node-b", "us-east"),
    NodeSpec("node-c", "ap-south"),
)
SPECS = {spec.node: spec for spec in (A, B, C)}
AGENT = InboxAnswerer.id
AGENT_REF = "hb_inbox_agents:InboxAnswerer"
FAST = LeaseTiming(100, 800)  # tick 100 ms, TTL 800 ms (renew deadline 480 ms)
# Where the leader is paused while submissions go in: its renew deadline (1.2 s) must
# outlast the pause on a loaded machine.
PATIENT = LeaseTiming(100, 2000)
RESULT_S = 60.0  # a reply, once its submission is in and a leader is (or will be) up
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


def seeded(test: str) -> random.Random:
    """A Random for this test; its seed is printed (shown by pytest when the test fails)."""
    seed = int(os.environ.get("HB_TEST_SEED") or secrets.randbits(32))
    print(f"{test}: random seed {seed} (replay with HB_TEST_SEED={seed})")
    return random.Random(seed)


def quietly(probe: Callable[[], T]) -> Callable[[], T | None]:
    """probe, as None while the store answers with an error (a record mid-write)."""

    def probed() -> T | None:
        try:
            return probe()
        except StoreError:
            return None

    return probed


def answerer(
    local_cluster: MakeCluster, tmp_path: Path, backend: str, **kwargs: Any
) -> LocalCluster:
    env = {"HB_TEST_INBOX_LOG": str(tmp_path / "inbox.jsonl"), "HB_TEST_INBOX_WAIT_S": "0.3"}
    return local_cluster(agent=AGENT_REF, store_url=url_of(backend), env=env, **kwargs)


def latest(store: Store) -> tuple[int, int]:
    """(seq, epoch) of the newest checkpoint, (0, 0) without one."""
    checkpoints = store.list_checkpoints(AGENT)
    return (checkpoints[0].seq, checkpoints[0].epoch) if checkpoints else (0, 0)


def final_checkpoint(
    cluster: LocalCluster, store: Store
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The newest checkpoint's state and inbox marks, opened with the cluster's secret."""
    record = store.read_cluster()
    assert record is not None
    info = store.list_checkpoints(AGENT)[0]
    return Sealer(cluster.secret, record).open_checkpoint(
        store.read_checkpoint(AGENT, info), AGENT, info.epoch, info.seq
    )


def steps_log(tmp_path: Path) -> list[dict[str, Any]]:
    """What each step of the agent was shown and consumed (a torn last line from a kill
    skipped)."""
    found = []
    path = tmp_path / "inbox.jsonl"
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


def consumed_by_publishes(ops: list[Op]) -> dict[str, list[int]]:
    """The numbers each node's accepted publishes consumed, by node."""
    by: dict[str, list[int]] = defaultdict(list)
    for op in ops:
        if op.op == "publish" and op.outcome == "ok":
            by[op.node] += op.detail.get("consumed", [])
    return by


def exited(process: subprocess.Popen[bytes], what: str, timeout: float = 30) -> int:
    wait_until(lambda: process.poll() is not None, what, timeout=timeout)
    code = process.returncode
    assert code is not None
    return code


def publishing_term(store: Store, after_epoch: int) -> LeaseRecord | None:
    """The lease, once its holder has published a checkpoint in an epoch above after_epoch."""
    lease = store.read_lease(AGENT)
    if lease is None or lease.holder is None or lease.epoch <= after_epoch:
        return None
    seq, epoch = latest(store)
    return lease if seq and epoch == lease.epoch else None


def holds_lease(store: Store, node: str) -> bool:
    lease = store.read_lease(AGENT)
    return lease is not None and lease.holder == node


def pause(cluster: LocalCluster, node: str) -> None:
    """SIGSTOP node; on the file store outside its store lock (a node paused holding it
    would hold up every other writer, a stated limit of the file store)."""
    if cluster.store_url.startswith("file://"):
        pause_outside_lock(cluster, node)
        return
    cluster.signal(node, signal.SIGSTOP)
    wait_until(lambda: process_state(cluster.pid(node)) == "T", f"{node} to stop")


def redo_log_left(cluster: LocalCluster) -> bool:
    """Whether the file store holds a redo log: a commit a crash cut short after the log
    was durable, which the next writer finishes (``stores.backends.file_tree``)."""
    log = Path(cluster.store_url.removeprefix("file://")) / ".redo"
    return log.exists() and log.stat().st_size > 0  # the file stays, emptied, between commits


def reply_of(payload: Any, node: str, number: int) -> dict[str, Any]:
    """The reply InboxAnswerer gives payload, admitted as number, on node."""
    return {"answer": answer(payload), "node": node, "number": number}


# -- 1. the soak -----------------------------------------------------------------

SUBMISSIONS = 1000
THREADS = 4
KILLS, TERMS = 10, 5
CHUNKS = KILLS + TERMS + 1  # each thread submits a chunk of its share between two faults
# How a request id is submitted again (a third of them are): by its own thread at once,
# after its chunk, after the next fault; or by the next thread, at about the same time.
AGAIN = ("at_once", "later", "after_fault", "racing")
SUBMIT_PHASE_S = 240.0
RESULTS_PHASE_S = 120.0


@dataclass(frozen=True)
class Entry:
    """One submit call a thread makes: its request id's first, or one again."""

    rid: str
    payload: dict[str, Any]
    first: bool  # the owning thread's first submit of rid
    again: str | None  # how it is submitted again, for a first entry


@dataclass
class Plan:
    """Who submits what: per thread, its chunks of entries in order."""

    payloads: dict[str, dict[str, Any]]  # rid -> the payload of its first submit
    again: dict[str, str | None]
    chunks: list[list[list[Entry]]]  # thread -> chunk -> entries

    @classmethod
    def make(cls, rng: random.Random) -> Plan:
        rids = [f"req-{i:04d}-{rng.randrange(16**6):06x}" for i in range(SUBMISSIONS)]
        payloads = {rid: {"i": i, "words": rng.choice(["ask", "tell", "why", "how"]) * rng.randint(1, 5)}
                    for i, rid in enumerate(rids)}  # fmt: skip
        retried = set(rng.sample(rids, SUBMISSIONS // 3))
        again = {rid: (rng.choice(AGAIN) if rid in retried else None) for rid in rids}
        chunks: list[list[list[Entry]]] = [[[] for _ in range(CHUNKS)] for _ in range(THREADS)]
        per_chunk = -(-SUBMISSIONS // (THREADS * CHUNKS))
        for i, rid in enumerate(rids):
            thread, chunk = i % THREADS, min(i // (THREADS * per_chunk), CHUNKS - 1)
            chunks[thread][chunk].append(Entry(rid, payloads[rid], True, again[rid]))
            if again[rid] == "racing":  # the next thread, at about the same point
                chunks[(thread + 1) % THREADS][chunk].append(Entry(rid, payloads[rid], False, None))
        return cls(payloads, again, chunks)


def again_payload(payload: dict[str, Any]) -> dict[str, Any]:
    """What a submit of a request id again carries: different, so that a duplicate that
    replaced the first payload would show in the reply."""
    return {**payload, "again": True}


class Progress:
    """Faults done and request ids submitted, shared by the fault loop and the submitters."""

    def __init__(self) -> None:
        self.changed = threading.Condition()
        self.faults = 0
        self.admitted = 0  # request ids submitted (first submits by their own thread)
        self.errors: list[BaseException] = []

    def bump(self, *, fault: bool) -> None:
        with self.changed:
            if fault:
                self.faults += 1
            else:
                self.admitted += 1
            self.changed.notify_all()

    def fail(self, error: BaseException) -> None:
        with self.changed:
            self.errors.append(error)
            self.changed.notify_all()

    def wait(self, probe: Callable[[], bool], what: str, deadline: float) -> bool:
        """Wait until probe() (False if some thread failed); AssertionError past deadline."""
        with self.changed:
            while not probe():
                if self.errors:
                    return False
                left = deadline - time.monotonic()
                assert left > 0, f"timed out waiting for {what}"
                self.changed.wait(min(left, 1.0))
            return True


@dataclass
class Submitted:
    """What one thread's submit calls returned: (rid, first?, Admission) in call order."""

    calls: list[tuple[str, bool, Admission]] = field(default_factory=list)
    results: dict[str, Any] = field(default_factory=dict)


def submitter(
    url: str, secret: str, plan: Plan, thread: int, progress: Progress, out: Submitted,
    deadline: float,
) -> None:  # fmt: skip
    """One client thread: its chunks, each once the fault before it is done."""
    try:
        with Client(url, secret) as client:

            def submit(entry: Entry, *, again: bool) -> None:
                payload = again_payload(entry.payload) if again else entry.payload
                admission = client.submit(AGENT, payload, request_id=entry.rid)
                out.calls.append((entry.rid, entry.first and not again, admission))
                if entry.first and not again:
                    progress.bump(fault=False)

            after_fault: list[Entry] = []
            for k, chunk in enumerate(plan.chunks[thread]):
                if not progress.wait(lambda k=k: progress.faults >= k, f"fault {k}", deadline):  # type: ignore[misc]
                    return
                for entry in after_fault:
                    submit(entry, again=True)
                after_fault, later = [], []
                for entry in chunk:
                    submit(entry, again=False)
                    if entry.again == "at_once":
                        submit(entry, again=True)
                    elif entry.again == "later":
                        later.append(entry)
                    elif entry.again == "after_fault":
                        after_fault.append(entry)
                for entry in later:
                    submit(entry, again=True)
            for entry in after_fault:  # the last chunk's: after the last fault
                submit(entry, again=True)
            # The reply to each of this thread's own request ids (the racing ones' too).
            results_deadline = time.monotonic() + RESULTS_PHASE_S
            for rid in dict.fromkeys(rid for rid, first, _ in out.calls if first):
                left = results_deadline - time.monotonic()
                assert left > 0, "the results phase ran out of time"
                out.results[rid] = client.result(AGENT, rid, timeout=left)
    except BaseException as exc:  # handed to the test's thread
        progress.fail(exc)


@pytest.mark.parametrize("backend", ["file", "redis", "etcd"])
def test_soak_every_submission_admitted_once_consumed_once_and_answered_across_faults(
    local_cluster: MakeCluster, tmp_path: Path, backend: str
) -> None:
    """1,000 submissions (a third of them again) from four client threads while the active
    node is SIGKILLed 10 times and SIGTERMed 5 times."""
    rng = seeded(f"inbox soak ({backend})")
    plan = Plan.make(rng)
    faults = ["kill"] * KILLS + ["term"] * TERMS
    rng.shuffle(faults)
    cluster = answerer(local_cluster, tmp_path, backend, timing=FAST)
    for spec in (A, B, C):
        cluster.start(spec)
    store = open_store(cluster.store_url)
    wait_until(quietly(partial(publishing_term, store, 0)), "a first leader to publish")

    started = time.monotonic()
    submit_deadline = started + SUBMIT_PHASE_S
    progress = Progress()
    outs = [Submitted() for _ in range(THREADS)]
    threads = [
        threading.Thread(
            target=submitter,
            args=(cluster.store_url, cluster.secret, plan, t, progress, outs[t]),
            kwargs={"deadline": submit_deadline},
            name=f"submitter-{t}",
            daemon=True,
        )
        for t in range(THREADS)
    ]
    for thread in threads:
        thread.start()

    firsts = [sum(e.first for chunks in plan.chunks for e in chunks[k]) for k in range(CHUNKS)]
    epoch, done = 0, []  # (fault, node, epoch, exit code)
    took: list[float] = []  # seconds from each fault to the next
    at = started
    try:
        for j, fault in enumerate(faults):
            # Each fault lands while the threads submit a chunk and the leader consumes:
            # once a random part of the chunk after the last fault is in, and a leader
            # since that fault has published.
            part = sum(firsts[:j]) + round(rng.uniform(0.2, 0.8) * firsts[j])
            if not progress.wait(lambda part=part: progress.admitted >= part,  # type: ignore[misc]
                                 f"{part} admissions", submit_deadline):  # fmt: skip
                break
            lease = wait_until(
                quietly(partial(publishing_term, store, epoch)),
                f"a leader above epoch {epoch} to publish",
            )
            node = lease.holder
            assert node is not None
            if fault == "kill":
                cluster.kill(node)
                code = cluster.processes[node].returncode
                assert code == -signal.SIGKILL, (node, code)
            else:
                cluster.signal(node, signal.SIGTERM)
                code = exited(cluster.processes[node], f"{node} to stop", timeout=20)
                assert code == 0, f"{node} exited with {code}:\n{cluster.log(node)}"
            done.append((fault, node, lease.epoch, code))
            took.append(time.monotonic() - at)
            at = time.monotonic()
            epoch = lease.epoch
            cluster.start(SPECS[node])  # back, as a standby
            progress.bump(fault=True)
        faulted = time.monotonic()
        for thread in threads:
            thread.join(timeout=max(0.0, submit_deadline + RESULTS_PHASE_S - time.monotonic()))
    finally:
        if len(done) < len(faults) or any(t.is_alive() for t in threads):
            progress.fail(AssertionError("the test gave up"))  # the threads stop waiting
    # 1,000 admissions never exceed the inbox's limit of 1,000: InboxFull is the test's bug.
    assert not [e for e in progress.errors if isinstance(e, InboxFull)], progress.errors
    assert progress.errors == [], progress.errors
    assert not any(t.is_alive() for t in threads), "a submitter did not finish in time"
    answered = time.monotonic()
    cluster.stop_all()

    # Admitted once: all submits of a request id got its one number, exactly one of them
    # a fresh admission; a thread's submit again after its own first is a duplicate.
    calls = [call for out in outs for call in out.calls]
    by_rid: dict[str, list[tuple[bool, Admission]]] = defaultdict(list)
    for rid, first, admission in calls:
        assert admission.request_id == rid, admission
        by_rid[rid].append((first, admission))
    assert sorted(by_rid) == sorted(plan.payloads), "a request id was never submitted"
    number_of = {}
    for rid, admissions in by_rid.items():
        numbers = {a.number for _, a in admissions}
        assert len(numbers) == 1, (rid, admissions)
        assert sum(not a.duplicate for _, a in admissions) == 1, (rid, admissions)
        if plan.again[rid] != "racing":  # else the other thread may have been first
            assert [a.duplicate for _, a in admissions] == [False] + [True] * (len(admissions) - 1)
        number_of[rid] = numbers.pop()
    assert sorted(number_of.values()) == list(range(1, SUBMISSIONS + 1)), "a number was skipped"
    retries = Counter(plan.again[rid] for rid in by_rid if plan.again[rid])
    assert len(calls) == SUBMISSIONS + sum(retries.values())

    # Answered: every result() is the reply to the first payload, by some node.
    results = {rid: reply for out in outs for rid, reply in out.results.items()}
    assert sorted(results) == sorted(plan.payloads)
    by_node: Counter[str] = Counter()
    for rid, reply in results.items():
        assert reply == reply_of(plan.payloads[rid], reply["node"], number_of[rid]), (rid, reply)
        by_node[reply["node"]] += 1

    # Consumed once, nothing lost: the final checkpoint counts every request id once, and
    # its marks consume every number.
    state, marks = final_checkpoint(cluster, store)
    assert state["counts"] == dict.fromkeys(plan.payloads, 1), {
        rid: n for rid, n in state["counts"].items() if n != 1
    } or sorted(set(plan.payloads) - set(state["counts"]))
    assert state["consumed"] == SUBMISSIONS
    assert marks == {"through": SUBMISSIONS, "ranges": []}, marks

    # The histories: no violation (a submission consumed by two accepted checkpoints among
    # them), and no accepted publish consumed a number twice or one never admitted.
    ops = history(cluster)
    assert check(ops) == []
    in_publishes = [n for numbers in consumed_by_publishes(ops).values() for n in numbers]
    assert len(in_publishes) == len(set(in_publishes)) and set(in_publishes) <= set(
        range(1, SUBMISSIONS + 1)
    )
    # A consumption no publish records was made by the last steps of a killed node's term
    # (killed once its checkpoint was written, before its record): the next leader
    # restored it (on the file store, rolling the replies forward).
    killed_terms = {(node, epoch) for fault, node, epoch, _ in done if fault == "kill"}
    by_killed = {n for s in steps_log(tmp_path) if (s["node"], s["epoch"]) in killed_terms
                 for n in s["consumed"]}  # fmt: skip
    unrecorded = set(range(1, SUBMISSIONS + 1)) - set(in_publishes)
    assert unrecorded <= by_killed, sorted(unrecorded - by_killed)
    # A planned stop repeats nothing (DESIGN.md invariant 6): what a SIGTERMed node's
    # term consumed is never consumed again by a later term (a step given up and retried
    # within the term under load aside).
    terms_of: dict[int, set[tuple[int, str]]] = defaultdict(set)
    for s in steps_log(tmp_path):
        for n in s["consumed"]:
            terms_of[n].add((s["epoch"], s["node"]))
    stopped_terms = {(epoch, node) for fault, node, epoch, _ in done if fault == "term"}
    repeated_after_stop = {n: sorted(terms) for n, terms in terms_of.items()
                           if set(sorted(terms)[:-1]) & stopped_terms}  # fmt: skip
    assert repeated_after_stop == {}, repeated_after_stop
    replayed = sum(len(terms) > 1 for terms in terms_of.values())
    assert [f for f, *_ in done] == faults, done
    print(
        f"inbox soak ({backend}): {len(calls)} submits ({dict(retries)} again) with "
        f"{KILLS} SIGKILLs and {TERMS} SIGTERMs in {faulted - started:.1f} s, all answered "
        f"{answered - started:.1f} s in; replies by {dict(by_node)}; "
        f"{replayed} consumptions replayed after a kill, {len(unrecorded)} committed by "
        f"a killed node's unrecorded publish; the slowest "
        f"fault {max(took):.1f} s after the one before"
    )


# -- 2. the leader killed between consuming and its checkpoint ---------------------


@dataclass(frozen=True)
class CommitPoint:
    point: str
    committed: bool  # the checkpoint was durable at the kill: the consumption counts


COMMIT_POINTS = [
    CommitPoint("inbox.before_commit", committed=False),
    CommitPoint("inbox.after_commit", committed=True),
    # The file backend's commit of that checkpoint: its values durable under temporary
    # names, the lock not taken; its redo log durable, none of its writes made yet.
    CommitPoint("inbox.commit.file_backend.commit.before_lock", committed=False),
    CommitPoint("inbox.commit.file_backend.commit.after_log", committed=True),
]
COMMIT_CASES = [("file", p) for p in COMMIT_POINTS] + [
    (backend, p) for backend in ("redis", "etcd") for p in COMMIT_POINTS[:2]
]
BATCH = 3  # submitted while the leader is paused: usually consumed in one step


@pytest.mark.parametrize(
    ("backend", "point"),
    COMMIT_CASES,
    ids=[f"{b}-{p.point.removeprefix('inbox.')}" for b, p in COMMIT_CASES],
)
def test_a_leader_killed_between_consuming_and_its_checkpoint_commits_all_or_nothing(
    local_cluster: MakeCluster, tmp_path: Path, backend: str, point: CommitPoint
) -> None:
    """node-a consumes a warm-up submission (published), then a batch, and is killed at the
    failpoint of that second consuming publish; node-b takes over."""
    cluster = answerer(local_cluster, tmp_path, backend, timing=PATIENT)
    store = open_store(cluster.store_url)
    # node-b waits before its first look at the lease (stopped by a failpoint) until
    # node-a is dead: the store is then looked at as node-a left it.
    standby = cluster.start(B, extra_env={"HB_FAILPOINTS": "node.before_first_tick=stop"})
    leader = cluster.start(A, extra_env={"HB_FAILPOINTS": f"{point.point}=kill@2"})
    wait_until(quietly(partial(holds_lease, store, A.node)), "node-a to take the lease")
    wait_until(lambda: process_state(standby.pid) == "T", "node-b to line up")
    with Client(store, cluster.secret) as client:
        warm = client.submit(AGENT, {"warm": True}, request_id="warm")
        assert client.result(AGENT, "warm", timeout=RESULT_S) == reply_of(
            {"warm": True}, A.node, warm.number
        )
        # The batch goes in while node-a is paused, so that it sees all of it at once.
        pause(cluster, A.node)
        batch = {f"batch-{i}": {"question": i} for i in range(BATCH)}
        numbers = {rid: client.submit(AGENT, payload, request_id=rid).number
                   for rid, payload in batch.items()}  # fmt: skip
        cluster.signal(A.node, signal.SIGCONT)
        code = exited(leader, "node-a to be killed at its failpoint")
        assert code == -signal.SIGKILL, f"node-a exited with {code}:\n{cluster.log(A.node)}"

        # The step node-a was killed in: the last it logged with a consumption.
        killed = [s for s in steps_log(tmp_path) if s["node"] == A.node and s["consumed"]][-1]
        at_kill = set(killed["consumed"])
        assert at_kill <= set(numbers.values()), killed
        rid_of = {n: rid for rid, n in numbers.items()}
        if backend == "file":
            assert redo_log_left(cluster) == point.point.endswith(".after_log")
            open_store(cluster.store_url).close()  # a writer's open finishes that commit
            assert not redo_log_left(cluster)
        # As node-a left the store: all of its consumption committed, or none of it.
        for number in sorted(at_kill):
            admission = store.read_admission(AGENT, rid_of[number])
            assert admission is not None and admission.consumed is point.committed, (
                number,
                admission,
            )
        if point.committed:
            for number in at_kill:
                assert client.result(AGENT, rid_of[number], timeout=0.5) == reply_of(
                    batch[rid_of[number]], A.node, number
                )

        standby.send_signal(signal.SIGCONT)
        replies = {rid: client.result(AGENT, rid, timeout=RESULT_S) for rid in batch}
        after = client.submit(AGENT, {"after": True}, request_id="after")
        assert client.result(AGENT, "after", timeout=RESULT_S) == reply_of(
            {"after": True}, B.node, after.number
        )
    cluster.stop_all()

    # Each reply: node-a's where its checkpoint counted, node-b's where it did not.
    for rid, reply in replies.items():
        by = A.node if point.committed and numbers[rid] in at_kill else B.node
        assert reply == reply_of(batch[rid], by, numbers[rid]), (rid, reply, killed)
    # Shown again by node-b exactly when node-a's checkpoint did not count.
    shown_to_b = {n for s in steps_log(tmp_path) if s["node"] == B.node for n in s["shown"]}
    if point.committed:
        assert not shown_to_b & at_kill, (shown_to_b, at_kill)
    else:
        assert at_kill <= shown_to_b, (shown_to_b, at_kill)
    # Consumed once: in the final checkpoint, and by one accepted publish at most.
    state, marks = final_checkpoint(cluster, store)
    everything = ["warm", *batch, "after"]
    assert state["counts"] == dict.fromkeys(everything, 1), state
    assert marks == {"through": len(everything), "ranges": []}, marks
    ops = history(cluster)
    assert check(ops) == []
    published = consumed_by_publishes(ops)
    # node-a's consuming step at the kill is never recorded as published (killed before
    # its record); node-b's publishes consumed the rest of the batch, and the replay.
    assert published[A.node] == [warm.number], ops
    want_b = set(numbers.values()) - (at_kill if point.committed else set())
    assert sorted(published[B.node]) == sorted(want_b | {after.number}), ops
    print(f"{point.point} ({backend}): node-a consumed {sorted(at_kill)} of {BATCH} at the kill")


# -- 3. a submitter killed between admission steps -------------------------------------

SUBMITTER = """
import json, os, sys
from hamsterbunker import Client
with Client(os.environ["HB_TEST_STORE"], os.environ["HB_TEST_SECRET"]) as client:
    admission = client.submit(os.environ["HB_TEST_AGENT"], json.loads(os.environ["HB_TEST_PAYLOAD"]),
                              request_id=os.environ["HB_TEST_RID"])
print(admission)
"""


@dataclass(frozen=True)
class AdmitPoint:
    point: str
    landed: bool  # the admission was in the store at the kill


ADMIT_POINTS = [
    AdmitPoint("inbox.submit.after_admit", landed=True),
    # The file backend's commit of the admission: before its lock; its redo log durable.
    AdmitPoint("inbox.admit.file_backend.commit.before_lock", landed=False),
    AdmitPoint("inbox.admit.file_backend.commit.after_log", landed=True),
]
ADMIT_CASES = [("file", p) for p in ADMIT_POINTS] + [
    (backend, ADMIT_POINTS[0]) for backend in ("redis", "etcd")
]


@pytest.mark.parametrize(
    ("backend", "point"),
    ADMIT_CASES,
    ids=[f"{b}-{p.point.removeprefix('inbox.')}" for b, p in ADMIT_CASES],
)
def test_a_submitter_killed_between_admission_steps_is_admitted_once_on_retry(
    local_cluster: MakeCluster, tmp_path: Path, backend: str, point: AdmitPoint
) -> None:
    """A `python -c` submitter is SIGKILLed at the failpoint; the same request id submitted
    again is admitted once in all and answered once; the next submission goes in after it."""
    cluster = answerer(local_cluster, tmp_path, backend, timing=FAST)
    cluster.start(A)
    store = open_store(cluster.store_url)
    wait_until(quietly(partial(publishing_term, store, 0)), "node-a to publish")
    first, again = {"from": "the killed submitter"}, {"from": "its retry"}
    env = {
        **os.environ,
        "HB_FAILPOINTS": f"{point.point}=kill",
        "HB_TEST_STORE": cluster.store_url,
        "HB_TEST_SECRET": cluster.secret,
        "HB_TEST_AGENT": AGENT,
        "HB_TEST_PAYLOAD": json.dumps(first),
        "HB_TEST_RID": "handed-in",
    }
    child = subprocess.Popen([sys.executable, "-c", SUBMITTER], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    try:
        out, err = child.communicate(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(timeout=10)
    assert child.returncode == -signal.SIGKILL, (child.returncode, out, err)

    if backend == "file":
        open_store(cluster.store_url).close()  # a writer's open finishes a commit left
    with Client(store, cluster.secret) as client:
        left = store.read_admission(AGENT, "handed-in")
        assert (left is not None) is point.landed, left
        retry = client.submit(AGENT, again, request_id="handed-in")
        # A duplicate of the landed admission, else a fresh one under the same number.
        assert retry.duplicate is point.landed, retry
        assert retry.number == 1, retry
        again_again = client.submit(AGENT, {"from": "a third try"}, request_id="handed-in")
        assert (again_again.number, again_again.duplicate) == (retry.number, True)
        later = client.submit(AGENT, {"later": True}, request_id="later")
        assert (later.number, later.duplicate) == (retry.number + 1, False), later
        answered = first if point.landed else again
        assert client.result(AGENT, "handed-in", timeout=RESULT_S) == reply_of(
            answered, A.node, retry.number
        )
        assert client.result(AGENT, "later", timeout=RESULT_S) == reply_of(
            {"later": True}, A.node, later.number
        )
    cluster.stop_all()

    state, marks = final_checkpoint(cluster, store)
    assert state["counts"] == {"handed-in": 1, "later": 1}, state
    consumed = Counter(n for s in steps_log(tmp_path) for n in s["consumed"])
    assert consumed == Counter({retry.number: 1, later.number: 1}), consumed
    ops = history(cluster)
    assert check(ops) == []
    assert sorted(consumed_by_publishes(ops)[A.node]) == [retry.number, later.number]
    assert marks == {"through": later.number, "ranges": []}, marks
