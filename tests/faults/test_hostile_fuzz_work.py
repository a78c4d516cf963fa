"""Fuzzing the records of work under running nodes: the effect journal, the inbox and control.

On each backend (file, Redis, etcd and the in-memory store of
``hamsterbunker.testing``; the syncdir store keeps the inbox in each node's own
subtree only, so no standby could take its work over, and is left out) a
leader and a standby run in this process, each with its own store client. The
agent journals effects in every step (``fetch``, replay="safe"; ``commit``,
replay="interrupted"; ``plan-a`` or ``plan-b``, "safe", named after what
``fetch`` returned, so that a re-run of ``fetch`` takes another path; and one
"safe" ``answer-<request id>`` per submission it consumes, whose result is the
reply), counting every real call outside the store. Each hypothesis example
submits a request, then does what a store writer without the secret can do to
one record:

* an effect-journal record (of the step in flight, the last one, or any):
  arbitrary bytes or JSON, a genuine record captured earlier put back (at its
  own place, or moved into the step in flight), or deleted (one record or the
  step's whole journal);
* a submission, a "consumed" record with its reply, or a request-id index
  entry (of the request just submitted, of one consumed, or of the next one
  to come): arbitrary bytes, well-formed records naming another number, a
  forged "consumed, no reply", a genuine reply or submission put back, or
  deleted (a reply alone, its consumed mark kept, too);
* the lease record's control field (written by compare-and-set, as anyone can):
  arbitrary text, an older genuine signed request (a pause, then the resume
  that followed it) put back, or cleared;

and then, in most examples, stops the leader at once (no grace: the step in
flight is cancelled, and the standby replays it from the journal) and starts
it again. After every example:

* no node crashed or hung: each keeps writing heartbeats;
* nothing is reported done that was not: ``Client.submit`` of a new request id
  is no duplicate (one the fuzz wrote records for before it was submitted may
  be refused with an error instead: reported, not forged), and
  ``Client.result`` of any request touched returns only the reply the agent
  gave that request (None only if it gave none), and only once the agent
  consumed it;
* progress: a new request (an id the fuzz never aims at) is answered within a
  few lease TTLs;
* effects: the effect checks below, on what happened so far.

At the end: an effect of replay="interrupted" was called at most once; no
effect was called after its step's checkpoint was accepted, nor (unless the
fuzz wrote to or deleted that step's journal) after its outcome record was
accepted; the agent consumed only requests the test submitted, and its last
published state counts each at most once; every request ``Client.result``
reported done is in that state; the history checker finds nothing wrong.

One test per family of records (journal; submissions; consumed records and
index entries; control), so that a failure in one hides none in another. Each
runs the attack shapes known to matter (``KNOWN``) first, then ``EXAMPLES``
drawn ones, seeded per backend and family. The nodes and the store carry on
from example to example, so a failure may come from an earlier one: its
message lists every action so far and the nodes' last events. Bounded: a fixed
number of examples, each wait bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import threading
import time
import zlib
from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

import pytest
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st

from hamsterbunker.agent.effects import current_effect
from hamsterbunker.agent.step import current_step
from hamsterbunker.core.errors import (
    EffectInterrupted,
    HamsterbunkerError,
    LeaseConflict,
    SealError,
    StoreError,
    UnknownRequest,
)
from hamsterbunker.core.history import read_history
from hamsterbunker.core.timing import LeaseTiming
from hamsterbunker.lease.control import set_paused
from hamsterbunker.ops.checker import check
from hamsterbunker.ops.client import Client
from hamsterbunker.runtime import Runtime
from hamsterbunker.sealing import Sealer
from hamsterbunker.stores import Store, open_store
from hamsterbunker.testing import MemoryStore
from tests.support import fuzz_examples, wait_until
from tests.support.agents import SECRET, Recorder
from tests.support.hostile_values import json_values
from tests.support.raw_store import BACKENDS
from tests.support.raw_work import RawWork, raw_work
from tests.support.restarting import RestartingNodes

pytestmark = pytest.mark.fuzz

T = TypeVar("T")

AGENT = "a"
NODES = ("node-a", "node-b")
EXAMPLES = fuzz_examples(full=12, fast=5)
TIMING = LeaseTiming(tick_ms=100, lease_ttl_ms=500)
TTL_S = TIMING.lease_ttl_ms / 1000
# "A few TTLs": how long after a hostile write a new request may wait for its reply.
# A stall that hostile records cause lasts for ever (or a TTL or two); 16 TTLs leave
# room for a loaded machine (make test-all's workers beside real-process tests).
PROGRESS_S = 16 * TTL_S
# How long an idle step waits for work before it ends (and the next one starts).
IDLE_WAIT_S = 0.2
# How many submissions one step answers at most.
ANSWERED_PER_STEP = 4


# -- what the world saw ----------------------------------------------------------------


@dataclass(frozen=True)
class Call:
    """One real call of an effect's function."""

    at: float  # monotonic
    seq: int
    index: int
    name: str
    replay: str
    key: str
    node: str  # the node whose step called it


@dataclass
class World:
    """Everything the agent did outside the store, and what the store accepted, thread-safe."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    calls: dict[str, list[Call]] = field(default_factory=lambda: defaultdict(list))  # by key
    # request id -> the replies the agent gave it (as JSON text), in any attempt
    consumed: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    # (seq, index) -> when the store first accepted its outcome record
    recorded: dict[tuple[int, int], float] = field(default_factory=dict)
    # seq -> when the store first accepted a checkpoint of it
    published: dict[int, float] = field(default_factory=dict)
    last_input: dict[str, Any] = field(default_factory=dict)
    steps: int = 0

    def call(self) -> int:
        """Count a real call of the running effect; how many calls of it there were."""
        effect, step = current_effect(), current_step()
        assert effect is not None and step is not None, "an effect runs outside a step"
        with self.lock:
            calls = self.calls[effect.key]
            calls.append(
                Call(time.monotonic(), effect.seq, effect.index, effect.name, effect.replay,
                     effect.key, step.node)
            )  # fmt: skip
            return len(calls)

    def gave(self, request_id: str, reply: Any) -> None:
        with self.lock:
            self.consumed[request_id].add(json.dumps(reply, sort_keys=True))

    def entered(self, state: dict[str, Any]) -> None:
        with self.lock:
            self.last_input = copy.deepcopy(state)
            self.steps += 1

    def accepted_effect(self, seq: int, index: int, kind: str) -> None:
        if kind == "outcome":
            with self.lock:
                self.recorded.setdefault((seq, index), time.monotonic())

    def accepted_checkpoint(self, seq: int) -> None:
        with self.lock:
            self.published.setdefault(seq, time.monotonic())


def expected_reply(request_id: str, payload: Any) -> Any:
    """The reply the agent gives a request: None when its payload asks for none."""
    if isinstance(payload, dict) and payload.get("reply") is False:
        return None
    return {"rid": request_id, "k": payload.get("k") if isinstance(payload, dict) else None}


class WorkAgent:
    """Journals a "safe" and an "interrupted" effect each step, then a "safe" one whose name
    depends on the first one's result (as an LLM's answer picks the next tool: a re-run of
    the first may take another path), then answers its inbox, each answer a "safe" effect
    whose result is the reply. An interrupted effect is noted and the step goes on (the
    agent's decision)."""

    def __init__(self, world: World) -> None:
        self.id = AGENT
        self.world = world

    def init(self) -> dict[str, Any]:
        return {"n": 0, "interrupted": 0, "answered": {}}

    async def _call(self) -> int:
        calls = self.world.call()
        await asyncio.sleep(0.01)  # long enough for a stop to cancel a step mid-call
        return calls

    async def _answer(self, request_id: str, payload: Any) -> Any:
        await self._call()
        return expected_reply(request_id, payload)

    async def step(self, state: dict[str, Any]) -> dict[str, Any]:
        context = current_step()
        assert context is not None
        self.world.entered(state)
        fetched = await context.effect("fetch", self._call, replay="safe")
        try:
            await context.effect("commit", self._call, replay="interrupted")
        except EffectInterrupted:
            state["interrupted"] += 1
        await context.effect(f"plan-{'ab'[fetched % 2]}", self._call, replay="safe")
        shown = await context.wait_for_inbox(IDLE_WAIT_S)
        for submission in shown[:ANSWERED_PER_STEP]:
            rid = submission.request_id
            reply = await context.effect(
                f"answer-{rid}", self._answer, rid, submission.payload, replay="safe"
            )
            context.consume(submission.number, reply)
            self.world.gave(rid, reply)
            state["answered"][rid] = state["answered"].get(rid, 0) + 1
        state["n"] += 1
        return state


class SpyStore:
    """A node's store client that tells the world what the store accepted, and counts this
    node's heartbeat writes (proof that its loop goes on)."""

    def __init__(self, inner: Store, world: World, *, owned: bool) -> None:
        self._inner, self._world, self._owned = inner, world, owned
        self.beats = 0
        self._lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def put_heartbeat(self, agent: str, heartbeat: Any) -> None:
        self._inner.put_heartbeat(agent, heartbeat)
        with self._lock:
            self.beats += 1

    def put_effect(self, agent: str, fence: Any, seq: int, index: int, kind: str, blob: bytes
                   ) -> None:  # fmt: skip
        self._inner.put_effect(agent, fence, seq, index, kind, blob)
        self._world.accepted_effect(seq, index, kind)

    def put_checkpoint(self, agent: str, fence: Any, seq: int, *args: Any, **kwargs: Any) -> Any:
        info = self._inner.put_checkpoint(agent, fence, seq, *args, **kwargs)
        self._world.accepted_checkpoint(seq)
        return info

    def put_checkpoint_and_release(self, agent: str, fence: Any, seq: int, *args: Any) -> Any:
        found = self._inner.put_checkpoint_and_release(agent, fence, seq, *args)
        self._world.accepted_checkpoint(seq)
        return found

    def close(self) -> None:
        if self._owned:
            self._inner.close()


# -- the backends ----------------------------------------------------------------------


@dataclass
class Backend:
    name: str
    raw: RawWork
    store: Store  # the test's own client: reads, captures, and control writes
    memory: MemoryStore | None  # the shared store itself, for the in-memory backend
    url: str

    def node_store(self, world: World) -> SpyStore:
        if self.memory is not None:
            return SpyStore(self.memory, world, owned=False)
        return SpyStore(open_store(self.url), world, owned=True)


@pytest.fixture(params=[*BACKENDS, "memory"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    """A fresh, empty store of each backend, with raw access to its work records."""
    if request.param == "memory":
        memory = MemoryStore()
        yield Backend("memory", raw_work(memory), memory, memory, memory.url)
        return
    raw = BACKENDS[request.param](tmp_path)
    store = open_store(raw.url)
    try:
        yield Backend(request.param, raw_work(raw), store, None, raw.url)
    finally:
        store.close()
        raw.close()


# -- the running nodes and what the test submitted ---------------------------------------


@dataclass
class Submitted:
    request_id: str
    number: int
    payload: dict[str, Any]


class Running(RestartingNodes):
    """Two nodes of one agent, a client, and what the fuzz captured and touched."""

    def __init__(self, backend: Backend, tmp_path: Path) -> None:
        super().__init__()
        self.backend = backend
        self.tmp_path = tmp_path
        self.history = tmp_path / "history.jsonl"
        self.world = World()
        self.client = Client(backend.memory or backend.url, SECRET)
        cluster = backend.store.read_cluster()
        assert cluster is not None
        self.sealer = Sealer(SECRET, cluster)
        self.submitted: dict[str, Submitted] = {}
        self.next_k = 1
        self.next_probe = 1
        self.squatted: set[str] = set()  # request ids the fuzz wrote records for before use
        self.reported_done: set[str] = set()
        # Genuine records seen, to be put back later.
        self.effect_records: dict[tuple[int, int, str], bytes] = {}
        self.submissions: dict[int, bytes] = {}
        self.replies: dict[int, bytes] = {}
        self.controls: list[str] = []
        self.touched_steps: dict[int, list[int]] = defaultdict(list)  # seq -> action numbers
        self.events = Recorder()
        self.actions: list[str] = []  # what each example did, for failure messages
        self.done_kinds: set[str] = set()
        self.not_done: BaseException | None = None  # why the last result() reported nothing

    # -- nodes

    def start(self, node_id: str) -> None:
        store = self.backend.node_store(self.world)
        node = Runtime(
            node_id=node_id,
            region="r1",
            store=store,  # a Store by delegation
            agent=WorkAgent(self.world),
            secret=SECRET,
            timing=TIMING,
            history=self.history,
            state_dir=self.tmp_path / f"state-{node_id}",
            stop_grace_ms=0,  # a stop cancels the step in flight: the next leader replays it
            on_event=self.events,
        )
        self.nodes[node_id] = (node, store)
        node.start()
        wait_until(lambda: node.ready.is_set() or node.stopped.is_set(), f"{node_id} to start")

    @contextlib.contextmanager
    def told(self, hostile: Hostile | None) -> Iterator[None]:
        """Run an example; a failure names every action so far and the nodes' last events (the
        store carries on from example to example, so an earlier action may be the cause)."""
        if hostile is not None:
            self.actions.append(f"#{len(self.actions) + 1} (from req-{self.next_k}): {hostile}")
        try:
            yield
        except (Exception, pytest.fail.Exception) as exc:  # Failed is no Exception
            noise = {"inbox.rejected", "agent.step", "checkpoint.published", "node.heartbeat"}
            events = [
                f"{e.node}:{e.type}(epoch {e.epoch}, seq {e.seq}) {e.detail or ''}"[:300]
                for e in self.events.of() if e.type not in noise
            ][-25:]  # fmt: skip
            raise AssertionError(
                f"{exc}\n\nactions so far:\n  "
                + "\n  ".join(self.actions)
                + "\n\nlast events:\n  "
                + "\n  ".join(events)
            ) from exc

    def leader(self) -> str:
        with contextlib.suppress(StoreError):
            lease = self.backend.store.read_lease(AGENT)
            if lease is not None and lease.holder in self.nodes:
                return lease.holder
        return NODES[self.restarts % len(NODES)]

    def stop(self) -> None:
        for node, store in self.nodes.values():
            with contextlib.suppress(BaseException):
                node.stop(timeout=20)
            store.close()
        self.nodes.clear()
        self.client.close()

    # -- work

    def new_request(self, *, reply: bool = True, probe: bool = False) -> Submitted:
        """Submit a new request (``req-<k>``, or ``probe-<k>``, an id the fuzz never aims at).

        A new request id is never a duplicate. Only an id the fuzz squatted (wrote records
        for before it was submitted) may instead be refused with an error that says so: a
        reported refusal, not a forged admission; the next id is submitted then.
        """
        while True:
            if probe:
                k = self.next_probe
                self.next_probe += 1
            else:
                k = self.next_k
                self.next_k += 1
            request_id = f"{'probe' if probe else 'req'}-{k}"
            payload: dict[str, Any] = {"k": k, "reply": reply}
            try:
                admission = self.client.submit(AGENT, payload, request_id=request_id)
            except HamsterbunkerError as exc:
                if request_id in self.squatted:
                    continue
                pytest.fail(f"submit of the new request {request_id!r} failed: {exc!r}")
            break
        submitted = Submitted(request_id, admission.number, payload)
        self.submitted[request_id] = submitted
        assert not admission.duplicate, (
            f"submit of the new request {request_id!r} was reported a duplicate (#"
            f"{admission.number}): a request nobody submitted counts as admitted"
        )
        return submitted

    def next_request_id(self) -> str:
        """The id the next new_request (not a probe) submits first."""
        return f"req-{self.next_k}"

    def assert_result_honest(self, request_id: str, timeout: float = 0) -> Any:
        """Client.result reports request_id done only with the reply the agent gave it (a
        request id never submitted is never done)."""
        submitted = self.submitted.get(request_id)
        try:
            got = self.client.result(AGENT, request_id, timeout=timeout)
        except (TimeoutError, UnknownRequest, SealError, StoreError) as exc:
            self.not_done = exc
            return _NOT_DONE  # not reported done (or reported damaged): no claim made
        assert submitted is not None, (
            f"Client.result reported {request_id!r}, which was never submitted, done with {got!r}"
        )
        with self.world.lock:
            gave = set(self.world.consumed.get(request_id, ()))
        assert gave, (
            f"Client.result reported {request_id!r} (#{submitted.number}) done with "
            f"{got!r}, but the agent never consumed it"
        )
        text = json.dumps(got, sort_keys=True)
        assert text == json.dumps(expected_reply(request_id, submitted.payload), sort_keys=True) \
            and text in gave, (
            f"Client.result gave {got!r} for {request_id!r} (#{submitted.number}); the agent "
            f"replied {sorted(gave)}"
        )  # fmt: skip
        self.reported_done.add(request_id)
        return got

    def assert_progress(self) -> None:
        """A new request is answered within PROGRESS_S."""
        probe = self.new_request(probe=True)
        got = self.assert_result_honest(probe.request_id, timeout=PROGRESS_S)
        assert got is not _NOT_DONE, (
            f"no reply to the new request {probe.request_id!r} (#{probe.number}) within "
            f"{PROGRESS_S} s ({self.not_done!r}): the agent made no progress "
            f"({self.world.steps} steps so far)"
        )

    # -- what the fuzz puts back

    def latest_seq(self) -> int:
        with self.world.lock:
            return max(self.world.published, default=0)

    def settle_in_flight(self) -> None:
        """Wait (a little, bounded) until the step in flight has recorded the outcomes of its
        first three effects, so that what is done to its journal meets records there."""
        deadline = time.monotonic() + 2 * TTL_S
        while time.monotonic() < deadline:
            with self.world.lock:
                in_flight = max(self.world.published, default=0) + 1
                if (in_flight, 2) in self.world.recorded:
                    return
            time.sleep(0.01)

    def capture(self) -> None:
        """Keep the genuine records there are now: the journals of the last and the next
        step, the unconsumed submissions and the replies."""
        store = self.backend.store
        with contextlib.suppress(StoreError):
            latest = self.latest_seq()
            for seq in (latest, latest + 1):
                for (index, kind), blob in store.read_effects(AGENT, seq).items():
                    self.effect_records[(seq, index, kind)] = blob
            for number, blob in store.read_inbox(AGENT):
                self.submissions[number] = blob
            replies, _more = store.read_replies(AGENT, max(self.replies, default=0), 64)
            self.replies.update(replies)

    def capture_controls(self) -> None:
        """Pause, then resume, as an operator: two genuine signed requests to put back."""
        for paused in (True, False):
            lease = set_paused(self.backend.store, self.sealer, AGENT, paused)
            self.controls.append(lease.control)
        # What is promised is about requests a node saw: let both read the resume first.
        self.assert_alive()

    def write_control(self, text: str) -> None:
        """Put text in the lease record's control field by compare-and-set, as anyone can."""
        store = self.backend.store
        for _ in range(20):
            try:
                lease = store.read_lease(AGENT)
            except StoreError:
                return  # a record the fuzz damaged: nothing to write into
            if lease is None:
                return
            try:
                store.cas_lease(AGENT, lease.version, replace(lease, control=text))
                return
            except LeaseConflict:
                continue


_NOT_DONE = object()


@pytest.fixture
def running(backend: Backend, tmp_path: Path) -> Iterator[Running]:
    made = Running(backend, tmp_path)
    try:
        for node_id in NODES:
            made.start(node_id)
        made.capture_controls()
        yield made
    finally:
        made.stop()


# -- hostile writes ----------------------------------------------------------------------


def junk() -> st.SearchStrategy[bytes]:
    """Arbitrary bytes, or arbitrary JSON (what a record of ours looks like from outside)."""
    return st.binary(max_size=200) | json_values().map(
        lambda value: json.dumps(value, allow_nan=True).encode()
    )


@dataclass(frozen=True)
class Hostile:
    """One hostile action, resolved against what is in the store when it runs."""

    kind: str  # effect, pending, done, index, control
    form: str
    target: str  # which record: for effects a step, for the inbox a request
    index: int = 0
    record: str = "outcome"
    pick: int = 0  # which captured genuine record, modulo how many there are
    data: bytes = b""
    restart: bool = True
    reply_wanted: bool = True


# The record families, one test each: a failure in one family hides none in another.
FAMILIES = {
    "journal": ["effect"],
    "submissions": ["pending"],
    "consumed": ["done", "index"],
    "control": ["control"],
}


@st.composite
def hostile_actions(draw: st.DrawFn, kinds: list[str]) -> Hostile:
    """A hostile action on a record of one of kinds (most examples then restart the leader)."""
    kind = draw(st.sampled_from(kinds))
    forms = {
        "effect": ["junk", "junk", "replay", "moved", "delete", "delete-step"],
        "pending": ["junk", "junk-raw", "replay", "delete"],
        "done": ["no-reply", "junk-reply", "replay", "delete", "delete-reply"],
        "index": ["junk", "other-number", "delete"],
        "control": ["junk", "replay-pause", "replay-resume", "clear"],
    }[kind]
    targets = {
        "effect": ["in-flight", "in-flight", "latest", "any"],
        "control": ["lease"],
    }.get(kind, ["fresh", "fresh", "consumed", "next"])
    return Hostile(
        kind=kind,
        form=draw(st.sampled_from(forms)),
        target=draw(st.sampled_from(targets)),
        index=draw(st.sampled_from([0, 1, 2, 3])),
        record=draw(st.sampled_from(["intent", "outcome"])),
        pick=draw(st.integers(0, 1000)),
        data=draw(junk()),
        restart=draw(st.booleans() | st.just(True)),
        reply_wanted=draw(st.booleans() | st.just(True)),
    )


def _picked(items: Sequence[T], pick: int) -> T | None:
    return items[pick % len(items)] if items else None


def do_hostile(run: Running, hostile: Hostile, fresh: Submitted) -> str | None:
    """Carry out one hostile action (see the module docstring); the request id it aimed at."""
    raw = run.backend.raw
    if hostile.kind == "effect":
        if hostile.target == "in-flight":
            run.settle_in_flight()
        latest = run.latest_seq()
        seq = {"in-flight": latest + 1, "latest": max(latest, 1)}.get(
            hostile.target, 1 + hostile.pick % (latest + 2)
        )
        run.touched_steps[seq].append(len(run.actions))
        index, record = hostile.index, hostile.record
        old = _picked(sorted(run.effect_records), hostile.pick)
        match hostile.form:
            case "junk":
                raw.put_effect(AGENT, seq, index, record, hostile.data)
            case "replay" if old is not None:  # at its own place
                run.touched_steps[old[0]].append(len(run.actions))
                raw.put_effect(AGENT, old[0], old[1], old[2], run.effect_records[old])
            case "moved" if old is not None:  # into the step aimed at
                raw.put_effect(AGENT, seq, old[1], old[2], run.effect_records[old])
            case "delete":
                raw.delete_effect(AGENT, seq, index, record)
            case "delete-step":
                with contextlib.suppress(FileNotFoundError):
                    raw.delete_effects(AGENT, seq)
        return None
    if hostile.kind == "control":
        match hostile.form:
            case "junk":
                run.write_control(hostile.data.decode("latin-1"))
            case "replay-pause":
                run.write_control(run.controls[0])
            case "replay-resume":
                run.write_control(run.controls[1])
            case "clear":
                run.write_control("")
        return None
    # The inbox: which request, and its number.
    consumed = _picked(sorted(r for r in run.submitted if r in run.world.consumed), hostile.pick)
    match hostile.target:
        case "fresh":
            request_id, number = fresh.request_id, fresh.number
        case "consumed" if consumed is not None:
            request_id, number = consumed, run.submitted[consumed].number
        case _:
            request_id, number = run.next_request_id(), fresh.number + 1
            run.squatted.add(request_id)
    other = _picked(sorted(s.number for s in run.submitted.values()), hostile.pick) or number
    match hostile.kind, hostile.form:
        case "pending", "junk":
            raw.put_pending(AGENT, number, request_id, hostile.data)
        case "pending", "junk-raw":
            raw.put_pending_raw(AGENT, number, hostile.data)
        case "pending", "replay":
            kept = _picked(sorted(run.submissions), hostile.pick)
            if kept is not None:
                owner = next(
                    (s.request_id for s in run.submitted.values() if s.number == kept), request_id
                )
                raw.put_pending(AGENT, kept, owner, run.submissions[kept])
        case "pending", "delete":
            raw.delete_pending(AGENT, number)
        case "done", "no-reply":
            raw.put_done(AGENT, number, request_id, None)
        case "done", "junk-reply":
            raw.put_done(AGENT, number, request_id, hostile.data)
        case "done", "replay":
            kept = _picked(sorted(run.replies), hostile.pick)
            if kept is not None:
                raw.put_done(AGENT, number, request_id, run.replies[kept])
        case "done", "delete":
            raw.delete_done(AGENT, number, request_id)
        case "done", "delete-reply":
            raw.delete_reply(AGENT, number, request_id)
        case "index", "junk":
            raw.put_index_raw(AGENT, request_id, hostile.data)
        case "index", "other-number":
            raw.put_index(AGENT, request_id, other)
        case "index", "delete":
            raw.delete_index(AGENT, request_id)
    return request_id


# -- the test ----------------------------------------------------------------------------


def assert_effects_honest(run: Running) -> None:
    """No "interrupted" effect ran twice, but where the fuzz deleted or replaced its step's
    journal and another node than the one that began it replayed the step (what the README's
    threat model says such a writer can do: the node that began it keeps its intents); no
    effect ran after its step was checkpointed, nor, in a step whose journal the fuzz left
    alone, after its outcome was recorded."""
    world = run.world
    with world.lock:
        calls = {key: list(each) for key, each in world.calls.items()}
        recorded, published = dict(world.recorded), dict(world.published)
    for each in calls.values():
        first = each[0]
        seq, index = first.seq, first.index
        if first.replay == "interrupted":
            by_node = [sum(c.node == node for c in each) for node in {c.node for c in each}]
            excused = seq in run.touched_steps and max(by_node) <= 1  # each node once
            assert len(each) <= 1 or excused, (
                f'effect {first.name!r} (replay="interrupted") of step {seq} #{index} ran '
                f"{len(each)} times (key {first.key}); actions on that step's journal: "
                f"{run.touched_steps.get(seq, 'none')}"
            )
        done = published.get(seq)
        late = [c for c in each if done is not None and c.at > done]
        assert not late, (
            f"effect {first.name!r} of step {seq} #{index} ran again after step {seq}'s "
            f"checkpoint was accepted ({len(each)} calls in all)"
        )
        at = recorded.get((seq, index))
        if at is not None and seq not in run.touched_steps:
            again = [c for c in each if c.at > at and c.name == first.name]
            assert not again, (
                f"effect {first.name!r} of step {seq} #{index} ran again after its outcome "
                f"was recorded, though the fuzz never touched that step's journal"
            )


def touched(run: Running, violation: str) -> bool:
    """Whether a history checker's violation is an effect called again in a step whose journal
    the fuzz deleted or replaced: what assert_effects_honest holds such a step to instead."""
    keys = {key for key, each in run.world.calls.items() if each[0].seq in run.touched_steps}
    again = ("was called again", "interrupted effect")
    return any(key in violation for key in keys) and any(word in violation for word in again)


# Shapes of attack known to matter, run on every backend before the drawn ones.
KNOWN = {
    "journal": [
        Hostile("effect", "delete-step", "in-flight"),  # the step's intents go
        # A safe effect's outcome: its re-run takes another path past the records there.
        Hostile("effect", "delete", "in-flight", index=0, record="outcome"),
        Hostile("effect", "junk", "in-flight", index=1, record="outcome"),
        Hostile("effect", "moved", "in-flight"),  # a genuine record of another step
    ],
    "submissions": [
        Hostile("pending", "junk", "next", data=b"junk", restart=False),
        Hostile("pending", "replay", "consumed"),  # a consumed submission's entry put back
        Hostile("pending", "delete", "fresh"),
    ],
    "consumed": [
        Hostile("done", "no-reply", "next", restart=False),
        Hostile("done", "no-reply", "fresh", restart=False),
        Hostile("index", "other-number", "next", restart=False),
        Hostile("done", "replay", "fresh"),  # another request's genuine reply
        Hostile("done", "delete-reply", "consumed"),  # the agent's reply goes, its mark stays
    ],
    "control": [
        Hostile("control", "replay-pause", "lease"),  # then two leaders start afresh
        Hostile("control", "junk", "lease", data=b"junk"),
        Hostile("control", "junk", "lease", data=b"junk"),
    ],
}


def act(run: Running, hostile: Hostile) -> None:
    """One example: submit, write, maybe restart the leader, then check (module docstring)."""
    with run.told(hostile):
        fresh = run.new_request(reply=hostile.reply_wanted)
        run.capture()
        aimed = do_hostile(run, hostile, fresh)
        if aimed is not None:  # at once, before the agent may have consumed it
            run.assert_result_honest(aimed)
        run.done_kinds.add(hostile.kind)
        if hostile.restart:
            run.restart(run.leader())
        run.assert_alive()
        for request_id in {fresh.request_id, *list(run.submitted)[-8:]}:
            run.assert_result_honest(request_id)
        run.assert_progress()
        assert_effects_honest(run)
        run.capture()


@pytest.mark.parametrize("family", list(FAMILIES))
def test_hostile_work_records_never_crash_stall_or_forge_work(
    running: Running, family: str
) -> None:
    """Under hostile writes, replays and deletions of one family of work records (the effect
    journal; submissions; consumed records and request-id index entries; the lease's control
    field), on every backend, nodes keep their loop going, the agent keeps answering within a
    few TTLs, nothing is reported done that was not, and no completed or "interrupted"
    effect runs twice."""
    for hostile in KNOWN[family]:
        act(running, hostile)

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        # The nodes and the store carry on from example to example: shrinking would replay
        # examples against another store, so a failure is reported as found.
        phases=[Phase.generate],
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    @given(hostile=hostile_actions(FAMILIES[family]))
    def one_action(hostile: Hostile) -> None:
        act(running, hostile)

    # Each backend and family its own sequence of actions, the same on every run.
    seed(zlib.crc32(f"{running.backend.name}-{family}".encode()))(one_action)()
    assert running.done_kinds == set(FAMILIES[family]) and running.restarts >= 3, (
        running.done_kinds,
        running.restarts,
    )
    with running.told(None):  # the end of the run
        for request_id in running.submitted:
            running.assert_result_honest(request_id)
        # Two more steps: the last one entered starts from everything published before.
        steps = running.world.steps
        wait_until(lambda: running.world.steps >= steps + 2, "two more steps", timeout=PROGRESS_S)
        running.stop()
        assert_effects_honest(running)
        world = running.world
        assert set(world.consumed) <= set(running.submitted), (
            f"the agent consumed requests nobody submitted: "
            f"{sorted(set(world.consumed) - set(running.submitted))}"
        )
        answered: dict[str, int] = world.last_input.get("answered", {})
        twice = {rid: n for rid, n in answered.items() if n > 1}
        assert not twice, f"published state counts these requests consumed more than once: {twice}"
        unpublished = running.reported_done - set(answered)
        assert not unpublished, (
            f"Client.result reported done requests that no published step consumed: "
            f"{sorted(unpublished)}"
        )
        assert [v for v in check(read_history(running.history)) if not touched(running, v)] == []
