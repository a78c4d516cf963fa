"""Switchover (``hb switchover --to NODE``): the request → the new leader's first step, per store."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hamsterbunker import current_step
from hamsterbunker.clock import MonotonicClock
from hamsterbunker.control import request_switchover
from hamsterbunker.history import Op
from hamsterbunker.local import LocalCluster
from hamsterbunker.sealing import Sealer

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
REPO = Path(__file__).resolve().parent.parent
CLOCK = MonotonicClock()  # CLOCK_BOOTTIME: the nodes' history and the agent's step log use it
AGENT = "benchmarks.switchover:ShortStepAgent"
STEP_LOG_ENV = "HB_BENCH_STEP_LOG"  # where the agent notes the start of each term's first step

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

For each switchover ({SWITCHOVERS} per store, {QUICK_SWITCHOVERS} with `--quick`):
wait until the three nodes heartbeat and the leader has published in its epoch;
choose the target, alternating between the two standbys (sorted by name); sleep a
random 0–{TICK_MS} ms; call `hamsterbunker.control.request_switchover(store, sealer,
agent, to=target)` in this process, as `hb switchover --to TARGET` does. The call
first watches the lease record and the heartbeats until the leader and the target
are seen live (their records change: up to about one tick), then writes the signed
request into the lease record by compare-and-set and returns. Then wait until the
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
  called: includes the call's liveness watch (it polls every 50 ms until the leader
  has renewed and the target has beaten once while watched, so up to about a tick).
  Reported, no target.
* **(c) parts**: request written → the old leader's last publish of its epoch (the
  step in flight finished; from its history) → its `lease.released` event (emitted as
  the release's compare-and-set returns; the event's time is the node's
  `time.time()`, compared with this process's `time.time()` at the write) → the new
  leader's acquisition (the end of its `acquire` op) → its restore → its first step.
"""

ANALYSIS = """\
(Filled in from the run: see the notes of each store.)
"""


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
    last_published: float | None  # the old leader's last accepted publish of its epoch
    released: float | None  # its lease.released event
    acquired: float
    restored: float
    first_step: float  # the agent's first step of the new epoch started
    publish_start: float
    published: float

    @property
    def published_without_step(self) -> float:
        return self.published - (self.publish_start - self.restored)


class _Watcher:
    """What the nodes wrote to their history and step log, and the store's events, read on."""

    def __init__(self, cluster: BenchCluster) -> None:
        self.cluster = cluster
        self._history = _Lines(cluster.history)
        self._steps = _Lines(cluster.workdir / "steps.jsonl")
        self.ops: list[Op] = []
        self.first_steps: dict[tuple[str, int], float] = {}
        self._after: dict[str, int] = {}
        self.released: dict[tuple[str, int], float] = {}  # (node, epoch) → event time.time()

    def read(self) -> None:
        self.ops += [Op(**doc) for doc in self._history.new()]
        for doc in self._steps.new():
            self.first_steps.setdefault((doc["node"], doc["epoch"]), doc["start"])

    def released_by(self, node: str, epoch: int) -> float | None:
        """The time of node's lease.released event of epoch (a switchover), reading on."""
        for event in self.cluster.store.read_events(AGENT_ID, self._after):
            self._after[event.node] = max(self._after.get(event.node, 0), event.n)
            if event.type == "lease.released" and event.detail.get("via") == "switchover":
                self.released[(event.node, event.epoch)] = event.time
        return self.released.get((node, epoch))

    def first_checkpoint(self, epoch: int) -> tuple[Op, Op, Op, float] | None:
        """(acquire, restore, first publish, first step start) of the term after epoch."""
        self.read()
        acquires = [
            o for o in self.ops if o.op == "acquire" and o.outcome == "ok" and o.epoch > epoch
        ]
        if not acquires:
            return None
        acquire = min(acquires, key=lambda o: o.epoch)
        term = [o for o in self.ops if o.node == acquire.node and o.epoch == acquire.epoch]
        restores = [o for o in term if o.op == "restore"]
        publishes = [o for o in term if o.op == "publish" and o.outcome == "ok"]
        step = self.first_steps.get((acquire.node, acquire.epoch))
        if not restores or not publishes or step is None:
            return None
        return acquire, restores[0], min(publishes, key=lambda o: o.seq), step

    def last_published(self, node: str, epoch: int) -> float | None:
        ends = [o.end for o in self.ops if o.node == node and o.epoch == epoch
                and o.op == "publish" and o.outcome == "ok"]  # fmt: skip
        return max(ends, default=None)


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
        asked = request_switchover(cluster.store, sealer, AGENT_ID, to=target)
        written, written_wall = CLOCK.monotonic(), time.time()
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
        released = None
        with contextlib.suppress(BenchmarkError):  # reported as missing, not fatal
            released = wait_for(
                lambda: watcher.released_by(leader.node, leader.epoch),  # noqa: B023
                "the old leader's lease.released event",
                timeout=5,
                every=0.05,
            )
        last_published = watcher.last_published(leader.node, leader.epoch)
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
                released=None if released is None else released - written_wall,
                acquired=acquire.end - written,
                restored=restore.end - written,
                first_step=step - written,
                publish_start=publish.start - written,
                published=publish.end - written,
            )
        )
    if not samples:
        raise BenchmarkError("no switchover measured")
    return samples, notes


@contextlib.contextmanager
def _store_url(backend: str) -> Iterator[str | None]:
    if backend == "file":
        yield None  # bench_cluster's file store in its temporary directory
    else:
        with _server(backend) as url:
            yield url


def _measure(backend: str, quick: bool) -> tuple[list[Sample], list[str], list[str]]:
    count = QUICK_SWITCHOVERS if quick else SWITCHOVERS
    budget = QUICK_BUDGET_S if quick else BUDGET_S
    with (
        _store_url(backend) as url,
        bench_cluster(
            f"{NAME}-{backend}", timing=TIMING, cluster_class=_ShortStepCluster, store_url=url
        ) as cluster,
    ):
        samples, notes = _switchovers(cluster, count, budget, seed=17)
        violations = cluster.safety_violations()
    return samples, notes, violations


def _spread(label: str, values: list[float]) -> list[str]:
    return spread_row(label, values) if values else [label, "0", "–", "–", "–", "–"]


def _backend_result(backend: str, samples: list[Sample], notes: list[str],
                    violations: list[str]) -> tuple[list[Table], list[Check], list[str]]:  # fmt: skip
    target_ms = TARGET_MS[backend]
    written = "request written"
    figures = {
        f"(a) {written} → new leader's first step starts": [s.first_step for s in samples],
        f"{written} → first checkpoint, agent step excluded": [
            s.published_without_step for s in samples
        ],
        f"{written} → first checkpoint (with the {STEP_S * 1000:.0f} ms step)": [
            s.published for s in samples
        ],
        "(b) request_switchover called → first step starts": [
            s.first_step - s.call for s in samples
        ],
        "request_switchover called → request written (liveness watch, CAS)": [
            -s.call for s in samples
        ],
    }
    with_release = [s for s in samples if s.released is not None]
    with_last = [s for s in samples if s.last_published is not None and s.last_published > 0]
    parts = {
        f"{written} → old leader's last publish (step in flight finished)": [
            s.last_published for s in with_last if s.last_published is not None
        ],
        f"(c) {written} → old leader's release (its event)": [
            s.released for s in with_release if s.released is not None
        ],
        "old leader's last publish → its release": [
            s.released - s.last_published
            for s in with_last
            if s.released is not None and s.last_published is not None
        ],
        "(c) release → new leader's acquisition": [
            s.acquired - s.released for s in with_release if s.released is not None
        ],
        "acquisition → restore done": [s.restored - s.acquired for s in samples],
        "restore done → first step starts": [s.first_step - s.restored for s in samples],
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
            "— (includes the call's liveness watch, up to about a tick)",
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
    if len(with_release) < len(samples):
        notes.append(f"{len(samples) - len(with_release)} releases without a lease.released event")
    if len(samples) < 100:
        notes.append(f"with n = {len(samples)}, p99 interpolates between the two largest samples")
    return tables, checks, [f"{backend}: {n}" for n in notes]


def _split(s: Sample) -> str:
    released = "?" if s.released is None else ms(s.released)
    last = "?" if s.last_published is None else ms(s.last_published)
    return (
        f"{ms(s.first_step)} ms ({s.old} → {s.new}: last publish {last}, released {released}, "
        f"acquired {ms(s.acquired)}, restored {ms(s.restored)})"
    )


def run(quick: bool) -> Result:
    tables: list[Table] = []
    checks: list[Check] = []
    notes: list[str] = []
    for backend in BACKENDS:
        samples, backend_notes, violations = _measure(backend, quick)
        part = _backend_result(backend, samples, backend_notes, violations)
        tables += part[0]
        checks += part[1]
        notes += part[2]
    return Result(NAME, TITLE, METHOD, tables, checks, notes, ANALYSIS)
