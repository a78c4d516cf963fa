"""Far regions: failover, handover and quiet standbys with every node behind a netem delay.

Each node process runs in a network namespace of its own, linked to the root namespace
by a veth pair that delays each direction by netem; the store server (etcd, Redis,
PostgreSQL) runs
in the root namespace on a test address of a dummy link. Namespaces, links and the
address are this benchmark's own (names starting ``hbrg``, addresses in 10.201.0.0/16)
and are removed afterwards, and any left by an interrupted run at the start.
"""

from __future__ import annotations

import asyncio
import math
import os
import secrets
import select
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hamsterbunker.core.timing import DEFAULT_TIMING, LeaseTiming
from hamsterbunker.ops.local import LocalCluster

from .common import (
    SPREAD_TTL_HEADERS,
    BenchmarkError,
    Check,
    Result,
    Table,
    median,
    ms,
    percentile,
    wait_for,
)
from .nodes import (
    AGENT_ID,
    NODE_CLOCK,
    NODES,
    BenchCluster,
    Sample,
    bench_cluster,
    takeover_result,
    takeovers,
)

NAME = "regions"
TITLE = "Far regions: nodes behind delayed links (etcd, Redis, PostgreSQL)"
ONE_WAY_MS = (25, 75, 150)  # netem delay each way between a node and the store
STORES = ("etcd", "redis", "postgres")
EDGE_STORES = ("etcd", "redis")  # the shorter TTLs soaked beside (not on every store: CPU)
# The hot standby, side by side: a state over what the take reads along, hot copy on/off.
HOT_STORES, HOT_ONE_WAY_MS, HOT_STATE_KIB = ("etcd", "redis"), 75, 1024
SOAK_S, QUICK_SOAK_S = 600, 20  # three nodes left alone, per store and delay, all at once
KILLS, QUICK_KILLS = 10, 3
HANDOVERS, QUICK_HANDOVERS = 10, 3
SLACK_MS = 50  # beyond the round trips of each target
FAILOVER_RTTS = 2  # target: failover p99 ≤ TTL + 2 round trips + 50 ms
HANDOVER_RTTS = 3  # target: handover p99 ≤ 3 round trips + 50 ms
RENEW_SHARE = 0.6  # the renew deadline's share of the TTL (hamsterbunker.core.timing)
GAP_RTTS, GAP_FACTOR = 2.5, 2.5  # the renewal gap taken as tick + 2.5 RTT; TTL = 2.5 × that
# Soaked beside the others, reported only: shorter TTLs at the longest round trip.
EDGE_ONE_WAY_MS, EDGE_TTLS_MS = 150, (2000, 1500)
# agent.yielded: a step cut short at the renew deadline (renewals too slow to keep stepping).
EVENT_KINDS = ("lease.renew_failed", "lease.lost", "node.fenced", "agent.yielded")
POLL_S = 0.1  # how often the soak reads each lease record (from the root namespace)

PREFIX = "hbrg"  # every namespace and link of this benchmark
DELAY_LINE = Path(__file__).with_name("delayline.py")  # a userspace netem: no sch_netem here
STORE_DEV, STORE_IP = f"{PREFIX}-store", "10.201.0.1"  # the store's address, on a portless bridge


def advised_ttl_ms(rtt_ms: float, tick_ms: int = DEFAULT_TIMING.tick_ms) -> int:
    """The TTL for a round trip: GAP_FACTOR × the expected renewal gap, never below the default.

    A leader renews every tick plus the renewal's own round trip (and, behind a busy
    store connection, up to about 2.5 round trips: the soak's longest gaps); it steps only
    within 0.6 × TTL of its last renewal, so 2.5 × the gap leaves that deadline 1.5 × the
    gap. Rounded up to 500 ms.
    """
    gap = tick_ms + GAP_RTTS * rtt_ms
    return max(DEFAULT_TIMING.lease_ttl_ms, math.ceil(GAP_FACTOR * gap / 500) * 500)


def timing_for(one_way_ms: int) -> LeaseTiming:
    """The tick (the default) and TTL (advised_ttl_ms) a node behind this delay runs with."""
    ttl = advised_ttl_ms(2 * one_way_ms)
    return LeaseTiming(tick_ms=DEFAULT_TIMING.tick_ms, lease_ttl_ms=ttl)


METHOD = f"""\
The three `python -m hamsterbunker run` processes of the failover benchmark
(`hamsterbunker.demo:CounterAgent`, `--history`), each in a **network namespace of its
own**, linked to the root namespace by a point-to-point link (10.201.*n*.2/30 in the
namespace, 10.201.*n*.1/30 outside) that delays every packet D each way, so a node's round
trip to the store is 2·D. This machine's kernel has no `sch_netem` (`tc qdisc ... netem`:
"Specified qdisc kind is unknown"), so the link is `benchmarks/delayline.py`, a userspace
netem: a pair of TUN devices per node, one moved into the namespace, and a process
(nice −10) that copies each IP packet from one to the other D later, in order (epoll
timers: up to about 1 ms late). The store server runs in the root namespace, listening on
127.0.0.1 and on {STORE_IP} (on a bridge without ports; each namespace has a route to it
through its link and nothing else): one etcd member, one `redis-server` or one
PostgreSQL server (fsync and synchronous commit on) as in the tests, started by the
benchmark. The benchmark reads the store and the nodes'
history from the root namespace, without delay; all times are the nodes' own (history
file, one clock for every process of the machine). D = {", ".join(map(str, ONE_WAY_MS))} ms
(round trips {", ".join(str(2 * d) for d in ONE_WAY_MS)} ms); the round trip a node sees
(`read_lease` p50, from its namespace) is measured too ("RTT seen").

Timing per round trip (`--tick-ms`, `--lease-ttl-ms`): the default tick, {DEFAULT_TIMING.tick_ms} ms,
and the TTL the benchmark advises, max(2000, {GAP_FACTOR} × (tick + {GAP_RTTS} RTT)) rounded
up to 500 ms: {", ".join(f"{timing_for(d).lease_ttl_ms} ms" for d in ONE_WAY_MS)}.

* **Soak** ({SOAK_S // 60} minutes, {QUICK_SOAK_S} s with `--quick`): all
  {len(ONE_WAY_MS) * len(STORES)} clusters (each store × each round trip) at once, and beside
  them, reported only, the round trip of {2 * EDGE_ONE_WAY_MS} ms with the shorter TTLs
  {" and ".join(f"{t} ms" for t in EDGE_TTLS_MS)} (the default, and less) on {" and ".join(EDGE_STORES)};
  left alone once a leader has published (the shorter TTLs: once one holds the lease).
  Counted: takeovers (epochs acquired after the start), the nodes' `lease.renew_failed`,
  `lease.lost`, `node.fenced` and `agent.yielded` events (a step cut short at the renew
  deadline, 0.6 × TTL after the last renewal was sent), the checkpoints the leader
  published per second, and the gaps between two changes of the lease record
  (renewals), read every {POLL_S * 1000:.0f} ms at the store. Target: no takeover.
* **Crash failover** ({KILLS} kills per store and round trip, {QUICK_KILLS} with `--quick`):
  as the failover benchmark, SIGKILL of the leader at a random phase of its tick. Target:
  p99 of kill → agent resumed and of kill → first checkpoint without the agent's step
  ≤ TTL + 2 RTT + 50 ms.
* **Graceful handover** ({HANDOVERS} per store and round trip, {QUICK_HANDOVERS} with
  `--quick`): as the handover benchmark, SIGTERM, measured from the old leader's last
  publish. Target: p99 of last publish → agent resumed and → first checkpoint without the
  step ≤ 3 RTT + 50 ms.
* **Hot standby, side by side** (reported, no target): at the round trip of
  {2 * HOT_ONE_WAY_MS} ms on {" and ".join(HOT_STORES)}, the same kills and handovers with
  `BigStateAgent` (this module: the counter with {HOT_STATE_KIB} KiB of random letters in
  its state, over the 512 KiB the take's commit reads along), once with the standbys'
  hot copy (the default) and once with `--no-hot-standby`, one after the other.

The failover and handover runs come after the soak, one cluster at a time, each on fresh
namespaces and a fresh key prefix of the store.
"""

ANALYSIS = """\
Measured on 2026-12-05 on 9488c58 (full run; 10 kills and 10 handovers per store and
round trip), after the hot standby (a standby keeps the newest checkpoint its leader's
renewals name) and a take that also reads what the first step reads (the effect journal of
the step in flight and the inbox), on top of the take that reads the checkpoints and keys
along and the release in the last publish's commit. In round trips (RTT), from the parts
tables:

* **Failover**, kill → first checkpoint (step excluded), p99: etcd 2086 / 2531 / 4202 ms
  at RTT 50 / 150 / 300 ms, Redis 2101 / 2855 / 4078 ms; the target (TTL + 2 RTT + 50 ms)
  holds at 50 ms and is missed by 1.2 / 1.8 RTT on etcd and 3.4 / 1.4 RTT on Redis. Kill →
  lease acquired is TTL + 2.1 / 2.7 RTT at p99 on etcd (Redis 1.9 / 2.6): the standby
  times the TTL from when it *saw* the last renewal, about 1 RTT after the leader sent
  it, then the compare-and-set (1 RTT). That first round trip is kept on purpose: a
  standby that timed from the leader's send would need the leader's clock, and the 0.4 ×
  TTL between the leader's renew deadline and the expiry is the margin for a leader
  stalled between checking its lease and acting. The restore is 2 ms at p50 but 1 RTT at
  p99 (one kill in ten), and on etcd the first publish 2 RTT at p99 (Redis: one publish
  of 3.7 RTT); in the handovers neither happens. The first publish's extra round trips
  were a new connection's handshake: a standby's store client holds the connections a
  standby uses, and a takeover makes more calls at once. Since this run a node opens as
  many connections as it has store threads at start (`NodeCalls.warm`); a check run of
  10 kills at RTT 150 ms: first publish p99 293 → 157 ms on etcd and 568 → 156 ms on
  Redis (1 RTT), kill → first checkpoint p99 2617 → 2470 and 2829 → 2527 ms. Which call
  spends the restore's round trip is not known yet: not the take's reads along (the
  newest checkpoint, journal and inbox come with it), not the key follower (it follows
  the record the take read on the worker pool now), and not the store threads' queue
  (eight threads did not change it).
* **Handover**, last publish → first checkpoint (step excluded), p50 2.1 RTT at 150 and
  300 ms (etcd 321 / 632 ms, Redis 313 / 617), p99: etcd 163 / 583 / 1433 ms, Redis
  186 / 717 / 1092 ms; the target (3 RTT + 50 ms) holds at 50 ms. Released → acquired is
  about 1.1 RTT, the restore 2–4 ms at p99 (nothing is read between the take and the
  first step now), the first publish 1 RTT. Each miss is the one handover in ten whose
  release was a write of its own (last publish → release 246 / 580 ms on etcd, 408 / 467
  ms on Redis at p99, 0.12–0.15 ms at p50): the stop came while no step was in flight, or
  while a renewal was, so the release could not ride on the last publish's commit.
* **PostgreSQL** misses every target. At RTT 50 ms: failover p99 7156 ms, handover 2238
  ms (p50 1782); at 150 and 300 ms no leader kept stepping (renewal gaps of 1.05 s at
  p50, 553 steps cut at the renew deadline in the soak, 2 and 7 takeovers). Each
  statement of its SERIALIZABLE transaction is a round trip (BEGIN, the compare, each
  write, each read, COMMIT: 5–8 RTT a commit), and the longer transactions collide more
  (a first step's journal commits lost 30 tries to serialization failures at 50 ms). So
  PostgreSQL is for nodes near it until a commit is one round trip (psycopg's pipeline
  mode, or one server-side statement): the next step.
* **Hot standby** (the side-by-side table; a 1 MiB state, RTT 150 ms): the restore after
  the acquire is 5.7 ms at p50 with the hot copy against 1148 ms without on etcd's
  handover, and 196 against 1148 ms on its failover (p99 1160 against 1167: the kill
  came after a publish the renewals had not named yet, which is read); Redis 241 against
  1017 ms (failover) and 795 against 1017 ms (handover: the copy named was one behind,
  and the fetch of the released one, started as the release was seen, was awaited).
  Kill → first checkpoint p50 3564 against 5341 ms on etcd, 3456 against 4048 on Redis.
  A 1 MiB read over this link costs about a second (TCP slow start on a connection idle
  between renewals), and so does the first publish of 1 MiB, which the hot copy does not
  change.
* **Against before.** The full run of 2026-12-05 03:58 (f5ff231, without these changes)
  gave failover p99 2177 / 2481 / 4076 ms on etcd and 2081 / 2919 / 4167 on Redis,
  handover p99 188 / 474 / 1045 and 164 / 725 / 629 ms; this run 2086 / 2531 / 4202, 2101
  / 2855 / 4078, 163 / 583 / 1433 and 186 / 717 / 1092 ms. The p50s moved by less than a
  round trip; at p99, with 10 samples, one slow takeover sets the figure, and which store
  or round trip gets it differs from run to run. Not side by side: a far-regions run of
  two commits would take an hour and a half here.

The soak met its target on etcd and Redis: no takeover, no failed renewal, no fencing, at
the advised TTLs; at RTT 300 ms with a 1500 ms TTL the leaders never published (steps cut
at the renew deadline), with 2000 ms none was cut. The advice stands: TTL = max(2000, 2.5
× (tick + 2.5 RTT)) rounded up to 500 ms.
"""


# -- the network ------------------------------------------------------------------------


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=15, check=check)


@dataclass(frozen=True)
class Link:
    """One node's namespace and its delayed point-to-point link to the root namespace."""

    index: int  # 1..250: the third octet of its /30

    @property
    def netns(self) -> str:
        return f"{PREFIX}-n{self.index}"

    @property
    def host_dev(self) -> str:
        return f"{PREFIX}h{self.index}"

    @property
    def node_dev(self) -> str:
        return f"{PREFIX}n{self.index}"

    @property
    def exec_prefix(self) -> list[str]:
        return ["ip", "netns", "exec", self.netns]

    def up(self) -> None:
        """Move the node's end (made by the delay line) into a new namespace; address both."""
        host_ip, node_ip = f"10.201.{self.index}.1", f"10.201.{self.index}.2"
        _ip("netns", "add", self.netns)
        _ip("link", "set", self.node_dev, "netns", self.netns)
        _ip("addr", "add", f"{host_ip}/30", "dev", self.host_dev)
        _ip("link", "set", self.host_dev, "up")
        _ip("-n", self.netns, "link", "set", "lo", "up")
        _ip("-n", self.netns, "addr", "add", f"{node_ip}/30", "dev", self.node_dev)
        _ip("-n", self.netns, "link", "set", self.node_dev, "up")
        # The store's address and nothing else: no default route out of the namespace.
        _ip("-n", self.netns, "route", "add", f"{STORE_IP}/32", "via", host_ip)

    def down(self) -> None:
        _ip("netns", "del", self.netns, check=False)


@contextmanager
def delay_line(links: list[Link], one_way_ms: int) -> Iterator[None]:
    """The process that carries the links' packets, one_way_ms late each way (delayline.py)."""
    pairs = [f"{link.host_dev}:{link.node_dev}" for link in links]
    process = subprocess.Popen(
        [sys.executable, str(DELAY_LINE), str(one_way_ms), *pairs],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        assert process.stdout is not None
        ready, _, _ = select.select([process.stdout], [], [], 15)
        if not ready or process.stdout.readline().strip() != b"ready":
            process.kill()
            _, err = process.communicate(timeout=10)
            raise BenchmarkError(f"the delay line did not start: {err.decode()[-500:]}")
        yield
    finally:
        if process.poll() is None:
            assert process.stdin is not None
            process.stdin.close()  # its signal to end; its devices go with it
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)


def _remove_leftovers() -> None:
    """Namespaces and links of an earlier run that was interrupted before its cleanup."""
    for line in _ip("netns", "list", check=False).stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        if name.startswith(f"{PREFIX}-n"):
            _ip("netns", "del", name, check=False)
    for line in _ip("-o", "link", "show", check=False).stdout.splitlines():
        parts = line.split(":")
        name = parts[1].strip().split("@")[0] if len(parts) > 1 else ""
        if name.startswith(PREFIX):
            _ip("link", "del", name, check=False)


@contextmanager
def store_address() -> Iterator[None]:
    """The store's test address on a portless bridge of the root namespace (after a cleanup)."""
    _remove_leftovers()
    try:
        _ip("link", "add", STORE_DEV, "type", "bridge")  # no ports: an address holder
        _ip("addr", "add", f"{STORE_IP}/32", "dev", STORE_DEV)
        _ip("link", "set", STORE_DEV, "up")
        yield
    finally:
        _ip("link", "del", STORE_DEV, check=False)
        _remove_leftovers()


class LinkPool:
    """Hands out fresh link indices, so that no two clusters ever share a namespace."""

    def __init__(self) -> None:
        self.next = 1

    @contextmanager
    def links(self, one_way_ms: int) -> Iterator[dict[str, Link]]:
        """One link per node of NODES, delayed and up; all removed afterwards whatever happens."""
        if self.next + len(NODES) > 250:
            raise BenchmarkError("out of link indices")
        made = {spec.node: Link(self.next + i) for i, spec in enumerate(NODES)}
        self.next += len(NODES)
        try:
            with delay_line(list(made.values()), one_way_ms):
                for link in made.values():
                    link.up()
                yield made
        finally:
            for link in made.values():
                link.down()


# -- the store servers -------------------------------------------------------------------


@contextmanager
def store_server(backend: str) -> Iterator[Callable[[], str]]:
    """A private server on 127.0.0.1 and STORE_IP; yields a maker of fresh store URLs."""
    from _pytest.outcomes import OutcomeException  # the test helpers fail or skip with these

    from tests.support.etcd_server import EtcdServer
    from tests.support.postgres_server import PostgresServer
    from tests.support.redis_server import RedisServer

    # The last --bind wins; only loopback and the test address, so no protected mode.
    redis_bind = ("--bind", "127.0.0.1", STORE_IP, "--protected-mode", "no")
    try:
        if backend == "etcd":
            server = _start_etcd()
        elif backend == "postgres":
            server = _start_postgres()
        else:
            server = RedisServer.start(*redis_bind)
    except OutcomeException as exc:
        raise BenchmarkError(f"could not start {backend}: {exc.msg}") from None
    assert isinstance(server, EtcdServer | RedisServer | PostgresServer)
    try:
        # The helpers name 127.0.0.1; the nodes reach the same port on the test address.
        yield lambda: server.url().replace("127.0.0.1", STORE_IP, 1)
    finally:
        server.stop()


def _start_etcd() -> object:
    """One etcd member as tests/support/etcd_server.py starts it, also listening on STORE_IP."""
    from tests.support.etcd_server import EtcdServer, require_etcd
    from tests.support.server_process import free_port

    workdir = Path(tempfile.mkdtemp(prefix="hb-etcd-"))
    client, peer = free_port(), free_port()
    peer_url = f"http://127.0.0.1:{peer}"
    command = [
        require_etcd(), "--name", "hb-bench", "--data-dir", str(workdir / "data"),
        "--listen-client-urls", f"http://127.0.0.1:{client},http://{STORE_IP}:{client}",
        "--advertise-client-urls", f"http://{STORE_IP}:{client}",
        "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
        "--initial-cluster", f"hb-bench={peer_url}", "--log-level", "warn",
    ]  # fmt: skip
    server = EtcdServer(command, client, workdir, "etcd", None)
    if not server._wait_healthy():  # the helper's own bounded wait
        server.stop()
        raise BenchmarkError("etcd was not healthy")
    return server


def _start_postgres() -> object:
    """A throwaway PostgreSQL as tests/support/postgres_server.py starts it, also listening on
    STORE_IP and taking password logins from the nodes' links."""
    import psycopg

    from tests.support.postgres_server import PostgresServer

    server = PostgresServer.start(f"listen_addresses=127.0.0.1,{STORE_IP}")
    with open(server.workdir / "data" / "pg_hba.conf", "a") as hba:
        hba.write("host all all 10.201.0.0/16 scram-sha-256\n")
    assert server.process is not None
    server.process.send_signal(signal.SIGHUP)  # reload pg_hba.conf, then wait until it lets us in
    conninfo = server.raw_conninfo().replace("127.0.0.1", STORE_IP, 1)

    def logs_in() -> bool:
        try:
            psycopg.connect(conninfo, connect_timeout=5).close()
        except psycopg.OperationalError:
            return False
        return True

    wait_for(logs_in, "PostgreSQL to take logins on the test address", timeout=20, every=0.1)
    return server


# -- one cluster behind a delay -----------------------------------------------------------


class BigStateAgent:
    """The counter with HOT_STATE_KIB of random letters in its state (made once, by init)."""

    id = AGENT_ID

    def init(self) -> dict[str, Any]:
        return {"count": 0, "pad": secrets.token_urlsafe(HOT_STATE_KIB * 768)}

    async def step(self, state: dict[str, Any]) -> dict[str, Any]:
        await asyncio.sleep(0.25)  # as CounterAgent's step
        return {**state, "count": state["count"] + 1}


@dataclass
class _BigStateCluster(LocalCluster):
    """The nodes, running BigStateAgent (hot copy on, the default)."""

    def __post_init__(self) -> None:
        self.agent, self.agent_id = "benchmarks.regions:BigStateAgent", AGENT_ID
        self.env = {**self.env, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}


@dataclass
class _ColdBigStateCluster(_BigStateCluster):
    """The same, with no hot copy (hb run --no-hot-standby)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.args = ("--no-hot-standby",)


@dataclass
class Far:
    """One store and delay: its cluster, and what was measured of it."""

    backend: str
    one_way_ms: int
    timing: LeaseTiming
    edge: bool = False  # a shorter TTL than advised, soaked only
    state_kib: int = 0  # BigStateAgent's state, for the hot standby side by side (0: counter)
    hot: bool = True  # the standbys keep a hot copy (hb run's default)
    rtt_measured_s: float = float("nan")

    @property
    def rtt_ms(self) -> int:
        return 2 * self.one_way_ms

    @property
    def label(self) -> str:
        edge = f", TTL {self.timing.lease_ttl_ms} ms" if self.edge else ""
        if self.state_kib:
            edge += f", {self.state_kib} KiB state, hot copy {'on' if self.hot else 'off'}"
        return f"{self.backend}, RTT {self.rtt_ms} ms{edge}"

    @property
    def cluster_class(self) -> type[LocalCluster]:
        if not self.state_kib:
            return LocalCluster
        return _BigStateCluster if self.hot else _ColdBigStateCluster


@contextmanager
def far_cluster(
    pool: LinkPool, far: Far, url: str, name: str
) -> Iterator[tuple[BenchCluster, dict[str, Link]]]:
    """Three nodes, each in its own delayed namespace, on the store at url."""
    with ExitStack() as stack:
        links = stack.enter_context(pool.links(far.one_way_ms))
        cluster = stack.enter_context(
            bench_cluster(
                name, timing=far.timing, store_url=url, cluster_class=far.cluster_class,
                command_prefix=lambda node: links[node].exec_prefix,
            )
        )  # fmt: skip
        yield cluster, links


# Run inside a node's namespace: the store round trip it sees (read_lease, after warm-up).
_RTT_PROBE = """\
import os, statistics, time
from hamsterbunker.stores import open_store
store = open_store(os.environ["HB_STORE"])
times = []
for _ in range(8):
    started = time.perf_counter()
    store.read_lease("counter")
    times.append(time.perf_counter() - started)
store.close()
print(statistics.median(times[2:]))
"""


def measured_rtt(link: Link, url: str) -> float:
    """The median read_lease round trip from inside the link's namespace, in seconds."""
    done = subprocess.run(
        [*link.exec_prefix, sys.executable, "-c", _RTT_PROBE],
        capture_output=True, text=True, timeout=60, env={**os.environ, "HB_STORE": url},
    )  # fmt: skip
    if done.returncode != 0:
        raise BenchmarkError(f"round-trip probe in {link.netns} failed: {done.stderr[-500:]}")
    return float(done.stdout.strip())


# -- the soak ------------------------------------------------------------------------


@dataclass
class Soak:
    """What one cluster did while left alone."""

    far: Far
    cluster: BenchCluster
    start_epoch: int = 0
    started_wall: float = 0.0
    started: float = 0.0  # the nodes' clock
    key: tuple[int, int, str | None] | None = None
    changed_at: float = 0.0
    gaps: list[float] = field(default_factory=list)  # between two changes of the lease record
    dead: str = ""
    # Counted at the end, before the cluster and its files are gone:
    took: list[str] = field(default_factory=list)  # the takeovers
    counts: dict[str, int] = field(default_factory=dict)  # events of EVENT_KINDS
    steps_per_s: float = 0.0  # checkpoints the leader published per second
    logs: dict[str, str] = field(default_factory=dict)  # node log tails, if anything happened

    def poll(self) -> None:
        """Read the lease once; note when it changed (a renewal, or a new term)."""
        lease = self.cluster.store.read_lease(AGENT_ID)
        now = time.monotonic()
        key = None if lease is None else (lease.epoch, lease.renewals, lease.holder)
        if key != self.key:
            if self.key is not None:
                self.gaps.append(now - self.changed_at)
            self.key, self.changed_at = key, now

    def finish(self, seconds: float) -> None:
        ops = self.cluster.ops()
        self.took = [
            f"{op.node} epoch {op.epoch}"
            for op in ops
            if op.op == "acquire" and op.outcome == "ok" and op.epoch > self.start_epoch
        ]
        events = [
            e for e in self.cluster.store.read_events(AGENT_ID) if e.time >= self.started_wall
        ]
        self.counts = {kind: sum(1 for e in events if e.type == kind) for kind in EVENT_KINDS}
        published = [
            op
            for op in ops
            if op.op == "publish" and op.outcome == "ok" and op.start >= self.started
        ]
        self.steps_per_s = len(published) / seconds
        if self.took or any(self.counts.values()):
            self.logs = {s.node: self.cluster.log_tail(s.node, 40) for s in NODES}


def run_soaks(
    pool: LinkPool, fars: list[Far], urls: dict[str, Callable[[], str]], seconds: float
) -> list[Soak]:
    """Every cluster at once, left alone for seconds; their counts afterwards."""
    with ExitStack() as stack:
        soaks = []
        for far in fars:
            cluster, links = stack.enter_context(
                far_cluster(pool, far, urls[far.backend](), f"{NAME}-soak")
            )
            soaks.append(Soak(far, cluster))
            far.rtt_measured_s = measured_rtt(next(iter(links.values())), cluster.cluster.store_url)
        for soak in soaks:
            try:
                soak.start_epoch = _start_epoch(soak)
            except BenchmarkError as exc:  # reported as that cluster's miss; the rest go on
                soak.dead = f"not ready: {exc}"
        for soak in soaks:
            soak.started_wall, soak.started = time.time(), NODE_CLOCK.monotonic()
        _watch(soaks, seconds)
        for soak in soaks:
            soak.finish(seconds)  # while its store and history are still there
        return soaks


def _start_epoch(soak: Soak) -> int:
    """The epoch the soak starts from: once a leader has published, or (a TTL shorter than
    advised, where a leader may never finish a step) once one holds the lease."""
    if not soak.far.edge:
        return soak.cluster.ready_leader(timeout=60).epoch

    def held() -> int | None:
        lease = soak.cluster.store.read_lease(AGENT_ID)
        return lease.epoch if lease is not None and lease.holder is not None else None

    return wait_for(held, f"a lease holder ({soak.far.label})", timeout=60, every=0.1)


def _watch(soaks: list[Soak], seconds: float) -> None:
    """Poll every lease every POLL_S until seconds have passed (bounded), noting dead nodes."""
    deadline = time.monotonic() + seconds
    for n in range(int(seconds / POLL_S) + 1):
        if time.monotonic() >= deadline:
            break
        for soak in soaks:
            soak.poll()
            if n % 50 == 0 and not soak.dead:
                gone = [s.node for s in NODES if not soak.cluster.cluster.alive(s.node)]
                soak.dead = ", ".join(gone)
        time.sleep(max(0.0, min(POLL_S, deadline - time.monotonic())))


# -- failover and handover ------------------------------------------------------------


@dataclass
class Runs:
    far: Far
    kills: list[Sample]
    handovers: list[Sample]
    violations: list[str]
    notes: list[str]


def run_takeovers(pool: LinkPool, far: Far, url_of: Callable[[], str], quick: bool) -> Runs:
    """The kills, then the handovers, each on a fresh cluster behind far's delay."""
    runs = Runs(far, [], [], [], [])
    plan = (
        (signal.SIGKILL, QUICK_KILLS if quick else KILLS, "failover", 1),
        (signal.SIGTERM, QUICK_HANDOVERS if quick else HANDOVERS, "handover", 2),
    )
    for signum, count, kind, seed in plan:
        budget = count * (far.timing.lease_ttl_s + 20)
        with far_cluster(pool, far, url_of(), f"{NAME}-{kind}") as (cluster, _links):
            try:
                samples, notes = takeovers(cluster, signum, count, budget, seed=seed)
            except BenchmarkError as exc:  # reported as this store's miss; the rest go on
                samples, notes = [], [f"stopped: {exc}"]
            runs.violations += cluster.safety_violations()
        runs.notes += [f"{far.label}, {kind}: {note}" for note in notes]
        if signum == signal.SIGKILL:
            runs.kills = samples
        else:
            runs.handovers = samples
    return runs


def failover_target_s(far: Far) -> float:
    return far.timing.lease_ttl_s + (FAILOVER_RTTS * far.rtt_ms + SLACK_MS) / 1000


def handover_target_s(far: Far) -> float:
    return (HANDOVER_RTTS * far.rtt_ms + SLACK_MS) / 1000


def _judged(samples: list[Sample], graceful: bool) -> tuple[list[float], list[float]]:
    """resumed and first checkpoint (the agent's step excluded), from where they are judged."""
    origin = [s.handover_start if graceful else 0.0 for s in samples]
    resumed = [s.restored - o for s, o in zip(samples, origin, strict=True)]
    first = [s.published_without_step - o for s, o in zip(samples, origin, strict=True)]
    return resumed, first


def _takeover_tables(runs: list[Runs], graceful: bool) -> tuple[Table, Table, list[str]]:
    """The spread and parts tables of takeover_result, one row set per store and delay."""
    spread_rows: list[list[str]] = []
    parts_rows: list[list[str]] = []
    notes: list[str] = []
    for run in runs:
        far = run.far
        samples = run.handovers if graceful else run.kills
        if not samples:  # the runs stopped (their note says why)
            spread_rows.append(
                [f"{far.label}: none measured", *["—"] * (len(SPREAD_TTL_HEADERS) - 1)]
            )
            continue
        part = takeover_result(
            name=NAME, title="", method="", analysis="",
            signal_word="SIGTERM" if graceful else "kill",
            samples=samples, notes=[], violations=[], ttl_s=far.timing.lease_ttl_s,
            tick_ms=far.timing.tick_ms, target_s=0, target_text="",
            from_last_publish=graceful,
        )  # fmt: skip
        spread_rows += [[f"{far.label}: {row[0]}", *row[1:]] for row in part.tables[0].rows]
        parts_rows += [[f"{far.label}: {row[0]}", *row[1:]] for row in part.tables[1].rows]
        notes += [f"{far.label}: {note}" for note in part.notes[-4:-1]]
    kind = "Graceful handover (SIGTERM)" if graceful else "Crash failover (SIGKILL)"
    return (
        Table(f"{kind}: spread per store and round trip", SPREAD_TTL_HEADERS, spread_rows),
        Table(f"{kind}: parts", ["part", "p50 ms", "p99 ms", "max ms"], parts_rows),
        notes,
    )


# -- the result ----------------------------------------------------------------------


def _p(values: list[float], q: float) -> str:
    return ms(percentile(values, q))


def _summary(runs: list[Runs], soaks: dict[tuple[str, int], Soak], soak_s: float) -> Table:
    rows = []
    for run in runs:
        far = run.far
        soak = soaks[(far.backend, far.one_way_ms)]
        fail_r, fail_c = _judged(run.kills, graceful=False)
        hand_r, hand_c = _judged(run.handovers, graceful=True)
        rows.append([
            far.backend, str(far.rtt_ms), ms(far.rtt_measured_s), str(far.timing.tick_ms),
            str(far.timing.lease_ttl_ms),
            f"{_p(fail_r, 50)} / {_p(fail_r, 99)}", f"{_p(fail_c, 99)}",
            ms(failover_target_s(far)),
            f"{_p(hand_r, 50)} / {_p(hand_r, 99)}", f"{_p(hand_c, 99)}",
            ms(handover_target_s(far)),
            str(len(soak.took)), ms(max(soak.gaps, default=float("nan"))),
        ])  # fmt: skip
    return Table(
        f"Per store and round trip (ms; soak {soak_s:.0f} s)",
        ["store", "RTT", "RTT seen", "tick", "TTL", "failover resumed p50 / p99",
         "failover 1st ckpt p99", "target", "handover resumed p50 / p99",
         "handover 1st ckpt p99", "target", "soak takeovers", "longest renewal gap"],
        rows,
    )  # fmt: skip


def _soak_table(soaks: list[Soak], seconds: float) -> Table:
    rows = []
    for soak in soaks:
        far, gaps = soak.far, soak.gaps
        rows.append([
            far.label, str(far.timing.lease_ttl_ms), str(len(soak.took)),
            *[str(soak.counts[kind]) for kind in EVENT_KINDS], str(len(gaps)), ms(median(gaps)),
            _p(gaps, 99), ms(max(gaps, default=float("nan"))),
            f"{max(gaps, default=0) / far.timing.lease_ttl_s:.2f}",
            f"{soak.steps_per_s:.2f}", soak.dead or "—",
        ])  # fmt: skip
    return Table(
        f"Soak: three nodes left alone for {seconds:.0f} s, every cluster at once",
        ["store, round trip", "TTL ms", "takeovers", "renew_failed", "lost", "fenced",
         "yielded", "renewals", "gap p50 ms", "gap p99 ms", "gap max ms", "max gap / TTL",
         "checkpoints/s", "nodes dead"],
        rows,
    )  # fmt: skip


def _advice_table(soaks: list[Soak]) -> Table:
    """Per round trip: the renewal gaps the soak saw, what TTL they need, and the advice.

    A leader steps only while its last successful renewal was *sent* less than 0.6 × TTL
    ago; that time peaks just before a renewal's answer arrives, at the gap between two
    renewals plus the round trip. A TTL below (gap + RTT) / 0.6 cuts steps short.
    """
    rows = []
    for rtt in sorted({s.far.rtt_ms for s in soaks}):
        main = [s for s in soaks if s.far.rtt_ms == rtt and not s.far.edge]
        gaps = [g for s in main for g in s.gaps]
        tick = main[0].far.timing.tick_ms
        worst = max(gaps, default=float("nan"))
        peak = worst + rtt / 1000
        outcomes = "; ".join(
            f"TTL {ttl}: {sum(len(s.took) for s in at)} takeovers, "
            f"{sum(s.counts['agent.yielded'] for s in at)} steps cut, "
            f"{sum(s.steps_per_s for s in at) / len(at):.2f} checkpoints/s"
            for ttl in sorted({s.far.timing.lease_ttl_ms for s in soaks if s.far.rtt_ms == rtt})
            for at in [
                [s for s in soaks if s.far.rtt_ms == rtt and s.far.timing.lease_ttl_ms == ttl]
            ]
        )
        rows.append([
            str(rtt), str(tick), ms(worst), ms(peak), ms(peak / RENEW_SHARE),
            str(round(tick + GAP_RTTS * rtt)), str(advised_ttl_ms(rtt)), outcomes,
        ])  # fmt: skip
    return Table(
        f"TTL advice: TTL = max(2000, {GAP_FACTOR} × (tick + {GAP_RTTS} RTT)), rounded up to 500 ms",
        ["RTT ms", "tick ms", "longest renewal gap seen ms", "gap + RTT ms",
         "least TTL to keep stepping ms", f"tick + {GAP_RTTS} RTT ms", "advised TTL ms",
         "soak (both stores)"],
        rows,
    )  # fmt: skip


def _choice_table(soaks: list[Soak]) -> Table:
    """The short form of the advice: which TTL to choose for a round trip."""
    rows = []
    for rtt in sorted({s.far.rtt_ms for s in soaks}):
        gaps = [g for s in soaks if s.far.rtt_ms == rtt and not s.far.edge for g in s.gaps]
        least = (max(gaps, default=float("nan")) + rtt / 1000) / RENEW_SHARE
        rows.append([str(rtt), str(advised_ttl_ms(rtt)), ms(least)])
    rows.append(["other", f"max(2000, {GAP_FACTOR} × (tick + {GAP_RTTS} RTT)), up to 500 ms", "—"])
    return Table(
        "TTL to choose for a round trip (tick 400 ms)",
        ["RTT ms", "TTL ms", "least TTL that kept the leader stepping here ms"],
        rows,
    )


def _hot_table(runs: list[Runs]) -> Table:
    """The hot standby side by side: the same state and round trip, hot copy on and off."""
    rows = []
    for run in runs:
        kills = [s.restored - s.acquired for s in run.kills]
        handed = [s.restored - s.acquired for s in run.handovers]
        _fail_r, fail_c = _judged(run.kills, graceful=False)
        _hand_r, hand_c = _judged(run.handovers, graceful=True)
        rows.append([
            run.far.label, f"{_p(kills, 50)} / {_p(kills, 99)}", f"{_p(fail_c, 50)} / {_p(fail_c, 99)}",
            f"{_p(handed, 50)} / {_p(handed, 99)}", f"{_p(hand_c, 50)} / {_p(hand_c, 99)}",
        ])  # fmt: skip
    return Table(
        f"Hot standby: a {HOT_STATE_KIB} KiB state, hot copy on and off (ms)",
        ["store, round trip", "failover: acquired → restored p50 / p99",
         "failover: kill → 1st ckpt p50 / p99", "handover: acquired → restored p50 / p99",
         "handover: last publish → 1st ckpt p50 / p99"],
        rows,
    )  # fmt: skip


def _checks(
    runs: list[Runs], soaks: dict[tuple[str, int], Soak], hot_runs: list[Runs]
) -> list[Check]:
    checks = []
    for run in runs:
        far = run.far
        for graceful, samples in ((False, run.kills), (True, run.handovers)):
            resumed, first = _judged(samples, graceful)
            target = handover_target_s(far) if graceful else failover_target_s(far)
            worst = max(percentile(resumed, 99), percentile(first, 99))
            what = "handover p99 (last publish →" if graceful else "failover p99 (kill →"
            rounds = f"{HANDOVER_RTTS} RTT" if graceful else f"TTL + {FAILOVER_RTTS} RTT"
            rule = f"{rounds} + {SLACK_MS} ms"
            checks.append(
                Check(
                    f"{far.label}: {what} resumed / first checkpoint)",
                    f"{_p(resumed, 99)} / {_p(first, 99)} ms",
                    f"≤ {rule} = {ms(target)} ms",
                    worst <= target,
                )
            )
        soak = soaks[(far.backend, far.one_way_ms)]
        took = soak.took
        checks.append(
            Check(
                f"{far.label}: takeovers in the soak (TTL {far.timing.lease_ttl_ms} ms)",
                str(len(took)) + (f" ({', '.join(took)})" if took else ""),
                "0",
                not took and not soak.dead,
            )
        )
    violations = [v for run in runs + hot_runs for v in run.violations]
    checks.append(
        Check("safety violations in the histories (checker)", str(len(violations)), "0",
              not violations)
    )  # fmt: skip
    return checks


def run(quick: bool) -> Result:
    if os.geteuid() != 0:
        raise BenchmarkError("network namespaces and netem need root")
    soak_s = QUICK_SOAK_S if quick else SOAK_S
    fars = [Far(b, d, timing_for(d)) for b in STORES for d in ONE_WAY_MS]
    edges = [
        Far(b, EDGE_ONE_WAY_MS, LeaseTiming(DEFAULT_TIMING.tick_ms, ttl), edge=True)
        for b in EDGE_STORES
        for ttl in EDGE_TTLS_MS
    ]
    hots = [
        Far(b, HOT_ONE_WAY_MS, timing_for(HOT_ONE_WAY_MS), state_kib=HOT_STATE_KIB, hot=hot)
        for b in HOT_STORES
        for hot in (True, False)
    ]
    pool = LinkPool()
    with ExitStack() as stack:
        stack.enter_context(store_address())
        urls = {b: stack.enter_context(store_server(b)) for b in STORES}
        soak_list = run_soaks(pool, fars + edges, urls, soak_s)
        soaks = {(s.far.backend, s.far.one_way_ms): s for s in soak_list if not s.far.edge}
        # The soak's clusters are stopped now: the takeover runs have the machine alone.
        runs = [run_takeovers(pool, far, urls[far.backend], quick) for far in fars]
        hot_runs = [run_takeovers(pool, far, urls[far.backend], quick) for far in hots]
    spread_f, parts_f, notes_f = _takeover_tables(runs + hot_runs, graceful=False)
    spread_h, parts_h, notes_h = _takeover_tables(runs + hot_runs, graceful=True)
    notes = [n for r in runs for n in r.notes] + notes_f + notes_h
    notes += [f"checker: {v}" for r in runs + hot_runs for v in r.violations]
    return Result(
        NAME,
        TITLE,
        METHOD,
        tables=[
            _summary(runs, soaks, soak_s),
            _hot_table(hot_runs),
            _soak_table(soak_list, soak_s),
            _choice_table(soak_list),
            _advice_table(soak_list),
            spread_f,
            parts_f,
            spread_h,
            parts_h,
        ],
        checks=_checks(runs, soaks, hot_runs),
        notes=notes,
        analysis=ANALYSIS,
    )
