"""Fault tests on real node processes: kill loops, zombie leaders, short pauses, clock jumps.

Every node records its store operations (``--history``); the ``local_cluster``
fixture holds each history to the checker's safety rules at teardown, and the
tests call the checker themselves too. The test agent (``JournalCounter``)
writes an external journal line for every step it completes, so lost and
repeated steps are counted from outside the runtime.

Randomness comes from ``random.Random(seed)``; the seed is printed, and
``HB_TEST_SEED=<seed>`` replays a failed run's choices.

In the slow tier (``make test-all``), on the file store: the store's half
(fenced writes, compare-and-set races) is proved on every backend by the
contract suite (tests/stores/contract), and a kill and a zombie on Redis and
etcd by tests/node/test_multiprocess.py.
"""

from __future__ import annotations

import glob
import json
import os
import platform
import random
import secrets
import signal
import time
from collections import Counter
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from hamsterbunker import Event, FileStore
from hamsterbunker.core.history import Op, read_history
from hamsterbunker.core.timing import LeaseTiming
from hamsterbunker.ops.checker import check
from hamsterbunker.ops.local import LocalCluster, NodeSpec
from hamsterbunker.records import Heartbeat, LeaseRecord
from hamsterbunker.sealing import Sealer
from tests.support import (
    pause_outside_lock,
    process_state,
    redo_finished,
    store_of,
    wait_until,
)

pytestmark = [pytest.mark.fault, pytest.mark.multiprocess]

AGENT = "journal"  # JournalCounter's id
A, B, C = (
    NodeSpec("node-a", "eu-central"),
    NodeSpec("node-b", "us-east"),
    NodeSpec("node-c", "ap-south"),
)
SPECS = {spec.node: spec for spec in (A, B, C)}
MakeCluster = Callable[..., LocalCluster]
HOUR = 3600.0


# -- helpers -------------------------------------------------------------------


def seeded(test: str) -> random.Random:
    """A Random for this test; its seed is printed (shown by pytest when the test fails)."""
    seed = int(os.environ.get("HB_TEST_SEED") or secrets.randbits(32))
    print(f"{test}: random seed {seed} (replay with HB_TEST_SEED={seed})")
    return random.Random(seed)


def events(store: FileStore, kind: str | None = None, node: str | None = None) -> list[Event]:
    return [
        e
        for e in store.read_events(AGENT)
        if (kind is None or e.type == kind) and (node is None or e.node == node)
    ]


def last_event_n(store: FileStore, node: str) -> int:
    return max((e.n for e in events(store, node=node)), default=0)


def heartbeat(store: FileStore, node: str) -> Heartbeat | None:
    return next((b for b in store.list_heartbeats(AGENT) if b.node == node), None)


def has_role(store: FileStore, node: str, role: str, beats: int = 0) -> bool:
    beat = heartbeat(store, node)
    return beat is not None and beat.role == role and beat.beats >= beats


def settled(store: FileStore, node: str) -> bool:
    """The node has looked at the lease: it reports standby or active."""
    return has_role(store, node, "standby") or has_role(store, node, "active")


def beats_of(store: FileStore, node: str) -> int:
    beat = heartbeat(store, node)
    return beat.beats if beat is not None else 0


def lease_version(store: FileStore) -> int | None:
    lease = store.read_lease(AGENT)
    return lease.version if lease is not None else None


def lease_moved(store: FileStore, version: int | None) -> bool:
    return lease_version(store) != version


def lost_lease_since(store: FileStore, node: str, after_n: int) -> bool:
    return any(e.n > after_n for e in events(store, "lease.lost", node))


def taken_over(store: FileStore, node: str, epoch: int) -> LeaseRecord | None:
    """The lease, once a node other than `node` holds an epoch above `epoch`."""
    lease = store.read_lease(AGENT)
    if lease is not None and lease.epoch > epoch and lease.holder not in (None, node):
        return lease
    return None


def latest_seq(store: FileStore) -> int:
    checkpoints = store.list_checkpoints(AGENT)
    return checkpoints[0].seq if checkpoints else 0


def seq_above(store: FileStore, seq: int) -> int:
    """The newest checkpoint's seq once it is above seq, else 0."""
    latest = latest_seq(store)
    return latest if latest > seq else 0


def publishing_term(store: FileStore, after_epoch: int = 0) -> LeaseRecord | None:
    """The lease, once its holder has published a checkpoint in an epoch above after_epoch."""
    lease = store.read_lease(AGENT)
    if lease is None or lease.holder is None or lease.epoch <= after_epoch:
        return None
    checkpoints = store.list_checkpoints(AGENT)
    if checkpoints and checkpoints[0].epoch == lease.epoch:
        return lease
    return None


def read_journal(cluster: LocalCluster) -> list[dict[str, Any]]:
    path = Path(cluster.env["HB_TEST_JOURNAL"])
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def assert_retained_checkpoints_open_with_count_equal_seq(
    cluster: LocalCluster, store: FileStore
) -> None:
    record = store.read_cluster()
    assert record is not None
    sealer = Sealer(cluster.secret, record)
    infos = store.list_checkpoints(AGENT)
    assert infos, "no checkpoint retained"
    for info in infos:
        state = sealer.open(store.read_checkpoint(AGENT, info), AGENT, info.epoch, info.seq)
        assert state["count"] == info.seq, (info, state)


def assert_history_clean(cluster: LocalCluster) -> list[Op]:
    assert cluster.history is not None
    ops = read_history(cluster.history)
    assert ops, "no history recorded"
    violations = check(ops)
    assert violations == [], violations
    return ops


def acquired(store: FileStore) -> list[tuple[str, int, str]]:
    return [(e.node, e.epoch, e.detail.get("via", "")) for e in events(store, "lease.acquired")]


def hold_steady(
    store: FileStore,
    seconds: float,
    expect: Callable[[], None],
    what: str,
) -> int:
    """For `seconds`, keep checking expect() while the agent keeps publishing; return steps seen.

    Bounded: at most one wait per published step, each wait bounded.
    """
    start_seq = latest_seq(store)
    seq = start_seq
    until = time.monotonic() + seconds
    for _ in range(10_000):
        if time.monotonic() >= until:
            break
        expect()
        seq = wait_until(
            partial(seq_above, store, seq),
            f"the agent to keep publishing ({what})",
            timeout=30,
        )
    expect()
    return seq - start_seq


# -- libfaketime ---------------------------------------------------------------

# Written into a directory that goes first on PYTHONPATH of nodes run under
# libfaketime. With FAKETIME_DONT_FAKE_MONOTONIC=1 (a real clock jump moves the
# wall clock, not the monotonic one), libfaketime 0.9.10 translates
# clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, ...) into a negative time and
# the kernel answers EINVAL (wolfcw/libfaketime#426). Python >= 3.11's
# time.sleep sleeps exactly that way, so every time.sleep would raise OSError.
# This replaces time.sleep only, with a select() on the real monotonic clock.
_SITECUSTOMIZE = '''\
"""libfaketime workaround for fault tests (see tests/faults/test_process_faults.py)."""
import select
import time


def _sleep(seconds):
    if seconds < 0:
        raise ValueError("sleep length must be non-negative")
    deadline = time.monotonic() + seconds
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return
        select.select([], [], [], remaining)


time.sleep = _sleep
'''


def libfaketime() -> str:
    """Path of libfaketime.so.1; fails in CI (CI=true) and skips elsewhere if it is missing."""
    candidates = [
        f"/usr/lib/{platform.machine()}-linux-gnu/faketime/libfaketime.so.1",
        "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
        "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
        *sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1")),
        "/usr/lib/faketime/libfaketime.so.1",
    ]
    for path in candidates:
        if os.path.exists(path):
            return path
    message = (
        "libfaketime is not installed (looked for " + ", ".join(dict.fromkeys(candidates)) + "); "
        "the clock-jump fault tests need it: apt-get install faketime"
    )
    if os.environ.get("CI") == "true":
        pytest.fail(f"{message} (CI must run this test, never skip it)")
    pytest.skip(message)


def faketime_env(cluster: LocalCluster, tmp_path: Path, **settings: str) -> dict[str, str]:
    """Environment for a node whose wall clock libfaketime fakes (the monotonic clock stays real)."""
    site = tmp_path / "faketime-site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(_SITECUSTOMIZE)
    return {
        "LD_PRELOAD": libfaketime(),
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        "DONT_FAKE_MONOTONIC": "1",  # its older name, still read
        "PYTHONPATH": os.pathsep.join([str(site), cluster.env["PYTHONPATH"]]),
        **settings,
    }


def set_offset(path: Path, offset: str) -> None:
    """Atomically replace a FAKETIME_TIMESTAMP_FILE (a reader never sees it half written)."""
    tmp = path.with_name(path.name + ".new")
    tmp.write_text(offset + "\n")
    os.replace(tmp, path)


def clock_offset(store: FileStore, node: str, beats_after: int = 0) -> float | None:
    """How far the node's wall clock is from ours, from a heartbeat newer than beats_after."""
    beat = heartbeat(store, node)
    if beat is None or beat.beats <= beats_after:
        return None
    return beat.time - time.time()


def near(offset: float | None, target: float, slack: float = 120.0) -> bool:
    return offset is not None and abs(offset - target) < slack


def clock_jumped(store: FileStore, node: str, target: float, beats_after: int) -> bool:
    return near(clock_offset(store, node, beats_after), target)


def remove_faketime_shm(pids: list[int]) -> None:
    """Remove libfaketime's shared memory of our own node processes that did not exit cleanly."""
    for pid in pids:
        if not Path(f"/proc/{pid}").exists():
            for name in (f"faketime_shm_{pid}", f"sem.faketime_sem_{pid}"):
                Path("/dev/shm", name).unlink(missing_ok=True)


# -- 1. kill loop --------------------------------------------------------------


def test_kill_loop_sigkills_of_the_active_node_lose_nothing_and_repeat_at_most_the_step_in_flight(
    local_cluster: MakeCluster,
) -> None:
    """21 SIGKILLs of the leader at random moments: no step lost, each kill repeats at most one."""
    rng = seeded("kill loop")
    kills_wanted, time_budget = 21, 150.0
    ttl_ms = 700
    # Short steps: a kill often lands between a step's journal line and its publish.
    cluster = local_cluster(timing=LeaseTiming(100, ttl_ms), env={"HB_TEST_STEP_S": "0.02"})
    for spec in (A, B, C):
        cluster.start(spec)
    store = store_of(cluster)

    started = time.monotonic()
    kills: list[dict[str, Any]] = []  # epoch killed, last accepted seq at the kill, when
    killed_epoch = 0
    for _ in range(kills_wanted):
        assert time.monotonic() - started < time_budget, (
            f"only {len(kills)} kills in {time_budget} s"
        )
        wait_until(
            partial(publishing_term, store, killed_epoch),
            f"a leader above epoch {killed_epoch} to publish",
            timeout=30,
        )
        time.sleep(rng.uniform(0.0, 0.3))  # the random moment of the crash
        lease = store.read_lease(AGENT)
        assert lease is not None and lease.holder is not None
        victim = lease.holder
        killed_at = time.monotonic()
        cluster.kill(victim)  # SIGKILL, and reaped: it writes nothing more
        last = latest_seq(redo_finished(store))  # a commit it had made durable counts
        kills.append({"node": victim, "epoch": lease.epoch, "last": last, "at": killed_at})
        killed_epoch = lease.epoch
        cluster.start(SPECS[victim])  # the machine comes back, as a standby
    # The last kill is recovered from too.
    wait_until(
        lambda: publishing_term(store, killed_epoch), "a leader after the last kill", timeout=30
    )
    last_kill = kills[-1]["last"]
    wait_until(lambda: latest_seq(store) >= last_kill + 3, "the agent to advance after the kills")
    duration = time.monotonic() - started
    cluster.stop_all()  # graceful: the step in flight is cancelled, not journalled

    ops = assert_history_clean(cluster)
    assert_retained_checkpoints_open_with_count_equal_seq(cluster, store)
    final = latest_seq(store)

    # Each takeover resumed from exactly the last checkpoint accepted before the kill.
    restores = {op.epoch: op for op in ops if op.op == "restore"}
    acquires = {op.epoch: op for op in ops if op.op == "acquire" and op.outcome == "ok"}
    for kill in kills:
        successor = kill["epoch"] + 1
        assert successor in restores, f"no restore of epoch {successor} after {kill}"
        if acquires[successor].start > kill["at"]:  # not an unrelated earlier takeover
            assert restores[successor].outcome == "resumed", restores[successor]
            assert restores[successor].detail["from_seq"] == kill["last"], (
                kill,
                restores[successor],
            )

    # From outside the runtime: the journal of completed steps.
    journal = read_journal(cluster)
    for line in journal:
        assert line["count"] == line["seq"], f"a step computed {line}: every run of seq n gives n"
    occurrences = Counter(line["seq"] for line in journal)
    lost = sorted(set(range(1, final + 1)) - set(occurrences))
    assert lost == [], f"steps lost: {lost}"
    # What a kill may repeat: the step in flight, seq = last accepted + 1. The
    # kills come after a publish of each new term, so these are all different.
    in_flight = Counter(kill["last"] + 1 for kill in kills)
    assert all(n == 1 for n in in_flight.values()), in_flight
    # Apart from kills, only a completed step the runtime discarded (renew deadline
    # passed, fenced, store failure: each emits an event naming it) runs again.
    discarded = Counter(
        e.detail["step_seq"]
        for e in store.read_events(AGENT)
        if e.type in ("agent.yielded", "node.fenced", "checkpoint.failed")
        and "step_seq" in e.detail
    )
    repeats = {seq: n - 1 for seq, n in occurrences.items() if n > 1}
    for seq, extra in sorted(repeats.items()):
        assert extra <= in_flight[seq] + discarded[seq], (
            f"seq {seq} ran {extra + 1} times; kills with it in flight: {in_flight[seq]}, "
            f"discarded runs: {discarded[seq]}"
        )
    by_kills = sum(min(extra, in_flight[seq]) for seq, extra in repeats.items())
    print(
        f"kill loop: {len(kills)} SIGKILLs in {duration:.1f} s; {final} steps published, "
        f"{len(journal)} journalled; {sum(repeats.values())} steps repeated "
        f"({by_kills} in flight at a kill, seqs {sorted(repeats)}); "
        f"{sum(discarded.values())} completed-or-cancelled steps discarded by the runtime"
    )
    assert len(kills) >= 20


# -- 2. zombie loop ------------------------------------------------------------


def test_zombie_loop_paused_leaders_are_fenced_by_the_store_and_step_down(
    local_cluster: MakeCluster,
) -> None:
    """Leaders paused 1.5-5 TTL, four times: the store refuses their later writes; they step down."""
    rng = seeded("zombie loop")
    rounds, ttl_ms = 4, 800
    ttl = ttl_ms / 1000
    cluster = local_cluster(timing=LeaseTiming(100, ttl_ms), env={"HB_TEST_STEP_S": "0.05"})
    for spec in (A, B, C):
        cluster.start(spec)
    store = store_of(cluster)

    zombies: list[dict[str, Any]] = []
    epoch = 0
    for round_no in range(rounds):
        lease = wait_until(
            partial(publishing_term, store, epoch),
            f"round {round_no}: a leader publishing above epoch {epoch}",
            timeout=30,
        )
        zombie, old_epoch = lease.holder, lease.epoch
        assert zombie is not None
        time.sleep(rng.uniform(0.0, 0.3))  # a random moment of its work
        pause_s = rng.uniform(1.5, 5.0) * ttl
        before_n = last_event_n(store, zombie)
        pause_outside_lock(cluster, zombie)
        paused_at = time.monotonic()
        seq_at_pause = latest_seq(store)  # the zombie is frozen outside the lock: final
        # Someone else must take over while it sleeps, or there would be nothing to fence.
        successor = wait_until(
            partial(taken_over, store, zombie, old_epoch),
            f"round {round_no}: a standby to take over from the paused {zombie}",
            timeout=30,
        )
        # ... and be leading (its acquire recorded, a checkpoint published) before it wakes.
        wait_until(
            partial(publishing_term, store, old_epoch),
            f"round {round_no}: the successor to publish",
            timeout=30,
        )
        remaining = pause_s - (time.monotonic() - paused_at)
        if remaining > 0:
            time.sleep(remaining)  # the rest of the pause: this sleep is the fault
        assert process_state(cluster.pid(zombie)) == "T"
        cluster.signal(zombie, signal.SIGCONT)
        resumed_at = time.monotonic()
        paused_for = resumed_at - paused_at

        wait_until(
            partial(lost_lease_since, store, zombie, before_n),
            f"round {round_no}: {zombie} to report losing the lease",
            timeout=30,
        )
        wait_until(
            partial(has_role, store, zombie, "standby"),
            f"round {round_no}: {zombie} to report standby",
            timeout=30,
        )
        now = store.read_lease(AGENT)
        assert now is not None and now.holder != zombie and now.epoch > old_epoch, now
        zombies.append(
            {
                "node": zombie,
                "epoch": old_epoch,
                "successor": successor.epoch,
                "paused_at": paused_at,
                "resumed_at": resumed_at,
                "seq_at_pause": seq_at_pause,
                "paused_for": paused_for,
            }
        )
        print(
            f"round {round_no}: {zombie} (epoch {old_epoch}) paused {paused_for:.2f} s "
            f"= {paused_for / ttl:.1f} TTL; {successor.holder} took epoch {successor.epoch}"
        )
        epoch = old_epoch  # next round: the successor, once it publishes
    cluster.stop_all()

    ops = assert_history_clean(cluster)
    assert_retained_checkpoints_open_with_count_equal_seq(cluster, store)
    fenced_total = 0
    for z in zombies:
        taken = next(
            op
            for op in ops
            if op.op == "acquire" and op.outcome == "ok" and op.epoch == z["epoch"] + 1
        )
        assert z["paused_at"] < taken.end < z["resumed_at"], (z, taken)
        publishes = [
            op
            for op in ops
            if op.op == "publish" and op.node == z["node"] and op.epoch == z["epoch"]
        ]
        for op in publishes:
            if op.outcome == "ok":
                # Accepted only what was already in the store when it froze.
                assert op.start < taken.end and op.seq <= z["seq_at_pause"], (z, op)
            if op.start > z["resumed_at"]:
                assert op.outcome == "fenced", (z, op)
        after_pause = [op for op in publishes if op.end > z["resumed_at"]]
        fenced_total += sum(op.outcome == "fenced" for op in after_pause)
        print(
            f"{z['node']} epoch {z['epoch']}: publish attempts ending after the pause: "
            f"{[(op.seq, op.outcome) for op in after_pause]}"
        )
    lengths = ", ".join(f"{z['paused_for'] / ttl:.1f}" for z in zombies)
    print(
        f"zombie loop: {len(zombies)} pauses of {lengths} TTL; "
        f"{fenced_total} zombie publishes fenced by the store"
    )


# -- 3. short pause ------------------------------------------------------------


def test_short_pauses_of_the_leader_cause_no_takeover_and_no_epoch_change(
    local_cluster: MakeCluster,
) -> None:
    """A leader SIGSTOPped for half the TTL (once 0.75 × TTL) keeps its lease and its epoch."""
    rng = seeded("short pause")
    # tick/TTL = 0.1 as in 200/2000, scaled up so the standby's margin is wide on a noisy machine.
    tick_ms, ttl_ms = 300, 3000
    ttl = ttl_ms / 1000
    cluster = local_cluster(timing=LeaseTiming(tick_ms, ttl_ms))
    cluster.start(A)
    store = store_of(cluster)
    wait_until(lambda: publishing_term(store), "node-a to lead and publish")
    cluster.start(B)
    wait_until(lambda: has_role(store, B.node, "standby", beats=3), "node-b to stand by")
    standby_beats = heartbeat(store, B.node).beats  # type: ignore[union-attr]

    # Half the TTL, as the issue says; the last pause outlasts the renew deadline
    # (0.6 × TTL) too: the leader must stop stepping, yet its renewal still
    # succeeds and keeps the epoch. Each pause starts just after a renewal, so the
    # standby's margin is the rest of the TTL, not that minus a tick.
    for round_no, fraction in enumerate((0.5, 0.5, 0.5, 0.75)):
        time.sleep(rng.uniform(0.0, tick_ms / 1000))  # a random moment of the agent's step
        version = lease_version(store)
        wait_until(partial(lease_moved, store, version), "node-a to renew", timeout=30)
        pause_outside_lock(cluster, A.node)
        paused_at = time.monotonic()
        time.sleep(fraction * ttl)  # the pause itself is the fault
        seq_at_resume = latest_seq(store)
        cluster.signal(A.node, signal.SIGCONT)
        paused_for = time.monotonic() - paused_at
        wait_until(
            partial(seq_above, store, seq_at_resume),
            f"round {round_no}: node-a to publish again after a {fraction} × TTL pause",
            timeout=30,
        )
        lease = store.read_lease(AGENT)
        assert lease is not None and (lease.holder, lease.epoch) == (A.node, 1), lease
        assert store.list_checkpoints(AGENT)[0].epoch == 1
        assert acquired(store) == [(A.node, 1, "empty")], acquired(store)
        assert events(store, "lease.lost") == []
        yielded = len(events(store, "agent.yielded", A.node))
        print(
            f"round {round_no}: paused {paused_for:.2f} s = {paused_for / ttl:.2f} TTL; "
            f"still epoch 1; node-a has yielded {yielded} steps at its renew deadline"
        )

    beat = heartbeat(store, B.node)
    assert cluster.alive(B.node) and beat is not None and beat.role == "standby"
    assert beat.beats > standby_beats  # the standby was watching all along
    cluster.stop_all()
    ops = assert_history_clean(cluster)
    assert [(op.node, op.epoch) for op in ops if op.op == "acquire"] == [(A.node, 1)]
    assert {op.node for op in ops if op.op == "publish"} == {A.node}


# -- 4. clock jumps ------------------------------------------------------------


def test_wall_clocks_an_hour_ahead_and_behind_cause_no_takeover(
    local_cluster: MakeCluster, tmp_path: Path
) -> None:
    """Wall clocks an hour ahead and an hour behind (libfaketime) cause no takeover."""
    # Default timing: these tests are about clocks, not about tight timing.
    tick_ms, ttl_ms = 200, 2000
    ttl = ttl_ms / 1000
    cluster = local_cluster(timing=LeaseTiming(tick_ms, ttl_ms))
    ahead = faketime_env(cluster, tmp_path, FAKETIME="+1h")
    behind = faketime_env(cluster, tmp_path, FAKETIME="-1h")
    pids: list[int] = []
    try:
        pids.append(cluster.start(A, extra_env=ahead).pid)
        store = store_of(cluster)
        wait_until(lambda: publishing_term(store), "node-a (an hour ahead) to lead")
        pids.append(cluster.start(B, extra_env=behind).pid)
        wait_until(
            lambda: has_role(store, B.node, "standby"), "node-b (an hour behind) to stand by"
        )
        # The fake clocks really are in effect inside the nodes.
        assert near(clock_offset(store, A.node), +HOUR), clock_offset(store, A.node)
        assert near(clock_offset(store, B.node), -HOUR), clock_offset(store, B.node)

        def one_term() -> None:
            lease = store.read_lease(AGENT)
            assert lease is not None and (lease.holder, lease.epoch) == (A.node, 1), lease
            assert acquired(store) == [(A.node, 1, "empty")], acquired(store)
            assert events(store, "lease.lost") == []

        steps = hold_steady(store, 3 * ttl, one_term, "leader ahead, standby behind")
        print(f"leader an hour ahead, standby an hour behind: {steps} steps in 3 TTL, epoch 1")

        # The other way round: the leader behind, the standby ahead. A graceful
        # handover (not the clocks) moves the lease to node-b.
        cluster.signal(A.node, signal.SIGTERM)
        assert cluster.processes[A.node].wait(timeout=30) == 0
        wait_until(lambda: publishing_term(store, 1), "node-b (an hour behind) to take over")
        pids.append(cluster.start(A, extra_env=ahead).pid)
        # A wall clock two hours ahead of the leader's must not make it take over.
        wait_until(partial(settled, store, A.node), "node-a (an hour ahead) to rejoin")

        def second_term() -> None:
            lease = store.read_lease(AGENT)
            assert lease is not None and (lease.holder, lease.epoch) == (B.node, 2), lease
            terms = acquired(store)
            assert terms == [(A.node, 1, "empty"), (B.node, 2, "released")], terms
            assert events(store, "lease.lost") == []

        steps = hold_steady(store, 3 * ttl, second_term, "leader behind, standby ahead")
        print(f"leader an hour behind, standby an hour ahead: {steps} steps in 3 TTL, epoch 2")
        cluster.stop_all()
        assert_history_clean(cluster)
        assert_retained_checkpoints_open_with_count_equal_seq(cluster, store)
    finally:
        cluster.stop_all()
        remove_faketime_shm(pids)


def test_wall_clock_jumps_mid_run_cause_no_takeover(
    local_cluster: MakeCluster, tmp_path: Path
) -> None:
    """Mid-run wall-clock jumps (leader +1 h, standby -1 h, then 2 h back the other way): no takeover."""
    tick_ms, ttl_ms = 200, 2000  # default timing: this test is about clocks
    ttl = ttl_ms / 1000
    cluster = local_cluster(timing=LeaseTiming(tick_ms, ttl_ms))
    offsets = {spec.node: tmp_path / f"faketime-{spec.node}" for spec in (A, B)}
    for path in offsets.values():
        set_offset(path, "+0")
    # The offset is read from a file on every clock read, so it can change at run
    # time; FAKETIME must stay unset, or it would take priority over the file.
    envs = {
        node: faketime_env(
            cluster, tmp_path, FAKETIME_TIMESTAMP_FILE=str(path), FAKETIME_NO_CACHE="1"
        )
        for node, path in offsets.items()
    }
    pids: list[int] = []
    try:
        pids.append(cluster.start(A, extra_env=envs[A.node]).pid)
        store = store_of(cluster)
        wait_until(lambda: publishing_term(store), "node-a to lead")
        pids.append(cluster.start(B, extra_env=envs[B.node]).pid)
        wait_until(lambda: has_role(store, B.node, "standby"), "node-b to stand by")
        assert near(clock_offset(store, A.node), 0.0, slack=60)
        assert near(clock_offset(store, B.node), 0.0, slack=60)

        def one_term() -> None:
            lease = store.read_lease(AGENT)
            assert lease is not None and (lease.holder, lease.epoch) == (A.node, 1), lease
            assert acquired(store) == [(A.node, 1, "empty")], acquired(store)
            assert events(store, "lease.lost") == []

        def jumped(node: str, target: float, beats_after: int) -> None:
            wait_until(
                partial(clock_jumped, store, node, target, beats_after),
                f"{node}'s wall clock to read {target:+.0f} s from ours",
                timeout=30,
            )

        hold_steady(store, ttl, one_term, "before the jumps")

        # 1. Both clocks jump while everything runs.
        beats = {node: beats_of(store, node) for node in offsets}
        set_offset(offsets[A.node], "+1h")
        set_offset(offsets[B.node], "-1h")
        jumped(A.node, +HOUR, beats[A.node])
        jumped(B.node, -HOUR, beats[B.node])
        steps = hold_steady(store, 3 * ttl, one_term, "leader +1 h, standby -1 h")
        print(f"leader's clock jumped +1 h, standby's -1 h: {steps} steps in 3 TTL, epoch 1")

        # 2. Both jump back two hours, the other way, while the leader is silent
        # for half the TTL (SIGSTOP): the standby's first looks after its jump
        # find the lease unchanged, so a standby that timed the lease on its wall
        # clock would see two hours without a renewal and take over.
        beats = {node: beats_of(store, node) for node in offsets}
        pause_outside_lock(cluster, A.node)
        paused_at = time.monotonic()
        set_offset(offsets[A.node], "-1h")
        set_offset(offsets[B.node], "+1h")
        looked = 0  # standby ticks wholly after its jump, while the leader was silent
        first_jumped_beat = 0
        for _ in range(1000):  # bounded by count and by half the TTL
            if time.monotonic() - paused_at >= 0.5 * ttl:
                break
            if not first_jumped_beat and clock_jumped(store, B.node, +HOUR, beats[B.node]):
                first_jumped_beat = beats_of(store, B.node)
            if first_jumped_beat:
                looked = beats_of(store, B.node) - first_jumped_beat
            time.sleep(0.01)
        remaining = 0.5 * ttl - (time.monotonic() - paused_at)
        if remaining > 0:
            time.sleep(remaining)  # the rest of the pause: the fault itself
        cluster.signal(A.node, signal.SIGCONT)
        jumped(A.node, -HOUR, beats[A.node])
        jumped(B.node, +HOUR, beats[B.node])
        steps = hold_steady(store, 3 * ttl, one_term, "leader -1 h, standby +1 h")
        print(
            f"leader's clock jumped -2 h (to -1 h) during a 0.5 TTL pause, standby's +2 h "
            f"(to +1 h), which then looked {looked} times at the silent lease: "
            f"{steps} steps in 3 TTL, epoch 1"
        )
        cluster.stop_all()
        assert_history_clean(cluster)
        assert_retained_checkpoints_open_with_count_equal_seq(cluster, store)
    finally:
        cluster.stop_all()
        remove_faketime_shm(pids)
