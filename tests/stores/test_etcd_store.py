"""An etcd store beyond the shared contract: URLs, endpoints, a dead or frozen member, the
watch, large checkpoints, TLS, the CLI and the monitor.

The contract every backend keeps runs on etcd in tests/stores/contract; this file
checks what only an etcd-backed store can get wrong. Members listen on
127.0.0.1 only (tests/support/etcd_server.py).
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("etcd3gw")


from hamsterbunker.core.errors import (
    ConfigError,
    Fenced,
    StoreError,
    StoreUnavailable,
)
from hamsterbunker.records import Heartbeat
from hamsterbunker.stores import open_store
from hamsterbunker.stores.backends.etcd import EtcdBackend
from hamsterbunker.stores.backends.etcd_connection import parse_etcd_url
from hamsterbunker.stores.base import Fence
from hamsterbunker.stores.interface import Store
from hamsterbunker.stores.layer import RecordStore
from tests.support import each_ended, process_state, wait_until
from tests.support.etcd_server import EtcdServer, etcd_url, shared_etcd
from tests.support.records import lease
from tests.support.records import network_event as event
from tests.support.server_process import free_port, stop_thawed
from tests.support.store_watch import next_wake
from tests.support.tls_certs import make_certificates

WAIT_S = 10.0


# -- helpers -----------------------------------------------------------------


def heartbeat(node: str, role: str = "standby") -> Heartbeat:
    return Heartbeat(
        node=node,
        region="eu",
        host="h",
        pid=1,
        role=role,
        epoch=1,
        seq=0,
        leader=None,
        time=time.time(),
    )


@pytest.fixture
def private_server() -> Iterator[Callable[..., EtcdServer]]:
    """Start members of this test's own (to stop, freeze or restart); all stopped at the end."""
    with each_ended(EtcdServer.start, stop_thawed) as start:
        yield start


def _record_store(url: str, **settings: Any) -> RecordStore:
    return RecordStore(EtcdBackend(url), **settings)


@pytest.fixture
def opened() -> Iterator[Callable[..., RecordStore]]:
    """Open record-layer stores on etcd backends; all closed at the end."""
    with each_ended(_record_store, RecordStore.close) as open_one:
        yield open_one


@pytest.fixture
def by_url() -> Iterator[Callable[..., Store]]:
    """Open stores by URL, as hb does (``open_store``: the record layer); closed at the end."""
    with each_ended(open_store, Store.close) as open_one:
        yield open_one


def watch_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("hb-etcd-watch")]


# -- URLs ----------------------------------------------------------------------


def test_url_names_endpoints_prefix_and_options(tmp_path: Path) -> None:
    """Several endpoints (default port 2379, IPv6 in brackets), the key prefix and the options."""
    target = parse_etcd_url("etcd://127.0.0.1:23790,[::1]:23791,localhost/hb/prod/?timeout=2.5")
    assert target.endpoints == (("127.0.0.1", 23790), ("::1", 23791), ("localhost", 2379))
    assert (target.prefix, target.timeout, target.tls) == ("/hb/prod", 2.5, False)
    certs = make_certificates(tmp_path)  # the files are loaded: they must be real ones
    ca, cert, key = (str(certs[name]) for name in ("ca.crt", "client.crt", "client.key"))
    tls = parse_etcd_url(f"etcds://127.0.0.1/p?ca={ca}&cert={cert}&key={key}")
    assert tls.tls and (tls.ca, tls.cert, tls.key) == (ca, cert, key)


def test_missing_etcd3gw_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without etcd3gw, an etcd:// URL tells how to install it."""
    for name in [name for name in sys.modules if name.partition(".")[0] == "etcd3gw"]:
        monkeypatch.setitem(sys.modules, name, None)
    for name in [n for n in sys.modules if n.startswith("hamsterbunker.stores.backends.etcd")]:
        monkeypatch.delitem(sys.modules, name)  # the backend and its connection and watch
    with pytest.raises(ConfigError, match=r"hamsterbunker\[etcd\]"):
        open_store("etcd://127.0.0.1:2379/p")


def test_reader_of_an_empty_prefix_is_refused(by_url: Callable[..., Store]) -> None:
    """open_store(create=False), as hb status and hb-tui use it, refuses a prefix that holds nothing."""
    url = etcd_url()
    with pytest.raises(ConfigError, match="no HamsterBunker store"):
        open_store(url, create=False)
    by_url(url).put_heartbeat("a", heartbeat("n1"))
    reader = by_url(url, create=False)
    assert [b.node for b in reader.list_heartbeats("a")] == ["n1"]


# -- endpoints, a member that is gone or frozen -------------------------------------


def test_a_dead_endpoint_fails_one_call_then_the_next_endpoint_answers(
    opened: Callable[..., RecordStore],
) -> None:
    """With several endpoints, a call to a dead one is StoreUnavailable and the next call moves on."""
    server = shared_etcd()
    dead = free_port()
    prefix = f"hb-test/{time.monotonic_ns()}"
    store = opened(f"etcd://127.0.0.1:{dead},{server.endpoint}/{prefix}?timeout=2")
    with pytest.raises(StoreUnavailable, match=f"127.0.0.1:{dead}"):
        store.read_lease("a")
    held = store.cas_lease("a", None, lease("n1", 1))
    assert store.read_lease("a") == held


def test_frozen_server_is_store_unavailable_within_the_timeout(
    private_server: Callable[..., EtcdServer], opened: Callable[..., RecordStore]
) -> None:
    """A member that stops answering (SIGSTOP) gives StoreUnavailable after the timeout, not a hang."""
    server = private_server()
    store = opened(server.url(query="timeout=0.5"))
    held = store.cas_lease("a", None, lease("n1", 1))
    server.process.send_signal(signal.SIGSTOP)
    # Stopping every thread of the member takes a moment: a call before that is answered.
    wait_until(lambda: process_state(server.process.pid) == "T", "the member to stop")
    calls: list[Callable[[], object]] = [
        lambda: store.read_lease("a"),
        lambda: store.cas_lease("a", held.version, lease("n1", 1)),
    ]
    try:
        for call in calls:
            started = time.monotonic()
            with pytest.raises(StoreUnavailable):
                call()
            assert time.monotonic() - started < 3.0
    finally:
        server.process.send_signal(signal.SIGCONT)


# -- watch -------------------------------------------------------------------------


def test_watch_wakes_at_once_on_a_release(opened: Callable[..., RecordStore]) -> None:
    """A standby's lease watch wakes within a fraction of a second when the holder releases."""
    url = etcd_url()
    standby, holder = opened(url), opened(url)

    async def main() -> float:
        watcher = standby.watch("a", lease_only=True)
        try:
            await next_wake(watcher, holder)  # the watch is set up and streaming
            current = await asyncio.to_thread(holder.read_lease, "a")
            assert current is not None
            woke = asyncio.ensure_future(anext(watcher))
            started = time.monotonic()
            await asyncio.to_thread(holder.cas_lease, "a", current.version, lease(None, 1))
            await asyncio.wait_for(woke, WAIT_S)
            return time.monotonic() - started
        finally:
            await watcher.aclose()  # type: ignore[attr-defined]

    took = asyncio.run(main())
    assert took < 1.0, f"the release woke the watch after {took:.2f} s"


def test_closing_a_watch_or_the_store_ends_its_thread(opened: Callable[..., RecordStore]) -> None:
    """aclose() of a watch, or close() of its store, ends the watch's thread (bounded)."""
    url = etcd_url()
    store, writer = opened(url), opened(url)
    before = set(watch_threads())

    async def main() -> None:
        first, second = store.watch("a", lease_only=True), store.watch("a")
        await next_wake(first, writer)
        await next_wake(second, writer)
        assert len(set(watch_threads()) - before) == 2
        await first.aclose()  # type: ignore[attr-defined]
        store.close()  # ends the second, still open, watch too

    asyncio.run(main())
    for thread in set(watch_threads()) - before:
        thread.join(WAIT_S)
        assert not thread.is_alive(), f"{thread.name} still runs"


# -- limits ------------------------------------------------------------


@pytest.mark.parametrize("size", [1_600_000, 3_000_000], ids=["over-request-limit", "over-grpc"])
def test_too_large_checkpoint_is_refused_clearly(
    opened: Callable[..., RecordStore], size: int
) -> None:
    """A checkpoint over etcd's request limit is a StoreError naming the size and the setting."""
    store = opened(etcd_url())
    held = store.cas_lease("a", None, lease("n1", 1))
    fence = Fence("n1", "s1", held.epoch)
    store.put_checkpoint("a", fence, 1, b"small")
    with pytest.raises(StoreError) as caught:
        store.put_checkpoint("a", fence, 2, bytes(size))
    assert not isinstance(caught.value, (Fenced, StoreUnavailable))
    assert f"{size} bytes" in str(caught.value) and "--max-request-bytes" in str(caught.value)
    assert [i.seq for i in store.list_checkpoints("a")] == [1]
    assert store.put_checkpoint("a", fence, 2, bytes(1_400_000)).size == 1_400_000


# -- TLS ---------------------------------------------------------------------------


def test_etcds_with_client_certificates(
    tmp_path: Path,
    private_server: Callable[..., EtcdServer],
    opened: Callable[..., RecordStore],
) -> None:
    """Over mutual TLS the store works, watch included; without a client certificate, or with a
    wrong CA, it is refused."""
    certs = make_certificates(tmp_path)
    server = private_server(certs=certs)
    client = f"cert={certs['client.crt']}&key={certs['client.key']}"
    url = server.url(prefix="tls", query=f"ca={certs['ca.crt']}&{client}")
    store, writer = opened(url), opened(url)
    store.cas_lease("a", None, lease("n1", 1))
    store.put_checkpoint("a", Fence("n1", "s1", 1), 1, b"sealed")
    assert [i.seq for i in store.list_checkpoints("a")] == [1]

    async def watch_once() -> None:
        watcher = store.watch("a")
        try:
            await next_wake(watcher, writer)
        finally:
            await watcher.aclose()  # type: ignore[attr-defined]

    asyncio.run(watch_once())
    # Certificates that do not match are a setting to fix, not an outage to wait out.
    no_client_cert = opened(server.url(prefix="tls", query=f"ca={certs['ca.crt']}"))
    with pytest.raises(StoreError) as refused:
        no_client_cert.read_lease("a")
    assert not isinstance(refused.value, StoreUnavailable)
    wrong_ca = opened(server.url(prefix="tls", query=f"ca={certs['other-ca.crt']}&{client}"))
    with pytest.raises(StoreError) as refused:
        wrong_ca.read_lease("a")
    assert not isinstance(refused.value, StoreUnavailable)
    plain = opened(f"etcd://{server.endpoint}/tls?timeout=2")
    with pytest.raises(StoreUnavailable):
        plain.read_lease("a")


# -- hb status and the monitor ---------------------------------------------------------


def test_hb_status_reads_an_etcd_store(by_url: Callable[..., Store]) -> None:
    """hb status --store etcd://... shows the holder and the nodes' heartbeats; an empty prefix
    is one line and exit 2."""
    url = etcd_url()
    store = by_url(url)
    store.cas_lease("a", None, lease("n1", 1))
    store.put_heartbeat("a", heartbeat("n1", role="active"))
    shown = hb("status", "--store", url, "--agent-id", "a", "--json", "--observe-ms", "0")
    assert shown.returncode == 0, shown.stderr
    status = json.loads(shown.stdout)
    assert status["lease"]["holder"] == "n1"
    assert [beat["node"] for beat in status["nodes"]] == ["n1"]
    empty = hb("status", "--store", etcd_url(), "--agent-id", "a")
    assert empty.returncode == 2
    assert "no HamsterBunker store" in empty.stderr and len(empty.stderr.splitlines()) == 1


def hb(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hamsterbunker", *args],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_monitor_follows_an_etcd_store(by_url: Callable[..., Store]) -> None:
    """hb-tui's monitor shows an etcd store's holder and events, and follows new ones."""
    pytest.importorskip("textual")
    from hamsterbunker_tui.app import MonitorApp

    from tests.tui.screen import screen_text, until

    url = etcd_url()
    store = by_url(url)
    store.cas_lease("a", None, replace(lease("n1", 1), ttl_ms=60_000))
    store.put_heartbeat("a", heartbeat("n1", role="active"))
    store.append_event("a", event("n1", 1))

    async def scenario() -> None:
        monitored = open_store(url, create=False)
        app = MonitorApp(monitored, "a")
        try:
            async with app.run_test(size=(150, 45)) as pilot:
                await until(pilot, "the holder", lambda: "holder  n1" in screen_text(app))
                assert "agent.step" in screen_text(app)
                store.append_event("a", replace(event("n1", 2), type="lease.renew_failed"))
                await until(
                    pilot, "the new event", lambda: "lease.renew_failed" in screen_text(app)
                )
        finally:
            monitored.close()

    asyncio.run(scenario())
