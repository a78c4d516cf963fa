"""Failpoints (``hamsterbunker.failpoints``): a point reached inside a scope counts as
``scope.point`` too, so a test can kill a node in one kind of write."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

REACHES = """
from hamsterbunker.failpoints import failpoint, failpoints_within

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
