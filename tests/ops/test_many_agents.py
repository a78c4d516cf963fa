"""One node process keeping several agents (``[[agents]]`` in the config; issue 18).

Each agent's lease is its own: killing a process fails all its agents over,
a SIGTERM hands them over, and a failing agent does not disturb the others.
Real ``hb run`` processes on every backend; each agent's history is held to
the checker.
"""

from __future__ import annotations

import asyncio
import re
import signal
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import tomli_w

from hamsterbunker.core.clock import FakeClock
from hamsterbunker.core.errors import ConfigError
from hamsterbunker.core.history import read_history
from hamsterbunker.core.timing import LeaseTiming
from hamsterbunker.node.balance import MAX_READS_PER_ROUND, Balancer
from hamsterbunker.node.host import Host, HostNotifier
from hamsterbunker.node.notify import Notifier
from hamsterbunker.ops.checker import check
from hamsterbunker.ops.config import HostedAgent, parse_config
from hamsterbunker.records import Heartbeat
from hamsterbunker.runtime import Runtime
from hamsterbunker.stores import Store, open_store
from hamsterbunker.testing import MemoryStore
from tests.support import wait_until
from tests.support.agents import SECRET, SyncAgent
from tests.support.cli import HB, hb_env, run_hb
from tests.support.etcd_server import etcd_url
from tests.support.redis_server import redis_url

SUPPORT_DIR = Path(__file__).resolve().parent.parent / "support"
TIMING = LeaseTiming(tick_ms=100, lease_ttl_ms=800)
AGENTS = ("fleet-1", "fleet-2", "fleet-3", "fleet-4", "fleet-5")
NODES = ("host-a", "host-b", "host-c")


# -- the config ---------------------------------------------------------------------


def test_agents_in_the_config_are_each_an_agent_and_its_id() -> None:
    config = parse_config(
        {"store": "file:///s", "agents": [{"agent": "m:A", "agent_id": "one"}, {"agent": "m:B"}]},
        Path("fleet.toml"),
    )
    assert config.hosted() == (HostedAgent("m:A", "one"), HostedAgent("m:B"))
    single = parse_config({"store": "file:///s", "agent": "m:A"}, Path("one.toml"))
    assert single.hosted() == (HostedAgent("m:A", None),)
    assert "agents" not in single.to_toml_dict()
    assert config.to_toml_dict()["agents"] == [{"agent": "m:A", "agent_id": "one"},
                                               {"agent": "m:B"}]  # fmt: skip


@pytest.mark.parametrize(
    ("document", "says"),
    [
        ({"agents": []}, "1 to 1000 agents"),
        ({"agents": ["m:A"]}, "entry 1 must be a table"),
        ({"agents": [{"agent_id": "x"}]}, "entry 1: key 'agent' is missing"),
        ({"agents": [{"agent": "m:A", "region": "x"}]}, "unknown key 'region'"),
        ({"agents": [{"agent": 7}]}, "key 'agent' must be a string"),
        ({"agents": [{"agent": "m:A", "agent_id": "no way"}]}, "key 'agent_id'"),
        ({"agents": [{"agent": "m:A", "agent_id": "x"}, {"agent": "m:B", "agent_id": "x"}]},
         "agent id 'x' is in [[agents]] twice"),
        ({"agent": "m:A", "agents": [{"agent": "m:B"}]}, "'agent' cannot be given beside"),
        ({"agents": {"agent": "m:A"}}, "key 'agents' must be an array"),
        ({}, "key 'agent' is missing"),
    ],
)  # fmt: skip
def test_a_wrong_agents_list_is_refused_naming_the_problem(
    document: dict[str, Any], says: str
) -> None:
    with pytest.raises(ConfigError, match=re.escape(says)):
        parse_config({"store": "file:///s", **document}, Path("fleet.toml"))


def write_instance(directory: Path, name: str, **keys: Any) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{name}.toml").write_text(tomli_w.dumps(keys))


def test_hb_run_refuses_http_with_several_agents(tmp_path: Path) -> None:
    agents = [{"agent": "hamsterbunker.demo:CounterAgent", "agent_id": a} for a in AGENTS[:2]]
    write_instance(tmp_path, "fleet", store=(tmp_path / "store").as_uri(), agents=agents,
                   http="127.0.0.1:9999")  # fmt: skip
    env = hb_env(HB_SECRET=SECRET, CONFIGURATION_DIRECTORY=str(tmp_path))
    done = run_hb(["run", "--instance", "fleet"], env=env)
    assert done.returncode == 2, done.stderr
    assert "http cannot be set with several [[agents]]" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "store").exists()  # refused before anything was written


# -- several agents per process, real processes, every backend ----------------------


class Fleet:
    """Three `hb run --instance` processes, each keeping the same five agents."""

    def __init__(self, tmp_path: Path, url: str) -> None:
        self.tmp_path, self.url = tmp_path, url
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self.store = open_store(url)

    def start(self, node: str) -> None:
        config_dir = self.tmp_path / f"config-{node}"
        agents = [{"agent": "hb_test_agents:JournalCounter", "agent_id": a} for a in AGENTS]
        write_instance(config_dir, "fleet", store=self.url, node_id=node, region=f"r-{node}",
                       tick_ms=TIMING.tick_ms, lease_ttl_ms=TIMING.lease_ttl_ms,
                       agents=agents)  # fmt: skip
        env = hb_env(
            HB_SECRET=SECRET,
            CONFIGURATION_DIRECTORY=str(config_dir),
            PYTHONPATH=str(SUPPORT_DIR),
            HB_TEST_STEP_S="0.02",
        )
        history = self.tmp_path / f"history-{node}"
        with open(self.tmp_path / f"{node}.log", "ab") as log:
            self.processes[node] = subprocess.Popen(
                [*HB, "run", "--instance", "fleet", "--history", str(history), "--create-store"],
                env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
            )  # fmt: skip

    def leaders(self) -> dict[str, str | None]:
        found = {}
        for agent in AGENTS:
            lease = self.store.read_lease(agent)
            found[agent] = None if lease is None else lease.holder
        return found

    def seq(self, agent: str) -> int:
        return max((i.seq for i in self.store.list_checkpoints(agent)), default=0)

    def active_heartbeats(self, agent: str) -> list[str]:
        return [b.node for b in self.store.list_heartbeats(agent) if b.role == "active"]

    def log(self, node: str) -> str:
        path = self.tmp_path / f"{node}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                process.terminate()
        for process in self.processes.values():
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)
        self.store.close()

    def violations(self) -> list[str]:
        found = []
        for agent in AGENTS:
            files = [self.tmp_path / f"history-{node}.{agent}" for node in NODES]
            ops = [op for path in files if path.exists() for op in read_history(path)]
            found += [f"{agent}: {v}" for v in check(ops)]
        return found


@pytest.fixture(params=["file", "redis", "etcd"])
def fleet(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Fleet]:
    url = {"file": lambda: (tmp_path / "store").as_uri(), "redis": redis_url, "etcd": etcd_url}
    made = Fleet(tmp_path, url[request.param]())
    try:
        yield made
    finally:
        made.stop()
        for node in made.processes:  # shown by pytest only when the test failed
            print(f"----- log of {node} -----\n{made.log(node)}")
    assert made.violations() == []


def led_by_live_nodes(fleet: Fleet, live: set[str]) -> bool:
    return all(holder in live for holder in fleet.leaders().values())


@pytest.mark.multiprocess
def test_one_process_keeps_several_agents_and_its_death_fails_them_all_over(fleet: Fleet) -> None:
    for node in NODES:
        fleet.start(node)
    wait_until(lambda: led_by_live_nodes(fleet, set(NODES)), "every agent to have a leader", 60)
    # Each log line names the agent beside the node.
    wait_until(lambda: "host-a/fleet-1 node.online" in fleet.log("host-a"), "host-a's log")
    wait_until(lambda: all(fleet.seq(a) >= 2 for a in AGENTS), "every agent to step", 30)
    # Exactly one node is active for each agent, whichever process it runs in.
    wait_until(lambda: all(len(fleet.active_heartbeats(a)) == 1 for a in AGENTS),
               "one active heartbeat per agent")  # fmt: skip

    leaders = fleet.leaders()
    victim = max(NODES, key=lambda node: list(leaders.values()).count(node))
    stood = {agent: fleet.seq(agent) for agent in AGENTS}
    fleet.processes[victim].kill()
    fleet.processes[victim].wait(timeout=10)
    # Read once the victim is dead: its balancer may have handed one on just before the kill.
    orphaned = [agent for agent, holder in fleet.leaders().items() if holder == victim]
    assert orphaned, leaders

    survivors = set(NODES) - {victim}
    wait_until(lambda: led_by_live_nodes(fleet, survivors), "the survivors to lead every agent", 30)
    wait_until(lambda: all(fleet.seq(a) >= stood[a] + 2 for a in AGENTS),
               "every agent to step on", 30)  # fmt: skip
    for agent in orphaned:  # taken from the dead host by expiry (a balancer may move it on)
        lease = fleet.store.read_lease(agent)
        assert lease is not None, agent
        assert [t.via for t in lease.history if t.from_ == victim][-1:] == ["expired"], lease

    # A SIGTERM hands every agent of the process over at once (released, not expired).
    leaders = fleet.leaders()
    stopping = max(survivors, key=lambda node: list(leaders.values()).count(node))
    handed = [agent for agent, holder in leaders.items() if holder == stopping]
    fleet.processes[stopping].send_signal(signal.SIGTERM)
    assert fleet.processes[stopping].wait(timeout=30) == 0, fleet.log(stopping)
    last = (survivors - {stopping}).pop()
    wait_until(lambda: led_by_live_nodes(fleet, {last}), f"{last} to lead every agent", 30)
    for agent in handed:
        lease = fleet.store.read_lease(agent)
        # Handed over, never left to expire: released by the stop, or switched over by
        # the stopping host's balancer just before (it spreads leases on its own).
        assert lease is not None, agent
        from_stopping = [t.via for t in lease.history if t.from_ == stopping]
        assert from_stopping and from_stopping[-1] in ("released", "switchover"), lease


@pytest.mark.multiprocess
def test_hosts_spread_the_leases_evenly_by_switchover(fleet: Fleet) -> None:
    """One host takes every lease; the two that join get theirs handed over (via=switchover,
    no TTL waited), until no host leads two more than another."""
    fleet.start("host-a")
    wait_until(lambda: led_by_live_nodes(fleet, {"host-a"}), "host-a to lead every agent", 60)
    fleet.start("host-b")
    fleet.start("host-c")

    def spread() -> list[int]:
        holders = list(fleet.leaders().values())
        return sorted(holders.count(node) for node in NODES)

    wait_until(lambda: spread() == [1, 2, 2], "the leases to spread", 60)
    for agent, holder in fleet.leaders().items():
        lease = fleet.store.read_lease(agent)
        assert lease is not None
        if holder != "host-a":
            # Handed over by a balancer, never left to expire: by host-a, or by a host that
            # led some already as the other joined (a loaded machine starts the two apart).
            assert lease.history[-1].via == "switchover", lease.history
    assert "by=balance" in fleet.log("host-a")


# -- a failing agent beside a healthy one, in one host (in this process) --------------


class RaisingAgent(SyncAgent):
    def step(self, state: dict[str, Any]) -> dict[str, Any]:
        raise RuntimeError("the API said 500")


def test_a_failing_agent_does_not_disturb_the_other_agents_of_its_host(tmp_path: Path) -> None:
    store: Store = open_store((tmp_path / "store").as_uri())
    gathered = HostNotifier(Notifier(None), ["healthy", "failing"])
    runtimes = [
        Runtime(node_id="solo", region="r", store=store, agent=agent, agent_id=agent_id,
                secret=SECRET, timing=TIMING, notifier=gathered.for_agent(agent_id))
        for agent_id, agent in (("healthy", SyncAgent()), ("failing", RaisingAgent()))
    ]  # fmt: skip
    host = Host(runtimes, gathered)
    errors: list[BaseException] = []

    def serve() -> None:
        try:
            asyncio.run(host.serve())
        except BaseException as exc:  # reported by the test
            errors.append(exc)

    thread = threading.Thread(target=serve, name="host")
    thread.start()
    try:
        healthy, failing = runtimes
        wait_until(lambda: failing.standing.failing[0] >= 3, "the failing agent to fail 3 times")
        seq = healthy.seq
        wait_until(lambda: healthy.seq >= seq + 5, "the healthy agent to step on meanwhile")
        lease = store.read_lease("healthy")
        assert lease is not None and lease.holder == "solo" and lease.epoch == 1
    finally:
        host.request_stop()
        thread.join(30)
    assert not thread.is_alive(), "the host did not stop"
    assert errors == []
    store.close()


def test_a_host_refuses_an_agent_id_given_twice(tmp_path: Path) -> None:
    store = open_store((tmp_path / "store").as_uri())
    gathered = HostNotifier(Notifier(None), ["same", "same"])
    runtimes = [Runtime(node_id="solo", region="r", store=store, agent=SyncAgent(),
                        agent_id="same", secret=SECRET) for _ in range(2)]  # fmt: skip
    with pytest.raises(ConfigError, match="'same' is given twice"):
        Host(runtimes, gathered)
    store.close()


def test_the_host_tells_systemd_ready_and_pings_only_when_every_agent_did() -> None:
    sent: list[str] = []

    class Recording(Notifier):
        def __init__(self) -> None:
            super().__init__(None, 2_000_000)

        def _send(self, message: str) -> None:
            sent.append(message)

    gathered = HostNotifier(Recording(), ["a", "b"])
    a, b = gathered.for_agent("a"), gathered.for_agent("b")
    a.ready()
    assert "READY=1" not in sent
    b.ready()
    assert sent.count("READY=1") == 1
    a.watchdog()
    a.watchdog()
    assert "WATCHDOG=1" not in sent  # b's lease loop has not pinged: withheld
    b.watchdog()
    assert sent.count("WATCHDOG=1") == 1
    a.status("leading")
    b.status("standby")
    assert sent[-1] == "STATUS=a: leading; b: standby"
    gathered.ended("b")  # b's node stopped: a alone is waited for now
    a.watchdog()
    assert sent.count("WATCHDOG=1") == 2


# -- the balancer's choices, against a memory store --------------------------------------


class LeadingRuntime:
    """What the Balancer asks of a Runtime: whether it leads, and to hand over."""

    def __init__(self, agent_id: str) -> None:
        self.agent_id = agent_id
        self.leading = True
        self.handed_to: list[str] = []

    def hand_over_to(self, target: str, beats: list[Heartbeat]) -> bool:
        self.handed_to.append(target)
        self.leading = False
        return True


def beat(node: str, beats: int, leads: int, role: str = "standby") -> Heartbeat:
    return Heartbeat(node, "r", "h", 1, role, 1, 1, "a", 0.0, beats=beats,
                     lease_session="00ff", host_leads=leads, host_agents=4)  # fmt: skip


def test_the_balancer_hands_over_only_to_live_standbys_that_lead_two_fewer() -> None:
    store = MemoryStore()
    clock = FakeClock()
    runtimes = [LeadingRuntime(f"agent-{n}") for n in range(4)]
    balancer = Balancer(runtimes, store, clock, period_s=1.0)  # type: ignore[arg-type]

    def beats(n: int, b_leads: int, c_beats: int) -> None:
        for runtime in runtimes:
            store.put_heartbeat(runtime.agent_id, beat("b", n, b_leads))
            store.put_heartbeat(runtime.agent_id, beat("c", c_beats, 0))  # stands still

    beats(1, 0, 1)
    assert asyncio.run(balancer.round()) == 0  # first sight: nobody known to be live yet
    clock.advance(1.0)
    beats(2, 0, 1)
    assert asyncio.run(balancer.round()) == 2  # b leads 0: two agents go to it (4 → 2, 0 → 2)
    assert [r.handed_to for r in runtimes] == [["b"], ["b"], [], []]
    assert balancer.load() == (2, 4)
    clock.advance(1.0)
    beats(3, 2, 1)
    assert asyncio.run(balancer.round()) == 0  # even now; c never moved: never a target
    clock.advance(3.0)
    beats(4, 0, 1)
    assert asyncio.run(balancer.round()) == 0  # b's last sight is too old to call it live


def test_a_balancing_round_reads_a_bounded_number_of_heartbeat_lists() -> None:
    """A host leading many agents: a round reads at most MAX_READS_PER_ROUND lists (a list
    a round once even), so rounds stay short however many agents it keeps."""
    store = MemoryStore()
    reads: list[str] = []
    listing = store.list_heartbeats

    def counted(agent: str) -> list[Heartbeat]:
        reads.append(agent)
        return listing(agent)

    store.list_heartbeats = counted  # type: ignore[method-assign]
    clock = FakeClock()
    runtimes = [LeadingRuntime(f"agent-{n}") for n in range(60)]
    balancer = Balancer(runtimes, store, clock, period_s=1.0)  # type: ignore[arg-type]
    for n in (1, 2):
        for runtime in runtimes:  # b is live and leads all it can take; c stands still
            store.put_heartbeat(runtime.agent_id, beat("b", n, 0, role="active"))
            store.put_heartbeat(runtime.agent_id, beat("c", 1, 0))
        reads.clear()
        assert asyncio.run(balancer.round()) == 0
        assert len(reads) == MAX_READS_PER_ROUND
        clock.advance(1.0)
