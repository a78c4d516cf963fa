"""Agents for tests that run nodes as real processes (on PYTHONPATH via conftest).

Each writes an external journal line for every step it completes (before the
runtime publishes it), so lost and repeated steps are counted from outside.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from typing import Any

from hamsterbunker import current_step


def _journal(count: int) -> None:
    path = os.environ.get("HB_TEST_JOURNAL")
    context = current_step()
    if path and context is not None:
        line = {"node": context.node, "epoch": context.epoch, "seq": context.seq, "count": count}
        with open(path, "a") as journal:
            journal.write(json.dumps(line) + "\n")


def _began() -> None:
    """Say a step is in flight: touch HB_TEST_BEGUN, if set."""
    path = os.environ.get("HB_TEST_BEGUN")
    if path:
        open(path, "a").close()


class JournalCounter:
    """Async counter; each step sleeps HB_TEST_STEP_S seconds (default 0.1)."""

    id = "journal"

    def __init__(self) -> None:
        self.step_s = float(os.environ.get("HB_TEST_STEP_S", "0.1"))

    def init(self) -> dict[str, Any]:
        return {"count": 0}

    async def step(self, state: dict[str, Any]) -> dict[str, Any]:
        _began()
        await asyncio.sleep(self.step_s)
        count = state["count"] + 1
        _journal(count)
        return {"count": count}


class SlowSyncCounter(JournalCounter):
    """The same counter with a blocking step (runs in a thread), e.g. a long LLM call."""

    id = "slow"

    def step(self, state: dict[str, Any]) -> dict[str, Any]:  # type: ignore[override]
        time.sleep(self.step_s)
        count = state["count"] + 1
        _journal(count)
        return {"count": count}


# -- journaled effects against a loopback tool (tests/support/tool_server.py) -----


def _append_line(path: str, line: dict[str, Any]) -> None:
    """One JSON line, appended in one write (several nodes share the file)."""
    data = (json.dumps(line, separators=(",", ":")) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def _call_tool() -> dict[str, Any]:
    """An effect's function: one POST to HB_TOOL_URL naming current_effect().key.

    The tool answers {"key", "n", "order"}: this key's call number and the call's
    number over all keys, so a result tells which call produced it. "During the
    call" is after the tool has done its work, before the function returns.
    """
    import urllib.request

    from hamsterbunker import current_effect
    from hamsterbunker.core.failpoints import failpoint

    effect, step = current_effect(), current_step()
    assert effect is not None and step is not None, "called outside a journaled effect"
    body = {
        "key": effect.key,
        "name": effect.name,
        "seq": effect.seq,
        "index": effect.index,
        "replay": effect.replay,
        "node": step.node,
        "epoch": step.epoch,
        "delay_s": float(os.environ.get("HB_TEST_TOOL_DELAY_S", "0")),
    }
    request = urllib.request.Request(
        os.environ["HB_TOOL_URL"],
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=20) as answer:
        result: dict[str, Any] = json.loads(answer.read())
    failpoint("effect.during_call")
    return result


class EffectsAgent:
    """Async; each step runs the journaled effects of ``plan`` in order against the tool.

    It writes what each effect gave it to HB_TEST_EFFECTS (a result, or that the
    effect was interrupted), keeps the interrupted ones in its state, and what
    each effect gave it ("seq/name": the tool call's number, or "interrupted"),
    so the published state tells what the published run of each step saw; it
    writes an HB_TEST_JOURNAL line for each step it completes.
    """

    id = "effects"
    plan: tuple[tuple[str, str], ...] = (
        ("fetch", "safe"),
        ("charge", "interrupted"),
        ("notify", "safe"),
    )

    def init(self) -> dict[str, Any]:
        return {"count": 0, "interrupted": [], "seen": {}}

    def _saw(self, index: int, name: str, replay: str, saw: str, value: Any) -> None:
        context = current_step()
        path = os.environ.get("HB_TEST_EFFECTS")
        if path and context is not None:
            _append_line(path, {
                "node": context.node, "epoch": context.epoch, "seq": context.seq,
                "index": index, "name": name, "replay": replay, "saw": saw, "value": value,
            })  # fmt: skip

    def _interrupted(self, state: dict[str, Any], index: int, name: str, replay: str) -> None:
        context = current_step()
        assert context is not None
        self._saw(index, name, replay, "interrupted", None)
        state["interrupted"].append([context.seq, name])
        state["seen"][f"{context.seq}/{name}"] = "interrupted"

    def _result(
        self, state: dict[str, Any], index: int, name: str, replay: str, value: Any
    ) -> None:
        context = current_step()
        assert context is not None
        self._saw(index, name, replay, "result", value)
        state["seen"][f"{context.seq}/{name}"] = value["order"]

    def _done(self, state: dict[str, Any]) -> dict[str, Any]:
        state["count"] += 1
        _journal(state["count"])
        return state

    async def step(self, state: dict[str, Any]) -> dict[str, Any]:
        from hamsterbunker import EffectInterrupted

        context = current_step()
        assert context is not None
        for index, (name, replay) in enumerate(self.plan):
            try:
                value = await context.effect(name, _call_tool, replay=replay)
            except EffectInterrupted:
                self._interrupted(state, index, name, replay)
                continue
            self._result(state, index, name, replay, value)
        return self._done(state)


class SyncEffectsAgent(EffectsAgent):
    """The same with a blocking step (in a thread) and effect_sync, and four effects a step."""

    id = "effects-sync"
    plan = (
        ("lookup", "safe"),
        ("charge", "interrupted"),
        ("search", "safe"),
        ("send", "interrupted"),
    )

    def step(self, state: dict[str, Any]) -> dict[str, Any]:  # type: ignore[override]
        from hamsterbunker import EffectInterrupted

        context = current_step()
        assert context is not None
        for index, (name, replay) in enumerate(self.plan):
            try:
                value = context.effect_sync(name, _call_tool, replay=replay)
            except EffectInterrupted:
                self._interrupted(state, index, name, replay)
                continue
            self._result(state, index, name, replay, value)
        return self._done(state)


# -- the inbox ----------------------------------------------------------------------


class InboxEcho:
    """Async; each step waits for its inbox (HB_TEST_INBOX_WAIT_S, default 1 s) and answers
    every submission with {"echo": payload, "node": the node that answered}, counting them."""

    id = "inbox-echo"

    def __init__(self) -> None:
        self.wait_s = float(os.environ.get("HB_TEST_INBOX_WAIT_S", "1"))

    def init(self) -> dict[str, Any]:
        return {"answered": 0}

    async def step(self, state: dict[str, Any]) -> dict[str, Any]:
        context = current_step()
        assert context is not None
        for submission in await context.wait_for_inbox(self.wait_s):
            context.consume(
                submission.number, reply={"echo": submission.payload, "node": context.node}
            )
            state["answered"] += 1
        return state


class FailingAgent:
    """Every step raises, as against an LLM API that answers 500 (issue 16, point 3)."""

    id = "failing"

    def init(self) -> dict[str, Any]:
        return {"count": 0}

    async def step(self, state: dict[str, Any]) -> dict[str, Any]:
        raise RuntimeError("the API said 500")
