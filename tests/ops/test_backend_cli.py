"""``hb`` against Redis and etcd, as real processes: TLS mistakes, the demo, store outages.

1. ``hb run`` against ``rediss://`` and ``etcds://`` servers that ask for a
   client certificate (mutual TLS), with a client certificate of another CA, or
   with a CA file that did not sign the server's certificate: the node exits 1
   at once with one line naming the store and the refused certificate, no
   traceback, and nothing written. A certificate file that does not exist is
   one line and exit 2. The right files work (the control).
2. ``hb demo --store redis://...`` and ``--store etcd://...``: the three-node
   kill demo survives, and ``hb status`` then shows the lease and its epoch.
3. A Redis or etcd server frozen (SIGSTOP), or an etcd stopped and started
   again on its data, for less than the lease TTL: the nodes report
   ``store.error`` (the leader ``lease.renew_failed``) then ``store.recovered``,
   and the agent goes on publishing under the same epoch (local_cluster's
   teardown also holds the whole history to the safety rules).
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis
from cryptography.hazmat.primitives import serialization

from hamsterbunker import Event
from hamsterbunker.core.errors import ConfigError
from hamsterbunker.core.timing import LeaseTiming
from hamsterbunker.ops.local import LocalCluster, NodeSpec
from hamsterbunker.stores import Store, open_store
from hamsterbunker.stores._tls import tls_files_problem
from tests.support import process_state, wait_until
from tests.support.cli import (
    AGENT,
    AGENT_ID,
    FAST,
    HB,
    RESUMED,
    SECRET,
    SURVIVED,
    check_rounds,
    hb_env,
    run_demo,
    run_hb,
)
from tests.support.etcd_server import EtcdServer, etcd_url
from tests.support.redis_server import RedisServer, mutual_tls_args, redis_url
from tests.support.server_process import free_port
from tests.support.tls_certs import make_certificates

pytestmark = pytest.mark.multiprocess

MakeCluster = Callable[..., LocalCluster]
# A refused handshake is known within a round trip; this bound leaves room for a slow machine
# (the stores' own timeouts are 2 s for Redis and 5 s for etcd).
REFUSED_WITHIN_S = 15.0


# -- TLS servers ---------------------------------------------------------------------


@dataclass
class TlsStore:
    """A Redis or etcd server whose TLS port asks every client for a certificate."""

    backend: str  # "redis" or "etcd"
    port: int
    certs: dict[str, Path]

    @property
    def server(self) -> str:
        return f"127.0.0.1:{self.port}"

    def url(
        self, prefix: str, *, ca: Path | None = None, cert: Path | None = None,
        key: Path | None = None,
    ) -> str:  # fmt: skip
        """A store URL under prefix: the right CA file and client certificate unless given."""
        ca = ca or self.certs["ca.crt"]
        cert = cert or self.certs["client.crt"]
        key = key or self.certs["client.key"]
        if self.backend == "redis":
            return (
                f"rediss://{self.server}/0?prefix={prefix}&ssl_ca_certs={ca}"
                f"&ssl_certfile={cert}&ssl_keyfile={key}"
            )
        return f"etcds://{self.server}/{prefix}?ca={ca}&cert={cert}&key={key}"

    def other_client(self, prefix: str) -> str:
        """A URL with a well-formed client certificate that another CA signed."""
        return self.url(
            prefix, cert=self.certs["other-client.crt"], key=self.certs["other-client.key"]
        )

    def written(self, prefix: str) -> list[str]:
        """Every key under prefix, read with the right CA and client certificate."""
        if self.backend == "redis":
            client = redis.Redis(
                host="127.0.0.1",
                port=self.port,
                ssl=True,
                ssl_ca_certs=str(self.certs["ca.crt"]),
                ssl_certfile=str(self.certs["client.crt"]),
                ssl_keyfile=str(self.certs["client.key"]),
                socket_timeout=5,
            )
            try:
                keys = client.keys(f"*{prefix}*")  # the store's: {prefix}:... (hash-tagged)
                return sorted(k.decode() if isinstance(k, bytes) else k for k in keys)
            finally:
                client.close()
        try:
            store = open_store(self.url(prefix), create=False)
        except ConfigError as exc:
            assert "no HamsterBunker store" in str(exc), exc
            return []
        store.close()
        return [f"{prefix}/..."]  # something is there


@pytest.fixture(scope="module")
def tls_stores(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, TlsStore]]:
    """One mutual-TLS Redis and one mutual-TLS etcd for this module's tests (each its own prefix)."""
    certs = make_certificates(tmp_path_factory.mktemp("certs"))
    tls_port = free_port()
    redis_server = RedisServer.start(*mutual_tls_args(tls_port, certs))
    etcd_server = EtcdServer.start(certs=certs)
    try:
        yield {
            "redis": TlsStore("redis", tls_port, certs),
            "etcd": TlsStore("etcd", etcd_server.port, certs),
        }
    finally:
        redis_server.stop()
        etcd_server.stop()


def fresh_prefix() -> str:
    return f"tls{uuid.uuid4().hex[:12]}"


NODE = ["--node-id", "tls-node"]


def hb_run_node(url: str, timeout: float = 60) -> tuple[subprocess.CompletedProcess[str], float]:
    """``hb run`` of the demo counter on url, to its end; the result and how long it took."""
    started = time.monotonic()
    result = run_hb(
        ["run", "--store", url, "--agent", AGENT, "--node-id", "tls-node", "--create-store", *FAST],
        env=hb_env(HB_SECRET=SECRET),
        timeout=timeout,
    )
    return result, time.monotonic() - started


def one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    """The single line on stderr (asserting there is exactly one, and no traceback)."""
    assert "Traceback" not in result.stderr, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    return lines[0]


@pytest.mark.parametrize("backend", ["redis", "etcd"])
def test_hb_run_with_the_right_certificates_leads(
    tls_stores: dict[str, TlsStore], backend: str, tmp_path: Path
) -> None:
    """The control: with the server's CA and a client certificate it signed, a node leads."""
    tls, prefix = tls_stores[backend], fresh_prefix()
    url = tls.url(prefix)
    log_path = tmp_path / "node.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [*HB, "run", "--create-store", "--store", url, "--agent", AGENT, *NODE, *FAST],
            env=hb_env(HB_SECRET=SECRET),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        store = open_store(url)

        def leading() -> bool:
            lease = store.read_lease(AGENT_ID)
            return (
                lease is not None
                and lease.holder == "tls-node"
                and bool(store.list_checkpoints(AGENT_ID))
            )

        wait_until(leading, "the node to lead and publish over TLS")
        assert tls.written(prefix), "the probe of written keys sees nothing"
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=20) == 0, log_path.read_text()
        store.close()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=10)


@pytest.mark.parametrize("backend", ["redis", "etcd"])
def test_hb_run_with_a_client_certificate_of_another_ca_fails_in_one_line(
    tls_stores: dict[str, TlsStore], backend: str
) -> None:
    """A client certificate the server's CA did not sign: exit 1 at once, one line naming the
    store and the refused certificate, no traceback, nothing written."""
    tls, prefix = tls_stores[backend], fresh_prefix()
    result, took = hb_run_node(tls.other_client(prefix))

    assert result.returncode == 1, result.stderr
    assert took < REFUSED_WITHIN_S
    line = one_error_line(result)
    assert line.startswith(f"hb run: failed: {backend} store "), line
    assert tls.server in line, line
    assert "TLS handshake refused" in line, line
    assert "did not accept the client certificate" in line, line
    assert str(tls.certs["other-client.crt"]) in line, line
    assert result.stdout == ""
    assert tls.written(prefix) == []


@pytest.mark.parametrize("backend", ["redis", "etcd"])
def test_hb_run_with_a_ca_that_did_not_sign_the_server_fails_in_one_line(
    tls_stores: dict[str, TlsStore], backend: str
) -> None:
    """A CA file that did not sign the server's certificate: exit 1 at once, one line naming the
    store, the untrusted server certificate and the CA file, no traceback, nothing written."""
    tls, prefix = tls_stores[backend], fresh_prefix()
    result, took = hb_run_node(tls.url(prefix, ca=tls.certs["other-ca.crt"]))

    assert result.returncode == 1, result.stderr
    assert took < REFUSED_WITHIN_S
    line = one_error_line(result)
    assert line.startswith(f"hb run: failed: {backend} store "), line
    assert tls.server in line, line
    assert "TLS handshake failed: the server's certificate is not trusted" in line, line
    assert str(tls.certs["other-ca.crt"]) in line, line
    assert result.stdout == ""
    assert tls.written(prefix) == []


@pytest.mark.parametrize("backend", ["redis", "etcd"])
def test_hb_status_with_a_refused_client_certificate_fails_in_one_line(
    tls_stores: dict[str, TlsStore], backend: str
) -> None:
    """``hb status`` with a client certificate the server refuses: one line, exit 2 (status
    cannot tell)."""
    tls = tls_stores[backend]
    started = time.monotonic()
    result = run_hb(["status", "--store", tls.other_client(fresh_prefix()), "--agent-id", AGENT_ID])
    assert result.returncode == 2, result.stderr
    assert time.monotonic() - started < REFUSED_WITHIN_S
    line = one_error_line(result)
    assert line.startswith(f"hb status: failed: {backend} store "), line
    assert "did not accept the client certificate" in line, line


@pytest.mark.parametrize("missing", ["ca", "cert", "key"])
@pytest.mark.parametrize("backend", ["redis", "etcd"])
def test_hb_run_with_a_certificate_file_that_does_not_exist_is_one_line_exit_2(
    tls_stores: dict[str, TlsStore], backend: str, missing: str, tmp_path: Path
) -> None:
    """A CA, certificate or key file that does not exist: one line naming the option and the
    path, exit 2, no traceback, nothing written."""
    tls, prefix = tls_stores[backend], fresh_prefix()
    nowhere = tmp_path / f"no-such-{missing}.pem"
    url = tls.url(prefix, **{missing: nowhere})
    option = {"ca": "ssl_ca_certs", "cert": "ssl_certfile", "key": "ssl_keyfile"}[missing]
    option = option if backend == "redis" else missing
    assert f"{option}={nowhere}" in url, url  # the URL really names the missing file

    result, took = hb_run_node(url)

    assert result.returncode == 2, result.stderr
    assert took < REFUSED_WITHIN_S
    line = one_error_line(result)
    assert line.startswith("hb run: error: "), line
    assert f"{option} file {nowhere} does not exist" in line, line
    assert tls.written(prefix) == []


@pytest.mark.parametrize("problem", ["not PEM", "key of another certificate"])
@pytest.mark.parametrize("backend", ["redis", "etcd"])
def test_hb_run_with_an_unusable_client_certificate_is_one_line_exit_2(
    tls_stores: dict[str, TlsStore], backend: str, problem: str, tmp_path: Path
) -> None:
    """A client certificate file that is not PEM, or a key that is not the certificate's: one
    line naming both files, exit 2 before any connection, no traceback, nothing written."""
    tls, prefix = tls_stores[backend], fresh_prefix()
    if problem == "not PEM":
        cert, key = tmp_path / "client.crt", tls.certs["client.key"]
        cert.write_text("this is not a certificate\n")
    else:
        cert, key = tls.certs["client.crt"], tls.certs["other-client.key"]

    result, took = hb_run_node(tls.url(prefix, cert=cert, key=key))

    assert result.returncode == 2, result.stderr
    assert took < REFUSED_WITHIN_S
    line = one_error_line(result)
    assert line.startswith("hb run: error: "), line
    assert f"{cert} and " in line and str(key) in line, line
    assert "are not a usable client certificate and key" in line, line
    assert tls.written(prefix) == []


def test_an_encrypted_client_key_is_checked_with_its_password_and_never_prompted_for(
    tls_stores: dict[str, TlsStore], tmp_path: Path
) -> None:
    """An encrypted client key without its password is refused at once (OpenSSL would
    otherwise prompt on the terminal, which hangs a service); with ssl_password it is loaded."""
    certs = tls_stores["redis"].certs
    key = serialization.load_pem_private_key(certs["client.key"].read_bytes(), password=None)
    encrypted = tmp_path / "client-encrypted.key"
    encrypted.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"hunter22"),
        )
    )
    cert: tuple[str, str | None] = ("ssl_certfile", str(certs["client.crt"]))
    locked: tuple[str, str | None] = ("ssl_keyfile", str(encrypted))
    problem = tls_files_problem(cert=cert, key=locked)
    assert problem is not None and "encrypted key needs its password" in problem, problem
    assert tls_files_problem(cert=cert, key=locked, password="wrong") is not None
    assert tls_files_problem(cert=cert, key=locked, password="hunter22") is None


# -- hb demo on Redis and etcd ---------------------------------------------------------


@pytest.mark.parametrize("backend", ["redis", "etcd"])
def test_hb_demo_survives_a_kill_on_the_backend_and_hb_status_shows_the_lease(
    backend: str, capsys: pytest.CaptureFixture[str], record_property: Callable[..., None]
) -> None:
    """``hb demo --store URL`` on Redis or etcd: a standby resumes at epoch 2 with nothing
    lost; ``hb status`` afterwards shows that lease (released by the graceful end of the demo)
    with its epoch, and the last checkpoint under it."""
    url = {"redis": redis_url, "etcd": etcd_url}[backend]()
    result = run_demo(["--store", url], 90, capsys, record_property)
    out = result.stdout
    assert f"store {url}" in out.splitlines()[0], out
    assert SURVIVED in out.splitlines(), out
    check_rounds(out, [2])
    ((resumer, region, _count, epoch),) = RESUMED.findall(out)

    status = run_hb(["status", "--store", url, "--agent-id", AGENT_ID])
    # Every node stopped: the lease is released, no live leader (degraded).
    assert status.returncode == 1, status.stderr
    assert "no live leader: the lease is released" in status.stdout, status.stdout
    assert "Traceback" not in status.stderr
    shown = status.stdout
    assert shown.startswith(f"agent {AGENT_ID} · store "), shown
    lease_line = re.search(r"^lease: (.+)$", shown, re.M)
    assert lease_line is not None, shown
    as_json = json.loads(
        run_hb(["status", "--store", url, "--agent-id", AGENT_ID, "--json"]).stdout
    )
    lease = as_json["lease"]
    # The demo ends with a graceful stop of every node: the last holder released the lease.
    assert lease["holder"] is None, lease
    assert lease_line.group(1) == f"released · epoch {lease['epoch']}", shown
    assert lease["epoch"] >= int(epoch)
    if lease["epoch"] == int(epoch):  # no standby took the lease during the final stop
        assert lease["region"] == region, (lease, resumer)
    checkpoint = as_json["checkpoint"]
    assert checkpoint["epoch"] >= int(epoch), checkpoint
    assert re.search(
        rf"^last checkpoint: seq {checkpoint['seq']} \(epoch {checkpoint['epoch']}\)", shown, re.M
    ), shown
    # The nodes stopped gracefully dropped their heartbeats; only the SIGKILLed node's last
    # one may remain, from before the takeover.
    assert all(n["epoch"] < int(epoch) for n in as_json["nodes"]), as_json["nodes"]


def test_hb_demo_never_prints_a_redis_password(
    private_servers: list[RedisServer | EtcdServer],
    capsys: pytest.CaptureFixture[str],
    record_property: Callable[..., None],
) -> None:
    """``hb demo --store redis://:PASSWORD@...`` shows the store as ``:***@``, also when it
    refuses a store in use."""
    server = RedisServer.start("--requirepass", "s3cret-pw")
    private_servers.append(server)
    url = f"redis://:s3cret-pw@127.0.0.1:{server.port}/0?prefix={fresh_prefix()}"
    result = run_demo(["--store", url], 90, capsys, record_property)
    assert SURVIVED in result.stdout.splitlines(), result.stdout
    assert "s3cret-pw" not in result.stdout + result.stderr
    assert f"store redis://:***@127.0.0.1:{server.port}/0" in result.stdout.splitlines()[0]

    again = run_hb(["demo", "--store", url])  # the store is in use now
    assert again.returncode == 2, again.stderr
    assert "in use already" in again.stderr and "s3cret-pw" not in again.stderr + again.stdout


def test_local_nodes_keep_a_redis_password_off_their_command_lines(
    private_servers: list[RedisServer | EtcdServer], local_cluster: MakeCluster
) -> None:
    """Every user can read a process's command line: the nodes LocalCluster starts (the
    demo's) get the store URL, password and all, from $HB_STORE instead."""
    server = RedisServer.start("--requirepass", "s3cret-pw")
    private_servers.append(server)
    url = f"redis://:s3cret-pw@127.0.0.1:{server.port}/0?prefix={fresh_prefix()}"
    cluster = local_cluster(store_url=url)
    node = cluster.start(A)
    store = open_store(url)
    wait_until(lambda: store.read_lease("journal"), "node-a to take the lease over Redis")
    command_line = Path(f"/proc/{node.pid}/cmdline").read_bytes()
    assert b"s3cret-pw" not in command_line and b"redis://" not in command_line
    store.close()


# -- store outages shorter than the lease TTL ------------------------------------------

A, B = NodeSpec("node-a", "eu-central"), NodeSpec("node-b", "us-east")
TTL_MS = 8000  # renew deadline 0.6 × TTL = 4.8 s: every outage below stays well under it


def events(store: Store, kind: str | None = None, node: str | None = None) -> list[Event]:
    """Each event once: one whose write timed out on a frozen server, which stored it when
    thawed, is written again by its node (the same node and number, ``n``)."""
    unique = {(e.node, e.n): e for e in store.read_events("journal")}
    return [
        e
        for e in unique.values()
        if (kind is None or e.type == kind) and (node is None or e.node == node)
    ]


def latest_seq(store: Store) -> int:
    checkpoints = store.list_checkpoints("journal")
    return checkpoints[0].seq if checkpoints else 0


def log_count(cluster: LocalCluster, node: str, *kinds: str) -> int:
    """How many of the node's logged events are of these kinds (its log says what it emitted)."""
    return sum(
        1
        for line in cluster.log(node).splitlines()
        if any(f" {node} {kind} " in line for kind in kinds)
    )


FAILED = ("store.error", "lease.renew_failed")


@pytest.fixture
def private_servers() -> Iterator[list[RedisServer | EtcdServer]]:
    """Servers a test starts for itself; stopped after local_cluster's nodes (asked for first)."""
    started: list[RedisServer | EtcdServer] = []
    yield started
    for server in started:
        server.process.send_signal(signal.SIGCONT)  # a frozen server cannot handle SIGTERM
        server.stop()


@pytest.mark.parametrize("outage", ["redis-frozen", "etcd-frozen", "etcd-restarted"])
def test_a_store_outage_shorter_than_the_ttl_is_reported_then_recovered(
    private_servers: list[RedisServer | EtcdServer], local_cluster: MakeCluster, outage: str
) -> None:
    """The store's server frozen (SIGSTOP) or stopped and started again for less than the TTL:
    both nodes report the failure (store.error, or lease.renew_failed from the leader) and
    then store.recovered; the leader keeps its lease and epoch and goes on publishing; no epoch
    is reused (checker at teardown)."""
    backend, _, how = outage.partition("-")
    server: RedisServer | EtcdServer
    if backend == "redis":
        server = RedisServer.start()
        # Short client timeouts, so a frozen server is noticed well within the TTL.
        url = server.url(query="socket_timeout=0.5&socket_connect_timeout=0.5")
    else:
        server = EtcdServer.start()
        url = server.url(query="timeout=1")
    private_servers.append(server)
    cluster = local_cluster(timing=LeaseTiming(200, TTL_MS), store_url=url)
    cluster.start(A)
    store = open_store(url)
    wait_until(lambda: latest_seq(store) >= 3, "node-a to publish a few steps")
    lease = store.read_lease("journal")
    assert lease is not None and lease.holder == A.node and lease.epoch == 1
    cluster.start(B)
    wait_until(
        lambda: any(b.node == B.node and b.role == "standby"
                    for b in store.list_heartbeats("journal")),
        "node-b to stand by",
    )  # fmt: skip
    failed_before = {node: log_count(cluster, node, *FAILED) for node in (A.node, B.node)}
    seq_before = latest_seq(store)

    def both_noticed() -> bool:
        return all(
            log_count(cluster, node, *FAILED) > failed_before[node] for node in failed_before
        )

    # The outage lasts until both nodes have noticed it (their logs say so), which the short
    # client timeouts make about a second: well under the TTL.
    began = time.monotonic()
    if how == "frozen":
        server.process.send_signal(signal.SIGSTOP)
        try:
            wait_until(lambda: process_state(server.process.pid) == "T", "the server to freeze")
            wait_until(both_noticed, "both nodes to notice the frozen store", timeout=TTL_MS / 2000)
        finally:
            server.process.send_signal(signal.SIGCONT)
    else:
        assert isinstance(server, EtcdServer)
        server.halt()
        try:
            wait_until(
                both_noticed, "both nodes to notice the stopped store", timeout=TTL_MS / 2000
            )
        finally:
            server.start_again()  # same ports, same data
    outage_s = time.monotonic() - began
    assert outage_s < TTL_MS / 1000, f"the outage lasted {outage_s:.1f} s, not under the TTL"

    def reported_then_recovered(node: str, failures: tuple[str, ...]) -> bool:
        kinds = [e.type for e in events(store, node=node)]
        failed = [i for i, kind in enumerate(kinds) if kind in failures]
        return bool(failed) and "store.recovered" in kinds[failed[0] :]

    # The standby's lease reads failed and then worked again: store.error, store.recovered.
    wait_until(
        lambda: reported_then_recovered(B.node, ("store.error",)),
        "node-b to report store.error then store.recovered",
        timeout=60,
    )
    # The leader reported its failing renewals (or store calls) while the store was away ...
    wait_until(
        lambda: any(e.type in FAILED for e in events(store, node=A.node)),
        "node-a's failure events to reach the store",
        timeout=60,
    )
    # ... and renews and publishes again, under the same lease.
    renewals = store.read_lease("journal").renewals  # type: ignore[union-attr]
    wait_until(
        lambda: store.read_lease("journal").renewals > renewals + 3,  # type: ignore[union-attr]
        "node-a to renew again",
        timeout=60,
    )
    wait_until(
        lambda: latest_seq(store) >= seq_before + 5, "node-a to go on publishing", timeout=60
    )
    # Same holder, same epoch: an outage under the TTL cost no takeover.
    lease = store.read_lease("journal")
    assert lease is not None and (lease.holder, lease.epoch) == (A.node, 1), lease
    assert [e.node for e in events(store, "lease.acquired")] == [A.node]
    assert not events(store, "lease.lost")
    published = [(e.epoch, e.seq) for e in events(store, "checkpoint.published")]
    assert {epoch for epoch, _ in published} == {1}, published
    seqs = [seq for _, seq in published]
    assert seqs == sorted(set(seqs)), published  # each seq published once, in order
    assert {e.node for e in events(store, "checkpoint.published")} == {A.node}
    # The leader, too, says when the store answers again.
    wait_until(
        lambda: reported_then_recovered(A.node, FAILED),
        "node-a to report store.recovered after its failures",
        timeout=30,
    )
    store.close()
