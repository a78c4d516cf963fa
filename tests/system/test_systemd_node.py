"""Two nodes as hamsterbunker@.service instances, under a real systemd in systemd-nspawn.

Installed the way the README says (`make install-systemd`, `hb init`, the
secret copied, `systemctl enable --now`), both instances run the demo counter
on one file store. The tests run in file order on that one pair of nodes and
each leaves both units running again.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from hamsterbunker import FileStore
from hamsterbunker.records import Event

from .nspawn import Container

pytestmark = pytest.mark.system

REPO = Path(__file__).resolve().parents[2]
STORE = "/var/lib/hamsterbunker/shared"
AGENT_ID = "counter"  # the demo agent's id
TICK_S = 0.4  # hb init's default tick
NODES = {"a": ("node-a", "eu-west"), "b": ("node-b", "us-east")}


def unit(instance: str) -> str:
    return f"hamsterbunker@{instance}.service"


def show(box: Container, instance: str) -> dict[str, str]:
    """The unit's properties that the tests look at, as systemctl show gives them."""
    props = "ActiveState,SubState,StatusText,MainPID,NRestarts,Result"
    out = box.run("systemctl", "show", "-p", props, unit(instance)).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def running(box: Container, instance: str) -> dict[str, str] | None:
    props = show(box, instance)
    ok = props["ActiveState"] == "active" and props["SubState"] == "running"
    return props if ok else None


def roles(box: Container, nodes: Mapping[str, tuple[str, str]] = NODES) -> dict[str, str]:
    """instance -> StatusText, once every unit of nodes is running with a role to show."""
    found = {}
    for instance in nodes:
        props = running(box, instance)
        if props is None:
            return {}
        found[instance] = props["StatusText"]
    return found


def active_and_standby(
    box: Container, nodes: Mapping[str, tuple[str, str]] = NODES
) -> tuple[str, str] | None:
    """(active instance, standby instance) once one steps and the other names it as leader.

    nodes: instance -> (node id, region), two of them.
    """
    status = roles(box, nodes)
    first, second = nodes
    for active, standby in ((first, second), (second, first)):
        if (
            status.get(active, "").startswith("active · epoch ")
            and " · step " in status[active]
            and status[standby].startswith(f"standby · leader {nodes[active][0]} ")
        ):
            return active, standby
    return None


def events(box: Container) -> list[Event]:
    """Every event the nodes stored, read from the host side of the container's disk."""
    return FileStore(box.path(STORE), create=False).read_events(AGENT_ID)


def journal(box: Container, instance: str) -> str:
    return box.run("journalctl", "--no-pager", "-o", "cat", "-u", unit(instance)).stdout


@pytest.fixture(scope="module")
def nodes(booted: Container) -> Iterator[Container]:
    """Both instances installed, initialised with one secret, enabled and running."""
    booted.install_project(REPO)
    node_id, region = NODES["a"]
    init = booted.run(
        "hb", "init", "a", "--store", f"file://{STORE}", "--node-id", node_id, "--region", region
    )
    assert "systemctl enable --now hamsterbunker@a" in init.stdout
    # The second node gets the first one's secret, as the README tells.
    booted.run("cp", "-p", "/etc/hamsterbunker/a.secret", "/etc/hamsterbunker/b.secret")
    node_id, region = NODES["b"]
    init = booted.run(
        "hb", "init", "b", "--store", f"file://{STORE}", "--node-id", node_id, "--region", region
    )
    assert "kept the existing secret" in init.stdout
    for instance in NODES:
        # Type=notify: this returns once the node has said READY=1.
        booted.run("systemctl", "enable", "--now", unit(instance), timeout=90)
    yield booted
    booted.run("systemctl", "stop", unit("a"), unit("b"), check=False, timeout=90)


def test_both_units_run_and_their_status_names_the_role(nodes: Container) -> None:
    """Both units are active (running); one says it steps, the other names it as leader."""
    active, standby = nodes.wait_until(
        lambda: active_and_standby(nodes), f"an active and a standby node: {roles(nodes)}", 60
    )
    leader_region = NODES[active][1]
    assert f"({leader_region}) · epoch " in roles(nodes)[standby]
    assert "node.online" in journal(nodes, active)  # the node logs to the journal
    assert any(e.type == "agent.step" for e in events(nodes))


def test_the_secret_is_readable_by_no_other_user(nodes: Container) -> None:
    """Neither the secret file nor the node's credential can be read by another user."""
    credential = "/run/credentials/hamsterbunker@a.service/secret"
    assert nodes.run("test", "-s", credential, check=False).returncode == 0, "no credential"
    for user in ("nobody", "hamsterbunker"):
        denied = nodes.run("cat", "/etc/hamsterbunker/a.secret", user=user, check=False)
        assert denied.returncode != 0 and "Permission denied" in denied.stderr, (user, denied)
    denied = nodes.run("cat", credential, user="nobody", check=False)
    assert denied.returncode != 0 and "Permission denied" in denied.stderr, denied
    secret = nodes.path("/etc/hamsterbunker/a.secret")
    assert secret.stat().st_mode & 0o777 == 0o600 and secret.stat().st_uid == 0


def test_a_frozen_active_node_is_killed_by_the_watchdog_and_restarted(
    nodes: Container,
) -> None:
    """SIGSTOP of the active node's main PID: the standby takes over, systemd kills and restarts it."""
    active, standby = nodes.wait_until(
        lambda: active_and_standby(nodes), f"an active and a standby node: {roles(nodes)}", 60
    )
    frozen = show(nodes, active)
    nodes.run("kill", "-STOP", frozen["MainPID"])
    # The lease, not the watchdog, moves the agent: the standby takes over after a TTL.
    nodes.wait_until(
        lambda: (
            roles(nodes).get(standby, "").startswith("active · ")
            or show(nodes, standby)["StatusText"].startswith("active · ")
        ),
        f"{standby} to take over",
        60,
    )

    def restarted() -> dict[str, str] | None:
        props = running(nodes, active)
        if props and int(props["NRestarts"]) >= 1 and props["MainPID"] != frozen["MainPID"]:
            return props
        return None

    # WatchdogSec=10s, then RestartSec=2s: well inside the bound.
    again = nodes.wait_until(restarted, f"{active} restarted by systemd: {show(nodes, active)}", 90)
    assert int(again["NRestarts"]) >= 1
    log = journal(nodes, active)
    assert "Watchdog timeout" in log, log[-2000:]
    # SIGABRT reached the node, whose faulthandler left its stacks in the journal.
    assert "Fatal Python error: Aborted" in log, log[-2000:]
    takeover = [
        e
        for e in events(nodes)
        if e.type == "lease.acquired"
        and e.node == NODES[standby][0]
        and e.detail["via"] == "expired"
    ]
    assert takeover, "the standby's takeover was not by expiry of the frozen node's lease"
    nodes.wait_until(
        lambda: active_and_standby(nodes) == (standby, active),
        f"the restarted node to rejoin as standby: {roles(nodes)}",
        60,
    )


def test_stopping_the_active_unit_hands_over_within_a_tick(nodes: Container) -> None:
    """systemctl stop of the active node: released, and the standby holds the lease within a tick."""
    active, standby = nodes.wait_until(
        lambda: active_and_standby(nodes), f"an active and a standby node: {roles(nodes)}", 60
    )
    before = {(e.node, e.n) for e in events(nodes)}
    nodes.run("systemctl", "stop", unit(active), timeout=60)
    props = show(nodes, active)
    assert (props["ActiveState"], props["Result"]) == ("inactive", "success"), props

    def handover() -> tuple[Event, Event] | None:
        new = [e for e in events(nodes) if (e.node, e.n) not in before]
        released = [e for e in new if e.type == "lease.released" and e.node == NODES[active][0]]
        acquired = [e for e in new if e.type == "lease.acquired" and e.node == NODES[standby][0]]
        return (released[0], acquired[0]) if released and acquired else None

    released, acquired = nodes.wait_until(handover, "the lease to be released and taken", 30)
    assert acquired.detail["via"] == "released"
    assert acquired.epoch == released.epoch + 1
    # Both times come from one kernel's clock: the nodes share the container.
    assert acquired.time - released.time < TICK_S, acquired.time - released.time
    nodes.run("systemctl", "start", unit(active), timeout=90)
    nodes.wait_until(
        lambda: active_and_standby(nodes) == (standby, active),
        f"the restarted node to rejoin as standby: {roles(nodes)}",
        60,
    )
