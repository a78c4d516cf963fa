"""``hb status`` shows the active node's inbox: how many submissions wait, and the oldest's age.

The depth and the oldest unconsumed submission's time come from the active
node's heartbeat (the age is our clock minus the submitter's: display only).
Planted heartbeats test the lines and fields; a real node fed by ``hb submit``
tests the way there.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from hamsterbunker import FileStore
from hamsterbunker.records import Heartbeat, LeaseRecord
from tests.support import SUPPORT_DIR
from tests.support.cli import HB, SECRET, hb_env, run_hb, wait_for

AGENT_ID = "journal"  # hb_test_agents.JournalCounter.id: it never consumes


def beat(node: str, role: str, depth: int = 0, oldest: float | None = None) -> Heartbeat:
    return Heartbeat(node=node, region="eu", host="h", pid=4242, role=role, epoch=1, seq=7,
                     leader="n1", time=time.time(), beats=1, inbox_depth=depth,
                     inbox_oldest=oldest)  # fmt: skip


def status(store: Path) -> tuple[str, dict[str, Any]]:
    # Not watched: nobody renews a planted lease, and its TTL is a minute.
    args = ["status", "--store", store.as_uri(), "--agent-id", AGENT_ID, "--observe-ms", "0"]
    text, as_json = run_hb(args), run_hb([*args, "--json"])
    # 1 (degraded) where the planted lease is released: no live leader.
    assert text.returncode in (0, 1), text.stderr
    assert as_json.returncode == text.returncode, as_json.stderr
    return text.stdout, json.loads(as_json.stdout)


def status_text(store: Path) -> str:
    """hb status's text, or "" while it fails (the node has not made the store yet)."""
    result = run_hb(["status", "--store", store.as_uri(), "--agent-id", AGENT_ID])
    return result.stdout if result.returncode == 0 else ""


def planted(root: Path, holder: str | None, *beats: Heartbeat) -> Path:
    store = FileStore(root)
    lease = store.cas_lease(AGENT_ID, None, LeaseRecord("n1", "eu", "s1", epoch=1, ttl_ms=60_000))
    if holder is None:
        store.cas_lease(
            AGENT_ID, lease.version, LeaseRecord(None, "eu", "s1", epoch=1, ttl_ms=60_000)
        )
    for one in beats:
        store.put_heartbeat(AGENT_ID, one)
    return root


def test_status_does_not_say_empty_while_the_leader_is_paused(tmp_path: Path) -> None:
    """A paused leader reads no inbox: the depth its heartbeat carries is from before the
    pause (here 0, with submissions admitted since). Text: "not known while paused"; JSON:
    no depth, and no oldest age."""
    paused = replace(beat("n1", "active", depth=0), paused=True)
    text, data = status(planted(tmp_path / "store", "n1", paused))
    assert "inbox: not known while paused (a paused leader does not read it)" in text, text
    assert "inbox: empty" not in text
    assert (data["inbox_depth"], data["inbox_oldest_age_s"], data["paused"]) == (None, None, True)


def test_status_shows_the_active_nodes_inbox_depth_and_oldest_age(tmp_path: Path) -> None:
    """Active n1 says 3 wait, the oldest submitted 12 s ago; a standby's heartbeat is not the
    inbox's. Text: "inbox: 3 waiting, oldest 12 s"; JSON: the fields, top level and per node."""
    store = planted(
        tmp_path / "store",
        "n1",
        beat("n1", "active", depth=3, oldest=time.time() - 12),
        beat("n2", "standby", depth=9, oldest=time.time() - 999),
    )
    text, data = status(store)
    found = re.search(r"^inbox: 3 waiting, oldest (\d+) s$", text, re.M)
    assert found, text
    assert 12 <= int(found.group(1)) < 20, text
    assert data["inbox_depth"] == 3
    assert 12 <= data["inbox_oldest_age_s"] < 20
    nodes = {n["node"]: n for n in data["nodes"]}
    assert nodes["n1"]["inbox_depth"] == 3
    assert 12 <= nodes["n1"]["inbox_oldest_age_s"] < 20
    assert nodes["n2"]["inbox_depth"] == 9  # as its heartbeat says; not the inbox's
    # The fields that were there before are all still there.
    assert {"store", "agent", "lease", "nodes", "checkpoint", "checkpoint_age_s"} <= data.keys()
    assert {"node", "role", "epoch", "seq", "age_s", "effects"} <= nodes["n1"].keys()


@pytest.mark.parametrize(
    ("age", "shown"),
    [(3.5, r"(?P<s>\d+\.\d) s"), (185, r"(?P<m>3) m (?P<s>\d\d) s"), (3 * 86400 + 60, r"3 d")],
    ids=["seconds", "minutes", "days"],
)
def test_the_oldest_age_reads_as_a_person_would_say_it(
    tmp_path: Path, age: float, shown: str
) -> None:
    planted_at = time.time()
    store = planted(tmp_path / "store", "n1", beat("n1", "active", 1, planted_at - age))
    text, _ = status(store)
    waited = time.time() - planted_at  # hb status as a process: seconds on a loaded machine
    found = re.search(rf"^inbox: 1 waiting, oldest {shown}$", text, re.M)
    assert found, text
    parts = found.groupdict()
    if parts:  # the figure shown is the age when hb status looked
        seconds = 60 * int(parts.get("m") or 0) + float(parts["s"])
        assert age - 0.1 <= seconds <= age + waited + 1, text


def test_status_says_when_the_inbox_is_empty_or_not_known(tmp_path: Path) -> None:
    """Depth 0: "inbox: empty". No active node (the lease released): not known, null in JSON."""
    empty = planted(tmp_path / "a", "n1", beat("n1", "active"))
    text, data = status(empty)
    assert re.search(r"^inbox: empty$", text, re.M), text
    assert (data["inbox_depth"], data["inbox_oldest_age_s"]) == (0, None)

    released = planted(tmp_path / "b", None, beat("n1", "standby", 2, time.time() - 5))
    text, data = status(released)
    assert re.search(r"^inbox: not known \(no active node to tell it\)$", text, re.M), text
    assert (data["inbox_depth"], data["inbox_oldest_age_s"]) == (None, None)


def test_a_far_off_submitter_clock_is_shown_within_bounds(tmp_path: Path) -> None:
    """The time is the submitter's wall clock: one far ahead reads as 0, one far behind is
    capped, and neither breaks the line."""
    ahead = planted(tmp_path / "a", "n1", beat("n1", "active", 1, time.time() + 1e6))
    text, data = status(ahead)
    assert re.search(r"^inbox: 1 waiting, oldest 0\.0 s$", text, re.M), text
    assert data["inbox_oldest_age_s"] == 0
    behind = planted(tmp_path / "b", "n1", beat("n1", "active", 1, -1e300))
    text, _ = status(behind)
    assert re.search(r"^inbox: 1 waiting, oldest > 10000 d$", text, re.M), text


@pytest.mark.multiprocess
def test_status_shows_submissions_waiting_at_a_running_node(tmp_path: Path) -> None:
    """A node whose agent never consumes: two ``hb submit``s reach its heartbeat, and
    ``hb status`` shows them waiting."""
    store, log_path = tmp_path / "store", tmp_path / "node.log"
    command = [
        *HB, "run", "--create-store", "--store", store.as_uri(),
        "--agent", "hb_test_agents:JournalCounter",
        "--node-id", "n1", "--region", "test", "--tick-ms", "100", "--lease-ttl-ms", "600",
    ]  # fmt: skip
    env = hb_env(HB_SECRET=SECRET, PYTHONPATH=str(SUPPORT_DIR))
    with log_path.open("ab") as log:
        node = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT)  # fmt: skip
    try:
        wait_for("the node to lead", lambda: "inbox: empty" in status_text(store) or None, 30)
        for n in (1, 2):
            sent = run_hb(
                ["submit", "--store", store.as_uri(), "--agent-id", AGENT_ID, "--data", str(n)],
                env=hb_env(HB_SECRET=SECRET),
            )
            assert sent.returncode == 0, sent.stderr
        pattern = re.compile(r"^inbox: 2 waiting, oldest \d+\.\d s$", re.M)
        text = wait_for(
            "hb status to show 2 waiting", lambda: pattern.search(status_text(store)), 60
        )
        assert text
        data = status(store)[1]
        assert data["inbox_depth"] == 2
        assert 0 <= data["inbox_oldest_age_s"] < 30
    finally:
        node.send_signal(signal.SIGTERM)
        try:
            node.wait(timeout=15)
        except subprocess.TimeoutExpired:
            node.kill()
            node.wait(timeout=10)
