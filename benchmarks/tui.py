"""hb-tui under load: 50 nodes, 1,000 events a second; poll cost, UI responsiveness, memory.

Three processes besides the benchmark itself, side by side on one file store:

* the **writer** (the load): 50 nodes' heartbeats every 400 ms, their events at an
  aggregate 1,000 a second, the leader's lease renewals and checkpoints;
* the **poll monitor**: what one poll of the monitor costs (``read_lease``,
  ``list_checkpoints``, ``tail.read``, ``ClusterModel.update``), timed part by part;
* the **app**: ``MonitorApp`` headless (``run_test``), probed from its own event loop.

Children are started with ``python -c`` and import ``benchmarks.tui`` under a stub
package, so that a monitor process holds what a monitor imports (plus
``benchmarks.common``), not every benchmark.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import math
import os
import signal
import socket
import subprocess
import sys
import time
from array import array
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hamsterbunker.core.timing import DEFAULT_LEASE_TTL_MS
from hamsterbunker.records import Event, Heartbeat, LeaseRecord
from hamsterbunker.stores.base import Fence
from hamsterbunker.stores.layer.files import FileStore

from .common import (
    SPREAD_HEADERS,
    BenchmarkError,
    Check,
    Result,
    Table,
    ms,
    percentile,
    spread_row,
    temp_dir,
)

NAME = "tui"
TITLE = "hb-tui monitor under load (50 nodes, 1,000 events/s)"

AGENT = "loadtest"
NODES = 50
EVENT_RATE = 1000  # events/s, all nodes together
BEAT_S = 0.4  # each node's heartbeat period (the default tick)
RENEW_S = 0.4  # the leader's lease renewals
CHECKPOINT_S = 0.25  # the leader's checkpoints (a 0.25 s agent step)
TTL_MS = DEFAULT_LEASE_TTL_MS
POLL_S = 0.5  # MonitorApp's default poll interval
LAG_TICK_S = 0.05  # the UI probe's timer
SEEN_CHECK_S = 0.02  # how often the UI probe looks for new events in app.model
MAX_EVENTS_KEPT = 2000  # ClusterModel's events deque
EVENTS_KEPT = 250  # per node (the default is 1,000): older events fall off during the run

LAG_TARGET_MS = 100
SEEN_TARGET_MS = 1000
POLL_TARGET_MS = 50
RSS_GROWTH_TARGET_MB = 20

REPO = Path(__file__).resolve().parent.parent
# A child imports benchmarks.tui under a stub "benchmarks" package (benchmarks/__init__
# would import every benchmark), then runs child(role, args...).
_CHILD = (
    "import sys, types; package = types.ModuleType('benchmarks'); "
    "package.__path__ = [sys.argv[1]]; sys.modules['benchmarks'] = package; "
    "from benchmarks.tui import child; sys.exit(child(sys.argv[2:]))"
)

METHOD = f"""\
A load generator (one process) writes to a file store in a temporary directory what
{NODES} nodes would: each node's heartbeat every {BEAT_S * 1000:.0f} ms (staggered; the
leader's as active, the others as standby), events at an aggregate {EVENT_RATE:,} a
second spread round-robin over the nodes (`FileStore.append_event`, the record layer's
file store, each node's log kept to its newest {EVENTS_KEPT} events rather than the
default 1,000, so that older events fall off every log in a full run and the tail follows
that), the leader's
lease renewal every {RENEW_S * 1000:.0f} ms (compare-and-set, fsynced) and a checkpoint
every {CHECKPOINT_S * 1000:.0f} ms (fsynced). Its schedule is fixed in advance; how far it
fell behind is reported. Two monitor processes watch the same store at the same time:

* **Poll cost**: a loop that every {POLL_S * 1000:.0f} ms (the app's poll interval) does
  what one poll of `hb-tui` does, `read_lease`, `list_checkpoints`, `tail.read()` (the
  store's tail) and `ClusterModel.update`, each timed with
  `perf_counter`; its CPU is `time.thread_time()` of the polling thread over the load
  window.
* **UI**: `MonitorApp(store, agent)` (default poll interval, the store's watch as
  hints) run headless with `run_test()`; on its event loop a callback scheduled every
  {LAG_TICK_S * 1000:.0f} ms with `loop.call_later` records how late it runs (the loop
  lag: how long a key press or a repaint would wait), and another every
  {SEEN_CHECK_S * 1000:.0f} ms takes the events that reached `app.model` since the last
  look: for each, the wall-clock time now minus the event's `time` (written by the load
  generator just before its append) is its event-to-screen latency, as the screen's next
  refresh would show it (the look itself adds up to {SEEN_CHECK_S * 1000:.0f} ms).
* **Memory**: `VmRSS` of each monitor process from `/proc/PID/status` every 0.5 s:
  at start (ready, before the load), after 10 s of load, halfway from there to the end,
  and at the end; growth after the warm-up is end minus the 10 s figure (the event
  deque holds {MAX_EVENTS_KEPT:,} events, reached after 2 s; a bounded process grows
  less in the second half than in the first).

Targets: UI loop lag p99 ≤ {LAG_TARGET_MS} ms, event-to-screen p99 ≤ {SEEN_TARGET_MS} ms,
poll p99 ≤ {POLL_TARGET_MS} ms, RSS growth after warm-up ≤ {RSS_GROWTH_TARGET_MB} MB.
"""


ANALYSIS = """\
Profiled on 2026-11-30 on this machine: `MonitorApp` headless in one process under
`cProfile` and asyncio's debug mode (callbacks over 50 ms logged), the same load
generator writing for 20 s. Times under the profiler are about twice the real ones;
the shares are what counts.

First version of the app: 102 callbacks over 50 ms, 45 of them the poll worker.
`_show` took 200 ms per poll, 97 % of it in `EventLog.show_new`, which called
`RichLog.write` once per new event (render the line, make its strips, scroll to the
end, post messages): at 1,000 events a second and about four polls a second (the
watch's hints), some 250 writes per poll, the loop blocked meanwhile. In a headless
app at rest, 500 events written one `write` each took 80 ms, joined into one `Text`
and written once 61 ms, only the newest 100 written 18 ms. Done since: the event log
writes at most a screenful of the newest events per poll (`WRITE_PER_POLL` in
`eventlog.py`) and counts the rest in one line.

Second version (at most 100 writes per poll): 181 callbacks over 50 ms: 71 repaints
(53 ms each; 74 of 140 redid the whole layout, 97 ms each, since something on screen
changed size on every poll), 69 polls (`_show` 62 ms, 55 ms of it the event log's
writes), 39 runs of the nodes table's message pump (`DataTable._update_column_widths`
measured every cell of the 50 rows again after each poll, 53 ms). Done since: table
cells updated in place with columns widened only when a cell outgrows them, panels of
fixed size updated only when their text changed, the event log written once per poll
with at most a screenful of lines.

Third version (as measured above): 90 callbacks over 50 ms, 87 of them the screen's
refresh timer. A repaint takes 72 ms under the profiler: the nodes table renders its
visible rows again (29 ms; about 9 rows of 7 cells per repaint, each cell a Rich
render), the event log its visible lines (17 ms), and styles are looked up per line
(`rich_style`, 14 ms). `_show` is down to 21 ms per poll and the layout is redone in
24 of 107 repaints. The lag left is mostly one repaint: the heartbeat ages change on
every poll, so the table is rendered again about four times a second, and on two
CPUs shared with the load generator and the poll monitor a repaint can wait for a
CPU as well.

What could lower it further (in `tui/hamsterbunker_tui/`, not changed here): show
ages at the resolution the eye needs (whole seconds past 10 s) so that fewer cells
change per poll, and repaint on a timer of its own (two or three a second) however
often the watch makes the app poll.
"""

# -- the children -------------------------------------------------------------------


def child(argv: list[str]) -> int:
    """Entry point of a child process: ROLE WORKDIR [DURATION]."""
    role, workdir = argv[0], Path(argv[1])
    roles: dict[str, Callable[[Path, list[str]], None]] = {
        "writer": _writer,
        "poll": _poll_monitor,
        "app": _app_monitor,
    }
    roles[role](workdir, argv[2:])
    return 0


def _store(workdir: Path, **options: Any) -> FileStore:
    return FileStore(workdir / "store", create=False, **options)


def _write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


class Histogram:
    """Counts of values in fixed bins: a probe whose memory does not grow with its samples."""

    def __init__(self, width_s: float = 0.001, top_s: float = 10.0) -> None:
        self.width = width_s
        self.counts = array("q", bytes(8 * (int(top_s / width_s) + 1)))
        self.n = 0
        self.low = math.inf
        self.high = -math.inf

    def add(self, value: float) -> None:
        self.counts[min(len(self.counts) - 1, max(0, int(value / self.width)))] += 1
        self.n += 1
        self.low = min(self.low, value)
        self.high = max(self.high, value)

    def to_json(self) -> dict[str, Any]:
        bins = {str(i): count for i, count in enumerate(self.counts) if count}
        return {"width": self.width, "n": self.n, "min": self.low, "max": self.high, "bins": bins}


def histogram_percentile(histogram: dict[str, Any], q: float) -> float:
    """The q-th percentile of a Histogram.to_json(): its bin's middle, within min and max."""
    rank, total = q / 100 * histogram["n"], 0
    for index, count in sorted((int(i), c) for i, c in histogram["bins"].items()):
        total += count
        if total >= rank:
            value = (index + 0.5) * histogram["width"]
            return float(min(max(value, histogram["min"]), histogram["max"]))
    return float(histogram["max"])


def histogram_row(label: str, histogram: dict[str, Any]) -> list[str]:
    """label, n, min, p50, p99, max (ms), as common.spread_row gives them."""
    values = [
        histogram["min"],
        histogram_percentile(histogram, 50),
        histogram_percentile(histogram, 99),
        histogram["max"],
    ]
    return [label, str(histogram["n"]), *(ms(value) for value in values)]


def _node(i: int) -> str:
    return f"node-{i:02d}"


def _heartbeat(i: int, beats: int, seq: int, pid: int, host: str) -> Heartbeat:
    return Heartbeat(
        node=_node(i), region=("eu-central", "us-east", "ap-south")[i % 3], host=host,
        pid=pid, role="active" if i == 0 else "standby", epoch=1, seq=seq,
        leader=_node(0), time=time.time(), beats=beats,
    )  # fmt: skip


def prepare(workdir: Path) -> None:
    """The cluster as the monitors first see it: every heartbeat, the lease of node-00."""
    store = FileStore(workdir / "store")
    host, pid = socket.gethostname(), os.getpid()
    for i in range(NODES):
        store.put_heartbeat(AGENT, _heartbeat(i, 1, 0, pid, host))
    store.cas_lease(
        AGENT, None, LeaseRecord(_node(0), "eu-central", "bench", 1, TTL_MS, renewals=0)
    )


def _writer(workdir: Path, args: list[str]) -> None:
    """The load: heartbeats, events, renewals and checkpoints on a schedule fixed in advance."""
    duration = float(args[0])
    store = _store(workdir, events_per_node=EVENTS_KEPT)
    host, pid = socket.gethostname(), os.getpid()
    lease = store.read_lease(AGENT)
    assert lease is not None and lease.holder is not None
    fence = Fence(lease.holder, lease.session, lease.epoch)
    total = int(duration * EVENT_RATE)
    n = [0] * NODES
    beats = [1] * NODES
    seq = 0
    counts = {"heartbeats": 0, "renewals": 0, "checkpoints": 0}
    behind_max = 0.0

    def append(i: int, kind: str, **detail: Any) -> None:
        n[i] += 1
        store.append_event(
            AGENT, Event(_node(i), n[i], kind, time.time(), epoch=1, seq=seq, detail=detail)
        )

    start_wall = time.time()
    start = time.monotonic()
    end = start + duration
    next_beat = [start + BEAT_S * i / NODES for i in range(NODES)]
    next_renew, next_checkpoint = start + RENEW_S, start
    append(0, "lease.acquired", via="free")
    append(0, "agent.started")
    written = 2
    while (now := time.monotonic()) < end and written < total:
        due = min(total, int((now - start) * EVENT_RATE))
        behind_max = max(behind_max, (due - written) / EVENT_RATE)
        while written < due:
            i = written % NODES
            if i == 0:
                append(0, "agent.step", step_seq=seq)
            else:
                append(i, "node.standby", leader=_node(0))
            written += 1
        for i in range(NODES):
            if now >= next_beat[i]:
                beats[i] += 1
                store.put_heartbeat(AGENT, _heartbeat(i, beats[i], seq, pid, host))
                counts["heartbeats"] += 1
                next_beat[i] += BEAT_S
        if now >= next_renew:
            lease = store.cas_lease(
                AGENT, lease.version, LeaseRecord(
                    lease.holder, lease.region, lease.session, lease.epoch, lease.ttl_ms,
                    renewals=lease.renewals + 1, version=lease.version,
                ),
            )  # fmt: skip
            counts["renewals"] += 1
            next_renew += RENEW_S
        if now >= next_checkpoint:
            seq += 1
            info = store.put_checkpoint(AGENT, fence, seq, os.urandom(1024))
            append(0, "checkpoint.published", size=info.size)
            written += 1
            counts["checkpoints"] += 1
            next_checkpoint += CHECKPOINT_S
        wake = min(start + (written + 1) / EVENT_RATE, min(next_beat), next_renew, end)
        time.sleep(min(0.005, max(0.0, wake - time.monotonic())))
    elapsed = time.monotonic() - start
    _write_json(
        workdir / "writer.json",
        {
            "start": start_wall,
            "end": start_wall + elapsed,
            "elapsed": elapsed,
            "events": written,
            "behind_max": behind_max,
            **counts,
        },
    )


def _run_until_stopped(workdir: Path) -> Callable[[], bool]:
    stop = workdir / "stop"
    deadline = time.monotonic() + float(os.environ.get("HB_BENCH_MAX_S", "300"))
    return lambda: stop.exists() or time.monotonic() > deadline


def _poll_monitor(workdir: Path, args: list[str]) -> None:
    """Poll every POLL_S as the app does, timing each part."""
    from hamsterbunker_tui.model import ClusterModel

    store = _store(workdir)
    tail = store.tail(AGENT)
    model = ClusterModel(AGENT)
    stopped = _run_until_stopped(workdir)
    polls: list[list[float]] = []  # wall, lease, checkpoints, tail, update, cpu, events
    seen = Histogram()  # event time -> in the model, seconds
    (workdir / "poll.ready").touch()
    next_poll = time.monotonic()
    while not stopped():
        wall = time.time()
        cpu = time.thread_time()
        t0 = time.perf_counter()
        lease = store.read_lease(AGENT)
        t1 = time.perf_counter()
        checkpoints = store.list_checkpoints(AGENT)
        t2 = time.perf_counter()
        got = tail.read()
        t3 = time.perf_counter()
        model.update(got.events, got.heartbeats, lease, checkpoints)
        t4 = time.perf_counter()
        cpu = time.thread_time() - cpu
        now = time.time()
        for event in got.events:
            seen.add(now - event.time)
        polls.append([wall, t1 - t0, t2 - t1, t3 - t2, t4 - t3, cpu, len(got.events)])
        next_poll += POLL_S
        time.sleep(max(0.0, next_poll - time.monotonic()))
    _write_json(
        workdir / "poll.json",
        {
            "polls": polls,
            "seen": seen.to_json(),
            "events_kept": len(model.events),
            "events_seen": model.events_seen,
            "nodes": len(model.nodes()),
        },
    )


def _app_monitor(workdir: Path, args: list[str]) -> None:
    asyncio.run(_app_probe(workdir))


async def _app_probe(workdir: Path) -> None:
    """MonitorApp headless; its loop lag and when events reach app.model."""
    from hamsterbunker_tui.app import MonitorApp

    app = MonitorApp(_store(workdir), AGENT)
    stopped = _run_until_stopped(workdir)
    # Allocated up front: the probe's own memory does not grow during the run.
    cap = int(float(os.environ.get("HB_BENCH_MAX_S", "300")) / LAG_TICK_S) + 10
    lag_walls, lags = array("d", bytes(8 * cap)), array("d", bytes(8 * cap))
    taken_lags = 0
    seen = Histogram()  # event time -> in app.model, seconds
    async with app.run_test(size=(160, 80)):
        loop = asyncio.get_running_loop()
        taken = app.model.events_seen

        def lag_tick(due: float) -> None:
            nonlocal taken_lags
            now = loop.time()
            if taken_lags < cap:
                lag_walls[taken_lags], lags[taken_lags] = time.time(), now - due
                taken_lags += 1
            loop.call_later(LAG_TICK_S, lag_tick, now + LAG_TICK_S)

        def seen_tick() -> None:
            nonlocal taken
            model = app.model
            new = min(model.events_seen - taken, len(model.events))
            if new > 0:
                wall = time.time()
                for event in list(model.events)[-new:]:
                    seen.add(wall - event.time)
            taken = model.events_seen
            loop.call_later(SEEN_CHECK_S, seen_tick)

        loop.call_later(LAG_TICK_S, lag_tick, loop.time() + LAG_TICK_S)
        loop.call_later(SEEN_CHECK_S, seen_tick)
        (workdir / "app.ready").touch()
        while not stopped():
            await asyncio.sleep(0.1)
        result = {
            "lags": list(zip(lag_walls[:taken_lags], lags[:taken_lags], strict=True)),
            "seen": seen.to_json(),
            "polls": app.polls,
            "store_error": app.store_error,
            "events_kept": len(app.model.events),
            "events_seen": app.model.events_seen,
            "nodes": len(app.model.nodes()),
        }
    _write_json(workdir / "app.json", result)


# -- the benchmark ------------------------------------------------------------------


def _status(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM in bytes."""
    values = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            values[key] = int(rest.split()[0]) * 1024
    return values


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _log_tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


class _Children:
    """The child processes: started with their logs in workdir, always stopped and reaped."""

    def __init__(self, workdir: Path, max_s: float) -> None:
        self.workdir = workdir
        self.max_s = max_s
        self.processes: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, role: str, *args: str) -> subprocess.Popen[bytes]:
        with open(self.workdir / f"{role}.log", "wb") as log:
            process = subprocess.Popen(
                [sys.executable, "-c", _CHILD, str(REPO / "benchmarks"), role,
                 str(self.workdir), *args],
                cwd=REPO, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env={**os.environ, "HB_BENCH_MAX_S": str(self.max_s)},
            )  # fmt: skip
        self.processes[role] = process
        return process

    def check_running(self, role: str) -> None:
        code = self.processes[role].poll()
        if code is not None:
            raise BenchmarkError(
                f"the {role} process exited with {code}:\n{_log_tail(self.workdir / f'{role}.log')}"
            )

    def wait_ready(self, roles: list[str], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not all((self.workdir / f"{role}.ready").exists() for role in roles):
            for role in roles:
                self.check_running(role)
            if time.monotonic() > deadline:
                raise BenchmarkError(f"the monitors were not ready within {timeout:.0f} s")
            time.sleep(0.05)

    def wait(self, role: str, timeout: float) -> None:
        process = self.processes[role]
        try:
            code = process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise BenchmarkError(
                f"the {role} process did not finish within {timeout:.0f} s"
            ) from None
        if code != 0:
            raise BenchmarkError(
                f"the {role} process exited with {code}:\n{_log_tail(self.workdir / f'{role}.log')}"
            )

    def stop_all(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in self.processes.values():
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)


def app_available() -> bool:
    try:
        return importlib.util.find_spec("hamsterbunker_tui.app") is not None
    except ImportError:
        return False


def run(quick: bool) -> Result:
    return measure(duration=8.0 if quick else 40.0, warmup=4.0 if quick else 10.0, quick=quick)


def measure(duration: float, warmup: float, quick: bool = False) -> Result:
    """The whole benchmark with duration seconds of load, RSS judged from warmup seconds on."""
    with_app = app_available()
    monitors = ["poll", "app"] if with_app else ["poll"]
    with temp_dir(NAME) as workdir:
        prepare(workdir)
        children = _Children(workdir, max_s=duration + 120)
        try:
            pids = {role: children.start(role).pid for role in monitors}
            children.wait_ready(monitors, timeout=60)
            rss: dict[str, list[tuple[float, dict[str, int]]]] = {role: [] for role in monitors}

            def sample() -> None:
                for role, pid in pids.items():
                    rss[role].append((time.time(), _status(pid)))

            sample()  # at start: ready, before the load
            cpu_before = {role: _cpu_s(pid) for role, pid in pids.items()}
            writer = children.start("writer", str(duration))
            deadline = time.monotonic() + duration + 60
            while writer.poll() is None:
                for role in monitors:
                    children.check_running(role)
                if time.monotonic() > deadline:
                    raise BenchmarkError("the load generator did not finish in time")
                sample()
                time.sleep(0.5)
            children.wait("writer", timeout=10)
            load = json.loads((workdir / "writer.json").read_text())
            for _ in range(3):  # 1.5 s more: the last events reach the monitors
                sample()
                time.sleep(0.5)
            sample()
            cpu_after = {role: _cpu_s(pid) for role, pid in pids.items()}
            cpu_window = time.time() - load["start"]
            (workdir / "stop").touch()
            for role in monitors:
                children.wait(role, timeout=30)
            results = {
                role: json.loads((workdir / f"{role}.json").read_text()) for role in monitors
            }
        finally:
            children.stop_all()
    cpu = {role: (cpu_after[role] - cpu_before[role]) / cpu_window for role in monitors}
    return _result(quick, duration, warmup, load, results, rss, cpu)


def _rss_at(samples: list[tuple[float, dict[str, int]]], wall: float) -> dict[str, int]:
    """The first sample taken at or after wall (the last one if none)."""
    return next((s for t, s in samples if t >= wall), samples[-1][1])


def _result(
    quick: bool,
    duration: float,
    warmup: float,
    load: dict[str, Any],
    results: dict[str, dict[str, Any]],
    rss: dict[str, list[tuple[float, dict[str, int]]]],
    cpu: dict[str, float],
) -> Result:
    start, end, elapsed = load["start"], load["end"], load["elapsed"]
    tables: list[Table] = []
    checks: list[Check] = []
    notes: list[str] = []
    tables.append(
        Table(
            "The load (one writer process)",
            ["figure", "value"],
            [
                ["nodes", str(NODES)],
                ["run", f"{elapsed:.1f} s"],
                ["events written", f"{load['events']:,} ({load['events'] / elapsed:.0f}/s)"],
                [
                    "heartbeats written",
                    f"{load['heartbeats']:,} ({load['heartbeats'] / elapsed:.0f}/s)",
                ],
                ["lease renewals / checkpoints", f"{load['renewals']} / {load['checkpoints']}"],
                ["most behind its schedule", f"{load['behind_max'] * 1000:.0f} ms"],
            ],
        )
    )

    # a. the poll
    poll = results["poll"]
    in_load = [p for p in poll["polls"] if start <= p[0] <= end]
    if not in_load:
        raise BenchmarkError("no poll fell inside the load window")
    parts = ["read_lease", "list_checkpoints", "tail.read", "model.update"]
    totals = [sum(p[1:5]) for p in in_load]
    rows = [spread_row("one poll, all four", totals)]
    rows += [spread_row(f"  {part}", [p[1 + k] for p in in_load]) for k, part in enumerate(parts)]
    per_poll = [p[6] for p in in_load]
    poll_cpu = sum(p[5] for p in in_load) / (end - start)
    tables.append(
        Table(
            f"Poll cost every {POLL_S * 1000:.0f} ms under load "
            f"({sum(per_poll) / len(per_poll):.0f} events per poll on average, "
            f"at most {max(per_poll)})",
            SPREAD_HEADERS,
            rows,
        )
    )
    poll_seen = poll["seen"]
    poll_p99 = percentile(totals, 99)
    checks.append(
        Check(
            "poll p99 (read_lease + list_checkpoints + tail.read + model.update)",
            f"{poll_p99 * 1000:.1f} ms",
            f"≤ {POLL_TARGET_MS} ms",
            poll_p99 * 1000 <= POLL_TARGET_MS,
        )
    )
    checks.append(
        Check(
            "CPU of the polling thread",
            f"{poll_cpu * 100:.1f} % of a core",
            "— (reported)",
            None,
        )
    )

    # b. the UI
    app = results.get("app")
    if app is None:
        notes.append(
            "tui/hamsterbunker_tui/app.py was not found at run time: the UI was not measured"
        )
        checks.append(Check("UI measured", "no: no hamsterbunker_tui.app", "yes", None))
    else:
        lags = [lag for wall, lag in app["lags"] if start <= wall <= end]
        seen = app["seen"]
        if not lags or not seen["n"]:
            raise BenchmarkError("the UI probe saw no load (no lag samples or no events)")
        lag_p99 = percentile(lags, 99)
        seen_p99 = histogram_percentile(seen, 99)
        tables.append(
            Table(
                f"MonitorApp headless under the load ({app['polls']} polls in "
                f"{end - start + 1.5:.0f} s; the app process used "
                f"{cpu['app'] * 100:.0f} % of a core)",
                SPREAD_HEADERS,
                [
                    spread_row(f"event-loop lag (a {LAG_TICK_S * 1000:.0f} ms timer)", lags),
                    histogram_row("event append → in app.model (the screen's data)", seen),
                    histogram_row("event append → in the poll monitor's model", poll_seen),
                ],
            )
        )
        checks.append(
            Check(
                "UI event-loop lag p99",
                f"{lag_p99 * 1000:.1f} ms (max {max(lags) * 1000:.0f} ms)",
                f"≤ {LAG_TARGET_MS} ms",
                lag_p99 * 1000 <= LAG_TARGET_MS,
            )
        )
        checks.append(
            Check(
                "event → screen p99 (append → in app.model)",
                f"{seen_p99 * 1000:.0f} ms",
                f"≤ {SEEN_TARGET_MS} ms",
                seen_p99 * 1000 <= SEEN_TARGET_MS,
            )
        )
        if app["store_error"]:
            notes.append(f"the app's last poll failed: {app['store_error']}")

    # c. memory
    mem_rows = []
    labels = {"poll": "poll monitor (tail + model)", "app": "MonitorApp (headless)"}
    for role, samples in rss.items():
        first = samples[0][1]["VmRSS"]
        warm = _rss_at(samples, start + warmup)["VmRSS"]
        mid = _rss_at(samples, start + (warmup + elapsed) / 2)["VmRSS"]
        last = samples[-1][1]
        growth = last["VmRSS"] - warm
        kept = results[role]["events_kept"]
        mem_rows.append(
            [
                labels[role],
                f"{first / 1e6:.1f}",
                f"{warm / 1e6:.1f}",
                f"{mid / 1e6:.1f}",
                f"{last['VmRSS'] / 1e6:.1f}",
                f"{growth / 1e6:+.1f}",
                f"{last['VmHWM'] / 1e6:.1f}",
                f"{kept:,} of {results[role]['events_seen']:,}",
            ]
        )
        checks.append(
            Check(
                f"RSS growth after warm-up, {labels[role]}",
                f"{growth / 1e6:+.1f} MB ({warm / 1e6:.1f} → {last['VmRSS'] / 1e6:.1f} MB)",
                f"≤ {RSS_GROWTH_TARGET_MB} MB",
                growth <= RSS_GROWTH_TARGET_MB * 1e6,
            )
        )
        if kept > MAX_EVENTS_KEPT:
            notes.append(f"{labels[role]} kept {kept} events, more than {MAX_EVENTS_KEPT}")
    tables.append(
        Table(
            "Resident memory of the monitor processes (MB = 10⁶ bytes)",
            [
                "process",
                "at start",
                f"after {warmup:.0f} s",
                f"after {(warmup + elapsed) / 2:.0f} s",
                "at the end",
                "growth after warm-up",
                "VmHWM",
                "events kept",
            ],
            mem_rows,
        )
    )
    notes.append(
        "Both monitors ran at the same time as the writer, in separate processes, on "
        f"{os.cpu_count()} CPUs: the app's figures include the competition for them"
    )
    if quick:
        notes.append(f"quick run: {duration:.0f} s of load, warm-up {warmup:.0f} s")
    return Result(NAME, TITLE, METHOD, tables, checks, notes, ANALYSIS, analysis_always=True)
