"""The node config file (``NAME.toml``) and ``hb init``, which writes it with the secret.

Covers: parsing and its defaults, where the file is looked for, every mistake
in a file (one line on stderr naming key and file, exit 2, through the real
``hb``), ``hb run --instance`` running a real node with the secret from the
credentials directory, ``hb init`` (modes, refusing to clobber, keeping a
secret, refusing bad input before writing anything, the printed next steps)
and its atomic writes.

Every subprocess gets a controlled environment (no secret source, no
config directory, no systemd variables unless the test sets them) and a timeout.
"""

from __future__ import annotations

import json
import signal
import socket
import stat
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from hamsterbunker import FileStore
from hamsterbunker.cli.node import node_config
from hamsterbunker.cli.parsers import build_parser
from hamsterbunker.core.errors import ConfigError, WrongSecret
from hamsterbunker.ops.config import (
    DEFAULT_CONFIG_DIR,
    NodeConfig,
    config_dir,
    instance_path,
    load_instance,
    parse_config,
)
from hamsterbunker.ops.provision import provision
from hamsterbunker.sealing import Sealer
from hamsterbunker.stores.layer.keys import CLUSTER
from tests.support.cli import HB, hb_env, run_hb, wait_for
from tests.support.raw_store import file_key

AGENT = "hamsterbunker.demo:CounterAgent"
AGENT_ID = "counter"  # CounterAgent.id
SECRET = "correct-horse-battery"
NAME = "agent"


# -- helpers ------------------------------------------------------------------


def assert_one_line_error(
    result: subprocess.CompletedProcess[str], command: str, words: list[str]
) -> str:
    """Exit 2, no stdout, exactly one stderr line ``hb COMMAND: error: ...`` naming words."""
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got:\n{result.stderr}"
    line = lines[0]
    assert line.startswith(f"hb {command}: error: "), line
    for word in words:
        assert word.lower() in line.lower(), f"{word!r} not named in: {line}"
    assert result.stdout == ""
    return line


def snapshot(directory: Path) -> dict[str, bytes]:
    """Every file directly in directory, by name, with its content."""
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


def assert_only(directory: Path, *names: str) -> None:
    """The directory holds exactly these files: no temporary or stray ones."""
    assert sorted(p.name for p in directory.iterdir()) == sorted(names)


def write_secret(path: Path, text: str, mode: int = 0o600) -> None:
    path.write_text(text, encoding="utf-8")
    path.chmod(mode)


def init_args(config_dir: Path, store: Path | str, *extra: str, name: str = NAME) -> list[str]:
    store_url = store if isinstance(store, str) else store.as_uri()
    return ["init", name, "--config-dir", str(config_dir), "--store", store_url, *extra]


# -- 1. parsing and loading ------------------------------------------------------------

VALID = {"store": "file:///srv/hamsterbunker", "agent": AGENT}


def test_defaults_of_a_minimal_file():
    """A file with only store and agent gets the host name, region local, tick 400, TTL 2000."""
    config = parse_config(dict(VALID), Path("/x/agent.toml"))
    assert config == NodeConfig(
        store="file:///srv/hamsterbunker",
        agent=AGENT,
        agent_id=None,
        node_id=socket.gethostname(),
        region="local",
        tick_ms=400,
        lease_ttl_ms=2000,
        stop_grace_ms=10_000,
    )


def test_every_key_is_read(tmp_path):
    """Every key of the file reaches the NodeConfig unchanged."""
    (tmp_path / "full.toml").write_text(
        'store = "file:///s"\nagent = "m:a"\nagent_id = "a1"\nnode_id = "n1"\n'
        'region = "eu"\ntick_ms = 100\nlease_ttl_ms = 600\nstop_grace_ms = 0\n'
    )
    assert load_instance("full", tmp_path) == NodeConfig(
        "file:///s", "m:a", "a1", "n1", "eu", 100, 600, 0
    )


def test_configuration_directory_first_entry_is_used(monkeypatch):
    """$CONFIGURATION_DIRECTORY's first ':'-separated entry is the config directory."""
    monkeypatch.setenv("CONFIGURATION_DIRECTORY", "/run/one:/run/two")
    assert config_dir() == Path("/run/one")
    assert instance_path("agent") == Path("/run/one/agent.toml")


@pytest.mark.parametrize("value", [None, ""], ids=["unset", "empty"])
def test_config_directory_defaults_to_etc(monkeypatch, value):
    """Without $CONFIGURATION_DIRECTORY (unset or empty) the directory is /etc/hamsterbunker."""
    if value is None:
        monkeypatch.delenv("CONFIGURATION_DIRECTORY", raising=False)
    else:
        monkeypatch.setenv("CONFIGURATION_DIRECTORY", value)
    assert config_dir() == DEFAULT_CONFIG_DIR == Path("/etc/hamsterbunker")
    assert instance_path("agent") == Path("/etc/hamsterbunker/agent.toml")


def test_load_instance_reads_from_configuration_directory(tmp_path, monkeypatch):
    """load_instance without a directory reads $CONFIGURATION_DIRECTORY/NAME.toml."""
    (tmp_path / "agent.toml").write_text(
        'store = "file:///s"\nagent = "m:a"\nnode_id = "from-env"\n'
    )
    monkeypatch.setenv("CONFIGURATION_DIRECTORY", f"{tmp_path}:/nonexistent")
    assert load_instance("agent").node_id == "from-env"


def test_hot_standby_is_on_unless_the_file_or_the_flag_turns_it_off():
    """hot_standby = false in the file, or hb run --no-hot-standby (as hb init writes it)."""
    assert parse_config(dict(VALID), Path("/x/a.toml")).hot_standby is True
    off = parse_config({**VALID, "hot_standby": False}, Path("/x/a.toml"))
    assert off.hot_standby is False
    given = ["run", "--store", "file:///s", "--agent", "m:a"]
    assert node_config(build_parser().parse_args(given)).hot_standby is True
    flagged = build_parser().parse_args([*given, "--no-hot-standby"])
    assert node_config(flagged).hot_standby is False


BASE = 'store = "file:///srv/hb"\nagent = "hamsterbunker.demo:CounterAgent"\n'

# (id, file text, words the error must name besides the file)
BAD_FILES: list[tuple[str, str, list[str]]] = [
    ("unknown-key", BASE + "tickms = 100\n", ["unknown key", "'tickms'"]),
    ("tick-ms-string", BASE + 'tick_ms = "100"\n', ["'tick_ms'", "whole number", "string"]),
    ("store-integer", 'store = 5\nagent = "m:a"\n', ["'store'", "string", "whole number"]),
    ("tick-ms-boolean", BASE + "tick_ms = true\n", ["'tick_ms'", "boolean"]),
    ("hot-standby-string", BASE + 'hot_standby = "no"\n', ["'hot_standby'", "boolean", "string"]),
    ("tick-ms-float", BASE + "tick_ms = 100.5\n", ["'tick_ms'", "decimal"]),
    ("region-array", BASE + 'region = ["eu"]\n', ["'region'", "array"]),
    ("lease-ttl-zero", BASE + "lease_ttl_ms = 0\n", ["'lease_ttl_ms'", "above 0"]),
    ("tick-negative", BASE + "tick_ms = -5\n", ["'tick_ms'", "-5"]),
    ("stop-grace-negative", BASE + "stop_grace_ms = -1\n", ["'stop_grace_ms'", "-1"]),
    ("stop-grace-an-hour-on", BASE + "stop_grace_ms = 3600001\n", ["stop grace", "3600001"]),
    ("missing-store", 'agent = "m:a"\n', ["'store'", "missing"]),
    ("missing-agent", 'store = "file:///srv/hb"\n', ["'agent'", "missing"]),
    ("secret-key", BASE + 'secret = "correct-horse-battery"\n', ["'secret'", "LoadCredential"]),
    ("invalid-toml", BASE + "region = \n", ["not valid TOML", "line 3"]),
    ("bad-node-id", BASE + 'node_id = "bad/id"\n', ["'node_id'", "bad/id"]),
    ("bad-agent-id", BASE + 'agent_id = "../up"\n', ["'agent_id'", "../up"]),
]


@pytest.mark.parametrize(
    ("text", "words"), [pytest.param(t, w, id=name) for name, t, w in BAD_FILES]
)
def test_bad_file_is_an_error_naming_key_and_file(tmp_path, text, words):
    """A mistake in the file raises ConfigError naming the key (or line) and the file."""
    path = tmp_path / "agent.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_instance("agent", tmp_path)
    message = str(caught.value)
    assert str(path) in message, message
    for word in words:
        assert word.lower() in message.lower(), f"{word!r} not named in: {message}"


def test_secret_key_message_does_not_echo_the_secret(tmp_path):
    """A secret put in the config file is refused without printing it back."""
    (tmp_path / "agent.toml").write_text(BASE + 'secret = "correct-horse-battery"\n')
    with pytest.raises(ConfigError) as caught:
        load_instance("agent", tmp_path)
    assert "correct-horse-battery" not in str(caught.value)


def test_missing_file_suggests_hb_init(tmp_path):
    """A missing NAME.toml is an error naming the file and the command ``hb init NAME``."""
    with pytest.raises(ConfigError) as caught:
        load_instance("agent", tmp_path)
    assert str(tmp_path / "agent.toml") in str(caught.value)
    assert "hb init agent" in str(caught.value)


@pytest.mark.parametrize("name", ["../x", "a/b", "", "-x", ".x"])
def test_invalid_instance_name_is_refused(tmp_path, name):
    """An instance name that is not a plain name is refused, even if a file of that path exists."""
    directory = tmp_path / "cfg"
    directory.mkdir()
    (tmp_path / "x.toml").write_text(BASE)  # what "../x" would reach
    (directory / "a").mkdir()
    (directory / "a/b.toml").write_text(BASE)  # what "a/b" would reach
    with pytest.raises(ConfigError, match="instance name"):
        load_instance(name, directory)


# -- 2. the same mistakes through the real CLI -------------------------------------------


def _run_instance(tmp_path: Path, name: str, text: str | None, *flags: str):  # type: ignore[no-untyped-def]
    directory = tmp_path / "cfg"
    directory.mkdir()
    if text is not None:
        (directory / "agent.toml").write_text(text.replace("/srv/hb", str(tmp_path / "store")))
    env = hb_env(CONFIGURATION_DIRECTORY=str(directory), HB_SECRET=SECRET)
    result = run_hb(["run", "--instance", name, *flags], env=env, cwd=tmp_path)
    return result, directory


@pytest.mark.parametrize(
    ("text", "words"), [pytest.param(t, w, id=name) for name, t, w in BAD_FILES]
)
def test_hb_run_bad_file_one_line_exit_2(tmp_path, text, words):
    """``hb run --instance`` on a bad file prints one line naming key and file and exits 2."""
    result, directory = _run_instance(tmp_path, "agent", text)
    assert_one_line_error(result, "run", [*words, str(directory / "agent.toml")])
    assert not (tmp_path / "store").exists(), "a rejected node created its store"


@pytest.mark.parametrize("value", ["-1", "soon"])
def test_hb_run_bad_stop_grace_flag_one_line_exit_2(tmp_path, value):
    """A stop grace that is not a whole number of at least 0 is one line and exit 2."""
    store = tmp_path / "store"
    flags = ["--store", store.as_uri(), "--agent", AGENT, "--stop-grace-ms", value]
    result = run_hb(["run", *flags], env=hb_env(HB_SECRET=SECRET), cwd=tmp_path)
    assert_one_line_error(result, "run", ["--stop-grace-ms", value])
    assert not store.exists(), "a rejected node created its store"


def test_hb_run_missing_file_suggests_init(tmp_path):
    """``hb run --instance`` without the file exits 2 naming the file and ``hb init NAME``."""
    result, directory = _run_instance(tmp_path, "agent", None)
    assert_one_line_error(result, "run", [str(directory / "agent.toml"), "hb init agent"])


def test_hb_run_invalid_instance_name(tmp_path):
    """``hb run --instance ../x`` exits 2 naming the instance name."""
    result, _ = _run_instance(tmp_path, "../x", BASE)
    assert_one_line_error(result, "run", ["instance name", "../x"])


@pytest.mark.parametrize(
    "flag",
    [
        ["--store", "file:///tmp/elsewhere"],
        ["--agent", AGENT],
        ["--agent-id", "counter"],
        ["--node-id", "n2"],
        ["--region", "eu"],
        ["--tick-ms", "100"],
        ["--lease-ttl-ms", "600"],
    ],
    ids=lambda flag: flag[0],
)
def test_hb_run_instance_refuses_node_flags(tmp_path, flag):
    """``hb run --instance NAME`` with a node flag exits 2 naming the flag and --instance."""
    result, _ = _run_instance(tmp_path, "agent", BASE, *flag)
    assert_one_line_error(result, "run", [flag[0], "--instance"])
    assert not (tmp_path / "store").exists()


# -- 3. hb run --instance runs a real node -----------------------------------------------


@pytest.mark.multiprocess
def test_hb_run_instance_runs_node_with_credential_secret(tmp_path):
    """A node set up by ``hb init`` runs from its file, with the secret from $CREDENTIALS_DIRECTORY."""
    directory, store, creds = tmp_path / "cfg", tmp_path / "store", tmp_path / "creds"
    flags = ["--node-id", "n1", "--region", "test", "--tick-ms", "100", "--lease-ttl-ms", "600"]
    init = run_hb(init_args(directory, store, *flags))
    assert init.returncode == 0, init.stderr
    secret = (directory / f"{NAME}.secret").read_text().strip()
    creds.mkdir()
    write_secret(creds / "secret", secret + "\n")

    env = hb_env(CONFIGURATION_DIRECTORY=str(directory), CREDENTIALS_DIRECTORY=str(creds))
    log = tmp_path / "node.log"
    with open(log, "wb") as out:
        node = subprocess.Popen(
            [*HB, "run", "--instance", NAME],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=tmp_path,
        )
    try:

        def n1_active() -> bool | None:
            if not file_key(store, CLUSTER).exists():
                return None
            beats = FileStore(store).list_heartbeats(AGENT_ID)
            return True if any(b.node == "n1" and b.role == "active" for b in beats) else None

        wait_for("n1 to become active", n1_active, 30)
        status = run_hb(["status", "--store", store.as_uri(), "--agent-id", AGENT_ID, "--json"])
        assert status.returncode == 0, status.stderr
        data = json.loads(status.stdout)
        assert data["lease"]["holder"] == "n1"
        assert [n["role"] for n in data["nodes"] if n["node"] == "n1"] == ["active"]

        node.send_signal(signal.SIGTERM)
        assert node.wait(timeout=20) == 0, log.read_text()
    finally:
        if node.poll() is None:
            node.kill()
            node.wait(timeout=10)

    # The cluster was created with the secret hb init wrote (it came from the credential).
    cluster = FileStore(store).read_cluster()
    assert cluster is not None
    Sealer(secret, cluster)
    with pytest.raises(WrongSecret):
        Sealer("some-other-secret-entirely", cluster)


def test_hb_run_instance_without_any_secret_exits_2(tmp_path):
    """``hb run --instance`` with no HB_SECRET, --secret-file or credential exits 2 in one line."""
    directory = tmp_path / "cfg"
    assert run_hb(init_args(directory, tmp_path / "store")).returncode == 0
    result = run_hb(["run", "--instance", NAME], env=hb_env(CONFIGURATION_DIRECTORY=str(directory)))
    assert_one_line_error(result, "run", ["secret", "HB_SECRET", "LoadCredential"])
    assert not (tmp_path / "store").exists()


# -- 4. hb init --------------------------------------------------------------------------


def test_init_writes_config_that_loads_back(tmp_path):
    """``hb init`` writes a commented NAME.toml that loads back as the NodeConfig of its flags."""
    directory = tmp_path / "cfg"
    flags = [
        *("--agent", "mypkg.agents:Summariser", "--agent-id", "summariser"),
        *("--node-id", "n1", "--region", "eu-central"),
        *("--tick-ms", "300", "--lease-ttl-ms", "3000"),
    ]
    result = run_hb(init_args(directory, tmp_path / "store", *flags))
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    assert load_instance(NAME, directory) == NodeConfig(
        store=(tmp_path / "store").as_uri(),
        agent="mypkg.agents:Summariser",
        agent_id="summariser",
        node_id="n1",
        region="eu-central",
        tick_ms=300,
        lease_ttl_ms=3000,
        create_store_on=socket.gethostname(),  # a new secret: this node makes the store
    )
    text = (directory / f"{NAME}.toml").read_text()
    assert text.startswith("# "), text
    assert f"hb run --instance {NAME}" in text
    secret = (directory / f"{NAME}.secret").read_text().strip()
    assert secret not in text
    assert f"wrote {directory / f'{NAME}.toml'}" in result.stdout
    assert_only(directory, f"{NAME}.toml", f"{NAME}.secret")


def test_init_defaults_agent_and_store(tmp_path):
    """``hb init NAME --local-only`` runs the demo counter on /var/lib/hamsterbunker/NAME."""
    directory = tmp_path / "cfg"
    result = run_hb(
        ["init", NAME, "--config-dir", str(directory), "--node-id", "n1", "--local-only"]
    )
    assert result.returncode == 0, result.stderr
    config = load_instance(NAME, directory)
    assert (config.store, config.agent) == (f"file:///var/lib/hamsterbunker/{NAME}", AGENT)
    assert (config.region, config.tick_ms, config.lease_ttl_ms) == ("local", 400, 2000)


def test_init_secret_is_private_and_random(tmp_path):
    """NAME.secret has mode 0600 and 32+ random characters; two inits make different secrets."""
    secrets = []
    for directory in (tmp_path / "a", tmp_path / "b"):
        result = run_hb(init_args(directory, tmp_path / "store"))
        assert result.returncode == 0, result.stderr
        assert "new random secret" in result.stdout
        path = directory / f"{NAME}.secret"
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        secret = path.read_text().strip()
        assert len(secret) >= 32, secret
        assert len(set(secret)) >= 16, "the secret does not look random"
        secrets.append(secret)
    assert secrets[0] != secrets[1]


def test_init_refuses_to_overwrite_config_without_force(tmp_path):
    """A second ``hb init`` without --force exits 2 naming --force, leaving both files byte for byte."""
    directory = tmp_path / "cfg"
    assert run_hb(init_args(directory, tmp_path / "store", "--region", "one")).returncode == 0
    before = snapshot(directory)
    result = run_hb(init_args(directory, tmp_path / "store", "--region", "two"))
    assert_one_line_error(result, "init", [str(directory / f"{NAME}.toml"), "--force"])
    assert snapshot(directory) == before


def test_init_force_replaces_config_never_secret(tmp_path):
    """``hb init --force`` replaces NAME.toml but keeps the secret's bytes, and says so."""
    directory = tmp_path / "cfg"
    assert run_hb(init_args(directory, tmp_path / "store", "--region", "one")).returncode == 0
    secret_before = (directory / f"{NAME}.secret").read_bytes()
    result = run_hb(init_args(directory, tmp_path / "store", "--region", "two", "--force"))
    assert result.returncode == 0, result.stderr
    assert load_instance(NAME, directory).region == "two"
    assert (directory / f"{NAME}.secret").read_bytes() == secret_before
    assert "kept the existing secret" in result.stdout
    assert_only(directory, f"{NAME}.toml", f"{NAME}.secret")


def test_init_second_node_keeps_copied_secret(tmp_path):
    """``hb init`` where the secret was copied keeps and reuses it: how a second node is set up."""
    first, second = tmp_path / "node1", tmp_path / "node2"
    assert run_hb(init_args(first, tmp_path / "store", "--node-id", "n1")).returncode == 0
    second.mkdir()
    secret = (first / f"{NAME}.secret").read_bytes()
    (second / f"{NAME}.secret").write_bytes(secret)
    (second / f"{NAME}.secret").chmod(0o600)
    result = run_hb(init_args(second, tmp_path / "store", "--node-id", "n2"))
    assert result.returncode == 0, result.stderr
    assert "kept the existing secret" in result.stdout
    assert "new random secret" not in result.stdout
    assert (second / f"{NAME}.secret").read_bytes() == secret
    assert load_instance(NAME, second).node_id == "n2"
    assert_only(second, f"{NAME}.toml", f"{NAME}.secret")


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o644, 0o660])
def test_init_refuses_secret_readable_by_others(tmp_path, mode):
    """An existing secret readable by group or others is refused with a chmod hint; nothing written."""
    directory = tmp_path / "cfg"
    directory.mkdir()
    write_secret(directory / f"{NAME}.secret", SECRET + "-long-enough\n", mode)
    before = snapshot(directory)
    result = run_hb(init_args(directory, tmp_path / "store"))
    assert_one_line_error(
        result, "init", [f"chmod 600 {directory / f'{NAME}.secret'}", f"{mode:o}"]
    )
    assert snapshot(directory) == before
    assert stat.S_IMODE((directory / f"{NAME}.secret").stat().st_mode) == mode


def test_init_refuses_too_short_secret(tmp_path):
    """An existing secret under 8 characters is refused; no config is written."""
    directory = tmp_path / "cfg"
    directory.mkdir()
    write_secret(directory / f"{NAME}.secret", "12345\n")
    result = run_hb(init_args(directory, tmp_path / "store"))
    assert_one_line_error(result, "init", ["secret", "8"])
    assert_only(directory, f"{NAME}.secret")
    assert (directory / f"{NAME}.secret").read_text() == "12345\n"


def test_init_too_short_secret_names_the_file(tmp_path):
    """The error for a too-short existing secret names the secret file to fix."""
    directory = tmp_path / "cfg"
    directory.mkdir()
    write_secret(directory / f"{NAME}.secret", "12345\n")
    result = run_hb(init_args(directory, tmp_path / "store"))
    assert_one_line_error(result, "init", [str(directory / f"{NAME}.secret")])


# (id, extra argv after the name, words)
INIT_MISTAKES: list[tuple[str, list[str], list[str]]] = [
    ("ftp-store", ["--store", "ftp://x"], ["ftp://x", "scheme"]),
    ("relative-file-store", ["--store", "file://relative"], ["file://relative", "absolute"]),
    ("file-no-slashes", ["--store", "file:relative/path"], ["file:relative/path", "absolute"]),
    ("bad-node-id", ["--local-only", "--node-id", "bad/id"], ["'node_id'", "bad/id"]),
    ("bad-agent-id", ["--local-only", "--agent-id", "bad id"], ["'agent_id'", "bad id"]),
    ("tick-zero", ["--tick-ms", "0"], ["--tick-ms", "0"]),
]


@pytest.mark.parametrize(
    ("extra", "words"), [pytest.param(e, w, id=name) for name, e, w in INIT_MISTAKES]
)
def test_init_mistake_writes_nothing(tmp_path, extra, words):
    """A bad flag to ``hb init`` exits 2 in one line before writing: the directory stays empty."""
    directory = tmp_path / "cfg"
    directory.mkdir()
    result = run_hb(["init", NAME, "--config-dir", str(directory), *extra])
    assert result.returncode == 2, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and "error" in lines[0] and "Traceback" not in result.stderr, lines
    for word in words:
        assert word.lower() in lines[0].lower(), f"{word!r} not named in: {lines[0]}"
    assert list(directory.iterdir()) == []


def test_init_mistake_does_not_create_config_dir(tmp_path):
    """A bad --store does not even create a missing --config-dir."""
    directory = tmp_path / "cfg"
    result = run_hb(init_args(directory, "ftp://x"))
    assert_one_line_error(result, "init", ["ftp://x"])
    assert not directory.exists()


@pytest.mark.parametrize("name", ["../x", "a/b", ".x"])
def test_init_invalid_instance_name_writes_nothing(tmp_path, name):
    """``hb init`` refuses an instance name that is not a plain name, writing nothing anywhere."""
    directory = tmp_path / "cfg"
    directory.mkdir()
    result = run_hb(init_args(directory, tmp_path / "store", name=name))
    assert_one_line_error(result, "init", ["instance name", name])
    assert list(directory.iterdir()) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cfg"]


def test_init_prints_next_steps(tmp_path):
    """``hb init`` prints the scp of the secret and ``systemctl enable --now hamsterbunker@NAME``."""
    directory = tmp_path / "cfg"
    result = run_hb(init_args(directory, tmp_path / "store"))
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert f"systemctl enable --now hamsterbunker@{NAME}" in out
    secret = directory / f"{NAME}.secret"
    scp = [line.strip() for line in out.splitlines() if line.strip().startswith("scp ")]
    assert len(scp) == 1, out
    assert str(secret) in scp[0], scp


def test_init_relative_config_dir_prints_absolute_scp_paths(tmp_path):
    """With a relative --config-dir, the printed scp command names the secret by absolute path."""
    result = run_hb(
        ["init", NAME, "--config-dir", "cfg", "--store", (tmp_path / "store").as_uri()],
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    scp = next(line.split() for line in result.stdout.splitlines() if "scp " in line)
    source, target = scp[-2], scp[-1].split(":", 1)[1]
    assert source == target == str(tmp_path / "cfg" / f"{NAME}.secret"), scp


def test_init_store_outside_state_directory_prints_readwritepaths(tmp_path):
    """A store outside /var/lib/hamsterbunker gets the ReadWritePaths= hint naming it."""
    store = tmp_path / "store"
    result = run_hb(init_args(tmp_path / "cfg", store))
    assert result.returncode == 0, result.stderr
    assert f"ReadWritePaths={store}" in result.stdout
    assert f"systemctl edit hamsterbunker@{NAME}" in result.stdout


@pytest.mark.parametrize(
    "store",
    [f"file:///var/lib/hamsterbunker/{NAME}", "file:///var/lib/hamsterbunker", None],
    ids=["below", "itself", "default"],
)
def test_init_store_inside_state_directory_has_no_hint(tmp_path, store):
    """A store in /var/lib/hamsterbunker (the unit's StateDirectory) prints no ReadWritePaths hint."""
    args = ["init", NAME, "--config-dir", str(tmp_path / "cfg")]
    args += ["--store", store] if store is not None else ["--local-only"]
    result = run_hb(args)
    assert result.returncode == 0, result.stderr
    assert "ReadWritePaths" not in result.stdout


def test_init_store_escaping_state_directory_gets_hint(tmp_path):
    """A store path that leaves /var/lib/hamsterbunker through '..' still gets the hint."""
    result = run_hb(init_args(tmp_path / "cfg", "file:///var/lib/hamsterbunker/../../srv/store"))
    assert result.returncode == 0, result.stderr
    assert "ReadWritePaths" in result.stdout


def test_init_refuses_timing_that_run_refuses(tmp_path):
    """``hb init`` refuses --tick-ms/--lease-ttl-ms that no node could run with, writing nothing."""
    directory = tmp_path / "cfg"
    directory.mkdir()
    result = run_hb(
        init_args(directory, tmp_path / "store", "--tick-ms", "1500", "--lease-ttl-ms", "2000")
    )
    assert result.returncode == 2, result.stdout
    assert list(directory.iterdir()) == []


# -- 5. atomic writes ---------------------------------------------------------------------


def _config(region: str) -> NodeConfig:
    return NodeConfig(store="file:///srv/hb", agent=AGENT, node_id="n1", region=region)


def _failing(name: str) -> Callable[..., Any]:
    def fail(*args: object, **kwargs: object) -> None:
        raise OSError(5, f"injected {name} failure")

    return fail


@pytest.mark.parametrize("op", ["fsync", "replace"])
def test_crash_while_replacing_config_keeps_old_one(tmp_path, monkeypatch, op):
    """A failure while --force writes NAME.toml leaves the old file whole and no temp file."""
    provision(NAME, _config("old"), tmp_path, force=False)
    before = snapshot(tmp_path)
    monkeypatch.setattr(f"hamsterbunker.ops.provision.os.{op}", _failing(op))
    with pytest.raises(OSError, match="injected"):
        provision(NAME, _config("new"), tmp_path, force=True)
    monkeypatch.undo()
    assert snapshot(tmp_path) == before
    assert load_instance(NAME, tmp_path).region == "old"


@pytest.mark.parametrize("op", ["fsync", "link"])
def test_crash_while_writing_first_config_leaves_none(tmp_path, monkeypatch, op):
    """A failure while writing a new NAME.toml leaves no NAME.toml and no temp file."""
    write_secret(tmp_path / f"{NAME}.secret", SECRET + "\n")
    monkeypatch.setattr(f"hamsterbunker.ops.provision.os.{op}", _failing(op))
    with pytest.raises(OSError, match="injected"):
        provision(NAME, _config("new"), tmp_path, force=False)
    monkeypatch.undo()
    assert_only(tmp_path, f"{NAME}.secret")
    assert (tmp_path / f"{NAME}.secret").read_text() == SECRET + "\n"


@pytest.mark.parametrize("op", ["fsync", "link"])
def test_crash_while_writing_new_secret_leaves_nothing(tmp_path, monkeypatch, op):
    """A failure while writing a new secret leaves neither secret nor config nor temp file."""
    monkeypatch.setattr(f"hamsterbunker.ops.provision.os.{op}", _failing(op))
    with pytest.raises(OSError, match="injected"):
        provision(NAME, _config("new"), tmp_path, force=False)
    monkeypatch.undo()
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "store", ["etcd://127.0.0.1:2379,127.0.0.2:2379/hb", "redis://127.0.0.1:6379/0?prefix=hb"]
)
def test_init_takes_a_server_store_without_connecting(tmp_path, store):
    """etcd:// and redis:// URLs are checked, not dialled (nothing listens here), and need no hint."""
    result = run_hb(init_args(tmp_path / "cfg", store))
    assert result.returncode == 0, result.stderr
    assert load_instance(NAME, tmp_path / "cfg").store == store
    assert "ReadWritePaths" not in result.stdout


@pytest.mark.parametrize("store", ["etcd://127.0.0.1:2379", "redis://127.0.0.1:notaport/0"])
def test_init_refuses_a_bad_server_store_url(tmp_path, store):
    """A bad etcd or Redis URL is refused in one line before anything is written."""
    result = run_hb(init_args(tmp_path / "cfg", store))
    assert_one_line_error(result, "init", ["store URL"])
    assert not (tmp_path / "cfg").exists()
