"""``hb init`` names the store a cluster shares, or says it is a cluster of one machine.

A default store on the local disk would give every machine that follows the
README its own cluster, each with a leader of the same agent. So ``hb init``
without ``--store`` (or ``$HB_STORE``) and without ``--local-only`` is refused
in one line naming both, before anything is written; ``--local-only`` takes
``/var/lib/hamsterbunker/NAME`` as before. The NixOS module's counterpart is
tested in tests/ops/test_nix.py.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from hamsterbunker.core.errors import ConfigError
from hamsterbunker.ops.config import KEYS, load_instance
from hamsterbunker.ops.provision import choose_store, local_store
from tests.support.cli import hb_env, run_hb

NAME = "agent"


def one_error_line(result: subprocess.CompletedProcess[str], *words: str) -> str:
    """Exit 2, nothing on stdout, one stderr line ``hb init: error: ...`` naming words."""
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert result.stdout == "" and "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("hb init: error: "), lines[0]
    for word in words:
        assert word in lines[0], f"{word!r} not named in: {lines[0]}"
    return lines[0]


def test_init_without_store_or_local_only_is_refused(tmp_path):
    """``hb init NAME`` alone exits 2 in one line naming --store and --local-only; writes nothing."""
    config_dir = tmp_path / "cfg"
    result = run_hb(["init", NAME, "--config-dir", str(config_dir), "--node-id", "n1"])
    one_error_line(result, "--store", "--local-only", "HB_STORE", local_store(NAME))
    assert not config_dir.exists()


def test_init_store_and_local_only_exclude_each_other(tmp_path):
    """--store with --local-only is a contradiction: exit 2 naming both, nothing written."""
    config_dir = tmp_path / "cfg"
    store = (tmp_path / "store").as_uri()
    result = run_hb(
        ["init", NAME, "--config-dir", str(config_dir), "--store", store, "--local-only"]
    )
    one_error_line(result, "--store", "--local-only")
    assert not config_dir.exists()


def test_init_local_only_takes_the_local_store_and_prints_no_scp(tmp_path):
    """--local-only writes the store /var/lib/hamsterbunker/NAME; no secret to copy anywhere."""
    config_dir = tmp_path / "cfg"
    result = run_hb(["init", NAME, "--config-dir", str(config_dir), "--local-only"])
    assert result.returncode == 0, result.stderr
    assert load_instance(NAME, config_dir).store == f"file:///var/lib/hamsterbunker/{NAME}"
    assert "one machine" in result.stdout
    assert "scp" not in result.stdout
    assert f"systemctl enable --now hamsterbunker@{NAME}" in result.stdout


def test_init_takes_the_store_from_hb_store(tmp_path):
    """$HB_STORE names the store as --store does (keeping a password off the command line)."""
    config_dir = tmp_path / "cfg"
    store = (tmp_path / "store").as_uri()
    result = run_hb(["init", NAME, "--config-dir", str(config_dir)], env=hb_env(HB_STORE=store))
    assert result.returncode == 0, result.stderr
    assert load_instance(NAME, config_dir).store == store


def test_three_machines_following_the_readme_share_one_store(tmp_path):
    """hb init on three machines (secret copied) writes one store URL, and tells each to use it."""
    store = (tmp_path / "shared").as_uri()
    machines = [tmp_path / f"machine{i}" for i in (1, 2, 3)]
    first = run_hb(["init", NAME, "--config-dir", str(machines[0]), "--store", store])
    assert first.returncode == 0, first.stderr
    assert f"hb init {NAME} --store URL" in first.stdout
    secret = (machines[0] / f"{NAME}.secret").read_bytes()
    for number, machine in enumerate(machines[1:], start=2):
        machine.mkdir()
        (machine / f"{NAME}.secret").write_bytes(secret)
        (machine / f"{NAME}.secret").chmod(0o600)
        result = run_hb(
            [
                "init",
                NAME,
                "--config-dir",
                str(machine),
                "--store",
                store,
                "--node-id",
                f"n{number}",
            ]
        )
        assert result.returncode == 0, result.stderr
    assert {load_instance(NAME, machine).store for machine in machines} == {store}


@pytest.mark.parametrize(
    ("store", "local_only", "expected"),
    [
        ("redis://r:6379/0", False, "redis://r:6379/0"),
        (None, True, "file:///var/lib/hamsterbunker/x"),
        ("", True, "file:///var/lib/hamsterbunker/x"),
    ],
)
def test_choose_store(store, local_only, expected):
    """The given store, or with local_only the local one."""
    assert choose_store("x", store, local_only=local_only) == expected


@pytest.mark.parametrize(("store", "local_only"), [(None, False), ("", False), ("file:///s", True)])
def test_choose_store_refuses(store, local_only):
    """Neither a store nor --local-only, or both, is a ConfigError."""
    with pytest.raises(ConfigError, match="--local-only"):
        choose_store("x", store, local_only=local_only)


def test_readmes_init_commands_name_a_store():
    """Every `hb init` command the READMEs show names --store or --local-only."""
    root = Path(__file__).resolve().parents[2]
    for readme in (root / "README.md", root / "systemd" / "README.md"):
        commands = [
            line
            for line in readme.read_text(encoding="utf-8").splitlines()
            if line.lstrip().startswith("hb init ")
        ]
        assert commands, f"{readme} shows no hb init command"
        for command in commands:
            assert "--store" in command or "--local-only" in command, (readme, command)


def test_init_without_agent_says_the_demo_counter_was_chosen_and_lists_every_key(tmp_path):
    """No --agent: the config runs the demo counter, and hb init says so on stderr (how to
    choose another); with --agent it says nothing. The file's header names every key."""
    store = (tmp_path / "store").as_uri()
    config_dir = tmp_path / "cfg"
    demo = run_hb(["init", NAME, "--config-dir", str(config_dir), "--store", store])
    assert demo.returncode == 0, demo.stderr
    assert demo.stderr.splitlines() == [
        f"hb init: no --agent given: {NAME} runs the demo counter "
        f"(hamsterbunker.demo:CounterAgent). For your own agent: hb init {NAME} --agent "
        f"MODULE:ATTR --force (or edit agent = in {config_dir.absolute() / (NAME + '.toml')})"
    ]
    header = [
        line for line in (config_dir / f"{NAME}.toml").read_text().splitlines()
        if line.startswith("#")
    ]  # fmt: skip
    listed = {key.strip(" ,") for line in header for key in line.lstrip("# ").split(",")}
    assert set(KEYS) <= listed, header
    own = run_hb(["init", NAME, "--config-dir", str(config_dir), "--store", store,
                  "--agent", "mypkg.agents:Mine", "--force"])  # fmt: skip
    assert own.returncode == 0 and own.stderr == "", own.stderr
    assert load_instance(NAME, config_dir).agent == "mypkg.agents:Mine"
