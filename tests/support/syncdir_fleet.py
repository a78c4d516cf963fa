"""Node processes of the syncdir store on Syncthing-synced folders: the scenarios' fleet.

Each node is a process of its own (``tests.support.syncdir_node``: the library's
``Runtime`` on a ``SyncDirStore``, stepping the demo's ``CounterAgent``) on the
folder of one instance of a ``tests.support.syncthing`` mesh, all appending to
one history file (the nodes' clock, CLOCK_BOOTTIME). The timing is what a user of
such a folder would choose: a stated sync delay of 3 s (the harness measures
about 1 s), tick 500 ms, TTL 8 s ≥ 2 × (tick + sync delay). Shared by
``tests/faults/test_syncdir_syncthing.py`` and ``benchmarks/syncdir.py``.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from hamsterbunker.core.history import Op, read_history
from hamsterbunker.records import Event
from hamsterbunker.stores.layer.keys import AgentKeys
from hamsterbunker.stores.syncdir import SyncDirStore
from tests.support import wait_until
from tests.support.raw_store import file_key
from tests.support.syncthing import SyncthingInstance, SyncthingMesh, syncthing_mesh

__all__ = [
    "AGENT",
    "SYNC_DELAY_MS",
    "TICK_MS",
    "TTL_MS",
    "TTL_S",
    "WAIT_S",
    "Fleet",
    "chain",
    "events",
    "fleet_on",
    "reader",
]

AGENT = "counter"  # CounterAgent.id
SYNC_DELAY_MS, TICK_MS, TTL_MS = 3_000, 500, 8_000
TTL_S = TTL_MS / 1000
WAIT_S = 90.0  # a generous bound for anything that takes a TTL or two and a sync
STORE_ROOT = (".hamsterbunker-syncdir", "cluster.json", "nodes")  # what the first node made


class Fleet:
    """Node processes, each on one Syncthing instance's folder; all stopped at the end."""

    def __init__(self, mesh: SyncthingMesh, workdir: Path) -> None:
        self.mesh, self.workdir = mesh, workdir
        self.history = workdir / "history.jsonl"
        self.processes: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, node: str, instance: SyncthingInstance) -> None:
        log = open(self.workdir / f"{node}.log", "ab")  # noqa: SIM115 - closed with the process
        self.processes[node] = subprocess.Popen(
            [sys.executable, "-m", "tests.support.syncdir_node", "--root", str(instance.folder),
             "--node", node, "--history", str(self.history),
             "--sync-delay-ms", str(SYNC_DELAY_MS), "--tick-ms", str(TICK_MS),
             "--lease-ttl-ms", str(TTL_MS)],
            stdin=subprocess.DEVNULL, stdout=log, stderr=log,
        )  # fmt: skip
        log.close()

    def start_first(self, node: str, instance: SyncthingInstance) -> None:
        """The node that makes the store: leading once it has published."""
        self.start(node, instance)
        wait_until(lambda: self.published(node), f"{node} to lead and publish", WAIT_S)

    def start_beside(self, node: str, instance: SyncthingInstance) -> None:
        """A node on a folder the store's cluster record (else it would first wait for the
        record: docs/syncdir.md, "The first start") and the leader's lease have reached:
        a node that sees no lease takes it, and the fleet would begin with two leaders."""
        folder = instance.folder
        wait_until(
            lambda: all((folder / name).exists() for name in STORE_ROOT), "the store", WAIT_S
        )
        wait_until(lambda: lease_held(instance), "the leader's lease", WAIT_S)
        self.start(node, instance)
        wait_until(lambda: self.beats(instance, node), f"{node} to stand by", WAIT_S)

    def ops(self, node: str, op: str, outcome: str | None = None) -> list[Op]:
        found = read_history(self.history) if self.history.exists() else []
        return [o for o in found if o.node == node and o.op == op
                and (outcome is None or o.outcome == outcome)]  # fmt: skip

    def published(self, node: str) -> list[Op]:
        return self.ops(node, "publish", "ok")

    def acquired(self, node: str, above: int = 0) -> list[Op]:
        return [o for o in self.ops(node, "acquire", "ok") if o.epoch > above]

    def beats(self, instance: SyncthingInstance, node: str) -> bool:
        return any(b.node == node for b in reader(instance).list_heartbeats(AGENT))

    def stop(self, node: str, signum: signal.Signals) -> None:
        process = self.processes[node]
        process.send_signal(signum)
        process.wait(timeout=WAIT_S)

    def log_tails(self) -> str:
        tails = []
        for node in self.processes:
            lines = (self.workdir / f"{node}.log").read_text().splitlines()
            tails.append(f"--- {node} ---\n" + "\n".join(lines[-20:]))
        return "\n".join(tails)

    def close(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                process.kill()
            process.wait(timeout=WAIT_S)


def reader(instance: SyncthingInstance) -> SyncDirStore:
    """What the store holds on this instance's machine, read without writing anything."""
    return SyncDirStore(instance.folder, "reader", sync_delay_ms=SYNC_DELAY_MS, create=False)


def lease_held(instance: SyncthingInstance) -> bool:
    """Whether the store on this instance's machine shows the agent's lease held."""
    lease = reader(instance).read_lease(AGENT)
    return lease is not None and lease.holder is not None


def events(instance: SyncthingInstance, kind: str) -> list[Event]:
    return [e for e in reader(instance).read_events(AGENT) if e.type == kind]


def chain(instance: SyncthingInstance, node: str) -> set[str]:
    """The checkpoint files of node's chain as this instance's folder holds them (their
    keys in node's subtree: ``<seq>-<epoch>-<size>-<ms>``; Syncthing's temp files not)."""
    keys = AgentKeys(AGENT)
    folder = file_key(instance.folder / "nodes" / node, keys.ckpt)
    names = [path.name for path in folder.iterdir()] if folder.is_dir() else []
    return {name for name in names if keys.checkpoint_info(keys.ckpt + name) is not None}


@contextlib.contextmanager
def fleet_on(tmp_path: Path, n: int) -> Iterator[Fleet]:
    with syncthing_mesh(tmp_path / "sync", n=n) as mesh:
        fleet = Fleet(mesh, tmp_path)
        try:
            yield fleet
        except BaseException:
            print(fleet.log_tails())
            print(mesh.logs())
            raise
        finally:
            fleet.close()
