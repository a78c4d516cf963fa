"""`hb run` and stop signals: the first SIGTERM waits for the step in flight within the stop
grace; a second SIGTERM (or SIGINT) gives it no more grace."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

from hamsterbunker import FileStore
from tests.support import SUPPORT_DIR, wait_until
from tests.support.agents import SECRET
from tests.support.cli import HB, hb_env

AGENT_ID = "journal"


def test_a_second_stop_signal_cuts_the_grace_short(tmp_path: Path) -> None:
    """A step of a minute, a grace of a minute: after the first SIGTERM the node still runs
    (stopping, lease held); the second SIGTERM ends the step and the node exits 0 at once,
    releasing the lease and publishing nothing of the step it gave up."""
    store, log_path = tmp_path / "store", tmp_path / "node.log"
    command = [
        *HB, "run", "--create-store", "--store", store.as_uri(),
        "--agent", "hb_test_agents:JournalCounter",
        "--node-id", "n1", "--tick-ms", "100", "--lease-ttl-ms", "600",
        "--stop-grace-ms", "60000",
    ]  # fmt: skip
    began = tmp_path / "began"  # the agent's step is in flight: the stop waits for it
    env = hb_env(
        HB_SECRET=SECRET, HB_TEST_STEP_S="60", HB_TEST_BEGUN=str(began), PYTHONPATH=str(SUPPORT_DIR)
    )
    with log_path.open("ab") as log:
        node = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT)  # fmt: skip
    try:
        wait_until(began.exists, "n1 to lead and start its first step", 30)
        node.send_signal(signal.SIGTERM)
        wait_until(
            lambda: "node.stopping" in log_path.read_text() or node.poll() is not None,
            "n1 to say it is stopping",
            10,
        )
        assert "grace_ms=60000" in log_path.read_text()  # it waits for the step in flight
        assert node.poll() is None, log_path.read_text()
        second = time.monotonic()
        node.send_signal(signal.SIGTERM)
        assert node.wait(timeout=15) == 0, log_path.read_text()
        assert time.monotonic() - second < 10
    finally:
        if node.poll() is None:
            node.kill()
            node.wait(timeout=10)
    text = log_path.read_text()
    assert "agent.yielded" in text and "lease.released" in text, text
    assert FileStore(store).list_checkpoints(AGENT_ID) == []
