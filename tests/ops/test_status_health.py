"""``hb status`` as a health check (issue 16, point 6): exit 0 healthy, 1 degraded, 2 cannot tell.

Real ``hb`` processes on file stores. Whether the lease is live is watched from
here (the record changing on our own clock), so a cluster whose every node was
SIGKILLed reads as expired within one TTL, however fresh its last heartbeat.
Planted records test the resolution of the store and agents (``--instance``,
``$HB_STORE``, no ``--agent-id``) and the verdict's other reasons.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import pytest

from hamsterbunker import FileStore
from hamsterbunker.records import Event, Heartbeat, LeaseRecord
from hamsterbunker.stores.layer.keys import CLUSTER
from tests.support.cli import AGENT, AGENT_ID, FAST, HB, SECRET, hb_env, run_hb, wait_for
from tests.support.raw_store import file_key

pytestmark = pytest.mark.multiprocess


@contextmanager
def nodes(store: Path, log: Path, *ids: str) -> Iterator[list[subprocess.Popen[bytes]]]:
    """``hb run`` nodes of the counter on store, killed on the way out if still running."""
    started = []
    with log.open("ab") as out:
        for node in ids:
            command = [*HB, "run", "--store", store.as_uri(), "--agent", AGENT,
                       "--node-id", node, "--region", "test", "--create-store", *FAST]  # fmt: skip
            env = hb_env(HB_SECRET=SECRET)
            started.append(
                subprocess.Popen(
                    command, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT
                )
            )
    try:
        yield started
    finally:
        for process in started:
            if process.poll() is None:
                process.kill()
            process.wait(timeout=10)


def status(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return run_hb(["status", *args], env=env)


def leading(store: Path) -> str | None:
    """The holder once a node holds the lease (the store made by then), else None."""
    if not file_key(store, CLUSTER).exists():
        return None
    lease = FileStore(store).read_lease(AGENT_ID)
    return lease.holder if lease is not None else None


def test_a_running_node_is_healthy_and_every_node_killed_is_degraded(tmp_path: Path) -> None:
    """Two nodes: exit 0, the lease live as seen from here. Both SIGKILLed: their records
    still name a holder, but the lease stands still, so within a TTL: exit 1, expired."""
    store, log = tmp_path / "store", tmp_path / "nodes.log"
    args = ["--store", store.as_uri(), "--agent-id", AGENT_ID]
    with nodes(store, log, "n1", "n2") as running:
        holder = wait_for("a node to lead", lambda: leading(store), 30)
        healthy = status(*args)
        assert healthy.returncode == 0, healthy.stdout + healthy.stderr + log.read_text()
        assert re.search(r"^health: healthy$", healthy.stdout, re.M), healthy.stdout
        live = re.compile(
            r"^lease is live: changed \d+\.\d s ago, as seen from here · \d+ renewals this term,"
            r" \d+ acquisitions so far$",
            re.M,
        )
        assert live.search(healthy.stdout), healthy.stdout
        as_json = json.loads(status(*args, "--json").stdout)
        assert as_json["health"] == "healthy" and as_json["exit_code"] == 0
        assert as_json["liveness"]["state"] == "live" and as_json["problems"] == []
        assert as_json["lease"]["holder"] == holder  # the fields kept from before
        seqs = {n["node"]: n["seq"] for n in as_json["nodes"]}
        assert set(seqs) == {"n1", "n2"}, as_json
        for process in running:
            process.send_signal(signal.SIGKILL)
            process.wait(timeout=10)

    started = time.monotonic()
    dead = status(*args)
    took = time.monotonic() - started
    assert dead.returncode == 1, dead.stdout + dead.stderr
    assert f"lease: {holder} (test)" in dead.stdout, dead.stdout  # the record still names it
    assert re.search(r"^health: degraded\n  no live leader: the lease is expired$", dead.stdout,
                     re.M), dead.stdout  # fmt: skip
    assert re.search(r"^lease is expired: unchanged for \d+\.\d s, as seen from here \(TTL 0\.6 s\)",
                     dead.stdout, re.M), dead.stdout  # fmt: skip
    assert took < 10, took  # one TTL (0.6 s) of watching, plus starting Python
    as_json = json.loads(status(*args, "--json").stdout)
    assert as_json["liveness"]["state"] == "expired" and as_json["exit_code"] == 1


def planted(root: Path, *agents: str, ttl_ms: int = 60_000) -> Path:
    """A store with a held lease and an active heartbeat for each agent (nobody renews)."""
    store = FileStore(root)
    for agent in agents:
        store.cas_lease(agent, None, LeaseRecord("n1", "eu", "s1", epoch=1, ttl_ms=ttl_ms))
        store.put_heartbeat(agent, beat("n1"))
    return root


def beat(node: str, **fields: object) -> Heartbeat:
    base = dict(node=node, region="eu", host="h", pid=7, role="active", epoch=1, seq=3,
                leader="n1", time=time.time(), beats=1)  # fmt: skip
    return Heartbeat(**{**base, **fields})  # type: ignore[arg-type]


def test_a_mistyped_agent_id_is_an_error_naming_the_agents_held(tmp_path: Path) -> None:
    store = planted(tmp_path / "store", "counter", "mailer")
    typo = status("--store", store.as_uri(), "--agent-id", "countr")
    assert typo.returncode == 2, typo.stdout + typo.stderr
    assert typo.stderr.splitlines() == [
        f"hb status: error: store {store.as_uri()} holds no records of agent 'countr'; "
        "it holds: counter, mailer"
    ]
    assert typo.stdout == ""
    assert not file_key(store, "agents/countr").exists()  # reading made nothing
    empty = tmp_path / "empty"
    empty.mkdir()
    none = status("--store", empty.as_uri(), "--agent-id", "counter")
    assert none.returncode == 2 and "it holds no agents" in none.stderr, none.stderr


def test_the_store_from_hb_store_and_one_line_per_agent_without_agent_id(tmp_path: Path) -> None:
    """$HB_STORE names the store; without --agent-id, two agents give one line each, and a
    lease nobody renews (TTL 300 ms here) is expired: exit 1."""
    store = planted(tmp_path / "store", "counter", "mailer", ttl_ms=300)
    listed = status(env=hb_env(HB_STORE=store.as_uri()))
    assert listed.returncode == 1, listed.stdout + listed.stderr
    lines = listed.stdout.splitlines()
    assert lines[0] == f"store {store.as_uri()} · 2 agents", listed.stdout
    assert re.fullmatch(r"AGENT\s+LEADER\s+LEASE\s+HEALTH", lines[1]), listed.stdout
    for agent, line in zip(["counter", "mailer"], lines[2:], strict=True):
        assert re.fullmatch(rf"{agent}\s+n1\s+expired\s+no live leader \(lease expired\)", line)
    as_json = json.loads(status("--json", env=hb_env(HB_STORE=store.as_uri())).stdout)
    assert [a["agent"] for a in as_json["agents"]] == ["counter", "mailer"]
    assert {a["liveness"]["state"] for a in as_json["agents"]} == {"expired"}
    # Neither --store nor $HB_STORE: one line, exit 2.
    missing = status()
    assert missing.returncode == 2
    assert missing.stderr.splitlines() == [
        "hb status: error: --store is required (or set HB_STORE, or use --instance NAME)"
    ]


def test_instance_takes_the_store_and_agent_from_its_config(tmp_path: Path) -> None:
    """--instance NAME reads NAME.toml as hb run does; one agent in the store is shown in full."""
    store = planted(tmp_path / "store", "counter")
    config = tmp_path / "etc"
    config.mkdir()
    (config / "prod.toml").write_text(f'store = "{store.as_uri()}"\nagent = "{AGENT}"\n')
    env = hb_env(CONFIGURATION_DIRECTORY=str(config))
    shown = status("--instance", "prod", "--observe-ms", "0", env=env)
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert shown.stdout.startswith(f"agent counter · store {store.as_uri()}\n"), shown.stdout
    assert "lease is not watched (--observe-ms 0) · " in shown.stdout, shown.stdout
    clash = status("--instance", "prod", "--store", store.as_uri(), env=env)
    assert clash.returncode == 2 and "--instance" in clash.stderr, clash.stderr
    absent = status("--instance", "nope", env=env)
    assert absent.returncode == 2, absent.stderr
    assert len(absent.stderr.splitlines()) == 1 and "nope.toml" in absent.stderr


def test_a_refusing_or_failing_node_is_degraded(tmp_path: Path) -> None:
    """A node whose newest event is store.regressed refuses; an active node's failing steps
    (when its heartbeat tells them) degrade too. Each is named."""
    store = planted(tmp_path / "store", "counter")
    fs = FileStore(store)
    fs.append_event("counter", Event(node="n2", n=1, type="store.regressed", time=time.time(),
                                     detail={"reason": "checkpoint 9 is gone"}))  # fmt: skip
    args = ["--store", store.as_uri(), "--agent-id", "counter", "--observe-ms", "0"]
    shown = status(*args)
    assert shown.returncode == 1, shown.stdout + shown.stderr
    assert re.search(r"^  n2 refuses \(store\.regressed\)$", shown.stdout, re.M), shown.stdout
    assert re.search(r"^refusing: n2 \(store\.regressed, .+ ago\): checkpoint 9 is gone$",
                     shown.stdout, re.M), shown.stdout  # fmt: skip
    # A later event: the node went on (after hb accept-loss), no longer refusing.
    fs.append_event("counter", Event(node="n2", n=2, type="node.standby", time=time.time()))
    assert status(*args).returncode == 0

    if "failing" not in Heartbeat.__dataclass_fields__:
        pytest.skip("heartbeats do not tell failing steps yet")
    fs.put_heartbeat("counter", beat("n1", failing=4, failing_error="HTTP 500"))
    failing = status(*args)
    assert failing.returncode == 1, failing.stdout
    assert re.search(r"^  n1 is failing: 4 steps in a row$", failing.stdout, re.M), failing.stdout


def test_watch_refreshes_until_count(tmp_path: Path) -> None:
    """--watch prints a fresh status every tick; --count N stops it after N (the exit code
    is the last one's). Against a running node: healthy each time."""
    store, log = tmp_path / "store", tmp_path / "node.log"
    with nodes(store, log, "n1"):
        wait_for("the node to lead", lambda: leading(store), 30)
        args = ["--store", store.as_uri(), "--agent-id", AGENT_ID, "--watch", "--count", "3"]
        watched = status(*args)
    assert watched.returncode == 0, watched.stdout + watched.stderr
    assert watched.stdout.count("health: healthy") == 3, watched.stdout
    assert watched.stdout.count(f"agent {AGENT_ID} · store") == 3, watched.stdout
    as_json = status("--store", store.as_uri(), "--agent-id", AGENT_ID, "--watch", "--count", "2",
                     "--json", "--observe-ms", "0")  # fmt: skip
    assert as_json.returncode == 0, as_json.stderr
    assert as_json.stdout.count('"health": "healthy"') == 2, as_json.stdout


class FakeClock:
    """A monotonic clock that moves only when the observer sleeps."""

    def __init__(self) -> None:
        self.now = 100.0
        self.on_sleep: list[object] = []

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        for hook in self.on_sleep:
            hook()  # type: ignore[operator]


def test_the_observer_judges_on_its_own_clock_only() -> None:
    """Live once the record changed and not a full TTL ago; expired after a full TTL of no
    change; unknown when the TTL is longer than the watching may last. Never a wall clock."""
    from hamsterbunker.lease.observe import MAX_WATCH_S, LeaseObserver
    from hamsterbunker.testing import MemoryStore

    store, clock = MemoryStore(), FakeClock()
    held = store.cas_lease("a", None, LeaseRecord("n1", "eu", "s1", epoch=1, ttl_ms=1000))
    observer = LeaseObserver(store, clock=lambda: clock.now, sleep=clock.sleep)

    def renew() -> None:
        nonlocal held
        if clock.now >= 100.3 and held.renewals == 0:
            held = store.cas_lease("a", held.version, replace(held, renewals=1))

    clock.on_sleep.append(renew)
    seen = observer.observe(["a"])["a"].liveness
    assert (seen.state, seen.changes) == ("live", 1)
    assert 100.3 <= clock.now < 100.5  # stopped at the first change seen
    clock.on_sleep.clear()
    seen = observer.observe(["a"])["a"].liveness  # remembered: no wait needed
    assert seen.state == "live" and seen.changed_s_ago is not None and seen.changed_s_ago < 0.3
    for _ in range(5):  # time passes between refreshes (hb status --watch)
        clock.now += 0.25
        seen = observer.observe(["a"])["a"].liveness
    assert seen.state == "expired" and seen.changed_s_ago is not None
    assert seen.changed_s_ago >= 1.0

    long = store.cas_lease("b", None, LeaseRecord("n1", "eu", "s1", epoch=1, ttl_ms=600_000))
    started = clock.now
    assert observer.observe(["b"])["b"].liveness.state == "unknown"
    assert MAX_WATCH_S <= clock.now - started < MAX_WATCH_S + 1
    assert long.holder == "n1"


@pytest.mark.parametrize("args", [[], ["--json"]])
def test_a_reader_gone_ends_hb_status_quietly(tmp_path: Path, args: list[str]) -> None:
    """`hb status | head -c 0`: the reader is gone before hb writes a byte; hb ends as a
    command a SIGPIPE ends (141 in a shell), with nothing on stderr: no traceback."""
    store = planted(tmp_path / "store", "counter", "mailer")
    command = [*HB, "status", "--store", store.as_uri(), "--observe-ms", "0", *args]
    process = subprocess.Popen(command, env=hb_env(), stdin=subprocess.DEVNULL,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    assert process.stdout is not None and process.stderr is not None
    process.stdout.close()  # no reader left
    stderr = process.stderr.read()
    assert process.wait(timeout=30) == 141, stderr
    assert stderr == b""


def test_a_killed_leader_whose_heartbeat_is_still_fresh_is_superseded_not_active(
    tmp_path: Path,
) -> None:
    """n1 led epoch 1 and was killed; n2 took the lease at epoch 2. n1's heartbeat is still
    fresh, but a node below the lease's epoch is not active: one active row, n2's."""
    store = FileStore(tmp_path / "store")
    first = store.cas_lease("counter", None, LeaseRecord("n1", "eu", "s1", epoch=1, ttl_ms=60_000))
    store.cas_lease("counter", first.version, LeaseRecord("n2", "eu", "s2", epoch=2, ttl_ms=60_000))
    store.put_heartbeat("counter", beat("n1", role="active", epoch=1))
    store.put_heartbeat("counter", beat("n2", role="active", epoch=2, leader="n2"))
    shown = status("--store", (tmp_path / "store").as_uri(), "--agent-id", "counter",
                   "--observe-ms", "0")  # fmt: skip
    assert shown.returncode == 0, shown.stdout + shown.stderr
    roles = {line.split()[0]: line.split()[2] for line in shown.stdout.splitlines()
             if line.startswith(("  n1", "  n2"))}  # fmt: skip
    assert roles == {"n1": "superseded", "n2": "active"}, shown.stdout
