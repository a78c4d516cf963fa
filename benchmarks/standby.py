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
store busy, so this is a standby's busiest idle. The nodes run as `hb run` does by
default: without `--http`, so without metrics.
"""

ANALYSIS = """\
Profiled on 2026-11-30 and 2026-12-02 on this machine, a standby of the cluster above
(per thread from `/proc/PID/task/*/stat`; system calls with `strace -c -f` for 10 s).
Each change was measured in its own run beside the others, under the load other work
put on the machine then, so the steps are roughly, not exactly, comparable (each
lock or temp file closed or moved in the agent's directory woke the loop: 3 wake-ups
per renewal and 1 per checkpoint, for nothing):

| the standby | CPU % of a core | RSS MB |
| --- | --- | --- |
| watchfiles, the agent's whole directory, recursive (2026-11-30) | 1.25–1.65 | 41 |
| watchfiles, the lease record alone | 0.85–1.20 | 41 |
| inotify on the event loop, the lease record alone (ec446f5) | 1.15–1.35 | 40.5–41.5 |
| inotify: only `lease.json` arriving or going (not each temp or lock file) | 0.80–0.85 | 39.5 |
| reads the lease when woken, else after 2 ticks without (not also each tick) | 0.65–0.85 | 39.5 |
| without watchfiles (polling only) and prometheus_client (`--http` only) | 0.65–0.70 | 37.6 |
| its heartbeat every half TTL, not every tick (`LeaseTiming.standby_period_s`) | 0.45–0.60 | 36.7–37.5 |

What one idle second of the standby did before the last step (`strace`): 2.5 wake-ups
by the leader's renewals, each followed by a read of the lease on the store's thread
pool, and 2.5 heartbeat writes on the same pool; 107 futex calls, 36 passes of the
event loop and 5 self-pipe writes, i.e. the hand-offs to the pool and back. The
wake-ups were not what cost the most: a standby whose watch slept through renewals (as
a leader's does) used 0.60–0.70 % as well, and one writing its heartbeat every third
tick 0.40–0.45 %: each heartbeat costs about 0.1 % of a core. The read after each
renewal stays: it is what keeps a failover within a TTL of the holder's death (the
standby times the expiry from the last change it saw). A standby's liveness is judged
over a whole TTL (`hb switchover`, `hb forget`, a duplicate node id), which still sees
two heartbeats; a leader beats every tick, and a change of role is written at once.

What is left, 2.5 reads and 1 heartbeat a second, is hand-offs to the store's thread
pool; fewer would need the store calls on the event loop itself (a loop-native client
for Redis and etcd, the file store's local writes inline), which is where the many
agents of one node process (issue 18) will have to go.
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
