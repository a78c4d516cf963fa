"""Two nodes on one syncdir:// folder as hamsterbunker@.service instances (issue 20).

Installed the way the README says (`make install-systemd`, `hb init --store
syncdir:///var/lib/hamsterbunker/... --sync-delay-ms N`, the secret copied,
`systemctl enable --now`), both instances run the demo counter under the
hardened unit, on one folder that both see: no sync tool is needed, since
each node writes only its own subtree `nodes/NODE/` and reads the others'.
The folder lies under the unit's StateDirectory= (/var/lib/hamsterbunker),
the one place the hardened unit may write.

The tests run in file order on that one pair of nodes and each leaves both
units running again. Instance names differ from test_systemd_node.py's, so
both modules can share the session's container.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator

import pytest

from hamsterbunker import open_store
from hamsterbunker.core.timing import LeaseTiming, check_sync_delay
from hamsterbunker.demo import REST_S, TOOL_S
from hamsterbunker.records import CheckpointInfo, Event
from hamsterbunker.stores.syncdir import SyncDirStore

from .nspawn import Container
from .test_systemd_node import REPO, active_and_standby, journal, roles, running, show, unit

pytestmark = pytest.mark.system

STORE = "/var/lib/hamsterbunker/syncdir-counter"
AGENT_ID = "counter"  # the demo agent's id
NODES = {"sa": ("sync-a", "eu-west"), "sb": ("sync-b", "us-east")}
TICK_MS, SYNC_DELAY_MS, LEASE_TTL_MS = 400, 300, 2000
# The TTL rule of a synced folder: lease_ttl ≥ 2 × (tick + sync delay) = 1400 ms.
check_sync_delay(LeaseTiming(tick_ms=TICK_MS, lease_ttl_ms=LEASE_TTL_MS), SYNC_DELAY_MS)
TICK_S, SYNC_DELAY_S, LEASE_TTL_S = TICK_MS / 1000, SYNC_DELAY_MS / 1000, LEASE_TTL_MS / 1000
# A term that took the lease (not one handed to it) waits this long before its first
# step, so that claims taken at once cross before anyone steps (docs/syncdir.md).
SETTLE_S = SYNC_DELAY_S + 2 * TICK_S
# One step of the demo counter: its tool call and the work after it.
STEP_S = TOOL_S + REST_S
# A stopped leader releases its lease; the standby takes it at its next look (the
# merged inotify watch wakes it, a tick at the latest), waits SETTLE_S, restores
# and steps (STEP_S, then the publish; a tick is left for the restore and the publish):
#   release -> lease.acquired    < TICK_S
#   lease.acquired -> first step  in [SETTLE_S, SETTLE_S + STEP_S + TICK_S)
# so the agent has stepped again on the other node within
# SYNC_DELAY_S + 4 × TICK_S + STEP_S = 2.15 s of the release.
HANDOVER_BOUND_S = TICK_S + SETTLE_S + STEP_S + TICK_S
# A frozen leader renews no more: the standby takes the expired lease at its first look
# a TTL after the last renewal it saw (at or before the SIGSTOP; the folder is shared, so
# no sync delay), a tick at the latest; one tick more for the kill to reach the node.
TAKEOVER_BOUND_S = LEASE_TTL_S + 2 * TICK_S
# The event times come from one kernel's clock (the nodes share the container); the
# term's settle starts just before lease.acquired is stamped.
CLOCK_SLACK_S = 0.05


def both_roles(box: Container) -> tuple[str, str] | None:
    return active_and_standby(box, NODES)


def describe(box: Container) -> str:
    return f"{roles(box, NODES)}"


@contextlib.contextmanager
def reader(box: Container) -> Iterator[SyncDirStore]:
    """The folder opened from the host side as `hb status` opens it: no node id, writes nothing."""
    store = open_store(f"syncdir://{box.path(STORE)}", create=False)
    assert isinstance(store, SyncDirStore)
    try:
        yield store
    finally:
        store.close()


def events(box: Container) -> list[Event]:
    """Every event the nodes stored, each read from its own node's subtree."""
    with reader(box) as store:
        return store.read_events(AGENT_ID)


def chains(box: Container) -> dict[str, list[CheckpointInfo]]:
    """node -> the checkpoints of its own chain, as the folder holds them."""
    with reader(box) as store:
        return store.list_chains(AGENT_ID)


def newest_of_term(box: Container, node: str, epoch: int) -> CheckpointInfo:
    """The newest checkpoint node published under epoch."""
    return max((c for c in chains(box)[node] if c.epoch == epoch), key=lambda c: c.seq)


def new_events(box: Container, before: set[tuple[str, int]]) -> list[Event]:
    return [e for e in events(box) if (e.node, e.n) not in before]


@pytest.fixture(scope="module")
def nodes(booted: Container) -> Iterator[Container]:
    """Both instances installed, initialised on one syncdir folder with one secret, running."""
    booted.install_project(REPO)
    for instance, (node_id, region) in NODES.items():
        init = booted.run(
            "hb", "init", instance, "--store", f"syncdir://{STORE}",
            "--sync-delay-ms", str(SYNC_DELAY_MS), "--tick-ms", str(TICK_MS),
            "--lease-ttl-ms", str(LEASE_TTL_MS), "--node-id", node_id, "--region", region,
        )  # fmt: skip
        assert f"systemctl enable --now hamsterbunker@{instance}" in init.stdout
        # Under StateDirectory=: hb init asks for no ReadWritePaths= drop-in.
        assert "ReadWritePaths" not in init.stdout, init.stdout
        if instance == "sa":
            # The second node gets the first one's secret, as the README tells.
            booted.run("cp", "-p", "/etc/hamsterbunker/sa.secret", "/etc/hamsterbunker/sb.secret")
        else:
            assert "kept the existing secret" in init.stdout
    for instance in NODES:
        # Type=notify: this returns once the node has said READY=1.
        booted.run("systemctl", "enable", "--now", unit(instance), timeout=90)
    yield booted
    booted.run("systemctl", "stop", *map(unit, NODES), check=False, timeout=90)


def test_both_units_run_on_the_folder_and_their_status_names_the_role(nodes: Container) -> None:
    """Both units run; one steps, the other names it as leader; each writes its own subtree."""
    active, standby = nodes.wait_until(
        lambda: both_roles(nodes), f"an active and a standby node: {describe(nodes)}", 60
    )
    assert f"({NODES[active][1]}) · epoch " in roles(nodes, NODES)[standby]
    assert "node.online" in journal(nodes, active)
    # Events reach the store in batches: the first steps' may still be on their way.
    nodes.wait_until(
        lambda: any(e.type == "agent.step" and e.node == NODES[active][0] for e in events(nodes)),
        "the active node's steps in its event log",
        30,
    )
    # The hardened unit wrote the folder, as the unit's user, each node in its own subtree.
    owner = nodes.run("stat", "-c", "%U %a", *(f"{STORE}/nodes/{n}" for n, _ in NODES.values()))
    assert owner.stdout.split("\n")[:2] == ["hamsterbunker 700"] * 2, owner.stdout
    assert chains(nodes)[NODES[active][0]], "the active node's chain is empty"


def test_hb_status_shows_the_syncdir_section(nodes: Container) -> None:
    """`hb status --instance` inside the container: the mode, the sync delay, both subtrees."""
    active, _ = nodes.wait_until(
        lambda: both_roles(nodes), f"an active and a standby node: {describe(nodes)}", 60
    )
    text = nodes.run("hb", "status", "--instance", "sa", check=False)
    assert text.returncode == 0, text
    assert "store mode: syncdir (" in text.stdout, text.stdout
    assert f"sync delay: {SYNC_DELAY_MS} ms (as configured)" in text.stdout, text.stdout
    assert "node subtrees: sync-a, sync-b" in text.stdout, text.stdout
    assert f"    {NODES[active][0]}: epoch " in text.stdout, text.stdout  # its chain
    assert "kept aside: none reported" in text.stdout, text.stdout
    doc = json.loads(nodes.run("hb", "status", "--instance", "sb", "--json").stdout)
    syncdir = doc["syncdir"]
    assert syncdir["mode"] == "syncdir" and syncdir["sync_delay_ms"] == SYNC_DELAY_MS, syncdir
    assert syncdir["nodes"] == ["sync-a", "sync-b"], syncdir
    assert syncdir["problems"] == [] and syncdir["sync_files"] == [], syncdir
    assert syncdir["diverged"] == [], syncdir


def test_stopping_the_active_unit_hands_over_and_the_new_leader_resumes(
    nodes: Container,
) -> None:
    """systemctl stop of the active node: released; the standby takes the lease within a tick
    and has stepped within HANDOVER_BOUND_S (2.15 s) of the release, resuming from the old
    leader's last checkpoint."""
    active, standby = nodes.wait_until(
        lambda: both_roles(nodes), f"an active and a standby node: {describe(nodes)}", 60
    )
    old, new = NODES[active][0], NODES[standby][0]
    before = {(e.node, e.n) for e in events(nodes)}
    nodes.run("systemctl", "stop", unit(active), timeout=60)
    props = show(nodes, active)
    assert (props["ActiveState"], props["Result"]) == ("inactive", "success"), props

    def handover() -> tuple[Event, Event, Event, Event] | None:
        got = new_events(nodes, before)
        released = [e for e in got if e.type == "lease.released" and e.node == old]
        acquired = [e for e in got if e.type == "lease.acquired" and e.node == new]
        resumed = [e for e in got if e.type == "agent.resumed" and e.node == new]
        stepped = [e for e in got if e.type == "agent.step" and e.node == new]
        if released and acquired and resumed and stepped:
            return released[0], acquired[0], resumed[0], stepped[0]
        return None

    released, acquired, resumed, first_step = nodes.wait_until(
        handover, "the lease to be released and taken, and the agent to step again", 30
    )
    assert acquired.detail["via"] == "released"
    assert acquired.epoch == released.epoch + 1
    # The old leader's chain is final: its unit is inactive.
    last = newest_of_term(nodes, old, released.epoch)
    assert (resumed.detail["from_seq"], resumed.detail["from_epoch"]) == (last.seq, last.epoch)
    assert resumed.epoch == acquired.epoch
    assert first_step.detail["step_seq"] == last.seq + 1, (first_step, last)
    took, stepped = acquired.time - released.time, first_step.time - acquired.time
    print(f"syncdir handover: acquired {took:.3f} s after the release, first step {stepped:.3f} s "
          f"later ({took + stepped:.3f} s in all; bound {HANDOVER_BOUND_S:.2f} s)")  # fmt: skip
    assert took < TICK_S, took
    # The term took the lease: it waits the sync delay and two ticks before it steps.
    assert SETTLE_S - CLOCK_SLACK_S <= stepped < SETTLE_S + STEP_S + TICK_S, stepped
    assert first_step.time - released.time < HANDOVER_BOUND_S
    assert not any(e.type == "store.diverged" for e in events(nodes))
    nodes.run("systemctl", "start", unit(active), timeout=90)
    nodes.wait_until(
        lambda: both_roles(nodes) == (standby, active),
        f"the restarted node to rejoin as standby: {describe(nodes)}",
        60,
    )


def test_a_frozen_active_node_is_killed_by_the_watchdog_and_the_standby_takes_over(
    nodes: Container,
) -> None:
    """SIGSTOP of the active node's main PID: the standby takes the expired lease and resumes from
    the frozen node's last checkpoint; systemd's watchdog kills the frozen node and restarts it."""
    active, standby = nodes.wait_until(
        lambda: both_roles(nodes), f"an active and a standby node: {describe(nodes)}", 60
    )
    frozen_node, taker = NODES[active][0], NODES[standby][0]
    before = {(e.node, e.n) for e in events(nodes)}
    frozen = show(nodes, active)
    nodes.run("kill", "-STOP", frozen["MainPID"])
    froze = time.time()  # the container's clock is the host's: one kernel

    def takeover() -> tuple[Event, Event] | None:
        got = new_events(nodes, before)
        acquired = [e for e in got if e.type == "lease.acquired" and e.node == taker]
        resumed = [e for e in got if e.type == "agent.resumed" and e.node == taker]
        return (acquired[0], resumed[0]) if acquired and resumed else None

    # The lease, not the watchdog, moves the agent: the standby takes it once it has seen
    # no renewal for a TTL (looking every tick), well before WatchdogSec=10s fires.
    acquired, resumed = nodes.wait_until(takeover, f"{standby} to take over", 30)
    assert acquired.detail["via"] == "expired", acquired
    print(f"syncdir takeover of a frozen leader: {acquired.time - froze:.3f} s after SIGSTOP "
          f"(bound {TAKEOVER_BOUND_S:.2f} s)")  # fmt: skip
    assert acquired.time - froze < TAKEOVER_BOUND_S
    # Read while the frozen node is still stopped: its chain cannot move any more.
    last = newest_of_term(nodes, frozen_node, acquired.epoch - 1)
    assert (resumed.detail["from_seq"], resumed.detail["from_epoch"]) == (last.seq, last.epoch)

    def restarted() -> dict[str, str] | None:
        props = running(nodes, active)
        if props and int(props["NRestarts"]) >= 1 and props["MainPID"] != frozen["MainPID"]:
            return props
        return None

    # WatchdogSec=10s, then RestartSec=2s: well inside the bound.
    nodes.wait_until(restarted, f"{active} restarted by systemd: {show(nodes, active)}", 90)
    log = journal(nodes, active)
    assert "Watchdog timeout" in log, log[-2000:]
    assert "Fatal Python error: Aborted" in log, log[-2000:]
    nodes.wait_until(
        lambda: both_roles(nodes) == (standby, active),
        f"the restarted node to rejoin as standby: {describe(nodes)}",
        60,
    )
    # The frozen node never stepped while another led: nothing was kept aside.
    assert not any(e.type == "store.diverged" for e in events(nodes))
