"""The demo's journaled effect and its report: reuse after a takeover, and the twice-ran check.

``hb demo`` kills at a random moment, so whether the new leader reuses a
recorded effect is luck there. Here the moment is arranged: a failpoint stops
the first node right after the outcome of step 3's effect is recorded, before
the step is published; it is then SIGKILLed and a second node takes over and
must reuse that outcome without calling the pretend tool again.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Callable
from pathlib import Path

import pytest

from hamsterbunker.core.timing import LeaseTiming
from hamsterbunker.demo import (
    CALL_LOG_ENV,
    DemoFailed,
    _CallLog,
    _report_effects,
    _Watcher,
)
from hamsterbunker.ops.local import LocalCluster, NodeSpec
from hamsterbunker.records import Event
from tests.support import process_state, store_of
from tests.support.cli import wait_for

AGENT = "hamsterbunker.demo:CounterAgent"
FAST = LeaseTiming(tick_ms=100, lease_ttl_ms=600)


def _log(path: Path, *calls: tuple[str, int]) -> _CallLog:
    path.write_text(
        "".join(json.dumps({"key": k, "seq": s, "index": 0, "pid": 1}) + "\n" for k, s in calls)
    )
    return _CallLog(path)


def test_call_log_allows_only_an_unfinished_effect_to_run_again(tmp_path: Path) -> None:
    """A key logged twice passes only if it was started but not recorded before a kill."""
    calls = _log(tmp_path / "calls.jsonl", ("k1", 1), ("k2", 2), ("k2", 2), ("k3", 3))
    calls.may_repeat = {"k2"}
    assert calls.check(recorded=set(), unfinished={"k2"}) == 1
    assert calls.check(recorded={"k3"}, unfinished=set()) == 0


def test_call_log_fails_loudly_when_a_recorded_effect_ran_twice(tmp_path: Path) -> None:
    calls = _log(tmp_path / "calls.jsonl", ("k1", 1), ("k2", 2), ("k2", 2))
    with pytest.raises(
        DemoFailed,
        match=r"RAN TWICE .* step 2 \(key k2\) was executed 2 times, though its outcome had been recorded",
    ):
        calls.check(recorded={"k2"}, unfinished=set())
    calls.may_repeat = {"k1"}  # another key may repeat: k2 still may not
    with pytest.raises(DemoFailed, match="RAN TWICE"):
        calls.check(recorded=set(), unfinished=set())


@pytest.mark.multiprocess
def test_a_new_leader_reuses_the_recorded_effect_and_the_demo_reports_it(
    tmp_path: Path, local_cluster: Callable[..., LocalCluster]
) -> None:
    calls = _CallLog(tmp_path / "tool-calls.jsonl")
    cluster = local_cluster(agent=AGENT, timing=FAST, env={CALL_LOG_ENV: str(calls.path)})
    store = store_of(cluster)
    first = cluster.start(
        NodeSpec("hbnk-1", "eu"), extra_env={"HB_FAILPOINTS": "effect.after_record=stop@3"}
    )
    wait_for(
        "hbnk-1 to stop after step 3's effect", lambda: process_state(first.pid) == "T" or None, 30
    )

    watcher = _Watcher(store, cluster.secret, "counter")
    last = watcher.latest()
    assert last is not None and last[:2] == (2, 1), last  # step 3 is in flight, unpublished
    recorded = watcher.recorded(3)
    assert len(recorded) == 1 and calls.keys_of(3) == recorded
    watcher.new_events()
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=10)

    cluster.start(NodeSpec("hbnk-2", "us"))

    def resumed() -> Event | None:
        watcher.new_events()
        return next(
            (e for e in watcher.seen if e.type == "agent.resumed" and e.node == "hbnk-2"), None
        )

    event = wait_for("hbnk-2 to resume", resumed, 30)
    assert (event.epoch, event.detail["from_seq"]) == (2, 2)
    wait_for("step 4 to be published", lambda: (watcher.latest() or (0,))[0] >= 4 or None, 30)
    lines: list[str] = []
    _report_effects(watcher, calls, event, 3, (recorded, set()), lines.append)
    assert lines == [
        "  ↳ effects: 1 reused from the journal · 0 unfinished re-run · no completed effect ran twice"
    ]
    # Step 3's tool call ran once, on hbnk-1; the count it answered was used.
    assert [c["pid"] for c in calls.calls() if c["seq"] == 3] == [first.pid]
    latest = watcher.latest()
    assert latest is not None and latest[2] == latest[0]  # the count is the step number still

    # Had it run again, the demo would have said so and failed.
    with calls.path.open("a") as log:
        log.write(json.dumps({"key": next(iter(recorded)), "seq": 3, "index": 0, "pid": 0}) + "\n")
    with pytest.raises(DemoFailed, match="RAN TWICE"):
        _report_effects(watcher, calls, event, 3, (recorded, set()), lines.append)
