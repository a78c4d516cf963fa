"""``hb submit``, run as a real subprocess against a ``file://`` store.

Covers: the admission line and a retry's "already admitted" (exit 0), --json,
the three payload sources (--data, --data-file, - for stdin), user mistakes (one
line on stderr, exit 2, no traceback, nothing admitted), a wrong secret, a full
inbox (exit 1), --wait answered by a running node (one started after the
submitter began waiting, too), and --wait --timeout with no node (exit 124).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from hamsterbunker import FileStore
from hamsterbunker.cli.submit import EXIT_TIMEOUT
from hamsterbunker.core.errors import InboxFull
from hamsterbunker.ops.client import Client
from hamsterbunker.records import LeaseRecord
from hamsterbunker.sealing import Sealer
from hamsterbunker.stores.base import Consumed, Fence
from tests.support import SUPPORT_DIR, wait_until
from tests.support.cli import HB, SECRET, hb_env

AGENT_ID = "inbox-echo"  # hb_test_agents.InboxEcho.id
ECHO = "hb_test_agents:InboxEcho"
UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def hb(
    args: list[str],
    *,
    secret: str | None = SECRET,
    stdin: str | bytes | None = None,
    timeout: float = 30,
) -> subprocess.CompletedProcess[str]:
    """``hb ARGS`` with HB_SECRET (unless None) and, if given, stdin."""
    env = hb_env() if secret is None else hb_env(HB_SECRET=secret)
    data = stdin.encode() if isinstance(stdin, str) else stdin
    result = subprocess.run(
        [*HB, *args],
        env=env,
        input=data,
        stdin=None if data is not None else subprocess.DEVNULL,
        capture_output=True,
        timeout=timeout,
    )
    return subprocess.CompletedProcess(
        result.args, result.returncode, result.stdout.decode(), result.stderr.decode()
    )


@pytest.fixture
def store(tmp_path: Path) -> Path:
    """An existing, empty store directory (hb submit makes no store)."""
    root = tmp_path / "store"
    root.mkdir()
    return root


def submit_args(store: Path, *more: str) -> list[str]:
    """hb submit's arguments; --new-agent: the tests' stores hold no agent until it admits."""
    return ["submit", "--store", store.as_uri(), "--agent-id", AGENT_ID, "--new-agent", *more]


def admitted(store: Path) -> list[tuple[int, str, Any]]:
    """(number, request id, payload) of every submission in the store's inbox."""
    fs = FileStore(store, create=False)
    cluster = fs.read_cluster()
    if cluster is None:
        return []
    sealer = Sealer(SECRET, cluster)
    opened = [sealer.open_submission(blob, AGENT_ID, n) for n, blob in fs.read_inbox(AGENT_ID)]
    return [(s.number, s.request_id, s.payload) for s in opened]


def one_error_line(result: subprocess.CompletedProcess[str], code: int) -> str:
    assert result.returncode == code, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


# -- admission ---------------------------------------------------------------------


def test_an_agent_the_store_does_not_hold_is_refused_without_new_agent(store: Path) -> None:
    """A mistyped agent id must not make a new agent: without --new-agent, hb submit to an
    agent the store holds no records of is one line naming the agents it holds, exit 2,
    nothing admitted; the same with --new-agent is admitted (its first node not run yet)."""
    first = hb(submit_args(store, "--request-id", "q-1", "--data", "1"))
    assert first.returncode == 0, first.stderr
    typo = ["submit", "--store", store.as_uri(), "--agent-id", "inbox-ecko", "--data", "2"]
    line = one_error_line(hb(typo), 2)
    assert line == (
        f"hb submit: error: store {store.as_uri()} holds no records of agent 'inbox-ecko'; "
        f"it holds: {AGENT_ID}"
    )
    assert "inbox-ecko" not in FileStore(store, create=False).list_agents()
    assert hb([*typo, "--new-agent"]).returncode == 0
    assert "inbox-ecko" in FileStore(store, create=False).list_agents()


def test_submit_prints_its_number_and_a_retry_says_already_admitted(store: Path) -> None:
    """The first submit of q-1 is #1, a retry of q-1 (another payload even) admits nothing and
    exits 0 saying so, the next request id is #2."""
    first = hb(submit_args(store, "--request-id", "q-1", "--data", '{"question": "why?"}'))
    assert first.returncode == 0, first.stderr
    assert first.stdout == "admitted as #1 (request id q-1)\n"
    assert first.stderr == ""

    again = hb(submit_args(store, "--request-id", "q-1", "--data", '"something else"'))
    assert again.returncode == 0, again.stderr
    assert again.stdout == "already admitted as #1 (request id q-1)\n"

    other = hb(submit_args(store, "--request-id", "q-2", "--data", "[1, 2]"))
    assert other.stdout == "admitted as #2 (request id q-2)\n"
    assert admitted(store) == [(1, "q-1", {"question": "why?"}), (2, "q-2", [1, 2])]


def test_submit_json_prints_one_object(store: Path) -> None:
    """--json: {"number", "request_id", "duplicate"}; without --request-id, a new UUID."""
    result = hb(submit_args(store, "--json", "--data", "42"))
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc.keys() == {"number", "request_id", "duplicate"}
    assert doc["number"] == 1 and doc["duplicate"] is False
    assert UUID.fullmatch(doc["request_id"]), doc

    again = hb(submit_args(store, "--json", "--request-id", doc["request_id"], "--data", "42"))
    assert json.loads(again.stdout) == {**doc, "duplicate": True}
    assert admitted(store) == [(1, doc["request_id"], 42)]


def test_submit_reads_the_payload_from_a_file_or_from_stdin(store: Path, tmp_path: Path) -> None:
    payload = {"text": "grüß dich ☃", "n": [1, 2.5, None, True]}
    data_file = tmp_path / "payload.json"
    data_file.write_text(json.dumps(payload, ensure_ascii=False, indent=2), encoding="utf-8")
    from_file = hb(submit_args(store, "--request-id", "f-1", "--data-file", str(data_file)))
    assert from_file.returncode == 0, from_file.stderr
    assert from_file.stdout == "admitted as #1 (request id f-1)\n"

    from_stdin = hb(submit_args(store, "--request-id", "s-1", "-"), stdin=json.dumps(payload))
    assert from_stdin.returncode == 0, from_stdin.stderr
    assert from_stdin.stdout == "admitted as #2 (request id s-1)\n"
    assert admitted(store) == [(1, "f-1", payload), (2, "s-1", payload)]


# -- mistakes --------------------------------------------------------------------------


MISTAKES = {
    "bad-json-data": (["--data", '{"a": 1'], None, ["--data is not JSON"]),
    "nan-data": (["--data", "NaN"], None, ["--data is not JSON", "NaN"]),
    "bad-json-file": (["--data-file", "{file}"], None, ["--data-file", "is not JSON"]),
    "bad-json-stdin": (["-"], "{not json", ["stdin is not JSON"]),
    "empty-stdin": (["-"], "", ["stdin is not JSON"]),
    "no-data-file": (["--data-file", "{missing}"], None, ["cannot be read", "missing.json"]),
    "data-and-file": (["--data", "1", "--data-file", "{file}"], None, ["--data and --data-file"]),
    "data-and-stdin": (["--data", "1", "-"], "2", ["--data and -"]),
    "no-payload": ([], None, ["no payload given"]),
    "stray-argument": (["--data", "1", "extra"], None, ["'extra'"]),
    "bad-request-id": (["--data", "1", "--request-id", "no spaces"], None, ["request id"]),
    "timeout-without-wait": (["--data", "1", "--timeout", "5"], None, ["--timeout needs --wait"]),
    "zero-timeout": (["--data", "1", "--wait", "--timeout", "0"], None, ["--timeout"]),
    "bad-agent-id": (["--data", "1", "--agent-id", "a/b"], None, ["agent id"]),
}


@pytest.mark.parametrize(("argv", "stdin", "words"), MISTAKES.values(), ids=MISTAKES.keys())
def test_a_mistake_gives_one_line_exit_2_and_admits_nothing(
    store: Path, tmp_path: Path, argv: list[str], stdin: str | None, words: list[str]
) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"unterminated": ', encoding="utf-8")
    names = {"{file}": str(bad), "{missing}": str(tmp_path / "missing.json")}
    argv = [names.get(arg, arg) for arg in argv]
    line = one_error_line(hb(submit_args(store, *argv), stdin=stdin), 2)
    assert line.startswith("hb submit: error: "), line
    for word in words:
        assert word in line, line
    assert admitted(store) == []


def test_no_secret_and_a_wrong_secret_are_refused_and_admit_nothing(store: Path) -> None:
    """Without a secret, or with another than the cluster's: exit 2 naming the secret."""
    assert hb(submit_args(store, "--data", "1", "--request-id", "ok")).returncode == 0
    line = one_error_line(hb(submit_args(store, "--data", "2"), secret=None), 2)
    assert "no secret given" in line, line
    line = one_error_line(hb(submit_args(store, "--data", "2"), secret="another-secret-x"), 2)
    assert "secret does not match" in line, line
    # hb submit is no node: the line speaks of the secret given, not of "this node".
    assert "the secret given here is key id" in line and "this node" not in line, line
    assert admitted(store) == [(1, "ok", 1)]


def test_submit_to_a_store_that_does_not_exist_makes_none(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-store"
    line = one_error_line(hb(submit_args(missing, "--data", "1")), 2)
    assert "does not exist" in line, line
    assert not missing.exists()


def test_a_full_inbox_refuses_with_the_limit_and_admits_nothing(
    store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Filled to its byte limit (32 MiB) with big payloads, the inbox refuses one more: exit 1
    naming the limit, and the inbox holds what it held."""
    big = "x" * 240_000
    monkeypatch.setattr(os, "fsync", lambda fd: None)  # filling fast: durability is not tested
    with Client(store.as_uri(), SECRET) as client, pytest.raises(InboxFull):
        for _ in range(1000):
            client.submit(AGENT_ID, big)
    monkeypatch.undo()
    before = len(FileStore(store, create=False).read_inbox(AGENT_ID))
    data_file = tmp_path / "big.json"
    data_file.write_text(json.dumps(big), encoding="utf-8")
    result = hb(submit_args(store, "--data-file", str(data_file)))
    line = one_error_line(result, 1)
    assert line.startswith("hb submit: failed: inbox is full"), line
    assert "32 MiB" in line, line
    assert result.stdout == ""
    assert len(FileStore(store, create=False).read_inbox(AGENT_ID)) == before


# -- --wait ----------------------------------------------------------------------------


@contextmanager
def echo_node(store: Path, log_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """One ``hb run`` node of InboxEcho; stopped (SIGTERM, then SIGKILL) on the way out."""
    command = [
        *HB, "run", "--create-store", "--store", store.as_uri(), "--agent", ECHO, "--node-id", "n1",
        "--region", "test", "--tick-ms", "100", "--lease-ttl-ms", "600",
        "--log-level", "debug",  # inbox.consumed is a debug line
    ]  # fmt: skip
    env = hb_env(HB_SECRET=SECRET, PYTHONPATH=str(SUPPORT_DIR), HB_TEST_INBOX_WAIT_S="0.5")
    with log_path.open("ab") as log:
        node = subprocess.Popen(
            command, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
        )
    try:
        yield node
    finally:
        if node.poll() is None:
            node.send_signal(signal.SIGTERM)
            try:
                node.wait(timeout=15)
            except subprocess.TimeoutExpired:
                node.kill()
                node.wait(timeout=10)


@pytest.mark.multiprocess
def test_wait_prints_the_reply_of_a_running_node(store: Path, tmp_path: Path) -> None:
    """A submitter that waits before any node is up gets its reply once a node starts and
    answers; a second one, and a --json retry of the first, get theirs at once."""
    log = tmp_path / "node.log"
    waiting = subprocess.Popen(
        [*HB, *submit_args(store, "--wait", "--timeout", "60", "--request-id", "q-1",
                           "--data", '{"question": "why?"}')],
        env=hb_env(HB_SECRET=SECRET), stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        wait_until(lambda: admitted(store), "q-1 to be admitted with no node up", 20)
        assert waiting.poll() is None, waiting.communicate()
        with echo_node(store, log) as node:
            out, err = waiting.communicate(timeout=60)
            assert waiting.returncode == 0, (out, err, log.read_text())
            assert out.splitlines() == [
                "admitted as #1 (request id q-1)",
                json.dumps({"echo": {"question": "why?"}, "node": "n1"}),
            ]
            assert err == ""

            second = hb(submit_args(store, "--wait", "--timeout", "60", "--data", '"two"'))
            assert second.returncode == 0, (second.stderr, log.read_text())
            line, reply = second.stdout.splitlines()
            assert re.fullmatch(rf"admitted as #2 \(request id {UUID.pattern}\)", line), line
            assert json.loads(reply) == {"echo": "two", "node": "n1"}

            retry = hb(submit_args(store, "--wait", "--json", "--request-id", "q-1",
                                   "--data", '"ignored"'))  # fmt: skip
            assert retry.returncode == 0, retry.stderr
            assert json.loads(retry.stdout) == {
                "number": 1,
                "request_id": "q-1",
                "duplicate": True,
                "reply": {"echo": {"question": "why?"}, "node": "n1"},
            }
            assert node.poll() is None, log.read_text()
    finally:
        if waiting.poll() is None:
            waiting.kill()
            waiting.communicate()
    assert "inbox.consumed" in log.read_text()


def test_wait_with_no_node_times_out_with_exit_124(store: Path) -> None:
    """No node answers: after --timeout the submitter says so and exits 124; the submission
    stays admitted, and waiting again (same request id) times out the same way."""
    started = time.monotonic()
    result = hb(submit_args(store, "--wait", "--timeout", "1", "--request-id", "q-9",
                            "--data", "1"))  # fmt: skip
    took = time.monotonic() - started
    line = one_error_line(result, EXIT_TIMEOUT)
    assert EXIT_TIMEOUT == 124
    assert line.startswith("hb submit: timed out: no reply to request q-9 (#1) within 1 s"), line
    assert "--request-id q-9" in line, line
    assert result.stdout == "admitted as #1 (request id q-9)\n"
    assert 1 <= took < 20

    as_json = hb(submit_args(store, "--wait", "--timeout", "0.5", "--json", "--request-id",
                             "q-9", "--data", "1"))  # fmt: skip
    one_error_line(as_json, EXIT_TIMEOUT)
    assert json.loads(as_json.stdout) == {"number": 1, "request_id": "q-9", "duplicate": True}
    assert admitted(store) == [(1, "q-9", 1)]


def plant_consumed(store: Path, request_ids: dict[str, int]) -> None:
    """Mark each request id consumed as its number, with no reply, as anyone who can write the
    store can: a checkpoint write under a lease of their own."""
    fs = FileStore(store, create=False)
    intruder = LeaseRecord(holder="intruder", region="x", session="s", epoch=1, ttl_ms=2000)
    record = fs.cas_lease(AGENT_ID, None, intruder)
    fence = Fence(record.holder or "", record.session, record.epoch)
    consumed = [Consumed(number, rid, None) for rid, number in request_ids.items()]
    fs.put_checkpoint(AGENT_ID, fence, 1, b"junk", consumed)
    fs.close()


def test_a_planted_consumed_mark_is_neither_a_reply_nor_an_admission(store: Path) -> None:
    """hb submit --wait of a request id marked consumed without a sealed reply, one submitted
    (the mark took its pending entry) or one nobody submitted, exits 1 saying it is not
    admitted: never "already admitted", never a reply of null."""
    for number, request_id in ((1, "q-1"), (2, "q-2")):
        done = hb(submit_args(store, "--request-id", request_id, "--data", "1"))
        assert done.stdout == f"admitted as #{number} (request id {request_id})\n", done.stderr
    plant_consumed(store, {"q-1": 1, "ghost": 2})
    for request_id in ("q-1", "ghost"):
        waited = hb(submit_args(store, "--wait", "--timeout", "1", "--request-id", request_id,
                                "--data", "1"))  # fmt: skip
        line = one_error_line(waited, 1)
        assert "not admitted" in line and "no sealed submission or reply" in line, line
        assert waited.stdout == ""


def test_help_documents_the_exit_codes() -> None:
    result = hb(["submit", "--help"], secret=None)
    assert result.returncode == 0, result.stderr
    for text in ("--data-file", "--wait", "--timeout", "124", "already admitted", "HB_SECRET"):
        assert text in result.stdout, text
