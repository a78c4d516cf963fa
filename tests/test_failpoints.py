"""Failpoints (``hamsterbunker.core.failpoints``): a point reached inside a scope counts as
``scope.point`` too, so a test can kill a node in one kind of write; a stop never lands
inside another thread's unstoppable block."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from tests.support import process_state, wait_until

REACHES = """
from hamsterbunker.core.failpoints import failpoint, failpoints_within

failpoint("p")
print("outside", flush=True)
with failpoints_within("s"):
    failpoint("p")
    print("first inside", flush=True)
    failpoint("p")
    print("second inside", flush=True)
failpoint("p")
print("done", flush=True)
"""


@pytest.mark.parametrize(
    ("armed", "printed"),
    [
        ("s.p=kill@2", ["outside", "first inside"]),  # the second hit inside the scope
        ("p=kill@3", ["outside", "first inside"]),  # the third hit, in or out of it
        ("s.p=kill@3", ["outside", "first inside", "second inside", "done"]),  # never
    ],
)
def test_a_point_inside_a_scope_is_reached_under_both_names(armed: str, printed: list[str]) -> None:
    env = {**os.environ, "HB_FAILPOINTS": armed}
    done = subprocess.run(
        [sys.executable, "-c", REACHES], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.stdout.splitlines() == printed, done.stderr
    assert done.returncode == (0 if "done" in printed else -9), done.stderr


HOLDS_ON = """
import threading, time
from hamsterbunker.core.failpoints import failpoint, not_stopped_inside

inside = threading.Event()

def hold() -> None:
    with not_stopped_inside():
        inside.set()
        time.sleep(0.5)
        print("left the block", flush=True)

holder = threading.Thread(target=hold)
holder.start()
inside.wait()
failpoint("p")
print("went on", flush=True)
holder.join()
"""


@pytest.mark.timeout(60)  # a stop inside the block would leave readline waiting
def test_a_stop_waits_for_other_threads_to_leave_their_unstoppable_blocks() -> None:
    """A process stopped at a failpoint never stops inside a ``not_stopped_inside`` block of
    another thread (the file store's lock): the stop comes once that block is left."""
    env = {**os.environ, "HB_FAILPOINTS": "p=stop"}
    child = subprocess.Popen(
        [sys.executable, "-c", HOLDS_ON], env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline() == "left the block\n"  # before the stop: it waited
        wait_until(lambda: process_state(child.pid) == "T", "the process to stop")
        child.send_signal(signal.SIGCONT)
        assert child.stdout.readline() == "went on\n"
        assert child.wait(timeout=30) == 0
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(timeout=10)
