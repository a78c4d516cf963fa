"""A node unit started while its store is down, under a real systemd in systemd-nspawn.

hamsterbunker@boot.service uses a Redis store on the container's loopback,
where no server listens when the unit starts. The unit must neither fail
(exit 1 at once used to end in start-limit-hit after five restarts) nor time
out (TimeoutStartSec=60s: the node extends it while it waits); it stays
`activating` with a STATUS= saying what it waits for. Sixty seconds later the
Redis server starts, and the node joins by itself: READY=1 (the unit becomes
active), then it takes the lease, as no other node runs.

The server is the host's redis-server binary run in the container's network
namespace only (nsenter --net): the container's root tree needs no Redis.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from .nspawn import Container, run_bounded, wait_for
from .test_systemd_node import REPO, journal, show, unit

pytestmark = pytest.mark.system

INSTANCE = "boot"
PORT = 6390
STORE = f"redis://127.0.0.1:{PORT}/0?prefix=boot"
# The scenario: the store comes up a minute after the unit started. That is
# past TimeoutStartSec=60s and, at the old RestartSec=2s, far past five failed starts.
STORE_DOWN_S = 60.0


def _redis_answers(box: Container) -> bool:
    pinged = run_bounded(
        ["nsenter", f"--target={box.leader}", "--net", "--", "redis-cli", "-p", str(PORT), "ping"],
        timeout=10,
    )
    return pinged.returncode == 0 and "PONG" in pinged.stdout


@contextlib.contextmanager
def _redis_in(box: Container) -> Iterator[subprocess.Popen[bytes]]:
    """A redis-server listening on the container's loopback, stopped afterwards."""
    workdir = tempfile.mkdtemp(prefix="hb-redis-nspawn-")
    server = subprocess.Popen(
        ["nsenter", f"--target={box.leader}", "--net", "--",
         "redis-server", "--port", str(PORT), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no", "--dir", workdir, "--logfile", "redis.log"],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True,
    )  # fmt: skip
    try:
        wait_for(lambda: server.poll() is None and _redis_answers(box), "Redis to answer", 20)
        yield server
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(10)


@pytest.fixture
def node_unit(booted: Container) -> Iterator[Container]:
    """hamsterbunker@boot initialised on the Redis URL (hb init does not connect); stopped after."""
    for binary in ("redis-server", "redis-cli"):
        if not any((Path(d) / binary).exists() for d in os.environ["PATH"].split(os.pathsep)):
            pytest.skip(f"needs {binary} on the host (apt-get install redis-server)")
    booted.install_project(REPO)
    has_redis = booted.run("/opt/hamsterbunker/bin/python", "-c", "import redis", check=False)
    if has_redis.returncode != 0:
        pytest.skip("the node's install has no Redis client (install-systemd without extras)")
    booted.run(
        "hb", "init", INSTANCE, "--store", STORE, "--node-id", "node-boot", "--region", "eu-west"
    )
    yield booted
    booted.run("systemctl", "stop", unit(INSTANCE), check=False, timeout=90)
    booted.run("systemctl", "reset-failed", unit(INSTANCE), check=False, timeout=30)


@pytest.mark.timeout(600)  # the install, then a minute of waiting on purpose
def test_a_unit_started_a_minute_before_its_store_joins_without_anyone_touching_it(
    node_unit: Container,
) -> None:
    """Started with no Redis on its port, the unit stays activating with a STATUS= naming the
    store for a minute; Redis starts; the unit becomes active (Type=notify: READY=1 came) and
    the node leads, with no restart, no start-limit-hit, no failure."""
    box = node_unit
    assert not _redis_answers(box)
    started = time.monotonic()
    box.run("systemctl", "start", "--no-block", unit(INSTANCE))

    def waiting() -> dict[str, str] | None:
        props = show(box, INSTANCE)
        ok = props["ActiveState"] == "activating" and props["StatusText"].startswith(
            f"starting · waiting for the store {STORE}: "
        )
        return props if ok else None

    props = box.wait_until(waiting, f"the unit to wait for its store: {show(box, INSTANCE)}", 60)
    assert "(try " in props["StatusText"], props
    # The whole minute the store is down, the unit waits: no failure, no restart, no timeout.
    while time.monotonic() - started < STORE_DOWN_S:
        props = show(box, INSTANCE)
        assert props["ActiveState"] == "activating", (props, journal(box, INSTANCE)[-3000:])
        assert props["NRestarts"] == "0", props
        time.sleep(1)
    with _redis_in(box):

        def joined() -> dict[str, str] | None:
            props = show(box, INSTANCE)
            ok = props["ActiveState"] == "active" and props["SubState"] == "running"
            return props if ok and props["StatusText"].startswith("active · epoch ") else None

        # The backoff is capped at 10 s: the node sees the store within a cap, then leads.
        props = box.wait_until(joined, f"the node to join: {show(box, INSTANCE)}", 60)
        assert props["NRestarts"] == "0" and props["Result"] == "success", props
        active = box.run("systemctl", "is-active", unit(INSTANCE), check=False)
        assert active.stdout.strip() == "active", active
        log = journal(box, INSTANCE)
        assert "start-limit-hit" not in log and "Start request repeated too quickly" not in log
        assert "store.error waiting for the store" in log and "Traceback" not in log, log[-3000:]
        assert "node.online" in log, log[-3000:]
        # systemd's own lines about the unit are in that journal too: it never failed.
        assert "Failed with result" not in log and "timed out" not in log, log[-3000:]
        box.run("systemctl", "stop", unit(INSTANCE), timeout=90)
