"""Duplicate node ids: a second `hb run` under the id of a live node refuses to start (exit 2,
naming the other's host and pid); the heartbeat of a SIGKILLed node does not block a restart."""

from __future__ import annotations

import signal
import socket
import subprocess
from pathlib import Path

from hamsterbunker import FileStore
from hamsterbunker.records import Heartbeat
from hamsterbunker.stores.layer.keys import CLUSTER
from tests.support import wait_until
from tests.support.cli import AGENT, AGENT_ID, FAST, HB, SECRET, hb_env
from tests.support.raw_store import file_key


def _start(store: Path, log_path: Path) -> subprocess.Popen[bytes]:
    command = [
        *HB, "run", "--store", store.as_uri(), "--agent", AGENT, "--node-id", "twin",
        "--create-store", *FAST,
    ]  # fmt: skip
    with log_path.open("ab") as log:
        return subprocess.Popen(
            command, env=hb_env(HB_SECRET=SECRET), stdin=subprocess.DEVNULL, stdout=log,
            stderr=subprocess.STDOUT,
        )  # fmt: skip


def _heartbeat(store: Path, pid: int) -> Heartbeat | None:
    if not file_key(store, CLUSTER).exists():
        return None
    for heartbeat in FileStore(store, create=False).list_heartbeats(AGENT_ID):
        if heartbeat.node == "twin" and heartbeat.pid == pid and heartbeat.beats >= 2:
            return heartbeat
    return None


def _stop(node: subprocess.Popen[bytes]) -> None:
    if node.poll() is None:
        node.kill()
        node.wait(timeout=10)


def test_a_second_node_with_a_live_nodes_id_exits_2_naming_it(tmp_path: Path) -> None:
    store = tmp_path / "store"
    first = _start(store, tmp_path / "first.log")
    try:
        wait_until(lambda: _heartbeat(store, first.pid), "the first node to beat", 30)
        second = subprocess.run(
            [*HB, "run", "--store", store.as_uri(), "--agent", AGENT, "--node-id", "twin", *FAST],
            env=hb_env(HB_SECRET=SECRET), stdin=subprocess.DEVNULL, capture_output=True,
            text=True, timeout=30,
        )  # fmt: skip
        assert second.returncode == 2, second.stderr
        assert "Traceback" not in second.stderr, second.stderr
        lines = [line for line in second.stderr.splitlines() if line.startswith("hb run:")]
        assert len(lines) == 1, second.stderr
        assert lines[0].startswith("hb run: error: node id 'twin' is already in use"), lines
        assert f"host {socket.gethostname()!r} (pid {first.pid})" in lines[0], lines
        assert first.poll() is None, (tmp_path / "first.log").read_text()
        # The first node's heartbeat is still its own, and it keeps beating.
        before = _heartbeat(store, first.pid)
        assert before is not None
        wait_until(
            lambda: (hb := _heartbeat(store, first.pid)) and hb.beats > before.beats,
            "the first node to beat on",
            10,
        )
        first.send_signal(signal.SIGTERM)
        assert first.wait(timeout=20) == 0, (tmp_path / "first.log").read_text()
    finally:
        _stop(first)


def test_the_heartbeat_of_a_killed_node_does_not_block_a_restart(tmp_path: Path) -> None:
    store = tmp_path / "store"
    first = _start(store, tmp_path / "first.log")
    try:
        wait_until(lambda: _heartbeat(store, first.pid), "the first node to beat", 30)
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=10)
    finally:
        _stop(first)
    assert _heartbeat(store, first.pid) is not None  # left behind
    again = _start(store, tmp_path / "again.log")
    try:
        wait_until(lambda: _heartbeat(store, again.pid), "the restarted node to beat", 30)
        assert again.poll() is None, (tmp_path / "again.log").read_text()
    finally:
        _stop(again)
