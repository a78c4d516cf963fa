"""The syncdir store on folders kept in step by real Syncthing (issue 20's scenarios).

Each node is a process of its own (``tests.support.syncdir_node``: the library's
``Runtime`` on a ``SyncDirStore``, stepping the demo's ``CounterAgent``) on a
folder of its own, and Syncthing instances on loopback keep the folders in step
(``tests.support.syncthing``; a partition pauses the links of one instance).
The timing is what a user of such a folder would choose: a stated sync delay of
3 s (the harness measures about 1 s), tick 500 ms, TTL 8 s ≥ 2 × (tick + sync
delay). Every wait is on a condition, bounded.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from tests.support import wait_until
from tests.support.cli import hb_env, run_hb
from tests.support.syncdir_fleet import (
    AGENT,
    SYNC_DELAY_MS,
    TTL_S,
    WAIT_S,
    Fleet,
    chain,
    events,
    fleet_on,
    reader,
)
from tests.support.syncdir_node import SECRET

pytestmark = [pytest.mark.syncthing, pytest.mark.multiprocess, pytest.mark.fault]


def test_the_leader_killed_is_taken_over_after_ttl_and_sync_delay_with_nothing_lost(
    tmp_path: Path,
) -> None:
    """Three machines: the leader is SIGKILLed; one of the others resumes from the last
    checkpoint the dead leader published, within TTL + sync delay. The two standbys may
    take the lease at once: the one whose claim loses steps down before its first step
    if the sync keeps to its stated delay, and is reported as diverged if it did not."""
    with fleet_on(tmp_path, 3) as fleet:
        a, b, c = fleet.mesh
        fleet.start_first("n1", a)
        fleet.start_beside("n2", b)
        fleet.start_beside("n3", c)
        wait_until(lambda: len(fleet.published("n1")) >= 4, "a few steps", WAIT_S)
        fleet.stop("n1", signal.SIGKILL)
        killed = time.clock_gettime(time.CLOCK_BOOTTIME)  # the histories' clock
        last = max(op.seq for op in fleet.published("n1"))
        # Both standbys saw the same last renewal: both may take the next epoch at once.
        # The one whose claim loses finds it before its first step and steps down; if the
        # sync was slower than stated, it finds it after a few steps (lease.lost).
        standbys = ("n2", "n3")

        def lost() -> set[str]:
            return {e.node for instance in fleet.mesh for e in events(instance, "lease.lost")}

        def goes_on() -> str | None:
            """The one standby that stepped and did not lose, once any other that stepped
            lost, and once it has stepped on past the dead leader's last checkpoint."""
            going = [n for n in standbys if stepped(fleet, n) and n not in lost()]
            if len(going) != 1 or any(stepped(fleet, n) for n in set(standbys) - {*going, *lost()}):
                return None
            return going[0] if max(o.seq for o in fleet.published(going[0])) > last + 3 else None

        taker = wait_until(goes_on, "one standby to take over and step on", WAIT_S)
        took_s = fleet.acquired(taker, above=1)[0].end - killed
        print(f"taken over by {taker} {took_s:.1f} s after the kill")
        assert took_s < TTL_S + 2 * SYNC_DELAY_MS / 1000 + 5  # TTL + the sync, with slack
        restored = fleet.ops(taker, "restore", "resumed")
        assert restored[0].detail["from_seq"] == last  # the dead leader's last checkpoint
        other = "n3" if taker == "n2" else "n2"
        if not stepped(fleet, other):
            for instance in fleet.mesh:
                assert events(instance, "store.diverged") == []
            return
        # Both stepped: the sync took longer than the term's wait for the other claim (the
        # stated delay and two ticks). What the design promises then: the loser steps down
        # (found above), it is reported, and the agent goes on from the winner's chain.
        print(f"both {taker} and {other} stepped: the sync was slower than stated")
        reported = wait_until(lambda: events(a, "store.diverged"), "store.diverged", WAIT_S)
        assert reported[0].detail["node"] == other
        assert reported[0].detail["winner"].endswith(f"@{taker}")


def stepped(fleet: Fleet, node: str) -> bool:
    """Whether node published under an epoch after the first (it took over and stepped)."""
    return any(op.epoch > 1 for op in fleet.published(node))


def test_a_partition_lets_both_lead_then_one_chain_wins_and_the_other_is_kept_aside(
    tmp_path: Path,
) -> None:
    """Syncthing paused on the leader's side for 3 × TTL: the other side takes over and
    both step; after the sync resumes, divergence is reported, the higher epoch's chain
    goes on, the old leader steps down, and its branch is kept (as its retention left it)."""
    with fleet_on(tmp_path, 2) as fleet:
        a, b = fleet.mesh
        fleet.start_first("n1", a)
        fleet.start_beside("n2", b)
        wait_until(lambda: len(fleet.published("n1")) >= 3, "a few steps", WAIT_S)
        a.pause()
        cut = time.monotonic()
        wait_until(lambda: fleet.acquired("n2", above=1), "n2 to take over", WAIT_S)
        # Both lead, each on its own side: both publish during the partition.
        wait_until(lambda: [o for o in fleet.published("n2") if o.epoch > 1], "n2 steps", WAIT_S)
        assert [o for o in fleet.published("n1") if o.start > cut - 1], "n1 stepped on"
        wait_until(lambda: time.monotonic() - cut >= 3 * TTL_S or None, "3 × TTL", WAIT_S)
        aside = chain(a, "n1")
        a.resume()
        healed = time.monotonic()
        # Divergence reported within a bound: a sync, then at most one check (every 3 TTLs).
        reported = wait_until(
            lambda: events(a, "store.diverged") or events(b, "store.diverged"),
            "store.diverged",
            WAIT_S,
        )
        detected_s = time.monotonic() - healed
        print(f"divergence reported {detected_s:.1f} s after the sync resumed: "
              f"{reported[0].detail}")  # fmt: skip
        # The bound the design states: the claims and chains sync, then the next check (every
        # 3 TTLs) sees them; with slack for this shared machine.
        assert detected_s < 3 * TTL_S + 2 * SYNC_DELAY_MS / 1000 + 10
        assert reported[0].detail["winner"].endswith("@n2")
        assert reported[0].detail["node"] == "n1"
        # n1 steps down; n2's chain goes on; nothing of n1's chain is gone, on either side.
        wait_until(lambda: events(a, "lease.lost") or events(b, "lease.lost"), "n1 lost", WAIT_S)
        n2_before = max(o.seq for o in fleet.published("n2"))
        wait_until(lambda: max(o.seq for o in fleet.published("n2")) > n2_before,
                   "n2 to step on", WAIT_S)  # fmt: skip
        after = max(o.end for o in fleet.published("n2"))
        assert not [o for o in fleet.published("n1") if o.start > after]
        # n1's branch is kept whole, as retention left it (each term keeps its newest few):
        # its newest checkpoint is there, on both machines, and nothing more is removed.
        tip = max(o.seq for o in fleet.published("n1"))
        kept = chain(a, "n1")
        assert any(name.startswith(f"{tip:020d}-") for name in kept), (tip, kept)
        wait_until(lambda: chain(b, "n1") == kept or None, "n1's chain on both sides", WAIT_S)
        assert len(kept) >= min(len(aside), 5)
        assert chain(a, "n1") == kept
        # The operator takes n1's branch after all (hb choose-chain on n2's machine): n2 ends
        # its term at its next check and the agent goes on from n1's tip.
        term = f"{max(o.epoch for o in fleet.published('n1'))}@n1"
        args = ["--store", f"syncdir://{b.folder}", "--node-id", "n2", "--agent-id", AGENT]
        chosen = run_hb(
            ["choose-chain", *args, "--term", term, "--yes", "--wait", "--timeout", str(WAIT_S)],
            env=hb_env(HB_SECRET=SECRET),
            timeout=WAIT_S + 10,
        )
        assert chosen.returncode == 0, chosen.stdout + chosen.stderr
        taken = wait_until(lambda: events(b, "chain.chosen"), "chain.chosen", WAIT_S)
        assert taken[0].detail["base"] == f"seq {tip} of term {term}"
        went_on = taken[0]  # the new term, which restored from n1's tip
        wait_until(lambda: [o for o in fleet.published(went_on.node)
                            if (o.epoch, o.seq) == (went_on.epoch, tip + 1)],
                   "a step on from n1's tip", WAIT_S)  # fmt: skip


def test_a_graceful_stop_hands_over_without_divergence(tmp_path: Path) -> None:
    """SIGTERM of the leader: the other node takes the released lease once it syncs,
    resumes from the last checkpoint, and nothing diverges."""
    with fleet_on(tmp_path, 2) as fleet:
        a, b = fleet.mesh
        fleet.start_first("n1", a)
        fleet.start_beside("n2", b)
        wait_until(lambda: len(fleet.published("n1")) >= 3, "a few steps", WAIT_S)
        fleet.stop("n1", signal.SIGTERM)
        stopped = time.monotonic()
        last = max(op.seq for op in fleet.published("n1"))
        wait_until(lambda: fleet.acquired("n2", above=1), "n2 to take over", WAIT_S)
        took_s = time.monotonic() - stopped
        print(f"handed over {took_s:.1f} s after the stop")
        assert took_s < TTL_S  # released: taken once synced, not after a TTL
        restored = wait_until(lambda: fleet.ops("n2", "restore", "resumed"), "restore", WAIT_S)
        assert restored[0].detail["from_seq"] == last
        taken = wait_until(lambda: [e for e in events(b, "lease.acquired") if e.node == "n2"],
                           "n2's lease.acquired", WAIT_S)  # fmt: skip
        assert taken[0].detail["via"] == "released", taken[0].detail
        for instance in fleet.mesh:
            assert events(instance, "store.diverged") == []


def test_two_first_starts_at_once_on_empty_folders_make_one_cluster_and_one_leader(
    tmp_path: Path,
) -> None:
    """Two machines, empty synced folders; both nodes may make the store (the library's
    default) and start at the same moment, n2 on a folder where an earlier start of its
    failed and left its empty subtree. One cluster record (no conflict copy) on both
    machines, one leader, both nodes running."""
    with fleet_on(tmp_path, 2) as fleet:
        a, b = fleet.mesh
        (b.folder / "nodes" / "n2" / "kv").mkdir(parents=True)  # the earlier start's
        fleet.start("n1", a)
        fleet.start("n2", b)
        for instance in fleet.mesh:
            wait_until(lambda i=instance: i.read("cluster.json"), "the cluster record", WAIT_S)

        def running() -> bool:
            return all(fleet.beats(i, n) for i in fleet.mesh for n in ("n1", "n2"))

        wait_until(running, "both nodes running, seen on both machines", WAIT_S)
        wait_until(lambda: fleet.published("n1") or fleet.published("n2"), "a leader", WAIT_S)
        assert a.read("cluster.json") == b.read("cluster.json")
        for instance in fleet.mesh:
            conflicts = [f for f in reader(instance).sync_files() if "conflict" in f]
            assert conflicts == [], fleet.log_tails()
        leaders = {op.node for n in ("n1", "n2") for op in fleet.ops(n, "acquire", "ok")}
        assert len(leaders) == 1, fleet.log_tails()
        assert all(process.poll() is None for process in fleet.processes.values())
        created = {e.node for i in fleet.mesh for e in events(i, "store.created")}
        assert len(created) == 1, fleet.log_tails()
