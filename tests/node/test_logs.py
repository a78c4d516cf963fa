"""Log lines on stderr: journald priority prefixes when $JOURNAL_STREAM names stderr.

Each test runs a real process with stderr redirected to a file and sets
$JOURNAL_STREAM to that file's ``dev:ino`` (what systemd does for a journal
stream), to another file's, or not at all.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

HB = [str(Path(sys.executable).with_name("hb"))]
AGENT = "hamsterbunker.demo:CounterAgent"
SECRET = "correct-horse-battery"

TIMESTAMP = re.compile(r"\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}")
PREFIX = re.compile(r"^<[0-7]>")

# Logs at every level, a two-line message and an exception with its traceback.
SCRIPT = textwrap.dedent(
    """
    import logging
    from hamsterbunker.core.logs import configure_logging

    configure_logging()
    log = logging.getLogger("hamsterbunker.test")
    log.debug("debug line")
    log.info("info line")
    log.warning("warning line")
    log.error("error line")
    log.critical("critical line")
    log.warning("first half\\nsecond half")
    try:
        raise ValueError("boom")
    except ValueError:
        log.exception("failed with a traceback")
    """
)


def clean_env(**overrides: str) -> dict[str, str]:
    env = dict(os.environ)
    for name in ("HB_SECRET", "CREDENTIALS_DIRECTORY", "NOTIFY_SOCKET", "JOURNAL_STREAM"):
        env.pop(name, None)
    env.update(overrides)
    return env


def stream_id(path: Path) -> str:
    st = path.stat()
    return f"{st.st_dev}:{st.st_ino}"


def run_script(tmp_path: Path, journal: str | None) -> list[str]:
    """Run SCRIPT with stderr to a file; journal: 'self', 'other' or None (JOURNAL_STREAM unset)."""
    err = tmp_path / "stderr.txt"
    err.touch()
    other = tmp_path / "other.txt"
    other.touch()
    env = clean_env()
    if journal == "self":
        env["JOURNAL_STREAM"] = stream_id(err)
    elif journal == "other":
        env["JOURNAL_STREAM"] = stream_id(other)
    with open(err, "wb") as stderr:
        result = subprocess.run(
            [sys.executable, "-c", SCRIPT],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            timeout=30,
        )
    text = err.read_text()
    assert result.returncode == 0, text
    return text.splitlines()


def test_journal_lines_carry_priority_and_no_timestamp(tmp_path):
    """Under journald, info/warning/error/critical lines start <6>/<4>/<3>/<2> and have no timestamp."""
    lines = run_script(tmp_path, "self")
    assert "<6>hamsterbunker.test: info line" in lines
    assert "<4>hamsterbunker.test: warning line" in lines
    assert "<3>hamsterbunker.test: error line" in lines
    assert "<2>hamsterbunker.test: critical line" in lines
    assert not any("debug line" in line for line in lines)
    for line in lines:
        assert PREFIX.match(line), f"line without a priority prefix: {line!r}"
        assert not TIMESTAMP.search(line), f"journald stamps lines itself: {line!r}"


def test_journal_traceback_lines_all_prefixed(tmp_path):
    """Under journald, every line of a multi-line message and of a traceback carries the prefix."""
    lines = run_script(tmp_path, "self")
    assert "<4>hamsterbunker.test: first half" in lines
    assert "<4>second half" in lines
    start = lines.index("<3>hamsterbunker.test: failed with a traceback")
    trace = lines[start + 1 :]
    assert trace[0] == "<3>Traceback (most recent call last):", trace
    assert trace[-1] == "<3>ValueError: boom", trace
    assert len(trace) >= 3
    assert all(line.startswith("<3>") for line in trace), trace


@pytest.mark.parametrize("journal", ["other", None], ids=["other-stream", "unset"])
def test_plain_lines_have_timestamp_and_no_prefix(tmp_path, journal):
    """When $JOURNAL_STREAM names another file or is unset, lines carry a timestamp and no <N>."""
    lines = run_script(tmp_path, journal)
    heads = [line for line in lines if TIMESTAMP.match(line)]
    assert any(
        re.match(rf"{TIMESTAMP.pattern},\d+ INFO hamsterbunker.test: info line$", h) for h in heads
    )
    assert any(h.endswith("WARNING hamsterbunker.test: warning line") for h in heads), heads
    assert any(h.endswith("ERROR hamsterbunker.test: error line") for h in heads), heads
    assert any(h.endswith("ERROR hamsterbunker.test: failed with a traceback") for h in heads)
    assert "Traceback (most recent call last):" in lines
    for line in lines:
        assert not PREFIX.match(line), f"a priority prefix outside journald: {line!r}"


def _run_node(tmp_path: Path, journal: bool) -> list[str]:
    """A real ``hb run`` node until it is online and leading, then SIGTERM; its stderr lines."""
    err = tmp_path / "node-stderr.txt"
    err.touch()
    env = clean_env(HB_SECRET=SECRET)
    if journal:
        env["JOURNAL_STREAM"] = stream_id(err)
    command = [
        *HB, "run", "--create-store", "--store", (tmp_path / "store").as_uri(), "--agent", AGENT,
        "--node-id", "n1", "--region", "test", "--tick-ms", "100", "--lease-ttl-ms", "600",
    ]  # fmt: skip
    with open(err, "wb") as stderr:
        node = subprocess.Popen(
            command, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr
        )
    try:
        deadline = time.monotonic() + 30
        while "lease.acquired" not in err.read_text():
            assert node.poll() is None, err.read_text()
            assert time.monotonic() < deadline, (
                f"node logged no lease.acquired in 30 s:\n{err.read_text()}"
            )
            time.sleep(0.05)
        node.send_signal(signal.SIGTERM)
        assert node.wait(timeout=20) == 0, err.read_text()
    finally:
        if node.poll() is None:
            node.kill()
            node.wait(timeout=10)
    lines = err.read_text().splitlines()
    assert len(lines) >= 3, lines
    return lines


@pytest.mark.multiprocess
def test_hb_run_under_journald_prefixes_every_line(tmp_path):
    """A real ``hb run`` node whose stderr is the journal stream prefixes every line, no timestamps."""
    lines = _run_node(tmp_path, journal=True)
    assert any(line.startswith("<6>hamsterbunker: n1 node.online") for line in lines), lines
    for line in lines:
        assert PREFIX.match(line), f"line without a priority prefix: {line!r}"
        assert not TIMESTAMP.search(line), line


@pytest.mark.multiprocess
def test_hb_run_outside_journald_stamps_lines(tmp_path):
    """A real ``hb run`` node outside journald writes timestamped lines without <N>."""
    lines = _run_node(tmp_path, journal=False)
    assert any(" INFO hamsterbunker: n1 node.online" in line for line in lines), lines
    for line in lines:
        assert TIMESTAMP.match(line), f"line without a timestamp: {line!r}"
        assert not PREFIX.match(line), line


def test_hb_error_line_under_journald_has_error_priority(tmp_path):
    """Under journald, the one-line error of a refused ``hb run`` carries priority <3>."""
    err = tmp_path / "stderr.txt"
    err.touch()
    env = clean_env(HB_SECRET=SECRET, JOURNAL_STREAM=stream_id(err))
    with open(err, "wb") as stderr:
        result = subprocess.run(
            [*HB, "run", "--store", "ftp://x", "--agent", AGENT],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            timeout=30,
        )
    lines = err.read_text().splitlines()
    assert result.returncode == 2, lines
    assert len(lines) == 1 and "ftp://x" in lines[0], lines
    assert lines[0].startswith("<3>"), lines


DEBUG_SCRIPT = textwrap.dedent(
    """
    import logging, sys
    from hamsterbunker.core.logs import configure_logging, log_level

    configure_logging(log_level(sys.argv[1]))
    for name in ("hamsterbunker.test", "otherlib"):
        for level in (logging.DEBUG, logging.INFO, logging.WARNING, logging.ERROR):
            logging.getLogger(name).log(level, "%s at %d", name, level)
    """
)


@pytest.mark.parametrize(
    ("level", "ours", "others"),
    [
        ("debug", [7, 6, 4, 3], [6, 4, 3]),  # other libraries' debug lines stay out
        ("info", [6, 4, 3], [6, 4, 3]),
        ("WARNING", [4, 3], [4, 3]),
        ("error", [3], [3]),
    ],
)
def test_configured_level_decides_which_priorities_are_written(tmp_path, level, ours, others):
    """configure_logging(level): hamsterbunker's lines from that level up, at their <N>."""
    err = tmp_path / "stderr.txt"
    err.touch()
    with open(err, "wb") as stderr:
        subprocess.run(
            [sys.executable, "-c", DEBUG_SCRIPT, level],
            env=clean_env(JOURNAL_STREAM=stream_id(err)),
            stdin=subprocess.DEVNULL,
            stderr=stderr,
            timeout=30,
            check=True,
        )
    lines = err.read_text().splitlines()
    assert [int(line[1]) for line in lines if "hamsterbunker.test at" in line] == ours, lines
    assert [int(line[1]) for line in lines if "otherlib at" in line] == others, lines


def test_an_event_type_not_in_the_table_is_info():
    """A new event type nobody gave a priority is still shown by default."""
    from hamsterbunker.node.priorities import EVENT_PRIORITIES, event_priority

    assert event_priority("something.new") == logging.INFO
    assert event_priority("store.regressed") == logging.CRITICAL
    assert all(kind.count(".") == 1 for kind in EVENT_PRIORITIES)


ROOT = Path(__file__).resolve().parents[2]
EMITTED = re.compile(r'emit\(\s*"([a-z_]+\.[a-z_]+)"')
LEVEL_OF_ROW = {"<2>": "CRITICAL", "<3>": "ERROR", "<4>": "WARNING", "<6>": "INFO", "<7>": "DEBUG"}


def test_every_emitted_event_type_has_its_priority_in_the_table_and_the_docs():
    """Each event type the runtime emits is in node.priorities, and systemd/README.md's
    priority table names each at the priority the table gives it."""
    from hamsterbunker.node.priorities import EVENT_PRIORITIES

    emitted = {
        kind
        for path in (ROOT / "hamsterbunker").rglob("*.py")
        for kind in EMITTED.findall(path.read_text(encoding="utf-8"))
    }
    assert len(emitted) > 20
    assert emitted <= set(EVENT_PRIORITIES), f"no priority for {emitted - set(EVENT_PRIORITIES)}"
    rows = {
        row.split("|")[1].strip(" `").split("`")[0]: row
        for row in (ROOT / "systemd" / "README.md").read_text(encoding="utf-8").splitlines()
        if row.startswith("| `<")
    }
    assert set(rows) == set(LEVEL_OF_ROW), rows
    for kind, level in EVENT_PRIORITIES.items():
        (row,) = [p for p, r in rows.items() if f"`{kind}`" in r.split("|")[2]]
        assert logging.getLevelName(level) == LEVEL_OF_ROW[row], (kind, row)
