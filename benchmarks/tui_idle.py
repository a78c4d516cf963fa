"""What ``hb-tui`` costs while nobody touches it: CPU share of one core on a three-node cluster."""

from __future__ import annotations

import fcntl
import os
import pty
import signal
import struct
import subprocess
import sys
import termios
import threading
import time
from pathlib import Path

from .common import TIMING, BenchmarkError, Check, Result, Table
from .nodes import AGENT_ID, bench_cluster
from .standby import CLK_TCK, Usage, _memory, _usage

NAME = "tui_idle"
TITLE = "hb-tui idle cost on a three-node cluster"
CPU_TARGET = 3.0  # % of one core
SIZES = ((80, 24), (200, 60))  # terminal columns, rows

METHOD = f"""\
The three node processes of the failover benchmark (default timing: tick
{TIMING.tick_ms} ms, TTL {TIMING.lease_ttl_ms} ms) on one file store, the leader stepping
`CounterAgent` (about 4 steps and 4 checkpoints a second, with their events, renewals
and heartbeats). Once the leader has published and both standbys heartbeat, `hb-tui
--store URL --agent-id {AGENT_ID}` is started as its own process on a pseudo-terminal
of each size in turn ({", ".join(f"{c}×{r}" for c, r in SIZES)}; `TERM=xterm-256color`),
whose output a thread of the benchmark reads and throws away, as a terminal would show
it. Nobody presses a key. After a settling time (start-up, the first poll, the event
history read once), the benchmark reads the monitor's `/proc/PID/stat` (`utime +
stime`, every thread, in clock ticks of 1/{CLK_TCK} s) at the start and end of the
window, and counts the bytes it wrote to the terminal meanwhile (what it repainted).
CPU is given as a share of one core.
"""

ANALYSIS = """\
Measured on 2026-12-01 on this machine, each change in turn (CPU % of a core at 80×24 /
200×60, from this benchmark; the machine is shared, so ±0.3 or so):

| hb-tui | 80×24 | 200×60 |
| --- | ---: | ---: |
| before (watch of every store change, a poll for each, 0.5 s timer) | 21.1 | 25.3 |
| hints taken at most every 0.4 s; ages in whole seconds; new layout | 10.6 | 20.6 |
| the event log no longer asks for a layout of the screen on each write | 10.4 | 17.3 |
| routine log lines (steps, checkpoints) written together every 2 s | 5.5 | 8.5 |
| the watch on the lease record only; a renewal costs a lease read, not a poll | 3.6 | 5.0 |
| routine cells, progress and log lines every 4 s; a step and its checkpoint: one line | 2.2–2.9 | 3.2–3.7 |
| file store: no watchfiles thread, the lease read every 0.5 s; 2 s timer while calm | 1.35 | 2.15 |
| then routine lines and cells every 2 s again, the progress panel at every poll | 1.55 | 2.20 |

What burnt the CPU, in order (cProfile of the event loop; `/proc/PID/task/*` per thread):

1. **A poll and a repaint for every store change.** The monitor watched the whole
   agent: every event line, checkpoint, heartbeat and renewal of the three nodes woke it
   (about ten polls a second with a stepping leader), and each poll pushed new text into
   the panels, the table and the log.
2. **A layout of the whole screen on every log write.** `RichLog.write` changes the
   log's virtual size, a reactive that asks for a layout of the screen (about 0.1 s each
   at 200×60 under the profiler). The event log now keeps its scrollbar always shown,
   and a longer log repaints the log alone.
3. **Repaints of things that change with every step.** The log scrolls (a scroll
   repaints every visible line: the cost grows with the terminal), the seq and step
   cells change (any changed cell makes the table render every row again). These are
   now brought up to date every `ROUTINE_S` (2 s; `tui/hamsterbunker_tui/nodes.py`);
   warnings, takeovers, roles, health and the lease are shown at once.
4. **The file store's watch itself.** A watchfiles thread (20 ms step) and notify's
   inotify thread woke about 300 times a second on the agent directory's writes: 1.3 %
   of a core, more than all the rest once the above was done. A file store is now not
   watched; its lease is read every 0.5 s instead (a takeover still shows within half a
   second). Stores whose watch is a push (etcd, Redis) keep it.

What is left at 200×60: the log's scroll every 2 s (most of the terminal output), one
poll of the store every 2 s while calm (1 s otherwise), two lease reads a second. A poll
that took in 100 events or more (a flood, as in the `tui` benchmark) is followed by
the next after 0.5 s, so that events still reach the screen within a second there
(event → app.model p99 757 ms in that benchmark after this change, 2078 ms without
this rule).
"""


def _spawn(url: str, size: tuple[int, int]) -> tuple[subprocess.Popen[bytes], int]:
    """Start hb-tui on a new pseudo-terminal of size (columns, rows); (process, master fd)."""
    master, slave = pty.openpty()
    columns, rows = size
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
    env = dict(os.environ, TERM="xterm-256color", COLUMNS=str(columns), LINES=str(rows))
    process = subprocess.Popen(
        [sys.executable, "-m", "hamsterbunker_tui", "--store", url, "--agent-id", AGENT_ID],
        stdin=slave,
        stdout=slave,
        stderr=slave,  # Textual draws on stderr
        env=env,
        start_new_session=True,  # its own controlling terminal: the pty
    )
    os.close(slave)
    return process, master


class _Drain(threading.Thread):
    """Reads the terminal's output, as a terminal would, and counts the bytes."""

    def __init__(self, fd: int) -> None:
        super().__init__(daemon=True)
        self.fd = fd
        self.bytes = 0

    def run(self) -> None:
        while True:
            try:
                data = os.read(self.fd, 65536)
            except OSError:
                return  # the process ended: EIO on the master side
            if not data:
                return
            self.bytes += len(data)


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)  # hb-tui quits on SIGTERM as on q
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


def _measure(url: str, size: tuple[int, int], settle: float, duration: float) -> list[str]:
    process, master = _spawn(url, size)
    drain = _Drain(master)
    drain.start()
    try:
        deadline = time.monotonic() + settle
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise BenchmarkError(f"hb-tui exited with {process.returncode} at start")
            time.sleep(0.1)
        if drain.bytes == 0:
            raise BenchmarkError("hb-tui showed nothing on its terminal")
        before: Usage = _usage(process.pid)
        written = drain.bytes
        start = time.monotonic()
        time.sleep(duration)
        after = _usage(process.pid)
        elapsed = time.monotonic() - start
        rss = _memory(process.pid)[0]
        if process.poll() is not None:
            raise BenchmarkError(f"hb-tui exited with {process.returncode} while measured")
        cpu = 100 * (after.cpu_s - before.cpu_s) / elapsed
        return [
            f"{size[0]}×{size[1]}",
            f"{cpu:.2f}",
            f"{(after.switches - before.switches) / elapsed:.0f}",
            f"{(drain.bytes - written) / elapsed / 1000:.1f}",
            f"{rss / 1e6:.0f}",
        ]
    finally:
        _stop(process)
        drain.join(timeout=5)
        os.close(master)


def run(quick: bool) -> Result:
    settle, duration = (4.0, 5.0) if quick else (6.0, 20.0)
    rows = []
    with bench_cluster(NAME, timing=TIMING) as cluster:
        cluster.ready_leader()
        url = Path(cluster.workdir / "store").as_uri()
        for size in SIZES:
            rows.append(_measure(url, size, settle, duration))
    table = Table(
        f"{TITLE}: {duration:.0f} s per terminal size, after {settle:.0f} s of start-up",
        ["terminal", "CPU % of a core", "ctx switches/s", "terminal output kB/s", "RSS MB"],
        rows,
    )
    worst = max(float(row[1]) for row in rows)
    checks = [
        Check(
            "hb-tui idle CPU (the costlier terminal size)",
            f"{worst:.2f} % of a core",
            f"≤ {CPU_TARGET} %",
            worst <= CPU_TARGET,
        )
    ]
    notes = [
        f"CPU resolution: one clock tick ({1000 / CLK_TCK:.0f} ms) in {duration:.0f} s "
        f"= {100 / CLK_TCK / duration:.3f} % of a core",
    ]
    return Result(NAME, TITLE, METHOD, [table], checks, notes, ANALYSIS, analysis_always=True)
