"""Storage faults: crashes mid-publish, a full disk, fuzzed damage, a node with the wrong secret.

1. Crash mid-publish. A node kills itself (``HB_FAILPOINTS``) at each point
   of its third checkpoint's commit to the file backend (``checkpoint.``
   scoped points, docs/failpoints.md): before it, after a value's temp write
   and fsync, before the lock, with the redo log durable, after one of its
   writes, before the log's removal. From outside, every file under a final
   checkpoint name opens whole and authenticated; a leftover temporary file is
   never taken for a checkpoint. The lease record names no checkpoint (names
   carry seq and epoch, restore takes the newest that authenticates), so "the
   lease never points at a missing checkpoint" means: restore never fails,
   whatever the crash point. A reader racing a fast publisher never sees a
   torn checkpoint.
2. Disk full (a small tmpfs, filled up). Publishing fails with a clear
   ENOSPC event, the previous checkpoint stays intact, the seq stays put, the
   node survives a full disk lasting longer than its lease and publishes again
   once space returns.
3. Fuzzed damage (hypothesis). Damaged checkpoints are skipped (and left as
   they are: nothing that was stored is ever written over); a damaged lease
   record is reported and left alone by nodes that keep running without
   spinning; a damaged cluster record stops a starting node before it writes.
4. A node with the wrong secret joining a running cluster refuses at start.

Every wait is bounded; nothing sleeps for a fixed time to synchronise.

In the slow tier (``make test-all``), on the file store, whose disk these faults
are; what a damaged record does on every backend is proved by
tests/node/test_hostile_store.py and the fuzz modules, in the fast tier.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

from hamsterbunker import Event, FileStore, current_step
from hamsterbunker.core.errors import (
    CorruptRecord,
    SealError,
    StoreError,
    StoreRegressed,
    Tampered,
)
from hamsterbunker.core.history import read_history
from hamsterbunker.core.timing import LeaseTiming
from hamsterbunker.ops.checker import check
from hamsterbunker.ops.local import LocalCluster, NodeSpec
from hamsterbunker.records import ClusterRecord, LeaseRecord
from hamsterbunker.runtime import Runtime
from hamsterbunker.sealing import Sealer
from hamsterbunker.stores.interface import Store
from hamsterbunker.stores.layer.keys import CLUSTER, AgentKeys
from tests.support import SUPPORT_DIR, holding_store_lock, store_of, wait_until
from tests.support.raw_store import file_key

pytestmark = pytest.mark.fault

SECRET = "storage-faults-secret"
A, B = NodeSpec("node-a", "eu-central"), NodeSpec("node-b", "us-east")
JOURNAL = "journal"  # JournalCounter.id (tests/support/hb_test_agents.py)
CHECKPOINT_NAME = re.compile(r"(\d{20})-(\d{10})-\d{10}-\d{13}")  # a checkpoint, under ckpt/
TMP_PREFIX = "tmp-hb-"
FUZZ = settings(deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
MakeCluster = Callable[..., LocalCluster]


# -- helpers ---------------------------------------------------------------------


class Recorder:
    """A thread-safe on_event handler."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._events: list[Event] = []

    def __call__(self, event: Event) -> None:
        with self._lock:
            self._events.append(event)

    def of(
        self,
        kind: str | None = None,
        node: str | None = None,
        where: Callable[[Event], bool] = bool,
    ) -> list[Event]:
        with self._lock:
            events = list(self._events)
        return [
            e
            for e in events
            if (kind is None or e.type == kind) and (node is None or e.node == node) and where(e)
        ]

    def wait(
        self,
        kind: str,
        node: str | None = None,
        where: Callable[[Event], bool] = bool,
        timeout: float = 30.0,
    ) -> Event:
        """The first such event, waiting for it at most timeout seconds."""
        deadline = time.monotonic() + timeout
        while not (found := self.of(kind, node, where)):
            if time.monotonic() > deadline:
                pytest.fail(
                    f"timed out after {timeout} s waiting for event {kind} from "
                    f"{node or 'any node'}; seen: {self.summary()}"
                )
            time.sleep(0.01)
        return found[0]

    def summary(self) -> str:
        return ", ".join(f"{e.node}:{e.type}" for e in self.of())


class Counter:
    """Counts its steps; its state carries a pad of pad_bytes; steps from park_from on wait."""

    def __init__(
        self, agent_id: str, *, pad_bytes: int = 0, step_s: float = 0.01, park_from: int = 0
    ) -> None:
        self.id = agent_id
        self.pad_bytes = pad_bytes
        self.step_s = step_s
        self.park_from = park_from  # 0: never park; may be changed while the node runs
        self.init_calls = 0
        self.started: list[tuple[int, int]] = []  # (seq, count it started from) of every step

    def init(self) -> dict[str, Any]:
        self.init_calls += 1
        return {"count": 0, "pad": "p" * self.pad_bytes}

    async def step(self, state: dict[str, Any]) -> dict[str, Any]:
        context = current_step()
        assert context is not None
        self.started.append((context.seq, state["count"]))
        await asyncio.sleep(self.step_s)
        while self.park_from and context.seq >= self.park_from:
            await asyncio.sleep(0.01)  # cancelled when the node stops
        return {**state, "count": state["count"] + 1}

    def started_seqs(self) -> list[int]:
        return [seq for seq, _ in list(self.started)]


class CountingStore:
    """Delegates to a FileStore and counts read_lease calls (a spinning node would make many)."""

    def __init__(self, inner: FileStore) -> None:
        self._inner = inner
        self.lease_reads = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def read_lease(self, agent: str) -> LeaseRecord | None:
        self.lease_reads += 1
        return self._inner.read_lease(agent)


def make_node(
    node_id: str, store: Store | CountingStore, agent: Counter, events: Recorder, **kwargs: Any
) -> Runtime:
    kwargs.setdefault("timing", LeaseTiming(tick_ms=100, lease_ttl_ms=600))
    return Runtime(
        node_id=node_id,
        region="r1",
        store=store,
        agent=agent,
        secret=SECRET,
        on_event=events,
        **{"stop_grace_ms": 0, **kwargs},  # parked steps: no grace to wait out
    )


@contextlib.contextmanager
def running(*nodes: Runtime) -> Iterator[None]:
    """Start nodes; whatever happens, stop every one of them on the way out."""
    try:
        for node in nodes:
            node.start()
        yield
    finally:
        for node in nodes:
            with contextlib.suppress(BaseException):  # a test checks the errors it expects
                node.stop(timeout=20)


def checkpoint_dir(store_dir: Path, agent: str) -> Path:
    """The folder of the agent's checkpoints (``stores.layer.keys``)."""
    return file_key(store_dir, AgentKeys(agent).ckpt)


def final_files(directory: Path) -> dict[tuple[int, int], Path]:
    """Every file under a final checkpoint name, by (seq, epoch)."""
    found = {}
    for path in directory.iterdir() if directory.exists() else ():
        match = CHECKPOINT_NAME.fullmatch(path.name)
        if match:
            found[(int(match[1]), int(match[2]))] = path
    return dict(sorted(found.items()))


def open_all(directory: Path, sealer: Sealer, agent: str) -> dict[tuple[int, int], dict[str, Any]]:
    """Open every file under a final checkpoint name: one that does not authenticate raises."""
    return {
        (seq, epoch): sealer.open(path.read_bytes(), agent, epoch, seq)
        for (seq, epoch), path in final_files(directory).items()
    }


def file_bytes(directory: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in final_files(directory).values()}


def newest_seq(store: Store | FileStore, agent: str) -> int:
    infos = store.list_checkpoints(agent)
    return infos[0].seq if infos else 0


def stored_events(store: FileStore, agent: str, kind: str, node: str | None = None) -> list[Event]:
    return [
        e for e in store.read_events(agent) if e.type == kind and (node is None or e.node == node)
    ]


def snapshot(root: Path) -> dict[str, tuple[bytes | None, int]]:
    """Every file and directory under root: (bytes, or None for a directory; mtime in ns)."""
    found: dict[str, tuple[bytes | None, int]] = {".": (None, root.stat().st_mtime_ns)}
    for path in sorted(root.rglob("*")):
        found[str(path.relative_to(root))] = (
            None if path.is_dir() else path.read_bytes(),
            path.stat().st_mtime_ns,
        )
    return found


def assert_history_clean(path: Path) -> None:
    assert path.exists(), "the node recorded no history"
    assert check(read_history(path)) == []


# Damage: ("flip", ((offset, xor mask), ...)) with distinct offsets and non-zero masks, so the
# bytes always change; or ("truncate", length) with length below the original's.
Damage = tuple[str, Any]


def damage_of(size: int) -> st.SearchStrategy[Damage]:
    # Single-bit flips often leave a record valid JSON (a changed value), any mask rarely does.
    masks = st.one_of(st.sampled_from([1 << bit for bit in range(8)]), st.integers(1, 255))
    flips = st.dictionaries(st.integers(0, size - 1), masks, min_size=1, max_size=8).map(
        lambda d: ("flip", tuple(sorted(d.items())))
    )
    cuts = st.integers(0, size - 1).map(lambda n: ("truncate", n))
    return st.one_of(flips, cuts)


def damaged(data: bytes, damage: Damage) -> bytes:
    kind, how = damage
    if kind == "truncate":
        return data[:how]
    out = bytearray(data)
    for offset, mask in how:
        out[offset] ^= mask
    return bytes(out)


def publish_and_stop(store_dir: Path, agent_id: str, count: int) -> None:
    """Run one node until it has published checkpoints 1..count, then stop it (lease released)."""
    agent = Counter(agent_id, park_from=count + 1)
    node = make_node("node-a", FileStore(store_dir), agent, Recorder())
    with running(node):
        wait_until(
            lambda: (
                newest_seq(FileStore(store_dir), agent_id) == count
                and count + 1 in agent.started_seqs()
            ),
            f"checkpoints 1-{count} of {agent_id}",
        )
        node.stop()


# -- 1. crash mid-publish ------------------------------------------------------------

KILL_AT = 3  # the third publish
# point -> (its hit in the third publish, whether the checkpoint counts once the next
# writer finished what the crash left, whether a temp file holds its sealed bytes). A
# checkpoint's commit with nothing consumed puts one value: one temp file, one rename,
# no redo log (the log's points are killed at in tests/stores/backend/test_file_backend.py
# and, with a consuming checkpoint, in tests/faults/test_inbox_faults.py).
CRASH_POINTS = {
    "checkpoint.before_commit": (KILL_AT, False, False),
    "checkpoint.file_backend.commit.after_temp_write": (KILL_AT, False, True),
    "checkpoint.file_backend.commit.after_temp_fsync": (KILL_AT, False, True),
    "checkpoint.file_backend.commit.before_lock": (KILL_AT, False, True),
    "checkpoint.file_backend.commit.after_op": (KILL_AT, True, False),
}


@pytest.mark.multiprocess
@pytest.mark.parametrize("point", list(CRASH_POINTS))
def test_crash_mid_publish_leaves_whole_checkpoints_and_the_next_leader_resumes(
    local_cluster: MakeCluster, point: str
) -> None:
    """A node killed at each step of a checkpoint write leaves only whole authenticated checkpoints
    under final names, and the next leader resumes from the newest of them.
    """
    nth, renamed, in_temp = CRASH_POINTS[point]
    cluster = local_cluster(timing=LeaseTiming(200, 1000))
    victim = cluster.start(A, extra_env={"HB_FAILPOINTS": f"{point}=kill@{nth}"})
    wait_until(lambda: victim.poll() is not None, f"node-a to kill itself at {point}", timeout=60)
    assert victim.returncode == -signal.SIGKILL, cluster.log(A.node)

    store = store_of(cluster)  # a writer's open: it finishes a redo log the crash left
    directory = checkpoint_dir(store.root, JOURNAL)
    cluster_record = store.read_cluster()
    assert cluster_record is not None
    sealer = Sealer(cluster.secret, cluster_record)
    newest = KILL_AT if renamed else KILL_AT - 1

    states = open_all(directory, sealer, JOURNAL)  # no torn or unauthenticated file
    assert list(states) == [(seq, 1) for seq in range(1, newest + 1)]
    assert all(state["count"] == seq for (seq, _), state in states.items())
    names = sorted(path.name for path in directory.iterdir())
    assert len(names) == len(states), names  # nothing else lies there

    def holds_checkpoint_3(temp: Path) -> bool:
        try:
            return sealer.open(temp.read_bytes(), JOURNAL, 1, KILL_AT)["count"] == KILL_AT
        except (SealError, CorruptRecord):
            return False  # another value (a description, a heartbeat being written)

    # Temporary files are in the root, under a name no reader takes for a key; the whole
    # of checkpoint 3 is in one where the crash came before its commit took the lock.
    temps = sorted(store.root.glob(f"{TMP_PREFIX}*"))
    assert any(holds_checkpoint_3(temp) for temp in temps) == in_temp, temps
    # The lease names a holder and an epoch, no checkpoint: restore takes the newest listed
    # checkpoint that authenticates, and that one is whole whatever the crash point.
    lease = store.read_lease(JOURNAL)
    assert lease is not None and (lease.holder, lease.epoch) == (A.node, 1)
    assert [(i.seq, i.epoch) for i in store.list_checkpoints(JOURNAL)] == [
        (seq, 1) for seq in range(newest, 0, -1)
    ]

    successor = cluster.start(B)
    [resumed] = wait_until(
        lambda: stored_events(store, JOURNAL, "agent.resumed", B.node),
        "node-b to resume",
        timeout=60,
    )
    assert (resumed.epoch, resumed.detail["from_seq"], resumed.detail["skipped"]) == (2, newest, 0)
    wait_until(lambda: newest_seq(store, JOURNAL) >= newest + 2, "node-b to publish two steps")
    cluster.signal(B.node, signal.SIGTERM)  # stopped, so nothing is pruned while we read
    assert successor.wait(timeout=30) == 0, cluster.log(B.node)

    assert stored_events(store, JOURNAL, "checkpoint.rejected") == []
    states = open_all(directory, sealer, JOURNAL)
    assert all(state["count"] == seq for (seq, _), state in states.items())
    assert all(epoch == (1 if seq <= newest else 2) for seq, epoch in states)
    journal = [
        json.loads(line) for line in Path(cluster.env["HB_TEST_JOURNAL"]).read_text().splitlines()
    ]
    seqs = [line["seq"] for line in journal]
    repeated = {seq for seq in seqs if seqs.count(seq) > 1}
    # Only the step whose checkpoint never got its name ran again.
    assert repeated == (set() if renamed else {KILL_AT})


@pytest.mark.multiprocess
def test_a_concurrent_reader_never_sees_a_torn_or_unauthenticated_checkpoint(
    local_cluster: MakeCluster,
) -> None:
    """Readers that list and open the newest checkpoint while a node publishes as fast as it can
    always get a whole authenticated one (or find it pruned), and always a whole lease record.
    """
    cluster = local_cluster(timing=LeaseTiming(200, 1000), env={"HB_TEST_STEP_S": "0.001"})
    cluster.start(A)
    store = store_of(cluster)
    wait_until(lambda: newest_seq(store, JOURNAL) >= 1, "node-a to publish")
    cluster_record = store.read_cluster()
    assert cluster_record is not None
    sealer = Sealer(cluster.secret, cluster_record)
    lock = threading.Lock()
    failures: list[str] = []
    seen: set[int] = set()
    tally = {"opened": 0, "pruned": 0}

    def read_loop() -> None:
        reader = FileStore(store.root)
        deadline = time.monotonic() + 3.0
        for _ in range(100_000):
            with lock:
                enough = tally["opened"] >= 500 and len(seen) >= 20
            if enough or time.monotonic() > deadline:
                return
            try:
                reader.read_lease(JOURNAL)
            except CorruptRecord as exc:
                with lock:
                    failures.append(f"lease: {exc}")
                continue
            info = reader.list_checkpoints(JOURNAL)[0]
            try:
                blob = reader.read_checkpoint(JOURNAL, info)
            except StoreError:
                with lock:
                    tally["pruned"] += 1  # removed by retention between list and read: fine
                continue
            try:
                state = sealer.open(blob, JOURNAL, info.epoch, info.seq)
            except Tampered as exc:
                with lock:
                    failures.append(f"checkpoint {info.seq}: {exc} ({len(blob)} bytes)")
                continue
            with lock:
                if state["count"] != info.seq:
                    failures.append(f"checkpoint {info.seq} holds count {state['count']}")
                seen.add(info.seq)
                tally["opened"] += 1

    readers = [threading.Thread(target=read_loop, name=f"reader-{i}") for i in range(2)]
    for thread in readers:
        thread.start()
    for thread in readers:
        thread.join(timeout=60)
    assert not any(thread.is_alive() for thread in readers)
    assert failures == []
    # The reads really raced the publisher: many different checkpoints were read.
    assert len(seen) >= 5, (sorted(seen), tally)
    assert tally["opened"] >= 50, tally


# -- 2. disk full ------------------------------------------------------------------------


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 2 MiB tmpfs mounted for this test (needs root), unmounted afterwards."""
    mount_point = tmp_path / "tmpfs"
    mount_point.mkdir()
    try:
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=2m,mode=0700", "tmpfs", str(mount_point)],
            check=True,
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        detail = getattr(exc, "stderr", None) or exc
        reason = f"cannot mount a small tmpfs to fill up (needs root): {str(detail).strip()}"
        if os.environ.get("CI") == "true":
            pytest.fail(reason)  # CI runs as root: there it must work
        pytest.skip(reason)
    try:
        yield mount_point
    finally:
        if subprocess.run(["umount", str(mount_point)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(mount_point)], capture_output=True)


def fill(path: Path) -> int:
    """Append zeros to path until its filesystem is full; return how many bytes went in."""
    chunk = bytes(64 * 1024)
    written = 0
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        for _ in range(100_000):  # the filesystem is a few MiB: far fewer are ever needed
            try:
                written += os.write(fd, chunk)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                return written
    finally:
        os.close(fd)
    pytest.fail(f"{path} took {written} bytes without filling its filesystem")


def no_space(event: Event) -> bool:
    return "No space left" in str(event.detail.get("error", ""))


def test_disk_full_keeps_the_last_checkpoint_and_the_node_recovers(
    small_tmpfs: Path, tmp_path: Path
) -> None:
    """With the store's filesystem full, publishing fails with an ENOSPC event, the last checkpoint
    stays intact and the seq stays put; the node survives and publishes again once space returns.
    """
    store_dir = small_tmpfs / "store"
    filler = small_tmpfs / "filler"
    history = tmp_path / "history.jsonl"  # outside the full filesystem
    events = Recorder()
    store = FileStore(store_dir)
    agent = Counter("full", pad_bytes=64 * 1024, step_s=0.02)  # about 17 tmpfs pages a checkpoint
    ttl_s = 1.0
    node = make_node(
        "node-a",
        FileStore(store_dir),
        agent,
        events,
        timing=LeaseTiming(tick_ms=100, lease_ttl_ms=1000),
        history=history,
    )
    directory = checkpoint_dir(store_dir, "full")
    with running(node):
        wait_until(lambda: newest_seq(store, "full") >= 3, "three checkpoints")

        def filled_until_a_publish_fails() -> list[Event]:
            # Topped up on every look: a write in flight when the disk filled may free
            # space (a pruned checkpoint) that the next publish would otherwise take.
            fill(filler)
            return events.of("checkpoint.failed", where=no_space)

        first = wait_until(filled_until_a_publish_fails, "a publish to fail with ENOSPC")[0]
        fill(filler)  # no publish can free space any more: take the last free pages too
        held = newest_seq(store, "full")
        assert first.detail["step_seq"] == held + 1, first
        assert node.seq == held
        frozen = file_bytes(directory)
        agent.park_from = held + 3  # after recovery: publish two steps, then wait

        # Full for longer than the lease can be kept without a write: heartbeats, events and
        # renewals fail too. Watched throughout: the node lives on, the seq stays put.
        full_since = time.monotonic()
        while time.monotonic() - full_since < 1.5 * ttl_s:
            assert not node.stopped.is_set(), "the full disk ended the node"
            assert newest_seq(store, "full") == held
            time.sleep(0.02)
        failed = events.of("checkpoint.failed")
        assert all(no_space(e) for e in failed), failed
        assert {e.detail["step_seq"] for e in failed} == {held + 1}  # retried, never advanced
        # every retry started again from the last published state
        assert {count for seq, count in agent.started if seq == held + 1} == {held}
        assert not events.of("checkpoint.published", where=lambda e: e.seq > held)
        reported = {e.type for e in events.of(where=no_space)}
        assert reported & {"lease.renew_failed", "lease.lost", "store.error"}, reported
        assert file_bytes(directory) == frozen  # intact, and nothing partial under a final name

        filler.unlink()
        wait_until(
            lambda: newest_seq(store, "full") == held + 2 and held + 3 in agent.started_seqs(),
            "node-a to publish again",
        )
        node.stop()

    for resumed in events.of("agent.resumed", where=lambda e: e.n > first.n):
        assert resumed.detail["from_seq"] == held  # if it lost the lease meanwhile
    cluster_record = store.read_cluster()
    assert cluster_record is not None
    states = open_all(directory, Sealer(SECRET, cluster_record), "full")
    assert max(states)[0] == held + 2
    for (seq, _), state in states.items():  # no lost state: one count per seq
        assert (state["count"], len(state["pad"])) == (seq, 64 * 1024)
    for name, data in frozen.items():
        path = directory / name
        assert not path.exists() or path.read_bytes() == data
    assert_history_clean(history)


def test_a_leader_that_cannot_renew_on_a_full_disk_reports_it_and_loses_the_lease(
    small_tmpfs: Path,
) -> None:
    """A leader whose renewals fail with ENOSPC reports lease.renew_failed and, a TTL without a
    renewal later, lease.lost and standby, as for any other failure of the store.
    """
    store_dir = small_tmpfs / "store"
    filler = small_tmpfs / "filler"
    events = Recorder()
    store = FileStore(store_dir)
    node = make_node("node-a", FileStore(store_dir), Counter("full", step_s=0.02), events)
    with running(node):
        wait_until(lambda: newest_seq(store, "full") >= 2, "two checkpoints")

        deadline = time.monotonic() + 6.0  # ten TTLs
        while not events.of("lease.lost", "node-a"):
            assert time.monotonic() < deadline, f"no lease.lost; seen: {events.summary()}"
            fill(filler)  # kept full: see the disk-full test
            time.sleep(0.01)
        renew_failed = events.of("lease.renew_failed", "node-a")
        assert renew_failed and no_space(renew_failed[0]), events.summary()
        assert node.role == "standby"
        filler.unlink()


# -- 3a. damaged checkpoints ------------------------------------------------------------------


def test_damaged_checkpoint_files_are_rejected_as_tampered(tmp_path: Path) -> None:
    """A stored checkpoint with flipped bits or cut short still lists, but opening it raises
    Tampered with a message saying what is wrong with the checkpoint.
    """
    store_dir = tmp_path / "store"
    publish_and_stop(store_dir, "fz", 1)
    store = FileStore(store_dir)
    cluster_record = store.read_cluster()
    assert cluster_record is not None
    sealer = Sealer(SECRET, cluster_record)
    [info] = store.list_checkpoints("fz")
    path = final_files(checkpoint_dir(store_dir, "fz"))[(1, 1)]
    original = path.read_bytes()

    @settings(FUZZ, max_examples=200)
    @given(damage=damage_of(len(original)))
    def check_damage(damage: Damage) -> None:
        path.write_bytes(damaged(original, damage))
        assert [(i.seq, i.epoch) for i in store.list_checkpoints("fz")] == [(1, 1)]
        with pytest.raises(Tampered) as caught:
            sealer.open(store.read_checkpoint("fz", info), "fz", info.epoch, info.seq)
        assert "checkpoint" in str(caught.value)

    check_damage()


def test_a_new_leader_skips_damaged_checkpoints_and_writes_over_nothing(tmp_path: Path) -> None:
    """A new leader rejects every damaged checkpoint newer than the newest whole one. Since the
    lease record says checkpoint 3 was accepted, a damaged 3 is a loss: it refuses
    (StoreRegressed), never resuming behind it; with 3 whole it resumes from 3. Either way it
    leaves every stored file as it found it.
    """
    pristine = tmp_path / "pristine"
    publish_and_stop(pristine, "fz", 3)
    originals = {
        seq: path.read_bytes()
        for (seq, _), path in final_files(checkpoint_dir(pristine, "fz")).items()
    }
    examples = itertools.count()

    @settings(FUZZ, max_examples=20)
    @given(data=st.data())
    def check_restore(data: st.DataObject) -> None:
        hit = data.draw(st.sets(st.sampled_from([1, 2, 3]), min_size=1), label="damaged seqs")
        store_dir = tmp_path / f"example-{next(examples)}"
        shutil.copytree(pristine, store_dir)
        directory = checkpoint_dir(store_dir, "fz")
        for seq in sorted(hit):
            damage = data.draw(damage_of(len(originals[seq])), label=f"damage of {seq}")
            final_files(directory)[(seq, 1)].write_bytes(damaged(originals[seq], damage))
        before = file_bytes(directory)
        whole = [seq for seq in (3, 2, 1) if seq not in hit]
        events = Recorder()
        agent = Counter("fz", park_from=6)
        node = make_node("node-b", FileStore(store_dir), agent, events)
        refuses = 3 in hit
        with running(node):
            if not refuses:
                wait_until(lambda: 6 in agent.started_seqs(), "node-b to publish 4 and 5")
                node.stop()
            else:
                wait_until(node.stopped.is_set, "node-b to refuse")
                with pytest.raises(StoreRegressed):
                    node.stop()

        rejected = events.of("checkpoint.rejected")
        newer = [seq for seq in (3, 2, 1) if seq in hit and (not whole or seq > whole[0])]
        assert [e.detail["checkpoint_seq"] for e in rejected] == newer
        assert all("checkpoint" in e.detail["error"] for e in rejected), rejected
        after = file_bytes(directory)
        # Nothing stored was written over or removed: neither the whole checkpoints nor the
        # damaged ones (left for inspection; only retention may remove old ones).
        assert {name: after.get(name) for name in before} == before
        if refuses:
            assert after == before
            assert (agent.init_calls, agent.started) == (0, [])
            return
        [resumed] = events.of("agent.resumed")
        assert (resumed.detail["from_seq"], resumed.detail["skipped"]) == (whole[0], len(newer))
        assert agent.started[0] == (4, whole[0])  # built on the newest whole checkpoint
        store = FileStore(store_dir)
        cluster_record = store.read_cluster()
        assert cluster_record is not None
        sealer = Sealer(SECRET, cluster_record)
        new = {
            (seq, epoch): sealer.open(path.read_bytes(), "fz", epoch, seq)["count"]
            for (seq, epoch), path in final_files(directory).items()
            if path.name not in before
        }
        assert new == {
            (4, 2): whole[0] + 1,
            (5, 2): whole[0] + 2,
        }

    check_restore()


# -- 3b. damaged lease record -----------------------------------------------------------------


def test_damaged_lease_record_is_corrupt_or_still_well_formed(tmp_path: Path) -> None:
    """A lease record with flipped bits or cut short reads as CorruptRecord naming the lease
    record, or (the record is not sealed) as a record whose every field has its proper type.
    """
    store = FileStore(tmp_path / "store")
    original = store.cas_lease(
        "lz",
        None,
        LeaseRecord(holder="node-a", region="eu-central", session="0f1e2d3c", epoch=7, ttl_ms=2000),
    ).to_json()
    path = file_key(tmp_path / "store", AgentKeys("lz").lease)

    @settings(FUZZ, max_examples=300)
    @given(damage=damage_of(len(original)))
    def check_damage(damage: Damage) -> None:
        data = damaged(original, damage)
        path.write_bytes(data)
        try:
            parsed = LeaseRecord.from_json(data)
        except CorruptRecord as exc:
            assert "lease record" in str(exc)
            with pytest.raises(CorruptRecord):
                store.read_lease("lz")
            return
        note(f"parsed: {parsed}")
        assert store.read_lease("lz") == parsed
        assert parsed.holder is None or isinstance(parsed.holder, str)
        assert all(isinstance(v, str) for v in (parsed.region, parsed.session))
        for value in (parsed.epoch, parsed.ttl_ms, parsed.renewals, parsed.version):
            assert type(value) is int
        assert parsed.epoch >= 0 and parsed.ttl_ms > 0 and parsed.version >= 0

    check_damage()


def test_a_lease_record_without_its_holder_field_is_corrupt() -> None:
    """A lease record whose holder key was damaged (so the field is missing) is CorruptRecord,
    not a released lease.
    """
    record = LeaseRecord(holder="node-a", region="r1", session="0f1e2d3c", epoch=3, ttl_ms=2000)
    data = record.to_json().replace(b'"holder"', b'"holdes"')  # one bit flipped: r -> s
    with pytest.raises(CorruptRecord, match="holder"):
        LeaseRecord.from_json(data)


LEASE_DAMAGE: dict[str, Callable[[bytes], bytes]] = {
    "truncated": lambda data: data[: len(data) // 2],
    "not-utf8": lambda data: b"\xff" + data[1:],
    "mistyped-epoch": lambda data: json.dumps({**json.loads(data), "epoch": "one"}).encode(),
}


@pytest.mark.parametrize("how", list(LEASE_DAMAGE))
def test_damaged_lease_stops_the_leader_and_is_replaced_a_ttl_later(
    tmp_path: Path, how: str
) -> None:
    """A lease record damaged under a leader and a standby: the leader stops at its next
    renewal, both report a store.error naming the lease record without spinning; once the
    damage stood a TTL one of them replaces it (lease.replaced_unreadable) and leads on from
    the last checkpoint of the damaged term, the history clean.
    """
    # Why this is right: the lease is the fencing token. A record nobody can read cannot be
    # renewed, so its holder is as good as silent: it stops stepping, and after a TTL with no
    # change the record is replaced by compare-and-set against what was found, like an
    # expired one, its fence with it (DESIGN.md invariants 2, 10). The fence stored beside
    # the record is whole meanwhile: what the leader published until its renewal is its own.
    store_dir = tmp_path / "store"
    history = tmp_path / "history.jsonl"
    events = Recorder()
    stores = {name: CountingStore(FileStore(store_dir)) for name in ("node-a", "node-b")}
    agents = {name: Counter("lz", step_s=0.02) for name in stores}
    nodes = {
        name: make_node(name, stores[name], agents[name], events, history=history)
        for name in stores
    }
    store = FileStore(store_dir)
    lease_path = file_key(store_dir, AgentKeys("lz").lease)
    directory = checkpoint_dir(store_dir, "lz")
    with running(nodes["node-a"]):
        wait_until(lambda: newest_seq(store, "lz") >= 2, "node-a to publish")
        nodes["node-b"].start()
        events.wait("node.standby", "node-b")

        with holding_store_lock(store_dir):  # no renewal is half done while we damage
            marks = {name: len(events.of(node=name)) for name in nodes}  # event n counts from 1
            lease_path.write_bytes(LEASE_DAMAGE[how](lease_path.read_bytes()))
            held = newest_seq(store, "lz")
            reads = {name: stores[name].lease_reads for name in nodes}
            started = time.monotonic()

        def since_damage(kind: str, name: str, about: str = "") -> list[Event]:
            return [
                e
                for e in events.of(kind, name)
                if e.n > marks[name] and about in str(e.detail.get("error", ""))
            ]

        lost = events.wait("lease.lost", "node-a", where=lambda e: e.n > marks["node-a"])
        assert "lease record" in lost.detail["reason"], lost
        for name in nodes:
            wait_until(
                functools.partial(since_damage, "store.error", name, "lease record"),
                f"a store.error about the lease record from {name}",
            )
        replaced = events.wait("lease.replaced_unreadable", timeout=30)
        assert "lease record" in replaced.detail["found"], replaced
        ticks = (time.monotonic() - started) / 0.1
        for name, node in nodes.items():
            assert not node.stopped.is_set(), f"{name} ended on a damaged lease"
            spent = stores[name].lease_reads - reads[name]
            assert spent <= 5 * ticks + 10, f"{name} read the lease {spent} times in {ticks} ticks"
        resumed = events.wait("agent.resumed", replaced.node, where=lambda e: e.epoch >= 2)
        # From the newest the damaged term published (one sent as the loss was noticed may
        # have landed: the fence was whole until the record was replaced), and nothing of
        # that term landed after the takeover's restore.
        term = [e.seq for e in events.of("checkpoint.published") if e.epoch < 2]
        assert resumed.detail["from_seq"] == max(term) >= held
        wait_until(lambda: newest_seq(store, "lz") >= held + 2, "the agent to advance again")
        for node in nodes.values():
            node.stop()

    cluster_record = store.read_cluster()
    assert cluster_record is not None
    states = open_all(directory, Sealer(SECRET, cluster_record), "lz")
    assert all(state["count"] == seq for (seq, _), state in states.items())
    assert_history_clean(history)


# -- 3c. damaged cluster record ---------------------------------------------------------------


def test_damaged_cluster_record_stops_a_starting_node_before_it_writes(tmp_path: Path) -> None:
    """A cluster record with flipped bits or cut short is refused at start with CorruptRecord,
    SealError or WrongSecret and a readable message, the node writing nothing; damage the record
    survives (a changed display time, base64 padding bits) still derives the cluster's own key.
    """
    pristine = tmp_path / "pristine"
    publish_and_stop(pristine, "cz", 1)
    original = file_key(pristine, CLUSTER).read_bytes()
    record = ClusterRecord.from_json(original)
    blob = next(iter(final_files(checkpoint_dir(pristine, "cz")).values())).read_bytes()
    examples = itertools.count()

    @settings(FUZZ, max_examples=60)
    @given(damage=damage_of(len(original)))
    def check_damage(damage: Damage) -> None:
        data = damaged(original, damage)
        try:
            sealer = Sealer(SECRET, ClusterRecord.from_json(data))
        except (CorruptRecord, SealError) as exc:
            expected: type[Exception] = type(exc)
        else:
            # Accepted: then it must still be this cluster's key, opening its checkpoints.
            assert sealer.key_id == record.key_id
            assert sealer.open(blob, "cz", 1, 1)["count"] == 1
            return
        store_dir = tmp_path / f"example-{next(examples)}"
        shutil.copytree(pristine, store_dir)
        file_key(store_dir, CLUSTER).write_bytes(data)
        before = snapshot(store_dir)
        events = Recorder()
        agent = Counter("cz")
        node = make_node("node-x", FileStore(store_dir), agent, events)
        with running(node):
            wait_until(node.stopped.is_set, "node-x to refuse")
            with pytest.raises(expected) as caught:
                node.stop()
        message = str(caught.value)
        assert message and "\n" not in message and "cluster" in message, message
        assert snapshot(store_dir) == before
        assert events.of() == [] and agent.init_calls == 0

    check_damage()


def _edit_cluster(field: str, value: Any) -> Callable[[bytes], bytes]:
    return lambda data: json.dumps({**json.loads(data), field: value}).encode()


CLUSTER_DAMAGE: dict[str, Callable[[bytes], bytes]] = {
    "truncated": lambda data: data[: len(data) // 2],
    "other-salt": _edit_cluster("salt", "AAAAAAAAAAAAAAAAAAAAAA=="),
    "unknown-kdf": _edit_cluster("kdf", "argon2"),
    "no-key-check": lambda data: json.dumps(
        {k: v for k, v in json.loads(data).items() if k != "key_check"}
    ).encode(),
}


@pytest.mark.multiprocess
@pytest.mark.parametrize("how", list(CLUSTER_DAMAGE))
def test_hb_run_on_a_damaged_cluster_record_fails_with_one_line(tmp_path: Path, how: str) -> None:
    """`hb run` on a store whose cluster record is damaged exits non-zero with one stderr line
    naming the cluster record and no traceback, and writes nothing.
    """
    store_dir = tmp_path / "store"
    publish_and_stop(store_dir, JOURNAL, 1)
    cluster_path = file_key(store_dir, CLUSTER)
    cluster_path.write_bytes(CLUSTER_DAMAGE[how](cluster_path.read_bytes()))
    before = snapshot(store_dir)
    env = {**os.environ, "HB_SECRET": SECRET, "PYTHONPATH": str(SUPPORT_DIR)}
    env.pop("CREDENTIALS_DIRECTORY", None)
    env.pop("HB_FAILPOINTS", None)
    command = [
        sys.executable, "-m", "hamsterbunker", "run",
        "--store", store_dir.as_uri(),
        "--agent", "hb_test_agents:JournalCounter",
        "--node-id", "node-x",
        "--tick-ms", "100", "--lease-ttl-ms", "600",
    ]  # fmt: skip
    result = subprocess.run(
        command, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60
    )
    assert result.returncode > 0, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert "cluster" in lines[0], lines[0]
    assert snapshot(store_dir) == before


def test_cluster_record_with_a_damaged_key_id_is_refused_at_start(tmp_path: Path) -> None:
    """A cluster record whose key id was changed is refused at start (SealError or CorruptRecord)
    and the node writes nothing, as for any other damage to the record.
    """
    store_dir = tmp_path / "store"
    publish_and_stop(store_dir, "cz", 2)
    cluster_path = file_key(store_dir, CLUSTER)
    doc = json.loads(cluster_path.read_bytes())
    doc["key_id"] = ("0" if doc["key_id"][0] != "0" else "1") + doc["key_id"][1:]
    cluster_path.write_bytes(json.dumps(doc).encode())
    before = snapshot(store_dir)
    events = Recorder()
    node = make_node("node-x", FileStore(store_dir), Counter("cz"), events)
    with running(node):
        wait_until(node.stopped.is_set, "node-x to end")
        with pytest.raises((SealError, CorruptRecord)):
            node.stop()
    assert snapshot(store_dir) == before
    assert events.of() == []


# -- 4. the wrong secret -----------------------------------------------------------------------


@pytest.mark.multiprocess
def test_a_node_with_the_wrong_secret_joining_a_running_cluster_touches_nothing(
    local_cluster: MakeCluster,
) -> None:
    """A third node with another secret joining two running nodes exits 2 with one line about the
    secret, never takes the lease, and writes nothing to the store.
    """
    cluster = local_cluster(timing=LeaseTiming(200, 1000))
    cluster.start(A)
    store = store_of(cluster)
    wait_until(lambda: newest_seq(store, JOURNAL) >= 2, "node-a to lead")
    cluster.start(B)
    wait_until(
        lambda: any(
            b.node == B.node and b.role == "standby" for b in store.list_heartbeats(JOURNAL)
        ),
        "node-b to stand by",
    )
    lease = store.read_lease(JOURNAL)
    assert lease is not None and (lease.holder, lease.epoch) == (A.node, 1)
    cluster_json = file_key(store.root, CLUSTER).read_bytes()

    intruder = "node-x"
    command = [
        sys.executable, "-m", "hamsterbunker", "run",
        "--store", cluster.store_url,
        "--agent", cluster.agent,
        "--node-id", intruder,
        "--region", "elsewhere",
        "--tick-ms", str(cluster.timing.tick_ms),
        "--lease-ttl-ms", str(cluster.timing.lease_ttl_ms),
    ]  # fmt: skip
    if cluster.history:
        command += ["--history", str(cluster.history)]
    env = {**os.environ, **cluster.env, "HB_SECRET": "not-the-cluster-secret"}
    env.pop("CREDENTIALS_DIRECTORY", None)
    result = subprocess.run(
        command, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert "secret" in lines[0].lower(), lines[0]

    assert not [p for p in store.root.rglob("*") if intruder in p.name]
    assert stored_events(store, JOURNAL, "node.online", intruder) == []
    assert intruder not in [b.node for b in store.list_heartbeats(JOURNAL)]
    now = store.read_lease(JOURNAL)
    assert now is not None
    assert (now.holder, now.epoch, now.session) == (lease.holder, lease.epoch, lease.session)
    assert [(e.node, e.epoch) for e in stored_events(store, JOURNAL, "lease.acquired")] == [
        (A.node, 1)
    ]
    assert file_key(store.root, CLUSTER).read_bytes() == cluster_json
    assert cluster.history is None or intruder not in cluster.history.read_text()
    assert cluster.alive(A.node) and cluster.alive(B.node)
