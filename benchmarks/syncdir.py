"""The syncdir store on real Syncthing: failover and divergence detection against the sync delay."""

from __future__ import annotations

import contextlib
import random
import signal
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TypeVar, cast

import pytest

from hamsterbunker.core.clock import MonotonicClock
from hamsterbunker.core.history import Op
from hamsterbunker.records import Event
from tests.support.syncdir_fleet import (
    AGENT,
    SYNC_DELAY_MS,
    TICK_MS,
    TTL_MS,
    WAIT_S,
    Fleet,
    events,
    fleet_on,
    reader,
)
from tests.support.syncthing import SyncthingInstance, SyncthingMesh

from .common import (
    SPREAD_HEADERS,
    BenchmarkError,
    Check,
    Result,
    Table,
    loadavg,
    ms,
    percentile,
    spread_row,
    temp_dir,
    wait_for,
)

T = TypeVar("T")

NAME = "syncdir"
TITLE = "syncdir on Syncthing: failover and divergence against the sync delay"
SYNC_S, TICK_S, TTL_S = SYNC_DELAY_MS / 1000, TICK_MS / 1000, TTL_MS / 1000
FAILOVER_BOUND_S = TTL_S + SYNC_S  # the design: a standby sees the last renewal late by ≤ the delay
HANDOVER_BOUND_S = SYNC_S + TICK_S  # the release syncs, the standby's next tick takes it
PARTITION_S = 3 * TTL_S
DETECT_BOUND_S = 3 * TTL_S + 2 * SYNC_S  # the sync, then the next check (every 3 TTLs)
CLOCK = MonotonicClock()  # CLOCK_BOOTTIME: the clock of the nodes' history file

METHOD = f"""\
Real Syncthing instances on loopback (`tests/support/syncthing.py`: filesystem
watcher delay 1 s, the least Syncthing accepts; reconnect interval 1 s), each with a
folder of its own, and one node process per folder (`tests/support/syncdir_node.py`:
the library's `Runtime` on a `SyncDirStore` stepping `CounterAgent`, a step of
0.25 s and a checkpoint per step), all appending to one `--history` file. The timing
is the scenario tests' (`tests/support/syncdir_fleet.py`): stated sync delay
{SYNC_DELAY_MS} ms, tick {TICK_MS} ms, TTL {TTL_MS} ms ≥ 2 × (tick + sync delay).
Each figure family has a mesh of its own, started fresh; the sync delay is measured
on each, with its nodes running (so Syncthing is as busy as the nodes make it):

* **sync delay**: a fresh 1 KiB file written (renamed into place) at the root of one
  folder → byte-identical on the other (polled every 10 ms), one after the other in
  both directions between the first two instances (10 each way per mesh, 3 with
  `--quick`). The store never looks outside `nodes/`, so the probes disturb nothing.
* **crash failover** (three machines): wait until the leader has published 3
  checkpoints in its epoch and both others heartbeat as standby (their current
  process, seen in the leader's folder); sleep a random 0–{TICK_MS} ms; SIGKILL the
  leader, reading CLOCK_BOOTTIME (the history's clock) just before the signal; →
  the end of the successful `acquire` of the node that goes on (the first to publish
  above the old epoch: both standbys may take the next one, and the one whose claim
  loses ends its term), its restore (`resumed`) and its first accepted checkpoint. The
  killed node is restarted and rejoins as a standby. Targets: p99 ≤ TTL + sync delay,
  the design's bound; no `store.diverged` segment after the kills.
* **graceful handover** (two machines): SIGTERM of the leader (it finishes the step
  in flight, publishes, releases its claim) → the other's `acquire`, also measured
  from the leader's last accepted publish; the stopped node is restarted. Target:
  p99 ≤ sync delay + tick (the release syncs, the standby's next tick takes it).
* **divergence detection** (two machines): Syncthing paused on the leader's side
  (`SyncthingInstance.pause`: both ends of each link pause the other) for 3 × TTL =
  {PARTITION_S:.0f} s: the other side takes over and both step; then resumed → the
  first new `store.diverged` event seen in either folder (every folder polled every
  0.2 s, the benchmark's clock). Reported with it: the takeover inside the partition,
  the old leader's accepted checkpoints during the partition and after it healed (its
  epoch), and the event's `count` (checkpoints kept aside) and seq range. The next
  round partitions the new leader. Target: every detection ≤ 3 × TTL + 2 × sync
  delay = {DETECT_BOUND_S:.0f} s (the claims and chains sync, then the next periodic
  check, every 3 TTLs, sees them).

Every wait is bounded ({WAIT_S:.0f} s, and a time budget per family); a family that
runs out of budget keeps the samples it has and says so in a note.
"""


@dataclass
class Partition:
    leader: str
    partition_s: float
    takeover_s: float  # cut → the other's acquire
    steps_during: int  # the old leader's accepted checkpoints in its epoch during the partition
    steps_after: int  # ... after the heal
    detect_s: float  # heal → the first new store.diverged seen
    count: int
    seqs: str
    reported_by: str
    outcome: str


@contextlib.contextmanager
def _fleet(prefix: str, n: int) -> Iterator[Fleet]:
    """A fresh mesh of n instances with a fleet on it; the tests' failures become ours."""
    with temp_dir(prefix) as path, _as_benchmark_error(), fleet_on(path, n) as fleet:
        yield fleet


@contextlib.contextmanager
def _as_benchmark_error() -> Iterator[None]:
    """The test helpers fail or skip through pytest: outside pytest that is a BenchmarkError."""
    try:
        yield
    except (pytest.fail.Exception, pytest.skip.Exception) as failure:
        raise BenchmarkError(str(failure.msg)[:2000]) from None


def _wait(probe: Callable[[], T | None], what: str, timeout: float = WAIT_S) -> T:
    return wait_for(probe, what, timeout, every=0.05)


def _sync_delays(mesh: SyncthingMesh, each_way: int) -> dict[str, list[float]]:
    a, b = mesh[0], mesh[1]
    found: dict[str, list[float]] = {f"{a.name} → {b.name}": [], f"{b.name} → {a.name}": []}
    for _ in range(each_way):
        found[f"{a.name} → {b.name}"].append(mesh.measure_delay(a, b))
        found[f"{b.name} → {a.name}"].append(mesh.measure_delay(b, a))
    return found


def _leader(fleet: Fleet) -> tuple[str, int]:
    """The node of the newest successful acquire, and its epoch."""
    acquired = [o for node in fleet.processes for o in fleet.acquired(node)]
    if not acquired:
        raise BenchmarkError("nobody has acquired the lease")
    # Two nodes can hold one epoch (both standbys took over at once): the higher node id wins.
    newest = max(acquired, key=lambda o: (o.epoch, o.node))
    return newest.node, newest.epoch


def _standing_by(fleet: Fleet, seen_on: SyncthingInstance, node: str) -> bool:
    """node's current process heartbeats as standby, as seen_on's folder holds it."""
    pid = fleet.processes[node].pid
    return any(
        b.node == node and b.pid == pid and b.role == "standby"
        for b in reader(seen_on).list_heartbeats(AGENT)
    )


def _ready(fleet: Fleet, homes: dict[str, SyncthingInstance], steps: int = 3) -> tuple[str, int]:
    """Wait until the leader has published steps checkpoints in its epoch and every other
    node's current process stands by as the leader's folder shows it."""

    def probe() -> tuple[str, int] | None:
        leader, epoch = _leader(fleet)
        if fleet.processes[leader].poll() is not None:
            return None
        if len([o for o in fleet.published(leader) if o.epoch == epoch]) < steps:
            return None
        others = [n for n in homes if n != leader]
        if not all(_standing_by(fleet, homes[leader], n) for n in others):
            return None
        return leader, epoch

    return _wait(probe, "a leader publishing and the others standing by")


def _taken(fleet: Fleet, epoch: int, by: Sequence[str]) -> Op:
    """The acquire of the node that went on after epoch: the first to publish above it
    (two standbys may both acquire the next epoch; the one whose claim loses ends its term
    before stepping)."""
    went_on = _wait(
        lambda: next(
            (o for n in by for o in fleet.ops(n, "publish", "ok") if o.epoch > epoch), None
        ),
        f"another node to publish above epoch {epoch}",
    )
    return next(o for o in fleet.acquired(went_on.node) if o.epoch == went_on.epoch)


def _first(fleet: Fleet, node: str, op: str, epoch: int, outcome: str) -> Op:
    return _wait(
        lambda: next((o for o in fleet.ops(node, op, outcome) if o.epoch == epoch), None),
        f"{node}'s {op} ({outcome}) in epoch {epoch}",
    )


def _signal(fleet: Fleet, node: str, signum: signal.Signals) -> float:
    """Send signum to node's process, reading the nodes' clock just before; reap it."""
    process = fleet.processes[node]
    sent = CLOCK.monotonic()
    process.send_signal(signum)
    try:
        process.wait(timeout=WAIT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=WAIT_S)
        raise BenchmarkError(
            f"{node} did not exit within {WAIT_S:.0f} s of {signum.name}"
        ) from None
    return sent


@dataclass
class Takeover:
    acquired_s: float
    resumed_s: float
    first_s: float
    from_last_publish_s: float
    from_last: bool  # resumed from the old leader's last accepted checkpoint
    via: str
    epoch: int  # the epoch taken
    leader: str
    taker: str
    gap_ms: str  # the taker's time since it last saw the claims change (lease.acquired)


def _takeovers(
    fleet: Fleet,
    homes: dict[str, SyncthingInstance],
    signum: signal.Signals,
    count: int,
    budget_s: float,
    seed: int,
) -> tuple[list[Takeover], list[str]]:
    rng = random.Random(seed)
    samples: list[Takeover] = []
    notes: list[str] = []
    deadline = time.monotonic() + budget_s
    for _ in range(count):
        if time.monotonic() > deadline:
            notes.append(
                f"{signum.name}: time budget of {budget_s:.0f} s spent after "
                f"{len(samples)} of {count}"
            )
            break
        try:
            leader, epoch = _ready(fleet, homes)
            time.sleep(rng.uniform(0, TICK_S))
            sent = _signal(fleet, leader, signum)
            published = [o for o in fleet.published(leader) if o.epoch == epoch]
            last = max(published, key=lambda o: o.seq)
            take = _taken(fleet, epoch, [n for n in homes if n != leader])
            resumed = _first(fleet, take.node, "restore", take.epoch, "resumed")
            first = _first(fleet, take.node, "publish", take.epoch, "ok")
            acquired = _wait(
                partial(_events_of, homes[take.node], "lease.acquired", take.node, take.epoch),
                f"{take.node}'s lease.acquired",
            )
            samples.append(
                Takeover(
                    acquired_s=take.end - sent,
                    resumed_s=resumed.end - sent,
                    first_s=first.end - sent,
                    from_last_publish_s=take.end - last.end,
                    from_last=resumed.detail.get("from_seq") == last.seq,
                    via=str(acquired[0].detail.get("via")),
                    epoch=take.epoch,
                    leader=leader,
                    taker=take.node,
                    gap_ms=str(acquired[0].detail.get("gap_ms", "—")),
                )
            )
            fleet.start(leader, homes[leader])  # it rejoins as a standby
        except BenchmarkError as error:
            if not samples:
                raise
            notes.append(f"{signum.name} {len(samples) + 1} not measured: {error}")
            break
    return samples, notes


STALL_MARKS = ("Failed to sync", "isn't making sync progress")


def _stalls(fleet: Fleet) -> str:
    """Syncthing's pull failures and back-offs on the mesh, from each instance's log."""
    counts = []
    for instance in fleet.mesh:
        try:
            lines = instance.log.read_text(errors="replace").splitlines()
        except OSError:
            lines = []
        failed = sum(STALL_MARKS[0] in line for line in lines)
        paused = sum(STALL_MARKS[1] in line for line in lines)
        counts.append(f"{instance.name} {failed}/{paused}")
    return ", ".join(counts)


def _diverged(fleet: Fleet) -> list[Event]:
    return [e for i in fleet.mesh for e in events(i, "store.diverged")]


def _new_diverged(fleet: Fleet, known: set[tuple[str, str]]) -> list[Event] | None:
    """store.diverged events of segments not in known, from any folder."""
    return [e for e in _diverged(fleet) if _segment(e) not in known] or None


def _events_of(instance: SyncthingInstance, kind: str, node: str, epoch: int) -> list[Event]:
    """node's events of kind, of epoch or later, as instance's folder holds them."""
    return [e for e in events(instance, kind) if e.node == node and e.epoch >= epoch]


def _segment(event: Event) -> tuple[str, str]:
    return str(event.detail.get("term")), str(event.detail.get("node"))


def _exit_reason(fleet: Fleet, node: str) -> str:
    """The last error line of node's log (a node that stops loudly ends on its exception)."""
    lines = (fleet.workdir / f"{node}.log").read_text(errors="replace").splitlines()
    found = [line for line in lines if "Error" in line.split(":", 1)[0]] or lines[-1:]
    return found[-1][:300] if found else "?"


def _partition(
    fleet: Fleet, homes: dict[str, SyncthingInstance], known: set[tuple[str, str]]
) -> Partition:
    """One partition of the leader's side for 3 × TTL, healed; what followed."""
    leader, epoch = _ready(fleet, homes)
    other = next(n for n in homes if n != leader)
    side = homes[leader]
    with _as_benchmark_error():
        side.pause()
    cut = CLOCK.monotonic()
    try:

        def taken_or_gone() -> Op | str | None:
            if fleet.processes[other].poll() is not None:
                return f"{other} exited: {_exit_reason(fleet, other)}"
            return next(iter(fleet.acquired(other, above=epoch)), None)

        take = cast("Op | str", _wait(taken_or_gone, f"{other} to take over in the partition"))
        time.sleep(max(0.0, cut + PARTITION_S - CLOCK.monotonic()))  # 3 × TTL from the cut
    finally:
        with _as_benchmark_error():
            side.resume()
    healed = CLOCK.monotonic()
    found = Partition(leader, healed - cut, float("nan"), 0, 0, float("nan"), 0, "—", "—", "")
    if isinstance(take, str):
        found.outcome = f"no takeover: {take}"
    else:
        found.takeover_s = take.end - cut
        try:
            fresh = wait_for(
                partial(_new_diverged, fleet, known), "store.diverged", DETECT_BOUND_S + 30, 0.2
            )
        except BenchmarkError:
            found.outcome = f"no store.diverged within {DETECT_BOUND_S + 30:.0f} s of the heal"
        else:
            found.detect_s = CLOCK.monotonic() - healed
            first = fresh[0]
            found.count = int(first.detail.get("count", 0))
            found.seqs = f"{first.detail.get('from_seq')}–{first.detail.get('to_seq')}"
            found.reported_by = first.node
            found.outcome = "diverged"
            # The old leader steps down once the winner's claim reaches it: wait for that,
            # so that its steps after the heal are all in, and the next round starts clean.
            _wait(partial(_events_of, side, "lease.lost", leader, epoch), f"{leader} to step down")
    mine = [o for o in fleet.published(leader) if o.epoch == epoch]
    found.steps_during = len([o for o in mine if cut <= o.end < healed])
    found.steps_after = len([o for o in mine if o.end >= healed])
    return found


def _partitions(
    fleet: Fleet, homes: dict[str, SyncthingInstance], count: int, budget_s: float
) -> tuple[list[Partition], list[str]]:
    found: list[Partition] = []
    notes: list[str] = []
    deadline = time.monotonic() + budget_s
    for _ in range(count):
        if time.monotonic() + PARTITION_S + DETECT_BOUND_S + 30 > deadline:
            notes.append(
                f"partition: time budget of {budget_s:.0f} s spent after {len(found)} of {count}"
            )
            break
        known = {_segment(e) for e in _diverged(fleet)}
        try:
            found.append(_partition(fleet, homes, known))
        except BenchmarkError as error:
            if not found:
                raise
            notes.append(f"partition round {len(found) + 1} not measured: {error}")
            break
        for node, process in fleet.processes.items():  # a node that stopped loudly rejoins
            if process.poll() is not None:
                fleet.start(node, homes[node])
    return found, notes


def run(quick: bool) -> Result:
    each_way = 3 if quick else 10
    kills, handovers, partitions = (2, 2, 1) if quick else (6, 6, 3)
    delays: dict[str, dict[str, list[float]]] = {}
    notes: list[str] = []

    with _fleet(NAME, 3) as fleet:
        a, b, c = fleet.mesh
        homes = {"n1": a, "n2": b, "n3": c}
        fleet.start_first("n1", a)
        fleet.start_beside("n2", b)
        fleet.start_beside("n3", c)
        delays["failover mesh (3)"] = _sync_delays(fleet.mesh, each_way)
        crashes, more = _takeovers(fleet, homes, signal.SIGKILL, kills, 120 + 40 * kills, 1)
        notes += more
        time.sleep(SYNC_S + 1)  # a rival claim of the last kill's epoch, if any, has synced
        takers = {
            s.epoch: sorted(
                {o.node for n in homes for o in fleet.acquired(n) if o.epoch == s.epoch}
            )
            for s in crashes
        }
        crash_segments = len({_segment(e) for e in _diverged(fleet)})
        stalls = {"failover mesh (3)": _stalls(fleet)}

    with _fleet(NAME, 2) as fleet:
        a, b = fleet.mesh
        homes = {"n1": a, "n2": b}
        fleet.start_first("n1", a)
        fleet.start_beside("n2", b)
        delays["handover mesh (2)"] = _sync_delays(fleet.mesh, each_way)
        stops, more = _takeovers(fleet, homes, signal.SIGTERM, handovers, 60 + 30 * handovers, 2)
        notes += more
        stalls["handover mesh (2)"] = _stalls(fleet)

    with _fleet(NAME, 2) as fleet:
        a, b = fleet.mesh
        homes = {"n1": a, "n2": b}
        fleet.start_first("n1", a)
        fleet.start_beside("n2", b)
        delays["partition mesh (2)"] = _sync_delays(fleet.mesh, each_way)
        cuts, more = _partitions(fleet, homes, partitions, 60 + 100 * partitions)
        notes += more
        stalls["partition mesh (2)"] = _stalls(fleet)

    if not crashes or not stops or not cuts:
        raise BenchmarkError("a figure family has no sample")
    raced = [f"{epoch}: {', '.join(nodes)}" for epoch, nodes in takers.items() if len(nodes) > 1]
    stall_text = "; ".join(f"{mesh}: {counts}" for mesh, counts in stalls.items())
    return _result(delays, crashes, stops, cuts, notes, raced, crash_segments, stall_text)


def _s(value: float) -> str:
    """Seconds with one decimal; — for none (nan)."""
    return "—" if value != value else f"{value:.1f}"


def _result(
    delays: dict[str, dict[str, list[float]]],
    crashes: list[Takeover],
    stops: list[Takeover],
    cuts: list[Partition],
    notes: list[str],
    raced: list[str],
    crash_segments: int,
    stalls: str,
) -> Result:
    every_delay = [d for per in delays.values() for ds in per.values() for d in ds]
    delay_rows = [
        spread_row(f"{mesh}: {way}", ds) for mesh, per in delays.items() for way, ds in per.items()
    ]
    delay_rows.append(spread_row("all", every_delay))
    sync_p50 = percentile(every_delay, 50)
    crash_rows = [
        spread_row("kill → lease acquired", [s.acquired_s for s in crashes]),
        spread_row("kill → agent resumed", [s.resumed_s for s in crashes]),
        spread_row("kill → first checkpoint", [s.first_s for s in crashes]),
    ]
    stop_rows = [
        spread_row("SIGTERM → lease acquired", [s.acquired_s for s in stops]),
        spread_row("last publish → lease acquired", [s.from_last_publish_s for s in stops]),
        spread_row("SIGTERM → agent resumed", [s.resumed_s for s in stops]),
        spread_row("SIGTERM → first checkpoint", [s.first_s for s in stops]),
    ]
    cut_rows = [
        [
            str(n),
            p.leader,
            f"{p.partition_s:.1f}",
            _s(p.takeover_s),
            str(p.steps_during),
            str(p.steps_after),
            str(p.count),
            p.seqs,
            _s(p.detect_s),
            p.reported_by,
            p.outcome,
        ]
        for n, p in enumerate(cuts, 1)
    ]
    each_rows = [
        [
            f"{word} {n}",
            f"{t.leader} → {t.taker} (epoch {t.epoch})",
            t.via,
            t.gap_ms,
            ms(t.acquired_s),
            ms(t.from_last_publish_s),
            "yes" if t.from_last else "no",
        ]
        for word, family in (("kill", crashes), ("SIGTERM", stops))
        for n, t in enumerate(family, 1)
    ]
    crash_p99 = percentile([s.acquired_s for s in crashes], 99)
    stop_p99 = percentile([s.acquired_s for s in stops], 99)
    diverged = [p for p in cuts if p.outcome == "diverged"]
    detect_max = max((p.detect_s for p in diverged), default=float("nan"))
    sync_p99 = percentile(every_delay, 99)
    tables = [
        Table(
            f"Sync delay (write → byte-identical on the other side), stated {SYNC_DELAY_MS} ms",
            SPREAD_HEADERS,
            delay_rows,
        ),
        Table(
            f"Crash failover, three machines (TTL {TTL_MS} ms, bound TTL + sync delay = "
            f"{FAILOVER_BOUND_S * 1000:.0f} ms)",
            SPREAD_HEADERS,
            crash_rows,
        ),
        Table(
            f"Graceful handover, two machines (bound sync delay + tick = "
            f"{HANDOVER_BOUND_S * 1000:.0f} ms)",
            SPREAD_HEADERS,
            stop_rows,
        ),
        Table(
            "Each takeover (gap: the taker's time since it last saw the claims change)",
            [
                "takeover",
                "leader → taker",
                "via",
                "gap ms",
                "→ acquired ms",
                "last publish → acquired ms",
                "resumed from the last checkpoint",
            ],
            each_rows,
        ),
        Table(
            f"Partitions of 3 × TTL and divergence detection (bound 3 × TTL + 2 × sync delay "
            f"= {DETECT_BOUND_S:.0f} s)",
            [
                "round",
                "old leader",
                "partition s",
                "takeover in it s",
                "old leader's steps in it",
                "its steps after the heal",
                "kept aside (count)",
                "seqs aside",
                "heal → diverged s",
                "reported by",
                "outcome",
            ],
            cut_rows,
        ),
    ]
    checks = [
        Check(
            "sync delay p99 (all meshes, both ways)",
            f"{ms(sync_p99)} ms "
            f"(median {ms(sync_p50)} ms, max {ms(max(every_delay))} ms, n {len(every_delay)})",
            f"≤ stated {SYNC_DELAY_MS} ms",
            sync_p99 <= SYNC_S,
        ),
        Check(
            "crash failover p99: SIGKILL → acquired",
            f"{ms(crash_p99)} ms (p50 "
            f"{ms(percentile([s.acquired_s for s in crashes], 50))} ms, n {len(crashes)})",
            f"≤ TTL + sync delay = {FAILOVER_BOUND_S * 1000:.0f} ms",
            crash_p99 <= FAILOVER_BOUND_S,
        ),
        Check(
            "crash failover resumed from the dead leader's last checkpoint",
            f"{sum(s.from_last for s in crashes)} of {len(crashes)}",
            "—",
            None,
        ),
        Check(
            "crash failover: store.diverged segments after the kills (both standbys stepped)",
            f"{crash_segments}; kills whose next epoch both standbys took: {len(raced)} of "
            f"{len(crashes)}" + (f" (epoch: takers {'; '.join(raced)})" if raced else ""),
            "none (the claim that loses ends its term before a step)",
            crash_segments == 0,
        ),
        Check(
            "graceful handover p99: SIGTERM → acquired",
            f"{ms(stop_p99)} ms (p50 "
            f"{ms(percentile([s.acquired_s for s in stops], 50))} ms, n {len(stops)}; via "
            f"{', '.join(sorted({s.via for s in stops}))})",
            f"≤ sync delay + tick = {HANDOVER_BOUND_S * 1000:.0f} ms",
            stop_p99 <= HANDOVER_BOUND_S,
        ),
        Check(
            "partitions of 3 × TTL that ended in store.diverged (both sides led)",
            f"{len(diverged)} of {len(cuts)}"
            + "".join(
                f"; round {n}: {p.outcome}"
                for n, p in enumerate(cuts, 1)
                if p.outcome != "diverged"
            ),
            "all",
            len(diverged) == len(cuts),
        ),
        Check(
            "divergence detection: heal → store.diverged (max)",
            f"{detect_max:.1f} s (n {len(diverged)}: "
            f"{', '.join(f'{p.detect_s:.1f}' for p in diverged)})",
            f"≤ 3 × TTL + 2 × sync delay = {DETECT_BOUND_S:.0f} s",
            bool(diverged) and detect_max <= DETECT_BOUND_S,
        ),
        Check(
            "checkpoints kept aside per partition of 3 × TTL",
            ", ".join(str(p.count) for p in diverged)
            + " (old leader's steps in the partition: "
            + ", ".join(str(p.steps_during) for p in diverged)
            + ")",
            "—",
            None,
        ),
    ]
    notes = [
        *notes,
        "Times from the history file are the nodes' CLOCK_BOOTTIME, read by the benchmark "
        "at each signal, heal and detection; sync delays are on the benchmark's monotonic "
        "clock.",
        f"Load average at the end of the measurement: {loadavg()}.",
    ]
    analysis = _analysis(every_delay, crashes, stops, cuts, raced, stalls, crash_segments)
    return Result(NAME, TITLE, METHOD, tables, checks, notes, analysis, analysis_always=True)


def _analysis(
    delays: list[float],
    crashes: list[Takeover],
    stops: list[Takeover],
    cuts: list[Partition],
    raced: list[str],
    stalls: str,
    crash_segments: int,
) -> str:
    crash_text = (
        "Here the claims crossed within that wait every time: no segment was kept aside."
        if crash_segments == 0
        else f"Here {crash_segments} segment(s) were kept aside: the claims crossed late."
    )
    crash_p50 = percentile([s.acquired_s for s in crashes], 50)
    released = [s.acquired_s for s in stops if s.via == "released"]
    expired = [s for s in stops if s.via != "released"]
    diverged = [p for p in cuts if p.outcome == "diverged"]
    detect = ", ".join(f"{p.detect_s:.1f}" for p in diverged) or "none"
    aside = ", ".join(f"{p.count} of {p.steps_during}" for p in diverged) or "none"
    handover = (
        f"{len(released)} of {len(stops)} were taken as released (median "
        f"{ms(percentile(released, 50))} ms): the release crosses in one sync and the "
        "standby's next tick takes it."
        if released
        else f"none of the {len(stops)} was taken as released."
    )
    refused = [p for p in cuts if p.outcome != "diverged"]
    partition_text = ""
    if refused:
        partition_text = (
            f"\n\n**Partitions that did not diverge.** {len(refused)} of {len(cuts)}: "
            + "; ".join(p.outcome for p in refused)
            + ". A cut that falls after a claim announcing a checkpoint has crossed but "
            "before the checkpoint itself has leaves the other side's restore behind what it "
            "saw announced: it does not lead from behind it (`BehindTheSync`: the term tries "
            "again and gives the lease up after a TTL) until the heal brings the checkpoint, "
            "so nothing diverges: the old leader goes on alone."
        )
    if expired:
        handover += (
            f" {len(expired)} waited for the TTL to run out (`via` {expired[0].via}, the "
            "taker's gap a whole TTL): the standby saw no change of the claims after the "
            "release was written, so the release reached it late or not at all (below)."
        )
    return f"""\
Measured on a shared machine (2 CPUs; load average {loadavg()} at the end of the run,
with other engineers' work on it): the figures are this run's, side by side, and move
with the load.

**Where the time goes.** The sync delay of a probe file (median
{ms(percentile(delays, 50))} ms, max {ms(max(delays))} ms) is mostly Syncthing's
filesystem watcher, which reports a change about 1 s after it is made
(`fsWatcherDelayS = 1`, the least it accepts); index exchange and pull add the rest. A
crash failover (median {ms(crash_p50)} ms) is the TTL less the kill's phase after the
last renewal plus the delay with which that renewal reached the standby (the gap
column: 8 s, the TTL, on the taker's clock). Of the graceful handovers, {handover}
Divergence detection ({detect} s after the heal) is set by the check period: a node
looks every 3 TTLs ({3 * TTL_S:.0f} s), so once the claims and chains have synced
(about a second) the report waits for the next check, anywhere from 0 to 3 TTLs.

**Claims are published under new names.** Syncthing holds back a path that keeps
changing: measured on two instances on loopback (40 s, a claim every 500 ms), a file
rewritten at each renewal (the subtree's `lease.json`) reached the other machine up to
14 renewals (7 s) late, 4.7–5.5 behind on average, while the same claims written once
under new names in the same directory arrived within 3 renewals (1.5 s), 1.9–2.4 on
average. Before 8a37b25 the other nodes read `lease.json`: the stated 3 s did not bound
a claim, so a release could wait out the TTL and two standbys' rival claims could cross
too late. Since then each claim is also created as `claim.VERSION.json` and the others
read the newest of those (`stores/syncdir/published.py`). Syncthing's logs still show
pulls that failed, now of files removed soon after they were written (checkpoints past
retention, effect records, published claims once synced), each followed by the folder
backing off ("isn't making sync progress - retrying in 1m0s"): failed / back-offs per
instance, {stalls}; later changes cross all the same.

**Two standbys, one crash.** With three machines, both standbys see the dead leader's
last renewal through the same sync, milliseconds apart, so their TTLs run out
together, and each writes its own claim of epoch + 1 before the other's can reach it
(a sync delay later): in this run {len(raced)} of {len(crashes)} kills went so. A term
that took the lease waits the stated sync delay and two ticks before its first step
(since 4755381), so the one whose claim loses ends its term before stepping, unless
the claims take longer than that to cross; then both step and the lower node id's
steps are kept aside (`store.diverged`). {crash_text} Before 8a37b25 (claims read from a
file rewritten every tick) 1 of 2 kills left a segment aside (the run at 14:07 UTC on
8444dc0); before 4755381, 6 of 6.{partition_text}

**What a partition keeps aside.** Kept aside / the old leader's steps in the partition:
{aside}. The old leader pruned its own chain at each publish, keeping its newest few
(`docs/syncdir.md`, "Retention, as built"): what is kept is the branch's last few
checkpoints, not its whole work, which happened all the same.

**Choosing TTL and sync delay.** The stated delay should bound the tool's real delay
with room (here 3 s against about 1 s measured); the TTL rule (≥ 2 × (tick + sync
delay)) then fixes the failover, about a TTL, and the detection, up to 3 TTLs after
the heal. A smaller stated delay allows a smaller TTL and so a faster failover and
detection, but a sync slower than stated for a moment (a failed pull, above) lets a
standby take over from a live leader: a divergence, reported and resolved, not a loss.
"""
