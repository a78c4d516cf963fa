"""``hb run`` makes a store only when asked: a store that does not exist yet (no cluster
record) is made with ``--create-store``, or by the node whose config ``hb init`` wrote
with a new secret on this host (``create_store_on``); any other node refuses in one
line, exit 2, writing nothing there, so that a mistyped URL does not start the agent
over in a new, empty store. Creating one is a WARNING naming the store."""

from __future__ import annotations

import signal
import socket
import subprocess
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from hamsterbunker import Runtime
from hamsterbunker.core.errors import ConfigError
from hamsterbunker.core.timing import LeaseTiming
from hamsterbunker.demo import CounterAgent
from hamsterbunker.node.cluster import Cluster
from hamsterbunker.stores import open_store, redacted_url
from hamsterbunker.testing import MemoryStore
from tests.support import wait_until
from tests.support.cli import AGENT, FAST, HB, SECRET, hb_env, run_hb

START_S = 60  # generous: a Python process starting on a busy 2-core machine
SYNC = ["--sync-delay-ms", "300", "--tick-ms", "100", "--lease-ttl-ms", "1000"]


def refusal(url: str) -> str:
    return (
        f"hb run: error: store {url} does not exist (it holds no cluster record); not creating "
        "it: check the store URL, or pass --create-store if this node starts a new cluster"
    )


@pytest.mark.parametrize("scheme", ["file", "syncdir"])
@pytest.mark.parametrize("folder", ["missing", "empty"])
def test_a_mistyped_folder_store_is_refused_in_one_line_and_nothing_is_made(
    tmp_path: Path, scheme: str, folder: str
) -> None:
    """The typo of the issue (stor1 for store): exit 2, one line naming the store and the
    way out, and no folder made (or nothing written in an existing one)."""
    typo = tmp_path / "stor1"
    if folder == "empty":
        typo.mkdir()
    url = f"{scheme}://{typo}"
    flags = SYNC if scheme == "syncdir" else FAST
    result = run_hb(["run", "--store", url, "--agent", AGENT, "--node-id", "n1", *flags],
                    env=hb_env(HB_SECRET=SECRET))  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert result.stderr.splitlines() == [refusal(url)]
    if folder == "missing":
        assert not typo.exists(), "a refused node made the store's folder"
    else:
        assert list(typo.iterdir()) == [], "a refused node wrote into the folder"


@pytest.mark.parametrize("backend", ["redis", "etcd"])
def test_a_store_on_a_server_with_no_cluster_record_is_refused_the_same(backend: str) -> None:
    """On Redis and etcd, a prefix no node ran on: the same line, with the URL as the
    store shows it, and nothing written under the prefix."""
    if backend == "redis":
        from tests.support.redis_server import redis_url

        url = redis_url()
    else:
        from tests.support.etcd_server import etcd_url

        url = etcd_url()
    result = run_hb(["run", "--store", url, "--agent", AGENT, "--node-id", "n1", *FAST],
                    env=hb_env(HB_SECRET=SECRET), timeout=60)  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert result.stderr.splitlines() == [refusal(redacted_url(url))]
    with pytest.raises(ConfigError, match="nothing is stored there"):
        open_store(url, create=False)


@contextmanager
def hb_node(log: Path, *args: str, env: dict[str, str]) -> Iterator[subprocess.Popen[bytes]]:
    """``hb run ARGS`` in the background, stopped (SIGTERM) on the way out."""
    with log.open("ab") as out:
        process = subprocess.Popen([*HB, "run", *args], env=env, stdin=subprocess.DEVNULL,
                                   stdout=out, stderr=subprocess.STDOUT)  # fmt: skip
    try:
        yield process
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


def wait_to_lead(process: subprocess.Popen[bytes], log: Path) -> str:
    """The node's log once its agent steps (failing at once if the node ended)."""

    def leading() -> str | None:
        text = log.read_text()
        assert process.poll() is None, text
        return text if "agent.started" in text or "agent.resumed" in text else None

    return wait_until(leading, "the node to lead", START_S)


def test_create_store_makes_it_with_a_warning_and_it_then_opens_without(tmp_path: Path) -> None:
    store, env = tmp_path / "store", hb_env(HB_SECRET=SECRET)
    run = ["--store", store.as_uri(), "--agent", AGENT, "--node-id", "n1", *FAST]
    first, second = tmp_path / "first.log", tmp_path / "second.log"
    with hb_node(first, *run, "--create-store", env=env) as node:
        text = wait_to_lead(node, first)
    created = [line for line in text.splitlines() if "store.created" in line]
    assert len(created) == 1 and " WARNING " in created[0], text
    assert f"store={store.as_uri()}" in created[0]
    # The store exists now: no flag needed, and nothing is created again.
    with hb_node(second, *run, env=env) as node:
        text = wait_to_lead(node, second)
    assert "store.created" not in text and "agent.resumed" in text, text


def hb_init(config_dir: Path, store: Path) -> subprocess.CompletedProcess[str]:
    return run_hb(["init", "n", "--store", store.as_uri(), "--agent", AGENT, "--node-id", "n1",
                   "--config-dir", str(config_dir), *FAST])  # fmt: skip


def test_the_config_hb_init_wrote_with_a_new_secret_makes_the_store(tmp_path: Path) -> None:
    """hb init's first node may make its store (create_store_on: this host); a node given
    the secret joins and makes none; the first's config copied to another host makes none."""
    first_dir, store = tmp_path / "first", tmp_path / "store"
    init = hb_init(first_dir, store)
    assert init.returncode == 0, init.stderr
    assert f"this node creates its store {store.as_uri()} at its first start" in init.stdout
    text = (first_dir / "n.toml").read_text()
    assert tomllib.loads(text)["create_store_on"] == socket.gethostname()
    secret_file = first_dir / "n.secret"
    env = hb_env(HB_SECRET=secret_file.read_text().strip())
    log = tmp_path / "node.log"
    with hb_node(log, "--instance", "n", env={**env, "CONFIGURATION_DIRECTORY": str(first_dir)}
                 ) as node:  # fmt: skip
        assert "store.created" in wait_to_lead(node, log)

    # The README's next node: given the secret, hb init keeps it and records nothing.
    joining_dir = tmp_path / "joining"
    joining_dir.mkdir()
    (joining_dir / "n.secret").write_bytes(secret_file.read_bytes())
    (joining_dir / "n.secret").chmod(0o600)
    joining = hb_init(joining_dir, store)
    assert joining.returncode == 0, joining.stderr
    assert "create_store_on" not in tomllib.loads((joining_dir / "n.toml").read_text())
    assert "creates its store" not in joining.stdout

    # The first node's config copied to another host, where its store is not there.
    copy_dir, elsewhere = tmp_path / "copy", tmp_path / "not-mounted"
    copy_dir.mkdir()
    copied = text.replace(store.as_uri(), elsewhere.as_uri())
    (copy_dir / "n.toml").write_text(copied.replace(f'"{socket.gethostname()}"', '"another-host"'))
    result = run_hb(["run", "--instance", "n"],
                    env={**env, "CONFIGURATION_DIRECTORY": str(copy_dir)})  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert result.stderr.splitlines() == [refusal(elsewhere.as_uri())]
    assert not elsewhere.exists()


def test_the_library_creates_by_default_with_a_warning_and_refuses_when_told(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Runtime(...) keeps making a new store (a store.created warning); create_store=False
    refuses a folder before anything is made, and any store at its cluster record."""
    timing = LeaseTiming(tick_ms=100, lease_ttl_ms=600)
    missing = tmp_path / "missing"
    with pytest.raises(ConfigError, match="does not exist"):
        Runtime(node_id="n1", region="r", store=missing.as_uri(), agent=CounterAgent(),
                secret=SECRET, timing=timing, create_store=False)  # fmt: skip
    assert not missing.exists()

    store = MemoryStore()
    kept = Cluster(store, "counter", SECRET, remembered=None, memory_path=None,
                   emit=print, create=False)  # fmt: skip
    with pytest.raises(ConfigError, match="does not exist"):
        kept.open()
    assert store.read_cluster() is None and not kept.created
    made = Cluster(store, "counter", SECRET, remembered=None, memory_path=None, emit=print)
    made.open()
    assert store.read_cluster() is not None and made.created

    node = Runtime(node_id="n1", region="r", store=(tmp_path / "s").as_uri(),
                   agent=CounterAgent(), secret=SECRET, timing=timing)  # fmt: skip
    with caplog.at_level("WARNING", logger="hamsterbunker"):
        node.start()
        try:
            wait_until(lambda: node.role == "active", "the node to lead", START_S)
        finally:
            node.stop()
    created = [r for r in caplog.records if "store.created" in r.getMessage()]
    assert [r.levelname for r in created] == ["WARNING"]
    assert (tmp_path / "s").as_uri() in created[0].getMessage()


def test_hb_init_again_with_force_keeps_the_leave_to_create_the_store(tmp_path: Path) -> None:
    """The first node's hb init run again (to choose another agent, as hb init suggests)
    keeps create_store_on; a config that had none gets none."""
    config_dir, store = tmp_path / "cfg", tmp_path / "store"
    assert hb_init(config_dir, store).returncode == 0
    again = run_hb(["init", "n", "--store", store.as_uri(), "--agent", "mypkg:Other",
                    "--config-dir", str(config_dir), "--force"])  # fmt: skip
    assert again.returncode == 0, again.stderr
    assert "this node creates its store" in again.stdout
    config = tomllib.loads((config_dir / "n.toml").read_text())
    assert (config["agent"], config["create_store_on"]) == ("mypkg:Other", socket.gethostname())
