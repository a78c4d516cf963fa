"""Running `hb` as a user would: a clean environment, the demo's output read back."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from hamsterbunker.core.errors import StoreError

HB = [sys.executable, "-m", "hamsterbunker"]
AGENT = "hamsterbunker.demo:CounterAgent"
AGENT_ID = "counter"  # CounterAgent.id
SECRET = "correct-horse-battery"
FAST = ["--tick-ms", "100", "--lease-ttl-ms", "600"]
T = TypeVar("T")


# -- helpers ------------------------------------------------------------------


def hb_env(**overrides: str) -> dict[str, str]:
    """os.environ without secret sources, config directory or systemd variables, plus overrides."""
    env = dict(os.environ)
    for name in (
        "HB_SECRET",
        "CREDENTIALS_DIRECTORY",
        "CONFIGURATION_DIRECTORY",
        "NOTIFY_SOCKET",
        "WATCHDOG_USEC",
        "WATCHDOG_PID",
        "JOURNAL_STREAM",
        "STATE_DIRECTORY",
        "HB_STORE",
    ):
        env.pop(name, None)
    env.update(overrides)
    return env


def run_hb(
    args: list[str],
    *,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    timeout: float = 30,
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*HB, *args],
        env=hb_env() if env is None else env,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def wait_for(what: str, probe: Callable[[], T | None], timeout: float) -> T:
    """Poll probe until it returns something other than None, at most timeout seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = probe()
        except StoreError:
            value = None  # a record mid-write: look again
        if value is not None:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


ACTIVE = re.compile(r"^active node: (hbnk-\d) \((.+)\) · agent at count=(\d+)$", re.M)
KILL = re.compile(r"^!! killing active node (hbnk-\d) \(SIGKILL\)", re.M)
RESUMED = re.compile(r"↳ (hbnk-\d) \((.+)\) RESUMED at count=(\d+) · epoch (\d+)", re.M)
SURVIVED = "✓ SURVIVED — agent resumed from checkpoint, 0 state loss."


def run_demo(
    args: list[str], timeout: float, capsys, record_property
) -> subprocess.CompletedProcess[str]:
    started = time.monotonic()
    result = run_hb(["demo", *args], timeout=timeout)
    wall = time.monotonic() - started
    record_property("demo_wall_s", round(wall, 2))
    with capsys.disabled():
        print(f"\n[hb demo {' '.join(args)}] wall time {wall:.2f} s", flush=True)
    assert result.returncode == 0, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    return result


def check_rounds(out: str, epochs: list[int]) -> None:
    actives, kills, resumes = ACTIVE.findall(out), KILL.findall(out), RESUMED.findall(out)
    assert len(actives) == len(kills) == len(resumes) == len(epochs), out
    for (active, _, count), killed, (resumer, _, resumed_count, epoch), want in zip(
        actives, kills, resumes, epochs, strict=True
    ):
        assert killed == active, out
        assert resumer != killed, out
        assert int(epoch) == want, out
        # The "active node" count was read before the kill: the resume cannot be behind it.
        assert int(resumed_count) >= int(count), out
    assert out.index(SURVIVED) > out.rindex("RESUMED"), out
