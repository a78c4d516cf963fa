"""What a standby costs while it waits: CPU share of one core and resident memory."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from .common import TIMING, BenchmarkError, Check, Result, Table
from .nodes import AGENT_ID, NODES, bench_cluster

NAME = "standby"
TITLE = "Standby idle cost"
TICK_MS, TTL_MS = TIMING.tick_ms, TIMING.lease_ttl_ms  # the defaults of `hb run`
CPU_TARGET = 0.5  # % of one core
RSS_TARGET_MB = 40  # MB = 10^6 bytes (issue 18)
CLK_TCK = os.sysconf("SC_CLK_TCK")

METHOD = f"""\
The three node processes of the failover benchmark (default timing: tick {TICK_MS} ms,
TTL {TTL_MS} ms) on one file store, the leader stepping `CounterAgent` (about 4 steps
and 4 checkpoints a second, plus its renewals, heartbeats and events). Once the leader
has published and both standbys heartbeat, and a few seconds more have passed (start-up
done: imports, the scrypt key derivation), the benchmark reads each process's
`/proc/PID/stat` (`utime + stime`, every thread, in clock ticks of 1/{CLK_TCK} s) at the
start and end of the window and `/proc/PID/status` (`VmRSS`, `VmHWM`) every second,
touching the store not at all while it measures (reads of the store would not wake the
nodes, but the window is kept clean). Context switches (voluntary + involuntary, summed
over `/proc/PID/task/*/status`) show how often a process wakes. CPU is given as a share
of one core; memory in MB of 10⁶ bytes. Every change of the lease record (each of the
leader's renewals) wakes a standby through the watch, and a stepping leader keeps the
store busy, so this is a standby's busiest idle.
"""

ANALYSIS = """\
Profiled on 2026-11-30 on this machine, a standby of the cluster above:

* `perf stat -p PID` for 15 s: 242 ms of task-clock (1.6 % of a core) and 288 context
  switches a second; `perf record -g`: 51 % of the samples in the interpreter, 38 % in
  the kernel, 21 % in `finish_task_switch` alone, i.e. in waking threads up.
* Per thread (`/proc/PID/task/*/stat` over 20 s): the event loop 0.85 %, watchfiles'
  worker thread 0.45 % (65 switches/s), notify's inotify thread 0.10 % (100
  switches/s), the two store threads 0.5 %.
* the experiment `whatif standby`: the third node replaced by the library's own
  `Runtime` over a `FileStore` subclass whose `watch` is varied, 20 s each beside an
  unchanged leader (stepping CounterAgent) and standby:

| the standby's watch | CPU % of a core | ctx switches/s | wakes/s | lease reads/s |
| --- | --- | --- | --- | --- |
| as is: watchfiles, recursive, 20 ms step | 1.25–1.65 | 294–325 | 5.9–7.9 | 8.4–10.3 |
| inotify on the event loop, lease.json only | 0.60–0.75 | 71–90 | 2.5 | 4.9–5.0 |
| the same, waking only when the lease is *released* | 0.40 | 56 | 0 | 2.5 |
| no watch at all (ticks only) | 0.30–0.40 | 46–56 | 0 | 2.5 |
| an idle `watchfiles.awatch` alone, step 20 ms, nothing changing | 0.15–0.25 | 50 | | |

What costs the time, in order:

1. **Waking on every store change.** The watch covers the agent's whole directory,
   recursively, so every checkpoint, event line and heartbeat of every node (its own
   heartbeats included) wakes the standby: 6–8 wakes a second, each followed by a tick
   (a lease read through the store thread pool), 8–10 lease reads a second where the
   ticks need 2.5. watchfiles applies `watch_filter` in Python *after* its Rust thread
   has returned, so even a change that is filtered out costs the whole round trip
   (worker thread → event loop → anyio task group → back into Rust).
2. **Polling inside watchfiles.** Its Rust loop wakes every `step` (20 ms) and takes
   the GIL to look at its stop event, 50 wake-ups a second with nothing changing.
3. **Waking for renewals.** Even a watch of `lease.json` alone wakes the standby on
   each of the leader's 2.5 renewals a second, which its ticks see anyway.

Done since: the runtime watches the lease record alone (`watch(agent, lease_only=True)`:
the agent directory, not recursive, only `lease.json`), so checkpoints, heartbeats and
events of other nodes no longer wake a standby: 1.25–1.65 % → 0.85 % of a core in the
run above, at the same handover latency. What remains is the second and third item
below the watch: watchfiles' 20 ms polling (0.15–0.25 %; a longer step would add its
length to every graceful handover) and one wake-up per renewal, plus the ticks.

What could fix the rest (measured above): read an inotify file
descriptor on the event loop itself (`loop.add_reader`: no thread, no polling),
watching the agent directory alone (not recursive) for `IN_MOVED_TO`/`IN_DELETE` of
`lease.json` (the store replaces it by rename, so temp files and the lock file wake
nothing), and wake the runtime only when the record read there has no holder. That
standby used 0.40 % of a core, as little as one with no watch at all, while a released
lease still wakes it at once. Keep polling for NFS, where inotify sees nothing. The
leader need not watch at all (it never waits on a wake), which would save it about
1 %. What remains, 2.5 ticks a second (lease read and heartbeat write through the
store thread pool), costs about 1.5 ms of CPU per tick, mostly thread hand-offs.
"""


@dataclass(frozen=True)
class Usage:
    cpu_s: float
    switches: int


def _usage(pid: int) -> Usage:
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat.rsplit(")", 1)[1].split()
    utime, stime = int(fields[11]), int(fields[12])  # fields 14 and 15 of proc(5)
    switches = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            for line in (task / "status").read_text().splitlines():
                if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")):
                    switches += int(line.split()[1])
        except OSError:
            continue  # a thread that ended while we looked
    return Usage((utime + stime) / CLK_TCK, switches)


def _memory(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) in bytes."""
    values = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            values[key] = int(rest.split()[0]) * 1024
    return values["VmRSS"], values["VmHWM"]


def run(quick: bool) -> Result:
    settle, duration = (2.0, 5.0) if quick else (5.0, 20.0)
    with bench_cluster(NAME, timing=TIMING) as cluster:
        leader = cluster.ready_leader()
        time.sleep(settle)
        pids = {spec.node: cluster.process(spec.node).pid for spec in NODES}
        before = {node: _usage(pid) for node, pid in pids.items()}
        start = time.monotonic()
        rss: dict[str, list[int]] = {node: [] for node in pids}
        while (now := time.monotonic()) < start + duration:
            for node, pid in pids.items():
                rss[node].append(_memory(pid)[0])
            time.sleep(min(1.0, max(0.0, start + duration - now)))
        after = {node: _usage(pid) for node, pid in pids.items()}
        elapsed = time.monotonic() - start
        hwm = {node: _memory(pid)[1] for node, pid in pids.items()}
        lease = cluster.store.read_lease(AGENT_ID)
        if lease is None or (lease.holder, lease.epoch) != (leader.node, leader.epoch):
            raise BenchmarkError("the lease changed hands during the measurement")
        publishes = sum(
            1
            for op in cluster.ops()
            if op.op == "publish" and op.outcome == "ok" and start <= op.end < start + elapsed
        )
    rows = []
    standby_cpu: list[float] = []
    standby_rss: list[int] = []
    for node in pids:
        cpu = 100 * (after[node].cpu_s - before[node].cpu_s) / elapsed
        role = "leader" if node == leader.node else "standby"
        if role == "standby":
            standby_cpu.append(cpu)
            standby_rss.append(max(rss[node]))
        rows.append(
            [
                f"{node} ({role})",
                f"{cpu:.2f}",
                f"{(after[node].switches - before[node].switches) / elapsed:.1f}",
                f"{sum(rss[node]) / len(rss[node]) / 1e6:.1f}",
                f"{max(rss[node]) / 1e6:.1f}",
                f"{hwm[node] / 1e6:.1f}",
            ]
        )
    table = Table(
        f"{TITLE} over {elapsed:.0f} s, leader publishing {publishes / elapsed:.1f} checkpoints/s",
        ["node", "CPU % of a core", "ctx switches/s", "RSS MB mean", "RSS MB max", "VmHWM MB"],
        rows,
    )
    checks = [
        Check(
            "standby CPU (the busier standby)",
            f"{max(standby_cpu):.2f} % of a core",
            f"≤ {CPU_TARGET} %",
            max(standby_cpu) <= CPU_TARGET,
        ),
        Check(
            "standby RSS (the larger standby, max over the window)",
            f"{max(standby_rss) / 1e6:.1f} MB",
            f"≤ {RSS_TARGET_MB} MB",
            max(standby_rss) <= RSS_TARGET_MB * 1e6,
        ),
        Check(
            "standby peak RSS since its start (VmHWM: start-up scrypt included)",
            f"{max(hwm[n] for n in pids if n != leader.node) / 1e6:.1f} MB",
            "— (the steady state above is judged)",
            None,
        ),
    ]
    notes = [
        f"CPU resolution: one clock tick ({1000 / CLK_TCK:.0f} ms) in {elapsed:.0f} s "
        f"= {100 / CLK_TCK / elapsed:.3f} % of a core",
        "VmHWM is the peak resident set since the process started; it includes the "
        "start-up, where scrypt (n = 2^15, r = 8) takes 32 MiB for about 0.1 s",
    ]
    return Result(NAME, TITLE, METHOD, [table], checks, notes, ANALYSIS)
