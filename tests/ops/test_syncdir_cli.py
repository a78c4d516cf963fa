"""``syncdir:///path`` from ``hb``: the config key ``sync_delay_ms``, opening the store,
``hb status`` on it, and two real ``hb run`` nodes on two folders kept in step.

Each node has a folder of its own (a machine's copy of the synced folder);
``tests.support.syncdir`` plays the sync tool (``Sync.copy`` once, or a
``SyncPump`` that copies both ways in a thread). Every wait is bounded.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from hamsterbunker.core.errors import ConfigError, StoreError
from hamsterbunker.ops.config import load_instance, parse_config
from hamsterbunker.records import Event
from hamsterbunker.sealing import new_cluster_record
from hamsterbunker.stores import check_store_url, open_store
from hamsterbunker.stores.syncdir import SyncDirStore
from hamsterbunker.stores.syncdir.layout import MARKER
from tests.support.cli import AGENT, AGENT_ID, HB, SECRET, hb_env, run_hb, wait_for
from tests.support.records import cluster, fence_of, heartbeat, lease
from tests.support.syncdir import Sync, SyncPump

SYNCDIR = {"store": "syncdir:///srv/sync/hb", "agent": AGENT}
CONFIG = Path("/etc/hamsterbunker/agent.toml")


def assert_one_line_error(result: subprocess.CompletedProcess[str], *words: str) -> str:
    """Exit 2, one stderr line ``hb run: error: ...`` naming words, no traceback."""
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    for word in words:
        assert word.lower() in lines[0].lower(), f"{word!r} not in: {lines[0]}"
    return lines[0]


def tree(root: Path) -> dict[str, tuple[int, bytes]]:
    """Every entry under root: (mtime_ns, bytes of a file)."""
    return {
        str(p.relative_to(root)): (p.stat().st_mtime_ns, p.read_bytes() if p.is_file() else b"")
        for p in sorted(root.rglob("*"))
    }


# -- 1. the config key ----------------------------------------------------------------


def test_sync_delay_is_read_with_a_syncdir_store() -> None:
    config = parse_config({**SYNCDIR, "sync_delay_ms": 1000, "lease_ttl_ms": 3000}, CONFIG)
    assert config.sync_delay_ms == 1000 and config.check_sync_delay() == 1000
    assert config.to_toml_dict()["sync_delay_ms"] == 1000


@pytest.mark.parametrize(
    ("document", "words"),
    [
        pytest.param(SYNCDIR, ["needs sync_delay_ms", "set it"], id="required"),
        pytest.param(
            {"store": "file:///srv/hb", "agent": AGENT, "sync_delay_ms": 1000},
            ["sync_delay_ms only applies to a syncdir:// store"],
            id="refused-on-file",
        ),
        pytest.param(
            {"store": "redis://localhost:6379/0", "agent": AGENT, "sync_delay_ms": 1000},
            ["sync_delay_ms only applies to a syncdir:// store"],
            id="refused-on-redis",
        ),
        pytest.param(
            {**SYNCDIR, "sync_delay_ms": 1000},  # default tick 400, TTL 2000 < 2 × 1400
            ["lease_ttl=2000 ms is too short", "2800 ms"],
            id="ttl-too-short",
        ),
        pytest.param(
            {**SYNCDIR, "sync_delay_ms": 3_600_000, "lease_ttl_ms": 600_000},
            ["too short", "more than a lease may hold"],
            id="delay-beyond-any-ttl",
        ),
        pytest.param({**SYNCDIR, "sync_delay_ms": 0}, ["'sync_delay_ms'", "above 0"], id="zero"),
        pytest.param({**SYNCDIR, "sync_delay_ms": -5}, ["'sync_delay_ms'", "-5"], id="negative"),
        pytest.param(
            {**SYNCDIR, "sync_delay_ms": "10s"}, ["'sync_delay_ms'", "a string"], id="string"
        ),
        pytest.param(
            {**SYNCDIR, "sync_delay_ms": True}, ["'sync_delay_ms'", "boolean"], id="boolean"
        ),
        pytest.param(
            {**SYNCDIR, "sync_delay_ms": 1.5}, ["'sync_delay_ms'", "decimal"], id="decimal"
        ),
        pytest.param(
            {"store": "syncdir://relative/dir", "agent": AGENT, "sync_delay_ms": 1},
            ["absolute path"],
            id="relative-path",
        ),
    ],
)
def test_a_bad_sync_delay_is_one_error_naming_the_file(
    document: dict[str, object], words: list[str]
) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(document, CONFIG)
    message = str(caught.value)
    assert message.startswith(f"{CONFIG}: ") and "\n" not in message, message
    for word in words:
        assert word.lower() in message.lower(), f"{word!r} not in: {message}"


def test_the_node_id_is_never_taken_from_the_url(tmp_path: Path) -> None:
    """The node id comes from the config: a query in a syncdir URL is refused as it is read."""
    (tmp_path / "agent.toml").write_text(
        'store = "syncdir:///srv/x?node=n1"\nagent = "m:a"\nsync_delay_ms = 100\n'
    )
    with pytest.raises(ConfigError, match="takes no query") as caught:
        load_instance("agent", tmp_path)
    assert str(tmp_path / "agent.toml") in str(caught.value)


@pytest.mark.parametrize(
    ("text", "words"),
    [
        pytest.param("", ["needs sync_delay_ms"], id="required"),
        pytest.param("sync_delay_ms = 5000\n", ["too short", "10800 ms"], id="ttl-too-short"),
        pytest.param("sync_delay_ms = 0\n", ["'sync_delay_ms'", "above 0"], id="zero"),
    ],
)
def test_hb_run_instance_with_a_bad_sync_delay_is_one_line_exit_2(
    tmp_path: Path, text: str, words: list[str]
) -> None:
    directory, folder = tmp_path / "cfg", tmp_path / "sync"
    directory.mkdir()
    (directory / "agent.toml").write_text(
        f'store = "syncdir://{folder}"\nagent = "{AGENT}"\n{text}'
    )
    env = hb_env(CONFIGURATION_DIRECTORY=str(directory), HB_SECRET=SECRET)
    result = run_hb(["run", "--instance", "agent"], env=env, cwd=tmp_path)
    line = assert_one_line_error(result, *words)
    assert str(directory / "agent.toml") in line
    assert not folder.exists(), "a refused node made its store"


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        pytest.param([], ["hb run --sync-delay-ms", "needs sync_delay_ms"], id="required"),
        pytest.param(["--sync-delay-ms", "900"], ["too short", "2000 ms"], id="ttl-too-short"),
    ],
)
def test_hb_run_flags_on_a_syncdir_store(
    tmp_path: Path, flags: list[str], words: list[str]
) -> None:
    folder = tmp_path / "sync"
    result = run_hb(
        ["run", "--store", f"syncdir://{folder}", "--agent", AGENT, "--node-id", "n1",
         "--tick-ms", "100", "--lease-ttl-ms", "1500", *flags],
        env=hb_env(HB_SECRET=SECRET),
    )  # fmt: skip
    assert_one_line_error(result, *words)
    assert not folder.exists()


def test_hb_run_flag_sync_delay_on_a_file_store_is_refused(tmp_path: Path) -> None:
    result = run_hb(
        ["run", "--store", (tmp_path / "s").as_uri(), "--agent", AGENT, "--sync-delay-ms", "10"],
        env=hb_env(HB_SECRET=SECRET),
    )
    assert_one_line_error(result, "sync_delay_ms only applies to a syncdir:// store")
    assert not (tmp_path / "s").exists()


def test_hb_init_writes_the_sync_delay_and_refuses_a_short_ttl(tmp_path: Path) -> None:
    folder = tmp_path / "sync"
    base = [
        "init",
        "agent",
        "--config-dir",
        str(tmp_path / "cfg"),
        "--store",
        f"syncdir://{folder}",
    ]
    refused = run_hb([*base, "--sync-delay-ms", "5000"])
    assert refused.returncode == 2 and "too short" in refused.stderr, refused.stderr
    done = run_hb([*base, "--sync-delay-ms", "500", "--lease-ttl-ms", "2000"])
    assert done.returncode == 0, done.stderr
    config = load_instance("agent", tmp_path / "cfg")
    assert (config.store, config.sync_delay_ms) == (f"syncdir://{folder}", 500)


# -- 2. opening -----------------------------------------------------------------------


def test_check_store_url_takes_a_syncdir_url_with_an_absolute_path(tmp_path: Path) -> None:
    assert check_store_url(f"syncdir://{tmp_path}") == str(tmp_path)
    for bad in ("syncdir://host/dir", "syncdir:relative", f"syncdir://{tmp_path}?node=n1"):
        with pytest.raises(ConfigError):
            check_store_url(bad)


def test_a_writer_needs_the_node_and_the_delay(tmp_path: Path) -> None:
    url = f"syncdir://{tmp_path / 'sync'}"
    with pytest.raises(ConfigError, match="needs the node id and sync_delay_ms"):
        open_store(url)
    with pytest.raises(ConfigError, match="needs sync_delay_ms"):
        open_store(url, node="n1")
    with pytest.raises(ConfigError, match="needs the node id"):
        open_store(url, sync_delay_ms=100)
    with pytest.raises(ConfigError, match="needs this node's id"):
        SyncDirStore(tmp_path / "sync", sync_delay_ms=100)
    assert not (tmp_path / "sync").exists()
    with pytest.raises(ConfigError, match="only applies to a syncdir"):
        open_store((tmp_path / "file").as_uri(), node="n1", sync_delay_ms=100)
    store = open_store(url, node="n1", sync_delay_ms=100)
    assert isinstance(store, SyncDirStore)
    assert (store.node, store.sync_delay_ms, store.url) == ("n1", 100, url)
    assert (tmp_path / "sync" / "nodes" / "n1").is_dir()


def test_a_reader_opens_without_a_node_and_writes_nothing(tmp_path: Path) -> None:
    sync = Sync(tmp_path)
    one = sync.open("n1")
    one.create_cluster(cluster(1))
    held = one.cas_lease(AGENT_ID, None, lease("n1", 1))
    one.put_checkpoint(AGENT_ID, fence_of(held), 1, b"sealed-1")
    one.put_heartbeat(AGENT_ID, heartbeat("n1"))
    root = sync.root("n1")
    before = tree(root)
    time.sleep(0.01)  # an mtime would move
    reader = open_store(f"syncdir://{root}", create=False)
    assert isinstance(reader, SyncDirStore)
    assert (reader.node, reader.sync_delay_ms) == ("", 0)
    lease_read = reader.read_lease(AGENT_ID)
    assert lease_read is not None and lease_read.holder == "n1"
    assert [i.seq for i in reader.list_chains(AGENT_ID)["n1"]] == [1]
    assert reader.read_chain_checkpoint(AGENT_ID, "n1", reader.list_checkpoints(AGENT_ID)[0])
    assert list(reader.subtrees()) == ["n1"]  # its own subtree is one of the others
    assert [b.node for b in reader.list_heartbeats(AGENT_ID)] == ["n1"]
    with pytest.raises(StoreError, match="opened to read"):
        reader.put_heartbeat(AGENT_ID, heartbeat("x"))
    reader.close()
    with_delay = open_store(f"syncdir://{root}", create=False, sync_delay_ms=250)
    assert with_delay.sync_delay_ms == 250  # type: ignore[attr-defined]
    assert tree(root) == before
    with pytest.raises(ConfigError, match="does not exist"):
        open_store(f"syncdir://{tmp_path / 'nowhere'}", create=False)
    assert not (tmp_path / "nowhere").exists()


# -- 3. hb status on a syncdir folder ---------------------------------------------------


def two_nodes_that_diverged(sync: Sync) -> Path:
    """n1 and n2 each led epoch 2 in a partition (n2 wins); n2 reported n1's chain aside.
    Returns n2's folder, with a sync-conflict file the tool left."""
    one, two = sync.open("n1"), sync.open("n2")
    one.create_cluster(cluster(1))
    sync.both_ways("n1", "n2")
    first = one.cas_lease(AGENT_ID, None, lease("n1", 1))
    one.put_checkpoint(AGENT_ID, fence_of(first), 1, b"n1-1")
    sync.both_ways("n1", "n2")
    read_one, read_two = one.read_lease(AGENT_ID), two.read_lease(AGENT_ID)
    assert read_one is not None and read_two is not None
    held_one = one.cas_lease(AGENT_ID, read_one.version, lease("n1", 2, "a"))
    held_two = two.cas_lease(AGENT_ID, read_two.version, lease("n2", 2, "b"))
    for seq in (2, 3):
        one.put_checkpoint(AGENT_ID, fence_of(held_one), seq, f"n1-{seq}".encode())
    two.put_checkpoint(AGENT_ID, fence_of(held_two), 2, b"n2-2")
    for node, store in (("n1", one), ("n2", two)):
        store.put_heartbeat(AGENT_ID, heartbeat(node))
    two.append_event(AGENT_ID, Event(
        node="n2", n=1, type="store.diverged", time=time.time(), epoch=2, seq=2,
        detail={"winner": "2@n2", "term": "2@n1", "node": "n1", "from_seq": 2, "to_seq": 3,
                "count": 2, "forked_at": "seq 1 of term 1@n1",
                "aside": "term 2@n1: seq 2..3 (2 checkpoints)"},
    ))  # fmt: skip
    sync.both_ways("n1", "n2")
    root = sync.root("n2")
    conflict = root / "nodes" / "n1" / "agents" / f"lease.sync-conflict-20260101-{AGENT_ID}.json"
    conflict.parent.mkdir(parents=True, exist_ok=True)
    conflict.write_text("{}")
    (root / "nodes" / "bad name").mkdir()  # not a node id: skipped and reported
    return root


def test_hb_status_shows_the_syncdir_section(tmp_path: Path) -> None:
    root = two_nodes_that_diverged(Sync(tmp_path))
    before = tree(root)
    url = f"syncdir://{root}"
    args = ["status", "--store", url, "--agent-id", AGENT_ID, "--observe-ms", "0"]
    shown = run_hb(args)
    assert shown.returncode in (0, 1), shown.stderr
    text = shown.stdout
    assert "store mode: syncdir (no mutual exclusion: divergence is detected and kept aside" in text
    assert "sync delay: not known here" in text
    assert "node subtrees: n1, n2" in text
    assert "lease.sync-conflict-20260101-counter.json" in text and "never read as ours" in text
    assert "problems: 1" in text and "not named by a node id" in text
    assert "n1: epoch 1, seq 1..1 (1 checkpoint)" in text
    assert "n1: epoch 2, seq 2..3 (2 checkpoints)" in text
    assert "n2: epoch 2, seq 2..2 (1 checkpoint)" in text
    assert "seq 3 (epoch 2)" in text and "the newest of any chain" in text
    assert "not authenticated" in text
    assert "term 2@n1: seq 2..3 (2 checkpoints) · winner 2@n2" in text
    assert "reported by n2" in text
    assert "lease: n2" in text

    data = json.loads(run_hb([*args, "--json"]).stdout)
    section = data["syncdir"]
    assert section["mode"] == "syncdir" and section["sync_delay_ms"] is None
    assert section["nodes"] == ["n1", "n2"]
    assert any("sync-conflict" in f for f in section["sync_files"])
    assert [d["term"] for d in section["diverged"]] == ["2@n1"]
    assert section["diverged"][0]["reported_by"] == ["n2"]
    assert {(c["node"], c["epoch"], c["to_seq"]) for c in section["chains"]} == {
        ("n1", 1, 1),
        ("n1", 2, 3),
        ("n2", 2, 2),
    }
    assert data["lease"]["holder"] == "n2" and "nodes" in data  # the other fields are as before

    # One line per agent (no --agent-id) carries the store-wide part.
    listed = run_hb(["status", "--store", url, "--observe-ms", "0", "--json"])
    # a single agent is shown in full; the section is there too
    assert json.loads(listed.stdout)["syncdir"]["nodes"] == ["n1", "n2"]

    # With --instance, the sync delay its config states.
    config = tmp_path / "cfg"
    config.mkdir()
    (config / "agent.toml").write_text(
        f'store = "{url}"\nagent = "{AGENT}"\nnode_id = "n2"\nsync_delay_ms = 500\n'
        "tick_ms = 100\nlease_ttl_ms = 1200\n"
    )
    env = hb_env(CONFIGURATION_DIRECTORY=str(config))
    instance = run_hb(["status", "--instance", "agent", "--observe-ms", "0"], env=env)
    assert "sync delay: 500 ms (as configured)" in instance.stdout, instance.stderr
    assert tree(root) == before, "hb status wrote into the folder"


def test_hb_status_on_a_file_store_has_no_syncdir_section(tmp_path: Path) -> None:
    from hamsterbunker import FileStore

    store = FileStore(tmp_path / "s")
    store.cas_lease(AGENT_ID, None, lease("n1", 1))
    store.put_heartbeat(AGENT_ID, heartbeat("n1"))
    args = ["status", "--store", (tmp_path / "s").as_uri(), "--agent-id", AGENT_ID]
    shown = run_hb([*args, "--observe-ms", "0"])
    assert "store mode" not in shown.stdout
    assert json.loads(run_hb([*args, "--observe-ms", "0", "--json"]).stdout)["syncdir"] is None


def test_requests_from_outside_a_node_are_refused_on_syncdir_for_now(tmp_path: Path) -> None:
    root = two_nodes_that_diverged(Sync(tmp_path))
    url = f"syncdir://{root}"
    env = hb_env(HB_SECRET=SECRET)
    for args, what in (
        (["submit", "--store", url, "--agent-id", AGENT_ID, "--data", "{}"], "submitting"),
        (["switchover", "--store", url, "--agent-id", AGENT_ID], "a switchover"),
        (["pause", "--store", url, "--agent-id", AGENT_ID], "hb pause"),
        (["forget", "n1", "--store", url, "--agent-id", AGENT_ID], "forgetting a node"),
        (["accept-loss", "--store", url, "--agent-id", AGENT_ID, "--yes"], "accepting a loss"),
    ):
        result = run_hb(args, env=env)
        assert result.returncode == 2, (args, result.stderr)
        assert f"{what} is not possible on a syncdir:// store yet" in result.stderr, result.stderr
        assert "Traceback" not in result.stderr


def test_key_rotation_is_refused_before_it_starts_as_the_store_declares(tmp_path: Path) -> None:
    """hb rotate-secret on a syncdir store is refused in one line from what the store's
    report declares it refuses, and nothing is changed."""
    root = two_nodes_that_diverged(Sync(tmp_path))
    before = {p: p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}
    env = hb_env(HB_SECRET="a-new-secret-for-rotation", HB_SECRET_PREVIOUS=SECRET)
    result = run_hb(
        ["rotate-secret", "begin", "--store", f"syncdir://{root}", "--agent-id", AGENT_ID],
        env=env,
    )
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and "does not rotate keys" in errors[0], result.stderr
    assert "nothing was changed" in errors[0]
    assert {p: p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()} == before


def test_an_earlier_syncdir_folder_is_refused_in_one_line_by_hb(tmp_path: Path) -> None:
    """hb status and hb run on a folder whose node subtrees an earlier version wrote: one
    line naming hb migrate-store, exit 2, no traceback, nothing written."""
    root = tmp_path / "old"
    agent_dir = root / "nodes" / "n1" / "agents" / AGENT_ID
    agent_dir.mkdir(parents=True)
    (root / MARKER).write_bytes(b"hamsterbunker syncdir 1\n")
    (agent_dir / "lease.json").write_bytes(lease("n1", 3).to_json())
    before = sorted(root.rglob("*"))
    url = f"syncdir://{root}"
    for args in (
        ["status", "--store", url, "--agent-id", AGENT_ID],
        ["run", "--store", url, "--agent", AGENT, "--node-id", "n2", "--sync-delay-ms", "300"],
    ):
        result = run_hb(args, env=hb_env(HB_SECRET=SECRET))
        assert result.returncode == 2, (args, result.stdout + result.stderr)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and "hb migrate-store" in lines[0], (args, result.stderr)
        assert "Traceback" not in result.stderr
    assert sorted(root.rglob("*")) == before


def test_hb_choose_chain_mistakes_are_one_line_and_write_nothing(tmp_path: Path) -> None:
    """hb choose-chain (the choice itself: tests/node/test_syncdir_lineage.py) refuses a
    store other than syncdir, a bad or unknown term, a choice with no node to hold it, and
    a folder whose records do not authenticate, each in one line, with nothing written."""
    sync = Sync(tmp_path)
    sync.open("n2").create_cluster(new_cluster_record(SECRET))
    root = sync.root("n2")
    before = tree(root)
    url = f"syncdir://{root}"
    env = hb_env(HB_SECRET=SECRET)
    base = ["choose-chain", "--store", url, "--agent-id", AGENT_ID]
    file_store = (tmp_path / "file").as_uri()
    for args, words in (
        (["choose-chain", "--store", file_store, "--agent-id", AGENT_ID], ["hb accept-loss"]),
        ([*base, "--node-id", "n2", "--term", "two@n1"], ["EPOCH@NODE"]),
        ([*base, "--node-id", "n2", "--term", "2@bad name"], ["node id"]),
        ([*base, "--term", "2@n1"], ["--node-id is required"]),
        ([*base, "--node-id", "n9", "--term", "2@n1"], ["node n9 has no subtree"]),
        ([*base, "--node-id", "n2", "--term", "2@n1"], ["no term record authenticates"]),
        (["choose-chain", "--store", url], ["--agent-id is required"]),
    ):
        assert_one_line_error(run_hb(args, env=env), *words)
    assert_one_line_error(run_hb([*base, "--node-id", "n2"], env=hb_env()), "secret")
    listed = run_hb([*base, "--node-id", "n2"], env=env)
    assert listed.returncode == 0, listed.stderr
    assert "no term record authenticates here yet" in listed.stdout
    refused = run_hb(["accept-loss", "--store", url, "--agent-id", AGENT_ID, "--yes"], env=env)
    assert "use hb choose-chain" in assert_one_line_error(refused)
    assert tree(root) == before, "a refused hb choose-chain wrote into the folder"


# -- 4. two real nodes on two synced folders ---------------------------------------------


@contextmanager
def node(tmp_path: Path, sync: Sync, name: str) -> Iterator[subprocess.Popen[bytes]]:
    """``hb run --instance agent`` for node name on its own folder (its own config dir)."""
    directory = tmp_path / f"cfg-{name}"
    directory.mkdir()
    (directory / "agent.toml").write_text(
        f'store = "syncdir://{sync.root(name)}"\nagent = "{AGENT}"\nnode_id = "{name}"\n'
        f"tick_ms = 100\nlease_ttl_ms = 1000\nsync_delay_ms = {sync.delay_ms}\n"
    )
    env = hb_env(CONFIGURATION_DIRECTORY=str(directory), HB_SECRET=SECRET)
    with (tmp_path / f"{name}.log").open("ab") as log:
        process = subprocess.Popen(
            [*HB, "run", "--instance", "agent", "--create-store"], env=env,
            stdin=subprocess.DEVNULL,
            stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path,
        )  # fmt: skip
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=10)


def reader(sync: Sync, name: str) -> SyncDirStore:
    return SyncDirStore(sync.root(name), create=False)


def test_two_hb_run_nodes_fail_over_on_synced_folders(tmp_path: Path) -> None:
    """n1 leads and checkpoints; SIGTERM stops it; n2, on its own folder kept in step by
    the pump, takes over and resumes from n1's checkpoint, never from init()."""
    sync = Sync(tmp_path, delay_ms=300)  # the pump copies every 50 ms
    logs = {name: tmp_path / f"{name}.log" for name in ("n1", "n2")}

    def log(name: str) -> str:
        return logs[name].read_text() if logs[name].exists() else ""

    with SyncPump(sync, "n1", "n2"), node(tmp_path, sync, "n1") as one:

        def n1_published(at_least: int) -> int | None:
            if not (sync.root("n1") / MARKER).exists():
                return None
            chain = reader(sync, "n1").list_chains(AGENT_ID).get("n1", [])
            return chain[0].seq if chain and chain[0].seq >= at_least else None

        wait_for("n1 to publish 3 checkpoints", lambda: n1_published(3), 40)
        # n2 starts once the cluster record has synced to its folder (one record only).
        wait_for("the cluster record on n2's machine",
                 lambda: (sync.root("n2") / "cluster.json").exists() or None, 10)  # fmt: skip
        with node(tmp_path, sync, "n2") as two:

            def n2_standby() -> bool | None:
                beats = reader(sync, "n1").list_heartbeats(AGENT_ID)
                return any(b.node == "n2" and b.role == "standby" for b in beats) or None

            wait_for("n2 to stand by, as seen on n1's machine", n2_standby, 30)
            one.send_signal(signal.SIGTERM)
            assert one.wait(timeout=20) == 0, log("n1")
            last_n1 = reader(sync, "n1").list_chains(AGENT_ID)["n1"][0]

            def n2_leads_past(seq: int) -> int | None:
                chain = reader(sync, "n2").list_chains(AGENT_ID).get("n2", [])
                record = reader(sync, "n2").read_lease(AGENT_ID)
                led = record is not None and record.holder == "n2"
                return chain[0].seq if led and chain and chain[0].seq > seq else None

            wait_for("n2 to take over and publish past n1's last", lambda: n2_leads_past(
                last_n1.seq), 30)  # fmt: skip
            resumed = [e for e in reader(sync, "n2").read_events(AGENT_ID)
                       if e.node == "n2" and e.type == "agent.resumed"]  # fmt: skip
            assert resumed, log("n2")
            assert resumed[0].detail["from_seq"] == last_n1.seq, (resumed[0], last_n1)
            assert resumed[0].detail["from_epoch"] == last_n1.epoch
            assert not [e for e in reader(sync, "n2").read_events(AGENT_ID)
                        if e.node == "n2" and e.type in ("agent.started", "store.diverged")]  # fmt: skip
            status = run_hb(["status", "--store", f"syncdir://{sync.root('n2')}", "--agent-id",
                             AGENT_ID, "--json"])  # fmt: skip
            assert status.returncode == 0, status.stdout + status.stderr
            data = json.loads(status.stdout)
            assert data["lease"]["holder"] == "n2" and data["syncdir"]["diverged"] == []
            two.send_signal(signal.SIGTERM)
            assert two.wait(timeout=20) == 0, log("n2")
    sync.assert_only_copies_of_others("n1")
    sync.assert_only_copies_of_others("n2")


def test_a_host_of_several_agents_writes_one_syncdir_subtree_as_its_node(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """[[agents]] on a syncdir store: one store for all the host's agents, opened as the
    process's node with the configured sync delay."""
    from hamsterbunker.cli import host as cli_host
    from hamsterbunker.node.host import Host
    from hamsterbunker.node.notify import Notifier

    folder = tmp_path / "sync"
    (tmp_path / "agent.toml").write_text(
        f'store = "syncdir://{folder}"\nnode_id = "n7"\nsync_delay_ms = 200\n'
        "tick_ms = 100\nlease_ttl_ms = 1000\n"
        f'[[agents]]\nagent = "{AGENT}"\nagent_id = "c1"\n'
        f'[[agents]]\nagent = "{AGENT}"\nagent_id = "c2"\n'
    )
    config = load_instance("agent", tmp_path)
    ran: list[object] = []
    monkeypatch.setattr(Host, "run", lambda self: ran.extend(self.runtimes))
    cli_host.run_host(config, SECRET, Notifier(None), history=None, state_dir=None,  # type: ignore[arg-type]
                      create_store=True)  # fmt: skip
    stores = {id(runtime.store) for runtime in ran}  # type: ignore[attr-defined]
    assert len(ran) == 2 and len(stores) == 1
    store = ran[0].store  # type: ignore[attr-defined]
    assert isinstance(store, SyncDirStore)
    assert (store.node, store.sync_delay_ms) == ("n7", 200)
    assert [p.name for p in (folder / "nodes").iterdir()] == ["n7"]
