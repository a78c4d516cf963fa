"""Rotating the secret online (issue 19) with real node processes, on file, Redis and etcd.

1. A whole rotation (rolling restart with the new secret, begin, commit,
   finish) while the leader is SIGKILLed and SIGTERMed again and again: no
   step is lost, no checkpoint is lost (the newest never goes back), no
   restore resumes behind (local_cluster's teardown holds the history to
   the checker), every checkpoint seen after begin is under the new key id
   and none under the old after commit. Afterwards a node with only the old
   secret refuses at start (exit 2, the rotation named).
2. ``hb rotate-secret commit`` killed at every failpoint of its work (each
   checkpoint's re-seal, before and after its rename, before the record
   says committed): run again, it completes the rotation, and every
   checkpoint opens with its state. Every failpoint on the file store, two on
   Redis and etcd.

In the slow tier (``make test-all``). The backend half, each store's re-seal
and cluster-record rewrites, is proved on every backend by the contract suite
(tests/stores/contract/test_cluster_rewrites.py); the keyrings and the key list
by tests/node/test_secret_rotation.py, in the fast tier.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from hamsterbunker.core.errors import HamsterbunkerError
from hamsterbunker.core.timing import LeaseTiming
from hamsterbunker.ops.local import LocalCluster, NodeSpec
from hamsterbunker.records import LeaseRecord
from hamsterbunker.rotation import Rotation
from hamsterbunker.sealing import Sealer, new_cluster_record, read_header
from hamsterbunker.sealing.keyring import Keyring
from hamsterbunker.stores import Fence, Store, open_store
from tests.support import wait_until
from tests.support.cli import hb_env, run_hb
from tests.support.etcd_server import etcd_url
from tests.support.redis_server import redis_url

pytestmark = [pytest.mark.fault, pytest.mark.multiprocess]

AGENT = "journal"  # JournalCounter's id
OLD, NEW = "the-old-secret-of-this-cluster", "the-new-secret-of-this-cluster"
SPECS = [NodeSpec("node-a", "eu-central"), NodeSpec("node-b", "us-east"),
         NodeSpec("node-c", "ap-south")]  # fmt: skip
MakeCluster = Callable[..., LocalCluster]


def store_url(backend: str, tmp_path: Path) -> str:
    if backend == "file":
        return (tmp_path / "store").as_uri()
    return redis_url() if backend == "redis" else etcd_url()


def latest(store: Store) -> tuple[int, int]:
    """(seq, epoch) of the newest retained checkpoint; (0, 0) if none."""
    found = store.list_checkpoints(AGENT)
    return (found[0].seq, found[0].epoch) if found else (0, 0)


@dataclass
class Watcher:
    """Reads every retained checkpoint's key id, over and over, in a thread of its own."""

    store: Store
    seen: list[tuple[float, int, str]] = field(default_factory=list)  # (when, seq, key id)
    newest: list[tuple[float, int]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        while not self._stop.is_set():
            try:
                infos = self.store.list_checkpoints(AGENT)
                now = time.monotonic()
                if infos:
                    self.newest.append((now, infos[0].seq))
                for info in infos:
                    blob = self.store.read_checkpoint(AGENT, info)
                    self.seen.append((time.monotonic(), info.seq, read_header(blob).key_id))
            except HamsterbunkerError:
                pass  # a checkpoint pruned between list and read: look again
            self._stop.wait(0.03)

    def stop(self) -> None:
        self._stop.set()


@contextlib.contextmanager
def watching(store: Store) -> Iterator[Watcher]:
    """A Watcher reading store in a thread while the block runs."""
    watcher = Watcher(store)
    thread = threading.Thread(target=watcher.run, daemon=True)
    thread.start()
    try:
        yield watcher
    finally:
        watcher.stop()
        thread.join(10)


class Chaos:
    """Kills (SIGKILL) or stops (SIGTERM) the leader every so often, and starts it again."""

    def __init__(self, cluster: LocalCluster, store: Store) -> None:
        self.cluster, self.store = cluster, store
        self.done = threading.Event()
        self.kills = self.terms = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        specs = {spec.node: spec for spec in SPECS}
        try:
            while not self.done.wait(1.2):
                lease = self.store.read_lease(AGENT)
                if lease is None or lease.holder is None or lease.holder not in specs:
                    continue
                victim = lease.holder
                if (self.kills + self.terms) % 2 == 0:
                    self.cluster.kill(victim)
                    self.kills += 1
                else:
                    self.cluster.signal(victim, signal.SIGTERM)
                    self.cluster.processes[victim].wait(timeout=30)
                    self.terms += 1
                self.cluster.start(specs[victim])  # with the secrets the cluster has now
        except BaseException as exc:  # reported by the test
            self.error = exc


def hb_rotate(
    step: str, url: str, *, failpoints: str = "", timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    env = hb_env(HB_SECRET=NEW, HB_SECRET_PREVIOUS=OLD, HB_STORE=url)
    if failpoints:
        env["HB_FAILPOINTS"] = failpoints
    return run_hb(
        ["rotate-secret", step, "--agent-id", AGENT, "--timeout", "60"], env=env, timeout=timeout
    )


# -- 1. a rotation under fire --------------------------------------------------------


@pytest.mark.parametrize("backend", ["file", "redis", "etcd"])
def test_a_rotation_while_the_leader_is_killed_and_stopped_loses_nothing(
    backend: str, local_cluster: MakeCluster, tmp_path: Path
) -> None:
    """Rolling restart, begin, commit, finish under repeated SIGKILL/SIGTERM of the leader:
    no step or checkpoint lost, the new key from begin on, the old one gone after commit."""
    url = store_url(backend, tmp_path)
    cluster = local_cluster(
        store_url=url, timing=LeaseTiming(100, 800), env={"HB_TEST_STEP_S": "0.1"}
    )
    cluster.secret = OLD
    for spec in SPECS:
        cluster.start(spec)
    store = open_store(url)
    wait_until(lambda: latest(store)[0] >= 3, "the agent to publish", timeout=60)
    old_id = Sealer(OLD, store.read_cluster()).key_id  # type: ignore[arg-type]
    new_id = Sealer(Keyring((NEW, OLD)), store.read_cluster()).held_key_ids()[0]  # type: ignore[arg-type]

    with watching(store) as watcher:
        # A rolling restart, each node given the new secret first: SIGTERM, start again.
        cluster.secret, cluster.env["HB_SECRET_PREVIOUS"] = NEW, OLD
        for spec in SPECS:
            cluster.signal(spec.node, signal.SIGTERM)
            cluster.processes[spec.node].wait(timeout=30)
            cluster.start(spec)
            wait_until(
                partial(beats_with, store, spec.node, new_id), f"{spec.node} with the new key"
            )
        chaos = Chaos(cluster, store)
        firing = threading.Thread(target=chaos.run, daemon=True)
        firing.start()
        try:
            begun = hb_rotate("begin", url)
            assert begun.returncode == 0, begun.stdout + begun.stderr
            begun_at = time.monotonic()
            wait_until(lambda: latest(store)[0] > 0, "a checkpoint")
            committed = hb_rotate("commit", url)
            assert committed.returncode == 0, committed.stdout + committed.stderr
            committed_at = time.monotonic()
            seq_at_commit = latest(store)[0]
            wait_until(lambda: latest(store)[0] >= seq_at_commit + 5, "steps after commit", 60)
            finished = hb_rotate("finish", url)
            assert finished.returncode == 0, finished.stdout + finished.stderr
            final_goal = latest(store)[0] + 5
            wait_until(lambda: latest(store)[0] >= final_goal, "steps after finish", 60)
        finally:
            chaos.done.set()
            firing.join(60)
        assert chaos.error is None, chaos.error
        assert chaos.kills >= 2 and chaos.terms >= 2, (chaos.kills, chaos.terms)
        final = latest(store)[0]
    # No node refused or died on its own: each could open what the others sealed, whichever
    # record it had read (a standby meets the new key before it reads begin's record).
    assert all(cluster.alive(spec.node) for spec in SPECS)
    for spec in SPECS:
        for refusal in ("checkpoint.rejected", "store.regressed", "node.refused"):
            assert refusal not in cluster.log(spec.node), (spec.node, refusal)
    cluster.stop_all()
    print(
        f"rotation on {backend}: {chaos.kills} SIGKILLs, {chaos.terms} SIGTERMs of the leader; "
        f"{final} steps; {len(watcher.seen)} checkpoint reads"
    )

    # Every checkpoint seen after begin returned is under the new key; none under the
    # old one once commit returned (sampled every 30 ms: steps take 100 ms).
    after_begin = {(seq, kid) for when, seq, kid in watcher.seen if when > begun_at}
    published_after = {
        (seq, kid) for seq, kid in after_begin if seq > max_seq_before(watcher, begun_at)
    }
    assert published_after and {kid for _seq, kid in published_after} == {new_id}
    assert not [s for when, s, kid in watcher.seen if when > committed_at and kid == old_id]
    # The newest checkpoint never went back: nothing accepted was lost.
    seqs = [seq for _when, seq in watcher.newest]
    assert all(b >= a for a, b in itertools.pairwise(seqs)), "the newest went back"
    # Every step from 1 to the last is in the journal (each run of seq n counts to n).
    journal = read_journal(cluster)
    assert all(line["count"] == line["seq"] for line in journal)
    assert set(range(1, final + 1)) <= {line["seq"] for line in journal}
    # Every retained checkpoint opens with the new secret alone.
    sealer = Sealer(NEW, store.read_cluster())  # type: ignore[arg-type]
    for info in store.list_checkpoints(AGENT):
        state = sealer.open(store.read_checkpoint(AGENT, info), AGENT, info.epoch, info.seq)
        assert state["count"] == info.seq

    # A node with only the old secret is refused at start, the rotation named.
    refused = run_hb(
        ["run", "--agent", "hb_test_agents:JournalCounter", "--node-id", "late",
         "--region", "eu"],
        env=hb_env(HB_SECRET=OLD, HB_STORE=url, PYTHONPATH=cluster.env["PYTHONPATH"]),
    )  # fmt: skip
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert f"key id {old_id}, the secret given here, was retired" in refused.stderr
    assert "Traceback" not in refused.stderr
    store.close()


def beats_with(store: Store, node: str, key_id: str) -> bool:
    return any(hb.node == node and key_id in hb.keys for hb in store.list_heartbeats(AGENT))


def max_seq_before(watcher: Watcher, moment: float) -> int:
    return max((seq for when, seq in watcher.newest if when <= moment), default=0)


def read_journal(cluster: LocalCluster) -> list[dict[str, Any]]:
    path = Path(cluster.env["HB_TEST_JOURNAL"])
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


# -- 2. commit crashed at every point ------------------------------------------------


def seeded_store(url: str, checkpoints: int) -> Store:
    """A store sealed under OLD with checkpoints 1..n of epoch 1, and a rotation begun."""
    store = open_store(url)
    record = store.create_cluster(new_cluster_record(OLD))
    sealer = Sealer(OLD, record)
    store.cas_lease(AGENT, None, LeaseRecord("n1", "eu", "s1", epoch=1, ttl_ms=2000))
    fence = Fence("n1", "s1", 1)
    for seq in range(1, checkpoints + 1):
        store.put_checkpoint(AGENT, fence, seq, sealer.seal(AGENT, 1, seq, {"count": seq}))
    Rotation(store, AGENT, Keyring((NEW, OLD)), say=lambda _line: None).begin(timeout_s=5)
    return store


FAILPOINTS = [f"reseal.before_commit=kill@{n}" for n in (1, 2, 3, 5)] + [
    "rotation.before_record=kill",
    "rotation.after_record=kill",
]
# Inside a re-seal's commit to the file backend (one key: no redo log): its new bytes
# durable under a temporary name; renamed onto the record.
FILE_ONLY = ["reseal.file_backend.commit.after_temp_fsync=kill@2",
             "reseal.file_backend.commit.after_op=kill@1",
             "reseal.file_backend.commit.after_op=kill@4"]  # fmt: skip


# Every failpoint on the file store; on Redis and etcd one re-seal and the record,
# since the contract suite proves their rewrites (tests/stores/contract/test_cluster_rewrites.py).
ON_NETWORK_STORES = ["reseal.before_commit=kill@2", "rotation.before_record=kill"]


@pytest.mark.parametrize(
    ("backend", "failpoint"),
    [("file", f) for f in FAILPOINTS + FILE_ONLY]
    + [(b, f) for b in ("redis", "etcd") for f in ON_NETWORK_STORES],
)
def test_a_commit_killed_at_any_point_completes_when_run_again(
    backend: str, failpoint: str, tmp_path: Path
) -> None:
    """Killed (SIGKILL) at the failpoint, commit left part of its work; run again, it
    re-seals the rest and records the rotation committed, every state intact."""
    url = store_url(backend, tmp_path)
    store = seeded_store(url, checkpoints=5)
    try:
        crashed = hb_rotate("commit", url, failpoints=failpoint)
        assert crashed.returncode == -9, crashed.stdout + crashed.stderr  # killed, not done
        again = hb_rotate("commit", url)
        assert again.returncode == 0, again.stdout + again.stderr
        record = store.read_cluster()
        assert record is not None and record.rotation == "committed"
        sealer = Sealer(Keyring((NEW, OLD)), record)
        infos = store.list_checkpoints(AGENT)
        assert [info.seq for info in infos] == [5, 4, 3, 2, 1]
        for info in infos:
            blob = store.read_checkpoint(AGENT, info)
            assert read_header(blob).key_id == record.key_id
            assert sealer.open(blob, AGENT, 1, info.seq) == {"count": info.seq}
        finished = hb_rotate("finish", url)
        assert finished.returncode == 0, finished.stdout + finished.stderr
    finally:
        store.close()
