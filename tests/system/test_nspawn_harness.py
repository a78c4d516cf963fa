"""The harness itself: the container boots, runs commands, and installs the project."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from .nspawn import CommandFailed, Container

pytestmark = pytest.mark.system

REPO = Path(__file__).resolve().parents[2]


def test_boots_a_real_systemd(booted: Container) -> None:
    state = booted.run("systemctl", "is-system-running", "--wait", check=False, timeout=60)
    assert state.stdout.strip() in ("running", "degraded"), state
    assert booted.run("cat", "/proc/1/comm").stdout.strip() == "systemd"
    assert booted.run("hostname").stdout.strip() == booted.name
    assert booted.run("systemd-detect-virt").stdout.strip() == "systemd-nspawn"


def test_commands_get_input_output_and_exit_status(booted: Container) -> None:
    assert booted.run("cat", input="through stdin").stdout == "through stdin"
    assert booted.run("id", "-un", user="nobody").stdout.strip() == "nobody"
    assert booted.run("sh", "-c", "echo $HB_X", env={"HB_X": "set"}).stdout == "set\n"
    # The host's environment stays outside.
    assert "PIP_" not in booted.run("env").stdout
    with pytest.raises(CommandFailed, match="to stderr"):
        booted.run("sh", "-c", "echo to stderr >&2; exit 3")
    assert booted.run("false", check=False).returncode == 1
    with pytest.raises(subprocess.TimeoutExpired):
        booted.run("sleep", "30", timeout=0.5)


def test_files_written_on_the_host_are_seen_inside(booted: Container) -> None:
    booted.path("/etc/systemd/system/hb-probe.service").write_text(
        "[Service]\nType=oneshot\nExecStart=/bin/sh -c 'echo probed > /run/hb-probe'\n"
    )
    booted.run("systemctl", "daemon-reload")
    booted.run("systemctl", "start", "hb-probe.service", timeout=30)
    assert booted.run("cat", "/run/hb-probe").stdout == "probed\n"
    # /run and /tmp are tmpfs mounted inside: not visible through booted.root.
    assert not booted.path("/run/hb-probe").exists()


def test_no_network_inside(booted: Container) -> None:
    interfaces = booted.run("ls", "/sys/class/net").stdout.split()
    assert interfaces == ["lo"]


def test_project_installs_offline_with_make_install_systemd(booted: Container) -> None:
    booted.install_project(REPO)
    assert "usage: hb" in booted.run("/opt/hamsterbunker/bin/hb", "--help").stdout
    # With the extras a node uses: hb-tui linked like hb, the Redis and etcd clients.
    assert "hb-tui" in booted.run("/usr/local/bin/hb-tui", "--help").stdout
    booted.run("/opt/hamsterbunker/bin/python", "-c", "import textual, redis, etcd3gw")
    booted.run("systemctl", "cat", "hamsterbunker@.service")
    assert booted.run("id", "-un", "hamsterbunker").stdout == "hamsterbunker\n"
    # The container has no network: everything came from the host's wheels.
    assert booted.run("ls", "/opt/wheels").stdout.count(".whl") >= 5
