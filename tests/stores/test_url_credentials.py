"""No credential a store URL carries is shown: not by redacted_url, an error, ``/status``,
``hb status``, a log line or a node's memory file.

Every credential below holds CREDENTIAL (or, for a password whose "/", "?" or
"#" was not percent-encoded, HEAD and CREDENTIAL on either side of it), so one
substring test finds any part of one that leaks. Servers listen on 127.0.0.1
only; a URL that must not connect names a port bound here but not listening.
"""

from __future__ import annotations

import json
import logging
import socket
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

pytest.importorskip("redis")

from cryptography.hazmat.primitives import serialization

from hamsterbunker.core.http_address import HttpAddress
from hamsterbunker.core.timing import LeaseTiming
from hamsterbunker.runtime import Runtime
from hamsterbunker.stores import open_store, redacted_url
from tests.support import each_ended, wait_until
from tests.support.agents import AGENT, SECRET, AsyncAgent, Recorder
from tests.support.cli import run_hb
from tests.support.redis_server import RedisServer, mutual_tls_args
from tests.support.server_process import free_port, stop_thawed
from tests.support.tls_certs import make_certificates

CREDENTIAL = "Cr3dential"
HEAD = "Hd7"  # the start of a password cut short by a "/", "?" or "#" not percent-encoded
LEAKS = (CREDENTIAL, HEAD)
# Bound and never listening, for as long as the tests run: a store on it is refused at once.
_NOT_LISTENING = socket.socket()
_NOT_LISTENING.bind(("127.0.0.1", 0))
CLOSED = _NOT_LISTENING.getsockname()[1]
HOST = f"127.0.0.1:{CLOSED}"

# name -> a store URL with a credential in it, on every backend and in every place a URL
# can carry one.
FORMS: dict[str, str] = {
    "redis-user-and-password": f"redis://app:{CREDENTIAL}@{HOST}/0?prefix=p",
    "redis-password-only": f"redis://:{CREDENTIAL}@{HOST}/0",
    "redis-token-as-user": f"redis://{CREDENTIAL}@{HOST}/0",
    "redis-password-option": f"redis://{HOST}/0?prefix=p&password={CREDENTIAL}",
    "redis-username-option": f"redis://{HOST}/0?username={CREDENTIAL}",
    "rediss-ssl-password": f"rediss://{HOST}/0?ssl_password={CREDENTIAL}",
    "redis-token-option": f"redis://{HOST}/0?token={CREDENTIAL}",
    "redis-encoded-option-name": f"redis://{HOST}/0?pass%77ord={CREDENTIAL}",
    "redis-bare-token": f"redis://{HOST}/0?{CREDENTIAL}",
    "redis-fragment": f"redis://{HOST}/0#{CREDENTIAL}",
    "redis-unencoded-slash": f"redis://app:{HEAD}/{CREDENTIAL}@{HOST}/0",
    "redis-unencoded-question-mark": f"redis://app:{HEAD}?{CREDENTIAL}@{HOST}/0",
    "redis-unencoded-hash": f"redis://app:{HEAD}#{CREDENTIAL}@{HOST}/0",
    "redis-bad-database": f"redis://app:{CREDENTIAL}@{HOST}/zero",
    "redis-bad-port": f"redis://app:{CREDENTIAL}@127.0.0.1:port/0",
    "etcd-user-and-password": f"etcd://app:{CREDENTIAL}@{HOST}/p",
    "etcd-unencoded-slash": f"etcd://app:{HEAD}/{CREDENTIAL}@{HOST}/p",
    "etcd-token-option": f"etcd://{HOST}/p?token={CREDENTIAL}",
    "etcd-bad-endpoint": f"etcd://{HOST},[::1/p?token={CREDENTIAL}",
    "file-userinfo": f"file://app:{CREDENTIAL}@/srv/store",
    "file-token-option": f"file:///srv/store?token={CREDENTIAL}",
    "syncdir-userinfo": f"syncdir://app:{CREDENTIAL}@/srv/store",
    "syncdir-token-option": f"syncdir:///srv/store?token={CREDENTIAL}",
    "unknown-scheme": f"https://{CREDENTIAL}@example.org/store?token={CREDENTIAL}",
}


def leaked(text: str) -> list[str]:
    return [part for part in LEAKS if part in text]


@pytest.mark.parametrize("url", FORMS.values(), ids=FORMS.keys())
def test_redacted_url_shows_no_credential(url: str) -> None:
    """redacted_url keeps no part of a password, token or credential option of the URL."""
    assert leaked(redacted_url(url)) == []


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        (f"redis://app:{CREDENTIAL}@h:6379/2?prefix=p", "redis://app:***@h:6379/2?prefix=p"),
        (f"redis://{CREDENTIAL}@h/0", "redis://***@h/0"),
        (
            f"rediss://h/0?ssl_ca_certs=/ca.pem&ssl_password={CREDENTIAL}&socket_timeout=1",
            "rediss://h/0?ssl_ca_certs=/ca.pem&ssl_password=***&socket_timeout=1",
        ),
        (
            "etcds://a:2379,b:2379/p?ca=/ca.pem&timeout=3",
            "etcds://a:2379,b:2379/p?ca=/ca.pem&timeout=3",
        ),
        ("file:///srv/agent@1/store", "file:///srv/agent@1/store"),
        ("syncdir:///srv/store", "syncdir:///srv/store"),
    ],
)
def test_redacted_url_keeps_what_names_the_store(url: str, shown: str) -> None:
    """Scheme, user name, hosts, ports, path and the options that are no secret stay as given."""
    assert redacted_url(url) == shown


@pytest.mark.parametrize("url", FORMS.values(), ids=FORMS.keys())
def test_a_store_that_refuses_or_fails_shows_no_credential(url: str) -> None:
    """Opening, then reading, a store whose URL holds a credential: whatever error it raises
    (a refused URL, a server that does not answer) shows no part of that credential."""
    try:
        store = open_store(url, create=False, sync_delay_ms=0 if "syncdir" in url else None)
        try:
            store.read_cluster()
        finally:
            store.close()
    except Exception as exc:  # every error a caller could print
        assert leaked(f"{exc} {exc!r}") == []
    else:
        pytest.fail(f"{url} opened: nothing listens on port {CLOSED}")


@pytest.mark.parametrize(
    "name", ["redis-password-option", "redis-unencoded-slash", "etcd-user-and-password"]
)
def test_hb_status_on_a_store_that_fails_shows_no_credential(name: str) -> None:
    """``hb status`` on a store it cannot use prints its one line without the credential."""
    result = run_hb(["status", "--store", FORMS[name], "--agent-id", AGENT])
    assert result.returncode != 0 and result.stderr.startswith("hb status: "), result.stderr
    assert leaked(result.stdout + result.stderr) == []


# -- a node on a store whose URL holds three credentials ------------------------------


@pytest.fixture
def private_server() -> Iterator[Callable[..., RedisServer]]:
    with each_ended(RedisServer.start, stop_thawed) as start:
        yield start


@pytest.fixture
def nodes() -> Iterator[list[Runtime]]:
    started: list[Runtime] = []
    yield started
    for node in started:
        node.stop(timeout=10)


def encrypted_key(certs: dict[str, Path], password: str, where: Path) -> Path:
    """The client key of certs, encrypted with password."""
    key = serialization.load_pem_private_key(certs["client.key"].read_bytes(), password=None)
    where.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(password.encode()),
        )
    )
    return where


def test_a_nodes_status_logs_and_memory_and_hb_status_show_no_credential_of_its_store(
    tmp_path: Path,
    private_server: Callable[..., RedisServer],
    nodes: list[Runtime],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A node on a rediss:// store whose URL holds Redis's password (as userinfo and as
    password=) and its client key's ssl_password=: neither its log lines (a wait for the
    store at start included), its /status, its memory file, nor ``hb status`` (text and JSON)
    show any of them, while each shows the store."""
    password, key_password = f"pw-{CREDENTIAL}", f"key-{CREDENTIAL}"
    certs = make_certificates(tmp_path)
    key = encrypted_key(certs, key_password, tmp_path / "client-encrypted.key")
    tls_port = free_port()
    url = (
        f"rediss://default:{password}@127.0.0.1:{tls_port}/0?prefix=credentials"
        f"&password={password}&ssl_ca_certs={certs['ca.crt']}&ssl_certfile={certs['client.crt']}"
        f"&ssl_keyfile={key}&ssl_password={key_password}"
    )
    caplog.set_level(logging.DEBUG)
    events = Recorder()
    node = Runtime(
        node_id="a", region="eu", store=url, agent=AsyncAgent(), secret=SECRET,
        timing=LeaseTiming(tick_ms=100, lease_ttl_ms=600), on_event=events,
        http=HttpAddress("127.0.0.1", 0), state_dir=tmp_path / "state",
    )  # fmt: skip
    nodes.append(node)
    node.start()
    wait_until(lambda: "waiting for the store" in caplog.text, "the node to wait for its store", 30)
    private_server("--requirepass", password, *mutual_tls_args(tls_port, certs))
    events.wait("agent.step", "a", timeout=30)

    assert node.endpoints is not None
    with urllib.request.urlopen(
        f"http://127.0.0.1:{node.endpoints.port}/status", timeout=10
    ) as got:
        status = got.read().decode()
    assert json.loads(status)["store"].startswith(f"rediss://default:***@127.0.0.1:{tls_port}/0")
    shown = run_hb(["status", "--store", url, "--agent-id", AGENT])
    as_json = run_hb(["status", "--store", url, "--agent-id", AGENT, "--json"])
    assert shown.stdout.startswith(f"agent {AGENT} · store rediss://default:***@"), shown
    assert json.loads(as_json.stdout)["store"] == json.loads(status)["store"]
    node.stop(timeout=10)
    memory = "".join(p.read_text() for p in (tmp_path / "state").rglob("*.json"))
    assert "rediss://default:***@" in memory

    for what, text in [
        ("the log", caplog.text),
        ("/status", status),
        ("hb status", shown.stdout + shown.stderr),
        ("hb status --json", as_json.stdout + as_json.stderr),
        ("the memory file", memory),
    ]:
        assert leaked(text) == [], (what, text)
