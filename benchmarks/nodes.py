"""Three real node processes on a temporary file store, as ``hb demo`` runs them.

Every node appends its lease and checkpoint operations to one history file
(``hb run --history``): start and end of each on the node's clock
(``hamsterbunker.core.clock``, CLOCK_BOOTTIME), which all processes of one machine
share, so the benchmark's own reading of that clock at a kill can be compared
with the nodes' times directly.
"""

from __future__ import annotations

import random
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from hamsterbunker import FileStore
from hamsterbunker.core.clock import MonotonicClock
from hamsterbunker.core.history import Op, read_history
from hamsterbunker.core.timing import LeaseTiming
from hamsterbunker.ops.checker import check
from hamsterbunker.ops.local import LocalCluster, NodeSpec
from hamsterbunker.stores import Store, open_store

from .common import (
    SECRET,
    SPREAD_TTL_HEADERS,
    TIMING,
    BenchmarkError,
    Check,
    Result,
    Table,
    ms,
    percentile,
    spread_row,
    temp_dir,
    wait_for,
)

NODE_CLOCK = MonotonicClock()  # the clock the nodes write their history on
AGENT = "hamsterbunker.demo:CounterAgent"  # counts up once per 0.25 s step
AGENT_ID = "counter"
NODES = (
    NodeSpec("bench-1", "eu-central"),
    NodeSpec("bench-2", "us-east"),
    NodeSpec("bench-3", "ap-south"),
)

FIRST_STEP = (
    "agent's first step (CounterAgent: a 100 ms journaled effect, reused if recorded, then 150 ms)"
)


# Where a graceful handover is measured from (takeover_result's from_last_publish).
LAST = "last publish"


@dataclass(frozen=True)
class Leader:
    node: str
    epoch: int
    pid: int


@dataclass(frozen=True)
class Takeover:
    """What the nodes recorded for the first term after a given epoch."""

    node: str
    epoch: int
    via: str
    acquired: float  # monotonic end of the acquire op
    restored: float  # end of the restore op: state loaded, the first new step about to start
    publish_start: float  # start of the first publish of the new epoch (seal + put_checkpoint)
    published: float  # end of it: the first checkpoint of the new epoch is durable


class BenchCluster:
    def __init__(
        self,
        workdir: Path,
        timing: LeaseTiming,
        cluster_class: type[LocalCluster] = LocalCluster,
        store_url: str | None = None,
        command_prefix: Callable[[str], list[str]] | None = None,
    ) -> None:
        self.workdir = workdir
        # Per node, a wrapper that execs it (e.g. `ip netns exec NS`), restarts included.
        self.command_prefix = command_prefix
        self.history = workdir / "history.jsonl"
        self.cluster = cluster_class(
            store_url=store_url or (workdir / "store").as_uri(),
            secret=SECRET,
            agent=AGENT,
            log_dir=workdir / "logs",
            timing=timing,
            history=self.history,
        )
        self.store: Store = open_store(store_url) if store_url else FileStore(workdir / "store")
        self.tick_s = timing.tick_s
        self.ttl_s = timing.lease_ttl_s

    # -- processes ----------------------------------------------------------------

    def start(self, node: str) -> None:
        prefix = self.command_prefix(node) if self.command_prefix else None
        self.cluster.start(next(spec for spec in NODES if spec.node == node), command_prefix=prefix)

    def process(self, node: str) -> subprocess.Popen[bytes]:
        return self.cluster.processes[node]

    def signal_and_reap(
        self, node: str, signum: signal.Signals, timeout: float = 15
    ) -> tuple[float, float]:
        """Send signum and reap the process; (monotonic, wall) time just before it was sent."""
        process = self.process(node)
        sent_wall = time.time()
        sent = NODE_CLOCK.monotonic()
        process.send_signal(signum)
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)
            raise BenchmarkError(
                f"{node} did not exit within {timeout} s of {signum.name}"
            ) from None
        return sent, sent_wall

    def stop_all(self) -> None:
        self.cluster.stop_all()

    # -- what the store says ------------------------------------------------------

    def ready_leader(self, timeout: float = 30) -> Leader:
        """Wait until every node runs, one leads and has published in its epoch, the rest stand by."""

        def probe() -> Leader | None:
            for spec in NODES:
                if not self.cluster.alive(spec.node):
                    raise BenchmarkError(f"{spec.node} exited:\n{self.log_tail(spec.node)}")
            lease = self.store.read_lease(AGENT_ID)
            if lease is None or lease.holder is None:
                return None
            checkpoints = self.store.list_checkpoints(AGENT_ID)
            if not checkpoints or checkpoints[0].epoch != lease.epoch:
                return None
            beats = {b.node: b for b in self.store.list_heartbeats(AGENT_ID)}
            for spec in NODES:
                beat = beats.get(spec.node)
                want = "active" if spec.node == lease.holder else "standby"
                if beat is None or beat.pid != self.cluster.pid(spec.node) or beat.role != want:
                    return None
            return Leader(lease.holder, lease.epoch, self.cluster.pid(lease.holder))

        return wait_for(probe, "a leader with a checkpoint and two standbys", timeout, every=0.05)

    def ops(self) -> list[Op]:
        return read_history(self.history) if self.history.exists() else []

    def takeover_after(self, epoch: int, timeout: float) -> Takeover:
        """Wait until a new term (epoch above the given one) has published its first checkpoint."""

        def probe() -> Takeover | None:
            later = [op for op in self.ops() if op.epoch > epoch]
            acquires = [op for op in later if op.op == "acquire" and op.outcome == "ok"]
            if not acquires:
                return None
            first = min(acquires, key=lambda op: op.epoch)
            term = [op for op in later if op.epoch == first.epoch and op.node == first.node]
            restores = [op for op in term if op.op == "restore"]
            publishes = [op for op in term if op.op == "publish" and op.outcome == "ok"]
            if not restores or not publishes:
                return None
            publish = min(publishes, key=lambda op: op.seq)
            return Takeover(
                node=first.node,
                epoch=first.epoch,
                via=self._acquired_via(first.node, first.epoch),
                acquired=first.end,
                restored=restores[0].end,
                publish_start=publish.start,
                published=publish.end,
            )

        return wait_for(probe, f"a new term after epoch {epoch} to publish", timeout, every=0.05)

    def _acquired_via(self, node: str, epoch: int) -> str:
        """Why the node says it acquired (released, expired, empty), from its stored events."""
        try:
            found = wait_for(
                lambda: next(
                    (
                        e
                        for e in self.store.read_events(AGENT_ID)
                        if e.type == "lease.acquired" and e.node == node and e.epoch == epoch
                    ),
                    None,
                ),
                "the lease.acquired event",
                timeout=2,
                every=0.05,
            )
        except BenchmarkError:
            return "?"
        return str(found.detail.get("via", "?"))

    def released_at(self, node: str, epoch: int, sent_wall: float) -> float | None:
        """Seconds from the signal to the node's lease.released event of epoch, if it has one.

        Event times are the writer's time.time(); the node is on this machine, so the
        clock is the same one as the benchmark's time.time() at the signal.
        """
        for event in self.store.read_events(AGENT_ID):
            if event.node == node and event.type == "lease.released" and event.epoch == epoch:
                return event.time - sent_wall
        return None

    def last_published(self, node: str, epoch: int) -> float | None:
        """End (the nodes' clock) of the node's last accepted publish in epoch, from the history.

        The publish op is recorded as its ``checkpoint.published`` event is emitted.
        """
        ends = [
            op.end
            for op in self.ops()
            if op.node == node and op.epoch == epoch and op.op == "publish" and op.outcome == "ok"
        ]
        return max(ends, default=None)

    def safety_violations(self) -> list[str]:
        return [str(v) for v in check(self.ops())]

    def log_tail(self, node: str, lines: int = 15) -> str:
        return "\n".join(self.cluster.log(node).splitlines()[-lines:])


@contextmanager
def bench_cluster(
    name: str,
    timing: LeaseTiming = TIMING,
    cluster_class: type[LocalCluster] = LocalCluster,
    store_url: str | None = None,
    command_prefix: Callable[[str], list[str]] | None = None,
) -> Iterator[BenchCluster]:
    """Start the three nodes; stop (SIGTERM, then SIGKILL) and reap them and remove all files after.

    The nodes share a file store in the temporary directory, or the store at store_url;
    command_prefix(node), if given, is the wrapper each node's command runs under.
    """
    with temp_dir(name) as workdir:
        cluster = BenchCluster(workdir, timing, cluster_class, store_url, command_prefix)
        try:
            for spec in NODES:
                cluster.start(spec.node)
            yield cluster
        except BaseException:
            for spec in NODES:
                print(f"----- last lines of {spec.node}'s log -----\n{cluster.log_tail(spec.node)}")
            raise
        finally:
            cluster.stop_all()
            cluster.store.close()


@dataclass(frozen=True)
class Sample:
    """One takeover, in seconds after the signal was sent to the leader."""

    old: str
    new: str
    sent: float  # monotonic time just before the signal
    via: str
    acquired: float
    restored: float
    published: float
    publish: float  # the first publish itself (seal + put_checkpoint)
    step: float  # restore end → publish start: the agent's first step of the new term
    released: float | None  # the old leader's lease.released event (graceful stop only)
    # The end of the old leader's last accepted publish of its epoch (its history; may be
    # before the signal, if no step was in flight to be finished and published).
    last_published: float | None = None

    @property
    def published_without_step(self) -> float:
        return self.published - self.step

    @property
    def handover_start(self) -> float:
        """Where a graceful handover is measured from: the old leader's last publish if the
        stop published the step in flight (after the signal), else the signal itself."""
        if self.last_published is not None and self.last_published > 0:
            return self.last_published
        return 0.0

    @property
    def stop_published(self) -> bool:
        return self.last_published is not None and self.last_published > 0


def takeovers(
    cluster: BenchCluster, signum: signal.Signals, count: int, budget_s: float, seed: int
) -> tuple[list[Sample], list[str]]:
    """Signal the leader count times (bounded by budget_s); restart it each time."""
    rng = random.Random(seed)
    samples: list[Sample] = []
    notes: list[str] = []
    deadline = time.monotonic() + budget_s
    for _ in range(count):
        if time.monotonic() > deadline:
            notes.append(f"time budget of {budget_s:.0f} s reached after {len(samples)} takeovers")
            break
        leader = cluster.ready_leader()
        # A random phase against the leader's renewal tick, so the kills sample all of it.
        time.sleep(rng.uniform(0, cluster.tick_s))
        sent, sent_wall = cluster.signal_and_reap(leader.node, signum)
        took = cluster.takeover_after(leader.epoch, timeout=3 * cluster.ttl_s + 20)
        if took.node == leader.node or took.epoch != leader.epoch + 1:
            raise BenchmarkError(
                f"unexpected takeover after epoch {leader.epoch}: {took.node} epoch {took.epoch}"
            )
        samples.append(
            Sample(
                old=leader.node,
                new=took.node,
                sent=sent,
                via=took.via,
                acquired=took.acquired - sent,
                restored=took.restored - sent,
                published=took.published - sent,
                released=cluster.released_at(leader.node, leader.epoch, sent_wall),
                last_published=_minus(cluster.last_published(leader.node, leader.epoch), sent),
                publish=took.published - took.publish_start,
                step=took.publish_start - took.restored,
            )
        )
        cluster.start(leader.node)  # it rejoins as a standby
    if not samples:
        raise BenchmarkError("no takeover measured")
    return samples, notes


def _minus(value: float | None, origin: float) -> float | None:
    return None if value is None else value - origin


def takeover_result(
    *,
    name: str,
    title: str,
    method: str,
    analysis: str,
    analysis_always: bool = False,
    signal_word: str,
    samples: list[Sample],
    notes: list[str],
    violations: list[str],
    ttl_s: float,
    tick_ms: int,
    target_s: float,
    target_text: str,
    from_last_publish: bool = False,
) -> Result:
    """Tables and checks shared by the failover and handover benchmarks.

    from_last_publish (a graceful handover): a stop lets the step in flight finish and
    publishes it before it releases the lease, so the handover is measured, and judged,
    from that publish (``LAST``); the figures from the signal are reported beside them.
    """
    w = signal_word
    figures = {
        f"{w} → lease acquired": [s.acquired for s in samples],
        f"{w} → agent resumed": [s.restored for s in samples],
        f"{w} → first checkpoint": [s.published for s in samples],
        f"{w} → first checkpoint, agent step excluded": [s.published_without_step for s in samples],
    }
    if from_last_publish:
        figures |= {
            f"{LAST} → lease acquired": [s.acquired - s.handover_start for s in samples],
            f"{LAST} → agent resumed": [s.restored - s.handover_start for s in samples],
            f"{LAST} → first checkpoint, agent step excluded": [
                s.published_without_step - s.handover_start for s in samples
            ],
        }
    table = Table(
        f"{title} (TTL {ttl_s * 1000:.0f} ms, tick {tick_ms} ms)",
        SPREAD_TTL_HEADERS,
        [spread_row(label, values, ttl_s) for label, values in figures.items()],
    )
    parts: dict[str, list[float]] = {}
    released = [s for s in samples if s.released is not None]
    stop_published = [s for s in samples if s.stop_published and s.released is not None]
    if from_last_publish and stop_published:
        parts[f"{w} → the old leader's last publish (the step in flight finished)"] = [
            s.handover_start for s in stop_published
        ]
        parts["its last publish → lease released by it (its event time)"] = [
            s.released - s.handover_start for s in stop_published if s.released is not None
        ]
    if released:
        parts[f"{w} → lease released by the old leader (its event time)"] = [
            s.released for s in released if s.released is not None
        ]
        parts["lease released → acquired by the new leader"] = [
            s.acquired - s.released for s in released if s.released is not None
        ]
    parts |= {
        "lease acquired → agent resumed (restore)": [s.restored - s.acquired for s in samples],
        FIRST_STEP: [s.step for s in samples],
        "first publish (seal + put_checkpoint)": [s.publish for s in samples],
    }
    parts_table = Table(
        "Parts of the takeover",
        ["part", "p50 ms", "p99 ms", "max ms"],
        [
            [label, ms(percentile(v, 50)), ms(percentile(v, 99)), ms(max(v))]
            for label, v in parts.items()
        ],
    )
    judged_from = LAST if from_last_publish else w
    judged = [
        f"{judged_from} → lease acquired",
        f"{judged_from} → agent resumed",
        f"{judged_from} → first checkpoint, agent step excluded",
    ]
    checks = [
        Check(
            f"p99, {label}",
            f"{ms(percentile(figures[label], 99))} ms",
            target_text,
            percentile(figures[label], 99) <= target_s,
        )
        for label in judged
    ]
    if from_last_publish:
        checks.append(
            Check(
                f"p99, {w} → lease acquired (with the rest of the step in flight)",
                f"{ms(percentile(figures[f'{w} → lease acquired'], 99))} ms",
                "— (includes the agent's own step, finished by the stop)",
                None,
            )
        )
    checks.append(
        Check(
            f"p99, {w} → first checkpoint (with the agent's 250 ms step)",
            f"{ms(percentile(figures[f'{w} → first checkpoint'], 99))} ms",
            "— (includes the agent's own step)",
            None,
        )
    )
    checks.append(
        Check(
            "safety violations in the history (checker)", str(len(violations)), "0", not violations
        )
    )
    if from_last_publish:
        published = sum(s.stop_published for s in samples)
        notes = [
            *notes,
            f"{LAST}: the end of the old leader's last accepted publish of its epoch (its "
            f"history; the moment it emits `checkpoint.published`); in {published} of "
            f"{len(samples)} handovers the stop published the step in flight after {w}, in "
            f"the others (none in flight, or not finished within the grace) the figure is "
            f"taken from {w}",
        ]
    vias = Counter(s.via for s in samples)
    new_leaders = Counter(s.new for s in samples)
    notes = [
        *notes,
        f"takeovers: {len(samples)}; acquired via: "
        + ", ".join(f"{via} × {n}" for via, n in sorted(vias.items()))
        + "; new leaders: "
        + ", ".join(f"{node} × {n}" for node, n in sorted(new_leaders.items())),
        f"spread of {w} → lease acquired (max − min): "
        f"{ms(max(s.acquired for s in samples) - min(s.acquired for s in samples))} ms, "
        f"against a tick of {tick_ms} ms",
        "slowest three, lease acquired after "
        + "; ".join(_split(s, w) for s in sorted(samples, key=lambda s: -s.acquired)[:3]),
        f"with n = {len(samples)}, p99 interpolates between the two largest samples, "
        "so it is nearly the maximum",
        *[f"checker: {v}" for v in violations],
    ]
    return Result(
        name=name,
        title=title,
        method=method,
        tables=[table, parts_table],
        checks=checks,
        notes=notes,
        analysis=analysis,
        analysis_always=analysis_always,
    )


def _split(sample: Sample, w: str) -> str:
    text = f"{ms(sample.acquired)} ms ({sample.old} → {sample.new}"
    if sample.released is not None:
        text += f": released {ms(sample.released)} ms after {w}"
    return text + ")"
