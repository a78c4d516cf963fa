"""Switchover (``hb switchover --to NODE``): the request → the new leader's first step, per store;
and the command itself, from its start, on the file store."""

from __future__ import annotations

import asyncio
import compileall
import contextlib
import json
import os
import random
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import hamsterbunker
from hamsterbunker import current_step
from hamsterbunker.core.clock import MonotonicClock
from hamsterbunker.core.history import Op
from hamsterbunker.lease.control import request_switchover
from hamsterbunker.ops.local import LocalCluster
from hamsterbunker.sealing import Sealer
from hamsterbunker.stores import Store

from .backends import _server
from .common import (
    SECRET,
    SPREAD_HEADERS,
    TIMING,
    BenchmarkError,
    Check,
    Result,
    Table,
    ms,
    percentile,
    spread_row,
    wait_for,
)
from .nodes import AGENT_ID, NODES, BenchCluster, bench_cluster

NAME = "switchover"
TITLE = "Switchover (hb switchover --to NODE) per store (file, etcd, Redis)"
TICK_MS, TTL_MS = TIMING.tick_ms, TIMING.lease_ttl_ms  # the defaults of `hb run`
BACKENDS = ("file", "etcd", "redis")
TARGET_MS = {"file": 100, "etcd": 50, "redis": 50}  # issue 17
SWITCHOVERS, QUICK_SWITCHOVERS = 30, 5
BUDGET_S, QUICK_BUDGET_S = 180.0, 60.0  # per store
STEP_S = 0.005  # the agent's step: the step in flight the old leader finishes
WAIT_S = 0.3  # the waiting workload: each step waits this long for work that never comes
WAIT_ENV = "HB_BENCH_WAIT_S"  # set for the nodes of the waiting workload
REPO = Path(__file__).resolve().parent.parent
CLOCK = MonotonicClock()  # CLOCK_BOOTTIME: the nodes' history and the agent's step log use it
AGENT = "benchmarks.switchover:ShortStepAgent"
EVENTS = ("lease.switchover_asked", "lease.released", "lease.acquired")  # split the parts
STEP_LOG_ENV = "HB_BENCH_STEP_LOG"  # where the agent notes the start of each term's first step
CLI_SWITCHOVERS, QUICK_CLI_SWITCHOVERS = 30, 20
CLI_TARGET_MS = 300  # issue 36: the command's start → the target's first step, file store

METHOD = f"""\
On each store (the file store in a temporary directory on this machine's disk; etcd
and Redis started by the benchmark on loopback, a fresh server per store, as in the
per-store benchmark), three real node processes (`python -m hamsterbunker run`,
tick {TICK_MS} ms, TTL {TTL_MS} ms, `--history`) run `ShortStepAgent` (this module):
an async counter whose step sleeps {STEP_S * 1000:.0f} ms. The step is short on
purpose: a switchover lets the step in flight finish and publishes it before the
lease is released, so the old leader's part of the switchover includes up to one
step, which is the agent's time, not the library's; CounterAgent's 0.25 s steps (the
other node benchmarks) would swamp the figure. The agent writes, on CLOCK_BOOTTIME
(the clock of the nodes' history), the moment its first step of each term starts.

Two workloads per store, each with fresh nodes and a fresh server:
* **busy**: the step sleeps {STEP_S * 1000:.0f} ms and the next begins at once, a checkpoint
  after each: the leader publishes as fast as the store takes it (on etcd about 60
  checkpoints a second, each a read and a txn), so the switchover's own store calls
  queue behind them. The store at its busiest.
* **waiting**: the step waits in `ctx.wait_for_inbox({WAIT_S})` for work that never comes,
  as an agent idle between requests does; a checkpoint every {WAIT_S * 1000:.0f} ms. A
  switchover tells the waiting step that the term ends, and it returns at once.

For each switchover ({SWITCHOVERS} per store, {QUICK_SWITCHOVERS} with `--quick`):
wait until the three nodes heartbeat and the leader has published in its epoch;
choose the target, alternating between the two standbys (sorted by name); sleep a
random 0–{TICK_MS} ms; call `hamsterbunker.lease.control.request_switchover(store, sealer,
agent, to=target)` in this process, as `hb switchover --to TARGET` does. The call
first judges the leader and the target live (from one read of their fresh records of
this term; else by watching until their records change: up to half a TTL, an idle
standby's heartbeat period), then writes the signed request into the lease record by
compare-and-set and returns. Then wait until the
nodes' history shows the next epoch's first checkpoint, and check that the target
took it and that the lease record's last takeover (`lease.history[-1]`) names the
target with via `switchover`. The benchmark reads only the local history and step-log
files while a switchover is under way (incrementally), so it puts no load on the store.

* **(a) request written → the new leader's first step** (held to the target of the
  issue: p99 ≤ {TARGET_MS["file"]} ms on the file store, ≤ {TARGET_MS["etcd"]} ms on
  etcd and Redis): from the return of `request_switchover` (its compare-and-set has
  returned; the call does nothing after it) to the start of the new leader's first
  `agent.step` of the new epoch, as the agent recorded it. Beside it, the same to the
  new epoch's first checkpoint with the agent's own step taken out (the end of its
  first publish minus restore end → publish start, as the handover benchmarks count
  it; this adds the seal and `put_checkpoint`), and to that checkpoint with the step.
* **(b) the whole call → first step**, from just before `request_switchover` was
  called: includes the call's liveness check (one read of the lease and the heartbeats
  when they are fresh; else a watch, polling every 50 ms until the leader has renewed
  and the target has beaten once while watched, so up to half a TTL). Reported, no
  target.
* **(c) parts**: request written → the old leader sees it (its
  `lease.switchover_asked` event) → its last publish of its epoch (the step in flight
  finished; its history) → its `lease.released` event (emitted as the release's
  compare-and-set returns) → the new leader's acquisition (the end of its `acquire`
  op) → its restore → its first step. Event times are the nodes' `time.time()`,
  compared with this process's `time.time()` at the write (one machine, one clock).
* **(d) the command** (`hb switchover --to TARGET --wait`, {CLI_SWITCHOVERS} times, {QUICK_CLI_SWITCHOVERS}
  with `--quick`, on a fresh busy cluster on the file store; held to the target of issue
  36: p99 ≤ {CLI_TARGET_MS} ms): each run is a new process (`python -m hamsterbunker
  switchover ...`, the secret and the store from the environment, as an operator's
  shell has them; the package's bytecode compiled first, as installing it does, so that
  no run compiles its modules afresh), timed from just before it is started to the start
  of the target's first step, as the agent recorded it (both on CLOCK_BOOTTIME); so the
  figure holds the interpreter's start, the imports, the key derivation from the secret
  (scrypt), the liveness check, the request and the whole switchover. Beside it, the
  command's start → its exit (it returns once it has read the lease held by the target).
* **The probe** (`HB_BENCH_PROBE=1 python -m benchmarks --only switchover`, for the
  analysis; off in `make bench`): the node processes, which import this module for
  the agent, wrap a few methods of the node loop and the lease keeper (the library is
  unchanged) and note each call on CLOCK_BOOTTIME: the store watch's wake-ups, each
  lease tick and release, when the loop tells the term to hand over and when the
  term has ended, and each entry to the loop's sleep. A table per store then splits
  the switchover further.
"""

ANALYSIS = """\
First measured on 2026-12-01 at a load average of 2.7 to 6 on this shared 2-core
machine (30 switchovers per store; the probe splits them). p50 / p99 (ms) of request
written → the new leader's first step, and the parts as the probe found them then:

| part (probe run, p50 / p99 ms) | file | etcd | Redis |
| --- | --- | --- | --- |
| request written → first step, plain run, load 5–6 | 87 / 178 | 96 / 451 | 31 / 355 |
| request written → first step, plain run, load 2.7 | 86 / 122 | 97 / 155 | 26 / 36 |
| request's compare-and-set sent → the old leader's watch wakes it | 37 / 55 | 11 / 23 | 1.3 / 4.4 |
| its check that the record changed (a lease read) | 2.1 / 13 | 12 / 33 | 3.0 / 7.3 |
| its renewal (compare-and-set refused, read again, request adopted) | 5.4 / 13 | 18 / 34 | 2.4 / 7.6 |
| the term ends (the 5 ms step in flight finishes, is published) | 7.3 / 16 | 14 / 35 | 6.6 / 13 |
| its release (one compare-and-set) | 5.2 / 11 | 11 / 23 | 2.0 / 5.9 |
| release returned → the new leader's acquiring tick starts | 32 / 41 | 0.5 / 9.4 | 0.7 / 2.8 |
| its acquiring tick (lease read, compare-and-set) | 4.5 / 15 | 19 / 44 | 4.0 / 12 |
| its restore (three reads: names, accepted loss, newest blob) | 3.2 / 6.7 | 23 / 73 | 4.0 / 10 |
| restore done → first step starts (`read_inbox` before each step) | 1.2 / 5.0 | 7.3 / 22 | 1.5 / 3.1 |

Changed in the library since (commits 7ab95bd, 9a76829):

1. **A lost wake-up, fixed.** The Redis and etcd outliers of 355–451 ms were the old
   leader seeing the request a tick late: its watch woke it during the pass that had
   just renewed, and `NodeLoop._sleep_until` cleared that wake-up at the top of its
   wait. `wake` is now cleared only before a store read (at the start of each pass,
   and before the leader's check): a change during a pass ends the next wait at once.
2. **The check adopts, no renewal first.** A leader woken by its watch reads the
   record; if it is still its term (holder, session, epoch) it adopts it and acts on
   the request at once: two round trips less (the refused compare-and-set and its
   read).
3. **The restore reads the checkpoint names and the accepted-loss record at once:**
   one round trip less for every takeover.

Changed since (2026-12-01, later; commits ec446f5, 2ea92e5, 77d95ab):

4. **The file store's lease watch is inotify on the event loop** (asyncinotify), not
   watchfiles' thread: a change is read as it lands, and nothing wakes while idle.
   File p99 fell from 112 to 31–48 ms (busy workload), and the idle standby's CPU from
   1.85 % to 1.20–1.30 % of a core (the standby benchmark). watchfiles is kept for NFS.
5. **A released lease is taken and restored in one go.** Once a node has read a
   released record, no checkpoint of that epoch can be accepted any more (the fence
   names no holder), so the restorer lists the checkpoints, reads the loss acceptance
   and the newest checkpoint while the acquiring compare-and-set is under way; the
   term uses them only if that compare-and-set replaced that very record. The term's
   first inbox read runs beside the restore. etcd's restore went from 16 to 10–12 ms
   (p50).
6. **A step waiting for work returns at once when its term ends** (a stop, a
   switchover), without waiting for the watch or a tick and without reading the inbox
   again: the waiting workload.

Changed since (2026-12-02; commits d5dc0cf to bdb3006):

7. **The watch carries the record** (etcd: the watch event's value; Redis: the
   message the compare-and-set script publishes is the record itself). The old
   leader acts on the request without reading the lease (its wake-up → the term told
   to hand over: 2.1 ms p50 on etcd, where the check was a 12 ms read), and a standby
   takes each renewal's record for the read it made.
8. **The acquisition reads what the restore needs** (`Store.take_lease`): on etcd the
   compare-and-set, the checkpoint listing, the acceptance record, the newest
   checkpoint and the inbox's first page are one txn, so the new term's restore and
   its first look at its inbox cost no round trip. The read-ahead beside the
   acquisition is gone; on the file store and Redis the restore reads after the
   acquisition (Redis: the listing and the acceptance record in one pipeline, then
   the blob).
9. **etcd: a term's checkpoints after its first are one txn**, without the read
   before it (the client knows what it wrote under its fence).
10. **A hush while the lease changes hands**: the node's own event and heartbeat
    writes wait (250 ms at most) from the request until the release on the old
    leader, and from the acquisition until the first step has begun on the new one,
    which also sets its watch up only then. Unhushed at the restore instead, their
    threads took the GIL from the first step (3.5 ms p50 on Redis).

Graceful handover (SIGTERM) gained too: last publish → agent resumed 29 ms p99 (was 57).

Changed since (2026-12-02, later; commits c18f94b, 899bebe):

11. **The old leader writes the target's term** (`LeaseKeeper.hand_over`): its
    compare-and-set makes the target the holder of the next epoch, with the session
    the target's heartbeat names (read while the step in flight finishes), and the
    fence moves with it. The target leads at once, without a write of its own: it
    counts the lease from the send time of a read that still found the record before
    the hand-over (a standby reads, instead of taking the watch's record, when the
    record carries a new operator request, which the switchover request is), renews
    at once beside its restore, and renews first if it has no such read within half
    the renew deadline. On etcd the chain after the request is now the last publish,
    the hand-over (two writes), the watch's delivery and one read (the restore).

Before item 11, on bdb3006 (06:27 UTC): etcd 74.0 ms busy and 59.3 ms waiting (p99),
Redis 32.9 and 26.8, file 63.0 and 48.9; the etcd figures missed the 50 ms target.

What is left:

* **etcd** meets its target now, but the last publish and the hand-over are still
  two Raft commits in series (8 to 13 ms p50 each on this machine's disk): one txn
  holding both (the last checkpoint and the target's term) would take one away.
* **(b), the whole call.** `request_switchover` now judges the leader and the target
  live from one read of their fresh records of this term (docs/design.md, "A switchover
  judges liveness at once") and watches only when those do not tell: on 2026-12-05 the
  call → first step was 10–55 ms on every store (it was up to half a TTL more).
* **(d), the command**, measured first on 2026-12-05 (30 runs, load 0.0–1.6): p50 297 ms,
  p99 346 ms from its start to the target's first step, against 300 ms. Timed inside
  (20 runs): the interpreter 25 ms, importing the command line 95 ms, the file store's
  modules 55 ms, the key's derivation from the secret (scrypt, n = 2^15, which the
  request's signature needs) 85 ms, the liveness read and the request 5 ms, then some
  10 ms to the target's first step. About 60 ms of those imports was compiling: this
  machine's environment sets PYTHONDONTWRITEBYTECODE, so the source tree never kept its
  bytecode and every run compiled the package afresh, which no installed hb does; the
  benchmark now compiles it first. The command also derives the key in a thread while it
  loads the lease code and judges liveness (5–15 ms on an idle machine; within the noise
  here, where the busy leader holds the other core). After both (two `--quick` runs of 20,
  load 0.8–1.7): p50 221 and 243 ms, p99 260 and 282 ms. A way on: the file store's
  modules import asyncio (and with it ssl) at the top, though only its watch uses it:
  some 14 ms.
"""


# -- the probe: where a switchover's time goes, inside the nodes (HB_BENCH_PROBE=1) --------
#
# Wraps a few methods of the node loop and the lease keeper in the node processes (the
# library is unchanged) and appends one line per call to a file on CLOCK_BOOTTIME:
# when the store's watch woke the loop, each lease tick and release, when the loop
# tells the term to hand over and when the term has ended, and each entry to the
# loop's sleep (with whether a
# wake-up was pending then, which that sleep clears before it waits). Installed when
# the node imports this module for its agent.

PROBE_ENV = "HB_BENCH_PROBE"  # set to 1 in this process: the analysis run
PROBE_LOG_ENV = "HB_BENCH_PROBE_LOG"  # the nodes' probe file


def _install_probe(path: str) -> None:
    import sys

    from hamsterbunker.lease import LeaseKeeper
    from hamsterbunker.node.loop import NodeLoop

    argv = sys.argv
    node = argv[argv.index("--node-id") + 1] if "--node-id" in argv else "?"

    def note(what: str, start: float, **detail: Any) -> None:
        line = {"node": node, "what": what, "start": start, "end": CLOCK.monotonic(), **detail}
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, (json.dumps(line) + "\n").encode())
        finally:
            os.close(fd)

    tick, release, hand = LeaseKeeper.tick, LeaseKeeper.release, LeaseKeeper.hand_over
    sleep_until = NodeLoop._sleep_until
    switch_over, hand_over = NodeLoop._switch_over_if_asked, NodeLoop._hand_over

    def probed_tick(self: LeaseKeeper, heard: Any = None) -> Any:
        start = CLOCK.monotonic()
        result = tick(self, heard)
        epoch = result.record.epoch if result.record is not None else 0
        note("tick", start, outcome=result.outcome.name, epoch=epoch)
        return result

    def probed_release(
        self: LeaseKeeper, successor: str | None = None, *, handoff: bool = False
    ) -> bool:
        start = CLOCK.monotonic()
        done = release(self, successor, handoff=handoff)
        note("release", start, successor=successor, ok=done)
        return done

    def probed_hand(self: LeaseKeeper, successor: str, session: str, region: str) -> bool:
        start = CLOCK.monotonic()
        done = hand(self, successor, session, region)
        note("release", start, successor=successor, ok=done, handed=True)
        return done

    def probed_switch_over(self: NodeLoop, record: Any) -> None:
        start = CLOCK.monotonic()
        leaving = self._term is not None and self._term.leaving.is_set()
        switch_over(self, record)
        if not leaving and self._term is not None and self._term.leaving.is_set():
            note("hand_over_asked", start)

    async def probed_hand_over(self: NodeLoop, ended: Any) -> None:
        note("term_handed_over", CLOCK.monotonic())
        await hand_over(self, ended)

    async def probed_sleep(self: NodeLoop, deadline: float) -> None:
        # A wake-up pending here is cleared by the sleep before it waits.
        note("sleep", CLOCK.monotonic(), wake_pending=self._signals.wake.is_set())
        await sleep_until(self, deadline)

    async def probed_watch(self: NodeLoop, leading: bool) -> None:  # NodeLoop._watch, noted
        try:
            watch = self._store.watch(self._id.agent, lease_only=True, terms_only=leading)
            async for record in watch:
                note("wake", CLOCK.monotonic())
                self._heard.add(record)
                self._signals.wake.set()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # as the library's: the watch is only a hint
            note("watch_stopped", CLOCK.monotonic(), error=str(exc))

    for cls, name, wrapper in (
        (LeaseKeeper, "tick", probed_tick),
        (LeaseKeeper, "release", probed_release),
        (LeaseKeeper, "hand_over", probed_hand),
        (NodeLoop, "_watch", probed_watch),
        (NodeLoop, "_sleep_until", probed_sleep),
        (NodeLoop, "_switch_over_if_asked", probed_switch_over),
        (NodeLoop, "_hand_over", probed_hand_over),
    ):
        setattr(cls, name, wrapper)


if os.environ.get(PROBE_LOG_ENV):
    _install_probe(os.environ[PROBE_LOG_ENV])


class ShortStepAgent:
    """Counts up once per step of STEP_S seconds; notes when each term's first step starts."""

    id = AGENT_ID

    def __init__(self) -> None:
        self._log = os.environ.get(STEP_LOG_ENV)
        self._epoch = 0

    def init(self) -> dict[str, Any]:
        return {"count": 0}

    async def step(self, state: dict[str, Any]) -> dict[str, Any]:
        started = CLOCK.monotonic()
        context = current_step()
        if self._log and context is not None and context.epoch != self._epoch:
            self._epoch = context.epoch
            line = {"node": context.node, "epoch": context.epoch, "seq": context.seq,
                    "start": started}  # fmt: skip
            fd = os.open(self._log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                os.write(fd, (json.dumps(line) + "\n").encode())
            finally:
                os.close(fd)
        wait_s = os.environ.get(WAIT_ENV)
        if wait_s and context is not None:
            await context.wait_for_inbox(float(wait_s))
        else:
            await asyncio.sleep(STEP_S)
        return {"count": state["count"] + 1}


@dataclass
class _ShortStepCluster(LocalCluster):
    """The benchmark cluster's nodes, running ShortStepAgent instead of CounterAgent."""

    def __post_init__(self) -> None:
        self.agent, self.agent_id = AGENT, AGENT_ID
        self.env = {
            **self.env,
            "PYTHONPATH": str(REPO),  # the nodes import this module's agent
            STEP_LOG_ENV: str(self.log_dir.parent / "steps.jsonl"),
        }
        if os.environ.get(PROBE_ENV) == "1":
            self.env[PROBE_LOG_ENV] = str(self.log_dir.parent / "probe.jsonl")


@dataclass
class _WaitingCluster(_ShortStepCluster):
    """The same nodes, whose agent waits for work in each step (the waiting workload)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.env[WAIT_ENV] = str(WAIT_S)


WORKLOADS: dict[str, type[_ShortStepCluster]] = {
    "busy": _ShortStepCluster,
    "waiting": _WaitingCluster,
}


class _Lines:
    """The complete JSON lines appended to a file since the last read (no re-parsing)."""

    def __init__(self, path: Path) -> None:
        self.path, self._offset, self._partial = path, 0, b""

    def new(self) -> list[dict[str, Any]]:
        try:
            with open(self.path, "rb") as file:
                file.seek(self._offset)
                data = file.read()
        except FileNotFoundError:
            return []
        self._offset += len(data)
        *lines, self._partial = (self._partial + data).split(b"\n")
        return [json.loads(line) for line in lines if line.strip()]


class _TimedStore:
    """The benchmark's store, noting when its last lease compare-and-set was sent and returned
    (request_switchover's last store call is the compare-and-set of the request)."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self.cas_sent = self.cas_returned = 0.0

    def cas_lease(self, *args: Any) -> Any:
        self.cas_sent = CLOCK.monotonic()
        result = self._store.cas_lease(*args)
        self.cas_returned = CLOCK.monotonic()
        return result

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


@dataclass(frozen=True)
class Sample:
    """One switchover; times in seconds after the request was written (its CAS returned)."""

    old: str
    asked: str
    new: str
    epoch: int  # the new leader's
    via: str  # lease.history[-1].via
    history_to: str  # lease.history[-1].to
    call: float  # request_switchover called (negative: before the write)
    cas_sent: float  # the request's compare-and-set was sent (negative)
    last_published: float | None  # the old leader's last accepted publish of its epoch
    seen: float | None  # the old leader saw the request: its lease.switchover_asked event
    released: float | None  # its lease.released event
    acquired_event: float | None  # the new leader's lease.acquired event
    acquired: float
    restore_start: float
    restored: float
    first_step: float  # the agent's first step of the new epoch started
    publish_start: float
    published: float
    probe: dict[str, float] = field(default_factory=dict)  # PROBE_PARTS, if probed

    @property
    def published_without_step(self) -> float:
        return self.published - (self.publish_start - self.restored)


class _Watcher:
    """What the nodes wrote to their history and step log, and the store's events, read on.

    Only what the figures need is kept, so that a poll stays cheap however long the
    history grows (a leader publishes some hundred steps a second).
    """

    def __init__(self, cluster: BenchCluster) -> None:
        self.cluster = cluster
        self._history = _Lines(cluster.history)
        self._steps = _Lines(cluster.workdir / "steps.jsonl")
        self._probe = _Lines(cluster.workdir / "probe.jsonl")
        self.probe: list[dict[str, Any]] = []  # the nodes' probe lines, if probed
        self.acquires: list[Op] = []
        self.restores: dict[tuple[str, int], Op] = {}  # (node, epoch) → its first restore
        self.first_publish: dict[tuple[str, int], Op] = {}  # ... its first accepted publish
        self.last_published: dict[tuple[str, int], float] = {}  # ... the end of its last
        self.first_steps: dict[tuple[str, int], float] = {}  # ... its agent's first step
        self._after: dict[str, int] = {}
        # (type, node, epoch) → the event's time.time(), the first of each
        self.events: dict[tuple[str, str, int], float] = {}

    def read(self) -> None:
        for doc in self._history.new():
            op = Op(**doc)
            key = (op.node, op.epoch)
            if op.op == "acquire" and op.outcome == "ok":
                self.acquires.append(op)
            elif op.op == "restore":
                self.restores.setdefault(key, op)
            elif op.op == "publish" and op.outcome == "ok":
                first = self.first_publish.get(key)
                if first is None or op.seq < first.seq:
                    self.first_publish[key] = op
                self.last_published[key] = max(self.last_published.get(key, op.end), op.end)
        for doc in self._steps.new():
            self.first_steps.setdefault((doc["node"], doc["epoch"]), doc["start"])
        self.probe += self._probe.new()

    def event_time(self, kind: str, node: str, epoch: int) -> float | None:
        """The time of node's first event of kind in epoch, reading on from the store."""
        for event in self.cluster.store.read_events(AGENT_ID, self._after):
            self._after[event.node] = max(self._after.get(event.node, 0), event.n)
            if event.type in EVENTS:
                self.events.setdefault((event.type, event.node, event.epoch), event.time)
        return self.events.get((kind, node, epoch))

    def first_checkpoint(self, epoch: int) -> tuple[Op, Op, Op, float] | None:
        """(acquire, restore, first publish, first step start) of the term after epoch."""
        self.read()
        acquires = [op for op in self.acquires if op.epoch > epoch]
        if not acquires:
            return None
        acquire = min(acquires, key=lambda op: op.epoch)
        key = (acquire.node, acquire.epoch)
        restore, publish = self.restores.get(key), self.first_publish.get(key)
        step = self.first_steps.get(key)
        if restore is None or publish is None or step is None:
            return None
        return acquire, restore, publish, step


def _switchovers(
    cluster: BenchCluster, count: int, budget_s: float, seed: int
) -> tuple[list[Sample], list[str]]:
    rng = random.Random(seed)
    watcher = _Watcher(cluster)
    cluster.ready_leader()
    record = cluster.store.read_cluster()
    if record is None:
        raise BenchmarkError("the store has no cluster record although a node leads")
    sealer = Sealer(SECRET, record)
    timed = _TimedStore(cluster.store)
    samples: list[Sample] = []
    notes: list[str] = []
    deadline = time.monotonic() + budget_s
    for i in range(count):
        if time.monotonic() > deadline:
            notes.append(
                f"time budget of {budget_s:.0f} s reached after {len(samples)} switchovers"
            )
            break
        leader = cluster.ready_leader()
        target = sorted(spec.node for spec in NODES if spec.node != leader.node)[i % 2]
        time.sleep(rng.uniform(0, cluster.tick_s))  # a random phase against the ticks
        called = CLOCK.monotonic()
        asked = request_switchover(timed, sealer, AGENT_ID, to=target)
        now, now_wall = CLOCK.monotonic(), time.time()
        written = timed.cas_returned  # the call returns right after it
        written_wall = now_wall - (now - written)
        if asked != target:
            raise BenchmarkError(f"asked for {target}, request_switchover chose {asked}")
        acquire, restore, publish, step = wait_for(
            lambda: watcher.first_checkpoint(leader.epoch),  # noqa: B023 (called at once)
            f"the term after epoch {leader.epoch} to publish",
            timeout=3 * cluster.ttl_s + 20,
            every=0.02,
        )
        lease = cluster.store.read_lease(AGENT_ID)
        last = lease.history[-1] if lease is not None and lease.history else None
        if last is None or last.epoch != acquire.epoch:
            raise BenchmarkError(f"the lease record names no takeover of epoch {acquire.epoch}")
        seen, released, acquired_event = (
            _event(watcher, kind, node, epoch, written_wall)
            for kind, node, epoch in (
                ("lease.switchover_asked", leader.node, leader.epoch),
                ("lease.released", leader.node, leader.epoch),
                ("lease.acquired", acquire.node, acquire.epoch),
            )
        )
        last_published = watcher.last_published.get((leader.node, leader.epoch))
        samples.append(
            Sample(
                old=leader.node,
                asked=target,
                new=acquire.node,
                epoch=acquire.epoch,
                via=last.via,
                history_to=last.to,
                call=called - written,
                last_published=None if last_published is None else last_published - written,
                seen=seen,
                released=released,
                acquired_event=acquired_event,
                acquired=acquire.end - written,
                restore_start=restore.start - written,
                restored=restore.end - written,
                first_step=step - written,
                publish_start=publish.start - written,
                published=publish.end - written,
                cas_sent=timed.cas_sent - written,
                probe=_probed(
                    watcher.probe, leader.node, acquire.node, acquire.epoch, timed.cas_sent
                ),
            )
        )
    if not samples:
        raise BenchmarkError("no switchover measured")
    return samples, notes


@dataclass(frozen=True)
class CliSample:
    """One `hb switchover --wait` run; seconds after the command was started."""

    asked: str
    new: str
    first_step: float  # the target's first step of the new epoch started
    exited: float  # the command exited (0: the target leads)


def _cli_switchovers(
    cluster: BenchCluster, count: int, budget_s: float, seed: int
) -> tuple[list[CliSample], list[str]]:
    """Run `hb switchover --to TARGET --wait` count times, each after the cluster settled."""
    rng = random.Random(seed)
    watcher = _Watcher(cluster)
    nodes = cluster.cluster
    env = {**os.environ, **nodes.env, "HB_STORE": nodes.store_url, "HB_SECRET": SECRET}
    env.pop("CREDENTIALS_DIRECTORY", None)
    command = [sys.executable, "-m", "hamsterbunker", "switchover", "--agent-id", AGENT_ID]
    samples: list[CliSample] = []
    notes: list[str] = []
    deadline = time.monotonic() + budget_s
    for i in range(count):
        if time.monotonic() > deadline:
            notes.append(f"time budget of {budget_s:.0f} s reached after {len(samples)} runs")
            break
        leader = cluster.ready_leader()
        target = sorted(spec.node for spec in NODES if spec.node != leader.node)[i % 2]
        time.sleep(rng.uniform(0, cluster.tick_s))  # a random phase against the ticks
        started = CLOCK.monotonic()
        done = subprocess.run(
            [*command, "--to", target, "--wait", "--timeout", "20"],
            env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        exited = CLOCK.monotonic()
        if done.returncode != 0:
            raise BenchmarkError(f"hb switchover exited {done.returncode}: {done.stderr.strip()}")
        acquire, _, _, step = wait_for(
            lambda: watcher.first_checkpoint(leader.epoch),  # noqa: B023 (called at once)
            f"the term after epoch {leader.epoch} to publish",
            timeout=3 * cluster.ttl_s + 20,
            every=0.02,
        )
        samples.append(CliSample(target, acquire.node, step - started, exited - started))
    if not samples:
        raise BenchmarkError("no hb switchover measured")
    return samples, notes


def _measure_cli(quick: bool) -> tuple[list[CliSample], list[str], list[str]]:
    count = QUICK_CLI_SWITCHOVERS if quick else CLI_SWITCHOVERS
    budget = QUICK_BUDGET_S if quick else BUDGET_S
    _compile_package()
    with bench_cluster(f"{NAME}-cli", timing=TIMING, cluster_class=_ShortStepCluster) as cluster:
        samples, notes = _cli_switchovers(cluster, count, budget, seed=36)
        violations = cluster.safety_violations()
    return samples, notes, violations


def _compile_package() -> None:
    """Compile the package's bytecode, as installing it does (pip, Nix), so that the command
    loads it as an installed hb does: where PYTHONDONTWRITEBYTECODE is set, a source tree
    never caches it, and each run would compile a hundred modules afresh (some 60 ms)."""
    package = Path(hamsterbunker.__file__).parent
    if not compileall.compile_dir(package, quiet=1):
        raise BenchmarkError(f"python -m compileall {package} failed")


def _cli_result(
    samples: list[CliSample], notes: list[str], violations: list[str]
) -> tuple[list[Table], list[Check], list[str]]:
    headline = [s.first_step for s in samples]
    wrong = [s for s in samples if s.new != s.asked]
    table = Table(
        f"hb switchover --to NODE --wait on file, busy (TTL {TTL_MS} ms, tick {TICK_MS} ms)",
        SPREAD_HEADERS,
        [
            _spread("(d) command started → the target's first step starts", headline),
            _spread(
                "command started → command exited (the target leads)", [s.exited for s in samples]
            ),
        ],
    )
    checks = [
        Check(
            "file, hb switchover: p99, command started → the target's first step starts",
            f"{ms(percentile(headline, 99))} ms",
            f"≤ {CLI_TARGET_MS} ms",
            percentile(headline, 99) <= CLI_TARGET_MS / 1000,
        ),
        Check(
            "file, hb switchover: runs whose target took the lease",
            f"{len(samples) - len(wrong)} of {len(samples)}",
            f"{len(samples)} of {len(samples)}",
            not wrong,
        ),
        Check(
            "file, hb switchover: safety violations in the history (checker)",
            str(len(violations)),
            "0",
            not violations,
        ),
    ]
    slowest = sorted(headline, reverse=True)[:3]
    notes = [
        *notes,
        f"{len(samples)} runs of hb switchover; slowest three: "
        + ", ".join(f"{ms(value)} ms" for value in slowest),
        *[f"checker: {v}" for v in violations],
    ]
    return [table], checks, [f"file, hb switchover: {n}" for n in notes]


PROBE_PARTS = (
    "the request's compare-and-set sent → the old leader's watch wakes it",
    "its wake-up → the loop tells the term to hand over (the record the watch carried)",
    "→ the term has ended (step in flight finished, published)",
    "→ its hand-over starts (the target's heartbeat read meanwhile)",
    "its hand-over (one compare-and-set writing the target's term)",
    "its hand-over returned → the new leader's watch wakes it",
    "that wake-up → its adopting tick starts",
    "its adopting tick (no write: the record the watch carried, or one read)",
)
BY_WATCH = "by watch"  # 1.0: the old leader saw the request through its watch, 0.0: at a tick


def _probed(
    lines: list[dict[str, Any]], old: str, new: str, epoch: int, sent: float
) -> dict[str, float]:
    """The PROBE_PARTS of one switchover found in the nodes' probe lines (seconds).

    sent: when the request's compare-and-set was sent; a node may see the request
    before this process sees the compare-and-set return.
    """

    def first(node: str, what: str, after: float, **match: Any) -> dict[str, Any] | None:
        return next(
            (
                line
                for line in lines
                if line["node"] == node
                and line["what"] == what
                and line["start"] > after
                and all(line.get(k) == v for k, v in match.items())
            ),
            None,
        )

    def last(node: str, what: str, before: float) -> dict[str, Any] | None:
        found = [
            line for line in lines
            if line["node"] == node and line["what"] == what and line["end"] <= before
        ]  # fmt: skip
        return found[-1] if found else None

    asked = first(old, "hand_over_asked", sent)
    ended = first(old, "term_handed_over", sent)
    release = first(old, "release", sent)
    acquired = first(new, "tick", sent, outcome="ACQUIRED", epoch=epoch)
    if None in (asked, ended, release, acquired):
        return {}
    assert asked and ended and release and acquired
    woke = last(old, "wake", asked["start"])
    if woke is not None and woke["start"] < sent:
        woke = None  # the request was seen at a tick of the leader's own, not by the watch
    # The wake-up that led to the acquiring tick, if the release caused it.
    new_woke = last(new, "wake", acquired["start"])
    if new_woke is not None and new_woke["start"] < release["start"]:
        new_woke = None
    found = dict(
        zip(
            PROBE_PARTS,
            (
                None if woke is None else woke["start"] - sent,
                None if woke is None else asked["start"] - woke["start"],
                ended["start"] - asked["start"],
                release["start"] - ended["start"],
                release["end"] - release["start"],
                None if new_woke is None else new_woke["start"] - release["end"],
                None if new_woke is None else acquired["start"] - new_woke["start"],
                acquired["end"] - acquired["start"],
            ),
            strict=True,
        )
    )
    found[BY_WATCH] = float(woke is not None)
    return {part: value for part, value in found.items() if value is not None}


def _event(watcher: _Watcher, kind: str, node: str, epoch: int, origin: float) -> float | None:
    """Seconds from origin (time.time()) to the node's event; None if it did not come."""
    try:
        found = wait_for(
            lambda: watcher.event_time(kind, node, epoch), f"{node}'s {kind}", 5, every=0.05
        )
    except BenchmarkError:
        return None
    return found - origin


@contextlib.contextmanager
def _store_url(backend: str) -> Iterator[str | None]:
    if backend == "file":
        yield None  # bench_cluster's file store in its temporary directory
    else:
        with _server(backend) as url:
            yield url


def _measure(backend: str, workload: str, quick: bool) -> tuple[list[Sample], list[str], list[str]]:
    count = QUICK_SWITCHOVERS if quick else SWITCHOVERS
    budget = QUICK_BUDGET_S if quick else BUDGET_S
    with (
        _store_url(backend) as url,
        bench_cluster(
            f"{NAME}-{backend}-{workload}",
            timing=TIMING,
            cluster_class=WORKLOADS[workload],
            store_url=url,
        ) as cluster,
    ):
        samples, notes = _switchovers(cluster, count, budget, seed=17)
        violations = cluster.safety_violations()
    return samples, notes, violations


def _spread(label: str, values: list[float]) -> list[str]:
    return spread_row(label, values) if values else [label, "0", "–", "–", "–", "–"]


def _backend_result(backend: str, workload: str, samples: list[Sample], notes: list[str],
                    violations: list[str]) -> tuple[list[Table], list[Check], list[str]]:  # fmt: skip
    target_ms = TARGET_MS[backend]
    step = f"the {STEP_S * 1000:.0f} ms step" if workload == "busy" else "the step's wait"
    backend = f"{backend}, {workload}"
    written = "request written"
    figures = {
        f"(a) {written} → new leader's first step starts": [s.first_step for s in samples],
        f"{written} → first checkpoint, agent step excluded": [
            s.published_without_step for s in samples
        ],
        f"{written} → first checkpoint (with {step})": [s.published for s in samples],
        "(b) request_switchover called → first step starts": [
            s.first_step - s.call for s in samples
        ],
        "request_switchover called → request written (liveness check, CAS)": [
            -s.call for s in samples
        ],
        "the request's compare-and-set (sent → returned)": [-s.cas_sent for s in samples],
    }
    parts = {
        f"{written} → old leader sees it (its lease.switchover_asked event)": _diffs(
            samples, lambda s: s.seen
        ),
        "→ its last publish (the step in flight finished and published)": _diffs(
            samples, lambda s: _minus(s.last_published, s.seen)
        ),
        "→ its release (its lease.released event)": _diffs(
            samples, lambda s: _minus(s.released, s.last_published)
        ),
        f"(c) {written} → old leader's release": _diffs(samples, lambda s: s.released),
        "(c) release → new leader's acquisition (its acquire op ends)": _diffs(
            samples, lambda s: _minus(s.acquired, s.released)
        ),
        "acquisition → its term starts restoring": _diffs(
            samples, lambda s: s.restore_start - s.acquired
        ),
        "the restore (reading the newest checkpoint)": _diffs(
            samples, lambda s: s.restored - s.restore_start
        ),
        "restore done → first step starts": _diffs(samples, lambda s: s.first_step - s.restored),
    }
    tables = [
        Table(
            f"Switchover on {backend} (TTL {TTL_MS} ms, tick {TICK_MS} ms)",
            SPREAD_HEADERS,
            [_spread(label, values) for label, values in figures.items()],
        ),
        Table(
            f"Parts of the switchover on {backend}",
            SPREAD_HEADERS,
            [_spread(label, values) for label, values in parts.items()],
        ),
    ]
    probed = [s for s in samples if s.probe]
    if probed:
        tables.append(
            Table(
                f"Inside the nodes on {backend} (probe: HB_BENCH_PROBE=1)",
                SPREAD_HEADERS,
                [
                    _spread(part, [s.probe[part] for s in probed if part in s.probe])
                    for part in PROBE_PARTS
                ],
            )
        )
        by_watch = sum(s.probe[BY_WATCH] == 1.0 for s in probed)
        notes.append(
            f"probe: {len(probed)} of {len(samples)} switchovers found in the probe lines; the "
            f"old leader saw the request through its watch's check in {by_watch}, at a tick of "
            f"its own in {len(probed) - by_watch}"
        )
    headline = figures[f"(a) {written} → new leader's first step starts"]
    wrong = [s for s in samples if (s.new, s.history_to, s.via) != (s.asked, s.asked, "switchover")]
    checks = [
        Check(
            f"{backend}: p99, {written} → new leader's first step starts",
            f"{ms(percentile(headline, 99))} ms",
            f"≤ {target_ms} ms",
            percentile(headline, 99) <= target_ms / 1000,
        ),
        Check(
            f"{backend}: p99, {written} → first checkpoint, agent step excluded",
            f"{ms(percentile(figures[f'{written} → first checkpoint, agent step excluded'], 99))} ms",
            "— (reported)",
            None,
        ),
        Check(
            f"{backend}: p99, request_switchover called → first step starts",
            f"{ms(percentile(figures['(b) request_switchover called → first step starts'], 99))} ms",
            "— (includes the call's liveness check)",
            None,
        ),
        Check(
            f"{backend}: switchovers to the asked target, via=switchover in lease.history[-1]",
            f"{len(samples) - len(wrong)} of {len(samples)}",
            f"{len(samples)} of {len(samples)}",
            not wrong,
        ),
        Check(
            f"{backend}: safety violations in the history (checker)",
            str(len(violations)),
            "0",
            not violations,
        ),
    ]
    new_leaders = Counter(s.new for s in samples)
    slowest = sorted(samples, key=lambda s: -s.first_step)[:3]
    notes = [
        *notes,
        f"{len(samples)} switchovers; new leaders: "
        + ", ".join(f"{node} × {n}" for node, n in sorted(new_leaders.items())),
        "slowest three, first step after " + "; ".join(_split(s) for s in slowest),
        *[
            f"wrong switchover: asked {s.asked}, {s.new} took epoch {s.epoch}, "
            f"history names {s.history_to} via {s.via}"
            for s in wrong
        ],
        *[f"checker: {v}" for v in violations],
    ]
    missing = sum(s.seen is None or s.released is None for s in samples)
    if missing:
        notes.append(f"{missing} switchovers without the old leader's events (left out of parts)")
    if len(samples) < 100:
        notes.append(f"with n = {len(samples)}, p99 interpolates between the two largest samples")
    return tables, checks, [f"{backend}: {n}" for n in notes]


def _minus(value: float | None, origin: float | None) -> float | None:
    return None if value is None or origin is None else value - origin


def _diffs(samples: list[Sample], figure: Callable[[Sample], float | None]) -> list[float]:
    """figure of every sample that has it."""
    return [value for value in map(figure, samples) if value is not None]


def _split(s: Sample) -> str:
    def at(value: float | None) -> str:
        return "?" if value is None else ms(value)

    return (
        f"{ms(s.first_step)} ms ({s.old} → {s.new}: seen {at(s.seen)}, last publish "
        f"{at(s.last_published)}, released {at(s.released)}, acquired {ms(s.acquired)}, "
        f"restored {ms(s.restored)})"
    )


def run(quick: bool) -> Result:
    tables: list[Table] = []
    checks: list[Check] = []
    notes: list[str] = []
    for backend in BACKENDS:
        for workload in WORKLOADS:
            samples, backend_notes, violations = _measure(backend, workload, quick)
            part = _backend_result(backend, workload, samples, backend_notes, violations)
            tables += part[0]
            checks += part[1]
            notes += part[2]
    part = _cli_result(*_measure_cli(quick))
    tables += part[0]
    checks += part[1]
    notes += part[2]
    return Result(NAME, TITLE, METHOD, tables, checks, notes, ANALYSIS, analysis_always=True)
