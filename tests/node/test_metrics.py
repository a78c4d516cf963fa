"""A node's metrics and HTTP endpoints, in-process (``Runtime(http=...)``, ``NodeMetrics``,
``NodeProbes``).

Nodes are real ``Runtime`` objects on one ``MemoryStore``, each serving on a
port of its own (port 0: the kernel picks); the numbers are read back over
HTTP and parsed with prometheus_client's own parser. The probes' judgement of
a lease is checked on a fake clock. Every wait is bounded and on a condition.
"""

from __future__ import annotations

import contextlib
import json
import math
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from hamsterbunker.core.clock import FakeClock
from hamsterbunker.core.errors import ConfigError
from hamsterbunker.core.http_address import HttpAddress, parse_http_address
from hamsterbunker.core.timing import LeaseTiming
from hamsterbunker.lease import LeaseKeeper
from hamsterbunker.node import endpoints as endpoints_module
from hamsterbunker.node.endpoints import Endpoints
from hamsterbunker.node.metrics import NodeMetrics
from hamsterbunker.node.probes import NodeProbes
from hamsterbunker.node.state import Identity, Standing
from hamsterbunker.records import LeaseRecord
from hamsterbunker.runtime import Runtime
from hamsterbunker.testing import MemoryStore
from tests.support import wait_until
from tests.support.agents import AGENT, SECRET, AsyncAgent, Recorder

TIMING = LeaseTiming(tick_ms=100, lease_ttl_ms=600)
LOOPBACK = HttpAddress("127.0.0.1", 0)

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def scrape(port: int) -> Samples:
    code, text = get(port, "/metrics")
    assert code == 200
    return parsed(text)


def parsed(text: str) -> Samples:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(f"hamsterbunker_{name}", tuple(sorted(labels.items())))]


@pytest.fixture
def nodes() -> Iterator[list[Runtime]]:
    started: list[Runtime] = []
    yield started
    for node in started:
        with contextlib.suppress(ConfigError):  # the node that could not bind
            node.stop(timeout=10)


def start(nodes: list[Runtime], store: MemoryStore, node_id: str, **kwargs: object) -> Runtime:
    node = Runtime(
        node_id=node_id, region="eu", store=store, agent=kwargs.pop("agent", AsyncAgent()),
        secret=SECRET, timing=TIMING, http=LOOPBACK, **kwargs,  # type: ignore[arg-type]
    )  # fmt: skip
    nodes.append(node)
    node.start()
    assert node.ready.wait(15)
    return node


def test_leader_and_standby_each_serve_their_own_numbers_and_a_handover_moves_them(
    nodes: list[Runtime],
) -> None:
    """Two nodes in one process, one registry each: the leader counts its steps, failures,
    publishes and renewals; the standby counts none; after a graceful stop the standby's
    takeovers{via="released"} and epoch rise, and the stopped node's port is closed."""
    store, events = MemoryStore(), Recorder()
    a = start(nodes, store, "a", agent=AsyncAgent(fail_once=(3,)), on_event=events)
    events.wait("agent.step", "a")
    b = start(nodes, store, "b", on_event=events)
    events.wait("node.standby", "b")
    assert a.endpoints is not None and b.endpoints is not None
    pa, pb = a.endpoints.port, b.endpoints.port
    wait_until(lambda: value(scrape(pa), "steps_total") >= 5, "five steps counted")

    leader, standby = scrape(pa), scrape(pb)
    assert value(leader, "is_leader") == 1 and value(standby, "is_leader") == 0
    assert value(leader, "epoch") == value(standby, "epoch") == 1
    assert value(leader, "takeovers_total", via="empty") == 1
    assert value(standby, "takeovers_total", via="empty") == 0
    assert value(leader, "step_failures_total") == 1  # step 3 failed once
    assert value(leader, "step_seconds_count") >= value(leader, "steps_total") + 1
    assert value(leader, "publish_seconds_count") >= 5
    assert value(leader, "checkpoints_total") >= 5
    assert value(leader, "checkpoint_bytes") > 0
    assert value(leader, "renewal_seconds_count") > 0
    assert 0 <= value(leader, "seconds_since_renewal") < TIMING.renew_deadline_s
    assert math.isnan(value(standby, "seconds_since_renewal"))
    assert value(standby, "steps_total") == 0 and value(standby, "step_seconds_count") == 0
    assert value(leader, "node_info", node="a", region="eu", agent=AGENT) == 1
    assert get(pa, "/leader")[0] == 200 and get(pb, "/leader")[0] == 503
    assert get(pa, "/health") == (200, "leader · epoch 1\n")
    assert get(pb, "/health") == (200, "standby · leader a · epoch 1\n")

    a.stop(timeout=10)
    events.wait("lease.acquired", "b")
    after = scrape(pb)
    assert value(after, "takeovers_total", via="released") == 1
    assert value(after, "epoch") == 2 and value(after, "is_leader") == 1
    assert get(pb, "/leader") == (200, "leader b · epoch 2\n")
    with pytest.raises(OSError):  # closed with its node
        socket.create_connection(("127.0.0.1", pa), timeout=5).close()


def test_metrics_count_without_http_when_asked_and_are_not_loaded_otherwise(
    nodes: list[Runtime],
) -> None:
    """Runtime(metrics=True) counts into node.metrics.registry with nothing served; a node
    with neither metrics nor http has none and never loads prometheus_client (some 5 MB of
    every standby's memory)."""
    store = MemoryStore()
    counted = Runtime(node_id="a", region="eu", store=store, agent=AsyncAgent(), secret=SECRET,
                      timing=TIMING, metrics=True)  # type: ignore[arg-type]  # fmt: skip
    nodes.append(counted)
    counted.start()
    assert counted.endpoints is None and counted.metrics is not None
    registry = counted.metrics.registry
    wait_until(
        lambda: value(parsed(generate_latest(registry).decode()), "steps_total") >= 2,
        "two steps counted",
    )
    bare = Runtime(node_id="b", region="eu", store=store, agent=AsyncAgent(), secret=SECRET,
                   timing=TIMING)  # type: ignore[arg-type]  # fmt: skip
    assert bare.metrics is None
    probe = (
        "import sys; from hamsterbunker.runtime import Runtime; "
        "from hamsterbunker.testing import MemoryStore; from tests.support.agents import "
        "AsyncAgent, SECRET; Runtime(node_id='c', region='eu', store=MemoryStore(), "
        "agent=AsyncAgent(), secret=SECRET); print('prometheus_client' in sys.modules)"
    )
    answer = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    assert answer.stdout.strip() == "False", answer.stderr


def test_status_is_hb_status_json_with_this_nodes_view_of_the_lease(
    nodes: list[Runtime],
) -> None:
    store, events = MemoryStore(), Recorder()
    a = start(nodes, store, "a", on_event=events)
    events.wait("agent.step", "a")
    assert a.endpoints is not None
    port = a.endpoints.port

    def healthy_status() -> str | None:
        # On a loaded machine a step may overrun this test's short renew deadline: the node
        # is not healthy (503) until its next renewal.
        code, text = get(port, "/status")
        return text if code == 200 else None

    text = wait_until(healthy_status, "/status answering 200")
    doc = json.loads(text)
    assert doc["node"] == "a" and doc["health"] == "healthy" and doc["exit_code"] == 0
    assert doc["lease"]["holder"] == "a" and doc["liveness"]["state"] == "live"
    assert [n["node"] for n in doc["nodes"]] == ["a"]


def test_an_address_in_use_is_a_config_error_before_the_node_touches_the_store(
    nodes: list[Runtime],
) -> None:
    store = MemoryStore()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        node = Runtime(node_id="a", region="eu", store=store, agent=AsyncAgent(), secret=SECRET,
                       timing=TIMING, http=f"127.0.0.1:{port}")  # fmt: skip
        node.start()
        assert node.ready.wait(15) and node.stopped.wait(15)
        with pytest.raises(ConfigError, match=rf"http 127.0.0.1:{port}: cannot listen there"):
            node.stop(timeout=10)
    assert store.read_lease(AGENT) is None and store.list_heartbeats(AGENT) == []


# -- the numbers, without a node -----------------------------------------------------------


def metrics_on(clock: FakeClock) -> tuple[NodeMetrics, Standing]:
    standing = Standing()
    keeper = LeaseKeeper(MemoryStore(), AGENT, "a", "eu", timing=TIMING, clock=clock)
    return NodeMetrics(Identity("a", "eu", "host", AGENT), standing, keeper, clock), standing


def test_events_and_timings_become_counters_and_histograms() -> None:
    clock = FakeClock()
    metrics, _ = metrics_on(clock)
    other, _ = metrics_on(clock)  # a second registry in the same process: no clash
    for kind, detail in [
        ("lease.acquired", {"via": "expired"}),
        ("lease.acquired", {"via": "not-a-via"}),
        ("agent.step", {"step_seq": 1}),
        ("agent.failing", {"step_seq": 2}),
        ("node.fenced", {"error": "x"}),
        ("store.error", {"error": "x"}),
        ("effect.replayed", {"step_seq": 2, "reused": 2}),
        ("effect.interrupted", {"step_seq": 2, "index": 0}),
        ("checkpoint.published", {"size": 321}),
        ("checkpoint.published", {"landed_despite": "timeout"}),
    ]:
        metrics.on_event(kind, detail)
    started = clock.monotonic()
    clock.advance(0.25)
    metrics.recorded("publish", started, "ok")
    metrics.recorded("publish", started, "failed")  # not a publish the store took
    metrics.recorded("acquire", started, "ok")
    metrics.measured("step", 1.5)
    metrics.measured("renewal", 0.004)
    got = parsed(generate_latest(metrics.registry).decode())
    assert value(got, "takeovers_total", via="expired") == 1
    assert value(got, "takeovers_total", via="other") == 1
    assert value(got, "takeovers_total", via="switchover") == 0
    assert value(got, "steps_total") == value(got, "step_failures_total") == 1
    assert value(got, "fenced_writes_total") == value(got, "store_errors_total") == 1
    assert value(got, "effects_replayed_total") == 2
    assert value(got, "effects_interrupted_total") == 1
    assert value(got, "checkpoints_total") == 2 and value(got, "checkpoint_bytes") == 321
    assert value(got, "publish_seconds_count") == 1
    assert value(got, "publish_seconds_sum") == pytest.approx(0.25)
    assert value(got, "step_seconds_sum") == 1.5
    assert value(got, "renewal_seconds_bucket", le="0.005") == 1
    untouched = parsed(generate_latest(other.registry).decode())
    assert value(untouched, "steps_total") == 0


def test_gauges_read_the_standing_at_each_scrape() -> None:
    metrics, standing = metrics_on(FakeClock())
    got = parsed(generate_latest(metrics.registry).decode())
    assert value(got, "paused") == value(got, "inbox_depth") == value(got, "is_leader") == 0
    standing.paused, standing.inbox, standing.failing = True, (3, None), (2, "boom")
    standing.epoch_seen = 7
    got = parsed(generate_latest(metrics.registry).decode())
    assert (value(got, "paused"), value(got, "inbox_depth")) == (1, 3)
    assert (value(got, "step_failures_in_a_row"), value(got, "epoch")) == (2, 7)


def test_probes_judge_the_lease_on_this_nodes_clock() -> None:
    """A standby is healthy while it sees the leader's record change within a TTL; once it
    stood still for a TTL, 503; the node that takes it is the leader until its renew
    deadline passes without a renewal."""
    clock, store = FakeClock(), MemoryStore()
    other = LeaseKeeper(store, AGENT, "b", "eu", timing=TIMING, clock=clock)
    ours = LeaseKeeper(store, AGENT, "a", "eu", timing=TIMING, clock=clock)
    standing = Standing(role="standby")
    probes = NodeProbes(Identity("a", "eu", "host", AGENT), standing, ours, store, clock)
    assert probes.health().text == "no leader: the lease is never taken"
    other.tick()  # b takes the empty lease
    ours.tick()
    assert (probes.health().ok, probes.health().text) == (True, "standby · leader b · epoch 1")
    assert not probes.leader().ok
    clock.advance(TIMING.lease_ttl_s)  # b stopped renewing
    health = probes.health()
    assert (
        not health.ok and "no live leader: the lease of b has not changed for a TTL" in health.text
    )
    ours.tick()  # takes it: expired
    standing.role = "active"
    assert probes.health().ok and probes.leader().ok
    standing.paused = True  # a paused leader is healthy: it holds still on purpose
    assert (probes.health().ok, probes.health().text) == (True, "leader · epoch 2 · paused")
    clock.advance(TIMING.renew_deadline_s)
    assert not probes.leader().ok
    assert probes.health().text.startswith("leader past its renew deadline")
    standing.failing = (2, "boom")
    ours.tick()  # renewed
    assert probes.health().text == "leader, but 2 steps failed in a row: boom"


@pytest.mark.parametrize(
    ("text", "host", "port"),
    [("127.0.0.1:9100", "127.0.0.1", 9100), ("[::1]:80", "::1", 80), (":9100", "", 9100),
     ("localhost:1", "localhost", 1)],
)  # fmt: skip
def test_http_addresses_that_parse(text: str, host: str, port: int) -> None:
    assert parse_http_address(text) == HttpAddress(host, port)
    assert str(parse_http_address(text)) == text


@pytest.mark.parametrize(
    "text", ["9100", "host:", "host:0", "host:65536", "::1:80", "a b:1", "h:x"]
)
def test_http_addresses_that_do_not(text: str) -> None:
    with pytest.raises(ConfigError):
        parse_http_address(text)


def test_an_ipv6_address_is_served_on_an_ipv6_socket() -> None:
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError:
        pytest.skip("no IPv6 loopback here")
    clock, store = FakeClock(), MemoryStore()
    metrics, standing = metrics_on(clock)
    keeper = LeaseKeeper(store, AGENT, "a", "eu", timing=TIMING, clock=clock)
    probes = NodeProbes(Identity("a", "eu", "host", AGENT), standing, keeper, store, clock)
    endpoints = Endpoints(HttpAddress("::1", 0), metrics, probes)
    endpoints.start()
    try:
        url = f"http://[::1]:{endpoints.port}"
        with urllib.request.urlopen(f"{url}/metrics", timeout=10) as answer:
            assert value(parsed(answer.read().decode()), "is_leader") == 0
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"{url}/health", timeout=10)
        assert refused.value.code == 503 and refused.value.read() == b"starting\n"
    finally:
        endpoints.stop()


def test_status_of_a_store_that_does_not_answer_is_503_within_the_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(endpoints_module, "STATUS_TIMEOUT_S", 0.2)
    release = threading.Event()

    class Hanging(MemoryStore):
        def read_lease(self, agent: str) -> LeaseRecord | None:
            release.wait(30)
            return super().read_lease(agent)

    clock, store = FakeClock(), Hanging()
    metrics, standing = metrics_on(clock)
    keeper = LeaseKeeper(MemoryStore(), AGENT, "a", "eu", timing=TIMING, clock=clock)
    probes = NodeProbes(Identity("a", "eu", "host", AGENT), standing, keeper, store, clock)
    endpoints = Endpoints(LOOPBACK, metrics, probes)
    endpoints.start()
    try:
        assert get(endpoints.port, "/status") == (503, "the store did not answer within 0.2 s\n")
        assert get(endpoints.port, "/metrics")[0] == 200  # the rest answers meanwhile
    finally:
        release.set()
        endpoints.stop()
