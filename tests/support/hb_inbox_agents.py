"""Inbox agents for tests that run nodes as real processes (tests/faults/test_inbox_faults.py).

On the nodes' PYTHONPATH (via conftest), imported by the node as
``hb_inbox_agents``; the tests import ``answer`` from here to know what each
reply must be.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any

from hamsterbunker import current_step
from hamsterbunker.core.limits import MAX_CONSUMED_PER_STEP

__all__ = ["InboxAnswerer", "answer"]


def answer(payload: Any) -> dict[str, Any]:
    """The part of a reply that depends only on the payload (what result() must return)."""
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"))
    return {"digest": hashlib.sha256(text.encode()).hexdigest()[:16], "echo": payload}


def _append_line(path: str, line: dict[str, Any]) -> None:
    """One JSON line, appended in one write (several nodes share the file)."""
    data = (json.dumps(line, separators=(",", ":")) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


class InboxAnswerer:
    """Async; waits in ``wait_for_inbox`` (HB_TEST_INBOX_WAIT_S, default 0.5 s), consumes
    every submission shown (at most a step's limit) with the reply ``{"answer":
    answer(payload), "node": the node, "number": its number}``, and counts each request
    id in its state (``counts``: request id -> times consumed in published steps).

    Every step that was shown anything appends a line to HB_TEST_INBOX_LOG before it
    returns (so before its checkpoint is published): node, epoch, seq, the numbers
    shown and the numbers consumed.
    """

    id = "answerer"

    def __init__(self) -> None:
        self.wait_s = float(os.environ.get("HB_TEST_INBOX_WAIT_S", "0.5"))
        self.log = os.environ.get("HB_TEST_INBOX_LOG")

    def init(self) -> dict[str, Any]:
        return {"counts": {}, "consumed": 0}

    async def step(self, state: dict[str, Any]) -> dict[str, Any]:
        ctx = current_step()
        assert ctx is not None
        shown = await ctx.wait_for_inbox(self.wait_s)
        consumed = []
        for submission in shown[:MAX_CONSUMED_PER_STEP]:
            reply = {"answer": answer(submission.payload), "node": ctx.node,
                     "number": submission.number}  # fmt: skip
            ctx.consume(submission.number, reply=reply)
            counts = state["counts"]
            counts[submission.request_id] = counts.get(submission.request_id, 0) + 1
            state["consumed"] += 1
            consumed.append(submission.number)
        if shown and self.log:
            _append_line(self.log, {
                "node": ctx.node, "epoch": ctx.epoch, "seq": ctx.seq,
                "shown": [s.number for s in shown], "consumed": consumed,
            })  # fmt: skip
        return state
