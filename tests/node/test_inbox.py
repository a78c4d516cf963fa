"""The inbox in a running node (DESIGN.md invariant 9), in-process on a MemoryStore.

Submissions go in with ``Client``; an agent reads ``current_step().inbox``,
consumes with a reply, and ``Client.result`` reads it back. Consumption
commits with the step's checkpoint: a step that is cut off before its publish
is replayed by the next leader with the same submissions unconsumed. Process
kills on every backend are in tests/faults/test_inbox_faults.py.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest

from hamsterbunker import (
    Client,
    InboxError,
    LeaseTiming,
    Runtime,
    Submission,
    UnknownRequest,
    current_step,
)
from hamsterbunker.agent.inbox import ConsumedMarks, StepInbox
from hamsterbunker.core.errors import StoreUnavailable, Tampered
from hamsterbunker.core.limits import MAX_CONSUMED_PER_STEP, MAX_INBOX_GAPS, MAX_SUBMISSION_BYTES
from hamsterbunker.sealing import Sealer, new_cluster_record
from hamsterbunker.stores.backend import DeleteRange, Txn
from hamsterbunker.stores.layer.keys import AgentKeys
from hamsterbunker.testing import MemoryStore
from tests.support import wait_until
from tests.support.agents import AGENT, SECRET, Recorder
from tests.support.raw_inbox import plant_submissions

TIMING = LeaseTiming(tick_ms=50, lease_ttl_ms=300)
WAIT_S = 20.0


class Nodes:
    def __init__(self) -> None:
        self.store = MemoryStore()
        self.events = Recorder()
        self.made: list[Runtime] = []

    def start(self, node_id: str, agent: Any, timing: LeaseTiming = TIMING) -> Runtime:
        node = Runtime(node_id=node_id, region="r", store=self.store, agent=agent, secret=SECRET,
                       timing=timing, on_event=self.events, stop_grace_ms=0)  # fmt: skip
        self.made.append(node)
        node.start()
        return node

    def client(self) -> Client:
        return Client(self.store, SECRET)


@pytest.fixture
def nodes() -> Iterator[Nodes]:
    made = Nodes()
    yield made
    for node in made.made:
        node.stop()


class Answerer:
    """Waits for its inbox, answers each submission with its payload doubled, counts them.

    ``park_on`` (a node id): that node consumes, then never finishes the step.
    """

    id = AGENT

    def __init__(self, park_on: str | None = None, wait_s: float = 60.0) -> None:
        self.park_on, self.wait_s = park_on, wait_s
        self.parked = threading.Event()
        self.shown: list[tuple[str, int]] = []  # (node, number) every time a step saw one

    def init(self) -> dict[str, Any]:
        return {"answered": {}}

    async def step(self, state: dict[str, Any]) -> dict[str, Any]:
        ctx = current_step()
        assert ctx is not None
        for submission in await ctx.wait_for_inbox(self.wait_s):
            self.shown.append((ctx.node, submission.number))
            ctx.consume(submission.number, reply={"doubled": submission.payload * 2})
            count = state["answered"].get(submission.request_id, 0)
            state["answered"][submission.request_id] = count + 1
        if ctx.node == self.park_on and ctx.mailbox is not None and ctx.mailbox.consumed:
            self.parked.set()
            await _forever()
        return state


async def _forever() -> None:
    await asyncio.Event().wait()


def test_a_submission_is_answered_and_its_reply_read_back(nodes: Nodes) -> None:
    """submit -> the waiting step consumes it with a reply -> result() returns the reply; a
    second submit of the request id is a duplicate and is never processed again."""
    agent = Answerer()
    nodes.start("a", agent)
    with nodes.client() as client:
        admission = client.submit(AGENT, 21, request_id="q1")
        assert (admission.number, admission.request_id, admission.duplicate) == (1, "q1", False)
        assert client.result(AGENT, "q1", timeout=WAIT_S) == {"doubled": 42}
        again = client.submit(AGENT, 99, request_id="q1")
        assert (again.number, again.duplicate) == (1, True)
        second = client.submit(AGENT, 5)  # a generated request id
        assert second.number == 2 and not second.duplicate and second.request_id
        assert client.result(AGENT, second.request_id, timeout=WAIT_S) == {"doubled": 10}
    assert [number for _node, number in agent.shown] == [1, 2]
    consumed = nodes.events.wait("inbox.consumed", where=lambda e: 2 in e.detail["numbers"])
    assert consumed.detail["request_ids"] == [second.request_id]
    admitted = [e.detail["number"] for e in nodes.events.of("inbox.admitted")]
    assert admitted == [1, 2]


class SilentConsumer:
    """Consumes every submission without a reply."""

    id = AGENT

    def init(self) -> dict[str, Any]:
        return {}

    async def step(self, state: dict[str, Any]) -> dict[str, Any]:
        ctx = current_step()
        assert ctx is not None
        for submission in await ctx.wait_for_inbox(60):
            ctx.consume(submission.number)
        return state


def test_a_submission_consumed_without_a_reply_reads_as_done_with_none(nodes: Nodes) -> None:
    """consume() with no reply still stores a sealed reply (of None), which is what result()
    takes as done: it returns None, and a resubmit is a proven duplicate."""
    nodes.start("a", SilentConsumer())
    with nodes.client() as client:
        admission = client.submit(AGENT, 1, request_id="quiet")
        assert client.result(AGENT, "quiet", timeout=WAIT_S, number=admission.number) is None
        state = nodes.store.read_admission(AGENT, "quiet")
        assert state is not None and state.consumed and state.reply is not None
        assert client.submit(AGENT, 1, request_id="quiet").duplicate


def test_an_idle_agent_is_woken_by_a_submission(nodes: Nodes) -> None:
    """A step waiting in wait_for_inbox with a long timeout returns when a submission arrives,
    not when the timeout runs out: the reply comes long before it."""
    agent = Answerer(wait_s=600.0)
    nodes.start("a", agent)
    wait_until(lambda: nodes.events.of("agent.started"), "node a to start the agent")
    with nodes.client() as client:
        client.submit(AGENT, 1, request_id="wake")
        assert client.result(AGENT, "wake", timeout=WAIT_S) == {"doubled": 2}


def test_a_step_cut_off_before_its_checkpoint_is_replayed_with_the_same_submissions(
    nodes: Nodes,
) -> None:
    """Node a consumes #1 and dies before publishing: b's replay sees #1 unconsumed, answers
    it, and the reply comes from b. Once b's checkpoint is accepted, nothing shows it again."""
    agent = Answerer(park_on="a")
    nodes.start("a", agent)
    with nodes.client() as client:
        client.submit(AGENT, 4, request_id="q")
        wait_until(agent.parked.is_set, "node a to consume and park")
        assert client.store.read_admission(AGENT, "q").consumed is False  # type: ignore[union-attr]
        nodes.made[0].stop()
        nodes.start("b", agent)
        assert client.result(AGENT, "q", timeout=WAIT_S) == {"doubled": 8}
    assert agent.shown == [("a", 1), ("b", 1)]
    nodes.made[1].stop()
    nodes.start("c", agent)
    wait_until(lambda: nodes.events.of("agent.resumed", node="c"), "node c to resume")
    with nodes.client() as client:
        client.submit(AGENT, 1, request_id="after")
        client.result(AGENT, "after", timeout=WAIT_S)
    assert agent.shown == [("a", 1), ("b", 1), ("c", 2)]


def test_a_planted_submission_that_does_not_authenticate_is_rejected(nodes: Nodes) -> None:
    """A real sealed submission copied to another number, and one sealed with another
    secret, are reported (inbox.rejected) and never shown; the genuine one is answered."""
    agent = Answerer()
    with nodes.client() as client:
        client.submit(AGENT, 3, request_id="real")
        blob = nodes.store.read_inbox(AGENT)[0][1]
    nodes.store.admit(AGENT, "copy", 2, blob)  # sealed as #1, stored as #2
    other = MemoryStore()
    with Client(other, "another secret") as stranger:
        stranger.submit(AGENT, 7, request_id="stranger")
        nodes.store.admit(AGENT, "stranger", 3, other.read_inbox(AGENT)[0][1])
    nodes.start("a", agent)
    rejected = nodes.events.wait("inbox.rejected", where=lambda e: e.detail["number"] == 3)
    assert "authenticate" in rejected.detail["error"]
    with nodes.client() as client:
        assert client.result(AGENT, "real", timeout=WAIT_S) == {"doubled": 6}
    numbers = {e.detail["number"] for e in nodes.events.of("inbox.rejected")}
    assert numbers == {2, 3}
    # Only #1 was ever shown (again, if a loaded machine let the renew deadline pass
    # during its step: the step is retried).
    assert set(agent.shown) == {("a", 1)}


class Misuser:
    """Tries each wrong use of the inbox once, in one step, and records what it raised."""

    id = AGENT

    def __init__(self) -> None:
        self.errors: dict[str, str] = {}
        self.done = threading.Event()

    def init(self) -> dict[str, Any]:
        return {}

    async def step(self, state: dict[str, Any]) -> dict[str, Any]:
        ctx = current_step()
        assert ctx is not None
        shown = await ctx.wait_for_inbox(60)
        if len(shown) < MAX_CONSUMED_PER_STEP or self.done.is_set():
            return state
        tries: dict[str, Callable[[], None]] = {
            "unknown number": lambda: ctx.consume(10_000),
            "not json": lambda: ctx.consume(shown[0].number, reply={1, 2}),
            "twice": lambda: (ctx.consume(shown[0].number), ctx.consume(shown[0].number)),
            # Read by the node but not shown: the step has consumed all it may.
            "too many": lambda: [ctx.consume(s.number) for s in [*shown[1:], _after(shown)]],
        }
        for name, attempt in tries.items():
            try:
                attempt()
            except InboxError as exc:
                self.errors[name] = str(exc)
        self.done.set()
        return state


def _after(shown: list[Submission]) -> Submission:
    return Submission(shown[-1].number + 1, "", None)


def test_wrong_uses_of_the_inbox_raise_inbox_errors(nodes: Nodes) -> None:
    agent = Misuser()
    with nodes.client() as client:
        for n in range(MAX_CONSUMED_PER_STEP + 2):
            client.submit(AGENT, n)
    nodes.start("a", agent)
    wait_until(agent.done.is_set, "the step to try its wrong uses")
    assert "#10000 is not in this step's inbox" in agent.errors["unknown number"]
    assert "JSON" in agent.errors["not json"]
    assert "not in this step's inbox" in agent.errors["twice"]
    assert str(MAX_CONSUMED_PER_STEP) in agent.errors["too many"]


class SyncAnswerer:
    """A sync step: wait_for_inbox_sync from its thread, then consume."""

    id = AGENT

    def init(self) -> dict[str, Any]:
        return {}

    def step(self, state: dict[str, Any]) -> dict[str, Any]:
        ctx = current_step()
        assert ctx is not None
        for submission in ctx.wait_for_inbox_sync(60):
            ctx.consume(submission.number, reply=f"sync:{submission.payload}")
        return state


def test_a_sync_step_waits_for_and_answers_its_inbox(nodes: Nodes) -> None:
    nodes.start("a", SyncAnswerer())
    with nodes.client() as client:
        client.submit(AGENT, "hi", request_id="s")
        assert client.result(AGENT, "s", timeout=WAIT_S) == "sync:hi"


def test_submit_refuses_what_cannot_be_sent_and_admits_nothing() -> None:
    store = MemoryStore()
    with Client(store, SECRET) as client:
        with pytest.raises(InboxError, match="request id"):
            client.submit(AGENT, 1, request_id="no spaces")
        with pytest.raises(InboxError, match="JSON"):
            client.submit(AGENT, {1, 2})
        with pytest.raises(InboxError, match=f"above the limit of {MAX_SUBMISSION_BYTES}"):
            client.submit(AGENT, "x" * MAX_SUBMISSION_BYTES)
        assert store.read_inbox(AGENT) == []
        with pytest.raises(UnknownRequest):
            client.result(AGENT, "never")
        client.submit(AGENT, 1, request_id="waiting")
        with pytest.raises(TimeoutError, match="no reply"):
            client.result(AGENT, "waiting", timeout=0.2)


def test_two_clients_number_on_from_each_other() -> None:
    """A client that guessed a taken number is told the next one and admits there."""
    store = MemoryStore()
    with Client(store, SECRET) as first, Client(store, SECRET) as second:
        assert first.submit(AGENT, 1).number == 1
        assert second.submit(AGENT, 2).number == 2
        assert first.submit(AGENT, 3).number == 3


# -- sealing -------------------------------------------------------------------


@pytest.fixture
def sealer() -> Sealer:
    store = MemoryStore()
    with Client(store, SECRET):
        cluster = store.read_cluster()
    assert cluster is not None
    return Sealer(SECRET, cluster)


def test_a_submission_opens_only_as_its_own_number_and_agent(sealer: Sealer) -> None:
    blob = sealer.seal_submission(AGENT, 7, "r", {"x": 1}, 123.0)
    opened = sealer.open_submission(blob, AGENT, 7)
    assert (opened.request_id, opened.payload, opened.submitted) == ("r", {"x": 1}, 123.0)
    with pytest.raises(Tampered):
        sealer.open_submission(blob, AGENT, 8)
    with pytest.raises(Tampered):
        sealer.open_submission(blob, "other", 7)
    with pytest.raises(Tampered):
        sealer.open_submission(blob[:-1] + bytes([blob[-1] ^ 1]), AGENT, 7)


def test_a_reply_opens_only_as_its_own_request_and_number(sealer: Sealer) -> None:
    """A sealed reply opens only for its agent, number and request id together."""
    blob = sealer.seal_reply(AGENT, 7, "r", [1, 2])
    assert sealer.open_reply(blob, AGENT, 7, "r") == [1, 2]
    with pytest.raises(Tampered):
        sealer.open_reply(blob, AGENT, 7, "s")
    with pytest.raises(Tampered, match="#8"):
        sealer.open_reply(blob, AGENT, 8, "r")  # the request id, submitted again as #8
    with pytest.raises(Tampered):
        sealer.open_reply(blob, "other", 7, "r")
    with pytest.raises(Tampered):
        sealer.open_reply(sealer.seal_submission(AGENT, 7, "r", 1, 0.0), AGENT, 7, "r")


def test_consumed_marks_are_sealed_with_the_state(sealer: Sealer) -> None:
    """A checkpoint carries its marks authenticated; one without marks opens as before."""
    marks, _ = ConsumedMarks().adding([1, 2, 5])
    blob = sealer.seal(AGENT, 1, 3, {"n": 1}, inbox=marks.to_json())
    state, inbox = sealer.open_checkpoint(blob, AGENT, 1, 3)
    assert state == {"n": 1} and ConsumedMarks.from_json(inbox) == marks
    assert sealer.open(blob, AGENT, 1, 3) == {"n": 1}
    plain = sealer.seal(AGENT, 1, 4, {"inbox": 1})
    assert sealer.open_checkpoint(plain, AGENT, 1, 4) == ({"inbox": 1}, None)


# -- consumed marks ------------------------------------------------------------


def test_marks_fold_runs_into_the_consumed_prefix() -> None:
    marks, gaps = ConsumedMarks().adding([2, 3, 5])
    assert (marks.through, marks.ranges, gaps) == (0, ((2, 3), (5, 5)), [])
    assert 1 not in marks and 2 in marks and 4 not in marks and 5 in marks
    marks, _ = marks.adding([1])
    assert (marks.through, marks.ranges) == (3, ((5, 5),))
    marks, _ = marks.adding([4])
    assert (marks.through, marks.ranges) == (5, ())
    assert ConsumedMarks.from_json(marks.to_json()) == marks
    assert ConsumedMarks().to_json() is None


def test_marks_give_up_the_oldest_gap_past_their_bound() -> None:
    """Every other number consumed: past MAX_INBOX_GAPS runs, the oldest gap is given up."""
    numbers = range(2, 2 * (MAX_INBOX_GAPS + 1) + 1, 2)
    marks, gaps = ConsumedMarks().adding(numbers)
    assert len(marks.ranges) == MAX_INBOX_GAPS
    assert gaps == [(1, 1)] and marks.through == 2
    assert 3 not in marks


@pytest.mark.parametrize(
    "doc",
    [
        {"through": -1, "ranges": []},
        {"through": 0, "ranges": [[3, 2]]},
        {"through": 5, "ranges": [[4, 9]]},
        {"through": 0, "ranges": [[2, 3], [3, 4]]},
        {"through": True, "ranges": []},
        {"through": 0, "ranges": "x"},
    ],
)
def test_malformed_marks_are_refused(doc: dict[str, Any]) -> None:
    with pytest.raises(Tampered):
        ConsumedMarks.from_json(doc)


def test_a_submission_compares_by_number_request_and_payload() -> None:
    assert Submission(1, "r", 2, 10.0) == Submission(1, "r", 2, 99.0)


def _stop_while_a_step_waits(nodes: Nodes, timing: LeaseTiming, within_s: float) -> bool:
    """Start a node whose step waits in wait_for_inbox(600) with a 60 s stop grace, with a
    first submission waiting for it, then stop it while its next step waits: whether
    stop() returned within within_s having published the waiting step.

    The submission comes first: a step already waiting when it came would see it only
    at its next look, a tick later (and the tick may be long)."""
    agent = Answerer(wait_s=600.0)
    node = Runtime(node_id="a", region="r", store=nodes.store, agent=agent, secret=SECRET,
                   timing=timing, on_event=nodes.events, stop_grace_ms=60_000)  # fmt: skip
    nodes.made.append(node)
    with nodes.client() as client:
        client.submit(AGENT, 1, request_id="first")
        node.start()
        client.result(AGENT, "first", timeout=WAIT_S)  # the next step now waits, idle
    published = len(nodes.events.of("checkpoint.published"))
    stopping = threading.Thread(target=node.stop)
    stopping.start()
    stopping.join(within_s)
    return not stopping.is_alive() and len(nodes.events.of("checkpoint.published")) > published


def test_a_planned_stop_ends_a_wait_for_inbox_and_publishes_the_step(nodes: Nodes) -> None:
    """stop() ends the wait, publishes the step and hands over, instead of cancelling it
    at the stop grace."""
    assert _stop_while_a_step_waits(nodes, TIMING, within_s=WAIT_S)
    assert not nodes.events.of("agent.yielded")


def test_a_planned_stop_ends_a_wait_for_inbox_at_once_not_at_the_next_tick(
    nodes: Nodes,
) -> None:
    """With a 20 s tick and a store watch that never fires (it is only a hint: the stop's
    own event writes would otherwise wake the wait), a step waiting for work is told the
    term is ending (a stop, as a switchover does): stop() returns long before the tick."""

    class Unwatched(MemoryStore):
        async def watch(
            self, agent: str, *, lease_only: bool = False, terms_only: bool = False
        ) -> AsyncIterator[None]:
            await asyncio.Event().wait()
            yield None

    nodes.store = Unwatched()
    slow = LeaseTiming(tick_ms=20_000, lease_ttl_ms=60_000)
    assert _stop_while_a_step_waits(nodes, slow, within_s=5.0)


def test_junk_planted_ahead_of_the_counter_hides_no_later_submission(nodes: Nodes) -> None:
    """A planted entry far above the inbox's counter is rejected, and submissions admitted
    below it afterwards are still read and answered (the node never reads on past junk)."""
    agent = Answerer()
    plant_submissions(nodes.store, AGENT, [(500, b"not sealed")])
    nodes.start("a", agent)
    nodes.events.wait("inbox.rejected", where=lambda e: e.detail["number"] == 500)
    with nodes.client() as client:
        for n in (1, 2):
            client.submit(AGENT, n, request_id=f"after-junk-{n}")
            assert client.result(AGENT, f"after-junk-{n}", timeout=WAIT_S) == {"doubled": 2 * n}
    assert len(nodes.events.of("inbox.rejected")) == 1  # reported once, not at every look


class ReadmeLoop:
    """The README's inbox loop as written there; records how many each step was handed."""

    id = AGENT

    def __init__(self) -> None:
        self.handed: list[int] = []

    def init(self) -> dict[str, Any]:
        return {}

    async def step(self, state: dict[str, Any]) -> dict[str, Any]:
        ctx = current_step()
        assert ctx is not None
        handed = 0
        for question in await ctx.wait_for_inbox(timeout=30):
            ctx.consume(question.number, reply={"answer": question.payload})
            handed += 1
        self.handed.append(handed)
        return state


def test_the_readme_inbox_loop_drains_more_than_a_step_may_consume(nodes: Nodes) -> None:
    """With 100 submissions waiting, the README's loop answers all of them over several steps,
    each handed at most MAX_CONSUMED_PER_STEP, one step right after another (not a tick
    apart), and no step fails."""
    burst = 100
    with nodes.client() as client:
        for n in range(burst):
            client.submit(AGENT, n, request_id=f"burst-{n}")
    agent = ReadmeLoop()
    slow = LeaseTiming(tick_ms=5_000, lease_ttl_ms=20_000)
    nodes.start("a", agent, slow)
    with nodes.client() as client:
        assert client.result(AGENT, "burst-0", timeout=WAIT_S) == {"answer": 0}
        first = time.monotonic()
        for n in range(burst):
            assert client.result(AGENT, f"burst-{n}", timeout=WAIT_S) == {"answer": n}
        # Three more steps: a tick between steps would take three ticks.
        assert time.monotonic() - first < slow.tick_s
    assert not nodes.events.of("agent.failing")
    handed = [count for count in agent.handed if count]
    assert max(handed) == MAX_CONSUMED_PER_STEP and sum(handed) >= burst


class _Waiting:
    """An InboxIO whose inbox holds submissions 1..count and never changes."""

    def __init__(self, count: int) -> None:
        self.held = [Submission(n, f"r{n}", n) for n in range(1, count + 1)]

    def seal_reply(self, number: int, request_id: str, reply: Any) -> bytes:
        return b"sealed"

    async def unconsumed(self) -> list[Submission]:
        return list(self.held)

    def wakes(self) -> int:
        return 0

    def closing(self) -> bool:
        return False

    async def woken(self, since: int, timeout: float) -> None:
        await asyncio.sleep(timeout)


def test_a_step_that_consumed_all_it_may_is_handed_nothing_more_and_does_not_wait() -> None:
    """A step's view never holds more than it may still consume; once it consumed that
    many, the view is empty and wait_for_inbox returns [] at once, not after its timeout."""

    async def scenario() -> None:
        io = _Waiting(MAX_CONSUMED_PER_STEP + 5)
        inbox = StepInbox(io, await io.unconsumed())
        assert [s.number for s in inbox.shown()] == list(range(1, MAX_CONSUMED_PER_STEP + 1))
        for submission in (await inbox.wait(600))[:3]:
            inbox.consume(submission.number)
        assert [s.number for s in inbox.shown()] == list(range(4, MAX_CONSUMED_PER_STEP + 1))
        for submission in inbox.shown():
            inbox.consume(submission.number)
        assert inbox.shown() == []
        assert await asyncio.wait_for(inbox.wait(600), 5.0) == []

    asyncio.run(scenario())


class InboxReadsFail(MemoryStore):
    """A memory store whose inbox reads fail while ``failing`` is above zero."""

    def __init__(self) -> None:
        super().__init__()
        self.failing = 0

    def read_inbox(self, agent: str, after: int = 0) -> Any:
        if self.failing > 0:
            self.failing -= 1
            raise StoreUnavailable("inbox reads refused by the test")
        return super().read_inbox(agent, after)


def test_an_inbox_read_that_failed_is_followed_by_store_recovered(nodes: Nodes) -> None:
    """The term's inbox reads say store.error when they fail and store.recovered once one
    works again, as the node loop does for the lease: an operator sees the outage end."""
    nodes.store = InboxReadsFail()
    nodes.start("a", Answerer(wait_s=0.2))
    nodes.events.wait("agent.started", timeout=WAIT_S)
    nodes.store.failing = 3
    failed = nodes.events.wait("store.error", timeout=WAIT_S)
    assert failed.detail["error"].startswith("inbox: ")
    recovered = nodes.events.wait("store.recovered", timeout=WAIT_S)
    assert recovered.detail == {"during": "inbox"}
    with nodes.client() as client:
        client.submit(AGENT, 2, request_id="after")
        assert client.result(AGENT, "after", timeout=WAIT_S) == {"doubled": 4}


class EffectPerSubmission:
    """Calls an effect named for each submission it is shown, oldest first, then consumes
    it; parks after its effects on node park_on (cut off before its publish)."""

    id = AGENT

    def __init__(self, park_on: str) -> None:
        self.park_on = park_on
        self.parked = threading.Event()
        self.shown: list[tuple[str, int]] = []

    def init(self) -> dict[str, Any]:
        return {}

    async def step(self, state: dict[str, Any]) -> dict[str, Any]:
        ctx = current_step()
        assert ctx is not None
        for submission in await ctx.wait_for_inbox(60):
            self.shown.append((ctx.node, submission.number))
            done = await ctx.effect(f"handle-{submission.request_id}", _handled, submission.number)
            ctx.consume(submission.number, reply=done)
        if ctx.node == self.park_on:
            self.parked.set()
            await _forever()
        return state


def _handled(number: int) -> str:
    return f"handled #{number}"


def test_a_replay_is_not_shown_a_submission_that_turned_up_below_what_its_first_run_saw(
    nodes: Nodes,
) -> None:
    """#1 is not there while #2 is (a pending record deleted and put back, or a synced copy
    come late): a's step 1 calls the effect for #2 and is cut off. #1 turns up. b's replay of
    step 1 is shown #2 alone, as the journal says a's run was, so its effects come in the
    same order (no EffectMismatch for ever); #1 goes to step 2."""
    nodes.store.create_cluster(new_cluster_record(SECRET))
    sealer = Sealer(SECRET, nodes.store.read_cluster())  # type: ignore[arg-type]

    def admit(number: int, request_id: str) -> None:
        blob = sealer.seal_submission(AGENT, number, request_id, number, time.time())
        nodes.store.admit(AGENT, request_id, number, blob)

    agent = EffectPerSubmission(park_on="a")
    admit(1, "low")
    admit(2, "high")
    [(_one, low)] = [(n, blob) for n, blob in nodes.store.read_inbox(AGENT) if n == 1]
    hidden = AgentKeys(AGENT).submission(1)
    assert nodes.store.backend.commit(Txn(writes=[DeleteRange(hidden)])).succeeded
    nodes.start("a", agent)
    wait_until(agent.parked.is_set, "node a to call #2's effect and park")
    plant_submissions(nodes.store, AGENT, [(1, low)])  # put back as it was
    nodes.made[0].stop()
    nodes.start("b", agent)
    with nodes.client() as client:
        assert client.result(AGENT, "high", timeout=WAIT_S) == "handled #2"
        assert client.result(AGENT, "low", timeout=WAIT_S) == "handled #1"
    assert agent.shown == [("a", 2), ("b", 2), ("b", 1)]
    assert not nodes.events.of("agent.failing")
    replayed = nodes.events.wait("effect.replayed", "b")
    assert replayed.detail == {"step_seq": 1, "reused": 1}
