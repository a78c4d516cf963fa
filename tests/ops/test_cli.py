"""The ``hb`` command line, run as a real subprocess (``python -m hamsterbunker``).

Covers: user mistakes (one line on stderr, exit 2, no traceback, no store
touched), the secret source order, a node with the wrong secret joining a
running cluster, ``hb status``, the ``hb demo`` survival run, and ``--help``.

Every subprocess gets a controlled environment (no HB_SECRET or
CREDENTIALS_DIRECTORY unless the test sets one) and a timeout.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from hamsterbunker import FileStore
from hamsterbunker.cli.main import read_secret
from hamsterbunker.lease.memory import MemoryFile
from hamsterbunker.records import Heartbeat, LeaseRecord, Takeover
from hamsterbunker.sealing import Sealer, new_cluster_record
from hamsterbunker.stores.base import Fence
from hamsterbunker.stores.layer.keys import CLUSTER, AgentKeys
from tests.support.cli import (
    AGENT,
    AGENT_ID,
    FAST,
    HB,
    SECRET,
    SURVIVED,
    check_rounds,
    hb_env,
    run_demo,
    run_hb,
    wait_for,
)
from tests.support.raw_store import RawRecords


def files_under(root: Path) -> dict[str, bytes]:
    """Every regular file under root, by relative path, with its content."""
    found: dict[str, bytes] = {}
    for path in root.rglob("*"):
        try:
            if path.is_file():
                found[str(path.relative_to(root))] = path.read_bytes()
        except FileNotFoundError:
            pass  # a temp file renamed away while we looked
    return found


@contextmanager
def running_node(
    store_dir: Path, node_id: str, log_path: Path, secret: str = SECRET
) -> Iterator[subprocess.Popen[bytes]]:
    """One ``hb run`` node in the background; killed on the way out if still running."""
    command = [
        *HB, "run", "--store", store_dir.as_uri(), "--agent", AGENT, "--node-id", node_id,
        "--region", "test", "--create-store", *FAST,
    ]  # fmt: skip
    with open(log_path, "ab") as log:
        process = subprocess.Popen(
            command,
            env=hb_env(HB_SECRET=secret),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=10)


def held_lease(store_dir: Path):  # type: ignore[no-untyped-def]
    """The lease record of the counter agent if someone holds it, else None."""
    if not (store_dir / "kv" / CLUSTER).exists():
        return None  # let the node create the store; do not race it
    lease = FileStore(store_dir).read_lease(AGENT_ID)
    return lease if lease is not None and lease.holder is not None else None


def stop_gracefully(process: subprocess.Popen[bytes], log_path: Path) -> int:
    process.send_signal(signal.SIGTERM)
    try:
        return process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=10)
        raise AssertionError(
            f"node did not stop within 20 s of SIGTERM; log:\n{log_path.read_text()}"
        ) from None


# -- 1. user mistakes -----------------------------------------------------------

RUN = ["run", "--store", "{store}", "--agent", AGENT]
NO_SECRET = None  # marker: the case runs with no secret source at all

# (id, argv, HB_SECRET or NO_SECRET, words the one error line must contain)
MISTAKES: list[tuple[str, list[str], str | None, list[str]]] = [
    ("run-unknown-flag", [*RUN, "--bogus"], SECRET, ["--bogus"]),
    ("tick-ms-not-a-number", [*RUN, "--tick-ms", "abc"], SECRET, ["--tick-ms", "abc"]),
    ("lease-ttl-zero", [*RUN, "--lease-ttl-ms", "0"], SECRET, ["--lease-ttl-ms", "0"]),
    ("missing-store", ["run", "--agent", AGENT], SECRET, ["--store"]),
    (
        "unknown-scheme",
        ["run", "--store", "http://x", "--agent", AGENT],
        SECRET,
        ["http", "scheme"],
    ),
    (
        "relative-file-url",
        ["run", "--store", "file:relative/path", "--agent", AGENT],
        SECRET,
        ["file:relative/path", "absolute"],
    ),
    (
        "nonexistent-parent",
        ["run", "--store", "file:///nonexistent-parent/x", "--agent", AGENT, "--create-store"],
        SECRET,
        ["/nonexistent-parent/x", "parent"],
    ),
    (
        "agent-module-missing",
        ["run", "--store", "{store}", "--agent", "nomodule:x"],
        SECRET,
        ["nomodule"],
    ),
    (
        "agent-attribute-missing",
        ["run", "--store", "{store}", "--agent", "hamsterbunker.demo:Nope"],
        SECRET,
        ["Nope"],
    ),
    (
        "agent-without-colon",
        ["run", "--store", "{store}", "--agent", "justamodule"],
        SECRET,
        ["justamodule", "module:attribute"],
    ),
    ("secret-too-short", RUN, "12345", ["secret", "8"]),
    ("no-secret", RUN, NO_SECRET, ["secret", "HB_SECRET"]),
    (
        "secret-file-missing",
        [*RUN, "--secret-file", "{tmp}/no-such-secret"],
        NO_SECRET,
        ["no-such-secret", "secret"],
    ),
    (
        "tick-above-renew-deadline",
        [*RUN, "--tick-ms", "1500", "--lease-ttl-ms", "2000"],
        SECRET,
        ["tick", "1500", "renew_deadline"],
    ),
    ("bad-node-id", [*RUN, "--node-id", "bad/id"], SECRET, ["node id", "bad/id"]),
    (
        "status-bad-agent-id",
        ["status", "--store", "{store}", "--agent-id", "bad/id"],
        SECRET,
        ["agent id", "bad/id"],
    ),
    ("demo-kills-zero", ["demo", "--kills", "0"], SECRET, ["--kills", "0"]),
    ("demo-bad-timing", ["demo", "--tick-ms", "1500"], SECRET, ["tick", "1500"]),
]


def _run_mistake(
    tmp_path: Path, argv: list[str], secret: str | None, store_exists: bool = False
) -> tuple[subprocess.CompletedProcess[str], Path, Path]:
    store = tmp_path / "store"
    if store_exists:
        store.mkdir()
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    args = [a.replace("{store}", store.as_uri()).replace("{tmp}", str(tmp_path)) for a in argv]
    env = hb_env() if secret is NO_SECRET else hb_env(HB_SECRET=secret)
    return run_hb(args, env=env, cwd=cwd), store, cwd


@pytest.mark.parametrize(
    ("argv", "secret", "words"),
    [pytest.param(argv, secret, words, id=name) for name, argv, secret, words in MISTAKES],
)
def test_user_mistake_gives_one_line_and_exit_2(tmp_path, argv, secret, words):
    """A user mistake prints exactly one stderr line naming the problem, exits 2, no traceback."""
    assert not Path("/nonexistent-parent").exists()
    result, _, cwd = _run_mistake(tmp_path, argv, secret)
    lines = result.stderr.splitlines()
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr
    assert len(lines) == 1, f"expected one line on stderr, got:\n{result.stderr}"
    assert "error" in lines[0]
    for word in words:
        assert word.lower() in lines[0].lower(), f"{word!r} not named in: {lines[0]}"
    assert result.stdout == ""
    assert list(cwd.iterdir()) == [], "a mistake left files in the working directory"
    assert not Path("/nonexistent-parent").exists()


def test_a_damaged_node_memory_gives_one_line_and_exit_2_and_touches_no_store(tmp_path):
    """A memory file in the state directory that does not parse is named in one line, and
    nothing is written to the store: the node stops before it opens the cluster."""
    store, state = tmp_path / "store", tmp_path / "state"
    store.mkdir()
    memory = MemoryFile(state / ".memory", store.as_uri(), AGENT_ID).path
    memory.parent.mkdir(parents=True)
    memory.write_text('{"format": 1}')
    argv = ["run", "--store", store.as_uri(), "--agent", AGENT, "--state-dir", str(state),
            "--create-store"]  # fmt: skip
    result = run_hb(argv, env=hb_env(HB_SECRET=SECRET))
    assert result.returncode == 2, result.stderr
    assert result.stderr.splitlines() == [
        f"hb run: error: the node's memory {memory} is damaged (no field 'cluster'); remove it to start "
        "without memory of this store"
    ]
    assert files_under(store / "kv") == {}  # no record: at most the empty store's directory
    assert memory.read_text() == '{"format": 1}'


@pytest.mark.parametrize(
    ("argv", "secret", "store_exists"),
    [
        pytest.param(argv, secret, exists, id=f"{name}-{'existing' if exists else 'absent'}-store")
        for name, argv, secret, _ in MISTAKES
        if argv[0] == "run" and "{store}" in argv
        for exists in (False, True)
    ],
)
def test_run_mistake_leaves_store_untouched(tmp_path, argv, secret, store_exists):
    """A rejected ``hb run`` neither creates the store directory nor writes into an existing one."""
    result, store, _ = _run_mistake(tmp_path, argv, secret, store_exists)
    assert result.returncode == 2, result.stderr
    if store_exists:
        assert list(store.iterdir()) == [], "a rejected hb run wrote into the store"
    else:
        assert not store.exists(), "a rejected hb run created the store directory"


# -- 2. secret sources ------------------------------------------------------------


def test_run_help_lists_secret_sources_in_order():
    """``hb run --help`` lists HB_SECRET, then --secret-file, then $CREDENTIALS_DIRECTORY/secret."""
    result = run_hb(["run", "--help"])
    assert result.returncode == 0, result.stderr
    text = result.stdout
    assert "in this order" in text
    section = text[text.index("in this order") :]
    positions = [
        section.find(s) for s in ("HB_SECRET", "--secret-file", "$CREDENTIALS_DIRECTORY/secret")
    ]
    assert -1 not in positions, section
    assert positions == sorted(positions), section


@pytest.fixture
def secret_sources(tmp_path, monkeypatch):
    """A secret file and a credentials directory with different secrets; no env secret yet."""
    monkeypatch.delenv("HB_SECRET", raising=False)
    monkeypatch.delenv("CREDENTIALS_DIRECTORY", raising=False)
    secret_file = tmp_path / "secret-file"
    secret_file.write_text("from-the-file\n", encoding="utf-8")
    creds = tmp_path / "creds"
    creds.mkdir()
    (creds / "secret").write_text("from-the-credentials\n", encoding="utf-8")
    return secret_file, creds


def test_secret_env_wins_over_file_and_credentials(secret_sources, monkeypatch):
    """HB_SECRET is used even when a secret file and a credentials directory are given."""
    secret_file, creds = secret_sources
    monkeypatch.setenv("HB_SECRET", "from-the-environment")
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(creds))
    assert read_secret(secret_file).secrets == ("from-the-environment",)


def test_secret_file_wins_over_credentials(secret_sources, monkeypatch):
    """Without HB_SECRET, --secret-file wins over the credentials directory, newline stripped."""
    secret_file, creds = secret_sources
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(creds))
    assert read_secret(secret_file).secrets == ("from-the-file",)


def test_secret_from_credentials_directory_alone(secret_sources, monkeypatch):
    """With only $CREDENTIALS_DIRECTORY set, its ``secret`` file is used, newline stripped."""
    _, creds = secret_sources
    (creds / "secret").write_text("from-the-credentials\r\n", encoding="utf-8")
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(creds))
    assert read_secret(None).secrets == ("from-the-credentials",)


# -- 3. wrong secret joining a running cluster ---------------------------------------


def test_wrong_secret_node_exits_2_and_touches_nothing(tmp_path):
    """A node with another secret exits 2 naming the secret, and writes nothing to the cluster."""
    store = tmp_path / "store"
    log = tmp_path / "node-a.log"
    with running_node(store, "node-a", log) as node:
        lease = wait_for("node-a to take the lease", lambda: held_lease(store), 30)
        assert lease.holder == "node-a", log.read_text()
        beat = store / "kv" / AgentKeys(AGENT_ID).beat("node-a")
        wait_for("node-a's heartbeat", lambda: True if beat.exists() else None, 10)
        before = files_under(store)

        started = time.monotonic()
        intruder = subprocess.run(
            [
                *HB,
                "run",
                "--store",
                store.as_uri(),
                "--agent",
                AGENT,
                "--node-id",
                "intruder",
                "--region",
                "test",
                *FAST,
            ],
            env=hb_env(HB_SECRET="another-secret-entirely"),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=30,
        )
        took = time.monotonic() - started
        assert intruder.returncode == 2, (intruder.returncode, intruder.stderr)
        assert took < 20
        lines = intruder.stderr.splitlines()
        assert len(lines) == 1, intruder.stderr
        assert "secret" in lines[0].lower()
        assert "Traceback" not in intruder.stderr

        after = files_under(store)
        assert not [p for p in after if "intruder" in p], sorted(after)
        assert after["kv/cluster"] == before["kv/cluster"]
        # Whatever appeared meanwhile is node-a's own work: checkpoints, effect records,
        # its own events, or a commit's temp file or redo log.
        new = set(after) - set(before)
        ours = (
            r"kv/agents/counter/ckpt/\d{20}-\d{10}-\d{10}-\d{13}",
            r"kv/agents/counter/effects/\d{20}/\d{4}-(intent|outcome)",
            r"kv/agents/counter/(beats/node-a|events/node-a/\d{20})",
            r"tmp-hb-\w+|\.redo",
        )
        strays = [p for p in new if not any(re.fullmatch(pattern, p) for pattern in ours)]
        assert strays == [], strays
        now = FileStore(store).read_lease(AGENT_ID)
        assert now is not None
        assert (now.holder, now.epoch, now.session) == (lease.holder, lease.epoch, lease.session)
        assert node.poll() is None, "the running node died when the intruder came"

        assert stop_gracefully(node, log) == 0, log.read_text()
    assert not beat.exists(), "the stopped node left its heartbeat behind"
    released = FileStore(store).read_lease(AGENT_ID)
    assert released is not None and released.holder is None


# -- 4. hb status --------------------------------------------------------------------


def test_status_shows_running_node(tmp_path):
    """``hb status`` (text and --json) shows the holder, epoch 1, an active node and a checkpoint."""
    store = tmp_path / "store"
    log = tmp_path / "status-node.log"

    def ready():  # type: ignore[no-untyped-def]
        if held_lease(store) is None:
            return None
        fs = FileStore(store)
        active = [b for b in fs.list_heartbeats(AGENT_ID) if b.role == "active"]
        return True if active and fs.list_checkpoints(AGENT_ID) else None

    with running_node(store, "status-node", log) as node:
        wait_for("an active heartbeat and a checkpoint", ready, 30)
        args = ["status", "--store", store.as_uri(), "--agent-id", AGENT_ID]
        text = run_hb(args)
        as_json = run_hb([*args, "--json"])
        # The counter's step makes one journaled effect, "tally": a heartbeat sent
        # mid-step names it (between steps there is none in flight).
        in_flight = re.compile(r"^effects in flight on status-node: tally (running|done)$", re.M)
        wait_for(
            "hb status to show the step's effect", lambda: in_flight.search(run_hb(args).stdout), 20
        )
        assert stop_gracefully(node, log) == 0, log.read_text()

    assert text.returncode == 0, text.stderr
    out = text.stdout
    assert re.search(r"^lease: status-node \(test\) · epoch 1$", out, re.M), out
    assert re.search(r"^last checkpoint: seq \d+ \(epoch 1\)", out, re.M), out
    assert re.search(r"^\s+status-node\s+test\s+active\s+1\s+\d+\s", out, re.M), out

    assert as_json.returncode == 0, as_json.stderr
    data = json.loads(as_json.stdout)
    assert data["lease"]["holder"] == "status-node"
    assert data["lease"]["epoch"] == 1
    assert [n["role"] for n in data["nodes"] if n["node"] == "status-node"] == ["active"]
    assert all(isinstance(n["effects"], list) for n in data["nodes"])
    assert isinstance(data["checkpoint"]["seq"], int) and data["checkpoint"]["seq"] >= 1


def test_status_on_empty_store_is_an_error(tmp_path):
    """``hb status`` on an empty store directory: the agent has no records there, exit 2."""
    store = tmp_path / "store"
    store.mkdir()
    result = run_hb(["status", "--store", store.as_uri(), "--agent-id", AGENT_ID])
    assert result.returncode == 2, result.stderr
    assert f"holds no records of agent '{AGENT_ID}'; it holds no agents" in result.stderr
    assert "Traceback" not in result.stderr


def hostile_lease_store(root: Path, lease_json: bytes) -> None:
    """A store with a node's heartbeat and a checkpoint, whose lease record is then overwritten.

    Anyone who can write the store can put anything there: no secret is needed.
    """
    store = FileStore(root)
    lease = store.cas_lease(AGENT_ID, None, LeaseRecord("n1", "eu", "s1", epoch=3, ttl_ms=60_000))
    store.put_checkpoint(AGENT_ID, Fence("n1", "s1", 3), 7, b"sealed bytes")
    beat = Heartbeat(node="n1", region="eu", host="h1", pid=4242, role="active", epoch=3, seq=7,
                     leader="n1", time=time.time(), beats=1)  # fmt: skip
    store.put_heartbeat(AGENT_ID, beat)
    assert lease.holder == "n1"
    RawRecords(store).put_lease(AGENT_ID, lease_json)


@pytest.mark.parametrize(
    "lease_json",
    [b'{"holder": "x", "epoch": Infinity}', b"[" * 60_000],
    ids=["infinity", "deep-nesting"],
)
def test_status_reports_an_unreadable_lease_and_shows_the_rest(
    tmp_path: Path, lease_json: bytes
) -> None:
    """A lease record that does not parse is named; nodes and the checkpoint are still shown."""
    store = tmp_path / "store"
    hostile_lease_store(store, lease_json)
    args = ["status", "--store", store.as_uri(), "--agent-id", AGENT_ID]
    text = run_hb(args)
    assert text.returncode == 1, text.stderr  # degraded: no live leader known
    assert "Traceback" not in text.stderr
    assert re.search(r"^lease: unreadable \(lease record .+\)$", text.stdout, re.M), text.stdout
    assert re.search(r"^last checkpoint: seq 7 \(epoch 3\)", text.stdout, re.M), text.stdout
    assert re.search(r"^\s+n1\s+eu\s+active\s+3\s+7\s", text.stdout, re.M), text.stdout

    as_json = run_hb([*args, "--json"])
    assert as_json.returncode == 1, as_json.stderr
    data = json.loads(as_json.stdout)
    assert data["lease"] is None
    assert data["lease_error"].startswith("lease record ")
    assert [n["node"] for n in data["nodes"]] == ["n1"]
    assert data["checkpoint"]["seq"] == 7


def test_status_escapes_control_characters_from_the_store(tmp_path: Path) -> None:
    """A heartbeat's host is whatever its writer put there: never raw escapes on the terminal."""
    store = FileStore(tmp_path / "store")
    beat = Heartbeat(node="n1", region="eu", host="h\x1b[2Jx", pid=1, role="standby", epoch=0,
                     seq=0, leader=None, time=time.time(), beats=1)  # fmt: skip
    store.put_heartbeat(AGENT_ID, beat)
    result = run_hb(["status", "--store", store.root.as_uri(), "--agent-id", AGENT_ID])
    assert result.returncode == 1, result.stderr  # no lease: no live leader
    assert "\x1b" not in result.stdout
    assert "h\\x1b[2Jx" in result.stdout


def test_status_shows_the_effects_of_the_step_in_flight(tmp_path: Path) -> None:
    """The active node's heartbeat names the journaled effects of its step in flight: ``hb
    status`` lists them with their states (text and --json); a standby shows none."""
    store = FileStore(tmp_path / "store")
    store.cas_lease(AGENT_ID, None, LeaseRecord("n1", "eu", "s1", epoch=2, ttl_ms=60_000))
    effects = (("search", "reused"), ("llm.call", "done"), ("tool\x1b[2J", "running"))
    active = Heartbeat(node="n1", region="eu", host="h1", pid=11, role="active", epoch=2, seq=5,
                       leader="n1", time=time.time(), beats=3, effects=effects)  # fmt: skip
    standby = Heartbeat(node="n2", region="us", host="h2", pid=12, role="standby", epoch=2,
                        seq=5, leader="n1", time=time.time(), beats=3)  # fmt: skip
    store.put_heartbeat(AGENT_ID, active)
    store.put_heartbeat(AGENT_ID, standby)
    # Nobody renews this planted lease: not watched, or hb status would wait out its TTL.
    args = ["status", "--store", store.root.as_uri(), "--agent-id", AGENT_ID, "--observe-ms", "0"]

    text = run_hb(args)
    assert text.returncode == 0, text.stderr
    lines = [line for line in text.stdout.splitlines() if line.startswith("effects in flight")]
    assert lines == [
        "effects in flight on n1: search reused · llm.call done · tool\\x1b[2J running"
    ], text.stdout
    assert "\x1b" not in text.stdout

    as_json = run_hb([*args, "--json"])
    assert as_json.returncode == 0, as_json.stderr
    nodes = {n["node"]: n for n in json.loads(as_json.stdout)["nodes"]}
    assert nodes["n1"]["effects"] == [[name, state] for name, state in effects]
    assert nodes["n2"]["effects"] == []


# -- 5. hb demo ----------------------------------------------------------------------


EFFECTS = re.compile(
    r"^  ↳ effects: (\d+) reused from the journal · (\d+) unfinished re-run"
    r" · no completed effect ran twice$"
)


def check_effect_reports(out: str, kills: int) -> None:
    """After each RESUMED line, one line on the effect of the step in flight at the kill.

    The kill lands at a random moment: before the step's one effect (nothing to reuse or
    re-run), during it (re-run: it was never recorded) or after it (reused), never two.
    """
    lines = out.splitlines()
    resumed = [i for i, line in enumerate(lines) if "RESUMED at count=" in line]
    assert len(resumed) == kills, out
    for i in resumed:
        match = EFFECTS.match(lines[i + 1])
        assert match is not None, out
        reused, rerun = int(match[1]), int(match[2])
        assert reused + rerun <= 1, out


def test_demo_survives_one_kill(capsys, record_property):
    """``hb demo`` kills the active node and a standby resumes at epoch 2 with no state lost;
    it says what the new leader did with the journaled effect of the step in flight."""
    result = run_demo([], 60, capsys, record_property)
    assert SURVIVED in result.stdout.splitlines(), result.stdout
    check_rounds(result.stdout, [2])
    check_effect_reports(result.stdout, 1)


@pytest.mark.multiprocess  # the fast tier keeps the one kill of make demo
def test_demo_survives_two_kills(capsys, record_property):
    """``hb demo --kills 2`` prints two kill/resume pairs, resuming at epochs 2 and 3."""
    result = run_demo(["--kills", "2"], 120, capsys, record_property)
    assert SURVIVED in result.stdout.splitlines(), result.stdout
    check_rounds(result.stdout, [2, 3])
    check_effect_reports(result.stdout, 2)


# -- 6. help -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args", [[], ["run"], ["demo"], ["status"]], ids=["hb", "run", "demo", "status"]
)
def test_help_exits_0(args):
    """``--help`` of hb and of each subcommand prints usage and exits 0."""
    result = run_hb([*args, "--help"])
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"usage: hb {' '.join(args)}".rstrip()), result.stdout


def test_demo_refuses_a_store_in_use(tmp_path: Path) -> None:
    """`hb demo --store` on a store that already has a cluster says so and exits 2 at once."""
    store = tmp_path / "store"
    FileStore(store).create_cluster(new_cluster_record("another-secret"))
    before = sorted(p.name for p in store.rglob("*"))
    result = subprocess.run(
        [*HB, "demo", "--store", store.as_uri()], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2
    assert "in use already" in result.stderr and "Traceback" not in result.stderr
    assert sorted(p.name for p in store.rglob("*")) == before


# -- hb accept-loss ------------------------------------------------------------------------------


def _store_without_checkpoints(tmp_path: Path) -> Path:
    """A file store with a cluster record of SECRET, and a lease (released) and no checkpoints."""
    root = tmp_path / "store"
    store = FileStore(root)
    store.create_cluster(new_cluster_record(SECRET))
    store.cas_lease(
        "a", None, LeaseRecord(holder=None, region="r", session="s", epoch=1, ttl_ms=2000)
    )
    return root


def test_accept_loss_is_refused_while_a_node_runs_and_writes_nothing(tmp_path: Path) -> None:
    """A node still heartbeats: hb accept-loss --yes watches the agent's records for a lease
    TTL, sees the node live and refuses (exit 1) before it reads or writes anything more;
    the lease it would have released stays the running node's."""
    root = tmp_path / "store"
    store = FileStore(root)
    cluster = store.create_cluster(new_cluster_record(SECRET))
    lease = store.cas_lease("a", None, LeaseRecord("n1", "r", "s1", epoch=1, ttl_ms=1000))
    blob = Sealer(SECRET, cluster).seal("a", 1, 1, {"n": 1})
    store.put_checkpoint("a", Fence("n1", "s1", 1), 1, blob)  # what a loss would go back to
    stop = threading.Event()

    def heartbeats() -> None:  # a node that runs: a fresh heartbeat every 100 ms
        beats = 0
        while not stop.wait(0.1):
            beats += 1
            store.put_heartbeat("a", Heartbeat(node="n1", region="r", host="h", pid=7,
                                               role="active", epoch=1, seq=0, leader="n1",
                                               time=time.time(), beats=beats))  # fmt: skip

    beating = threading.Thread(target=heartbeats)
    beating.start()
    try:
        result = run_hb(
            ["accept-loss", "--store", root.as_uri(), "--agent-id", "a", "--yes"],
            env=hb_env(HB_SECRET=SECRET),
        )
    finally:
        stop.set()
        beating.join()
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stderr.startswith("hb accept-loss: refused: node n1 of agent a is live")
    assert "stop every node first (nothing changed)" in result.stderr
    assert result.stdout == ""  # no plan printed, nothing given up
    assert store.read_lease("a") == lease
    assert store.read_acceptance("a") is None


@pytest.mark.parametrize(
    "secret, code, words",
    [
        ("another-secret-altogether", 2, "the secret does not match this cluster"),
        (SECRET, 1, "no stored checkpoint authenticates: there is nothing to resume from"),
    ],
    ids=["wrong-secret", "nothing-to-resume"],
)
def test_accept_loss_that_cannot_be_done_says_why_and_writes_nothing(
    tmp_path: Path, secret: str, code: int, words: str
) -> None:
    """hb accept-loss with the wrong secret (a user mistake: exit 2), or over a store with no
    checkpoint to resume from (exit 1), prints one line saying why and changes nothing."""
    root = _store_without_checkpoints(tmp_path)
    before = files_under(root)
    result = run_hb(
        ["accept-loss", "--store", root.as_uri(), "--agent-id", "a", "--yes"],
        env=hb_env(HB_SECRET=secret),
    )
    assert result.returncode == code, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert words in result.stderr
    assert "Traceback" not in result.stderr
    assert files_under(root) == before


def test_history_columns_line_up_with_their_header_whatever_the_node_names(
    tmp_path: Path,
) -> None:
    """hb history's table: each column starts where its header does, a long node id
    widening its column rather than pushing the rest of its row out of line."""
    root = tmp_path / "store"
    store = FileStore(root)
    takeovers = (
        Takeover(2, "a-rather-long-node-name.example", "switchover", 12, 1_700_000_100.0, "n1"),
        Takeover(1, "n1", "empty", 0, 1_700_000_000.0),
    )
    store.cas_lease("a", None, LeaseRecord("a-rather-long-node-name.example", "r", "s", epoch=2,
                                           ttl_ms=2000, history=takeovers))  # fmt: skip
    result = run_hb(["history", "--store", root.as_uri(), "--agent-id", "a"])
    assert result.returncode == 0, result.stderr
    header, *rows = result.stdout.splitlines()
    assert len(rows) == 2
    starts = [header.index(word) for word in ("from", "to", "via")]
    expected = [("-", "n1", "empty"), ("n1", "a-rather-long-node-name.example", "switchover")]
    for row, cells in zip(rows, expected, strict=True):
        for start, cell in zip(starts, cells, strict=True):
            assert row[start:].startswith(cell + " "), result.stdout
        assert row.endswith("s") and len(row) == len(header), result.stdout


def test_a_second_pause_says_already_paused_and_a_resume_of_a_running_agent_says_so(
    tmp_path: Path,
) -> None:
    """hb pause twice: "paused", then "already paused"; hb resume twice: "resumed", then
    "already running (not paused)". Each is exit 0: the state asked for holds."""
    root = _store_without_checkpoints(tmp_path)
    said = []
    for command in ("pause", "pause", "resume", "resume"):
        done = run_hb([command, "--store", root.as_uri(), "--agent-id", "a"],
                      env=hb_env(HB_SECRET=SECRET))  # fmt: skip
        assert done.returncode == 0, done.stderr
        said.append(done.stdout.strip())
    assert said[0].startswith("agent a: paused; the next leader finishes its step in flight")
    assert said[1:] == [
        "agent a: already paused",
        "agent a: resumed",
        "agent a: already running (not paused)",
    ]


@pytest.mark.parametrize(
    "command",
    [["pause"], ["resume"], ["history"], ["switchover"], ["accept-loss", "--yes"]],
    ids=lambda c: c[0],
)
def test_an_agent_id_the_store_does_not_hold_is_refused_and_makes_nothing(
    tmp_path: Path, command: list[str]
) -> None:
    """A mistyped --agent-id: one line naming the agents the store holds, exit 2; no records
    of the mistyped agent made (it would show in hb status as an agent without a leader)."""
    root = _store_without_checkpoints(tmp_path)  # holds agent "a"
    before = files_under(root)
    done = run_hb([command[0], "--store", root.as_uri(), "--agent-id", "b", *command[1:]],
                  env=hb_env(HB_SECRET=SECRET))  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.splitlines() == [
        f"hb {command[0]}: error: store {root.as_uri()} holds no records of agent 'b'; it holds: a"
    ]
    assert files_under(root) == before
    assert FileStore(root).list_agents() == ["a"]


def test_forget_agent_removes_a_whole_agent_once_none_of_its_nodes_is_live(
    tmp_path: Path,
) -> None:
    """hb forget --agent: says what goes and asks (no answer: nothing changed, exit 1);
    --yes removes every record of the agent and leaves the others; a node of the agent
    that heartbeats makes it refuse (exit 1); NODE with --agent is a usage mistake."""
    root = _store_without_checkpoints(tmp_path)  # agent "a"
    store = FileStore(root)
    store.cas_lease("b", None, LeaseRecord("n1", "r", "s", epoch=1, ttl_ms=1000))
    forget = ["forget", "--store", root.as_uri(), "--agent"]
    env = hb_env(HB_SECRET=SECRET)
    asked = run_hb([*forget, "a"], env=env)
    assert asked.returncode == 1 and "nothing changed" in asked.stderr, asked.stderr
    assert asked.stdout.startswith("agent a: every record of it goes: 0 checkpoints")
    assert store.list_agents() == ["a", "b"]
    done = run_hb([*forget, "a", "--yes"], env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "forgot agent a"
    assert store.list_agents() == ["b"] and store.read_lease("a") is None

    stop = threading.Event()

    def heartbeats() -> None:  # a node of b that runs
        beats = 0
        while not stop.wait(0.1):
            beats += 1
            store.put_heartbeat("b", Heartbeat(node="n1", region="r", host="h", pid=7,
                                               role="active", epoch=1, seq=0, leader="n1",
                                               time=time.time(), beats=beats))  # fmt: skip

    beating = threading.Thread(target=heartbeats)
    beating.start()
    try:
        live = run_hb([*forget, "b", "--yes"], env=env)
    finally:
        stop.set()
        beating.join()
    assert live.returncode == 1, live.stdout + live.stderr
    assert live.stderr.startswith("hb forget: refused: node n1 of agent b is live")
    assert store.list_agents() == ["b"]
    both = run_hb(["forget", "n1", "--store", root.as_uri(), "--agent", "b"], env=env)
    assert both.returncode == 2 and "give no NODE and no --agent-id" in both.stderr
