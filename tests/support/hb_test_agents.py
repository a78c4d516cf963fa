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


class JournalCounter:
    """Async counter; each step sleeps HB_TEST_STEP_S seconds (default 0.1)."""

    id = "journal"

    def __init__(self) -> None:
        self.step_s = float(os.environ.get("HB_TEST_STEP_S", "0.1"))

    def init(self) -> dict[str, Any]:
        return {"count": 0}

    async def step(self, state: dict[str, Any]) -> dict[str, Any]:
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
