"""The README's inbox example, as a user runs it: two `hb run` nodes with
examples/answerer.py, `hb submit --wait` asking a question, and the active node
SIGKILLed while it thinks: the answer arrives, from the other node."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from hamsterbunker.records import Heartbeat
from hamsterbunker.stores import open_store
from tests.support.cli import FAST, HB, SECRET, hb_env, wait_for

pytestmark = pytest.mark.multiprocess

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
AGENT_ID = "answerer"


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    yield started
    for process in started:
        if process.poll() is None:
            process.kill()
        process.communicate(timeout=30)


def test_the_answer_to_a_question_asked_while_its_node_dies_comes_from_the_next_leader(
    tmp_path: Path, processes: list[subprocess.Popen[str]]
) -> None:
    url = f"file://{tmp_path / 'store'}"
    env = hb_env(HB_SECRET=SECRET, PYTHONPATH=os.pathsep.join([str(EXAMPLES), *sys.path]),
                 ANSWERER_THINK_S="2")  # fmt: skip
    for node in ("node-a", "node-b"):
        run = [*HB, "run", "--store", url, "--agent", "answerer:Answerer", "--node-id", node,
               "--region", f"r-{node}", "--create-store", *FAST]  # fmt: skip
        processes.append(subprocess.Popen(run, env=env, text=True, stdout=subprocess.PIPE,
                                          stderr=subprocess.STDOUT))  # fmt: skip
    # As the README's `sleep 2`: hb submit needs the store to exist, which a node makes.
    wait_for("a node to make the store", lambda: (tmp_path / "store").is_dir() or None, 30)
    ask = [*HB, "submit", "--store", url, "--agent-id", AGENT_ID, "--request-id", "q1", "--wait",
           "--timeout", "60", "--data", '"why is the sky blue?"']  # fmt: skip
    submit = subprocess.Popen(ask, env=env, text=True, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE)  # fmt: skip
    processes.append(submit)
    store = open_store(url)
    try:
        thinking = wait_for("the active node to think about #1", lambda: _thinking(store), 30)
    finally:
        store.close()
    os.kill(thinking.pid, signal.SIGKILL)
    out, err = submit.communicate(timeout=60)
    assert submit.returncode == 0, err
    first, answer = out.strip().splitlines()
    assert first == "admitted as #1 (request id q1)"
    survivor = ({"node-a", "node-b"} - {thinking.node}).pop()
    assert json.loads(answer) == {"answer": "5 words, and a good question", "answered_by": survivor}


def _thinking(store: object) -> Heartbeat | None:
    beats = store.list_heartbeats(AGENT_ID)  # type: ignore[attr-defined]
    return next(
        (b for b in beats if b.role == "active" and any(n == "think-1" for n, _ in b.effects)),
        None,
    )
