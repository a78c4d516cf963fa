"""``hb-tui --demo``: the local three-node cluster the monitor watches, and brings back.

The nodes are real processes (``LocalCluster``) on a temporary file store with
a random secret, running the demo's counter agent. A node the monitor kills
is started again after a pause, so it rejoins as a standby and the next kill
has somewhere to go.
"""

from __future__ import annotations

import secrets
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from hamsterbunker.core.errors import HamsterbunkerError
from hamsterbunker.core.timing import DEFAULT_TIMING, LeaseTiming
from hamsterbunker.demo import NODES, CounterAgent
from hamsterbunker.ops.local import LocalCluster, NodeSpec
from hamsterbunker.records import CheckpointInfo
from hamsterbunker.sealing import Sealer
from hamsterbunker.stores import Store

__all__ = [
    "DEMO_AGENT",
    "RESTART_AFTER_S",
    "DemoCounter",
    "DemoNodes",
    "DemoRun",
    "prepare_demo",
    "start_demo",
]

DEMO_AGENT = "hamsterbunker.demo:CounterAgent"
DEMO_AGENT_ID = CounterAgent.id
# Long enough to watch the takeover happen without the killed node, short
# enough that the next kill finds three nodes again.
RESTART_AFTER_S = 2.0


@dataclass
class DemoRun:
    """A started demo cluster and the temporary directory that holds its store and logs."""

    cluster: LocalCluster
    workdir: Path

    @property
    def store_url(self) -> str:
        return self.cluster.store_url

    def stop(self) -> None:
        """Stop every node (gracefully, then SIGKILL) and remove the temporary directory."""
        try:
            self.cluster.stop_all()
        finally:
            shutil.rmtree(self.workdir, ignore_errors=True)


def prepare_demo(timing: LeaseTiming = DEFAULT_TIMING) -> DemoRun:
    """The demo's temporary store and cluster, no node started yet: the monitor starts
    them once its screen is up (``DemoNodes.start_missing``), so it is never blank."""
    workdir = Path(tempfile.mkdtemp(prefix="hb-tui-demo-"))
    cluster = LocalCluster(
        store_url=(workdir / "store").as_uri(),
        secret=secrets.token_urlsafe(24),
        agent=DEMO_AGENT,
        log_dir=workdir / "logs",
        timing=timing,
    )
    return DemoRun(cluster, workdir)


def start_demo(timing: LeaseTiming = DEFAULT_TIMING) -> DemoRun:
    """Start the three demo nodes on a new temporary file store."""
    run = prepare_demo(timing)
    try:
        for spec in NODES:
            run.cluster.start(spec)
    except BaseException:
        run.stop()
        raise
    return run


@dataclass
class DemoNodes:
    """Kills demo nodes through their LocalCluster and restarts them when due.

    Blocking (process waits and starts): the app calls it from threads, hence
    the lock around the restart schedule.
    """

    cluster: LocalCluster
    restart_after_s: float = RESTART_AFTER_S
    _due: dict[str, tuple[float, NodeSpec]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def owns(self, node: str, pid: int) -> bool:
        """True if pid is this cluster's live process of node (not a stale heartbeat's)."""
        return self.cluster.alive(node) and self.cluster.pid(node) == pid

    def kill(self, node: str, region: str) -> None:
        """SIGKILL node and schedule its restart."""
        self.cluster.kill(node)
        with self._lock:
            self._due[node] = (time.monotonic() + self.restart_after_s, NodeSpec(node, region))

    def start_missing(self) -> list[tuple[str, int]]:
        """Start the demo's nodes that are not running; (node, pid) of each started."""
        started = []
        for spec in NODES:
            if not self.cluster.alive(spec.node):
                started.append((spec.node, self.cluster.start(spec).pid))
        return started

    def running(self) -> list[tuple[str, str, int]]:
        """(node, region, pid) of each running demo node."""
        return [
            (spec.node, spec.region, self.cluster.pid(spec.node))
            for spec in NODES
            if self.cluster.alive(spec.node)
        ]

    def restart_due(self) -> list[tuple[str, int]]:
        """Start the killed nodes whose pause is over; (node, new pid) of each."""
        now = time.monotonic()
        with self._lock:
            due = [spec for at, spec in self._due.values() if at <= now]
            for spec in due:
                del self._due[spec.node]
        return [(spec.node, self.cluster.start(spec).pid) for spec in due]

    def pending(self) -> bool:
        with self._lock:
            return bool(self._due)


@dataclass
class DemoCounter:
    """The counter in the newest checkpoint, opened with the demo's own secret.

    Only the demo does this: it made the secret. Blocking (the key derivation, a
    store read): called from a thread. None until the first checkpoint can be opened.
    """

    store: Store
    secret: str
    agent: str = DEMO_AGENT_ID
    _sealer: Sealer | None = None
    _last: tuple[int, int, int | None] = (-1, -1, None)  # epoch, seq, count

    def read(self, info: CheckpointInfo | None) -> int | None:
        if info is None:
            return None
        epoch, seq, count = self._last
        if (info.epoch, info.seq) == (epoch, seq):
            return count
        try:
            if self._sealer is None:
                cluster = self.store.read_cluster()
                if cluster is None:
                    return None
                self._sealer = Sealer(self.secret, cluster)
            blob = self.store.read_checkpoint(self.agent, info)
            state = self._sealer.open(blob, self.agent, info.epoch, info.seq)
            count = int(state["count"])
        except (HamsterbunkerError, OSError, KeyError, TypeError, ValueError):
            return self._last[2]  # pruned meanwhile, say: keep the last one shown
        self._last = (info.epoch, info.seq, count)
        return count
