"""Each event's syslog priority under journald, and ``hb run --log-level`` / ``log_level``.

Every test runs a real ``hb run`` whose stderr is a file named by ``$JOURNAL_STREAM``
(what systemd does for a journal stream), so every line starts ``<N>``: what
``journalctl -p warning`` would keep is what these tests read. A lost store
and the lease lost with it are at <3> and <4>; role changes at <6>; every step
at <7>, written only at ``--log-level debug``.
"""

from __future__ import annotations

import re
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from hamsterbunker import FileStore
from tests.support import wait_until
from tests.support.cli import AGENT, AGENT_ID, FAST, HB, SECRET, hb_env, run_hb

pytestmark = pytest.mark.multiprocess

EVENT_LINE = re.compile(r"^<([0-7])>hamsterbunker: n1 ([a-z_]+\.[a-z_]+) epoch=")
WAIT_S = 30


def stream_id(path: Path) -> str:
    st = path.stat()
    return f"{st.st_dev}:{st.st_ino}"


class Node:
    """One ``hb run`` process writing to the journal stream ``err``."""

    def __init__(self, process: subprocess.Popen[bytes], err: Path) -> None:
        self.process, self.err = process, err

    def lines(self) -> list[str]:
        return self.err.read_text().splitlines()

    def priorities(self) -> dict[str, set[int]]:
        """Event type -> the priorities its lines carried."""
        found: dict[str, set[int]] = {}
        for line in self.lines():
            match = EVENT_LINE.match(line)
            if match:
                found.setdefault(match[2], set()).add(int(match[1]))
        return found

    def wait_for(self, line_start: str, count: int = 1) -> None:
        def seen() -> bool:
            assert self.process.poll() is None, self.err.read_text()
            return sum(line.startswith(line_start) for line in self.lines()) >= count

        wait_until(seen, f"{line_start!r} x{count} in:\n{self.err.read_text()}", WAIT_S)

    def stop(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        assert self.process.wait(timeout=WAIT_S) == 0, self.err.read_text()


@contextmanager
def hb_run(tmp_path: Path, *args: str, **env: str) -> Iterator[Node]:
    err = tmp_path / "stderr.txt"
    err.touch()
    environment = hb_env(HB_SECRET=SECRET, JOURNAL_STREAM=stream_id(err), **env)
    with err.open("ab") as stderr:
        process = subprocess.Popen(
            [*HB, "run", "--create-store", *args],
            env=environment,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )
    try:
        yield Node(process, err)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=WAIT_S)


def node_args(store: Path, *extra: str) -> list[str]:
    return ["--store", store.as_uri(), "--agent", AGENT, "--node-id", "n1", *FAST, *extra]


def published(store: Path) -> int:
    lease = FileStore(store).read_lease(AGENT_ID)
    return 0 if lease is None else lease.seq


def test_store_loss_is_an_error_the_lease_lost_a_warning_and_steps_silent(tmp_path):
    """The store vanishes under a leading node and comes back: store.error at <3>,
    lease.renew_failed and lease.lost at <4>, role changes at <6>, and at the default
    level no line for the steps published before and after."""
    store = tmp_path / "store"
    with hb_run(tmp_path, *node_args(store)) as node:
        node.wait_for("<6>hamsterbunker: n1 lease.acquired")
        wait_until(lambda: published(store) >= 2, "two steps published", WAIT_S)
        store.rename(tmp_path / "away")
        node.wait_for("<4>hamsterbunker: n1 lease.lost")
        (tmp_path / "away").rename(store)
        node.wait_for("<6>hamsterbunker: n1 lease.acquired", count=2)
        seq = published(store)
        wait_until(lambda: published(store) >= seq + 2, "two more steps", WAIT_S)
        node.stop()
        priorities = node.priorities()
        lines = node.lines()
    assert priorities["store.error"] == {3}, lines
    assert priorities["lease.renew_failed"] == {4}, lines
    assert priorities["lease.lost"] == {4}, lines
    for kind in ("node.online", "lease.acquired", "node.standby", "node.offline"):
        assert priorities[kind] == {6}, (kind, lines)
    assert not {"agent.step", "checkpoint.published"} & set(priorities), lines
    assert not [line for line in lines if line.startswith("<7>")], lines


def test_log_level_debug_writes_every_step_at_debug_priority(tmp_path):
    """--log-level debug adds agent.step and checkpoint.published lines, at <7>."""
    with hb_run(tmp_path, *node_args(tmp_path / "store", "--log-level", "debug")) as node:
        node.wait_for("<7>hamsterbunker: n1 agent.step", count=2)
        node.wait_for("<7>hamsterbunker: n1 checkpoint.published", count=2)
        node.stop()
        priorities = node.priorities()
    assert priorities["agent.step"] == priorities["checkpoint.published"] == {7}
    assert priorities["lease.acquired"] == {6}


def write_instance(directory: Path, store: Path, level: str) -> None:
    directory.mkdir()
    (directory / "n1.toml").write_text(
        f'store = "{store.as_uri()}"\nagent = "{AGENT}"\nnode_id = "n1"\n'
        f"tick_ms = 100\nlease_ttl_ms = 600\nlog_level = {level}\n"
    )


def test_config_log_level_and_the_flag_over_it(tmp_path):
    """log_level = "debug" in the config gives <7> step lines; --log-level warning given
    with --instance overrides it: neither info nor debug lines while the node steps."""
    store, config = tmp_path / "store", tmp_path / "etc"
    write_instance(config, store, '"debug"')
    with hb_run(tmp_path, "--instance", "n1", CONFIGURATION_DIRECTORY=str(config)) as node:
        node.wait_for("<7>hamsterbunker: n1 agent.step", count=2)
        node.stop()
    (tmp_path / "stderr.txt").unlink()
    args = ("--instance", "n1", "--log-level", "warning")
    with hb_run(tmp_path, *args, CONFIGURATION_DIRECTORY=str(config)) as node:
        seq = published(store)
        wait_until(lambda: published(store) >= seq + 2, "two more steps", WAIT_S)
        node.stop()
        lines = node.lines()
    assert not [line for line in lines if line.startswith(("<6>", "<7>"))], lines


@pytest.mark.parametrize(
    ("args", "level", "expected"),
    [
        (["--log-level", "loud"], None, ["--log-level", "'loud'", "'warning'"]),
        ([], '"loud"', ["n1.toml", "log level 'loud'", "debug, info, warning, error"]),
        ([], "7", ["n1.toml", "'log_level'", "a string"]),
    ],
    ids=["flag", "config-word", "config-number"],
)
def test_a_bad_log_level_is_one_line_and_exit_2(tmp_path, args, level, expected):
    """A log level hb does not know, as a flag or in the config, is one line naming it, exit 2."""
    store, config = tmp_path / "store", tmp_path / "etc"
    write_instance(config, store, level or '"info"')
    env = hb_env(HB_SECRET=SECRET, CONFIGURATION_DIRECTORY=str(config))
    result = run_hb(["run", "--instance", "n1", *args], env=env)
    assert result.returncode == 2, result
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and all(word in lines[0] for word in expected), lines
    assert not store.exists()
